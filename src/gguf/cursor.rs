//! A bounds-checked little-endian cursor over the mapped file.
//!
//! Used only by the parser (`parse.rs`). Every read checks the bytes left first and reports
//! `GgufError::Truncated` naming what was being read, where, and for which key or tensor
//! (the cursor's `context`). Nothing here can index out of bounds or overflow.

use super::error::GgufError;

/// The longest string (key, value or tensor name) the parser accepts.
pub(crate) const MAX_STRING_BYTES: u64 = 64 << 20;

pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// What the bytes being read belong to, e.g. "of metadata key 'general.name'"; set by
    /// the parser before each item so errors name it.
    pub(crate) context: String,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Cursor<'a> {
        Cursor {
            bytes,
            pos: 0,
            context: String::from("in the header"),
        }
    }

    /// The offset of the next byte to read.
    pub(crate) fn pos(&self) -> u64 {
        self.pos as u64
    }

    /// Bytes left after the cursor.
    pub(crate) fn remaining(&self) -> u64 {
        // `pos <= bytes.len()` always holds: `take` only advances within bounds.
        (self.bytes.len() - self.pos) as u64
    }

    /// "`what` `context`", e.g. "array length of metadata key 'x'", for error messages.
    pub(crate) fn describe(&self, what: &str) -> String {
        format!("{what} {}", self.context)
    }

    /// The next `n` bytes, or `Truncated` if fewer are left.
    pub(crate) fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], GgufError> {
        let available = self.remaining();
        if n > available {
            return Err(GgufError::Truncated {
                what: self.describe(what),
                offset: self.pos(),
                needed: n,
                available,
            });
        }
        // `n <= available <= usize::MAX`, so the cast and the addition are exact.
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.bytes[start..self.pos])
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let bytes = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &str) -> Result<u8, GgufError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(crate) fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    pub(crate) fn bool(&mut self, what: &str) -> Result<bool, GgufError> {
        let offset = self.pos();
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(GgufError::InvalidBool {
                what: self.describe(what),
                offset,
                value,
            }),
        }
    }

    /// A u64 count or length, at most `max` (`max_why` says why) and, when `min_bytes` is
    /// given, at most what the bytes left after it could hold at `min_bytes` per item.
    pub(crate) fn count(
        &mut self,
        what: &str,
        max: u64,
        max_why: &str,
        min_bytes: Option<u64>,
    ) -> Result<u64, GgufError> {
        let offset = self.pos();
        let count = self.u64(what)?;
        let left = self.remaining();
        let fit = match min_bytes {
            Some(per_item) if per_item > 0 => left / per_item,
            _ => u64::MAX,
        };
        if count > max.min(fit) {
            let why = if fit < max {
                format!(
                    "{left} bytes are left in the file and each takes at least {}",
                    min_bytes.unwrap_or(0)
                )
            } else {
                max_why.to_string()
            };
            return Err(GgufError::CountTooLarge {
                what: self.describe(what),
                offset,
                count,
                limit: max.min(fit),
                why,
            });
        }
        Ok(count)
    }

    /// A GGUF string: u64 byte length, then that many bytes of UTF-8.
    pub(crate) fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let len = self.count(
            &format!("{what} length"),
            MAX_STRING_BYTES,
            "the 64 MiB cap on strings",
            None,
        )?;
        let offset = self.pos();
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_string()),
            Err(_) => Err(GgufError::InvalidUtf8 {
                what: self.describe(what),
                offset,
                lossy: preview(bytes),
            }),
        }
    }

    /// `n` fixed-width little-endian values of `W` bytes each, decoded by `decode`.
    pub(crate) fn fixed_vec<T, const W: usize>(
        &mut self,
        n: u64,
        what: &str,
        decode: impl Fn([u8; W]) -> T,
    ) -> Result<Vec<T>, GgufError> {
        let total = n
            .checked_mul(W as u64)
            .ok_or_else(|| GgufError::CountTooLarge {
                what: self.describe(what),
                offset: self.pos(),
                count: n,
                limit: u64::MAX / W as u64,
                why: "its byte size overflows".to_string(),
            })?;
        let bytes = self.take(total, what)?;
        Ok(bytes
            .chunks_exact(W)
            .map(|chunk| {
                let mut a = [0u8; W];
                a.copy_from_slice(chunk);
                decode(a)
            })
            .collect())
    }
}

/// Most bytes of a bad string quoted in an error.
const PREVIEW_BYTES: usize = 64;

/// The start of a string that is not UTF-8, for an error message: at most `PREVIEW_BYTES`
/// bytes (lossily decoded), then its full length, so a hostile 30 MB string is not printed.
fn preview(bytes: &[u8]) -> String {
    if bytes.len() <= PREVIEW_BYTES {
        return String::from_utf8_lossy(bytes).into_owned();
    }
    format!(
        "{}... ({} bytes in all)",
        String::from_utf8_lossy(&bytes[..PREVIEW_BYTES]),
        bytes.len()
    )
}

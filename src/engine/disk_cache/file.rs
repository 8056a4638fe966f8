//! One file of the disk tier, a block's keys and values (`<hash>.kv`) or the recurrent state
//! snapshot taken at the end of that block (`<hash>.state`, a model with recurrent layers): its
//! bytes on disk and the checks a file must pass before it is served. Called by the disk tier's
//! I/O thread only.
//!
//! Layout (little-endian): magic (`ELKVBLK1` for a block, `ELSTATE1` for a state), format
//! version (u32), the tier's identity (u64), the block's chained hash (u64), tokens per block
//! (u32), its token ids (u32 each), the length of the payload (u64), the payload (a block: every
//! layer's keys then values; a state: every recurrent layer's state, f32), and a checksum (u64)
//! of everything before it. A state file passes the same checks as a block file.

use std::fmt;
use std::fs::File;
use std::io::Read;

use crate::engine::block_manager::BlockHash;

pub const FORMAT_VERSION: u32 = 1;
const HEADER_BYTES: usize = 8 + 4 + 8 + 8 + 4;

/// What a file of the tier holds for its block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FileKind {
    /// The block's keys and values.
    Kv,
    /// The recurrent state snapshot taken at the block's end.
    State,
}

impl FileKind {
    fn magic(self) -> &'static [u8; 8] {
        match self {
            FileKind::Kv => b"ELKVBLK1",
            FileKind::State => b"ELSTATE1",
        }
    }

    /// The file name's extension.
    pub fn extension(self) -> &'static str {
        match self {
            FileKind::Kv => "kv",
            FileKind::State => "state",
        }
    }
}

/// What a file must hold to be served for one block of one prompt.
pub struct Expected<'a> {
    pub kind: FileKind,
    pub identity: u64,
    pub hash: BlockHash,
    pub token_ids: &'a [u32],
    /// The payload's length (a block's KV bytes, a state slot's bytes).
    pub kv_bytes: usize,
}

/// Why a file was rejected (it is then deleted and the block recomputed).
#[derive(Debug, PartialEq, Eq)]
pub enum Reject {
    Truncated { len: usize, want: usize },
    BadMagic,
    Version(u32),
    Identity { found: u64 },
    Hash { found: BlockHash },
    TokenIds,
    Checksum,
}

impl fmt::Display for Reject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reject::Truncated { len, want } => {
                write!(
                    f,
                    "truncated or torn ({len} bytes, a file of this kind has {want})"
                )
            }
            Reject::BadMagic => write!(f, "not a file of this kind (bad magic)"),
            Reject::Version(v) => {
                write!(f, "format version {v}, this build writes {FORMAT_VERSION}")
            }
            Reject::Identity { found } => write!(
                f,
                "written for another model or setting (identity {found:016x})"
            ),
            Reject::Hash { found } => write!(f, "holds block {found:016x}, not the one named"),
            Reject::TokenIds => write!(f, "its token ids differ from the prompt's"),
            Reject::Checksum => write!(f, "checksum mismatch (corrupt)"),
        }
    }
}

/// Size of a block file of `num_tokens` tokens and `kv_bytes` bytes of keys and values.
pub fn file_bytes(num_tokens: usize, kv_bytes: usize) -> usize {
    HEADER_BYTES + 4 * num_tokens + 8 + kv_bytes + 8
}

/// A 64-bit checksum: each 8-byte word goes through a bijective mix of the running state, so
/// a change in any one word always changes the result.
pub fn checksum(bytes: &[u8]) -> u64 {
    const P: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h: u64 = 0x6A09_E667_F3BC_C908 ^ bytes.len() as u64;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        h = (h ^ w).wrapping_mul(P).rotate_left(29);
    }
    let mut tail = [0u8; 8];
    tail[..words.remainder().len()].copy_from_slice(words.remainder());
    h = (h ^ u64::from_le_bytes(tail))
        .wrapping_mul(P)
        .rotate_left(29);
    h ^ (h >> 31)
}

/// The bytes of a block file.
pub fn encode(
    kind: FileKind,
    identity: u64,
    hash: BlockHash,
    token_ids: &[u32],
    kv: &[u8],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(file_bytes(token_ids.len(), kv.len()));
    out.extend_from_slice(kind.magic());
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&identity.to_le_bytes());
    out.extend_from_slice(&hash.to_le_bytes());
    out.extend_from_slice(&(token_ids.len() as u32).to_le_bytes());
    for t in token_ids {
        out.extend_from_slice(&t.to_le_bytes());
    }
    out.extend_from_slice(&(kv.len() as u64).to_le_bytes());
    out.extend_from_slice(kv);
    let sum = checksum(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Reads a block file opened by `io::open_regular` (`len` bytes long): a file of the length the
/// block must have is read in full; another is never read past its header, which names what it
/// is (another model's, another format) where it can.
pub fn read(f: &mut File, len: u64, want: &Expected) -> std::io::Result<Result<Vec<u8>, Reject>> {
    let size = file_bytes(want.token_ids.len(), want.kv_bytes);
    if len == size as u64 {
        return super::io::read_exact(f, size).map(Ok);
    }
    let mut head = Vec::with_capacity(20);
    f.take(20).read_to_end(&mut head)?;
    Ok(Err(match decode(&head, want) {
        Err(Reject::Truncated { .. }) | Ok(_) => Reject::Truncated {
            len: len.try_into().unwrap_or(usize::MAX),
            want: size,
        },
        Err(other) => other,
    }))
}

/// Checks `bytes` against what the file must be, and returns its payload.
pub fn decode<'a>(bytes: &'a [u8], want: &Expected) -> Result<&'a [u8], Reject> {
    let size = file_bytes(want.token_ids.len(), want.kv_bytes);
    if bytes.len() >= 8 && &bytes[..8] != want.kind.magic() {
        return Err(Reject::BadMagic);
    }
    // Another model's (or setting's) file says so before its size differs.
    if bytes.len() >= 20 {
        let version = u32_at(bytes, 8);
        if version != FORMAT_VERSION {
            return Err(Reject::Version(version));
        }
        let identity = u64_at(bytes, 12);
        if identity != want.identity {
            return Err(Reject::Identity { found: identity });
        }
    }
    if bytes.len() != size {
        return Err(Reject::Truncated {
            len: bytes.len(),
            want: size,
        });
    }
    let (body, sum) = bytes.split_at(size - 8);
    if checksum(body) != u64_at(sum, 0) {
        return Err(Reject::Checksum);
    }
    let hash = u64_at(bytes, 20);
    if hash != want.hash {
        return Err(Reject::Hash { found: hash });
    }
    let n = u32_at(bytes, 28) as usize;
    let tokens_ok = n == want.token_ids.len()
        && want
            .token_ids
            .iter()
            .enumerate()
            .all(|(i, &t)| u32_at(bytes, HEADER_BYTES + 4 * i) == t);
    if !tokens_ok {
        return Err(Reject::TokenIds);
    }
    let kv_at = HEADER_BYTES + 4 * n;
    if u64_at(bytes, kv_at) as usize != want.kv_bytes {
        return Err(Reject::Truncated {
            len: bytes.len(),
            want: size,
        });
    }
    Ok(&bytes[kv_at + 8..kv_at + 8 + want.kv_bytes])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (Vec<u32>, Vec<u8>) {
        (
            (0..16).collect(),
            (0..1000u32).map(|i| (i * 7) as u8).collect(),
        )
    }

    fn want<'a>(tokens: &'a [u32], kv: &[u8]) -> Expected<'a> {
        Expected {
            kind: FileKind::Kv,
            identity: 7,
            hash: 42,
            token_ids: tokens,
            kv_bytes: kv.len(),
        }
    }

    #[test]
    fn round_trip() {
        let (t, kv) = sample();
        let bytes = encode(FileKind::Kv, 7, 42, &t, &kv);
        assert_eq!(bytes.len(), file_bytes(t.len(), kv.len()));
        assert_eq!(decode(&bytes, &want(&t, &kv)).unwrap(), &kv[..]);
    }

    #[test]
    fn every_single_bit_flip_is_caught() {
        let (t, kv) = sample();
        let bytes = encode(FileKind::Kv, 7, 42, &t, &kv);
        for i in (0..bytes.len()).step_by(3) {
            for bit in [0, 5] {
                let mut b = bytes.clone();
                b[i] ^= 1 << bit;
                assert!(
                    decode(&b, &want(&t, &kv)).is_err(),
                    "flip at byte {i} bit {bit}"
                );
            }
        }
    }

    #[test]
    fn truncation_identity_hash_and_tokens_are_caught() {
        let (t, kv) = sample();
        let bytes = encode(FileKind::Kv, 7, 42, &t, &kv);
        for len in [0, 5, 40, bytes.len() - 1] {
            assert!(matches!(
                decode(&bytes[..len], &want(&t, &kv)),
                Err(Reject::Truncated { .. })
            ));
        }
        let other = encode(FileKind::Kv, 8, 42, &t, &kv);
        assert_eq!(
            decode(&other, &want(&t, &kv)),
            Err(Reject::Identity { found: 8 })
        );
        let other = encode(FileKind::Kv, 7, 43, &t, &kv);
        assert_eq!(
            decode(&other, &want(&t, &kv)),
            Err(Reject::Hash { found: 43 })
        );
        // A state file is never served as the block's keys and values, nor the reverse.
        let state = encode(FileKind::State, 7, 42, &t, &kv);
        assert_eq!(decode(&state, &want(&t, &kv)), Err(Reject::BadMagic));
        let as_state = Expected {
            kind: FileKind::State,
            ..want(&t, &kv)
        };
        assert_eq!(decode(&state, &as_state).unwrap(), &kv[..]);
        assert_eq!(decode(&bytes, &as_state), Err(Reject::BadMagic));
        let mut t2 = t.clone();
        t2[3] = 99;
        let other = encode(FileKind::Kv, 7, 42, &t2, &kv);
        assert_eq!(decode(&other, &want(&t, &kv)), Err(Reject::TokenIds));
    }
}

//! The model file's digest: a 64-bit hash of every byte of the file (a copy with any byte
//! changed, even in the middle, gets another), computed once and recorded in the cache folder
//! (`<root>/<model stem>-<path hash>.identity`) with the file's size, times and inode, which
//! validate the record; a change to any of them recomputes it. Called by [`super::identity`].

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use super::file::checksum;
use super::io;

/// Bytes hashed per task; the chunks' digests are then hashed in order.
const CHUNK_BYTES: usize = 16 << 20;

/// First line of a record.
const RECORD_MAGIC: &str = "edge-llm model digest v1";

/// The hash of `bytes`: each chunk hashed with four independent lanes of the block files'
/// word mix (so a chunk runs at memory speed), chunks in parallel, their digests in order.
pub fn hash_bytes(bytes: &[u8]) -> u64 {
    let chunks: Vec<u64> = bytes.par_chunks(CHUNK_BYTES).map(hash_chunk).collect();
    let mut all = Vec::with_capacity(8 * chunks.len() + 8);
    all.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    for c in chunks {
        all.extend_from_slice(&c.to_le_bytes());
    }
    checksum(&all)
}

fn hash_chunk(chunk: &[u8]) -> u64 {
    const P: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut lanes: [u64; 4] = [
        0x6A09_E667_F3BC_C908,
        0xBB67_AE85_84CA_A73B,
        0x3C6E_F372_FE94_F82B,
        0xA54F_F53A_5F1D_36F1,
    ];
    let mut quads = chunk.chunks_exact(32);
    for q in &mut quads {
        for (lane, w) in lanes.iter_mut().zip(q.chunks_exact(8)) {
            let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
            *lane = (*lane ^ w).wrapping_mul(P).rotate_left(29);
        }
    }
    let mut tail = Vec::with_capacity(4 * 8 + 32);
    for lane in lanes {
        tail.extend_from_slice(&lane.to_le_bytes());
    }
    tail.extend_from_slice(quads.remainder());
    checksum(&tail)
}

/// What validates a record: the model file as `stat` sees it.
#[derive(Debug, PartialEq, Eq)]
struct Stamp {
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    inode: u64,
    device: u64,
}

impl Stamp {
    fn of(path: &Path) -> Option<Stamp> {
        let m = std::fs::metadata(path).ok()?;
        Some(Stamp {
            size: m.size(),
            mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
            ctime_ns: m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128,
            inode: m.ino(),
            device: m.dev(),
        })
    }

    /// A record's first two lines: what it is, and the stamp.
    fn head(&self) -> String {
        format!(
            "{RECORD_MAGIC}\n{} {} {} {} {}",
            self.size, self.mtime_ns, self.ctime_ns, self.inode, self.device
        )
    }

    fn record(&self, digest: u64) -> String {
        format!("{}\n{digest:016x}\n", self.head())
    }
}

/// Where the record of `model_path`'s digest lives under `root`.
fn record_path(root: &Path, model_path: &Path) -> PathBuf {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let full = std::fs::canonicalize(model_path).unwrap_or_else(|_| model_path.to_path_buf());
    let mut h = DefaultHasher::new();
    full.hash(&mut h);
    let stem = model_path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    root.join(format!("{stem}-{:016x}.identity", h.finish()))
}

/// The recorded digest, if the record is there, safe to read and matches `stamp`.
fn read_record(path: &Path, stamp: &Stamp) -> Option<u64> {
    let (mut f, len) = io::open_regular(path).ok()?;
    if len > 4096 {
        return None;
    }
    let text = String::from_utf8(io::read_exact(&mut f, len as usize).ok()?).ok()?;
    let (head, digest) = text.trim_end().rsplit_once('\n')?;
    (head == stamp.head())
        .then(|| u64::from_str_radix(digest, 16).ok())
        .flatten()
}

/// The digest of the model file at `model_path`, whose bytes are `bytes`: read from its record
/// under `root` when that still matches the file, else computed (and recorded, when `root` is
/// given and writable).
pub fn model_digest(model_path: &Path, bytes: &[u8], root: Option<&Path>) -> u64 {
    let stamp = Stamp::of(model_path);
    let record = root.map(|r| record_path(r, model_path));
    if let (Some(stamp), Some(record)) = (&stamp, &record) {
        if let Some(d) = read_record(record, stamp) {
            return d;
        }
    }
    let started = std::time::Instant::now();
    let digest = hash_bytes(bytes);
    if let (Some(stamp), Some(record)) = (stamp, record) {
        eprintln!(
            "disk cache: hashed {} ({} MiB) in {:.2} s for its identity",
            model_path.display(),
            bytes.len() >> 20,
            started.elapsed().as_secs_f64()
        );
        // The file as hashed: unchanged while it was read.
        if Stamp::of(model_path).as_ref() == Some(&stamp) {
            let _ = std::fs::create_dir_all(record.parent().expect("under root"));
            if let Err(e) = io::write_atomically(&record, stamp.record(digest).as_bytes()) {
                eprintln!(
                    "warning: disk cache: recording the model's digest in {}: {e}",
                    record.display()
                );
            }
        }
    }
    digest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_anywhere_changes_the_digest() {
        let bytes: Vec<u8> = (0..(40u32 << 20) + 13)
            .map(|i| (i * 31 % 253) as u8)
            .collect();
        let base = hash_bytes(&bytes);
        for at in [0, 1 << 20, 20 << 20, (40 << 20) + 12] {
            let mut b = bytes.clone();
            b[at] ^= 1;
            assert_ne!(hash_bytes(&b), base, "a flip at {at}");
        }
        let mut zeroed = bytes.clone();
        zeroed[16 << 20..24 << 20].fill(0);
        assert_ne!(hash_bytes(&zeroed), base);
        assert_ne!(hash_bytes(&bytes[..bytes.len() - 1]), base);
    }

    #[test]
    fn the_record_is_reused_until_the_file_changes() {
        let dir = std::env::temp_dir().join(format!("edge-llm-digest-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let model = dir.join("m.gguf");
        std::fs::write(&model, b"weights one").unwrap();
        let root = dir.join("cache");
        let d1 = model_digest(&model, b"weights one", Some(&root));
        assert_eq!(d1, hash_bytes(b"weights one"));
        // The record answers (the bytes passed are not hashed again).
        assert_eq!(model_digest(&model, b"ignored", Some(&root)), d1);
        // Rewritten: the stamp differs, the digest is recomputed.
        std::fs::write(&model, b"weights two!").unwrap();
        assert_eq!(
            model_digest(&model, b"weights two!", Some(&root)),
            hash_bytes(b"weights two!")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

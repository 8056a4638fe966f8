//! The disk tier of the prefix cache: full KV blocks kept in files under
//! `$XDG_CACHE_HOME/edge-llm/<model>-<identity>/` (or `~/.cache/...`, or `--cache-dir`), one file
//! per chained block hash, so a prompt computed before a restart is loaded instead of computed.
//! For a model with recurrent layers, the state snapshots taken at block ends
//! (`crate::engine::state_slots`) are kept beside their blocks (`<hash>.state`, `file`): written
//! when taken, read back with the chain they end (a prompt resumes from the deepest one), under
//! the same checks, and evicted with their block.
//!
//! The engine thread ([`crate::engine`]'s worker) owns a [`DiskTier`]: it asks whether a block
//! is on disk, hands blocks to write (copies of their KV bytes) and asks for chains of blocks to
//! load; every read and write runs on the tier's own I/O thread, which answers loads on a
//! channel the engine polls, so a step never waits on the disk. Writes go to a temporary file
//! then are renamed (a file is complete or absent); a file that fails its checks (`file`) is
//! reported once, deleted and never served. The byte budget is kept by LRU eviction (`index`).
//! The folder may be shared with others: no link is followed, nothing but a regular file of the
//! expected length is read, temporary files are created exclusively (`io`); a failure that
//! repeats for every block warns once a minute (`warn`). One process at a time uses a model's
//! folder (a lock, `io::lock_folder`): a second server on the same folder runs without the disk
//! tier, with a warning naming the first, so the budget holds and neither deletes the other's
//! temporary files.
//!
//! The directory's identity covers everything that changes a block's bytes for the same
//! tokens: the model file's contents (a hash of every byte, `digest`), the block size, the KV
//! element type, the layer shapes, the device and the CPU's SIMD path.

mod digest;
pub mod file;
mod index;
mod io;
mod parking;
mod thread;
mod warn;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::SystemTime;

use anyhow::{Context, Result};

use super::block_manager::BlockHash;
use crate::kernels::KvTypes;
use crate::model::Model;
pub use file::FileKind;
use index::{DiskIndex, FileKey};
pub(super) use parking::Parking;
use warn::Warner;

/// `--cache-disk-mib` when not given.
pub const DEFAULT_DISK_MIB: u64 = 1024;

/// Jobs the I/O thread may have queued before the engine stops handing it writes.
const QUEUE_JOBS: usize = 128;

/// The KV element types blocks are stored in, as the identity hashes them: "f16" for an f16
/// pool (as before the cache types existed, so f16 tiers stay valid), else both types named.
fn kv_element_types(kv_types: KvTypes) -> String {
    if kv_types == KvTypes::F16 {
        "f16".into()
    } else if kv_types.k == crate::kernels::tensor_type::TensorType::F16 {
        kv_types.to_string()
    } else {
        // Quantized keys are stored less their layer's center (model/key_centers.rs): a tier
        // written before the centers were is recomputed, not misread.
        format!("{kv_types}, keys centered")
    }
}

/// Where and how big the disk tier is.
#[derive(Clone, Debug)]
pub struct DiskCacheConfig {
    /// The edge-llm cache folder; each model gets a subfolder.
    pub root: PathBuf,
    pub budget_bytes: u64,
}

impl DiskCacheConfig {
    /// `$XDG_CACHE_HOME/edge-llm`, else `$HOME/.cache/edge-llm`; None without either.
    pub fn default_root() -> Option<PathBuf> {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME")
                    .filter(|v| !v.is_empty())
                    .map(|h| PathBuf::from(h).join(".cache"))
            })?;
        Some(base.join("edge-llm"))
    }
}

/// The disk tier's counters (for `/metrics`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskCacheStats {
    /// Blocks and bytes on disk now, and the budget.
    pub blocks: u64,
    pub bytes: u64,
    pub budget_bytes: u64,
    /// Blocks loaded from disk into the KV pool, their bytes, and the I/O thread's time.
    pub hit_blocks: u64,
    pub hit_bytes: u64,
    pub load_us: u64,
    /// Blocks written, and their bytes.
    pub written_blocks: u64,
    pub written_bytes: u64,
    /// Files rejected (torn, truncated, corrupt, another model's): deleted, recomputed.
    pub rejected_files: u64,
    /// Writes dropped because the I/O thread was behind, or failed.
    pub dropped_writes: u64,
    /// Recurrent state snapshots on disk now, loaded into the state pool, and written.
    pub states: u64,
    pub hit_states: u64,
    pub written_states: u64,
}

#[derive(Default)]
struct Counters {
    hit_blocks: AtomicU64,
    hit_bytes: AtomicU64,
    load_us: AtomicU64,
    written_blocks: AtomicU64,
    written_bytes: AtomicU64,
    rejected_files: AtomicU64,
    dropped_writes: AtomicU64,
    hit_states: AtomicU64,
    written_states: AtomicU64,
}

/// One block of a chain to load: its hash and the token ids it must hold.
pub type WantedBlock = (BlockHash, Vec<u32>);

/// A load's answer: the leading blocks of the asked chain that were on disk and passed every
/// check, in chain order, with their KV bytes; and the state snapshot asked for, when every
/// block came and its file passed every check.
pub struct Loaded {
    pub ticket: u64,
    pub blocks: Vec<(BlockHash, Vec<u32>, Vec<u8>)>,
    pub state: Option<Vec<u8>>,
}

enum Job {
    Write {
        key: FileKey,
        token_ids: Vec<u32>,
        kv: Vec<u8>,
    },
    Load {
        ticket: u64,
        blocks: Vec<WantedBlock>,
        /// The block whose state snapshot to load after the chain.
        state: Option<WantedBlock>,
    },
}

/// What the I/O thread needs to know.
struct Shared {
    dir: PathBuf,
    identity: u64,
    kv_bytes: usize,
    /// A state snapshot's bytes (0: the model has no recurrent layer).
    state_bytes: usize,
    index: Mutex<DiskIndex>,
    counters: Counters,
    warner: Mutex<Warner>,
}

impl Shared {
    fn index(&self) -> std::sync::MutexGuard<'_, DiskIndex> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A warning for a cause that may repeat per block: once a minute.
    fn warn_repeating(&self, cause: &str, message: &str) {
        self.warner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .warn(cause, message);
    }
}

/// The engine thread's side of the disk tier.
pub struct DiskTier {
    /// The folder's lock (`io::lock_folder`), held while the tier lives.
    _lock: File,
    shared: Arc<Shared>,
    jobs: Option<SyncSender<Job>>,
    loaded: Receiver<Loaded>,
    thread: Option<JoinHandle<()>>,
}

/// The identity of the blocks `model` computes with `block_size`-token blocks of `kv_types` on
/// `device`: a different value never shares a file (a tier written with other cache types is
/// another folder, so its blocks are recomputed, never misread). With a disk tier (`cache_root`) it includes the model
/// file's digest (a hash of all its bytes), recorded there and computed again only when the
/// file changes.
pub fn identity(
    model: &Model,
    block_size: usize,
    kv_types: KvTypes,
    device: &str,
    cache_root: Option<&Path>,
) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let bytes = model.file.bytes();
    // Only a disk tier shares blocks across processes: without one the pool is this process's
    // alone and the file's digest is not needed.
    let digest = cache_root.map(|root| {
        let digest = digest::model_digest(model.file.path(), bytes, Some(root));
        // Hashing may have read every page of the map back in: give them back (the interleaved
        // matrices' pages were released at load; the rest fault in again from the page cache
        // when used).
        model.file.release_pages(bytes);
        digest
    });
    let c = &model.config;
    let mut h = DefaultHasher::new();
    (
        file::FORMAT_VERSION,
        kv_element_types(kv_types),
        block_size,
        c.num_layers,
        c.kv_dim(),
        bytes.len(),
        digest,
        device,
        simd_path(),
    )
        .hash(&mut h);
    h.finish()
}

/// The CPU features that pick the kernels' arithmetic (their results differ in the last bits).
fn simd_path() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        let f = [
            ("avx2", std::arch::is_x86_feature_detected!("avx2")),
            ("fma", std::arch::is_x86_feature_detected!("fma")),
            ("avx512f", std::arch::is_x86_feature_detected!("avx512f")),
            ("avx512bw", std::arch::is_x86_feature_detected!("avx512bw")),
            (
                "avx512vnni",
                std::arch::is_x86_feature_detected!("avx512vnni"),
            ),
        ];
        f.iter()
            .filter(|x| x.1)
            .map(|x| x.0)
            .collect::<Vec<_>>()
            .join(",")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        std::env::consts::ARCH.to_string()
    }
}

impl DiskTier {
    /// Opens (creating it) the folder of `model`'s blocks under `config.root`, indexes the files
    /// already there (deleting leftover temporary files and what exceeds the budget) and starts
    /// the I/O thread. `kv_bytes` is one block's KV bytes, `state_bytes` one state snapshot's
    /// (0 for a model without recurrent layers).
    pub fn open(
        config: &DiskCacheConfig,
        model: &Model,
        identity: u64,
        kv_bytes: usize,
        state_bytes: usize,
    ) -> Result<DiskTier> {
        let stem = model
            .file
            .path()
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into());
        let dir = config.root.join(format!("{stem}-{identity:016x}"));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("creating the disk cache folder {}", dir.display()))?;
        let lock = io::lock_folder(&dir)?;
        let mut index = DiskIndex::new(config.budget_bytes);
        let mut found = Vec::new();
        let mut skipped = Vec::new();
        for entry in std::fs::read_dir(&dir)
            .with_context(|| format!("reading the disk cache folder {}", dir.display()))?
        {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            // The entry itself, never what a link points to.
            let kind = entry.file_type()?;
            if name.ends_with(".tmp") {
                // A crashed writer's (unlinking a link or a FIFO removes only the entry).
                if !kind.is_dir() {
                    let _ = std::fs::remove_file(entry.path());
                }
                continue;
            }
            let named = |kind: FileKind| {
                let stem = name.strip_suffix(kind.extension())?.strip_suffix('.')?;
                Some((u64::from_str_radix(stem, 16).ok()?, kind))
            };
            let Some(key) = named(FileKind::Kv).or_else(|| named(FileKind::State)) else {
                continue;
            };
            if !kind.is_file() {
                skipped.push(format!("{name} (a {})", io::kind_name(kind)));
                continue;
            }
            let meta = entry.metadata()?;
            let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            found.push((mtime, key, meta.len()));
        }
        if !skipped.is_empty() {
            eprintln!(
                "warning: disk cache: {}: skipped {} entries named like blocks that are not regular \
                 files, never read (e.g. {})",
                dir.display(),
                skipped.len(),
                skipped[..skipped.len().min(3)].join(", ")
            );
        }
        found.sort();
        for (_, key, len) in found {
            index.insert(key, len.max(1));
        }
        for victim in index.evict_for(0) {
            let _ = std::fs::remove_file(file_path(&dir, victim));
        }
        let shared = Arc::new(Shared {
            dir,
            identity,
            kv_bytes,
            state_bytes,
            index: Mutex::new(index),
            counters: Counters::default(),
            warner: Mutex::new(Warner::default()),
        });
        let (jobs_tx, jobs_rx) = mpsc::sync_channel(QUEUE_JOBS);
        let (loaded_tx, loaded_rx) = mpsc::channel();
        let io = shared.clone();
        let thread = std::thread::Builder::new()
            .name("edge-llm-disk-cache".into())
            .spawn(move || thread::io_loop(&io, jobs_rx, loaded_tx))
            .context("starting the disk cache thread")?;
        Ok(DiskTier {
            _lock: lock,
            shared,
            jobs: Some(jobs_tx),
            loaded: loaded_rx,
            thread: Some(thread),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    fn index(&self) -> std::sync::MutexGuard<'_, DiskIndex> {
        self.shared.index()
    }

    /// Whether the block is on disk or queued to be written.
    pub fn contains(&self, hash: BlockHash) -> bool {
        self.index().contains((hash, FileKind::Kv))
    }

    /// Whether the block's file is written.
    pub fn is_written(&self, hash: BlockHash) -> bool {
        self.index().is_written((hash, FileKind::Kv))
    }

    /// Whether the state snapshot at the end of the block is written.
    pub fn has_state(&self, hash: BlockHash) -> bool {
        self.index().is_written((hash, FileKind::State))
    }

    /// Queues a block to be written (never waits: when the I/O thread is behind, the write is
    /// dropped and counted).
    pub fn write(&self, hash: BlockHash, token_ids: Vec<u32>, kv: Vec<u8>) {
        self.queue_write((hash, FileKind::Kv), token_ids, kv);
    }

    /// Queues the state snapshot taken at the end of the block of `hash` (holding `token_ids`)
    /// to be written, as `write` a block.
    pub fn write_state(&self, hash: BlockHash, token_ids: Vec<u32>, state: Vec<u8>) {
        self.queue_write((hash, FileKind::State), token_ids, state);
    }

    fn queue_write(&self, key: FileKey, token_ids: Vec<u32>, kv: Vec<u8>) {
        let Some(jobs) = &self.jobs else { return };
        {
            let mut index = self.index();
            if index.contains(key) {
                return;
            }
            index.insert(key, 0);
        }
        let job = Job::Write { key, token_ids, kv };
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = jobs.try_send(job) {
            self.index().remove(key);
            self.shared
                .counters
                .dropped_writes
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Asks the I/O thread for the leading blocks of a chain, and then (when all came) for the
    /// state snapshot at the end of block `state`; the answer comes from
    /// [`DiskTier::try_loaded`] with the same ticket. False when the thread is behind.
    pub fn load(&self, ticket: u64, blocks: Vec<WantedBlock>, state: Option<WantedBlock>) -> bool {
        let Some(jobs) = &self.jobs else { return false };
        let job = Job::Load {
            ticket,
            blocks,
            state,
        };
        jobs.try_send(job).is_ok()
    }

    /// A load's answer, if one is ready.
    pub fn try_loaded(&self) -> Option<Loaded> {
        self.loaded.try_recv().ok()
    }

    pub fn stats(&self) -> DiskCacheStats {
        self.stats_handle().stats()
    }

    /// Reads the counters from any thread, while the I/O thread keeps writing.
    pub fn stats_handle(&self) -> DiskStatsHandle {
        DiskStatsHandle(self.shared.clone())
    }
}

/// The disk tier's live counters, for clients of the engine.
#[derive(Clone)]
pub struct DiskStatsHandle(Arc<Shared>);

impl DiskStatsHandle {
    pub fn stats(&self) -> DiskCacheStats {
        let c = &self.0.counters;
        let index = self.0.index.lock().unwrap_or_else(|e| e.into_inner());
        DiskCacheStats {
            blocks: index.num_files(FileKind::Kv) as u64,
            states: index.num_files(FileKind::State) as u64,
            hit_states: c.hit_states.load(Ordering::Relaxed),
            written_states: c.written_states.load(Ordering::Relaxed),
            bytes: index.total_bytes(),
            budget_bytes: index.budget_bytes,
            hit_blocks: c.hit_blocks.load(Ordering::Relaxed),
            hit_bytes: c.hit_bytes.load(Ordering::Relaxed),
            load_us: c.load_us.load(Ordering::Relaxed),
            written_blocks: c.written_blocks.load(Ordering::Relaxed),
            written_bytes: c.written_bytes.load(Ordering::Relaxed),
            rejected_files: c.rejected_files.load(Ordering::Relaxed),
            dropped_writes: c.dropped_writes.load(Ordering::Relaxed),
        }
    }
}

impl Drop for DiskTier {
    /// Lets the I/O thread finish the writes already queued, then joins it.
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn file_path(dir: &Path, (hash, kind): FileKey) -> PathBuf {
    dir.join(format!("{hash:016x}.{}", kind.extension()))
}

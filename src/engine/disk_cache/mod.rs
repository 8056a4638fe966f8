//! The disk tier of the prefix cache: full KV blocks kept in files under
//! `$XDG_CACHE_HOME/edge-llm/<model>-<identity>/` (or `~/.cache/...`, or `--cache-dir`), one file
//! per chained block hash, so a prompt computed before a restart is loaded instead of computed.
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
mod warn;

use std::collections::VecDeque;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime};

use anyhow::{Context, Result};

use super::block_manager::BlockHash;
use crate::kernels::KvTypes;
use crate::model::Model;
use index::DiskIndex;
use io::Refused;
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
}

/// One block of a chain to load: its hash and the token ids it must hold.
pub type WantedBlock = (BlockHash, Vec<u32>);

/// A load's answer: the leading blocks of the asked chain that were on disk and passed every
/// check, in chain order, with their KV bytes.
pub struct Loaded {
    pub ticket: u64,
    pub blocks: Vec<(BlockHash, Vec<u32>, Vec<u8>)>,
}

enum Job {
    Write {
        hash: BlockHash,
        token_ids: Vec<u32>,
        kv: Vec<u8>,
    },
    Load {
        ticket: u64,
        blocks: Vec<WantedBlock>,
    },
}

/// What the I/O thread needs to know.
struct Shared {
    dir: PathBuf,
    identity: u64,
    kv_bytes: usize,
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
    /// the I/O thread. `kv_bytes` is one block's KV bytes.
    pub fn open(
        config: &DiskCacheConfig,
        model: &Model,
        identity: u64,
        kv_bytes: usize,
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
            let Some(hash) = name
                .strip_suffix(".kv")
                .and_then(|h| u64::from_str_radix(h, 16).ok())
            else {
                continue;
            };
            if !kind.is_file() {
                skipped.push(format!("{name} (a {})", io::kind_name(kind)));
                continue;
            }
            let meta = entry.metadata()?;
            let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            found.push((mtime, hash, meta.len()));
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
        for (_, hash, len) in found {
            index.insert(hash, len.max(1));
        }
        for victim in index.evict_for(0) {
            let _ = std::fs::remove_file(block_path(&dir, victim));
        }
        let shared = Arc::new(Shared {
            dir,
            identity,
            kv_bytes,
            index: Mutex::new(index),
            counters: Counters::default(),
            warner: Mutex::new(Warner::default()),
        });
        let (jobs_tx, jobs_rx) = mpsc::sync_channel(QUEUE_JOBS);
        let (loaded_tx, loaded_rx) = mpsc::channel();
        let io = shared.clone();
        let thread = std::thread::Builder::new()
            .name("edge-llm-disk-cache".into())
            .spawn(move || io_loop(&io, jobs_rx, loaded_tx))
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
        self.index().contains(hash)
    }

    /// Whether the block's file is written.
    pub fn is_written(&self, hash: BlockHash) -> bool {
        self.index().is_written(hash)
    }

    /// Queues a block to be written (never waits: when the I/O thread is behind, the write is
    /// dropped and counted).
    pub fn write(&self, hash: BlockHash, token_ids: Vec<u32>, kv: Vec<u8>) {
        let Some(jobs) = &self.jobs else { return };
        {
            let mut index = self.index();
            if index.contains(hash) {
                return;
            }
            index.insert(hash, 0);
        }
        let job = Job::Write {
            hash,
            token_ids,
            kv,
        };
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = jobs.try_send(job) {
            self.index().remove(hash);
            self.shared
                .counters
                .dropped_writes
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Asks the I/O thread for the leading blocks of a chain; the answer comes from
    /// [`DiskTier::try_loaded`] with the same ticket. False when the thread is behind.
    pub fn load(&self, ticket: u64, blocks: Vec<WantedBlock>) -> bool {
        let Some(jobs) = &self.jobs else { return false };
        jobs.try_send(Job::Load { ticket, blocks }).is_ok()
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
            blocks: index.num_blocks() as u64,
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

fn block_path(dir: &Path, hash: BlockHash) -> PathBuf {
    dir.join(format!("{hash:016x}.kv"))
}

/// The I/O thread: loads first (a request waits on them), then writes, until the engine side
/// hangs up and the queue is empty.
fn io_loop(s: &Shared, jobs: Receiver<Job>, loaded: mpsc::Sender<Loaded>) {
    let mut queue = VecDeque::new();
    loop {
        if queue.is_empty() {
            match jobs.recv() {
                Ok(j) => queue.push_back(j),
                Err(_) => return,
            }
        }
        while let Ok(j) = jobs.try_recv() {
            queue.push_back(j);
        }
        let next = match queue.iter().position(|j| matches!(j, Job::Load { .. })) {
            Some(i) => queue.remove(i),
            None => queue.pop_front(),
        };
        match next {
            Some(Job::Load { ticket, blocks }) => {
                let blocks = load_chain(s, &blocks);
                let _ = loaded.send(Loaded { ticket, blocks });
            }
            Some(Job::Write {
                hash,
                token_ids,
                kv,
            }) => write_block(s, hash, &token_ids, &kv),
            None => {}
        }
    }
}

/// A block file that could not be read: warned about (once a minute per kind of error) and
/// forgotten, so the block is recomputed.
fn read_failed(s: &Shared, path: &Path, hash: BlockHash, e: &std::io::Error) {
    s.warn_repeating(
        &format!("read:{:?}", e.kind()),
        &format!(
            "reading {}: {e}; the block will be recomputed",
            path.display()
        ),
    );
    s.index().remove(hash);
}

fn load_chain(s: &Shared, wanted: &[WantedBlock]) -> Vec<(BlockHash, Vec<u32>, Vec<u8>)> {
    let started = Instant::now();
    let mut out = Vec::new();
    for (hash, token_ids) in wanted {
        let path = block_path(&s.dir, *hash);
        let want = file::Expected {
            identity: s.identity,
            hash: *hash,
            token_ids,
            kv_bytes: s.kv_bytes,
        };
        let (mut f, len) = match io::open_regular(&path) {
            Ok(opened) => opened,
            Err(Refused::NotFound) => {
                s.index().remove(*hash);
                break;
            }
            Err(Refused::Io(e)) => {
                read_failed(s, &path, *hash, &e);
                break;
            }
            Err(refused) => {
                reject(s, &path, *hash, &refused);
                break;
            }
        };
        let bytes = match file::read(&mut f, len, &want) {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(r)) => {
                reject(s, &path, *hash, &r);
                break;
            }
            Err(e) => {
                read_failed(s, &path, *hash, &e);
                break;
            }
        };
        match file::decode(&bytes, &want) {
            Ok(kv) => {
                let c = &s.counters;
                c.hit_blocks.fetch_add(1, Ordering::Relaxed);
                c.hit_bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                s.index().touch(*hash);
                // The LRU order survives restarts through the files' times.
                let _ = f.set_modified(SystemTime::now());
                out.push((*hash, token_ids.clone(), kv.to_vec()));
            }
            Err(r) => {
                reject(s, &path, *hash, &r);
                break;
            }
        }
    }
    s.counters
        .load_us
        .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
    out
}

/// A block file that is not what its name says (damaged, another model's, or not a regular
/// file at all): one warning, its entry deleted (a link or FIFO itself, never its target), the
/// block recomputed.
fn reject(s: &Shared, path: &Path, hash: BlockHash, why: &dyn std::fmt::Display) {
    eprintln!(
        "warning: disk cache: {}: {why}; deleted, the block will be recomputed",
        path.display()
    );
    let _ = std::fs::remove_file(path);
    s.index().remove(hash);
    s.counters.rejected_files.fetch_add(1, Ordering::Relaxed);
}

fn write_block(s: &Shared, hash: BlockHash, token_ids: &[u32], kv: &[u8]) {
    let bytes = file::encode(s.identity, hash, token_ids, kv);
    let size = bytes.len() as u64;
    let victims = {
        let mut index = s.index();
        if index.is_written(hash) {
            return;
        }
        index.remove(hash);
        if size > index.budget_bytes {
            return;
        }
        let victims = index.evict_for(size);
        // Reserved before the file exists, so files on disk never exceed the budget.
        index.insert(hash, size);
        victims
    };
    for v in victims {
        let _ = std::fs::remove_file(block_path(&s.dir, v));
    }
    let path = block_path(&s.dir, hash);
    let written = io::write_atomically(&path, &bytes);
    let c = &s.counters;
    match written {
        Ok(()) => {
            c.written_blocks.fetch_add(1, Ordering::Relaxed);
            c.written_bytes.fetch_add(size, Ordering::Relaxed);
        }
        Err(e) => {
            s.index().remove(hash);
            c.dropped_writes.fetch_add(1, Ordering::Relaxed);
            s.warn_repeating(
                &format!("write:{:?}", e.kind()),
                &format!(
                    "writing {}: {e}; blocks stay in memory only",
                    path.display()
                ),
            );
        }
    }
}

//! The disk tier's I/O thread: takes the engine's jobs (loads first, since a request waits on
//! them, then writes), reads and checks block and state snapshot files (`super::file`), writes
//! them atomically within the byte budget (evicting by LRU, a snapshot with its block), and
//! rejects (deletes, counts, warns about) a file that fails a check. Started by
//! `DiskTier::open`; it ends when the engine side hangs up and the queue is empty.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver};
use std::time::{Instant, SystemTime};

use super::io::{self, Refused};
use super::{file, file_path, FileKey, FileKind, Job, Loaded, Shared, WantedBlock};
use crate::engine::block_manager::BlockHash;

/// The I/O thread: loads first (a request waits on them), then writes, until the engine side
/// hangs up and the queue is empty.
pub(super) fn io_loop(s: &Shared, jobs: Receiver<Job>, loaded: mpsc::Sender<Loaded>) {
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
            Some(Job::Load {
                ticket,
                blocks,
                state,
            }) => {
                let started = Instant::now();
                let chain = load_chain(s, &blocks);
                let state = state
                    .filter(|_| chain.len() == blocks.len())
                    .and_then(|(hash, token_ids)| load_file(s, (hash, FileKind::State), &token_ids))
                    .inspect(|_| {
                        s.counters.hit_states.fetch_add(1, Ordering::Relaxed);
                    });
                s.counters
                    .load_us
                    .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
                let _ = loaded.send(Loaded {
                    ticket,
                    blocks: chain,
                    state,
                });
            }
            Some(Job::Write { key, token_ids, kv }) => write_file(s, key, &token_ids, &kv),
            None => {}
        }
    }
}

/// A block file that could not be read: warned about (once a minute per kind of error) and
/// forgotten, so the block is recomputed.
fn read_failed(s: &Shared, path: &Path, key: FileKey, e: &std::io::Error) {
    s.warn_repeating(
        &format!("read:{:?}", e.kind()),
        &format!(
            "reading {}: {e}; the block will be recomputed",
            path.display()
        ),
    );
    s.index().remove(key);
}

fn load_chain(s: &Shared, wanted: &[WantedBlock]) -> Vec<(BlockHash, Vec<u32>, Vec<u8>)> {
    let mut out = Vec::new();
    for (hash, token_ids) in wanted {
        let Some(kv) = load_file(s, (*hash, FileKind::Kv), token_ids) else {
            break;
        };
        let c = &s.counters;
        c.hit_blocks.fetch_add(1, Ordering::Relaxed);
        c.hit_bytes.fetch_add(kv.len() as u64, Ordering::Relaxed);
        out.push((*hash, token_ids.clone(), kv));
    }
    out
}

/// Reads one file of the tier and returns its payload once it passed every check; None (the
/// file rejected or forgotten, with a warning where it was not simply missing) otherwise.
fn load_file(s: &Shared, key: FileKey, token_ids: &[u32]) -> Option<Vec<u8>> {
    let path = file_path(&s.dir, key);
    let want = file::Expected {
        kind: key.1,
        identity: s.identity,
        hash: key.0,
        token_ids,
        kv_bytes: match key.1 {
            FileKind::Kv => s.kv_bytes,
            FileKind::State => s.state_bytes,
        },
    };
    let (mut f, len) = match io::open_regular(&path) {
        Ok(opened) => opened,
        Err(Refused::NotFound) => {
            s.index().remove(key);
            return None;
        }
        Err(Refused::Io(e)) => {
            read_failed(s, &path, key, &e);
            return None;
        }
        Err(refused) => {
            reject(s, &path, key, &refused);
            return None;
        }
    };
    let bytes = match file::read(&mut f, len, &want) {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(r)) => {
            reject(s, &path, key, &r);
            return None;
        }
        Err(e) => {
            read_failed(s, &path, key, &e);
            return None;
        }
    };
    match file::decode(&bytes, &want) {
        Ok(payload) => {
            s.index().touch(key);
            // The LRU order survives restarts through the files' times.
            let _ = f.set_modified(SystemTime::now());
            Some(payload.to_vec())
        }
        Err(r) => {
            reject(s, &path, key, &r);
            None
        }
    }
}

/// A block file that is not what its name says (damaged, another model's, or not a regular
/// file at all): one warning, its entry deleted (a link or FIFO itself, never its target), the
/// block recomputed.
fn reject(s: &Shared, path: &Path, key: FileKey, why: &dyn std::fmt::Display) {
    eprintln!(
        "warning: disk cache: {}: {why}; deleted, the block will be recomputed",
        path.display()
    );
    let _ = std::fs::remove_file(path);
    s.index().remove(key);
    s.counters.rejected_files.fetch_add(1, Ordering::Relaxed);
}

fn write_file(s: &Shared, key: FileKey, token_ids: &[u32], kv: &[u8]) {
    let bytes = file::encode(key.1, s.identity, key.0, token_ids, kv);
    let size = bytes.len() as u64;
    let victims = {
        let mut index = s.index();
        if index.is_written(key) {
            return;
        }
        index.remove(key);
        if size > index.budget_bytes {
            return;
        }
        let victims = index.evict_for(size);
        // Reserved before the file exists, so files on disk never exceed the budget.
        index.insert(key, size);
        victims
    };
    for v in victims {
        let _ = std::fs::remove_file(file_path(&s.dir, v));
    }
    let path = file_path(&s.dir, key);
    let written = io::write_atomically(&path, &bytes);
    let c = &s.counters;
    match written {
        Ok(()) if key.1 == FileKind::State => {
            c.written_states.fetch_add(1, Ordering::Relaxed);
        }
        Ok(()) => {
            c.written_blocks.fetch_add(1, Ordering::Relaxed);
            c.written_bytes.fetch_add(size, Ordering::Relaxed);
        }
        Err(e) => {
            s.index().remove(key);
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

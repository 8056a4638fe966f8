//! Which blocks the disk tier holds, their sizes and their LRU order, under one byte budget.
//! Shared between the engine thread (asks `contains`, reserves writes) and the I/O thread
//! (adds written files, evicts, drops rejected ones) behind a mutex; integers only.

use std::collections::{BTreeMap, HashMap};

use super::file::FileKind;
use crate::engine::block_manager::BlockHash;

/// A file of the tier: the block it belongs to and what it holds.
pub type FileKey = (BlockHash, FileKind);

#[derive(Clone, Copy, Debug)]
struct Entry {
    /// Bytes on disk; 0 while the write is only queued.
    bytes: u64,
    stamp: u64,
}

#[derive(Debug, Default)]
pub struct DiskIndex {
    entries: HashMap<FileKey, Entry>,
    /// Least recently used first.
    lru: BTreeMap<u64, FileKey>,
    next_stamp: u64,
    total_bytes: u64,
    pub budget_bytes: u64,
}

impl DiskIndex {
    pub fn new(budget_bytes: u64) -> Self {
        DiskIndex {
            budget_bytes,
            ..Default::default()
        }
    }

    /// Whether the file is on disk or queued to be written.
    pub fn contains(&self, key: FileKey) -> bool {
        self.entries.contains_key(&key)
    }

    /// Whether the file is written (not only queued).
    pub fn is_written(&self, key: FileKey) -> bool {
        self.entries.get(&key).is_some_and(|e| e.bytes > 0)
    }

    /// Files of `kind` written to disk.
    pub fn num_files(&self, kind: FileKind) -> usize {
        let written = self
            .entries
            .iter()
            .filter(|(k, e)| k.1 == kind && e.bytes > 0);
        written.count()
    }

    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }

    /// Adds (or refreshes) a file: `bytes` 0 marks a queued write.
    pub fn insert(&mut self, key: FileKey, bytes: u64) {
        self.remove(key);
        let stamp = self.stamp();
        self.entries.insert(key, Entry { bytes, stamp });
        self.lru.insert(stamp, key);
        self.total_bytes += bytes;
    }

    /// Marks a file as just used (a load hit).
    pub fn touch(&mut self, key: FileKey) {
        if let Some(e) = self.entries.get(&key).copied() {
            self.lru.remove(&e.stamp);
            let stamp = self.stamp();
            self.entries.insert(key, Entry { stamp, ..e });
            self.lru.insert(stamp, key);
        }
    }

    pub fn remove(&mut self, key: FileKey) {
        if let Some(e) = self.entries.remove(&key) {
            self.lru.remove(&e.stamp);
            self.total_bytes -= e.bytes;
        }
    }

    /// The written files to delete, least recently used first, so that `incoming` more bytes
    /// fit the budget: a block's state snapshot goes with its block. Removes them from the
    /// index; the caller deletes the files.
    pub fn evict_for(&mut self, incoming: u64) -> Vec<FileKey> {
        let mut out = Vec::new();
        while self.total_bytes + incoming > self.budget_bytes {
            let victim = self
                .lru
                .values()
                .copied()
                .find(|k| self.entries[k].bytes > 0);
            let Some(k) = victim else { break };
            self.remove(k);
            out.push(k);
            let state = (k.0, FileKind::State);
            if k.1 == FileKind::Kv && self.is_written(state) {
                self.remove(state);
                out.push(state);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::{DiskIndex, FileKey, FileKind};

    fn kv(h: u64) -> FileKey {
        (h, FileKind::Kv)
    }

    #[test]
    fn a_state_snapshot_is_evicted_with_its_block() {
        let mut ix = DiskIndex::new(300);
        ix.insert(kv(1), 100);
        ix.insert((1, FileKind::State), 50);
        ix.insert(kv(2), 100);
        ix.touch((1, FileKind::State));
        // Block 1 is the least recently used: its state goes with it, though used since.
        assert_eq!(ix.evict_for(100), vec![kv(1), (1, FileKind::State)]);
        assert_eq!((ix.total_bytes(), ix.num_files(FileKind::State)), (100, 0));
        // A state alone (its block never written) is evicted by its own use.
        ix.insert((3, FileKind::State), 150);
        ix.insert(kv(4), 50);
        assert_eq!(ix.evict_for(100), vec![kv(2)]);
        assert_eq!(ix.evict_for(300), vec![(3, FileKind::State), kv(4)]);
    }

    #[test]
    fn evicts_least_recently_used_within_budget() {
        let mut ix = DiskIndex::new(300);
        ix.insert(kv(1), 100);
        ix.insert(kv(2), 100);
        ix.insert(kv(3), 100);
        ix.touch(kv(1));
        assert_eq!(ix.evict_for(100), vec![kv(2)]);
        ix.insert(kv(4), 100);
        assert_eq!(ix.total_bytes(), 300);
        assert_eq!(ix.evict_for(150), vec![kv(3), kv(1)]);
        assert!(ix.contains(kv(4)) && !ix.contains(kv(1)));
        ix.insert(kv(5), 0);
        assert!(ix.contains(kv(5)) && !ix.is_written(kv(5)));
        assert_eq!(ix.evict_for(1000), vec![kv(4)]);
        assert_eq!(ix.total_bytes(), 0);
    }
}

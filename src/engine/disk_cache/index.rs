//! Which blocks the disk tier holds, their sizes and their LRU order, under one byte budget.
//! Shared between the engine thread (asks `contains`, reserves writes) and the I/O thread
//! (adds written files, evicts, drops rejected ones) behind a mutex; integers only.

use std::collections::{BTreeMap, HashMap};

use crate::engine::block_manager::BlockHash;

#[derive(Clone, Copy, Debug)]
struct Entry {
    /// Bytes on disk; 0 while the write is only queued.
    bytes: u64,
    stamp: u64,
}

#[derive(Debug, Default)]
pub struct DiskIndex {
    entries: HashMap<BlockHash, Entry>,
    /// Least recently used first.
    lru: BTreeMap<u64, BlockHash>,
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

    /// Whether the block is on disk or queued to be written.
    pub fn contains(&self, hash: BlockHash) -> bool {
        self.entries.contains_key(&hash)
    }

    /// Whether the block's file is written (not only queued).
    pub fn is_written(&self, hash: BlockHash) -> bool {
        self.entries.get(&hash).is_some_and(|e| e.bytes > 0)
    }

    /// Blocks written to disk.
    pub fn num_blocks(&self) -> usize {
        self.entries.values().filter(|e| e.bytes > 0).count()
    }

    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }

    /// Adds (or refreshes) a block: `bytes` 0 marks a queued write.
    pub fn insert(&mut self, hash: BlockHash, bytes: u64) {
        self.remove(hash);
        let stamp = self.stamp();
        self.entries.insert(hash, Entry { bytes, stamp });
        self.lru.insert(stamp, hash);
        self.total_bytes += bytes;
    }

    /// Marks a block as just used (a load hit).
    pub fn touch(&mut self, hash: BlockHash) {
        if let Some(e) = self.entries.get(&hash).copied() {
            self.lru.remove(&e.stamp);
            let stamp = self.stamp();
            self.entries.insert(hash, Entry { stamp, ..e });
            self.lru.insert(stamp, hash);
        }
    }

    pub fn remove(&mut self, hash: BlockHash) {
        if let Some(e) = self.entries.remove(&hash) {
            self.lru.remove(&e.stamp);
            self.total_bytes -= e.bytes;
        }
    }

    /// The written blocks to delete, least recently used first, so that `incoming` more bytes
    /// fit the budget. Removes them from the index; the caller deletes the files.
    pub fn evict_for(&mut self, incoming: u64) -> Vec<BlockHash> {
        let mut out = Vec::new();
        while self.total_bytes + incoming > self.budget_bytes {
            let victim = self
                .lru
                .values()
                .copied()
                .find(|h| self.entries[h].bytes > 0);
            let Some(h) = victim else { break };
            self.remove(h);
            out.push(h);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::DiskIndex;

    #[test]
    fn evicts_least_recently_used_within_budget() {
        let mut ix = DiskIndex::new(300);
        ix.insert(1, 100);
        ix.insert(2, 100);
        ix.insert(3, 100);
        ix.touch(1);
        assert_eq!(ix.evict_for(100), vec![2]);
        ix.insert(4, 100);
        assert_eq!(ix.total_bytes(), 300);
        assert_eq!(ix.evict_for(150), vec![3, 1]);
        assert!(ix.contains(4) && !ix.contains(1));
        ix.insert(5, 0);
        assert!(ix.contains(5) && !ix.is_written(5));
        assert_eq!(ix.evict_for(1000), vec![4]);
        assert_eq!(ix.total_bytes(), 0);
    }
}

//! The KV block manager: which block belongs to whom, in integers only (it never touches the
//! KV memory itself; `crate::model::kv_cache` does). Owned by the scheduler.
//!
//! - Reference counts: a block is used by every sequence whose block table holds it.
//! - Automatic prefix caching (vLLM's scheme): each full block gets a hash chained from its
//!   parent's hash, the salt and its token ids. A new sequence reuses every cached block its
//!   prompt matches, block by block; token ids are compared on a hit so a hash collision can
//!   never serve wrong keys and values.
//! - Freed blocks keep their hash and wait in a free queue in LRU order; a cached block is
//!   evicted only when its slot is needed for new tokens.
//! - Copy-on-write: a forked sequence shares its parent's blocks; before a sequence writes into
//!   a block someone else also holds, it gets a private copy (the caller copies the memory).
//! - Isolation: a sequence with a cache key (an API key's hash) hashes its blocks on a chain
//!   salted with the key, so it never matches another key's blocks; the chain stays unsalted
//!   while it runs through pinned blocks, which every key shares.
//! - The disk tier (`super::disk_cache`) hooks in through the eviction log (cached blocks whose
//!   slot was just taken, to save before they are overwritten) and `insert_cached` (blocks
//!   loaded from disk).
//! - KV events (off unless `enable_events`): a `BlockStored` per chain of blocks entering the
//!   prefix cache, a `BlockRemoved` per evicted one, queued for `take_events`. A model with
//!   recurrent layers (`announce_at_snapshots`) announces a chain only as far as a state
//!   snapshot reaches (`announce_through`), since a prompt resumes no further
//!   (docs/routers.md, "Hybrid models").

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

use super::kv_events::KvCacheEvent;
pub use crate::model::kv_cache::BlockId;

mod announce;

/// The hash of a full block: chained from its parent block's hash.
pub type BlockHash = u64;

#[derive(Clone, Debug, Default)]
struct Block {
    ref_count: u32,
    /// Set once the block is full and registered in the prefix cache.
    hash: Option<BlockHash>,
    /// The tokens the block holds, kept for registered blocks to verify cache hits.
    token_ids: Vec<u32>,
    /// Position in the free queue while free.
    free_stamp: Option<u64>,
    /// Whether a `BlockStored` named it (announce-at-snapshots mode).
    announced: bool,
}

/// A memory copy the caller must make before the next forward step (copy-on-write).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockCopy {
    pub src: BlockId,
    pub dst: BlockId,
}

/// Counters of the prefix cache, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Prompt blocks looked up, and the ones found.
    pub lookup_blocks: u64,
    pub hit_blocks: u64,
    /// The same in tokens.
    pub lookup_tokens: u64,
    pub hit_tokens: u64,
    /// Cached blocks whose slot was taken for new tokens.
    pub evictions: u64,
}

pub struct BlockManager {
    pub block_size: usize,
    blocks: Vec<Block>,
    /// Free blocks by the order they were freed: the first is the least recently used.
    free_queue: BTreeMap<u64, BlockId>,
    next_stamp: u64,
    cached: HashMap<BlockHash, BlockId>,
    salt: u64,
    pub stats: PrefixCacheStats,
    /// Prefix-cache changes not yet taken; None while events are off.
    events: Option<Vec<KvCacheEvent>>,
    /// Cached blocks evicted since the last `take_evicted` (id, hash, token ids), for the disk
    /// tier to save before the slot is written; None while the log is off.
    evicted: Option<Vec<(BlockId, BlockHash, Vec<u32>)>>,
    /// Hashes of pinned blocks, with how many pins hold each: chains of every cache key share
    /// them.
    pinned: HashMap<BlockHash, usize>,
    /// Blocks are announced by `announce_through` only (a model with recurrent layers).
    at_snapshots: bool,
}

/// The hash of a full block of `tokens` following a block whose hash is `parent`.
pub fn block_hash(parent: Option<BlockHash>, tokens: &[u32], salt: u64) -> BlockHash {
    let mut h = DefaultHasher::new();
    (parent, salt, tokens).hash(&mut h);
    h.finish()
}

impl BlockManager {
    /// A pool of `num_blocks` blocks of `block_size` tokens. `salt` goes into every block hash:
    /// anything that changes the KV contents for the same tokens (the model, its settings) must
    /// change it.
    pub fn new(num_blocks: usize, block_size: usize, salt: u64) -> Self {
        assert!(num_blocks > 0 && block_size > 0);
        let mut m = BlockManager {
            block_size,
            blocks: vec![Block::default(); num_blocks],
            free_queue: BTreeMap::new(),
            next_stamp: 0,
            cached: HashMap::new(),
            salt,
            stats: PrefixCacheStats::default(),
            events: None,
            evicted: None,
            pinned: HashMap::new(),
            at_snapshots: false,
        };
        for id in 0..num_blocks as u32 {
            m.push_free(BlockId(id));
        }
        m
    }

    /// Starts queueing KV events (see `crate::engine::kv_events`).
    pub fn enable_events(&mut self) {
        self.events.get_or_insert_with(Vec::new);
    }

    /// The events queued since the last call (none while events are off).
    pub fn take_events(&mut self) -> Vec<KvCacheEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Starts logging evicted cached blocks (for the disk tier).
    pub fn enable_eviction_log(&mut self) {
        self.evicted.get_or_insert_with(Vec::new);
    }

    /// The cached blocks evicted since the last call: (block id, hash, token ids). Their slots
    /// still hold the old keys and values until the next forward step or block write.
    pub fn take_evicted(&mut self) -> Vec<(BlockId, BlockHash, Vec<u32>)> {
        self.evicted
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// The hash and token ids of block `id` if it is registered in the prefix cache.
    pub fn registered(&self, id: BlockId) -> Option<(BlockHash, &[u32])> {
        let b = &self.blocks[id.index()];
        b.hash.map(|h| (h, b.token_ids.as_slice()))
    }

    /// The token ids of the cached block of `hash`.
    pub fn cached_tokens(&self, hash: BlockHash) -> Option<&[u32]> {
        let id = self.cached.get(&hash)?;
        Some(self.blocks[id.index()].token_ids.as_slice())
    }

    /// Whether the prefix cache holds a block with this hash.
    pub fn is_cached(&self, hash: BlockHash) -> bool {
        self.cached.contains_key(&hash)
    }

    /// Marks a registered block's hash as pinned: every cache key's chain shares it.
    pub fn mark_pinned(&mut self, hash: BlockHash) {
        *self.pinned.entry(hash).or_default() += 1;
    }

    /// Undoes one [`Self::mark_pinned`].
    pub fn unmark_pinned(&mut self, hash: BlockHash) {
        if let Some(n) = self.pinned.get_mut(&hash) {
            *n -= 1;
            if *n == 0 {
                self.pinned.remove(&hash);
            }
        }
    }

    pub fn is_pinned_hash(&self, hash: BlockHash) -> bool {
        self.pinned.contains_key(&hash)
    }

    /// Enters a block whose keys and values come from elsewhere (the disk tier) into the
    /// prefix cache as a free cached block: takes the least recently used free block (evicting
    /// what it held) and returns its id, for the caller to fill before the next step. None when
    /// no block is free or the hash is cached already.
    pub fn insert_cached(
        &mut self,
        hash: BlockHash,
        parent: Option<BlockHash>,
        token_ids: &[u32],
    ) -> Option<BlockId> {
        if self.cached.contains_key(&hash) || token_ids.len() != self.block_size {
            return None;
        }
        let id = self.allocate_block()?;
        let b = &mut self.blocks[id.index()];
        b.hash = Some(hash);
        b.token_ids = token_ids.to_vec();
        self.cached.insert(hash, id);
        if let (Some(events), false) = (&mut self.events, self.at_snapshots) {
            events.push(KvCacheEvent::BlockStored {
                block_hashes: vec![hash],
                parent_block_hash: parent,
                token_ids: token_ids.to_vec(),
            });
        }
        self.release_block(id);
        Some(id)
    }

    /// The next hash of a chain for cache key `key`: while the chain runs through pinned
    /// blocks it is the unkeyed chain; from the first block that is not pinned on, the key is
    /// mixed into the parent (`keyed` records that it was).
    fn chain_step(
        &self,
        parent: Option<BlockHash>,
        keyed: &mut bool,
        key: Option<u64>,
        chunk: &[u32],
    ) -> BlockHash {
        let Some(key) = key else {
            return block_hash(parent, chunk, self.salt);
        };
        if !*keyed {
            let h = block_hash(parent, chunk, self.salt);
            if self.pinned.contains_key(&h) {
                return h;
            }
            *keyed = true;
            let root = block_hash(parent, &[], key);
            return block_hash(Some(root), chunk, self.salt);
        }
        block_hash(parent, chunk, self.salt)
    }

    /// The hashes the prefix cache can serve now (what KV events have announced and not
    /// removed).
    pub fn cached_hashes(&self) -> impl Iterator<Item = BlockHash> + '_ {
        self.cached.keys().copied()
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks not held by any sequence (cached or not).
    pub fn num_free(&self) -> usize {
        self.free_queue.len()
    }

    /// Free blocks that still hold a registered prefix.
    pub fn num_cached_free(&self) -> usize {
        self.free_queue
            .values()
            .filter(|&&b| self.blocks[b.index()].hash.is_some())
            .count()
    }

    pub fn num_used(&self) -> usize {
        self.blocks.len() - self.free_queue.len()
    }

    pub fn ref_count(&self, block: BlockId) -> u32 {
        self.blocks[block.index()].ref_count
    }

    /// Blocks needed to hold `num_tokens` tokens.
    pub fn blocks_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.block_size)
    }

    fn push_free(&mut self, id: BlockId) {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        self.blocks[id.index()].free_stamp = Some(stamp);
        self.free_queue.insert(stamp, id);
    }

    fn take_from_free(&mut self, id: BlockId) {
        if let Some(stamp) = self.blocks[id.index()].free_stamp.take() {
            self.free_queue.remove(&stamp);
        }
    }

    /// Takes the least recently used free block, evicting its cached prefix if it has one.
    fn allocate_block(&mut self) -> Option<BlockId> {
        let (&stamp, &id) = self.free_queue.iter().next()?;
        self.free_queue.remove(&stamp);
        let b = &mut self.blocks[id.index()];
        b.free_stamp = None;
        debug_assert_eq!(b.ref_count, 0);
        b.ref_count = 1;
        if let Some(h) = b.hash.take() {
            if self.cached.get(&h) == Some(&id) {
                self.cached.remove(&h);
                if let Some(log) = &mut self.evicted {
                    log.push((id, h, b.token_ids.clone()));
                }
                // Only the cache's own entry was announced (see register_full_blocks).
                let announced = !self.at_snapshots || b.announced;
                if let (Some(events), true) = (&mut self.events, announced) {
                    events.push(KvCacheEvent::BlockRemoved {
                        block_hashes: vec![h],
                    });
                }
            }
            b.announced = false;
            self.stats.evictions += 1;
        }
        b.token_ids.clear();
        Some(id)
    }

    fn release_block(&mut self, id: BlockId) {
        let b = &mut self.blocks[id.index()];
        assert!(b.ref_count > 0, "block {id} released more often than held");
        b.ref_count -= 1;
        if b.ref_count == 0 {
            self.push_free(id);
        }
    }

    /// Looks up the longest cached prefix of `tokens` (whole blocks only, and never the block
    /// holding the last token, whose logits must be computed). Takes a reference on every hit
    /// and returns the block table it starts with; the sequence has `len * block_size` tokens
    /// computed.
    pub fn match_prefix(&mut self, tokens: &[u32]) -> Vec<BlockId> {
        self.match_prefix_keyed(None, tokens)
    }

    /// As `match_prefix`, on the chain of cache key `key`.
    pub fn match_prefix_keyed(&mut self, key: Option<u64>, tokens: &[u32]) -> Vec<BlockId> {
        let bs = self.block_size;
        let matchable = tokens.len().saturating_sub(1) / bs;
        let mut table = Vec::new();
        let mut parent = None;
        let mut keyed = false;
        for i in 0..matchable {
            let chunk = &tokens[i * bs..(i + 1) * bs];
            let h = self.chain_step(parent, &mut keyed, key, chunk);
            match self.cached.get(&h) {
                Some(&id) if self.blocks[id.index()].token_ids == chunk => {
                    self.take_from_free(id);
                    self.blocks[id.index()].ref_count += 1;
                    table.push(id);
                    parent = Some(h);
                }
                _ => break,
            }
        }
        table
    }

    /// Counts one prompt lookup of `num_tokens` tokens that reused `hit_blocks` cached blocks.
    /// Called once per admitted sequence, not per attempt.
    pub fn record_lookup(&mut self, num_tokens: usize, hit_blocks: usize) {
        let bs = self.block_size;
        self.stats.lookup_blocks += (num_tokens.saturating_sub(1) / bs) as u64;
        self.stats.hit_blocks += hit_blocks as u64;
        self.stats.lookup_tokens += num_tokens as u64;
        self.stats.hit_tokens += (hit_blocks * bs) as u64;
    }

    /// The chained hashes of the prompt blocks `match_prefix` could reuse: every full block
    /// but the one holding the last token.
    pub fn prompt_block_hashes(&self, tokens: &[u32]) -> Vec<BlockHash> {
        self.prompt_block_hashes_keyed(None, tokens)
    }

    /// As `prompt_block_hashes`, on the chain of cache key `key`.
    pub fn prompt_block_hashes_keyed(&self, key: Option<u64>, tokens: &[u32]) -> Vec<BlockHash> {
        let bs = self.block_size;
        let mut parent = None;
        let mut keyed = false;
        (0..tokens.len().saturating_sub(1) / bs)
            .map(|i| {
                let h = self.chain_step(parent, &mut keyed, key, &tokens[i * bs..(i + 1) * bs]);
                parent = Some(h);
                h
            })
            .collect()
    }

    /// How many new blocks growing `table` to `num_tokens` tokens takes, counting a private copy
    /// of a shared last block that the growth writes into (`num_computed` tokens are in it).
    pub fn blocks_needed(
        &self,
        table: &[BlockId],
        num_computed: usize,
        num_tokens: usize,
    ) -> usize {
        let grow = self.blocks_for(num_tokens).saturating_sub(table.len());
        grow + self.needs_copy(table, num_computed, num_tokens) as usize
    }

    fn needs_copy(&self, table: &[BlockId], num_computed: usize, num_tokens: usize) -> bool {
        let bs = self.block_size;
        if num_tokens <= num_computed || num_computed.is_multiple_of(bs) {
            return false;
        }
        let last = num_computed / bs;
        last < table.len() && self.blocks[table[last].index()].ref_count > 1
    }

    /// Grows `table` so it holds `num_tokens` tokens, where `num_computed` are already written.
    /// A shared block the new tokens would write into is replaced by a private copy, returned
    /// for the caller to copy. `None` (and nothing changed) when there are not enough free blocks.
    pub fn allocate(
        &mut self,
        table: &mut Vec<BlockId>,
        num_computed: usize,
        num_tokens: usize,
    ) -> Option<Option<BlockCopy>> {
        if self.blocks_needed(table, num_computed, num_tokens) > self.num_free() {
            return None;
        }
        let mut copy = None;
        if self.needs_copy(table, num_computed, num_tokens) {
            let last = num_computed / self.block_size;
            let src = table[last];
            let dst = self.allocate_block().expect("counted above");
            self.release_block(src);
            table[last] = dst;
            copy = Some(BlockCopy { src, dst });
        }
        while table.len() < self.blocks_for(num_tokens) {
            table.push(self.allocate_block().expect("counted above"));
        }
        Some(copy)
    }

    /// Registers every block of `table` that became full of computed tokens: from block
    /// `first_block` on, for the `num_computed` computed tokens of `tokens`. Returns the chain's
    /// last hash, so the caller can continue from it next time.
    pub fn register_full_blocks(&mut self, table: &[BlockId], tokens: &[u32], num_computed: usize) {
        self.register_full_blocks_keyed(None, table, tokens, num_computed)
    }

    /// As `register_full_blocks`, on the chain of cache key `key`.
    pub fn register_full_blocks_keyed(
        &mut self,
        key: Option<u64>,
        table: &[BlockId],
        tokens: &[u32],
        num_computed: usize,
    ) {
        let bs = self.block_size;
        let mut parent = None;
        let mut keyed = false;
        // The chain of blocks this call enters into the cache, for one `BlockStored`.
        let mut stored: Option<KvCacheEvent> = None;
        for i in 0..(num_computed / bs).min(table.len()) {
            let chunk = &tokens[i * bs..(i + 1) * bs];
            let id = table[i];
            if let Some(h) = self.blocks[id.index()].hash {
                self.flush_stored(&mut stored);
                parent = Some(h);
                keyed = keyed || (key.is_some() && !self.pinned.contains_key(&h));
                continue;
            }
            let h = self.chain_step(parent, &mut keyed, key, chunk);
            let b = &mut self.blocks[id.index()];
            b.hash = Some(h);
            b.token_ids = chunk.to_vec();
            // A block with the same contents computed at the same time keeps the entry; only
            // an entry the cache takes is announced (and later removed).
            let entered = *self.cached.entry(h).or_insert(id) == id;
            if entered && self.events.is_some() && !self.at_snapshots {
                match &mut stored {
                    Some(KvCacheEvent::BlockStored {
                        block_hashes,
                        token_ids,
                        ..
                    }) => {
                        block_hashes.push(h);
                        token_ids.extend_from_slice(chunk);
                    }
                    _ => {
                        stored = Some(KvCacheEvent::BlockStored {
                            block_hashes: vec![h],
                            parent_block_hash: parent,
                            token_ids: chunk.to_vec(),
                        })
                    }
                }
            } else {
                self.flush_stored(&mut stored);
            }
            parent = Some(h);
        }
        self.flush_stored(&mut stored);
    }

    fn flush_stored(&mut self, stored: &mut Option<KvCacheEvent>) {
        if let (Some(e), Some(events)) = (stored.take(), &mut self.events) {
            events.push(e);
        }
    }

    /// A fork shares every block of `table`.
    pub fn fork(&mut self, table: &[BlockId]) -> Vec<BlockId> {
        for &id in table {
            assert!(
                self.blocks[id.index()].ref_count > 0,
                "forking a free block {id}"
            );
            self.blocks[id.index()].ref_count += 1;
        }
        table.to_vec()
    }

    /// Releases every block of `table`, the last first so that the tails of prefixes are
    /// evicted before their heads.
    pub fn free(&mut self, table: &mut Vec<BlockId>) {
        for &id in table.iter().rev() {
            self.release_block(id);
        }
        table.clear();
    }

    /// Shrinks `table` to its first `keep` blocks, releasing the rest (the last first), as
    /// speculative decoding's rollback does. Returns how many were released.
    pub fn truncate(&mut self, table: &mut Vec<BlockId>, keep: usize) -> usize {
        let mut released = 0;
        while table.len() > keep {
            let id = table.pop().expect("longer than keep");
            self.release_block(id);
            released += 1;
        }
        released
    }

    /// Checks the invariants against the block tables of every live sequence: reference counts
    /// equal the number of tables holding each block; a block is free exactly when nobody holds
    /// it; the prefix cache maps only to registered blocks with that hash.
    pub fn check_invariants<'a>(
        &self,
        tables: impl IntoIterator<Item = &'a [BlockId]>,
    ) -> Result<(), String> {
        let mut counts = vec![0u32; self.blocks.len()];
        for table in tables {
            for &id in table {
                *counts
                    .get_mut(id.index())
                    .ok_or(format!("block id {id} out of range"))? += 1;
            }
        }
        for (id, (b, &n)) in self.blocks.iter().zip(&counts).enumerate() {
            if b.ref_count != n {
                return Err(format!(
                    "block {id}: ref_count {} but held by {n} tables",
                    b.ref_count
                ));
            }
            let in_queue = b
                .free_stamp
                .is_some_and(|s| self.free_queue.get(&s) == Some(&BlockId(id as u32)));
            if (n == 0) != in_queue || (n == 0) != b.free_stamp.is_some() {
                return Err(format!(
                    "block {id}: held by {n} tables, free-queue membership {in_queue}"
                ));
            }
        }
        if self.free_queue.len() != counts.iter().filter(|&&n| n == 0).count() {
            return Err("free queue holds a block twice or a used block".into());
        }
        for (&h, &id) in &self.cached {
            if self.blocks[id.index()].hash != Some(h) {
                return Err(format!(
                    "cache entry {h:x} points at block {id} that does not hold it"
                ));
            }
        }
        Ok(())
    }
}

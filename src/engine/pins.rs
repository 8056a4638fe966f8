//! Pinned prompts: each pin holds its own reference to every full block of its prompt, so its
//! blocks are never evicted while it lives, and pins sharing a prefix share those blocks (a
//! block counts once against the pool however many pins hold it). A pin is named by the id of
//! the request that made it and goes away with [`PinTable::unpin`], releasing its references
//! (and its blocks' pinned marks, which make every cache key's chain share them, once no pin
//! holds them). Integers only; the scheduler owns the table.

use std::collections::HashMap;

use super::block_manager::BlockManager;
use crate::model::kv_cache::BlockId;

#[derive(Default)]
pub struct PinTable {
    /// Each pin's blocks (its own references), by pin id.
    pins: HashMap<u64, Vec<BlockId>>,
    /// How many pins hold each pinned block.
    holders: HashMap<BlockId, usize>,
}

impl PinTable {
    /// Blocks held by pins (each counted once).
    pub fn num_blocks(&self) -> usize {
        self.holders.len()
    }

    pub fn contains_block(&self, id: BlockId) -> bool {
        self.holders.contains_key(&id)
    }

    pub fn contains(&self, pin: u64) -> bool {
        self.pins.contains_key(&pin)
    }

    /// Every pin's block list, for the block manager's invariant check.
    pub fn tables(&self) -> impl Iterator<Item = &[BlockId]> {
        self.pins.values().map(Vec::as_slice)
    }

    /// How many of `hashes` (a prompt's full blocks, unkeyed) are not pinned yet: the blocks a
    /// pin of that prompt would add.
    pub fn new_blocks(blocks: &BlockManager, hashes: &[u64]) -> usize {
        hashes
            .iter()
            .filter(|&&h| !blocks.is_pinned_hash(h))
            .count()
    }

    /// Pins the registered full blocks of `table` as pin `pin`. Returns the blocks newly
    /// pinned; fails (pinning nothing) when more than `limit` blocks would be pinned in all.
    pub fn pin(
        &mut self,
        blocks: &mut BlockManager,
        pin: u64,
        table: &[BlockId],
        limit: usize,
    ) -> Result<usize, String> {
        let full: Vec<(BlockId, u64)> = table
            .iter()
            .map_while(|&id| blocks.registered(id).map(|(h, _)| (id, h)))
            .collect();
        let new = full
            .iter()
            .filter(|(id, _)| !self.holders.contains_key(id))
            .count();
        if self.num_blocks() + new > limit {
            return Err(format!(
                "pinning {new} more blocks would pin more than {limit} of the KV pool's {} blocks",
                blocks.num_blocks()
            ));
        }
        let ids: Vec<BlockId> = full.iter().map(|&(id, _)| id).collect();
        let held = blocks.fork(&ids);
        for &(id, h) in &full {
            blocks.mark_pinned(h);
            *self.holders.entry(id).or_default() += 1;
        }
        self.pins.entry(pin).or_default().extend(held);
        Ok(new)
    }

    /// Releases pin `pin`; false when there is no such pin.
    pub fn unpin(&mut self, blocks: &mut BlockManager, pin: u64) -> bool {
        let Some(mut held) = self.pins.remove(&pin) else {
            return false;
        };
        for &id in &held {
            if let Some((h, _)) = blocks.registered(id) {
                blocks.unmark_pinned(h);
            }
            if let Some(n) = self.holders.get_mut(&id) {
                *n -= 1;
                if *n == 0 {
                    self.holders.remove(&id);
                }
            }
        }
        blocks.free(&mut held);
        true
    }
}

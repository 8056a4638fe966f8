//! The engine thread's side of the disk tier: new sequences whose prompt continues on disk
//! past what memory holds wait here ("parked") while the tier's I/O thread loads those blocks,
//! then enter the scheduler reusing what arrived; cached blocks evicted from the pool, and the
//! full blocks of sequences that end, are handed to the tier to write. For a model with
//! recurrent layers, state snapshots are written when taken and a prompt loads its chain only
//! as far as the deepest snapshot on it (in memory or on disk), with that snapshot: the blocks
//! past it would be recomputed anyway.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::{DiskCacheConfig, DiskCacheStats, DiskStatsHandle, DiskTier};
use crate::device::Executor;
use crate::engine::block_manager::{BlockHash, BlockId, BlockManager};
use crate::engine::sequence::SeqId;
use crate::engine::state_slots::{StateSlot, StateSlots};
use crate::model::state_pool::StatePool;
use crate::model::Model;

/// How long a new request waits for its blocks from disk; a slower disk degrades to
/// recomputing them.
const DISK_LOAD_WAIT: Duration = Duration::from_millis(500);

/// A sequence whose prompt continues on disk: it waits for the load (at most
/// `DISK_LOAD_WAIT`) and is then scheduled, reusing what arrived.
struct Parked {
    seq_id: SeqId,
    ticket: u64,
    deadline: Instant,
    /// The hash of the block before the first one asked for.
    parent: Option<BlockHash>,
    /// A state snapshot asked for: the chain's hashes through its block (its tokens are the
    /// chain's length times the block size).
    state: Option<Vec<BlockHash>>,
}

/// The disk tier (None when it is off) and the sequences parked on its loads.
pub(in crate::engine) struct Parking {
    tier: Option<DiskTier>,
    parked: Vec<Parked>,
    next_ticket: u64,
}

/// A parked sequence ready for the scheduler, and the blocks that came from disk for it.
pub(in crate::engine) struct Unparked {
    pub seq_id: SeqId,
    pub from_disk: HashSet<BlockHash>,
}

impl Parking {
    /// The tier `config` asks for, opened for `model`'s blocks of `block_size` tokens in
    /// `exec`'s pool; off, with a warning, where it cannot be. Also returns the blocks' salt: what
    /// their keys and values depend on besides the tokens (the model's contents, the block size,
    /// the KV cache types, the device), the tier's identity ([`super::identity`]).
    pub(in crate::engine) fn open(
        config: Option<DiskCacheConfig>,
        model: &Model,
        block_size: usize,
        exec: &Executor,
    ) -> (Self, u64) {
        let root = config.as_ref().map(|d| d.root.as_path());
        let salt = super::identity(
            model,
            block_size,
            exec.kv_types(),
            exec.device().name(),
            root,
        );
        let tier = config.and_then(|d| {
            let Some(kv_bytes) = exec.read_block(BlockId(0)).map(|b| b.len()) else {
                eprintln!("warning: the disk cache is off: it does not reach the GPU's KV pool");
                return None;
            };
            let state_bytes = match model.config.is_recurrent() {
                true => StatePool::slot_bytes(&model.config),
                false => 0,
            };
            match DiskTier::open(&d, model, salt, kv_bytes, state_bytes) {
                Ok(t) => Some(t),
                Err(e) => {
                    eprintln!("warning: the disk cache is off: {e:#}");
                    None
                }
            }
        });
        let parking = Parking {
            tier,
            parked: Vec::new(),
            next_ticket: 0,
        };
        (parking, salt)
    }

    pub(in crate::engine) fn is_on(&self) -> bool {
        self.tier.is_some()
    }

    pub(in crate::engine) fn num_parked(&self) -> usize {
        self.parked.len()
    }

    /// The tier's counters, when it is on.
    pub(in crate::engine) fn stats(&self) -> Option<DiskCacheStats> {
        self.tier.as_ref().map(|d| d.stats())
    }

    /// The tier's live counters, for the handle.
    pub(in crate::engine) fn stats_handle(&self) -> Option<DiskStatsHandle> {
        self.tier.as_ref().map(|d| d.stats_handle())
    }

    /// Parks a new sequence whose prompt continues on disk past what memory holds, and asks
    /// the tier for those blocks (for a model with recurrent layers, `states` on: only as far
    /// as the deepest snapshot, and that snapshot when memory lacks it). False (nothing
    /// parked) when there is nothing to load.
    pub(in crate::engine) fn park(
        &mut self,
        seq_id: SeqId,
        prompt: &[u32],
        cache_key: Option<u64>,
        blocks: &BlockManager,
        states: &StateSlots,
    ) -> bool {
        let Some(disk) = &self.tier else {
            return false;
        };
        let hashes = blocks.prompt_block_hashes_keyed(cache_key, prompt);
        let Some(first) = hashes.iter().position(|&h| !blocks.is_cached(h)) else {
            if !states.is_on() {
                return false;
            }
            return self.park_at_snapshot(seq_id, prompt, &hashes, hashes.len(), blocks, states);
        };
        if states.is_on() {
            return self.park_at_snapshot(seq_id, prompt, &hashes, first, blocks, states);
        }
        if !disk.is_written(hashes[first]) {
            return false;
        }
        let bs = blocks.block_size;
        let wanted: Vec<_> = (first..hashes.len())
            .take_while(|&i| disk.is_written(hashes[i]))
            .map(|i| (hashes[i], prompt[i * bs..(i + 1) * bs].to_vec()))
            .collect();
        self.ask(
            seq_id,
            wanted,
            None,
            first.checked_sub(1).map(|i| hashes[i]),
        )
    }

    /// `park` for a model with recurrent layers: the first `first` blocks of the prompt are in
    /// memory; the chain is loaded through the deepest block that has a snapshot (in memory or
    /// on disk) among those in memory or on disk from the start, with its snapshot.
    fn park_at_snapshot(
        &mut self,
        seq_id: SeqId,
        prompt: &[u32],
        hashes: &[BlockHash],
        first: usize,
        blocks: &BlockManager,
        states: &StateSlots,
    ) -> bool {
        let Some(disk) = &self.tier else {
            return false;
        };
        let on_disk = hashes[first..]
            .iter()
            .take_while(|&&h| disk.is_written(h))
            .count();
        let has = |h: BlockHash| states.has_snapshot(h) || disk.has_state(h);
        let Some(j) = (1..=first + on_disk).rev().find(|&j| has(hashes[j - 1])) else {
            return false;
        };
        let in_memory = states.has_snapshot(hashes[j - 1]);
        if j <= first && in_memory {
            return false; // memory resumes as deep
        }
        let bs = blocks.block_size;
        let tokens = |i: usize| prompt[i * bs..(i + 1) * bs].to_vec();
        let wanted = (first..j).map(|i| (hashes[i], tokens(i))).collect();
        let state = (!in_memory).then(|| (hashes[j - 1], tokens(j - 1)));
        let parent = first.checked_sub(1).map(|i| hashes[i]);
        if !self.ask(seq_id, wanted, state, parent) {
            return false;
        }
        let parked = self.parked.last_mut().expect("just parked");
        parked.state = Some(hashes[..j].to_vec());
        true
    }

    /// Asks the tier for `wanted` blocks (and `state`) and parks `seq_id` on the answer.
    fn ask(
        &mut self,
        seq_id: SeqId,
        wanted: Vec<(BlockHash, Vec<u32>)>,
        state: Option<(BlockHash, Vec<u32>)>,
        parent: Option<BlockHash>,
    ) -> bool {
        let Some(disk) = &self.tier else {
            return false;
        };
        self.next_ticket += 1;
        let ticket = self.next_ticket;
        if !disk.load(ticket, wanted, state) {
            return false;
        }
        self.parked.push(Parked {
            seq_id,
            ticket,
            deadline: Instant::now() + DISK_LOAD_WAIT,
            parent,
            state: None,
        });
        true
    }

    /// Stops waiting for `seq_id`'s load; true when it was parked (the caller schedules it).
    pub(in crate::engine) fn unpark(&mut self, seq_id: SeqId) -> bool {
        let i = self.parked.iter().position(|p| p.seq_id == seq_id);
        i.map(|i| self.parked.remove(i)).is_some()
    }

    /// Stops waiting for every load (the engine is shutting down).
    pub(in crate::engine) fn unpark_all(&mut self) -> Vec<SeqId> {
        self.parked.drain(..).map(|p| p.seq_id).collect()
    }

    /// Takes in the tier's answers: loaded blocks enter the KV pool as cached blocks and their
    /// sequences are returned for the scheduler; so are sequences whose load is late (without
    /// it).
    pub(in crate::engine) fn poll(
        &mut self,
        blocks: &mut BlockManager,
        states: &mut StateSlots,
        exec: &mut Executor,
    ) -> Vec<Unparked> {
        let mut ready = Vec::new();
        while let Some(loaded) = self.tier.as_ref().and_then(|d| d.try_loaded()) {
            let Some(i) = self.parked.iter().position(|p| p.ticket == loaded.ticket) else {
                continue; // its request was aborted; the blocks stay on disk
            };
            let p = self.parked.remove(i);
            let mut parent = p.parent;
            let mut from_disk = HashSet::new();
            for (hash, token_ids, kv) in loaded.blocks {
                if !blocks.is_cached(hash) {
                    let Some(id) = blocks.insert_cached(hash, parent, &token_ids) else {
                        break;
                    };
                    self.save_evicted(blocks, exec);
                    if let Err(e) = exec.write_block(id, &kv) {
                        eprintln!("warning: disk cache: {e:#}; leaving it off");
                        self.tier = None;
                        break;
                    }
                    from_disk.insert(hash);
                }
                parent = Some(hash);
            }
            if let Some(chain) = &p.state {
                self.restore_state(chain, loaded.state.as_deref(), blocks, states, exec);
            }
            ready.push(Unparked {
                seq_id: p.seq_id,
                from_disk,
            });
        }
        let now = Instant::now();
        let off = self.tier.is_none();
        let (late, waiting): (Vec<Parked>, Vec<Parked>) = std::mem::take(&mut self.parked)
            .into_iter()
            .partition(|p| p.deadline <= now || off);
        self.parked = waiting;
        ready.extend(late.into_iter().map(|p| Unparked {
            seq_id: p.seq_id,
            from_disk: HashSet::new(),
        }));
        ready
    }

    /// Puts a snapshot read from disk (at the end of the chain `chain`; None: memory holds
    /// it) into a snapshot slot, when the chain's blocks are all in memory now, and announces
    /// the chain.
    fn restore_state(
        &mut self,
        chain: &[BlockHash],
        bytes: Option<&[u8]>,
        blocks: &mut BlockManager,
        states: &mut StateSlots,
        exec: &mut Executor,
    ) {
        let Some(&hash) = chain.last() else { return };
        if !chain.iter().all(|&h| blocks.is_cached(h)) {
            return;
        }
        let Some(bytes) = bytes else {
            if states.has_snapshot(hash) {
                blocks.announce_chain(chain);
            }
            return;
        };
        let Some(slot) = states.insert_snapshot(hash) else {
            return;
        };
        if let Err(e) = exec.write_state(slot, bytes, chain.len() * blocks.block_size) {
            eprintln!("warning: disk cache: {e:#}; leaving it off");
            states.retain_snapshots(|h| h != hash);
            self.tier = None;
            return;
        }
        blocks.announce_chain(chain);
    }

    /// Writes the state snapshots just taken (`StateSlots::take_taken`, their copies made)
    /// beside their blocks.
    pub(in crate::engine) fn save_snapshots(
        &self,
        taken: Vec<(BlockHash, StateSlot)>,
        blocks: &BlockManager,
        exec: &Executor,
    ) {
        let Some(disk) = &self.tier else { return };
        for (hash, slot) in taken {
            let Some(token_ids) = blocks.cached_tokens(hash) else {
                continue;
            };
            if !disk.has_state(hash) {
                if let Some(bytes) = exec.read_state(slot) {
                    disk.write_state(hash, token_ids.to_vec(), bytes);
                }
            }
        }
    }

    /// Hands the cached blocks just evicted from the pool to the tier (their slots still hold
    /// their keys and values), unless it has them.
    pub(in crate::engine) fn save_evicted(&self, blocks: &mut BlockManager, exec: &Executor) {
        let evicted = blocks.take_evicted();
        let Some(disk) = &self.tier else { return };
        for (id, hash, token_ids) in evicted {
            if !disk.contains(hash) {
                if let Some(kv) = exec.read_block(id) {
                    disk.write(hash, token_ids, kv);
                }
            }
        }
    }

    /// Writes behind: the full blocks of a sequence that ends (its `block_table`) go to the tier.
    pub(in crate::engine) fn write_behind(
        &self,
        block_table: &[BlockId],
        blocks: &BlockManager,
        exec: &Executor,
    ) {
        let Some(disk) = &self.tier else { return };
        for &id in block_table {
            let Some((hash, token_ids)) = blocks.registered(id) else {
                continue;
            };
            if !disk.contains(hash) {
                if let Some(kv) = exec.read_block(id) {
                    disk.write(hash, token_ids.to_vec(), kv);
                }
            }
        }
    }
}

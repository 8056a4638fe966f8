//! Recurrent state slots in integers: which slot of the state pool (`crate::model::state_pool`)
//! each running sequence of a model with recurrent layers holds. Owned by the scheduler, beside
//! the block manager: a sequence takes a slot when it starts running and gives it back when it
//! finishes, is cancelled or is preempted (preemption recomputes from token 0, and a run that
//! starts at position 0 starts from a zero state); a fork takes a slot of its own and a copy of
//! its parent's state (`StateCopy`, made by the worker before the next step). Tested without a
//! model, like the block manager.
//!
//! Snapshots keep prefix caching for these models: a sequence whose prompt's chain of blocks
//! enters the prefix cache has its state copied, when its prefill reaches the prompt's last full
//! block (the scheduler cuts the chunk there), into a snapshot slot keyed by that block's
//! hash (so salted per cache key like the blocks). A later prompt matching cached blocks resumes
//! from the deepest matched block that has a snapshot: the snapshot is copied into its own slot
//! and only the tokens after it are computed. Snapshots take slots of their own (as many as
//! the running ones, `pool_slots`), the least recently used given up first when a new one needs
//! a slot, but those taken every `--state-snapshot-every` blocks inside a prompt before any
//! taken at a prompt's end (which a conversation's next turn resumes from). A snapshot is never wrong for its hash: the same chain of tokens gives the same state.
//! A snapshot goes with its block: once the block of its hash leaves the prefix cache (evicted
//! for new tokens), the snapshot is dropped too (`retain_snapshots`, called by the scheduler),
//! since no prompt can resume from it without the blocks before it. With the disk tier on, each
//! snapshot taken is also written beside its block (`take_taken`), and one read back from disk
//! enters a snapshot slot of its own (`insert_snapshot`).

use std::collections::{HashMap, HashSet};

use super::sequence::Sequence;
pub use crate::model::state_pool::StateSlot;

/// Blocks between a prompt's snapshots before its last full block (`--state-snapshot-every`).
pub const DEFAULT_SNAPSHOT_EVERY: usize = 16;

/// A state copy the caller must make before the next forward step (a fork).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateCopy {
    pub src: StateSlot,
    pub dst: StateSlot,
}

/// The pool's slots: `num_total` of them (0 for a model without recurrent layers).
#[derive(Clone, Debug, Default)]
pub struct StateSlots {
    num_total: usize,
    /// Free slots; the last is taken first.
    free: Vec<StateSlot>,
    /// Copies queued by forks, snapshots and resumes since the last `take_copies`.
    copies: Vec<StateCopy>,
    /// Free snapshot slots (ids `num_total..2 * num_total`).
    snapshot_free: Vec<StateSlot>,
    /// Snapshots by the hash of the block they end at: their slot and last use.
    snapshots: HashMap<u64, (StateSlot, u64)>,
    /// The snapshots taken at a prompt's end (or read from disk): evicted after the others.
    ends: HashSet<u64>,
    next_use: u64,
    /// Snapshots taken since the last `take_taken` (hash, slot), for the disk tier.
    taken: Vec<(u64, StateSlot)>,
}

impl StateSlots {
    pub fn new(num_total: usize) -> StateSlots {
        let n = num_total as u32;
        StateSlots {
            num_total,
            free: (0..n).rev().map(StateSlot).collect(),
            copies: Vec::new(),
            snapshot_free: (n..2 * n).rev().map(StateSlot).collect(),
            snapshots: HashMap::new(),
            ends: HashSet::new(),
            next_use: 0,
            taken: Vec::new(),
        }
    }

    /// Slots the model's state pool needs for `num_running` running sequences: as many again
    /// for snapshots.
    pub fn pool_slots(num_running: usize) -> usize {
        2 * num_running
    }

    /// Snapshots kept.
    pub fn num_snapshots(&self) -> usize {
        self.snapshots.len()
    }

    /// Whether a snapshot ends at the block of `hash`.
    pub fn has_snapshot(&self, hash: u64) -> bool {
        self.snapshots.contains_key(&hash)
    }

    /// Keeps `running`'s state (now at the end of the block of `hash`) as that block's
    /// snapshot, in a free snapshot slot or the least recently used one's; nothing when one
    /// exists already.
    pub fn snapshot(&mut self, hash: u64, running: StateSlot) {
        self.take_snapshot(hash, running, true);
    }

    /// As `snapshot`; `end`: taken at a prompt's end (kept longer than one inside a prompt).
    fn take_snapshot(&mut self, hash: u64, running: StateSlot, end: bool) {
        if end && self.has_snapshot(hash) {
            self.ends.insert(hash);
        }
        if self.has_snapshot(hash) || self.num_total == 0 {
            return;
        }
        let dst = self.new_snapshot(hash);
        if end {
            self.ends.insert(hash);
        }
        self.copies.push(StateCopy { src: running, dst });
        self.taken.push((hash, dst));
    }

    /// A snapshot slot for `hash`: a free one or the least recently used snapshot's. Copies
    /// still queued into it are dropped (their snapshot is gone).
    fn new_snapshot(&mut self, hash: u64) -> StateSlot {
        let dst = match self.snapshot_free.pop() {
            Some(s) => s,
            None => {
                let (&old, _) = self
                    .snapshots
                    .iter()
                    .min_by_key(|(h, &(_, used))| (self.ends.contains(h), used))
                    .expect("every snapshot slot holds one");
                self.ends.remove(&old);
                self.snapshots.remove(&old).expect("just found").0
            }
        };
        self.copies.retain(|c| c.dst != dst);
        self.taken.retain(|t| t.1 != dst);
        self.next_use += 1;
        self.snapshots.insert(hash, (dst, self.next_use));
        dst
    }

    /// A snapshot slot for the snapshot of `hash` read from elsewhere (the disk tier), for the
    /// caller to fill now; None when slots are off or it is held already.
    pub fn insert_snapshot(&mut self, hash: u64) -> Option<StateSlot> {
        if self.has_snapshot(hash) || self.num_total == 0 {
            return None;
        }
        let slot = self.new_snapshot(hash);
        self.ends.insert(hash);
        Some(slot)
    }

    /// The slot holding the snapshot of `hash`.
    pub fn snapshot_slot(&self, hash: u64) -> Option<StateSlot> {
        self.snapshots.get(&hash).map(|s| s.0)
    }

    /// Drops every snapshot whose block is gone (`keep(hash)` false): its slot is free again.
    pub fn retain_snapshots(&mut self, keep: impl Fn(u64) -> bool) {
        let gone: Vec<u64> = self
            .snapshots
            .keys()
            .copied()
            .filter(|&h| !keep(h))
            .collect();
        for h in gone {
            let (slot, _) = self.snapshots.remove(&h).expect("listed");
            self.ends.remove(&h);
            self.snapshot_free.push(slot);
        }
    }

    /// The snapshots taken since the last call (hash, slot) that are still held, once their
    /// copies are made (for the disk tier).
    pub fn take_taken(&mut self) -> Vec<(u64, StateSlot)> {
        let taken = std::mem::take(&mut self.taken);
        taken
            .into_iter()
            .filter(|&(h, slot)| self.snapshot_slot(h) == Some(slot))
            .collect()
    }

    /// After a step: snapshots `seq`'s state if its computed tokens end at one of its snapshot
    /// points (`Sequence::snapshot_cut`; `every` in tokens), `block_hash(c)` being the hash of
    /// its block that ends at token `c`. Returns the hash snapshotted at (held before or not).
    pub fn after_step(
        &mut self,
        seq: &Sequence,
        every: usize,
        block_hash: impl Fn(usize) -> Option<u64>,
    ) -> Option<u64> {
        let (Some((at, h)), Some(slot)) = (seq.snapshot_at, seq.state_slot) else {
            return None;
        };
        let c = seq.num_computed;
        let hash = if c == at {
            Some(h)
        } else if every > 0 && c > 0 && c < at && c % every == 0 {
            block_hash(c)
        } else {
            None
        };
        if let Some(h) = hash {
            self.take_snapshot(h, slot, c == at);
        }
        hash
    }

    /// Starts `running` from the snapshot of the block of `hash` (which must exist).
    pub fn resume(&mut self, hash: u64, running: StateSlot) {
        self.next_use += 1;
        let (src, used) = self
            .snapshots
            .get_mut(&hash)
            .expect("a snapshot to resume from");
        *used = self.next_use;
        self.copies.push(StateCopy {
            src: *src,
            dst: running,
        });
    }

    /// How a sequence starts whose prompt's blocks hash to `hashes`, the first `matched`
    /// cached: the blocks it reuses (as far as a snapshot reaches; none when `scoring`, whose
    /// reread row would run the state on) and, when `caching`, where its own snapshot goes (the
    /// tokens of the prompt's last full block and its hash).
    pub fn plan(
        &self,
        hashes: &[u64],
        matched: usize,
        block_size: usize,
        scoring: bool,
        caching: bool,
    ) -> (usize, Option<(usize, u64)>) {
        let keep = if scoring {
            0
        } else {
            self.resume_blocks(hashes, matched)
        };
        let at = hashes.last().filter(|_| caching && !scoring);
        (keep, at.map(|&h| (hashes.len() * block_size, h)))
    }

    /// Checks the slots against the live sequences, each (running, its slot): with slots on,
    /// a sequence holds one exactly while it runs; then `check_invariants`.
    pub fn check_held(
        &self,
        seqs: impl Iterator<Item = (bool, Option<StateSlot>)>,
    ) -> Result<(), String> {
        if !self.is_on() {
            return Ok(());
        }
        let mut held = Vec::new();
        for (running, slot) in seqs {
            if running != slot.is_some() {
                return Err(format!(
                    "a sequence (running: {running}) with state slot {slot:?}"
                ));
            }
            held.extend(slot);
        }
        self.check_invariants(held.into_iter())
    }

    /// Of a prompt's first `matched` cached blocks (chained hashes `hashes`), how many to reuse:
    /// up to the deepest one a snapshot ends at (0: none).
    pub fn resume_blocks(&self, hashes: &[u64], matched: usize) -> usize {
        (1..=matched.min(hashes.len()))
            .rev()
            .find(|&j| self.has_snapshot(hashes[j - 1]))
            .unwrap_or(0)
    }

    /// Whether sequences hold slots (the model has recurrent layers).
    pub fn is_on(&self) -> bool {
        self.num_total > 0
    }

    pub fn num_total(&self) -> usize {
        self.num_total
    }

    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// Whether a sequence could start now: slots are off, or one is free.
    pub fn has_room(&self) -> bool {
        !self.is_on() || !self.free.is_empty()
    }

    /// A free slot, if any.
    pub fn take(&mut self) -> Option<StateSlot> {
        self.free.pop()
    }

    /// Gives a sequence's slot back (none: nothing).
    pub fn give(&mut self, slot: Option<StateSlot>) {
        if let Some(s) = slot {
            debug_assert!(!self.free.contains(&s), "state slot {s} freed twice");
            self.free.push(s);
        }
    }

    /// A slot for a fork of a sequence holding `parent`, with the parent's state copied into it
    /// before the next step; None when no slot is free (the fork then waits to be recomputed).
    pub fn fork(&mut self, parent: StateSlot) -> Option<StateSlot> {
        let dst = self.take()?;
        self.copies.push(StateCopy { src: parent, dst });
        Some(dst)
    }

    /// The copies queued since the last call.
    pub fn take_copies(&mut self) -> Vec<StateCopy> {
        std::mem::take(&mut self.copies)
    }

    /// Checks the slots against those the live sequences hold: each held once, none both free
    /// and held, and free plus held the total.
    pub fn check_invariants(&self, held: impl Iterator<Item = StateSlot>) -> Result<(), String> {
        let mut seen = vec![false; Self::pool_slots(self.num_total)];
        let snapshots = self.snapshots.values().map(|&(s, _)| s);
        let all = self.free.iter().copied().chain(held);
        for s in all
            .chain(self.snapshot_free.iter().copied())
            .chain(snapshots)
        {
            match seen.get_mut(s.index()) {
                None => return Err(format!("state slot {s} outside {}", self.num_total)),
                Some(true) => return Err(format!("state slot {s} free and held, or held twice")),
                Some(x) => *x = true,
            }
        }
        match seen.iter().all(|&x| x) {
            true => Ok(()),
            false => Err("a state slot is neither free nor held".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_taken_given_back_and_forked_with_a_copy() {
        let mut s = StateSlots::new(3);
        let a = s.take().unwrap();
        let b = s.fork(a).unwrap();
        assert_eq!(s.take_copies(), [StateCopy { src: a, dst: b }]);
        assert!(s.take_copies().is_empty());
        s.check_invariants([a, b].into_iter()).unwrap();
        assert!(s.check_invariants([a].into_iter()).is_err());
        assert!(s.check_invariants([a, b, b].into_iter()).is_err());
        let c = s.take().unwrap();
        assert!(s.take().is_none() && s.fork(c).is_none() && !s.has_room());
        s.give(Some(b));
        s.give(None);
        assert_eq!(s.num_free(), 1);
        s.check_invariants([a, c].into_iter()).unwrap();
        assert!(!StateSlots::new(0).is_on() && StateSlots::new(0).has_room());
    }

    #[test]
    fn snapshots_take_their_own_slots_and_the_least_recently_used_goes_first() {
        let mut s = StateSlots::new(2);
        let a = s.take().unwrap();
        s.snapshot(10, a);
        s.snapshot(10, a); // kept once
        let c = s.take_copies();
        assert_eq!(c.len(), 1);
        assert_eq!((c[0].src, c[0].dst.index() >= 2), (a, true));
        s.snapshot(20, a);
        s.take_copies();
        assert_eq!(s.resume_blocks(&[5, 10, 7, 20, 9], 5), 4);
        assert_eq!(s.resume_blocks(&[5, 10, 7, 20, 9], 3), 2);
        assert_eq!(s.resume_blocks(&[5, 6], 2), 0);
        let b = s.take().unwrap();
        s.resume(10, b); // 10 used after 20: 20 is the least recently used now
        assert_eq!(s.take_copies()[0].dst, b);
        s.snapshot(30, b);
        assert!(s.has_snapshot(10) && s.has_snapshot(30) && !s.has_snapshot(20));
        s.check_invariants([a, b].into_iter()).unwrap();
        assert_eq!(s.num_snapshots(), 2);
    }

    #[test]
    fn snapshots_inside_a_prompt_are_given_up_before_those_at_a_prompts_end() {
        let mut s = StateSlots::new(2);
        let a = s.take().unwrap();
        s.take_snapshot(10, a, false); // every K blocks inside a prompt
        s.take_snapshot(20, a, true); // the prompt's end
        s.take_snapshot(30, a, true); // another prompt's end: 10 goes, though 20 is older
        assert!(!s.has_snapshot(10) && s.has_snapshot(20) && s.has_snapshot(30));
        s.take_snapshot(40, a, false);
        assert!(!s.has_snapshot(20) && s.has_snapshot(30) && s.has_snapshot(40));
        s.take_snapshot(40, a, true); // the end of a prompt now: kept as one
        s.take_snapshot(50, a, true);
        assert!(!s.has_snapshot(30) && s.has_snapshot(40) && s.has_snapshot(50));
        s.check_invariants([a].into_iter()).unwrap();
    }

    #[test]
    fn snapshots_go_with_their_blocks_and_one_read_from_disk_takes_a_slot() {
        let mut s = StateSlots::new(2);
        let a = s.take().unwrap();
        s.snapshot(10, a);
        s.snapshot(20, a);
        assert_eq!(s.take_taken().len(), 2);
        // Block 10 left the prefix cache: its snapshot goes, its slot is free again.
        s.retain_snapshots(|h| h != 10);
        assert!(!s.has_snapshot(10) && s.has_snapshot(20));
        s.check_invariants([a].into_iter()).unwrap();
        let loaded = s.insert_snapshot(30).expect("a free slot");
        assert!(s.insert_snapshot(30).is_none(), "held already");
        assert_eq!(s.snapshot_slot(30), Some(loaded));
        assert!(s.take_taken().is_empty(), "read from disk, not taken");
        // A full pool: the least recently used (20) makes room, its queued copy dropped.
        s.snapshot(40, a);
        assert!(!s.has_snapshot(20) && s.has_snapshot(40) && s.has_snapshot(30));
        let copies = s.take_copies();
        assert_eq!(
            copies
                .iter()
                .filter(|c| c.dst == s.snapshot_slot(40).unwrap())
                .count(),
            1
        );
        s.check_invariants([a].into_iter()).unwrap();
    }
}

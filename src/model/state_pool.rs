//! The recurrent state pool: fixed-size slots, each holding one sequence's state in every
//! recurrent layer (for LFM2's short convolutions, the last `l_cache - 1` inputs of each
//! channel), beside the paged KV pool and sized from the same memory budget. Which slot belongs
//! to whom is the engine's integer bookkeeping (`crate::engine::state_slots`); the batch names
//! each sequence row's slot (`Batch::state_slots`). This module owns the memory and checks, per
//! step, that each row's tokens continue its slot's state: a run starting at position 0 starts
//! from zeros, any other must start where the slot's state ends, so a state is never applied
//! to the wrong tokens (a prefix-cache hit or a rolled-back proposal would be caught here).
//! Used by the CPU backend (`super::cpu`).

use anyhow::{bail, Result};

use super::{Batch, ModelConfig};

/// A slot of the state pool: one sequence's recurrent state in every recurrent layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StateSlot(pub u32);

impl StateSlot {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl std::fmt::Display for StateSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// One sequence row's tokens in a step: batch rows `first..first + len` (consecutive
/// positions), its slot, and whether its state starts from zeros (position 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateRun {
    pub slot: StateSlot,
    pub first: usize,
    pub len: usize,
    pub reset: bool,
}

/// The states of `num_slots` sequences.
#[derive(Default)]
pub struct StatePool {
    /// Where each recurrent layer's state starts in a slot, and (last) a slot's floats.
    offsets: Vec<usize>,
    /// [num_slots][slot_floats], a slot laid out layer by layer
    state: Vec<f32>,
    /// Tokens each slot's state has seen (the position its next token must have).
    covers: Vec<usize>,
}

impl StatePool {
    /// Slots for `num_slots` sequences of a model of `c` (none when it has no recurrent layer).
    pub fn new(c: &ModelConfig, num_slots: usize) -> StatePool {
        let mut offsets = vec![0];
        for l in 0..c.layers.len() {
            let n = c.layer_state_floats(l);
            if n > 0 {
                offsets.push(offsets[offsets.len() - 1] + n);
            }
        }
        let num_slots = if c.is_recurrent() { num_slots } else { 0 };
        let slot_floats = offsets[offsets.len() - 1];
        StatePool {
            offsets,
            state: vec![0.0; num_slots * slot_floats],
            covers: vec![0; num_slots],
        }
    }

    pub fn num_slots(&self) -> usize {
        self.covers.len()
    }

    /// Bytes one slot takes.
    pub fn slot_bytes(c: &ModelConfig) -> usize {
        4 * c.state_floats()
    }

    fn slot_floats(&self) -> usize {
        self.offsets.last().copied().unwrap_or(0)
    }

    /// Recurrent layer `r`'s state in `slot` (the `r`-th layer with a state; its kind's shape,
    /// e.g. [l_cache - 1][n_embd] for a short convolution).
    pub fn layer_mut(&mut self, slot: StateSlot, r: usize) -> &mut [f32] {
        let at = slot.index() * self.slot_floats();
        &mut self.state[at + self.offsets[r]..at + self.offsets[r + 1]]
    }

    /// Copies slot `src` onto `dst` (a forked sequence continues its parent's state).
    pub fn copy(&mut self, src: StateSlot, dst: StateSlot) -> Result<()> {
        let n = self.slot_floats();
        if src.index() >= self.num_slots() || dst.index() >= self.num_slots() {
            bail!(
                "state slot copy {src} -> {dst} outside a pool of {}",
                self.num_slots()
            );
        }
        self.state
            .copy_within(src.index() * n..(src.index() + 1) * n, dst.index() * n);
        self.covers[dst.index()] = self.covers[src.index()];
        Ok(())
    }

    /// Slot `slot`'s state as little-endian bytes (every recurrent layer's, in layer order),
    /// for the disk tier; None outside the pool.
    pub fn read_slot(&self, slot: StateSlot) -> Option<Vec<u8>> {
        let n = self.slot_floats();
        let floats = self.state.get(slot.index() * n..(slot.index() + 1) * n)?;
        Some(floats.iter().flat_map(|x| x.to_le_bytes()).collect())
    }

    /// Fills slot `slot` from bytes `read_slot` gave, a state that has seen `covers` tokens.
    pub fn write_slot(&mut self, slot: StateSlot, bytes: &[u8], covers: usize) -> Result<()> {
        let n = self.slot_floats();
        if slot.index() >= self.num_slots() || bytes.len() != 4 * n {
            bail!(
                "state slot {slot} of a pool of {} written with {} bytes (a slot holds {})",
                self.num_slots(),
                bytes.len(),
                4 * n
            );
        }
        let dst = &mut self.state[slot.index() * n..(slot.index() + 1) * n];
        for (x, b) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
            *x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        self.covers[slot.index()] = covers;
        Ok(())
    }

    /// The step's runs, one per sequence row with a slot, checked: each row's tokens are
    /// consecutive in the batch and in position, and start at 0 or where the slot's state ends.
    /// Records that each slot's state will cover its run (the step then computes it).
    pub fn begin_step(&mut self, batch: &Batch) -> Result<Vec<StateRun>> {
        if batch.state_slots.is_empty() {
            return Ok(Vec::new());
        }
        let mut runs: Vec<Option<StateRun>> = vec![None; batch.state_slots.len()];
        for t in 0..batch.n_tokens() {
            let seq = batch.token_seq[t] as usize;
            let Ok(slot) = u32::try_from(batch.state_slots[seq]) else {
                bail!("sequence row {seq} has no state slot");
            };
            let pos = batch.positions[t] as usize;
            match &mut runs[seq] {
                None => {
                    runs[seq] = Some(StateRun {
                        slot: StateSlot(slot),
                        first: t,
                        len: 1,
                        reset: pos == 0,
                    })
                }
                Some(run) => {
                    let start = batch.positions[run.first] as usize;
                    if run.first + run.len != t || start + run.len != pos {
                        bail!("sequence row {seq}: its tokens are not one run of consecutive positions");
                    }
                    run.len += 1;
                }
            }
        }
        let runs: Vec<StateRun> = runs.into_iter().flatten().collect();
        let mut seen = vec![false; self.num_slots()];
        for run in &runs {
            let s = run.slot.index();
            if s >= self.num_slots() || std::mem::replace(&mut seen[s], true) {
                bail!(
                    "state slot {} is outside the pool of {} or used twice",
                    run.slot,
                    self.num_slots()
                );
            }
            let start = batch.positions[run.first] as usize;
            if !run.reset && self.covers[s] != start {
                bail!(
                    "state slot {} covers {} tokens, but its sequence continues at position {start}",
                    run.slot,
                    self.covers[s]
                );
            }
        }
        for run in &runs {
            self.covers[run.slot.index()] = batch.positions[run.first] as usize + run.len;
        }
        Ok(runs)
    }
}

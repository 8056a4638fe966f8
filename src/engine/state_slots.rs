//! Recurrent state slots in integers: which slot of the state pool (`crate::model::state_pool`)
//! each running sequence of a model with recurrent layers holds. Owned by the scheduler, beside
//! the block manager: a sequence takes a slot when it starts running and gives it back when it
//! finishes, is cancelled or is preempted (preemption recomputes from token 0, and a run that
//! starts at position 0 starts from a zero state); a fork takes a slot of its own and a copy of
//! its parent's state (`StateCopy`, made by the worker before the next step). Tested without a
//! model, like the block manager.

pub use crate::model::state_pool::StateSlot;

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
    /// Copies queued by forks since the last `take_copies`.
    copies: Vec<StateCopy>,
}

impl StateSlots {
    pub fn new(num_total: usize) -> StateSlots {
        StateSlots {
            num_total,
            free: (0..num_total as u32).rev().map(StateSlot).collect(),
            copies: Vec::new(),
        }
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
        let mut seen = vec![false; self.num_total];
        for s in self.free.iter().copied().chain(held) {
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
}

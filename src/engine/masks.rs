//! Token masks for the constrained rows of a step. The worker takes the constraint states of the
//! rows that will sample this step, computes all their masks together (rayon) on a helper thread
//! while the forward pass runs, and applies each mask to its row's logits before sampling.
//! Unconstrained rows never wait for a mask: they have none, and the masks are usually ready
//! before the logits are.

use std::collections::HashMap;
use std::time::Instant;

use rayon::prelude::*;
use toktrie::SimpleVob;

use crate::constraint::ConstraintState;

/// A row's mask, or why it could not be computed (that request ends with the error).
pub(super) type MaskResult = Result<SimpleVob, String>;

/// Masks of every state in `jobs`, by sequence id, and the time spent (summed over rows, in
/// microseconds).
pub(super) fn compute_all(jobs: &mut [(u64, ConstraintState)]) -> (HashMap<u64, MaskResult>, u64) {
    let results: Vec<(u64, MaskResult, u64)> = jobs
        .par_iter_mut()
        .map(|(id, state)| {
            let t = Instant::now();
            let mask = state.compute_mask();
            (*id, mask, t.elapsed().as_micros() as u64)
        })
        .collect();
    let micros = results.iter().map(|r| r.2).sum();
    (
        results.into_iter().map(|(id, m, _)| (id, m)).collect(),
        micros,
    )
}

/// `logits` with every token the mask disallows set to minus infinity. End-of-generation tokens
/// (`eog`) are allowed wherever the grammar's own end token is, so a chat model may end its turn
/// with the token it was trained to end with.
pub(super) fn apply(logits: &[f32], mask: &SimpleVob, eos: Option<u32>, eog: &[u32]) -> Vec<f32> {
    let end_allowed = eos.is_some_and(|e| (e as usize) < mask.len() && mask.is_allowed(e));
    logits
        .iter()
        .enumerate()
        .map(|(i, &l)| {
            let allowed = (i < mask.len() && mask.is_allowed(i as u32))
                || (end_allowed && eog.binary_search(&(i as u32)).is_ok());
            if allowed {
                l
            } else {
                f32::NEG_INFINITY
            }
        })
        .collect()
}

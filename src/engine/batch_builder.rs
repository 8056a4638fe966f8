//! The one bridge from scheduled sequences to the model: turns a scheduler output into the
//! flat [`Batch`] (token ids, positions, slot mapping, block tables, which rows want logits).

use super::scheduler::{Scheduler, SchedulerOutput};
use crate::model::Batch;

/// Builds the batch of one step. A sequence's row wants logits when the step computes its last
/// token, and so does every proposed token after it (speculative decoding: positions past
/// `tokens` take the sequence's `draft`); the rows of the returned batch's logits follow
/// `out.scheduled` order.
pub fn build_batch(sched: &Scheduler, out: &SchedulerOutput) -> Batch {
    let bs = sched.blocks.block_size;
    let max_blocks = out
        .scheduled
        .iter()
        .map(|&(id, _)| {
            sched
                .get(id)
                .expect("scheduled sequences are live")
                .block_table
                .len()
        })
        .max()
        .unwrap_or(0);
    let mut batch = Batch::with_max_blocks(max_blocks);
    for &(id, n) in &out.scheduled {
        let seq = sched.get(id).expect("scheduled sequences are live");
        let len = seq.tokens.len();
        let token_at = |pos: usize| {
            if pos < len {
                seq.tokens[pos]
            } else {
                seq.draft[pos - len]
            }
        };
        let positions = seq.num_computed..seq.num_computed + n;
        batch.push_sequence(&seq.block_table, bs, positions, token_at, len - 1);
    }
    batch
}

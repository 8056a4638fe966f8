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
    let mut batch = Batch {
        max_blocks_per_seq: max_blocks,
        ..Default::default()
    };
    for &(id, n) in &out.scheduled {
        let seq = sched.get(id).expect("scheduled sequences are live");
        let row = batch.push_block_table(&seq.block_table);
        let end = seq.num_computed + n;
        let len = seq.tokens.len();
        for pos in seq.num_computed..end {
            let slot = seq.block_table[pos / bs] as usize * bs + pos % bs;
            let token = if pos < len {
                seq.tokens[pos]
            } else {
                seq.draft[pos - len]
            };
            batch.push_token(token, pos, slot, row, pos + 1 >= len);
        }
    }
    batch
}

//! The one bridge from scheduled sequences to the model: turns a scheduler output into the
//! flat [`Batch`] (token ids, positions, slot mapping, block tables, which rows want logits).

use super::scheduler::{Scheduler, SchedulerOutput};
use crate::model::Batch;

/// Builds the batch of one step. A sequence's row wants logits when the step computes its last
/// token; the rows of the returned batch's logits follow `out.scheduled` order.
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
        for pos in seq.num_computed..end {
            let slot = seq.block_table[pos / bs] as usize * bs + pos % bs;
            batch.push_token(seq.tokens[pos], pos, slot, row, pos + 1 == seq.tokens.len());
        }
    }
    batch
}

//! The one bridge from scheduled sequences to the model: turns a scheduler output into the
//! flat [`Batch`] (token ids, positions, slot mapping, block tables, which rows want logits and
//! which want their embedding).

use super::scheduler::{Scheduler, SchedulerOutput};
use super::sequence::SeqId;
use crate::model::Batch;

/// The prompt rows a scoring sequence (`Sequence::prompt_logprobs`) gets in one step: rows
/// `first..first + count` of its positions, each giving the log-probability of the token after
/// it. They come before the sequence's sampling rows in the batch's logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScoreRows {
    pub seq_id: SeqId,
    pub first: usize,
    pub count: usize,
}

/// The step's rows that want their embedding (`Batch::embd_rows`), in the same order: each
/// one's sequence and position.
pub type EmbdRows = Vec<(SeqId, usize)>;

/// Builds the batch of one step. A sequence's row wants logits when the step computes its last
/// token, and so does every proposed token after it (speculative decoding: positions past
/// `tokens` take the sequence's `draft`); a scoring sequence's prompt rows want logits too,
/// and where it resumes after cached blocks, the last cached token is computed again (no KV
/// write) for the row that scores the first uncached token. The rows of the returned batch's
/// logits follow `out.scheduled` order: per sequence its score rows, then its sampling rows.
/// An embedding sequence (`Sequence::embed`) wants no logits, only the embeddings of the rows
/// its pooling reads.
pub fn build_batch(sched: &Scheduler, out: &SchedulerOutput) -> (Batch, Vec<ScoreRows>, EmbdRows) {
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
    let mut scores = Vec::new();
    let mut embd = Vec::new();
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
        let row = batch.push_block_table(&seq.block_table);
        if sched.states.is_on() {
            let slot = seq.state_slot.expect("running sequences hold a state slot");
            batch.state_slots.push(slot.0 as i32);
        }
        let mut first = positions.start;
        let scoring = seq.prompt_logprobs.is_some();
        if scoring && seq.num_cached > 0 && seq.num_computed == seq.num_cached {
            first -= 1;
            batch.push_reread(seq.tokens[first], first, row);
        }
        // Prompt rows before the last prompt token score the token after them.
        let score_end = positions.end.min(seq.prompt_len - 1);
        if scoring && score_end > first {
            scores.push(ScoreRows {
                seq_id: id,
                first,
                count: score_end - first,
            });
        }
        let want =
            |pos: usize| seq.embed.is_none() && (pos >= len - 1 || (scoring && pos < score_end));
        let first_row = batch.n_tokens();
        if let Some(pooling) = seq.embed {
            for pos in positions.clone() {
                if pooling.wants(pos, seq.prompt_len) {
                    batch.embd_rows.push(first_row + pos - positions.start);
                    embd.push((id, pos));
                }
            }
        }
        batch.push_tokens(&seq.block_table, bs, row, positions, token_at, want);
    }
    (batch, scores, embd)
}

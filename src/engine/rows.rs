//! Where a step's rows of logits go, in the batch's order (`batch_builder`): a scoring
//! sequence's prompt rows to `prompt_scores`, then each sequence whose tokens are all computed
//! samples its next token from its row (or verifies its proposed tokens against theirs,
//! `speculative`), and the outcome is applied to the scheduler; an embedding sequence whose
//! prompt is computed sends its embedding instead (`embeddings`).

use std::collections::HashMap;

use super::batch_builder::ScoreRows;
use super::handle::Command;
use super::masks::MaskResult;
use super::output::{After, Outcome};
use super::scheduler::SchedulerOutput;
use super::sequence::SeqId;
use super::worker::Worker;
use super::FinishReason;

impl Worker {
    /// Marks the step's tokens computed and hands every row of `logits` to its sequence.
    pub(super) fn deliver(
        &mut self,
        out: &SchedulerOutput,
        scores: Vec<ScoreRows>,
        logits: &[f32],
        mut masks: HashMap<SeqId, MaskResult>,
    ) {
        let ready = self.sched.step_done(out);
        let vocab = self.model.config.vocab_size;
        // Each ready sequence has one row of logits, and one more per proposed token.
        let drafts: Vec<Vec<u32>> = ready
            .iter()
            .map(|&id| {
                self.sched
                    .get(id)
                    .map(|s| s.draft.clone())
                    .unwrap_or_default()
            })
            .collect();
        // Rows follow the schedule: a scoring sequence's prompt rows first, then its own.
        let mut row = 0;
        let mut scores = scores.into_iter().peekable();
        let mut ready = ready.iter().zip(drafts).peekable();
        for &(id, _) in &out.scheduled {
            if let Some(s) = scores.next_if(|s| s.seq_id == id) {
                self.score_prompt(s, &logits[row * vocab..(row + s.count) * vocab]);
                row += s.count;
            }
            let Some((&seq_id, draft)) = ready.next_if(|(&r, _)| r == id) else {
                continue;
            };
            if self.finish_embedding(seq_id) {
                continue; // it wanted no logits
            }
            let mask = masks.remove(&seq_id);
            let rows = &logits[row * vocab..(row + 1 + draft.len()) * vocab];
            row += 1 + draft.len();
            if draft.is_empty() {
                self.sample(seq_id, rows, mask);
            } else {
                self.verify(seq_id, rows, &draft, mask);
            }
        }
        // A row whose constraint state was lost in a panicking mask and that did not sample
        // ends here, never unconstrained.
        for (id, mask) in masks {
            if let (true, Err(e)) = (self.out.constraint_lost(id), mask) {
                self.fail(id, e);
            }
        }
    }

    /// Samples the next token of `seq_id` from its row of logits and applies the outcome.
    /// Returns the token when it was appended to the sequence.
    pub(super) fn sample(
        &mut self,
        seq_id: SeqId,
        logits: &[f32],
        mut mask: Option<MaskResult>,
    ) -> Option<u32> {
        let seq = self.sched.get(seq_id)?;
        let outcome = self.out.sample(
            seq,
            logits,
            &mut mask,
            &self.model.tokenizer,
            self.max_seq_len(),
            &mut self.metrics,
        );
        match outcome {
            Outcome::Token { token, then } => {
                self.sched.append_token(seq_id, token);
                match then {
                    After::Continue => {}
                    After::Finish(reason) => self.finish(seq_id, reason),
                    After::Abort => {
                        if let Some(request_id) = self.out.request_id(seq_id) {
                            self.handle(Command::Abort(request_id));
                        }
                    }
                }
                Some(token)
            }
            Outcome::Fork(num_forks) => {
                // n > 1: the other completions fork here, sharing every block of the prompt,
                // and each samples this same row first.
                for index in 1..=num_forks {
                    let child = self.new_seq_id();
                    self.sched.fork(seq_id, child);
                    self.out.fork(seq_id, child, index);
                    self.sample(child, logits, None);
                }
                self.sample(seq_id, logits, mask)
            }
            Outcome::Pin => {
                let pin = self.out.request_id(seq_id).unwrap_or_default();
                match self.sched.pin(seq_id, pin, self.pin_limit()) {
                    Ok(_) => self.finish(seq_id, FinishReason::Stop),
                    Err(e) => self.fail(seq_id, e),
                }
                None
            }
            Outcome::Finish(reason) => {
                self.finish(seq_id, reason);
                None
            }
            Outcome::Fail(e) => {
                self.fail(seq_id, e);
                None
            }
        }
    }
}

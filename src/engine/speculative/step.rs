//! The worker's speculative-decoding part of a step (see `engine::speculative`): before scheduling,
//! decoding sequences get proposals (prompt lookup, or one batched run of the draft model); after the forward pass, a sequence with proposals samples
//! row by row with its own sampler while the sampled token equals the proposal, and the
//! scheduler rolls back the keys and values of the rest.

use crate::engine::masks::MaskResult;
use crate::engine::sequence::{SeqId, SeqStatus};
use crate::engine::worker::Worker;

impl Worker {
    /// Gives every decoding sequence that may speculate a proposal for this step (or none, when
    /// the gate says proposals do not pay now).
    pub(in crate::engine) fn propose(&mut self) {
        if !self.speculator.config.enabled {
            return;
        }
        let max_seq_len = self.max_seq_len();
        // Decoding: one token to compute, past its first, unconstrained, speculation allowed.
        let decoding: Vec<(SeqId, usize)> = self
            .sched
            .seq_ids()
            .filter_map(|&id| {
                let seq = self.sched.get(id)?;
                let request = self.out.request(id)?;
                let ok = seq.status == SeqStatus::Running
                    && seq.num_uncomputed() == 1
                    && !seq.generated().is_empty()
                    && request.speculate
                    && !self.out.is_constrained(id);
                // Never propose past max_tokens or the context: what is accepted plus the
                // target's own token must still fit.
                let room = (request.max_tokens.saturating_sub(seq.generated().len()))
                    .min(max_seq_len.saturating_sub(seq.len()))
                    .saturating_sub(1);
                (ok && room > 0).then_some((id, room))
            })
            .collect();
        let on = self.speculator.gate(decoding.len());
        // The draft pool's safety net: whatever is held for sequences gone goes back.
        if let Some(d) = &mut self.speculator.draft {
            let sched = &self.sched;
            d.retain(|id| sched.get(id).is_some());
        }
        let drafts = if on {
            let wants: Vec<(SeqId, &[u32], usize)> = decoding
                .iter()
                .map(|&(id, room)| {
                    let seq = self.sched.get(id).expect("listed above");
                    (id, seq.tokens.as_slice(), room)
                })
                .collect();
            let tokenizer = &self.model.tokenizer;
            self.speculator.propose_all(&wants, |t| tokenizer.is_eog(t))
        } else {
            Vec::new()
        };
        let mut drafts = drafts.into_iter();
        for (id, room) in decoding {
            let mut draft = drafts.next().unwrap_or_default();
            draft.truncate(room);
            self.sched.get_mut(id).expect("listed above").draft = draft;
        }
    }

    /// Verifies `draft` against `rows` (one row of logits per proposed token, plus one): each
    /// row's token is sampled as without speculation; the run goes on while it equals the
    /// proposal. Then the rejected proposals' keys and values are rolled back.
    pub(in crate::engine) fn verify(
        &mut self,
        seq_id: SeqId,
        rows: &[f32],
        draft: &[u32],
        mut mask: Option<MaskResult>,
    ) {
        let vocab = self.model.config.vocab_size;
        let mut accepted = 0;
        for (i, logits) in rows.chunks_exact(vocab).enumerate() {
            let token = self.sample(seq_id, logits, mask.take());
            let live = self.sched.get(seq_id).is_some();
            if !live || token.is_none() || draft.get(i) != token.as_ref() {
                break;
            }
            accepted += 1;
        }
        self.metrics.spec_proposed_tokens += draft.len() as u64;
        self.metrics.spec_accepted_tokens += accepted as u64;
        self.speculator.record(seq_id, draft.len(), accepted);
        self.metrics.spec_blocks_rolled_back += self.sched.settle_draft(seq_id, accepted) as u64;
    }
}

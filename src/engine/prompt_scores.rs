//! Prompt scoring (`Request::prompt_logprobs`: `echo` with `logprobs`, lm-eval's
//! log-likelihoods): every prompt token's log-probability given the tokens before it, gathered
//! as a scoring sequence's rows come out of the forward pass and sent in one `Event::Prompt`
//! when complete.
//!
//! A cached prefix holds keys and values, not the logits that scored its tokens, so the scores
//! of every full prompt block are kept too, by block hash (the hash names the whole prefix up
//! to the block's end, so the scores are the same for every prompt that shares it), in LRU
//! order under a byte budget. The scheduler reuses a scoring sequence's cached blocks only as
//! far as their scores are kept (`Scheduler::scored`, kept in step with this store here); the
//! batch builder then computes the last cached token again, without writing its KV slot, for
//! the row that scores the first uncached token. So the choices of a multiple-choice question
//! share their context's blocks and its scores, and each computes only its own tokens.

use std::collections::{BTreeMap, HashMap};

use super::batch_builder::ScoreRows;
use super::block_manager::BlockHash;
use super::output::token_logprobs;
use super::sequence::SeqId;
use super::worker::Worker;
use super::TokenLogprobs;

/// A step's prompt rows of logits are capped near this size (`Scheduler::max_score_rows`).
pub const SCORE_LOGITS_BYTES: usize = 256 << 20;

/// The kept scores' budget: about 24 KiB a 16-token block at 20 alternatives.
pub const KEPT_SCORES_BYTES: usize = 64 << 20;

/// The scores of one full prompt block, one entry per token (the prompt's first token has
/// none), each with `k` top alternatives.
struct Kept {
    k: usize,
    rows: Vec<Option<TokenLogprobs>>,
    /// Its place in the LRU order.
    tick: u64,
}

#[derive(Default)]
pub(super) struct PromptScores {
    /// Scores gathered so far per scoring sequence: one slot per prompt token.
    progress: HashMap<SeqId, Vec<Option<TokenLogprobs>>>,
    kept: HashMap<BlockHash, Kept>,
    /// Kept hashes by tick, least recently used first.
    order: BTreeMap<u64, BlockHash>,
    next_tick: u64,
    bytes: usize,
}

fn kept_bytes(rows: &[Option<TokenLogprobs>]) -> usize {
    let row = |r: &Option<TokenLogprobs>| r.as_ref().map_or(0, |l| l.top.len() * 8);
    64 + rows.iter().map(|r| 32 + row(r)).sum::<usize>()
}

impl PromptScores {
    fn touch(&mut self, hash: BlockHash) {
        let tick = self.next_tick;
        if let Some(kept) = self.kept.get_mut(&hash) {
            self.order.remove(&kept.tick);
            kept.tick = tick;
            self.order.insert(tick, hash);
            self.next_tick += 1;
        }
    }

    /// Keeps `rows` as the scores of block `hash` (replacing fewer alternatives); returns the
    /// hashes evicted to stay within the budget.
    fn keep(
        &mut self,
        hash: BlockHash,
        k: usize,
        rows: Vec<Option<TokenLogprobs>>,
    ) -> Vec<BlockHash> {
        if self.kept.get(&hash).is_some_and(|kept| kept.k >= k) {
            self.touch(hash);
            return Vec::new();
        }
        if let Some(old) = self.kept.remove(&hash) {
            self.order.remove(&old.tick);
            self.bytes -= kept_bytes(&old.rows);
        }
        self.bytes += kept_bytes(&rows);
        let tick = self.next_tick;
        self.next_tick += 1;
        self.kept.insert(hash, Kept { k, rows, tick });
        self.order.insert(tick, hash);
        let mut evicted = Vec::new();
        while self.bytes > KEPT_SCORES_BYTES {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            if let Some(old) = self.kept.remove(&oldest) {
                self.bytes -= kept_bytes(&old.rows);
            }
            evicted.push(oldest);
        }
        evicted
    }

    /// Forgets a sequence's scores in progress (it finished or was aborted).
    pub(super) fn forget(&mut self, seq_id: SeqId) {
        self.progress.remove(&seq_id);
    }

    /// Number of blocks whose scores are kept.
    pub(super) fn num_kept(&self) -> usize {
        self.kept.len()
    }
}

/// The top `k` of kept scores that kept at least `k`.
fn truncated(row: &Option<TokenLogprobs>, k: usize) -> Option<TokenLogprobs> {
    row.as_ref().map(|l| TokenLogprobs {
        logprob: l.logprob,
        top: l.top.iter().take(k).copied().collect(),
    })
}

impl Worker {
    /// Starts the scores of the scoring sequences this step admitted: their cached blocks'
    /// kept scores (the scheduler reused no block without them).
    pub(super) fn start_prompt_scores(&mut self, scheduled: &[(SeqId, usize)]) {
        let bs = self.sched.blocks.block_size;
        for &(id, _) in scheduled {
            let Some(seq) = self.sched.get(id) else {
                continue;
            };
            let Some(k) = seq.prompt_logprobs else {
                continue;
            };
            if seq.num_computed != seq.num_cached {
                continue; // admitted earlier: its scores are under way
            }
            let prompt = &seq.tokens[..seq.prompt_len];
            let hashes = self
                .sched
                .blocks
                .prompt_block_hashes_keyed(seq.cache_key, prompt);
            let mut rows = vec![None; seq.prompt_len];
            for (b, hash) in hashes.iter().take(seq.num_cached / bs).enumerate() {
                self.scores.touch(*hash);
                let kept = self.scores.kept.get(hash).expect("the scheduler checked");
                for (j, row) in kept.rows.iter().enumerate() {
                    rows[b * bs + j] = truncated(row, k);
                }
            }
            self.scores.progress.insert(id, rows);
            self.finish_prompt_scores(id); // a one-token prompt has nothing to score
        }
    }

    /// Scores the prompt tokens after rows `s` of this step's `logits` ([s.count][vocab]); once
    /// every prompt token is scored, sends the scores and keeps the full blocks'.
    pub(super) fn score_prompt(&mut self, s: ScoreRows, logits: &[f32]) {
        let vocab = self.model.config.vocab_size;
        let Some(seq) = self.sched.get(s.seq_id) else {
            return;
        };
        let Some(k) = seq.prompt_logprobs else {
            return;
        };
        let Some(rows) = self.scores.progress.get_mut(&s.seq_id) else {
            return;
        };
        for (i, row) in logits.chunks_exact(vocab).take(s.count).enumerate() {
            let pos = s.first + i + 1;
            rows[pos] = Some(token_logprobs(row, seq.tokens[pos], k));
        }
        self.finish_prompt_scores(s.seq_id);
    }

    /// Once every prompt token of `seq_id` is scored: keeps the full blocks' scores, sends
    /// them all, and ends the sequence's scoring.
    fn finish_prompt_scores(&mut self, seq_id: SeqId) {
        let Some(seq) = self.sched.get(seq_id) else {
            return;
        };
        let (Some(k), Some(rows)) = (seq.prompt_logprobs, self.scores.progress.get(&seq_id)) else {
            return;
        };
        if !rows.iter().skip(1).all(Option::is_some) {
            return;
        }
        let rows = self.scores.progress.remove(&seq_id).unwrap_or_default();
        let tokens = seq.tokens[..seq.prompt_len].to_vec();
        let bs = self.sched.blocks.block_size;
        let hashes = self
            .sched
            .blocks
            .prompt_block_hashes_keyed(seq.cache_key, &tokens);
        for (b, hash) in hashes.into_iter().enumerate() {
            let block = rows[b * bs..(b + 1) * bs].to_vec();
            for gone in self.scores.keep(hash, k, block) {
                self.sched.scored.remove(&gone);
            }
            let kept = self.scores.kept.get(&hash).map(|kept| kept.k);
            if let Some(kept) = kept {
                self.sched.scored.insert(hash, kept);
            }
        }
        if let Some(seq) = self.sched.get_mut(seq_id) {
            seq.prompt_logprobs = None;
        }
        self.out.send_prompt_scores(seq_id, tokens, rows);
    }
}

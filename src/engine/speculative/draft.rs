//! The draft-model proposer: a small model with the target's vocabulary, run by the engine
//! thread on its own KV pool, proposes each speculating sequence's next tokens greedily (its
//! argmax, so the proposal is deterministic and `speculative::verify`'s exact acceptance holds for
//! sampling too). Every proposal is one batched catch-up step (the tokens the target accepted
//! since the draft last saw the sequence, plus its own last token) and one batched step per
//! further proposed token, over all speculating sequences at once.
//!
//! The draft's KV follows the target's tokens: each sequence remembers the tokens its draft
//! blocks hold (`held`); before proposing, they are cut back to the longest prefix they share
//! with the target's tokens (rejected proposals roll back there) and the blocks past it go back
//! to the pool. A sequence that ends, fails or is preempted gives its draft blocks back
//! (`forget`). When the draft pool cannot hold a sequence, that sequence's draft blocks are
//! freed and it is not proposed for this step: speculation degrades, the request never fails.
//!
//! `check_vocab` is the load-time check that the pair share tokens, token types, merges and
//! special ids.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use super::cost::StepCost;
use crate::device::{Executor, Placement};
use crate::engine::block_manager::{BlockId, BlockManager};
use crate::engine::sequence::SeqId;
use crate::gguf::GgufFile;
use crate::model::{Batch, Model};

/// The draft model and the size of its KV pool, as `SpecConfig` carries them.
#[derive(Clone)]
pub struct DraftSetup {
    pub model: Arc<Model>,
    /// Blocks in the draft's KV pool (of the engine's block size).
    pub num_blocks: usize,
}

impl std::fmt::Debug for DraftSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraftSetup")
            .field("model", &self.model.file.path())
            .field("num_blocks", &self.num_blocks)
            .finish()
    }
}

impl PartialEq for DraftSetup {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.model, &other.model) && self.num_blocks == other.num_blocks
    }
}

impl Eq for DraftSetup {}

/// The tokenizer metadata a draft must share with its target: the vocabulary's kind and
/// pre-tokenizer, its tokens, their types, the merges, and every special id.
const SAME_KEYS: &[&str] = &[
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.eom_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.seperator_token_id",
    "tokenizer.ggml.mask_token_id",
    "tokenizer.ggml.fim_pre_token_id",
    "tokenizer.ggml.fim_suf_token_id",
    "tokenizer.ggml.fim_mid_token_id",
    "tokenizer.ggml.fim_pad_token_id",
    "tokenizer.ggml.fim_rep_token_id",
    "tokenizer.ggml.fim_sep_token_id",
];

/// Checks that `draft` can propose tokens for `target`: the same tokenizer metadata, key by
/// key. The error is one line naming the first difference.
pub fn check_vocab(target: &Model, draft: &Model) -> Result<()> {
    let (t, d) = (&*target.file, &*draft.file);
    for key in SAME_KEYS {
        if let Some(why) = differs(t, d, key) {
            bail!(
                "the draft model {} does not share the target's vocabulary: {why}",
                d.path().display()
            );
        }
    }
    Ok(())
}

/// How `key` differs between the target `t` and the draft `d`, if it does.
fn differs(t: &GgufFile, d: &GgufFile, key: &str) -> Option<String> {
    let short = key.trim_start_matches("tokenizer.ggml.");
    let (a, b) = (t.get(key), d.get(key));
    match (a, b) {
        (None, None) => None,
        (Some(_), None) => Some(format!(
            "{short} is set in the target, missing in the draft"
        )),
        (None, Some(_)) => Some(format!(
            "{short} is set in the draft, missing in the target"
        )),
        (Some(a), Some(b)) => {
            if let (Some(x), Some(y)) = (a.as_u64(), b.as_u64()) {
                return (x != y).then(|| format!("{short} is {x} in the target, {y} in the draft"));
            }
            if let (Some(x), Some(y)) = (a.as_str(), b.as_str()) {
                return (x != y)
                    .then(|| format!("{short} is {x:?} in the target, {y:?} in the draft"));
            }
            if let (Ok(x), Ok(y)) = (t.get_str_array(key), d.get_str_array(key)) {
                return first_difference(x, y).map(|(i, p, q)| match (p, q) {
                    (Some(p), Some(q)) => {
                        format!("{short}[{i}] is {p:?} in the target, {q:?} in the draft")
                    }
                    _ => format!(
                        "{short}: the target has {} entries, the draft {}",
                        x.len(),
                        y.len()
                    ),
                });
            }
            if let (Ok(x), Ok(y)) = (t.get_i32_array(key), d.get_i32_array(key)) {
                return first_difference(x, y).map(|(i, p, q)| match (p, q) {
                    (Some(p), Some(q)) => {
                        format!("{short}[{i}] is {p} in the target, {q} in the draft")
                    }
                    _ => format!(
                        "{short}: the target has {} entries, the draft {}",
                        x.len(),
                        y.len()
                    ),
                });
            }
            (format!("{a:?}") != format!("{b:?}")).then(|| format!("{short} differs"))
        }
    }
}

/// The first index where `a` and `b` differ, with their entries there (None past an end).
fn first_difference<'a, T: PartialEq>(
    a: &'a [T],
    b: &'a [T],
) -> Option<(usize, Option<&'a T>, Option<&'a T>)> {
    let n = a.len().max(b.len());
    (0..n)
        .find(|&i| a.get(i) != b.get(i))
        .map(|i| (i, a.get(i), b.get(i)))
}

/// What the draft holds for one target sequence.
#[derive(Default)]
struct DraftSeq {
    table: Vec<BlockId>,
    /// The tokens whose keys and values the blocks of `table` hold, in order.
    held: Vec<u32>,
}

/// One sequence's part of a proposal round.
struct Round {
    seq_id: SeqId,
    /// Tokens still to propose after the one the last step's logits give.
    left: usize,
    proposal: Vec<u32>,
}

/// Runs the draft model for the engine: its weights, its KV pool and what each sequence holds.
pub struct DraftRunner {
    model: Arc<Model>,
    exec: Executor,
    blocks: BlockManager,
    seqs: HashMap<SeqId, DraftSeq>,
    /// Time of draft steps against their rows (the catch-up step has more).
    pub cost: StepCost,
    /// Most rows one catch-up step runs; longer catch-ups (a new sequence's prompt) go in chunks.
    max_rows: usize,
    /// Ids the target may receive (its logits rows); a proposal stops before anything else.
    target_vocab: usize,
    /// The draft's weight bytes over the target's: a draft step's cost relative to a target
    /// step's, before any was measured (both read their weights once per step).
    pub bytes_ratio: f64,
}

impl DraftRunner {
    /// Loads the draft onto `placement` with a pool of `setup.num_blocks` blocks of
    /// `block_size` tokens of its cache types, after checking it shares `target`'s vocabulary.
    pub fn new(
        setup: &DraftSetup,
        target: &Model,
        placement: Placement,
        block_size: usize,
        max_rows: usize,
    ) -> Result<Self> {
        check_vocab(target, &setup.model)?;
        if setup.num_blocks == 0 {
            bail!("the draft model's KV pool needs at least one block");
        }
        let exec = Executor::new(&setup.model, placement, block_size, setup.num_blocks)
            .context("starting the draft model")?;
        Ok(DraftRunner {
            model: setup.model.clone(),
            exec,
            blocks: BlockManager::new(setup.num_blocks, block_size, 0),
            seqs: HashMap::new(),
            cost: StepCost::default(),
            max_rows: max_rows.max(1),
            target_vocab: target.config.vocab_size,
            bytes_ratio: setup.model.file.file_bytes() as f64
                / target.file.file_bytes().max(1) as f64,
        })
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.num_blocks()
    }

    pub fn num_free(&self) -> usize {
        self.blocks.num_free()
    }

    /// Gives back the draft blocks of a sequence that ended or was preempted.
    pub fn forget(&mut self, seq_id: SeqId) {
        if let Some(mut s) = self.seqs.remove(&seq_id) {
            self.blocks.free(&mut s.table);
        }
    }

    /// Forgets every sequence `live` says is gone (a safety net beside `forget`).
    pub fn retain(&mut self, live: impl Fn(SeqId) -> bool) {
        let gone: Vec<SeqId> = self.seqs.keys().copied().filter(|&id| !live(id)).collect();
        for id in gone {
            self.forget(id);
        }
    }

    /// Proposals for `wants`: (sequence, its tokens, how many to propose). A sequence the
    /// draft pool cannot hold now, or whose catch-up does not fit this step's rows, gets an
    /// empty proposal (its catch-up goes on in chunks). `is_end` tokens end a proposal.
    /// Errors of the draft's forward pass end every proposal (the target goes on alone).
    pub fn propose(
        &mut self,
        wants: &[(SeqId, &[u32], usize)],
        is_end: impl Fn(u32) -> bool,
    ) -> Vec<Vec<u32>> {
        let mut out = vec![Vec::new(); wants.len()];
        match self.run(wants, &is_end) {
            Ok(rounds) => {
                for r in rounds {
                    if let Some(i) = wants.iter().position(|w| w.0 == r.seq_id) {
                        out[i] = r.proposal;
                    }
                }
            }
            Err(e) => {
                eprintln!("warning: the draft model failed ({e:#}); proposing nothing this step");
                for &(id, _, _) in wants {
                    self.forget(id);
                }
            }
        }
        out
    }

    fn run(
        &mut self,
        wants: &[(SeqId, &[u32], usize)],
        is_end: &impl Fn(u32) -> bool,
    ) -> Result<Vec<Round>> {
        let bs = self.blocks.block_size;
        // The catch-up step: for each sequence, what its draft blocks lack of its tokens.
        let mut rows_left = self.max_rows;
        let mut plan: Vec<(SeqId, usize, usize, usize)> = Vec::new(); // id, from, to, k
        for &(id, tokens, k) in wants {
            if k == 0 || tokens.is_empty() || rows_left == 0 {
                continue;
            }
            let st = self.seqs.entry(id).or_default();
            let mut common = st
                .held
                .iter()
                .zip(tokens)
                .take_while(|(a, b)| a == b)
                .count();
            // Holding every token already (not after a verification, which always appends the
            // target's own token): the last one is recomputed for its logits.
            if common == tokens.len() {
                common -= 1;
            }
            st.held.truncate(common);
            self.blocks.truncate(&mut st.table, common.div_ceil(bs));
            let lack = tokens.len() - common;
            let (to, k) = if lack <= rows_left {
                (tokens.len(), k)
            } else {
                (common + rows_left, 0) // a chunk of a long catch-up; no proposal yet
            };
            // Slots for the catch-up and the k - 1 proposed tokens fed back.
            let need = to + k.saturating_sub(1);
            if self.blocks.allocate(&mut st.table, common, need).is_none() {
                let mut st = self.seqs.remove(&id).expect("entered above");
                self.blocks.free(&mut st.table);
                continue;
            }
            rows_left -= to - common;
            plan.push((id, common, to, k));
        }
        if plan.is_empty() {
            return Ok(Vec::new());
        }
        let mut batch = self.new_batch(plan.iter().map(|p| p.0));
        let mut rounds = Vec::new();
        for &(id, from, to, k) in &plan {
            let tokens = wants
                .iter()
                .find(|w| w.0 == id)
                .expect("planned from wants")
                .1;
            let st = &self.seqs[&id];
            let logits_from = if k > 0 { to - 1 } else { to };
            batch.push_sequence(&st.table, bs, from..to, |pos| tokens[pos], logits_from);
            if k > 0 {
                rounds.push(Round {
                    seq_id: id,
                    left: k,
                    proposal: Vec::new(),
                });
            }
        }
        let logits = self.forward(&batch)?;
        for &(id, from, to, _) in &plan {
            let tokens = wants
                .iter()
                .find(|w| w.0 == id)
                .expect("planned from wants")
                .1;
            let st = self.seqs.get_mut(&id).expect("planned");
            st.held.extend_from_slice(&tokens[from..to]);
        }
        self.take_argmax(&mut rounds, &logits, is_end);
        // One step per further token, over the sequences still proposing.
        while rounds.iter().any(|r| r.left > 0) {
            let live: Vec<usize> = (0..rounds.len()).filter(|&i| rounds[i].left > 0).collect();
            let mut batch = self.new_batch(live.iter().map(|&i| rounds[i].seq_id));
            for &i in &live {
                let st = &self.seqs[&rounds[i].seq_id];
                let pos = st.held.len();
                let t = *rounds[i].proposal.last().expect("proposing after a token");
                batch.push_sequence(&st.table, bs, pos..pos + 1, |_| t, pos);
            }
            let logits = self.forward(&batch)?;
            for &i in &live {
                let st = self.seqs.get_mut(&rounds[i].seq_id).expect("live");
                st.held
                    .push(*rounds[i].proposal.last().expect("proposing after a token"));
            }
            let mut step: Vec<Round> = live
                .iter()
                .map(|&i| Round {
                    seq_id: rounds[i].seq_id,
                    left: rounds[i].left,
                    proposal: std::mem::take(&mut rounds[i].proposal),
                })
                .collect();
            self.take_argmax(&mut step, &logits, is_end);
            for (r, &i) in step.into_iter().zip(&live) {
                rounds[i] = r;
            }
        }
        // Blocks allocated for proposals cut short (an end token) go back.
        for r in &rounds {
            if let Some(st) = self.seqs.get_mut(&r.seq_id) {
                let keep = st.held.len().div_ceil(bs);
                self.blocks.truncate(&mut st.table, keep);
            }
        }
        Ok(rounds)
    }

    /// A batch sized for the block tables of `ids`.
    fn new_batch(&self, ids: impl Iterator<Item = SeqId>) -> Batch {
        let max_blocks = ids.map(|id| self.seqs[&id].table.len()).max().unwrap_or(0);
        Batch::with_max_blocks(max_blocks)
    }

    /// Runs one draft step and learns its cost.
    fn forward(&mut self, batch: &Batch) -> Result<Vec<f32>> {
        let started = Instant::now();
        let logits = self.exec.forward(&self.model, batch)?;
        self.cost
            .record(batch.n_tokens(), started.elapsed().as_secs_f64());
        Ok(logits)
    }

    /// Appends each round's argmax (logits rows in round order) and counts it off; a token the
    /// target cannot take ends the round without it, an end token ends it after it.
    fn take_argmax(&self, rounds: &mut [Round], logits: &[f32], is_end: &impl Fn(u32) -> bool) {
        let vocab = self.model.config.vocab_size;
        for (r, row) in rounds.iter_mut().zip(logits.chunks_exact(vocab)) {
            let t = argmax(row);
            if t as usize >= self.target_vocab {
                r.left = 0;
                continue;
            }
            r.proposal.push(t);
            r.left -= 1;
            if is_end(t) {
                r.left = 0;
            }
        }
    }
}

/// The index of the largest logit, the lowest on ties.
fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_takes_the_lowest_index_on_ties() {
        assert_eq!(argmax(&[0.0, 2.0, 1.0, 2.0]), 1);
        assert_eq!(argmax(&[5.0]), 0);
    }

    #[test]
    fn first_difference_names_the_index() {
        assert_eq!(first_difference(&[1, 2, 3], &[1, 2, 3]), None);
        assert_eq!(
            first_difference(&[1, 2, 3], &[1, 4, 3]),
            Some((1, Some(&2), Some(&4)))
        );
        assert_eq!(
            first_difference(&[1, 2], &[1, 2, 3]),
            Some((2, None, Some(&3)))
        );
    }
}

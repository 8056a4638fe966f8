//! Token masks for the constrained rows of a step. The worker takes the constraint states of the
//! rows that will sample this step, computes all their masks together (rayon) on a helper thread
//! while the forward pass runs, and samples each constrained row under its mask.
//! Unconstrained rows never wait for a mask: they have none, and the masks are usually ready
//! before the logits are.
//!
//! Sampling under a mask costs next to nothing on the common path: a greedy row without
//! penalties takes the best allowed logit straight from the mask's bit words (whole words of
//! allowed tokens compared eight lanes at a time, empty words skipped), with no masked copy of
//! the vocabulary-wide row. Only rows that need the masked logits themselves (temperature,
//! penalties, logprobs) get them written out.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::time::Instant;

use rayon::prelude::*;
use toktrie::SimpleVob;

use crate::constraint::ConstraintState;
use crate::engine::sampler::Sampler;
use crate::engine::sequence::SeqId;

/// A row's mask, or why it could not be computed (that request ends with the error).
pub(super) type MaskResult = Result<SimpleVob, String>;

/// A step's masks being computed on rayon's pool while the forward pass runs.
pub(super) struct Pending {
    rx: mpsc::Receiver<Row>,
    ids: Vec<SeqId>,
}

/// One row's mask as computed: its state (None if the computation panicked), its mask, the
/// time it took in microseconds.
struct Row(SeqId, Option<ConstraintState>, MaskResult, u64);

/// A step's masks, computed.
pub(super) struct Done {
    /// The constraint states, back to their sequences.
    pub states: Vec<(SeqId, ConstraintState)>,
    /// Every row's mask, or why it has none (that request ends with the error).
    pub masks: HashMap<SeqId, MaskResult>,
    /// Time spent on the masks computed, summed over rows, in microseconds.
    pub micros: u64,
}

/// Starts computing the masks of `jobs` as one job on rayon's pool (no thread is created per
/// step: whichever pool thread is free first takes it, and the forward pass's work splits
/// around it); each row's mask is sent as soon as it is ready. None when there is nothing to
/// compute.
pub(super) fn start(jobs: Vec<(SeqId, ConstraintState)>) -> Option<Pending> {
    if jobs.is_empty() {
        return None;
    }
    let ids = jobs.iter().map(|j| j.0).collect();
    let (tx, rx) = mpsc::channel();
    rayon::spawn(move || {
        jobs.into_par_iter()
            .for_each_with(tx, |tx, (id, mut state)| {
                let t = Instant::now();
                let mask = std::panic::catch_unwind(AssertUnwindSafe(|| state.compute_mask()));
                let micros = t.elapsed().as_micros() as u64;
                // A row given up on is no longer listened for: its state is dropped here.
                let _ = tx.send(match mask {
                    Ok(mask) => Row(id, Some(state), mask, micros),
                    Err(_) => Row(id, None, Err(PANICKED.into()), micros),
                });
            });
    });
    Some(Pending { rx, ids })
}

/// The error of a row whose mask computation panicked (its state is lost).
const PANICKED: &str = "the constraint failed: its mask panicked";

impl Pending {
    /// The masks, waited for at most `budget_ms` from now (the forward pass is done: the
    /// masks computed beside it cost nothing more). A row still computing then gets an error
    /// that ends its request (its state is lost), so the others go on.
    pub fn wait(self, budget_ms: u64) -> Done {
        let deadline = Instant::now() + std::time::Duration::from_millis(budget_ms);
        let mut done = Done {
            states: Vec::new(),
            masks: HashMap::new(),
            micros: 0,
        };
        while done.masks.len() < self.ids.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(Row(id, state, mask, micros)) = self.rx.recv_timeout(left) else {
                break;
            };
            done.states.extend(state.map(|s| (id, s)));
            done.masks.insert(id, mask);
            done.micros += micros;
        }
        for &id in &self.ids {
            done.masks.entry(id).or_insert_with(|| {
                Err(format!(
                    "the constraint failed: its token mask took more than {} ms \
                     (--mask-budget-ms); this request ended so the others could go on",
                    budget_ms
                ))
            });
        }
        done
    }
}

/// Allows the end-of-generation tokens (`eog`) wherever the grammar's own end token (`eos`) is
/// allowed, so a chat model may end its turn with the token it was trained to end with.
pub(super) fn allow_eog(mask: &mut SimpleVob, eos: Option<u32>, eog: &[u32]) {
    let end_allowed = eos.is_some_and(|e| (e as usize) < mask.len() && mask.is_allowed(e));
    if end_allowed {
        for &t in eog {
            if (t as usize) < mask.len() {
                mask.allow_token(t);
            }
        }
    }
}

/// `logits` with every token the mask disallows set to minus infinity.
pub(super) fn apply(logits: &[f32], mask: &SimpleVob) -> Vec<f32> {
    let mut out = vec![f32::NEG_INFINITY; logits.len()];
    for_each_allowed_word(logits.len(), mask.as_slice(), |base, word| {
        if word == u32::MAX {
            out[base..base + 32].copy_from_slice(&logits[base..base + 32]);
        } else {
            for i in set_bits(base, word, logits.len()) {
                out[i] = logits[i];
            }
        }
    });
    out
}

/// The next token of a constrained row, and the masked logits when the caller or the sampler
/// needs them (`want_logits`: the request asks for logprobs). Same token as the sampler gives on
/// [`apply`]'s output: greedy takes the allowed token with the largest logit, the lowest id
/// among ties.
pub(super) fn sample(
    sampler: &mut Sampler,
    logits: &[f32],
    mask: &SimpleVob,
    prompt: &[u32],
    generated: &[u32],
    want_logits: bool,
) -> (u32, Option<Vec<f32>>) {
    if !want_logits && plain_greedy(sampler) {
        if let Some(token) = argmax_allowed(logits, mask.as_slice()) {
            return (token, None);
        }
    }
    let masked = apply(logits, mask);
    let token = sampler.sample(&masked, prompt, generated);
    (token, Some(masked))
}

/// Greedy with no penalty that could change a logit: the argmax of the row is the token.
fn plain_greedy(sampler: &Sampler) -> bool {
    let p = &sampler.params;
    p.temperature <= 0.0
        && p.logit_bias.is_empty()
        && (p.repeat_penalty == 1.0 || p.repeat_last_n == 0)
        && p.presence_penalty == 0.0
        && p.frequency_penalty == 0.0
}

/// The allowed token (bit `t % 32` of word `t / 32` of `allowed`) with the largest logit, the
/// lowest id among ties; None when no token below `logits.len()` is allowed, or none has a
/// logit above minus infinity.
pub(super) fn argmax_allowed(logits: &[f32], allowed: &[u32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for_each_allowed_word(logits.len(), allowed, |base, word| {
        let better = |l: f32, best: Option<(usize, f32)>| best.is_none_or(|(_, b)| l > b);
        if word == u32::MAX {
            let chunk = &logits[base..base + 32];
            let m = max32(chunk);
            if better(m, best) {
                if let Some(j) = chunk.iter().position(|&l| l == m) {
                    best = Some((base + j, m));
                }
            }
        } else {
            for i in set_bits(base, word, logits.len()) {
                if better(logits[i], best) {
                    best = Some((i, logits[i]));
                }
            }
        }
    });
    best.filter(|&(_, l)| l > f32::NEG_INFINITY)
        .map(|(i, _)| i as u32)
}

/// Calls `f(base, word)` for every non-empty word of `allowed` that starts below `n`; a word
/// reaching past `n` is cut to the tokens below it (so a full word always has 32 tokens).
fn for_each_allowed_word(n: usize, allowed: &[u32], mut f: impl FnMut(usize, u32)) {
    for (w, &word) in allowed.iter().enumerate() {
        let base = w * 32;
        if base >= n {
            break;
        }
        let word = if n - base < 32 {
            word & ((1u32 << (n - base)) - 1)
        } else {
            word
        };
        if word != 0 {
            f(base, word);
        }
    }
}

/// Token ids of the set bits of `word` (ids `base..base + 32`) below `n`, in order.
fn set_bits(base: usize, mut word: u32, n: usize) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        if word == 0 {
            return None;
        }
        let j = word.trailing_zeros() as usize;
        word &= word - 1;
        Some(base + j)
    })
    .take_while(move |&i| i < n)
}

/// The largest of 32 logits (NaN never wins), in eight lanes the compiler vectorises.
fn max32(chunk: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    for c in chunk.chunks_exact(8) {
        for k in 0..8 {
            lanes[k] = if c[k] > lanes[k] { c[k] } else { lanes[k] };
        }
    }
    lanes
        .into_iter()
        .fold(f32::NEG_INFINITY, |a, b| if b > a { b } else { a })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::sampler::{argmax, Rng};

    fn mask_of(n: usize, allowed: impl Fn(usize) -> bool) -> SimpleVob {
        let mut m = SimpleVob::alloc(n);
        for t in 0..n {
            if allowed(t) {
                m.allow_token(t as u32);
            }
        }
        m
    }

    /// On random rows and masks (dense, sparse, empty words, ties, a vocabulary that is not a
    /// multiple of 32): the bitset argmax is the plain argmax of the masked row.
    #[test]
    fn argmax_allowed_equals_argmax_of_the_masked_row() {
        let mut rng = Rng::new(7);
        for case in 0..400 {
            let n = 1 + (rng.next_u64() % 300) as usize;
            let levels = 1 + rng.next_u64() % 6; // few levels: many ties
            let logits: Vec<f32> = (0..n)
                .map(|_| (rng.next_u64() % levels) as f32 - 2.0)
                .collect();
            let density = rng.next_u64() % 4;
            let bits: Vec<bool> = (0..n)
                .map(|t| match density {
                    0 => rng.next_u64().is_multiple_of(17),
                    1 => rng.next_u64().is_multiple_of(2),
                    2 => (t / 32) % 2 == 0 || rng.next_u64().is_multiple_of(5),
                    _ => true,
                })
                .collect();
            let mask = mask_of(n, |t| bits[t]);
            let masked = apply(&logits, &mask);
            let want = bits.iter().any(|&b| b).then(|| argmax(&masked));
            assert_eq!(
                argmax_allowed(&logits, mask.as_slice()),
                want,
                "case {case}"
            );
            for t in 0..n {
                let expect = if bits[t] {
                    logits[t]
                } else {
                    f32::NEG_INFINITY
                };
                assert_eq!(masked[t], expect, "case {case} token {t}");
            }
        }
    }

    #[test]
    fn minus_infinity_and_nan_never_win() {
        let mask = mask_of(40, |t| t == 3 || t == 35);
        let mut logits = vec![0.0; 40];
        logits[3] = f32::NEG_INFINITY;
        logits[35] = f32::NAN;
        assert_eq!(argmax_allowed(&logits, mask.as_slice()), None);
        logits[35] = -5.0;
        assert_eq!(argmax_allowed(&logits, mask.as_slice()), Some(35));
    }

    #[test]
    fn end_tokens_follow_the_grammars_end() {
        let mut mask = mask_of(64, |t| t == 2);
        allow_eog(&mut mask, Some(2), &[2, 50]);
        assert!(mask.is_allowed(50));
        let mut mask = mask_of(64, |t| t == 3);
        allow_eog(&mut mask, Some(2), &[2, 50]);
        assert!(!mask.is_allowed(50) && !mask.is_allowed(2));
    }

    /// A greedy sampler under a mask gives the same token through the fast path and through
    /// the masked logits; with logprobs wanted the masked logits come back.
    #[test]
    fn sample_fast_path_matches_the_masked_sampler() {
        let mut rng = Rng::new(11);
        let n = 1000;
        for _ in 0..50 {
            let logits: Vec<f32> = (0..n)
                .map(|_| (rng.next_u64() % 1000) as f32 / 7.0)
                .collect();
            let mask = mask_of(n, |t| t % 3 != 0 || t > 900);
            let mut s = Sampler::new(crate::engine::sampler::SamplingParams::greedy());
            let (fast, none) = sample(&mut s, &logits, &mask, &[], &[], false);
            let (slow, masked) = sample(&mut s, &logits, &mask, &[], &[], true);
            assert!(none.is_none());
            assert_eq!(fast, slow);
            assert_eq!(masked.unwrap(), apply(&logits, &mask));
        }
    }
}

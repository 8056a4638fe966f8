//! Turning logits into the next token: greedy, or llama.cpp's sampling chain (logit bias,
//! then penalties, DRY, top-n-sigma, top-k, typical, top-p, min-p, XTC and temperature in the
//! order `samplers` gives, or temperature and Mirostat) followed by a draw from a seeded
//! generator. `params` holds the fields, `chain` and `dry` the stages. Called by the engine's
//! output side (`engine::output`) once per sequence per step.

pub mod chain;
pub mod dry;
pub mod infill;
mod params;

use std::sync::Arc;

pub use chain::{Candidate, Candidates};
pub use params::{SamplerKind, SamplingParams, DRY_DEFAULT_BREAKERS};

/// SplitMix64: a small, fast generator whose stream is fixed by its seed.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Index of the largest logit (the lowest index among ties, as llama.cpp's greedy sampler).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Mirostat's `m`: how many of the best tokens estimate the Zipf exponent (llama.cpp's 100).
const MIROSTAT_M: usize = 100;

/// A sequence's sampler: its parameters, its own random streams and Mirostat's state.
#[derive(Clone, Debug)]
pub struct Sampler {
    pub params: SamplingParams,
    rng: Rng,
    /// XTC's own stream, so that turning XTC on leaves the draws' stream as it was.
    xtc_rng: Rng,
    /// Mirostat's target surprise, 2 tau at the start (llama.cpp's `mu`).
    pub mu: f32,
    /// DRY's breakers as token sequences, once `bind_breakers` resolved them.
    breakers: Option<Arc<dry::Breakers>>,
    /// What the infill stage reads of the vocabulary, once `bind_breakers` bound it.
    vocab: Option<Arc<infill::InfillVocab>>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let rng = Rng::new(params.seed);
        let xtc_rng = Rng::new(params.seed ^ 0x5854_435F_5247_4E00);
        let mu = 2.0 * params.mirostat_tau;
        Sampler {
            params,
            rng,
            xtc_rng,
            mu,
            breakers: None,
            vocab: None,
        }
    }

    /// Whether DRY or the infill stage still needs the vocabulary (`bind_breakers`).
    pub fn needs_breakers(&self) -> bool {
        (self.breakers.is_none() && self.params.dry_enabled())
            || (self.vocab.is_none() && self.params.samplers.contains(&SamplerKind::Infill))
    }

    /// Tokenizes DRY's breakers against the model's vocabulary (cached per vocabulary) and
    /// binds what the infill stage reads of it.
    pub fn bind_breakers(&mut self, tok: &crate::tokenizer::Tokenizer) {
        if self.params.dry_enabled() {
            self.breakers = Some(dry::breakers(tok, &self.params.dry_sequence_breakers));
        }
        if self.params.samplers.contains(&SamplerKind::Infill) {
            self.vocab = Some(infill::InfillVocab::of(tok));
        }
    }

    /// Gives DRY its breakers as token sequences directly (tests, references).
    pub fn set_breakers(&mut self, breakers: dry::Breakers) {
        self.breakers = Some(Arc::new(breakers));
    }

    /// Picks the next token from `logits`, given the sequence's prompt and generated tokens
    /// (for the penalties and DRY).
    pub fn sample(&mut self, logits: &[f32], prompt: &[u32], generated: &[u32]) -> u32 {
        if self.params.temperature <= 0.0 {
            let mut logits = logits.to_vec();
            self.apply_logit_bias(&mut logits);
            self.apply_penalties(&mut logits, prompt, generated);
            return argmax(&logits);
        }
        if self.params.mirostat != 0 {
            let cand = self.mirostat_candidates(logits);
            let i = cand.draw(&mut self.rng);
            self.mirostat_accept(cand.data[i].p);
            return cand.data[i].id;
        }
        let cand = self.candidates(logits, prompt, generated);
        cand.data[cand.draw(&mut self.rng)].id
    }

    /// The chain without its draw (temperature above 0, no Mirostat): the candidates left, with
    /// their probabilities after a last softmax. XTC draws from its stream here.
    pub fn candidates(&mut self, logits: &[f32], prompt: &[u32], generated: &[u32]) -> Candidates {
        let mut cand = self.biased(logits);
        for i in 0..self.params.samplers.len() {
            let p = &self.params;
            match p.samplers[i] {
                SamplerKind::Penalties => {
                    if !self.penalties_on() {
                        continue;
                    }
                    // On the logits as the earlier stages left them.
                    let mut logits = logits.to_vec();
                    for c in &cand.data {
                        logits[c.id as usize] = c.logit;
                    }
                    self.apply_penalties(&mut logits, prompt, generated);
                    for c in &mut cand.data {
                        c.logit = logits[c.id as usize];
                    }
                    cand.sorted = false;
                }
                SamplerKind::Dry => self.apply_dry(&mut cand, prompt, generated),
                SamplerKind::TopNSigma => cand.top_n_sigma(p.top_n_sigma),
                SamplerKind::TopK => cand.top_k(p.top_k),
                SamplerKind::TypicalP => cand.typical(p.typical_p, p.min_keep),
                SamplerKind::TopP => cand.top_p(p.top_p, p.min_keep),
                SamplerKind::MinP => cand.min_p(p.min_p, p.min_keep),
                SamplerKind::Xtc => {
                    let (prob, threshold, min_keep) =
                        (p.xtc_probability, p.xtc_threshold, p.min_keep);
                    cand.xtc(prob, threshold, min_keep, &mut self.xtc_rng)
                }
                SamplerKind::Temperature => {
                    cand.temperature_ext(p.temperature, p.dynatemp_range, p.dynatemp_exponent)
                }
                SamplerKind::Infill => match &self.vocab {
                    Some(v) => cand.infill(v),
                    None => {} // no vocabulary bound (tests of the arithmetic alone)
                },
            }
        }
        cand.softmax(false);
        cand
    }

    /// Mirostat's candidates for this step (temperature, then the cut at the current mu),
    /// normalized; `mirostat_accept` then moves mu by the chosen token's probability.
    pub fn mirostat_candidates(&self, logits: &[f32]) -> Candidates {
        let mut cand = self.biased(logits);
        cand.temperature(self.params.temperature);
        if self.params.mirostat == 1 {
            cand.mirostat_v1(self.mu, MIROSTAT_M, logits.len());
        } else {
            cand.mirostat_v2(self.mu);
        }
        cand
    }

    pub fn mirostat_accept(&mut self, p: f32) {
        let (tau, eta) = (self.params.mirostat_tau, self.params.mirostat_eta);
        self.mu = chain::mirostat_update(self.mu, p, tau, eta);
    }

    fn apply_dry(&self, cand: &mut Candidates, prompt: &[u32], generated: &[u32]) {
        let p = &self.params;
        if !p.dry_enabled() {
            return;
        }
        let empty = dry::Breakers::default();
        let breakers = self.breakers.as_deref().unwrap_or(&empty);
        let keep = p.dry_penalty_last_n;
        let start = (prompt.len() + generated.len()).saturating_sub(keep);
        let history: Vec<u32> = prompt
            .iter()
            .chain(generated)
            .skip(start)
            .copied()
            .collect();
        dry::Dry {
            multiplier: p.dry_multiplier,
            base: p.dry_base,
            allowed_length: p.dry_allowed_length,
            penalty_last_n: keep,
            breakers,
        }
        .apply(cand, &history);
    }

    /// Every token a candidate, its logit biased (logit bias comes first, as in llama.cpp).
    fn biased(&self, logits: &[f32]) -> Candidates {
        let mut cand = Candidates::new(logits);
        for &(t, bias) in &self.params.logit_bias {
            if let Some(c) = cand.data.get_mut(t as usize) {
                c.logit += bias;
            }
        }
        cand
    }

    fn apply_logit_bias(&self, logits: &mut [f32]) {
        for &(t, bias) in &self.params.logit_bias {
            if let Some(l) = logits.get_mut(t as usize) {
                *l += bias;
            }
        }
    }

    /// Whether a penalty could change a logit.
    fn penalties_on(&self) -> bool {
        let p = &self.params;
        (p.repeat_penalty != 1.0 && p.repeat_last_n > 0)
            || p.presence_penalty != 0.0
            || p.frequency_penalty != 0.0
    }

    fn apply_penalties(&self, logits: &mut [f32], prompt: &[u32], generated: &[u32]) {
        let p = &self.params;
        if p.repeat_penalty != 1.0 && p.repeat_last_n > 0 {
            let all = prompt.iter().chain(generated);
            let total = prompt.len() + generated.len();
            let mut seen = std::collections::HashSet::new();
            for &t in all.skip(total.saturating_sub(p.repeat_last_n)) {
                if seen.insert(t) {
                    if let Some(l) = logits.get_mut(t as usize) {
                        *l = if *l > 0.0 {
                            *l / p.repeat_penalty
                        } else {
                            *l * p.repeat_penalty
                        };
                    }
                }
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            let mut counts = std::collections::HashMap::<u32, u32>::new();
            for &t in generated {
                *counts.entry(t).or_default() += 1;
            }
            for (t, n) in counts {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l -= p.presence_penalty + p.frequency_penalty * n as f32;
                }
            }
        }
    }
}

/// Numerically stable softmax.
pub fn softmax(x: &[f32]) -> Vec<f32> {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = x.iter().map(|&v| (v - max).exp()).collect();
    let sum: f32 = e.iter().sum();
    e.into_iter().map(|v| v / sum).collect()
}

/// log(softmax(x)[i]) computed in f64, as perplexity and logprobs need.
pub fn log_softmax_at(x: &[f32], i: usize) -> f64 {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = x.iter().map(|&v| (v as f64 - max).exp()).sum();
    x[i] as f64 - max - sum.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logit_bias_bans_and_forces_tokens_before_the_rest() {
        let logits = [0.1, 3.0, 2.0, -1.0];
        let mut s = Sampler::new(SamplingParams {
            logit_bias: vec![(1, f32::NEG_INFINITY), (3, 2.5)],
            ..SamplingParams::greedy()
        });
        assert_eq!(s.sample(&logits, &[], &[]), 2, "1 banned");
        s.params.logit_bias.push((3, 1.0));
        assert_eq!(s.sample(&logits, &[], &[]), 3, "3 raised past 2");
        let mut hot = Sampler::new(SamplingParams {
            temperature: 1.0,
            logit_bias: vec![(0, 100.0)],
            seed: 7,
            ..Default::default()
        });
        assert!((0..50).all(|_| hot.sample(&logits, &[], &[]) == 0));
    }

    #[test]
    fn greedy_takes_argmax_and_first_of_ties() {
        let mut s = Sampler::new(SamplingParams::greedy());
        assert_eq!(s.sample(&[0.1, 3.0, 3.0, -1.0], &[], &[]), 1);
    }

    #[test]
    fn same_seed_same_draws() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let params = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 42,
            ..Default::default()
        };
        let draw = |p: &SamplingParams| {
            let mut s = Sampler::new(p.clone());
            (0..50)
                .map(|_| s.sample(&logits, &[], &[]))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(&params), draw(&params));
        assert_ne!(
            draw(&params),
            draw(&SamplingParams {
                seed: 43,
                ..params.clone()
            })
        );
    }

    #[test]
    fn top_k_one_is_greedy() {
        let logits = [0.5, 2.0, 1.9, -3.0];
        let mut s = Sampler::new(SamplingParams {
            temperature: 5.0,
            top_k: 1,
            seed: 7,
            ..Default::default()
        });
        for _ in 0..20 {
            assert_eq!(s.sample(&logits, &[], &[]), 1);
        }
    }

    #[test]
    fn min_p_and_top_p_cut_the_tail() {
        // One dominant token: min_p 0.5 leaves only it.
        let logits = [10.0, 0.0, 0.0, 0.0];
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.5,
            seed: 1,
            ..Default::default()
        });
        for _ in 0..20 {
            assert_eq!(s.sample(&logits, &[], &[]), 0);
        }
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.5,
            min_p: 0.0,
            seed: 1,
            ..Default::default()
        });
        for _ in 0..20 {
            assert_eq!(s.sample(&logits, &[], &[]), 0);
        }
    }

    #[test]
    fn repeat_penalty_discourages_seen_tokens() {
        let mut s = Sampler::new(SamplingParams {
            temperature: 0.0,
            repeat_penalty: 2.0,
            ..Default::default()
        });
        // Token 0 leads, but has been seen: 2.0 / 2 = 1.0 < 1.5.
        assert_eq!(s.sample(&[2.0, 1.5], &[0], &[]), 1);
    }

    #[test]
    fn validate_rejects_bad_values() {
        assert!(SamplingParams {
            temperature: -1.0,
            ..Default::default()
        }
        .validate()
        .is_err());
        assert!(SamplingParams {
            top_p: 0.0,
            ..Default::default()
        }
        .validate()
        .is_err());
        assert!(SamplingParams::default().validate().is_ok());
    }
}

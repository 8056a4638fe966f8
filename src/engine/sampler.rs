//! Turning logits into the next token: greedy, or penalties, top-k, top-p, min-p and
//! temperature followed by a draw from a seeded generator, in llama.cpp's default order.
//! Called by the engine's output side (`engine::output`) once per sequence per step.

/// Sampling parameters of one request.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 disables.
    pub top_k: usize,
    /// 1.0 disables.
    pub top_p: f32,
    /// 0.0 disables.
    pub min_p: f32,
    /// 1.0 disables. Applied to the last `repeat_last_n` tokens, as llama.cpp does.
    pub repeat_penalty: f32,
    pub repeat_last_n: usize,
    /// OpenAI-style penalties over the generated tokens; 0.0 disables.
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub seed: u64,
    /// Added to the logits of these tokens before anything else (minus infinity bans one), as
    /// llama.cpp's logit-bias sampler, first in its chain.
    pub logit_bias: Vec<(u32, f32)>,
    /// What the output must match (JSON schema, regex, grammar); None leaves it free.
    pub constraint: Option<crate::constraint::Constraint>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
            logit_bias: Vec::new(),
            constraint: None,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(format!(
                "temperature must be >= 0, got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if !(self.repeat_penalty > 0.0 && self.repeat_penalty.is_finite()) {
            return Err(format!(
                "repeat_penalty must be > 0, got {}",
                self.repeat_penalty
            ));
        }
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return Err(format!("{name} must be in [-2, 2], got {v}"));
            }
        }
        Ok(())
    }
}

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

/// A sequence's sampler: its parameters and its own random stream.
#[derive(Clone, Debug)]
pub struct Sampler {
    pub params: SamplingParams,
    rng: Rng,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let rng = Rng::new(params.seed);
        Sampler { params, rng }
    }

    /// Picks the next token from `logits`, given the sequence's prompt and generated tokens
    /// (for the penalties).
    pub fn sample(&mut self, logits: &[f32], prompt: &[u32], generated: &[u32]) -> u32 {
        let p = &self.params;
        let mut logits = logits.to_vec();
        self.apply_penalties(&mut logits, prompt, generated);
        if p.temperature <= 0.0 {
            return argmax(&logits);
        }
        // Candidates sorted by logit, best first.
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        let k = if p.top_k == 0 {
            cand.len()
        } else {
            p.top_k.min(cand.len())
        };
        if k < cand.len() {
            cand.select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            cand.truncate(k);
        }
        cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let probs = softmax(&cand.iter().map(|c| c.1).collect::<Vec<_>>());
        // top-p: the smallest prefix whose mass reaches top_p.
        let mut keep = cand.len();
        if p.top_p < 1.0 {
            let mut mass = 0.0;
            for (i, &pr) in probs.iter().enumerate() {
                mass += pr;
                if mass >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
        }
        // min-p: drop tokens less likely than min_p times the best.
        if p.min_p > 0.0 {
            let threshold = probs[0] * p.min_p;
            keep = keep.min(
                probs
                    .iter()
                    .take_while(|&&pr| pr >= threshold)
                    .count()
                    .max(1),
            );
        }
        cand.truncate(keep);
        let scaled: Vec<f32> = cand.iter().map(|c| c.1 / p.temperature).collect();
        let probs = softmax(&scaled);
        let r = self.rng.next_f64() as f32;
        let mut acc = 0.0;
        for (i, &pr) in probs.iter().enumerate() {
            acc += pr;
            if r < acc {
                return cand[i].0;
            }
        }
        cand[cand.len() - 1].0
    }

    fn apply_penalties(&self, logits: &mut [f32], prompt: &[u32], generated: &[u32]) {
        let p = &self.params;
        for &(t, bias) in &p.logit_bias {
            if let Some(l) = logits.get_mut(t as usize) {
                *l += bias;
            }
        }
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

//! The sampling chain's stages on a candidate list, each a port of its llama.cpp sampler
//! (`src/llama-sampler.cpp`): top-k, top-p, min-p, typical, temperature with its dynamic range,
//! XTC, top-n-sigma and Mirostat 1 and 2, with the same arithmetic, `min_keep` rules and
//! early returns, so that a chain leaves the same tokens with the same probabilities
//! (`tests/samplers.rs` checks it against llama.cpp's output). Called by `Sampler`.

use super::Rng;

/// One candidate token: its id, its logit, and its probability once a stage computed it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub id: u32,
    pub logit: f32,
    pub p: f32,
}

/// llama.cpp's `llama_token_data_array`: the candidates still in the running, and whether they
/// are sorted by logit, best first.
#[derive(Clone, Debug)]
pub struct Candidates {
    pub data: Vec<Candidate>,
    pub sorted: bool,
}

/// Best logit first; the lower id first among equal logits.
fn by_logit(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

impl Candidates {
    pub fn new(logits: &[f32]) -> Self {
        Candidates {
            data: logits
                .iter()
                .enumerate()
                .map(|(i, &logit)| Candidate {
                    id: i as u32,
                    logit,
                    p: 0.0,
                })
                .collect(),
            sorted: false,
        }
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    fn sort(&mut self) {
        if !self.sorted {
            self.data.sort_unstable_by(by_logit);
            self.sorted = true;
        }
    }

    /// `llama_sampler_softmax_impl`: each candidate's probability, sorting first if asked.
    pub fn softmax(&mut self, do_sort: bool) {
        if self.data.is_empty() {
            return;
        }
        if do_sort {
            self.sort();
        }
        let max = if self.sorted {
            self.data[0].logit
        } else {
            self.data
                .iter()
                .fold(f32::NEG_INFINITY, |m, c| m.max(c.logit))
        };
        let mut sum = 0.0f32;
        for c in &mut self.data {
            c.p = (c.logit - max).exp();
            sum += c.p;
        }
        for c in &mut self.data {
            c.p /= sum;
        }
    }

    /// `llama_sampler_top_k_impl`: the k best; k of 0 keeps all.
    pub fn top_k(&mut self, k: usize) {
        if k == 0 {
            return;
        }
        let k = k.min(self.data.len());
        if !self.sorted {
            if k < self.data.len() {
                self.data.select_nth_unstable_by(k - 1, by_logit);
                self.data.truncate(k);
            }
            self.data.sort_unstable_by(by_logit);
            self.sorted = true;
        }
        self.data.truncate(k);
    }

    /// `llama_sampler_top_p_apply`: the smallest best-first prefix whose mass reaches p (and
    /// holds at least `min_keep`).
    pub fn top_p(&mut self, p: f32, min_keep: usize) {
        if p >= 1.0 || self.data.is_empty() {
            return;
        }
        self.softmax(false);
        // As llama.cpp: a large unsorted list tries its 256 best first.
        if !self.sorted && self.data.len() > 1024 {
            let mut best = self.data.clone();
            best.select_nth_unstable_by(255, by_logit);
            best.truncate(256);
            best.sort_unstable_by(by_logit);
            if let Some(last) = top_p_cut(&best, p, min_keep) {
                best.truncate(last);
                self.data = best;
                self.sorted = true;
                return;
            }
        }
        self.sort();
        let last = top_p_cut(&self.data, p, min_keep).unwrap_or(self.data.len());
        self.data.truncate(last);
    }

    /// `llama_sampler_min_p_apply`: drop tokens whose logit is below the best's plus ln(p).
    pub fn min_p(&mut self, p: f32, min_keep: usize) {
        if p <= 0.0 || self.data.is_empty() {
            return;
        }
        if !self.sorted {
            let max = self.data.iter().fold(-f32::MAX, |m, c| m.max(c.logit));
            let min_logit = max + p.ln();
            let kept = self.data.iter().filter(|c| c.logit >= min_logit).count();
            if kept > 0 && kept >= min_keep {
                self.data.retain(|c| c.logit >= min_logit);
                return;
            }
            self.sort();
        }
        let min_logit = self.data[0].logit + p.ln();
        let mut i = 1;
        while i < self.data.len() {
            if self.data[i].logit < min_logit && i >= min_keep {
                break;
            }
            i += 1;
        }
        self.data.truncate(i);
    }

    /// `llama_sampler_typical_apply`: order by how far each token's surprise is from the
    /// entropy, and keep the prefix whose mass passes p.
    pub fn typical(&mut self, p: f32, min_keep: usize) {
        if p >= 1.0 || self.data.is_empty() {
            return;
        }
        self.softmax(true);
        // A banned token (p = 0) adds nothing; llama.cpp would add NaN.
        let entropy: f32 = self
            .data
            .iter()
            .filter(|c| c.p > 0.0)
            .map(|c| -c.p * c.p.ln())
            .sum();
        let shifted: Vec<f32> = self
            .data
            .iter()
            .map(|c| (-c.p.ln() - entropy).abs())
            .collect();
        let mut order: Vec<usize> = (0..self.data.len()).collect();
        order.sort_by(|&a, &b| shifted[a].total_cmp(&shifted[b]).then(a.cmp(&b)));
        let mut sum = 0.0f32;
        let mut last = order.len();
        for (i, &idx) in order.iter().enumerate() {
            sum += self.data[idx].p;
            if sum > p && (min_keep == 0 || i + 1 >= min_keep) {
                last = i + 1;
                break;
            }
        }
        self.data = order[..last].iter().map(|&i| self.data[i]).collect();
        self.sorted = false;
    }

    /// `llama_sampler_temp_impl`: divide by `temp`, or (at 0 or below) keep only the best.
    pub fn temperature(&mut self, temp: f32) {
        if self.data.is_empty() {
            return;
        }
        if temp <= 0.0 {
            let mut best = 0;
            for i in 1..self.data.len() {
                if self.data[i].logit > self.data[best].logit {
                    self.data[best].logit = f32::NEG_INFINITY;
                    best = i;
                } else {
                    self.data[i].logit = f32::NEG_INFINITY;
                }
            }
            return;
        }
        for c in &mut self.data {
            c.logit /= temp;
        }
    }

    /// `llama_sampler_temp_ext_apply`: with a range, the temperature moves from
    /// `temp - range` to `temp + range` with the normalized entropy raised to `exponent`.
    pub fn temperature_ext(&mut self, temp: f32, range: f32, exponent: f32) {
        if range <= 0.0 {
            self.temperature(temp);
            return;
        }
        let min_temp = (temp - range).max(0.0);
        let max_temp = temp + range;
        if self.data.len() <= 1 {
            return;
        }
        let max_entropy = -(1.0f32 / self.data.len() as f32).ln();
        self.softmax(true);
        let mut entropy = 0.0f32;
        for c in &self.data {
            if c.p > 0.0 {
                entropy -= c.p * c.p.ln();
            }
        }
        let normalized = entropy / max_entropy;
        let dyn_temp = min_temp + (max_temp - min_temp) * normalized.powf(exponent);
        self.temperature(dyn_temp);
        let max = self.data[0].logit as f64;
        let mut sum = 0.0f64;
        for c in &mut self.data {
            let p = (c.logit as f64 - max).exp();
            c.p = p as f32;
            sum += p;
        }
        for c in &mut self.data {
            c.p = (c.p as f64 / sum) as f32;
        }
    }

    /// `llama_sample_xtc_apply`: with chance `probability` (one draw of `rng` whenever the
    /// stage is on and two or more tokens remain), remove every token at least `threshold`
    /// likely except the least likely of them.
    pub fn xtc(&mut self, probability: f32, threshold: f32, min_keep: usize, rng: &mut Rng) {
        if probability <= 0.0 || threshold > 0.5 || self.data.len() < 2 {
            return;
        }
        let chance = rng.next_f64() as f32;
        if chance > probability {
            return;
        }
        self.softmax(true);
        let mut pos_last = 0;
        for (i, c) in self.data.iter().enumerate() {
            if c.p >= threshold {
                pos_last = i;
            } else {
                break;
            }
        }
        if self.data.len() - pos_last >= min_keep && pos_last > 0 {
            self.data.drain(..pos_last);
        }
    }

    /// `llama_sampler_top_n_sigma_apply`: ban (logit to minus infinity) every token more than
    /// n standard deviations of the logits below the best.
    pub fn top_n_sigma(&mut self, n: f32) {
        if n <= 0.0 || self.data.len() <= 1 {
            return;
        }
        let mut max = self.data[0].logit;
        let mut sum = 0.0f32;
        let mut count = 0usize;
        for c in &self.data {
            if c.logit != f32::NEG_INFINITY {
                max = max.max(c.logit);
                sum += c.logit;
                count += 1;
            }
        }
        let mean = if count > 0 { sum / count as f32 } else { 0.0 };
        let mut acc = 0.0f32;
        for c in &self.data {
            if c.logit != f32::NEG_INFINITY {
                acc = (acc as f64 + ((c.logit - mean) as f64).powi(2)) as f32;
            }
        }
        let std = if count > 0 {
            ((acc / count as f32) as f64).sqrt() as f32
        } else {
            0.0
        };
        let cut = max - n * std;
        for c in &mut self.data {
            if c.logit < cut {
                c.logit = f32::NEG_INFINITY;
            }
        }
    }

    /// Mirostat 1's cut (`llama_sampler_mirostat_apply` before its draw): estimate the Zipf
    /// exponent from the `m` best, keep the k best that the target surprise `mu` allows, and
    /// normalize. `num_vocab` is the model's vocabulary size.
    pub fn mirostat_v1(&mut self, mu: f32, m: usize, num_vocab: usize) {
        self.softmax(true);
        let mut sum_ti_bi = 0.0f32;
        let mut sum_ti_sq = 0.0f32;
        let n = m.saturating_sub(1).min(self.data.len().saturating_sub(1));
        for i in 0..n {
            let t_i = ((i + 2) as f32 / (i + 1) as f32).ln();
            let b_i = (self.data[i].p / self.data[i + 1].p).ln();
            sum_ti_bi += t_i * b_i;
            sum_ti_sq += t_i * t_i;
        }
        let s_hat = sum_ti_bi / sum_ti_sq;
        let epsilon_hat = s_hat - 1.0;
        let k = ((epsilon_hat * 2f32.powf(mu)) / (1.0 - (num_vocab as f32).powf(-epsilon_hat)))
            .powf(1.0 / s_hat);
        self.top_k((k as i32).max(1) as usize);
        self.softmax(true);
    }

    /// Mirostat 2's cut (`llama_sampler_mirostat_v2_apply` before its draw): keep the best
    /// tokens whose surprise (-log2 p) is at most `mu` (at least one), and normalize.
    pub fn mirostat_v2(&mut self, mu: f32) {
        self.softmax(true);
        let keep = self
            .data
            .iter()
            .position(|c| -c.p.log2() > mu)
            .unwrap_or(self.data.len())
            .max(1);
        self.data.truncate(keep);
        self.softmax(true);
    }

    /// A draw from the candidates' probabilities (already computed), by one uniform number of
    /// `rng`; the index into `data`.
    pub fn draw(&self, rng: &mut Rng) -> usize {
        let r = rng.next_f64() as f32;
        let mut acc = 0.0;
        for (i, c) in self.data.iter().enumerate() {
            acc += c.p;
            if r < acc {
                return i;
            }
        }
        // Rounding left r past the sum: the last token with any mass.
        self.data.iter().rposition(|c| c.p > 0.0).unwrap_or(0)
    }
}

/// How many of `sorted` (best first) top-p keeps, if their mass reaches `p` (with at least
/// `min_keep` of them).
fn top_p_cut(sorted: &[Candidate], p: f32, min_keep: usize) -> Option<usize> {
    let mut sum = 0.0f32;
    for (i, c) in sorted.iter().enumerate() {
        sum += c.p;
        if sum >= p && i + 1 >= min_keep {
            return Some(i + 1);
        }
    }
    None
}

/// Mirostat's update after a draw: mu moves against the error between the observed surprise
/// of the chosen token (probability `p`) and the target `tau`, at rate `eta`.
pub fn mirostat_update(mu: f32, p: f32, tau: f32, eta: f32) -> f32 {
    let observed = -p.log2();
    mu - eta * (observed - tau)
}

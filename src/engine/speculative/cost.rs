//! What a step costs: a least-squares fit of step time against tokens per step,
//! `time = fixed + per_token * tokens`, over recent decoding steps (older ones decay; every
//! row computes logits, as a proposed row does). The fixed part is reading the weights once;
//! the per-token part is compute. Speculation pays while the step is
//! bound by the fixed part (few sessions) and stops paying when it is compute-bound (many).
//! With a draft model, each proposed token also costs a draft step (the draft runner keeps a
//! `StepCost` of its own): `break_even_with` adds it.
//!
//! Not the scheduler's `step_time::StepTime`, on purpose, though both fit the same decayed
//! sums (`least_squares`): speculation asks what one more row of a decoding step costs, so it
//! fits decoding steps only, of one model (the target's, its prompt steps', the draft's each
//! apart), on one feature, slowly forgotten (about 200 steps), and refuses to extrapolate
//! while the steps are too alike in size. `StepTime` fits every step of the target, mixed
//! prompt and decoding rows, on four features (rows with and without logits, keys attended)
//! with non-negative costs, to say how many prompt tokens fit beside the decoding rows.

use crate::engine::least_squares::DecayedSums;

/// Weight of a step one step older (about the last 200 steps count).
const DECAY: f64 = 0.995;

/// Decayed least-squares sums over (1, tokens) and seconds of recent steps.
#[derive(Clone, Debug)]
pub struct StepCost {
    sums: DecayedSums<2>,
}

impl Default for StepCost {
    fn default() -> Self {
        StepCost {
            sums: DecayedSums::new(DECAY),
        }
    }
}

impl StepCost {
    pub fn record(&mut self, num_tokens: usize, secs: f64) {
        self.sums.record([1.0, num_tokens as f64], secs);
    }

    /// The decayed sums of steps, tokens and seconds.
    fn w_t_y(&self) -> (f64, f64, f64) {
        let s = &self.sums;
        (s.weight(), s.xx[0][1], s.xy[0])
    }

    /// (fixed seconds per step, seconds per token), or None while recent steps are too alike
    /// in size to tell them apart.
    pub fn fit(&self) -> Option<(f64, f64)> {
        let (w, t, y) = self.w_t_y();
        let (tt, ty) = (self.sums.xx[1][1], self.sums.xy[1]);
        if w < 2.0 {
            return None;
        }
        let mean_t = t / w;
        let var_t = tt / w - mean_t * mean_t;
        if var_t < 0.25 {
            return None;
        }
        let cov = ty / w - mean_t * y / w;
        let per_token = (cov / var_t).max(0.0);
        let fixed = (y / w - per_token * mean_t).max(0.0);
        Some((fixed, per_token))
    }

    /// The acceptance rate (accepted per proposed token) above which proposing pays in a step
    /// of `num_decoding` sequences: adding X rows that bring Y tokens beats not adding them
    /// when Y / X > N * per_token / (fixed + N * per_token).
    pub fn break_even(&self, num_decoding: usize) -> Option<f64> {
        self.break_even_with(num_decoding, 0.0)
    }

    /// As `break_even`, when each proposed token per sequence also costs `extra_secs` outside
    /// the step (a draft model's step over the N sequences): one more proposed token for
    /// each of N sequences costs `extra + N * per_token`, a step without proposals brings N
    /// tokens for `fixed + N * per_token`, so it pays when its acceptance beats the ratio.
    pub fn break_even_with(&self, num_decoding: usize, extra_secs: f64) -> Option<f64> {
        let (fixed, per_token) = self.fit()?;
        let n = num_decoding as f64;
        let step = fixed + n * per_token;
        (step > 0.0).then(|| (extra_secs + n * per_token) / step)
    }

    /// Seconds per token: the fit's, or (steps too alike to fit) recent seconds over recent
    /// tokens, which counts the fixed part too and so errs high; None before any step.
    pub fn per_token_upper(&self) -> Option<f64> {
        if let Some((_, per_token)) = self.fit() {
            return Some(per_token);
        }
        let (_, t, y) = self.w_t_y();
        (t > 0.0).then(|| y / t)
    }

    /// The predicted seconds of a step of `num_tokens` tokens: the fit, or the mean of recent
    /// steps while they are too alike to fit; None before any step.
    pub fn predict(&self, num_tokens: usize) -> Option<f64> {
        if let Some((fixed, per_token)) = self.fit() {
            return Some(fixed + per_token * num_tokens as f64);
        }
        let (w, _, y) = self.w_t_y();
        (w > 0.0).then(|| y / w)
    }
}

/// The break-even acceptance of a draft model's proposals for `num_decoding` sequences: one
/// more proposed token each costs a draft step over them plus a target row each, against a
/// target step that brings one token each. The target's cost per row comes from its fit, else
/// from prompt steps (`prefill`, erring high); the draft step from the draft's own fit, else
/// the target step times `bytes_ratio` (the draft's share of the weight bytes both read once
/// per step). None before a target decoding step was measured.
pub fn draft_break_even(
    target: &StepCost,
    prefill: &StepCost,
    draft: &StepCost,
    bytes_ratio: f64,
    num_decoding: usize,
) -> Option<f64> {
    let n = num_decoding as f64;
    let step = target.predict(num_decoding).filter(|&s| s > 0.0)?;
    let per_token = match target.fit() {
        Some((_, c)) => c,
        None => prefill.per_token_upper()?,
    };
    let d = draft.predict(num_decoding).unwrap_or(step * bytes_ratio);
    Some((d + n * per_token) / step)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_fixed_and_per_token_cost() {
        let mut c = StepCost::default();
        assert!(c.fit().is_none());
        for _ in 0..10 {
            c.record(1, 0.020);
        }
        assert!(c.fit().is_none(), "all steps the same size");
        for t in [1usize, 4, 9, 100, 3] {
            c.record(t, 0.020 + 0.002 * t as f64 - 0.002);
        }
        let (fixed, per) = c.fit().unwrap();
        assert!((fixed - 0.018).abs() < 1e-6, "{fixed}");
        assert!((per - 0.002).abs() < 1e-6, "{per}");
        let one = c.break_even(1).unwrap();
        let many = c.break_even(64).unwrap();
        assert!(one < 0.1 && many > 0.8, "{one} {many}");
        // A draft step dearer than a whole step: not even 100% acceptance pays.
        assert!(c.break_even_with(1, 0.020).unwrap() > 1.0);
        assert!((c.predict(10).unwrap() - 0.038).abs() < 1e-6);
    }

    #[test]
    fn draft_break_even_from_estimates_then_measurements() {
        let (mut target, mut prefill, mut draft) = (
            StepCost::default(),
            StepCost::default(),
            StepCost::default(),
        );
        assert!(draft_break_even(&target, &prefill, &draft, 0.4, 1).is_none());
        // A 100 ms one-row step, and a 50-row prompt step of 1 s: 20 ms a row (errs high).
        target.record(1, 0.100);
        assert!(draft_break_even(&target, &prefill, &draft, 0.4, 1).is_none());
        prefill.record(50, 1.0);
        let guess = draft_break_even(&target, &prefill, &draft, 0.4, 1).unwrap();
        assert!((guess - 0.6).abs() < 1e-9, "(40 + 20) / 100: {guess}");
        // Measured: rows cost 10 ms, a draft step 30 ms.
        for t in [1usize, 4, 1, 4] {
            target.record(t, 0.090 + 0.010 * t as f64);
        }
        draft.record(1, 0.030);
        let measured = draft_break_even(&target, &prefill, &draft, 0.4, 1).unwrap();
        assert!((measured - 0.4).abs() < 1e-6, "(30 + 10) / 100: {measured}");
        // 16 sequences: 16 rows more per proposed token, against a 250 ms step.
        let many = draft_break_even(&target, &prefill, &draft, 0.4, 16).unwrap();
        assert!((many - (0.030 + 0.160) / 0.250).abs() < 1e-6, "{many}");
    }

    #[test]
    fn predicts_the_mean_while_steps_are_alike() {
        let mut c = StepCost::default();
        assert!(c.predict(1).is_none());
        c.record(2, 0.010);
        c.record(2, 0.030);
        assert!((c.predict(7).unwrap() - 0.020).abs() < 1e-4);
    }
}

//! What a step costs, learnt from the engine's own measured steps, and the time cap it puts on
//! a step's prefill. A step's time is fitted as
//! `fixed + per_logit_row * logit_rows + per_prompt_row * prompt_rows + per_key * keys`
//! (a prompt row skips the output matrix; `keys` counts the keys every row attends to), by
//! least squares over recent steps with non-negative costs. While any sequence decodes, the
//! scheduler asks [`PrefillAllowance`] how many prompt tokens fit beside the decoding rows
//! within `--max-step-ms`; with none decoding a prefill runs uncapped. The cap only decides
//! where prompts are cut into chunks, which never changes a row's arithmetic.
//!
//! Owned by the scheduler (`Scheduler::step_time`); the worker records each step's shape and
//! wall time after it runs. Numbers only; tested without a model.
//!
//! Not speculation's `speculative::cost::StepCost`, on purpose, though both fit the same decayed sums
//! (`least_squares`): here every step counts, prompt rows beside decoding rows, so a row's
//! cost depends on whether it computes logits and on the keys it attends to, and the fit
//! follows the machine quickly (about 100 steps); `StepCost` fits decoding steps alone on one
//! feature, per model, for the break-even of proposed tokens.

use crate::engine::least_squares::DecayedSums;
use crate::model::Batch;

/// Weight of a step one step older (about the last 100 steps count).
const DECAY: f64 = 0.99;

/// Prompt tokens a step may always run, however slow the steps are, so long prompts progress.
pub const MIN_PREFILL_CHUNK: usize = 16;

/// The cap while sessions decode, unless `--max-step-ms` says otherwise.
pub const DEFAULT_MAX_STEP_MS: u64 = 100;

/// Features of the fit: fixed, logit rows, prompt rows, thousands of keys.
const N: usize = 4;

/// The size of one step, as the cost model sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepShape {
    /// Rows that compute logits (decoding, verifying, a prompt's last token).
    pub logit_rows: usize,
    /// Rows that only write keys and values (prompt tokens but the last).
    pub prompt_rows: usize,
    /// Keys attended, summed over rows (a row at position p attends to p + 1).
    pub keys: usize,
}

impl StepShape {
    /// The shape of a built batch.
    pub fn of(batch: &Batch) -> Self {
        let logit_rows = batch.logits_rows.len();
        StepShape {
            logit_rows,
            prompt_rows: batch.n_tokens().saturating_sub(logit_rows),
            keys: batch.positions.iter().map(|&p| p as usize + 1).sum(),
        }
    }

    /// Adds `n` rows at positions `start..start + n`; the last computes logits when `logits`.
    pub fn add_rows(&mut self, start: usize, n: usize, logits: bool) {
        if n == 0 {
            return;
        }
        let with_logits = usize::from(logits);
        self.logit_rows += with_logits;
        self.prompt_rows += n - with_logits;
        // Keys of rows start..start + n: sum of (p + 1).
        self.keys += n * start + n * (n + 1) / 2;
    }

    fn features(&self) -> [f64; N] {
        [
            1.0,
            self.logit_rows as f64,
            self.prompt_rows as f64,
            self.keys as f64 / 1000.0,
        ]
    }
}

/// Decayed least-squares sums of step times against step shapes, and the cap's target.
#[derive(Clone, Debug)]
pub struct StepTime {
    sums: DecayedSums<N>,
    /// Decayed weight of steps that had prompt rows (until some are seen their cost is unknown).
    w_prompt: f64,
    /// The step-time target while sessions decode; None: no cap.
    pub max_step: Option<f64>,
}

impl StepTime {
    pub fn new(max_step_ms: Option<u64>) -> Self {
        StepTime {
            sums: DecayedSums::new(DECAY),
            w_prompt: 0.0,
            max_step: max_step_ms.map(|ms| ms as f64 / 1000.0),
        }
    }

    /// Learns from one step that took `secs`.
    pub fn record(&mut self, shape: StepShape, secs: f64) {
        if shape.logit_rows + shape.prompt_rows == 0 || !secs.is_finite() {
            return;
        }
        self.sums.record(shape.features(), secs);
        self.w_prompt = self.w_prompt * DECAY + f64::from(u8::from(shape.prompt_rows > 0));
    }

    /// Seconds per (step, logit row, prompt row, thousand keys): the non-negative least-squares
    /// fit of recent steps, or None before there are any. Every subset of the features is
    /// solved and the best fit whose costs are all non-negative wins (four features: sixteen
    /// tiny solves).
    pub fn fit(&self) -> Option<[f64; N]> {
        let s = &self.sums;
        if s.weight() < 1.0 {
            return None;
        }
        let mut best: Option<([f64; N], f64)> = None;
        for mask in 1u32..(1 << N) {
            let idx: Vec<usize> = (0..N).filter(|&i| mask & (1 << i) != 0).collect();
            let Some(sol) = solve_subset(&s.xx, &s.xy, &idx) else {
                continue;
            };
            if sol.iter().any(|&c| c < 0.0) {
                continue;
            }
            let mut coef = [0.0; N];
            for (&i, &c) in idx.iter().zip(&sol) {
                coef[i] = c;
            }
            let sse = self.sse(&coef);
            // Ties (within rounding) go to the smaller subset, found first.
            if best.is_none_or(|(_, b)| sse < b - 1e-12 * s.yy.max(1e-12)) {
                best = Some((coef, sse));
            }
        }
        best.map(|(c, _)| c)
    }

    /// Residual sum of squares of `coef`: yy - 2 c.xy + c^T xx c.
    fn sse(&self, coef: &[f64; N]) -> f64 {
        let sums = &self.sums;
        let mut s = sums.yy;
        for i in 0..N {
            s -= 2.0 * coef[i] * sums.xy[i];
            for j in 0..N {
                s += coef[i] * sums.xx[i][j] * coef[j];
            }
        }
        s
    }

    /// The prediction of the fit for a step of `shape`, in seconds.
    pub fn predict(&self, shape: &StepShape) -> Option<f64> {
        let coef = self.fit()?;
        Some(dot(&coef, &shape.features()))
    }

    /// The prompt tokens this step may run beside `decoding` (the shape of its decoding rows):
    /// unlimited when no cap is set or nothing decodes.
    pub fn allowance(&self, decoding: StepShape) -> PrefillAllowance {
        let limit = match self.max_step {
            Some(target) if decoding.logit_rows + decoding.prompt_rows > 0 => {
                // Until steps with prompt rows were measured, a prompt row's cost is unknown:
                // the minimum chunk only (those steps teach it).
                let coef = self.fit().filter(|_| self.w_prompt >= 2.0);
                Some(Limit { coef, target })
            }
            _ => None,
        };
        PrefillAllowance {
            shape: decoding,
            granted: 0,
            limit,
            cut: false,
        }
    }
}

fn dot(a: &[f64; N], b: &[f64; N]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Solves the normal equations restricted to the features `idx` (Gaussian elimination with
/// partial pivoting); None when they are singular (those features are not told apart).
fn solve_subset(xx: &[[f64; N]; N], xy: &[f64; N], idx: &[usize]) -> Option<Vec<f64>> {
    let k = idx.len();
    let mut a: Vec<Vec<f64>> = idx
        .iter()
        .map(|&i| {
            let mut row: Vec<f64> = idx.iter().map(|&j| xx[i][j]).collect();
            row.push(xy[i]);
            row
        })
        .collect();
    let scale: f64 = idx.iter().map(|&i| xx[i][i]).fold(0.0, f64::max);
    for col in 0..k {
        let piv = (col..k).max_by(|&r, &s| a[r][col].abs().total_cmp(&a[s][col].abs()))?;
        if a[piv][col].abs() <= 1e-9 * scale.max(1e-300) {
            return None;
        }
        a.swap(col, piv);
        let pivot_row = a[col].clone();
        for (r, row) in a.iter_mut().enumerate() {
            if r != col {
                let f = row[col] / pivot_row[col];
                for (x, p) in row[col..].iter_mut().zip(&pivot_row[col..]) {
                    *x -= f * p;
                }
            }
        }
    }
    Some((0..k).map(|i| a[i][k] / a[i][i]).collect())
}

#[derive(Clone, Copy, Debug)]
struct Limit {
    /// The fit, or None while a prompt row's cost is unknown.
    coef: Option<[f64; N]>,
    target: f64,
}

/// What is left of one step's prefill time: the scheduler takes prompt chunks from it in
/// batch order. However slow steps are, a step gets `MIN_PREFILL_CHUNK` prompt tokens.
#[derive(Clone, Debug)]
pub struct PrefillAllowance {
    /// The step so far: its decoding rows and the chunks granted.
    shape: StepShape,
    granted: usize,
    limit: Option<Limit>,
    /// Whether a chunk was granted shorter than asked.
    cut: bool,
}

impl PrefillAllowance {
    /// An allowance with no cap.
    pub fn unlimited() -> Self {
        PrefillAllowance {
            shape: StepShape::default(),
            granted: 0,
            limit: None,
            cut: false,
        }
    }

    /// Whether the cap has cut a chunk so far.
    pub fn cut(&self) -> bool {
        self.cut
    }

    /// Whether this step's prefill is capped.
    pub fn is_capped(&self) -> bool {
        self.limit.is_some()
    }

    /// Grants a chunk of at most `want` prompt tokens at positions from `start` (its last row
    /// computes logits when it ends the prompt, `ends_at`: the prompt's length) and returns
    /// its size: what keeps the predicted step within the target, and at least what is left
    /// of the minimum chunk.
    pub fn take(&mut self, start: usize, want: usize, ends_at: usize) -> usize {
        let shape_with = |base: &StepShape, n: usize| {
            let mut s = *base;
            s.add_rows(start, n, start + n >= ends_at);
            s
        };
        let n = match self.limit {
            None => want,
            Some(limit) => {
                let floor = MIN_PREFILL_CHUNK.saturating_sub(self.granted).min(want);
                let fits = |n: usize| {
                    limit.coef.is_some_and(|c| {
                        dot(&c, &shape_with(&self.shape, n).features()) <= limit.target
                    })
                };
                // The largest n in 0..=want that fits (the prediction grows with n).
                let (mut lo, mut hi) = (0, want);
                while lo < hi {
                    let mid = (lo + hi).div_ceil(2);
                    if fits(mid) {
                        lo = mid;
                    } else {
                        hi = mid - 1;
                    }
                }
                lo.max(floor)
            }
        };
        self.shape = shape_with(&self.shape, n);
        self.granted += n;
        self.cut |= n < want;
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A machine where a step costs 5 ms, a logit row 1 ms, a prompt row 0.5 ms, and a
    /// thousand keys 0.2 ms.
    fn truth(s: &StepShape) -> f64 {
        0.005
            + 0.001 * s.logit_rows as f64
            + 0.0005 * s.prompt_rows as f64
            + 0.0002 * s.keys as f64 / 1000.0
    }

    fn decode_step(rows: usize, ctx: usize) -> StepShape {
        let mut s = StepShape::default();
        for _ in 0..rows {
            s.add_rows(ctx, 1, true);
        }
        s
    }

    fn prefill_step(start: usize, n: usize, ends_at: usize) -> StepShape {
        let mut s = StepShape::default();
        s.add_rows(start, n, start + n >= ends_at);
        s
    }

    #[test]
    fn shapes_count_rows_and_keys() {
        let s = prefill_step(10, 4, 14);
        assert_eq!(s.logit_rows, 1);
        assert_eq!(s.prompt_rows, 3);
        assert_eq!(s.keys, 11 + 12 + 13 + 14);
        let s = prefill_step(10, 4, 100);
        assert_eq!((s.logit_rows, s.prompt_rows), (0, 4));
    }

    #[test]
    fn fit_recovers_the_costs_of_rows_and_keys() {
        let mut t = StepTime::new(Some(100));
        assert!(t.fit().is_none());
        for i in 0..40 {
            let d = decode_step(1 + i % 5, 100 + 10 * i);
            t.record(d, truth(&d));
            let p = prefill_step(64 * i, 64, 4000);
            t.record(p, truth(&p));
            let mut m = decode_step(4, 200);
            m.add_rows(32 * i, 16 + i, false);
            t.record(m, truth(&m));
        }
        let c = t.fit().unwrap();
        let want = [0.005, 0.001, 0.0005, 0.0002];
        for (got, want) in c.iter().zip(want) {
            assert!((got - want).abs() < 1e-6, "{c:?}");
        }
        let s = prefill_step(3000, 100, 3100);
        assert!((t.predict(&s).unwrap() - truth(&s)).abs() < 1e-6);
    }

    #[test]
    fn costs_stay_non_negative() {
        // Noise that makes a plain least-squares key cost negative.
        let mut t = StepTime::new(None);
        for i in 0..20 {
            let s = prefill_step(0, 10 + i, 1000);
            let noise = if i % 2 == 0 { 0.002 } else { -0.002 };
            t.record(s, 0.010 + noise - 0.00001 * s.keys as f64 / 1000.0);
        }
        let c = t.fit().unwrap();
        assert!(c.iter().all(|&x| x >= 0.0), "{c:?}");
    }

    #[test]
    fn no_cap_without_target_or_decoding_rows() {
        let t = StepTime::new(None);
        let mut a = t.allowance(decode_step(4, 100));
        assert!(!a.is_capped());
        assert_eq!(a.take(0, 512, 2590), 512);
        let t = StepTime::new(Some(10));
        let mut a = t.allowance(StepShape::default());
        assert!(!a.is_capped(), "a lone prefill runs at full speed");
        assert_eq!(a.take(0, 512, 2590), 512);
    }

    #[test]
    fn unknown_prompt_cost_grants_the_minimum_chunk() {
        let mut t = StepTime::new(Some(100));
        for i in 0..10 {
            let d = decode_step(1 + i % 4, 50);
            t.record(d, truth(&d));
        }
        let mut a = t.allowance(decode_step(4, 50));
        assert!(a.is_capped());
        assert_eq!(a.take(0, 512, 2590), MIN_PREFILL_CHUNK);
        assert_eq!(
            a.take(0, 512, 600),
            0,
            "the minimum is per step, not per prompt"
        );
    }

    #[test]
    fn cap_keeps_the_predicted_step_within_the_target() {
        let mut t = StepTime::new(Some(50));
        for i in 0..60 {
            let d = decode_step(1 + i % 5, 100 + 10 * i);
            t.record(d, truth(&d));
            let mut m = decode_step(4, 200);
            m.add_rows(40 * i, 8 + i, false);
            t.record(m, truth(&m));
        }
        for start in [0usize, 1000, 3000] {
            let base = decode_step(4, 300);
            let mut a = t.allowance(base);
            let n = a.take(start, 512, 5000);
            let mut with = base;
            with.add_rows(start, n, false);
            let mut one_more = base;
            one_more.add_rows(start, n + 1, false);
            assert!(truth(&with) <= 0.050 + 1e-9, "start {start}: {n} tokens");
            assert!(
                truth(&one_more) > 0.050,
                "start {start}: {n} tokens is not the most"
            );
            assert!(n > MIN_PREFILL_CHUNK);
            // Deeper prompts get smaller chunks: their keys cost more.
            assert_eq!(a.take(start + n, 512, 5000), 0, "the step is full");
        }
        let (mut a0, mut a3) = (
            t.allowance(decode_step(4, 300)),
            t.allowance(decode_step(4, 300)),
        );
        assert!(a3.take(3000, 512, 5000) < a0.take(0, 512, 5000));
        // Decoding rows that already fill the target leave the minimum chunk.
        let mut a = t.allowance(decode_step(64, 300));
        assert_eq!(a.take(0, 512, 5000), MIN_PREFILL_CHUNK);
        // A prompt shorter than what fits runs whole, and its last row computes logits.
        let mut a = t.allowance(decode_step(1, 10));
        assert_eq!(a.take(0, 20, 20), 20);
    }
}

//! The sums both step-time models learn from: exponentially decayed least-squares sums of a
//! step's measured seconds against its features (`x[0]` is always 1, the fixed part), so a
//! model follows the machine as it warms, throttles or shares its cores, without keeping steps.
//!
//! Two models use them, on purpose apart: `speculative::cost::StepCost` (decoding steps only, time
//! against tokens, one per model and kind of step, for speculation's break-even) and
//! `step_time::StepTime` (every step, time against logit rows, prompt rows and keys attended,
//! for the scheduler's `--max-step-ms` cap). Numbers only; tested without a model.

/// Decayed sums over steps of `x x^T`, `x y` and `y y`, where `x` are a step's `N` features
/// (the first is 1) and `y` its seconds. With `x[0] == 1`, `xx[0][0]` is the decayed count.
#[derive(Clone, Debug)]
pub struct DecayedSums<const N: usize> {
    /// The weight of a step one step older (0.99: about the last 100 steps count).
    decay: f64,
    pub xx: [[f64; N]; N],
    pub xy: [f64; N],
    pub yy: f64,
}

impl<const N: usize> DecayedSums<N> {
    pub fn new(decay: f64) -> Self {
        DecayedSums {
            decay,
            xx: [[0.0; N]; N],
            xy: [0.0; N],
            yy: 0.0,
        }
    }

    /// Ages the sums by one step and adds a step of features `x` that took `y` seconds.
    pub fn record(&mut self, x: [f64; N], y: f64) {
        for i in 0..N {
            for j in 0..N {
                self.xx[i][j] = self.xx[i][j] * self.decay + x[i] * x[j];
            }
            self.xy[i] = self.xy[i] * self.decay + x[i] * y;
        }
        self.yy = self.yy * self.decay + y * y;
    }

    /// The decayed number of steps recorded (`x[0]` is 1).
    pub fn weight(&self) -> f64 {
        self.xx[0][0]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_decay_and_accumulate() {
        let mut s = DecayedSums::<2>::new(0.5);
        s.record([1.0, 2.0], 3.0);
        s.record([1.0, 4.0], 1.0);
        assert_eq!(s.weight(), 1.5);
        assert_eq!(s.xx[0][1], 2.0 * 0.5 + 4.0);
        assert_eq!(s.xx[1][1], 4.0 * 0.5 + 16.0);
        assert_eq!(s.xy, [3.0 * 0.5 + 1.0, 6.0 * 0.5 + 4.0]);
        assert_eq!(s.yy, 9.0 * 0.5 + 1.0);
    }
}

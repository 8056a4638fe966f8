//! Speculative decoding that never changes the output. Before a step, a decoding sequence may
//! get a few proposed tokens (`ngram`: prompt lookup in its own tokens); the scheduler runs them
//! as extra rows of that sequence, counted in the step's token budget, and the worker verifies
//! them against the target's own choices row by row (`verify`). Rejected rows' KV entries are
//! rolled back by the scheduler.
//!
//! Proposals are deterministic (a point mass q), so standard speculative rejection sampling
//! reduces to: draw the target's token from row i with the sequence's own sampler; keep going
//! while it equals proposal i. A proposal is kept with probability p(token), and on rejection
//! the drawn token is distributed as p with the proposal removed and renormalised: exactly the
//! residual. Every emitted token consumes one draw of the sequence's generator, as without
//! speculation, so greedy output is identical and a seeded sampled output is too.
//!
//! - `ngram`: the prompt-lookup proposer.
//! - `cost`: a fit of step time against tokens per step, which decides whether proposals pay.
//! - [`Speculator`]: per-sequence proposal lengths that follow acceptance, and the gate.

pub mod cost;
pub mod ngram;

use std::collections::HashMap;

use cost::StepCost;

/// How an engine speculates; fixed at start-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecConfig {
    /// Off: no proposals at all (the engine runs as before).
    pub enabled: bool,
    /// Most tokens proposed for one sequence in one step.
    pub max_tokens: usize,
    /// Shortest and longest n-gram of a sequence's last tokens looked up in its context.
    pub ngram_min: usize,
    pub ngram_max: usize,
    /// Proposal lengths follow acceptance and proposals stop when they do not pay; false
    /// proposes `max_tokens` whenever there is a match (for tests and measurements).
    pub adaptive: bool,
}

impl Default for SpecConfig {
    fn default() -> Self {
        SpecConfig {
            enabled: false,
            max_tokens: 8,
            ngram_min: 2,
            ngram_max: 4,
            adaptive: true,
        }
    }
}

impl SpecConfig {
    /// Prompt lookup with the default parameters.
    pub fn ngram() -> Self {
        SpecConfig {
            enabled: true,
            ..Default::default()
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.max_tokens == 0 || self.max_tokens > 64 {
            return Err(format!(
                "--spec-max-tokens must be between 1 and 64, got {}",
                self.max_tokens
            ));
        }
        if self.ngram_min == 0 || self.ngram_min > self.ngram_max || self.ngram_max > 16 {
            return Err(format!(
                "--spec-ngram must be MIN..MAX with 1 <= MIN <= MAX <= 16, got {}..{}",
                self.ngram_min, self.ngram_max
            ));
        }
        Ok(())
    }
}

/// Steps between probes while proposals are switched off, so acceptance is measured again.
const PROBE_EVERY: u64 = 64;

/// Proposes tokens for decoding sequences and learns from what was accepted.
pub struct Speculator {
    pub config: SpecConfig,
    /// Proposal length of each sequence (adaptive).
    lengths: HashMap<u64, usize>,
    cost: StepCost,
    /// Decayed sums of proposed and accepted tokens over recent steps.
    recent_proposed: f64,
    recent_accepted: f64,
    /// Whether the last decision was to propose, and steps since proposals were switched off.
    on: bool,
    steps_off: u64,
}

impl Speculator {
    pub fn new(config: SpecConfig) -> Self {
        Speculator {
            config,
            lengths: HashMap::new(),
            cost: StepCost::default(),
            recent_proposed: 0.0,
            recent_accepted: 0.0,
            on: true,
            steps_off: 0,
        }
    }

    /// Whether this step should carry proposals for `num_decoding` decoding sequences: when the
    /// expected accepted tokens per proposed row exceed what a row costs relative to a step
    /// (`StepCost::break_even`). Unknown costs keep the last decision; every `PROBE_EVERY`
    /// steps off one step proposes anyway, to measure acceptance again.
    pub fn gate(&mut self, num_decoding: usize) -> bool {
        if !self.config.enabled || num_decoding == 0 {
            return false;
        }
        if !self.config.adaptive {
            return true;
        }
        if self.recent_proposed >= 4.0 {
            if let Some(threshold) = self.cost.break_even(num_decoding) {
                self.on = self.acceptance() > threshold;
            }
        }
        if self.on {
            self.steps_off = 0;
            return true;
        }
        self.steps_off += 1;
        self.steps_off.is_multiple_of(PROBE_EVERY)
    }

    /// Recent accepted tokens per proposed token.
    pub fn acceptance(&self) -> f64 {
        if self.recent_proposed == 0.0 {
            1.0
        } else {
            self.recent_accepted / self.recent_proposed
        }
    }

    /// How many tokens to propose for `seq_id` now.
    pub fn length(&self, seq_id: u64) -> usize {
        if !self.config.adaptive {
            return self.config.max_tokens;
        }
        *self
            .lengths
            .get(&seq_id)
            .unwrap_or(&self.config.max_tokens.min(4))
    }

    /// The proposal for a decoding sequence whose tokens are `tokens` (prompt and output).
    pub fn propose(&self, seq_id: u64, tokens: &[u32]) -> Vec<u32> {
        let c = &self.config;
        ngram::propose(tokens, c.ngram_min, c.ngram_max, self.length(seq_id))
    }

    /// Learns from one verification: `accepted` of `proposed` tokens kept. A fully accepted
    /// proposal grows the next one; a rejection shortens it to what was accepted plus one.
    pub fn record(&mut self, seq_id: u64, proposed: usize, accepted: usize) {
        if proposed == 0 {
            return;
        }
        let max = self.config.max_tokens;
        let next = if accepted == proposed {
            (self.length(seq_id) + 2).min(max)
        } else {
            (accepted + 1).min(max)
        };
        self.lengths.insert(seq_id, next);
        self.recent_proposed += proposed as f64;
        self.recent_accepted += accepted as f64;
    }

    /// Records one step: its tokens and time; the acceptance sums decay once per step.
    pub fn record_step(&mut self, num_tokens: usize, secs: f64) {
        self.cost.record(num_tokens, secs);
        self.recent_proposed *= 0.97;
        self.recent_accepted *= 0.97;
    }

    /// Forgets a finished sequence.
    pub fn forget(&mut self, seq_id: u64) {
        self.lengths.remove(&seq_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_follow_acceptance() {
        let mut s = Speculator::new(SpecConfig::ngram());
        assert_eq!(s.length(1), 4);
        s.record(1, 4, 4);
        assert_eq!(s.length(1), 6);
        s.record(1, 6, 6);
        s.record(1, 8, 8);
        assert_eq!(s.length(1), 8);
        s.record(1, 8, 2);
        assert_eq!(s.length(1), 3);
        s.record(1, 3, 0);
        assert_eq!(s.length(1), 1);
        s.forget(1);
        assert_eq!(s.length(1), 4);
    }

    #[test]
    fn gate_switches_off_when_rows_cost_more_than_they_bring() {
        let mut s = Speculator::new(SpecConfig::ngram());
        // A step costs 10 ms plus 1 ms per token: with 16 sequences a row is worth proposing
        // only if more than 16/26 of proposals are accepted.
        for t in [1usize, 5, 9, 16, 40, 16, 20, 100] {
            for _ in 0..5 {
                s.record_step(t, 0.010 + 0.001 * t as f64);
            }
        }
        for _ in 0..10 {
            s.record(1, 4, 1); // 25% acceptance
        }
        assert!(
            s.gate(1),
            "one sequence: 25% acceptance pays (threshold 1/11)"
        );
        assert!(!s.gate(16), "16 sequences: 25% acceptance does not pay");
        let probes = (0..PROBE_EVERY * 2).filter(|_| s.gate(16)).count();
        assert_eq!(
            probes, 2,
            "one probe step every PROBE_EVERY steps while off"
        );
        s.config.enabled = false;
        assert!(!s.gate(1));
    }

    #[test]
    fn config_is_validated() {
        assert!(SpecConfig::ngram().validate().is_ok());
        let bad = SpecConfig {
            ngram_min: 3,
            ngram_max: 2,
            ..SpecConfig::ngram()
        };
        assert!(bad.validate().unwrap_err().contains("--spec-ngram"));
        let bad = SpecConfig {
            max_tokens: 0,
            ..SpecConfig::ngram()
        };
        assert!(bad.validate().is_err());
    }
}

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
//! - `draft`: the draft-model proposer (a small model of the same vocabulary, greedy, on its
//!   own KV pool), used when `SpecConfig::draft` is set.
//! - `cost`: a fit of step time against tokens per step, which decides whether proposals pay.
//! - [`Speculator`]: per-sequence proposal lengths that follow acceptance, and the gate.

pub mod cost;
pub mod draft;
pub mod ngram;
mod step;

use std::collections::HashMap;

use anyhow::Result;

use crate::engine::sequence::SeqId;
use cost::StepCost;

pub use draft::{check_vocab, DraftRunner, DraftSetup};

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
    /// The draft model that proposes instead of prompt lookup (`--spec draft`), with its pool.
    pub draft: Option<DraftSetup>,
}

impl Default for SpecConfig {
    fn default() -> Self {
        SpecConfig {
            enabled: false,
            max_tokens: 8,
            ngram_min: 2,
            ngram_max: 4,
            adaptive: true,
            draft: None,
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

/// Weight of a sequence's older verifications against its newest (it adapts within a few).
const SEQ_DECAY: f64 = 0.7;

/// Break-even acceptance assumed until step times are known.
const DEFAULT_BREAK_EVEN: f64 = 0.25;

/// A draft model's acceptance assumed before any of its proposals were verified (a draft of
/// the target's family agrees with it on most tokens of code and prose).
const DRAFT_PRIOR_ACCEPTANCE: f64 = 0.8;

/// A sequence's recent verifications: proposed tokens kept, and proposals cut by a rejection.
#[derive(Clone, Copy, Debug, Default)]
struct SeqStats {
    accepted: f64,
    rejected: f64,
}

/// Proposes tokens for decoding sequences and learns from what was accepted.
pub struct Speculator {
    pub config: SpecConfig,
    /// Recent acceptance of each sequence (adaptive lengths).
    stats: HashMap<SeqId, SeqStats>,
    /// The acceptance a proposed row must beat in the current step (see `gate`).
    break_even: f64,
    cost: StepCost,
    /// Steps with prompt rows (which skip the output matrix): a first guess of a row's cost
    /// before any proposal was verified.
    prefill: StepCost,
    /// Decayed sums of proposed and accepted tokens over recent steps.
    recent_proposed: f64,
    recent_accepted: f64,
    /// The last acceptance measured over enough proposals (the draft model's gate keeps it
    /// while proposals are off).
    last_acceptance: Option<f64>,
    /// Whether the last decision was to propose, and steps since proposals were switched off.
    on: bool,
    steps_off: u64,
    /// The draft model, when it proposes (`config.draft`).
    pub draft: Option<DraftRunner>,
}

impl Speculator {
    pub fn new(config: SpecConfig) -> Self {
        Speculator {
            config,
            stats: HashMap::new(),
            break_even: DEFAULT_BREAK_EVEN,
            cost: StepCost::default(),
            prefill: StepCost::default(),
            recent_proposed: 0.0,
            recent_accepted: 0.0,
            last_acceptance: None,
            on: true,
            steps_off: 0,
            draft: None,
        }
    }

    /// The speculator of an engine of `target` on `placement` (the device and the KV cache
    /// types, which the draft's pool shares) with KV blocks of `block_size` tokens: with `config.draft`, its draft model is checked against the target's vocabulary
    /// and loaded on its own pool (catch-up steps of at most `max_rows` rows).
    pub fn start(
        config: SpecConfig,
        target: &crate::model::Model,
        placement: crate::device::Placement,
        block_size: usize,
        max_rows: usize,
    ) -> Result<Self> {
        let draft = match (&config.draft, config.enabled) {
            (Some(setup), true) => Some(DraftRunner::new(
                setup, target, placement, block_size, max_rows,
            )?),
            _ => None,
        };
        Ok(Speculator {
            draft,
            ..Speculator::new(config)
        })
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
        if self.draft.is_some() {
            return self.gate_draft(num_decoding);
        }
        if self.recent_proposed >= 4.0 {
            // A draft model's step over these sequences is paid once per proposed token.
            let extra = match &self.draft {
                Some(d) => d.cost.predict(num_decoding),
                None => Some(0.0),
            };
            if let Some(threshold) = extra.and_then(|x| self.cost.break_even_with(num_decoding, x))
            {
                self.break_even = threshold;
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

    /// The gate with a draft model. Every proposed token costs a draft step over the N
    /// sequences plus N target rows; a step without proposals brings N tokens. Both costs are
    /// estimated before they are measured (a row from prompt steps, a draft step from the
    /// weights' size), so the draft never starts (its first proposal computes the whole
    /// context) where it cannot pay. There are no periodic probes: a probe would catch the
    /// draft's KV up on every token since the last one, which costs about what keeping the
    /// draft running would. Instead the last measured acceptance is kept while off, and
    /// proposals come back when the costs change (fewer sessions, a quieter machine) so that
    /// it beats the break-even.
    fn gate_draft(&mut self, num_decoding: usize) -> bool {
        let draft = self.draft.as_ref().expect("draft mode");
        let threshold = cost::draft_break_even(
            &self.cost,
            &self.prefill,
            &draft.cost,
            draft.bytes_ratio,
            num_decoding,
        );
        // Not one decoding step measured yet: wait for one (the first decides).
        let Some(threshold) = threshold else {
            return false;
        };
        self.break_even = threshold;
        if self.recent_proposed >= 4.0 {
            self.last_acceptance = Some(self.acceptance());
        }
        let acceptance = self.last_acceptance.unwrap_or(DRAFT_PRIOR_ACCEPTANCE);
        self.on = acceptance > threshold;
        self.on
    }

    /// The break-even acceptance the last gate decision used.
    pub fn break_even(&self) -> f64 {
        self.break_even
    }

    /// Recent accepted tokens per proposed token.
    pub fn acceptance(&self) -> f64 {
        if self.recent_proposed == 0.0 {
            1.0
        } else {
            self.recent_accepted / self.recent_proposed
        }
    }

    /// The chance that a sequence's next proposed token is accepted after the ones before it
    /// were: its accepted tokens over accepted plus rejections, recent ones weighing more
    /// (one pseudo-count each way to start).
    pub fn seq_acceptance(&self, seq_id: SeqId) -> f64 {
        let s = self.stats.get(&seq_id).copied().unwrap_or_default();
        (s.accepted + 1.0) / (s.accepted + s.rejected + 2.0)
    }

    /// How many tokens to propose for `seq_id` now. The k-th proposed token is kept with
    /// probability about a^k (a: the sequence's acceptance) and costs a row; it pays while
    /// a^k beats the break-even of this step, so k = ln(break_even) / ln(a).
    pub fn length(&self, seq_id: SeqId) -> usize {
        let max = self.config.max_tokens;
        if !self.config.adaptive {
            return max;
        }
        let a = self.seq_acceptance(seq_id).min(0.99);
        let k = self.break_even.clamp(1e-3, 0.99).ln() / a.ln();
        (k.floor() as usize).clamp(1, max)
    }

    /// The proposal for a decoding sequence whose tokens are `tokens` (prompt and output).
    pub fn propose(&self, seq_id: SeqId, tokens: &[u32]) -> Vec<u32> {
        let c = &self.config;
        ngram::propose(tokens, c.ngram_min, c.ngram_max, self.length(seq_id))
    }

    /// Learns from one verification: `accepted` of `proposed` tokens kept.
    pub fn record(&mut self, seq_id: SeqId, proposed: usize, accepted: usize) {
        if proposed == 0 {
            return;
        }
        let s = self.stats.entry(seq_id).or_default();
        s.accepted = s.accepted * SEQ_DECAY + accepted as f64;
        s.rejected = s.rejected * SEQ_DECAY + f64::from(u8::from(accepted < proposed));
        self.recent_proposed += proposed as f64;
        self.recent_accepted += accepted as f64;
    }

    /// Records one step: its tokens and time (learnt from only when every row was a decoding
    /// or verifying row, `all_logits`); the acceptance sums decay once per step.
    pub fn record_step(&mut self, num_tokens: usize, secs: f64, all_logits: bool) {
        if all_logits {
            self.cost.record(num_tokens, secs);
        } else {
            self.prefill.record(num_tokens, secs);
        }
        self.recent_proposed *= 0.97;
        self.recent_accepted *= 0.97;
    }

    /// Proposals for several decoding sequences at once: (sequence, its tokens, most tokens
    /// it may take). The draft model runs one batch over all of them; prompt lookup goes one
    /// by one. `is_end` tokens end a draft's proposal.
    pub fn propose_all(
        &mut self,
        wants: &[(SeqId, &[u32], usize)],
        is_end: impl Fn(u32) -> bool,
    ) -> Vec<Vec<u32>> {
        let sized: Vec<(SeqId, &[u32], usize)> = wants
            .iter()
            .map(|&(id, tokens, room)| (id, tokens, self.length(id).min(room)))
            .collect();
        match &mut self.draft {
            Some(d) => d.propose(&sized, is_end),
            None => sized
                .iter()
                .map(|&(id, tokens, room)| {
                    let mut p = self.propose(id, tokens);
                    p.truncate(room);
                    p
                })
                .collect(),
        }
    }

    /// Gives back what a sequence holds in the draft's KV pool (preempted: it catches up again
    /// when it decodes), keeping its acceptance.
    pub fn release(&mut self, seq_id: SeqId) {
        if let Some(d) = &mut self.draft {
            d.forget(seq_id);
        }
    }

    /// Forgets a finished sequence, and gives back its draft blocks.
    pub fn forget(&mut self, seq_id: SeqId) {
        self.stats.remove(&seq_id);
        self.release(seq_id);
    }

    /// Blocks in the draft's KV pool, and free ones (None without a draft model).
    pub fn draft_blocks(&self) -> Option<(usize, usize)> {
        self.draft.as_ref().map(|d| (d.num_blocks(), d.num_free()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_follow_acceptance() {
        let mut s = Speculator::new(SpecConfig::ngram());
        // Break-even 0.25, acceptance 1/2 to start: 0.5^2 = 0.25 is the last that pays.
        assert_eq!(s.length(SeqId(1)), 2);
        s.record(SeqId(1), 2, 2);
        s.record(SeqId(1), 4, 4);
        assert_eq!(
            s.length(SeqId(1)),
            8,
            "acceptance {}",
            s.seq_acceptance(SeqId(1))
        );
        for _ in 0..3 {
            s.record(SeqId(1), 8, 0);
        }
        assert_eq!(
            s.length(SeqId(1)),
            1,
            "acceptance {}",
            s.seq_acceptance(SeqId(1))
        );
        s.forget(SeqId(1));
        assert_eq!(s.length(SeqId(1)), 2);
        // A dearer row (break-even 0.6) shortens proposals at the same acceptance.
        s.record(SeqId(1), 4, 4);
        let cheap = s.length(SeqId(1));
        s.break_even = 0.6;
        assert!(s.length(SeqId(1)) < cheap);
    }

    #[test]
    fn gate_switches_off_when_rows_cost_more_than_they_bring() {
        let mut s = Speculator::new(SpecConfig::ngram());
        // A step costs 10 ms plus 1 ms per token: with 16 sequences a row is worth proposing
        // only if more than 16/26 of proposals are accepted.
        for t in [1usize, 5, 9, 16, 40, 16, 20, 100] {
            for _ in 0..5 {
                s.record_step(t, 0.010 + 0.001 * t as f64, true);
            }
        }
        for _ in 0..10 {
            s.record(SeqId(1), 4, 1); // 25% acceptance
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

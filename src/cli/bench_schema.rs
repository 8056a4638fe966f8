//! `edge-llm bench --sessions N --json-schema FILE`: the constrained sessions benchmark, each
//! repetition followed by the same benchmark without the constraint, twice:
//!
//! - plain: every session asks for `-n` tokens, as the constrained run did. Its ratio is the
//!   aggregate tokens/s with the schema over without, as a user sees it; a schema that ends
//!   sessions early lowers it (fewer tokens over as many steps, the last steps with few rows),
//!   whatever the masks cost.
//! - matched: session i asks for as many tokens as constrained session i generated, so both runs
//!   do the same work and the ratio is what constrained decoding itself costs.
//!
//! The three runs of a repetition follow each other on one engine (the machine's drift hits all
//! three); ratios are medians of the per-repetition ratios.

use std::io::Write;

use anyhow::Result;

use super::bench::{median, sessions_once, BenchArgs};
use crate::constraint::Constraint;
use crate::engine::sampler::Rng;
use crate::engine::EngineHandle;

/// Aggregate tokens/s of one repetition's three runs.
#[derive(Clone, Copy, Debug)]
pub(super) struct Triple {
    pub with: f64,
    pub without: f64,
    pub matched: f64,
}

pub(super) struct Comparison {
    /// Medians of the constrained runs: (aggregate tokens/s, TTFT ms, prefix-cache hit rate),
    /// the figures of the plain table.
    pub constrained: (f64, f64, f64),
    pub runs: Vec<Triple>,
    /// Tokens the constrained sessions generated in all, per repetition.
    pub tokens: Vec<usize>,
}

impl Comparison {
    /// Median of with/without over the repetitions.
    pub fn ratio(&self) -> f64 {
        median(self.runs.iter().map(|t| t.with / t.without).collect())
    }

    /// Median of with/matched over the repetitions.
    pub fn matched_ratio(&self) -> f64 {
        median(self.runs.iter().map(|t| t.with / t.matched).collect())
    }

    fn median_of(&self, f: impl Fn(&Triple) -> f64) -> f64 {
        median(self.runs.iter().map(f).collect())
    }
}

/// Runs `args.repetitions` triples (constrained, plain, matched).
pub(super) fn compare(
    engine: &EngineHandle,
    rng: &mut Rng,
    args: &BenchArgs,
    constraint: &Option<Constraint>,
) -> Result<Comparison> {
    let (mut agg, mut ttft, mut hit) = (Vec::new(), Vec::new(), Vec::new());
    let (mut runs, mut tokens) = (Vec::new(), Vec::new());
    for _ in 0..args.repetitions {
        let with = sessions_once(engine, rng, args, constraint, true, None)?;
        let (min, max) = (with.lengths.iter().min(), with.lengths.iter().max());
        let total: usize = with.lengths.iter().sum();
        eprintln!(
            "constrained sessions generated {total} tokens ({}..{} each)",
            min.unwrap_or(&0),
            max.unwrap_or(&0)
        );
        let without = sessions_once(engine, rng, args, &None, true, None)?;
        let matched = sessions_once(engine, rng, args, &None, true, Some(&with.lengths))?;
        runs.push(Triple {
            with: with.tokens_per_s,
            without: without.tokens_per_s,
            matched: matched.tokens_per_s,
        });
        tokens.push(total);
        agg.push(with.tokens_per_s);
        ttft.push(with.ttft_ms);
        hit.push(with.hit_rate);
    }
    Ok(Comparison {
        constrained: (median(agg), median(ttft), median(hit)),
        runs,
        tokens,
    })
}

/// The comparison table, after the plain one.
pub(super) fn print(out: &mut impl Write, args: &BenchArgs, c: &Comparison) -> Result<()> {
    writeln!(out)?;
    writeln!(out, "| sessions | with schema tokens/s | without tokens/s | ratio | without, matched lengths tokens/s | matched ratio |")?;
    writeln!(out, "|---|---|---|---|---|---|")?;
    writeln!(
        out,
        "| {} | {:.1} | {:.1} | {:.2}x | {:.1} | {:.2}x |",
        args.sessions,
        c.median_of(|t| t.with),
        c.median_of(|t| t.without),
        c.ratio(),
        c.median_of(|t| t.matched),
        c.matched_ratio()
    )?;
    let list = |f: fn(&Triple) -> f64| {
        c.runs
            .iter()
            .map(|t| format!("{:.1}", f(t)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    eprintln!(
        "runs with schema: [{}]; without: [{}]; without, matched lengths: [{}] (tokens each with schema: {:?} of {})",
        list(|t| t.with),
        list(|t| t.without),
        list(|t| t.matched),
        c.tokens,
        args.sessions * args.n_gen
    );
    Ok(())
}

/// The comparison's fields for `--json`.
pub(super) fn json(c: &Comparison) -> serde_json::Value {
    serde_json::json!({
        "unconstrained_tokens_per_s": c.median_of(|t| t.without),
        "ratio": c.ratio(),
        "matched_unconstrained_tokens_per_s": c.median_of(|t| t.matched),
        "matched_ratio": c.matched_ratio(),
        "runs_with": c.runs.iter().map(|t| t.with).collect::<Vec<_>>(),
        "runs_without": c.runs.iter().map(|t| t.without).collect::<Vec<_>>(),
        "runs_matched": c.runs.iter().map(|t| t.matched).collect::<Vec<_>>(),
        "constrained_tokens": c.tokens,
    })
}

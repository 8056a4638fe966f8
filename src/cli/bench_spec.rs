//! `edge-llm bench --spec ngram`: the benchmark run with speculation off and on, interleaved
//! on one engine (each repetition runs off, then on: the machine's drift hits both), with the
//! medians, their ratio and the acceptance rate (accepted over proposed tokens).

use std::io::Write;

use anyhow::Result;

use super::bench::{median, sessions, single, BenchArgs};
use crate::constraint::Constraint;
use crate::engine::sampler::Rng;
use crate::engine::EngineHandle;

pub(super) fn compare(
    engine: &EngineHandle,
    rng: &mut Rng,
    args: &BenchArgs,
    constraint: &Option<Constraint>,
) -> Result<()> {
    let (mut off, mut on) = (Vec::new(), Vec::new());
    let before = engine.metrics().unwrap_or_default();
    for _ in 0..args.repetitions {
        for speculate in [false, true] {
            let tokens_per_s = if args.sessions == 0 {
                single(engine, rng, args, constraint, 1, speculate)?.1
            } else {
                Some(sessions(engine, rng, args, constraint, 1, speculate)?.tokens_per_s)
            };
            let Some(t) = tokens_per_s else {
                anyhow::bail!("-n must be at least 2 to measure generation speed");
            };
            if speculate { &mut on } else { &mut off }.push(t);
        }
    }
    let after = engine.metrics().unwrap_or_default();
    let proposed = after.spec_proposed_tokens - before.spec_proposed_tokens;
    let accepted = after.spec_accepted_tokens - before.spec_accepted_tokens;
    let acceptance = accepted as f64 / proposed.max(1) as f64;
    let (off_m, on_m) = (median(off.clone()), median(on.clone()));
    let what = if args.sessions == 0 {
        format!("tg{} (one sequence)", args.n_gen)
    } else {
        format!(
            "{} sessions x {} tokens, aggregate",
            args.sessions, args.n_gen
        )
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "| test | spec off tokens/s | spec on tokens/s | on/off | proposed | accepted | acceptance |")?;
    writeln!(out, "|---|---|---|---|---|---|---|")?;
    writeln!(
        out,
        "| {what} | {off_m:.1} | {on_m:.1} | {:.2}x | {proposed} | {accepted} | {acceptance:.3} |",
        on_m / off_m
    )?;
    eprintln!("runs off: {off:.1?}; on: {on:.1?}");
    if args.json {
        let j = serde_json::json!({
            "sessions": args.sessions, "n_gen": args.n_gen,
            "spec_off_tokens_per_s": off_m, "spec_on_tokens_per_s": on_m,
            "ratio": on_m / off_m, "proposed": proposed, "accepted": accepted,
            "acceptance": acceptance, "runs_off": off, "runs_on": on,
        });
        writeln!(out, "{j}")?;
    }
    Ok(())
}

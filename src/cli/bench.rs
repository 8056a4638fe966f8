//! `edge-llm bench`: prompt processing and generation speed of one sequence (like llama-bench's
//! pp and tg), and with `--sessions N --shared-prefix P` N concurrent sequences sharing a
//! P-token prefix: aggregate generated tokens/s, time to first token and the prefix-cache hit
//! rate. Everything runs through the engine, as the other faces do.
//!
//! `--depth D` (single sequence, like llama-bench's `-d`): each repetition first runs D random
//! tokens through the engine (not timed), then the timed request is those D tokens plus the -p
//! prompt tokens, so its prompt figure is the -p tokens prefilled after D tokens of context (the
//! D tokens come from the prefix cache) and its generation figure is decode at depth D + p.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::constraint::{Constraint, ConstraintSpec};
use crate::engine::disk_cache::{DiskCacheConfig, DEFAULT_DISK_MIB};
use crate::engine::sampler::{Rng, SamplingParams};
use crate::engine::{EngineHandle, EngineParts, Event, Request, RequestStream};
use crate::flags::{EngineArgs, ModelArgs, ThreadArgs};

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub threads: ThreadArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Prompt tokens (single sequence) or tokens after the shared prefix (sessions).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    pub n_prompt: usize,
    /// Tokens to generate per sequence.
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    pub n_gen: usize,
    /// Repetitions; medians are reported.
    #[arg(short = 'r', long = "repetitions", default_value_t = 3)]
    pub repetitions: usize,
    /// Single sequence: tokens of context prefilled (not timed) before the measured prompt and
    /// decode, like llama-bench's -d; with --depth, -p 0 measures decode alone at that depth.
    #[arg(short = 'd', long = "depth", default_value_t = 0)]
    pub depth: usize,
    /// Concurrent sessions (0: the single-sequence benchmark).
    #[arg(long = "sessions", default_value_t = 0)]
    pub sessions: usize,
    /// Prefix tokens all sessions share.
    #[arg(long = "shared-prefix", default_value_t = 0)]
    pub shared_prefix: usize,
    /// Print one JSON object on the last line of stdout.
    #[arg(long)]
    pub json: bool,
    /// Constrain every sequence to this JSON schema (the same figures, with constrained decoding).
    #[arg(long = "json-schema", value_name = "FILE")]
    pub json_schema: Option<std::path::PathBuf>,
    /// Single sequence: the prompt is this file's text (special tokens such as <|im_start|>
    /// parsed) instead of -p random tokens; every repetition uses it.
    #[arg(long = "prompt-file", value_name = "FILE")]
    pub prompt_file: Option<std::path::PathBuf>,
    /// Run with the prefix cache's disk tier in DIR (off by default here, so figures never
    /// depend on an earlier run's blocks)
    #[arg(long = "cache-dir", value_name = "DIR")]
    pub cache_dir: Option<std::path::PathBuf>,
    /// Embedding throughput instead: N sentences of 24-48 random tokens in batches of 32.
    #[arg(long = "embed", value_name = "N")]
    pub embed: Option<usize>,
}

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Random token ids from the ordinary part of the vocabulary, as llama-bench uses.
fn random_tokens(rng: &mut Rng, n: usize, vocab: usize) -> Vec<u32> {
    (0..n)
        .map(|_| 100 + (rng.next_u64() % (vocab as u64 - 100)) as u32)
        .collect()
}

/// Drains a stream; returns (time of the first token, time of the last, tokens generated).
/// (when the first token arrived, when the last did, tokens, the engine's time to first token in
/// ms). Streams drained one after another hear their first token late; the engine's TTFT is
/// measured when the token is made.
fn drain(stream: &mut RequestStream) -> Result<(Instant, Instant, usize, Option<u64>)> {
    let mut first = None;
    let mut last = Instant::now();
    let (mut n, mut ttft_ms) = (0, None);
    while let Some(e) = stream.next_blocking() {
        match e {
            Event::Prompt { .. } | Event::Embedding { .. } => {}
            Event::Token { .. } => {
                last = Instant::now();
                first.get_or_insert(last);
                n += 1;
            }
            Event::Finished { usage, .. } => ttft_ms = Some(usage.ttft_ms),
            Event::Error(e) => bail!("{e}"),
        }
    }
    Ok((first.unwrap_or(last), last, n, ttft_ms))
}

fn request(
    prompt: Vec<u32>,
    n_gen: usize,
    constraint: &Option<Constraint>,
    speculate: bool,
) -> Request {
    let sampling = SamplingParams {
        constraint: constraint.clone(),
        ..SamplingParams::greedy()
    };
    let mut r = Request::new(prompt, sampling, n_gen);
    r.ignore_eos = true;
    r.speculate = speculate;
    r
}

/// The constraint of `--json-schema FILE`, compiled for the engine's model.
fn schema_constraint(engine: &EngineHandle, path: &std::path::Path) -> Result<Constraint> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading --json-schema {}", path.display()))?;
    let schema: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("--json-schema {} is not JSON", path.display()))?;
    let t = Instant::now();
    let c = engine
        .grammars
        .compile(&ConstraintSpec::JsonSchema(schema), None)
        .map_err(|e| anyhow::anyhow!("--json-schema {}: {e}", path.display()))?;
    eprintln!(
        "--json-schema {}: compiled in {:.1} ms",
        path.display(),
        t.elapsed().as_secs_f64() * 1000.0
    );
    Ok(c)
}

pub fn bench(args: &BenchArgs) -> Result<()> {
    args.threads.init()?;
    if let Some(n) = args.embed {
        return super::bench_embed::run(args, n);
    }
    if args.repetitions == 0 || args.n_gen == 0 || (args.n_prompt == 0 && args.depth == 0) {
        bail!("-p, -n and -r must be at least 1 (-p may be 0 with --depth)");
    }
    if args.depth > 0 && (args.sessions > 0 || args.prompt_file.is_some()) {
        bail!("--depth applies to the single-sequence benchmark with random prompts (not with --sessions or --prompt-file)");
    }
    let threads = crate::kernels::num_threads();
    let model = args.model.load()?;
    let mut engine_args = args.engine.clone();
    let per_seq = args.depth + args.shared_prefix + args.n_prompt + args.n_gen + 1;
    if engine_args.ctx_size.is_none() {
        let least = if args.prompt_file.is_some() {
            4096
        } else {
            256
        };
        engine_args.ctx_size = Some(per_seq.max(least));
    }
    if engine_args.kv_mem.is_none() {
        engine_args.parallel = args.sessions.max(1);
    }
    let disk = args.cache_dir.as_ref().map(|root| DiskCacheConfig {
        root: root.clone(),
        budget_bytes: DEFAULT_DISK_MIB << 20,
    });
    let engine = engine_args.start(
        model,
        true,
        EngineParts {
            disk,
            ..Default::default()
        },
    )?;
    let constraint = match &args.json_schema {
        Some(path) => Some(schema_constraint(&engine, path)?),
        None => None,
    };
    let mut rng = Rng::new(1234);
    if engine_args.spec != crate::flags::SpecMode::Off {
        return super::bench_spec::compare(&engine, &mut rng, args, &constraint);
    }
    let mut out = std::io::stdout().lock();
    if args.sessions == 0 {
        let (pp, tg) = single(&engine, &mut rng, args, &constraint, args.repetitions, true)?;
        writeln!(out, "| model | threads | test | tokens/s |")?;
        writeln!(out, "|---|---|---|---|")?;
        let name = engine
            .model_path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let at = match args.depth {
            0 => String::new(),
            d => format!(" @ d{d}"),
        };
        if let Some(pp) = pp {
            writeln!(
                out,
                "| {name} | {threads} | pp{}{at} | {pp:.1} |",
                args.n_prompt
            )?;
        }
        // tg needs at least two generated tokens (the first one ends the prefill).
        if let Some(tg) = tg {
            writeln!(
                out,
                "| {name} | {threads} | tg{}{at} | {tg:.1} |",
                args.n_gen
            )?;
        }
        if args.json {
            let j = serde_json::json!({
                "threads": threads, "n_prompt": args.n_prompt, "n_gen": args.n_gen,
                "depth": args.depth, "prompt_tokens_per_s": pp, "gen_tokens_per_s": tg,
            });
            writeln!(out, "{j}")?;
        }
    } else {
        let mut waste = None;
        // With a schema, each repetition is followed by the same run without it (bench_schema).
        let comparison = match &constraint {
            Some(_) => Some(super::bench_schema::compare(
                &engine,
                &mut rng,
                args,
                &constraint,
            )?),
            None => None,
        };
        let r = match &comparison {
            Some(c) => c.constrained,
            None => {
                let f = sessions(&engine, &mut rng, args, &constraint, args.repetitions, true)?;
                writeln!(
                    out,
                    "| sessions | KV waste after prefill | KV waste at the end of generation |"
                )?;
                writeln!(out, "|---|---|---|")?;
                writeln!(
                    out,
                    "| {} | {:.1}% | {:.1}% |",
                    args.sessions,
                    100.0 * f.waste_after_prefill,
                    100.0 * f.waste_at_end
                )?;
                waste = Some((f.waste_after_prefill, f.waste_at_end));
                (f.tokens_per_s, f.ttft_ms, f.hit_rate)
            }
        };
        writeln!(out, "| sessions | shared prefix | prompt | gen | aggregate gen tokens/s | TTFT median ms | prefix-cache hit rate |")?;
        writeln!(out, "|---|---|---|---|---|---|---|")?;
        writeln!(
            out,
            "| {} | {} | {} | {} | {:.1} | {:.0} | {:.3} |",
            args.sessions, args.shared_prefix, args.n_prompt, args.n_gen, r.0, r.1, r.2
        )?;
        if let Some(c) = &comparison {
            super::bench_schema::print(&mut out, args, c)?;
        }
        if args.json {
            let mut j = serde_json::json!({
                "threads": threads, "sessions": args.sessions, "shared_prefix": args.shared_prefix,
                "n_prompt": args.n_prompt, "n_gen": args.n_gen,
                "aggregate_gen_tokens_per_s": r.0, "ttft_ms_median": r.1, "prefix_cache_hit_rate": r.2,
                "kv_waste_after_prefill": waste.map(|w| w.0), "kv_waste_at_end": waste.map(|w| w.1),
            });
            if let (Some(c), Some(obj)) = (&comparison, j.as_object_mut()) {
                if let serde_json::Value::Object(extra) = super::bench_schema::json(c) {
                    obj.extend(extra);
                }
            }
            writeln!(out, "{j}")?;
        }
    }
    if constraint.is_some() {
        let m = engine.metrics().unwrap_or_default();
        let per = m.mask_time_us as f64 / m.masks_computed.max(1) as f64;
        eprintln!(
            "constrained: {} token masks, {per:.0} us each on average (computed beside the forward pass)",
            m.masks_computed
        );
    }
    Ok(())
}

/// Medians of prompt tokens/s (prefill: submission to first token) and generated tokens/s
/// (first to last token), each repetition with a fresh random prompt so nothing is cached.
/// With `--depth D` each repetition first runs D random tokens (not timed) and then times those
/// D tokens plus the prompt: the prefix cache holds the D tokens' full blocks, so the timed
/// prefill is the prompt (and the context's last, partial block) after D tokens of context, and
/// the prompt figure counts the tokens actually computed (none with -p 0).
pub(super) fn single(
    engine: &EngineHandle,
    rng: &mut Rng,
    args: &BenchArgs,
    constraint: &Option<Constraint>,
    repetitions: usize,
    speculate: bool,
) -> Result<(Option<f64>, Option<f64>)> {
    let vocab = engine.model_config().vocab_size;
    let fixed = match &args.prompt_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading --prompt-file {}", path.display()))?;
            let tok = &engine.tokenizer();
            Some(tok.encode(&text, tok.add_bos_default(), true)?)
        }
        None => None,
    };
    let (mut pp, mut tg) = (Vec::new(), Vec::new());
    // One warm-up run, not counted.
    drain(&mut engine.submit(request(random_tokens(rng, 16, vocab), 4, constraint, false))?)?;
    for _ in 0..repetitions {
        let context = random_tokens(rng, args.depth, vocab);
        if args.depth > 0 {
            prefill_depth(engine, &context)?;
        }
        let before = engine.metrics().unwrap_or_default().prefix_cache.hit_tokens;
        let started = Instant::now();
        let mut prompt = context;
        match &fixed {
            Some(f) => prompt.extend_from_slice(f),
            None => prompt.extend(random_tokens(rng, args.n_prompt, vocab)),
        }
        let n_tokens = prompt.len();
        let mut s = engine.submit(request(prompt, args.n_gen, constraint, speculate))?;
        let (first, last, n, _) = drain(&mut s)?;
        // The tokens this request computed before its first token: all but the cached ones.
        let cached =
            (engine.metrics().unwrap_or_default().prefix_cache.hit_tokens - before) as usize;
        let bs = engine.config.block_size;
        if args.depth > 0 && cached + bs <= args.depth.min(n_tokens - 1) {
            bail!(
                "--depth {}: only {cached} tokens of the context came from the prefix cache (is the KV pool too small? try a larger -c)",
                args.depth
            );
        }
        if args.depth > 0 {
            eprintln!(
                "--depth {}: {cached} tokens of context from the prefix cache, {} computed in the timed request's prefill",
                args.depth,
                n_tokens - cached
            );
        }
        // (Without --depth every prompt token counts, as before, even where a --prompt-file
        // prompt repeats.)
        let computed = if args.depth > 0 {
            n_tokens - cached
        } else {
            n_tokens
        };
        if args.depth == 0 || args.n_prompt > 0 {
            pp.push(computed as f64 / (first - started).as_secs_f64());
        }
        if n > 1 {
            tg.push((n - 1) as f64 / (last - first).as_secs_f64());
        }
    }
    let pp = (!pp.is_empty()).then(|| median(pp));
    Ok((pp, (!tg.is_empty()).then(|| median(tg))))
}

/// Runs `context` through the engine (one token generated, not timed) so that the prefix cache
/// holds its full blocks for the request that starts with it.
fn prefill_depth(engine: &EngineHandle, context: &[u32]) -> Result<()> {
    drain(&mut engine.submit(request(context.to_vec(), 1, &None, false))?)?;
    Ok(())
}

/// Medians over repetitions of (aggregate generated tokens/s, median TTFT in ms, hit rate).
/// Each repetition uses a fresh shared prefix, so its first session computes it.
pub(super) fn sessions(
    engine: &EngineHandle,
    rng: &mut Rng,
    args: &BenchArgs,
    constraint: &Option<Constraint>,
    repetitions: usize,
    speculate: bool,
) -> Result<SessionsFigures> {
    let mut runs = Vec::new();
    for _ in 0..repetitions {
        let run = sessions_once(engine, rng, args, constraint, speculate, None)?;
        if constraint.is_some() {
            // A constraint may end sessions early and unevenly: fewer rows in the last steps.
            let (min, max) = (run.lengths.iter().min(), run.lengths.iter().max());
            eprintln!(
                "constrained sessions generated {} tokens ({}..{} each)",
                run.lengths.iter().sum::<usize>(),
                min.unwrap_or(&0),
                max.unwrap_or(&0)
            );
        }
        runs.push(run);
    }
    let med = |f: fn(&SessionsRun) -> f64| median(runs.iter().map(f).collect());
    Ok(SessionsFigures {
        tokens_per_s: med(|r| r.tokens_per_s),
        ttft_ms: med(|r| r.ttft_ms),
        hit_rate: med(|r| r.hit_rate),
        waste_after_prefill: med(|r| r.waste.0),
        waste_at_end: med(|r| r.waste.1),
    })
}

/// Medians over the repetitions of the sessions benchmark.
pub(super) struct SessionsFigures {
    pub tokens_per_s: f64,
    pub ttft_ms: f64,
    pub hit_rate: f64,
    /// The KV pool's internal waste (`Metrics::kv_waste`) once every session had its first
    /// token, and when the sessions held the most tokens (the end of generation).
    pub waste_after_prefill: f64,
    pub waste_at_end: f64,
}

/// One run of `args.sessions` concurrent sessions.
pub(super) struct SessionsRun {
    /// Aggregate generated tokens/s: all sessions' tokens over the time to the last one.
    pub tokens_per_s: f64,
    /// Median time to first token, ms.
    pub ttft_ms: f64,
    pub hit_rate: f64,
    /// Tokens each session generated, in submission order.
    pub lengths: Vec<usize>,
    /// KV waste after prefill and at the end of generation (see `SessionsFigures`).
    pub waste: (f64, f64),
}

/// The KV pool's waste while `sessions` sessions run, read from the engine's metrics every
/// millisecond until `stop`: once they generated `sessions` tokens past `generated` (every one
/// past its prefill), and when the pool held the most tokens.
fn kv_waste_during(
    engine: &EngineHandle,
    generated: u64,
    sessions: usize,
    stop: &AtomicBool,
) -> (f64, f64) {
    let (mut after_prefill, mut at_end, mut most) = (None, 0.0, 0);
    while !stop.load(Ordering::Relaxed) {
        if let Some(m) = engine.metrics() {
            if after_prefill.is_none() && m.tokens_generated >= generated + sessions as u64 {
                after_prefill = Some(m.kv_waste());
            }
            if m.kv_tokens_stored > most {
                (most, at_end) = (m.kv_tokens_stored, m.kv_waste());
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    (after_prefill.unwrap_or(at_end), at_end)
}

/// One run of the sessions benchmark with a fresh shared prefix. `max_tokens`, when given,
/// caps each session (in submission order) instead of `-n`.
pub(super) fn sessions_once(
    engine: &EngineHandle,
    rng: &mut Rng,
    args: &BenchArgs,
    constraint: &Option<Constraint>,
    speculate: bool,
    max_tokens: Option<&[usize]>,
) -> Result<SessionsRun> {
    let vocab = engine.model_config().vocab_size;
    let before = engine.metrics().unwrap_or_default().prefix_cache;
    let prefix = random_tokens(rng, args.shared_prefix, vocab);
    let generated = engine.metrics().unwrap_or_default().tokens_generated;
    let started = Instant::now();
    let mut streams = (0..args.sessions)
        .map(|i| {
            let mut p = prefix.clone();
            p.extend(random_tokens(rng, args.n_prompt, vocab));
            let n = max_tokens.map_or(args.n_gen, |m| m[i]);
            engine.submit(request(p, n, constraint, speculate))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut lengths = Vec::new();
    let mut first_ms = Vec::new();
    let mut end = started;
    let stop = AtomicBool::new(false);
    let (drained, waste) = std::thread::scope(|scope| {
        let poller = scope.spawn(|| kv_waste_during(engine, generated, args.sessions, &stop));
        let drained = streams.iter_mut().try_for_each(|s| {
            let (first, last, n, ttft_ms) = drain(s)?;
            lengths.push(n);
            first_ms.push(ttft_ms.map_or((first - started).as_secs_f64() * 1000.0, |ms| ms as f64));
            end = end.max(last);
            anyhow::Ok(())
        });
        stop.store(true, Ordering::Relaxed);
        (drained, poller.join().unwrap_or((f64::NAN, f64::NAN)))
    });
    drained?;
    let after = engine.metrics().unwrap_or_default().prefix_cache;
    let lookups = after.lookup_tokens - before.lookup_tokens;
    Ok(SessionsRun {
        tokens_per_s: lengths.iter().sum::<usize>() as f64 / (end - started).as_secs_f64(),
        ttft_ms: median(first_ms),
        hit_rate: (after.hit_tokens - before.hit_tokens) as f64 / lookups.max(1) as f64,
        lengths,
        waste,
    })
}

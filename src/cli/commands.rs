//! The subcommands `info`, `tokenize`, `run` and `perplexity`: each turns validated flags into
//! calls on the model and writes results to stdout (logs and progress go to stderr).

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::device::Device;
use crate::engine::sampler::SamplingParams;
use crate::engine::{EngineParts, Event, FinishReason, Request};
use crate::flags::{EngineArgs, ModelArgs, ThreadArgs};
use crate::gguf::GgufFile;
use crate::tokenizer::Tokenizer;

pub fn info(args: &ModelArgs) -> Result<()> {
    let path = args.path()?;
    let file = GgufFile::open(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = std::io::stdout().lock();
    file.write_info(&mut out)?;
    write_support(&file, &mut out)?;
    out.flush()?;
    Ok(())
}

/// What edge-llm runs, and whether it runs this file's architecture (the tensor types were
/// checked when the file was opened: an unknown one fails there, naming the tensor).
fn write_support(file: &GgufFile, out: &mut dyn Write) -> Result<()> {
    use crate::kernels::tensor_type::TensorType;
    use crate::model::config::SUPPORTED_ARCHITECTURES;
    let arch = file.architecture().unwrap_or("(none)");
    let types: Vec<&str> = TensorType::ALL
        .iter()
        .filter(|t| !matches!(t, TensorType::Q8_1 | TensorType::Q8_K))
        .map(|t| t.name())
        .collect();
    writeln!(out)?;
    writeln!(out, "edge-llm runs:")?;
    writeln!(
        out,
        "  architectures: {}",
        SUPPORTED_ARCHITECTURES.join(", ")
    )?;
    writeln!(
        out,
        "  tensor types:  {} (IQ types on the CPU backend only)",
        types.join(", ")
    )?;
    let verdict = if SUPPORTED_ARCHITECTURES.contains(&arch) {
        "supported"
    } else {
        "NOT supported"
    };
    writeln!(out, "  this file:     architecture '{arch}' {verdict}")?;
    Ok(())
}

pub fn tokenize(args: &ModelArgs, no_bos: bool, no_special: bool, text: &str) -> Result<()> {
    let path = args.path()?;
    let file = GgufFile::open(&path).with_context(|| format!("reading {}", path.display()))?;
    let tokenizer = Tokenizer::from_gguf(&file)
        .with_context(|| format!("building the tokenizer of {}", path.display()))?;
    let ids = tokenizer.encode(text, tokenizer.add_bos_default() && !no_bos, !no_special)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", serde_json::to_string(&ids)?)?;
    Ok(())
}

/// Sampling flags shared by the subcommands that generate.
#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Temperature; 0 is greedy.
    #[arg(long = "temp", default_value_t = 0.8, allow_negative_numbers = true)]
    pub temperature: f32,
    /// Keep the K most likely tokens (0: all).
    #[arg(long = "top-k", default_value_t = 40, allow_negative_numbers = true)]
    pub top_k: usize,
    /// Keep the most likely tokens whose mass reaches P.
    #[arg(long = "top-p", default_value_t = 0.95, allow_negative_numbers = true)]
    pub top_p: f32,
    /// Drop tokens less likely than P times the best.
    #[arg(long = "min-p", default_value_t = 0.05, allow_negative_numbers = true)]
    pub min_p: f32,
    /// Penalty for repeating one of the last --repeat-last-n tokens (1.0: off).
    #[arg(
        long = "repeat-penalty",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    pub repeat_penalty: f32,
    #[arg(
        long = "repeat-last-n",
        default_value_t = 64,
        allow_negative_numbers = true
    )]
    pub repeat_last_n: usize,
    /// Random seed [default: from the clock].
    #[arg(short = 's', long = "seed")]
    pub seed: Option<u64>,
    #[command(flatten)]
    pub llama: super::sampling_flags::LlamaSamplingArgs,
}

impl SamplingArgs {
    pub fn params(&self) -> Result<SamplingParams> {
        let mut p = SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            seed: self.seed.unwrap_or_else(clock_seed),
            ..Default::default()
        };
        self.llama.apply(&mut p)?;
        p.validate().map_err(anyhow::Error::msg)?;
        Ok(p)
    }
}

/// A `-n` flag's value as the engine's `max_tokens`: at least 1, or -1 for no limit but the
/// context (llama.cpp's meaning); anything else is refused, as `max_tokens: 0` is by the server.
pub fn max_tokens_flag(n: i64, flag: &str) -> Result<usize> {
    match n {
        -1 => Ok(usize::MAX),
        n if n >= 1 => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
        n => bail!("{flag} must be at least 1, or -1 for no limit but the context; got {n}"),
    }
}

/// A seed from the clock, for runs that did not ask for one.
pub fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Flags of `run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub threads: ThreadArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// The prompt; read from stdin when absent.
    #[arg(short = 'p', long = "prompt")]
    pub prompt: Option<String>,
    /// Tokens to generate at most; -1: no limit but the context (as llama.cpp's -n -1).
    #[arg(
        short = 'n',
        long = "n-predict",
        default_value_t = 128,
        allow_negative_numbers = true
    )]
    pub n_predict: i64,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Beam search of this width (greedy; the sampling flags do not apply): print the best
    /// beam's text.
    #[arg(long, value_name = "N", conflicts_with = "jsonl", value_parser = clap::value_parser!(u64).range(1..=crate::api::beam::MAX_WIDTH as u64))]
    pub beams: Option<u64>,
    /// Do not add BOS even if the model asks for one.
    #[arg(long)]
    pub no_bos: bool,
    /// Read one JSON request per stdin line and write one JSON result per line, in order.
    #[arg(long)]
    pub jsonl: bool,
    /// With --jsonl: requests in flight at once.
    #[arg(long, default_value_t = 16, requires = "jsonl")]
    pub concurrency: usize,
    /// With --jsonl: the Jinja chat template for `messages` [default: the model's]
    #[arg(long = "chat-template", requires = "jsonl")]
    pub chat_template: Option<PathBuf>,
    #[command(flatten)]
    pub constraint: super::constrain::ConstraintArgs,
}

pub fn run(args: &RunArgs) -> Result<()> {
    if args.jsonl {
        return super::jsonl::run(args);
    }
    args.threads.init()?;
    let sampling = args.sampling.params()?;
    let max_tokens = max_tokens_flag(args.n_predict, "-n/--n-predict")?;
    let prompt = match &args.prompt {
        Some(p) => p.clone(),
        None => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading the prompt from stdin")?;
            s
        }
    };
    let model = args.model.load()?;
    let tok = &model.tokenizer;
    let ids = tok.encode(&prompt, tok.add_bos_default() && !args.no_bos, true)?;
    // One sequence: a pool for one context unless asked otherwise.
    let mut engine_args = args.engine.clone();
    if engine_args.kv_mem.is_none() {
        engine_args.parallel = 1;
    }
    if let Some(width) = args.beams {
        engine_args.parallel = engine_args.parallel.max(width as usize);
        let engine = engine_args.start(model, false, EngineParts::default())?;
        if args.constraint.compile(&engine)?.is_some() {
            bail!("--beams cannot be combined with --json-schema, --regex or --grammar");
        }
        return super::beam::run(&engine, ids, width as usize, max_tokens, args.ignore_eos);
    }
    let engine = engine_args.start(model, false, EngineParts::default())?;
    let mut request = Request::new(ids.clone(), sampling, max_tokens);
    request.ignore_eos = args.ignore_eos;
    request.sampling.constraint = args.constraint.compile(&engine)?;
    let started = std::time::Instant::now();
    let mut stream = engine.submit(request)?;
    let mut out = std::io::stdout().lock();
    let mut n_generated = 0;
    let mut reason = FinishReason::Length;
    while let Some(event) = stream.next_blocking() {
        match event {
            Event::Prompt { .. } | Event::Embedding { .. } => {}
            Event::Token { text, .. } => {
                n_generated += 1;
                out.write_all(text.as_bytes()).and_then(|_| out.flush())?;
            }
            Event::Finished {
                text, reason: r, ..
            } => {
                out.write_all(text.as_bytes())?;
                reason = r;
            }
            Event::Error(e) => bail!("{e}"),
        }
    }
    if out.is_terminal() {
        out.write_all(b"\n")?;
    }
    out.flush()?;
    if std::io::stderr().is_terminal() {
        let secs = started.elapsed().as_secs_f64();
        eprintln!(
            "[{} prompt tokens, {n_generated} generated in {secs:.2} s ({:.1} tokens/s), finish: {}]",
            ids.len(),
            n_generated as f64 / secs,
            reason.as_str()
        );
    }
    Ok(())
}

/// Flags of `perplexity`.
#[derive(Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub threads: ThreadArgs,
    /// The text file to score (with --kl-divergence: optional, checked against the base's tokens).
    #[arg(short = 'f', long = "file", required_unless_present = "kl_divergence")]
    pub file: Option<PathBuf>,
    /// Tokens per chunk.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
    pub ctx_size: usize,
    /// Score at most this many chunks.
    #[arg(long = "chunks")]
    pub chunks: Option<usize>,
    /// Where the model runs: cuda when built with it and a GPU is usable (auto), or cpu, or cuda.
    #[arg(long = "device", value_enum, default_value_t = Device::Auto)]
    pub device: Device,
    #[command(flatten)]
    pub kv_types: crate::flags::kv_type::KvTypeArgs,
    /// llama.cpp's log-probabilities file: written here (the base model's run), or read with
    /// --kl-divergence.
    #[arg(long = "kl-divergence-base", value_name = "FILE")]
    pub kl_divergence_base: Option<PathBuf>,
    /// Compare with the --kl-divergence-base file instead of writing it: KL divergence, same
    /// top token, perplexity ratio, as llama-perplexity --kl-divergence prints them.
    #[arg(long = "kl-divergence", requires = "kl_divergence_base")]
    pub kl_divergence: bool,
}

pub fn perplexity(args: &PerplexityArgs) -> Result<()> {
    if args.chunks == Some(0) {
        bail!("--chunks must be at least 1");
    }
    if args.ctx_size < 8 {
        bail!(
            "-c/--ctx-size must be at least 8 for perplexity, got {}",
            args.ctx_size
        );
    }
    args.threads.init()?;
    // Before the file is read and tokenized, so a bad --device fails at once.
    let device = crate::device::Placement {
        device: args.device,
        kv_types: args.kv_types.kv_types(),
    }
    .resolve()?;
    let text = match &args.file {
        Some(file) => {
            let text =
                std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
            Some(String::from_utf8_lossy(&text).into_owned())
        }
        None => None,
    };
    let model = args.model.load()?;
    let started = std::time::Instant::now();
    if let (Some(base), true) = (&args.kl_divergence_base, args.kl_divergence) {
        return super::kl_divergence::compare(&model, device, base, text.as_deref(), args);
    }
    let text = text.unwrap_or_default();
    let show = |s: &crate::scoring::perplexity::PerplexityStats| {
        eprint!("[{}]{:.4},", s.num_chunks, s.ppl())
    };
    let stats = match &args.kl_divergence_base {
        Some(base) => crate::scoring::kl_divergence::write_base(
            &model,
            device,
            &text,
            args.ctx_size,
            args.chunks,
            base,
            show,
        )?,
        None => crate::scoring::perplexity::perplexity_on(
            &model,
            device,
            &text,
            args.ctx_size,
            args.chunks,
            show,
        )?,
    };
    eprintln!();
    eprintln!(
        "{} chunks of {} tokens in {:.1} s ({:.1} tokens/s)",
        stats.num_chunks,
        args.ctx_size,
        started.elapsed().as_secs_f64(),
        (stats.num_chunks * args.ctx_size) as f64 / started.elapsed().as_secs_f64()
    );
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "Final estimate: PPL = {:.4} +/- {:.5}",
        stats.ppl(),
        stats.ppl_error()
    )?;
    Ok(())
}

//! The subcommands `info`, `tokenize`, `run` and `perplexity`: each turns validated flags into
//! calls on the model and writes results to stdout (logs and progress go to stderr).

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;

use super::{ModelArgs, ThreadArgs};
use crate::generate::{self, FinishReason, GenerateOptions, SequenceRunner};
use crate::gguf::GgufFile;
use crate::sampler::SamplingParams;
use crate::tokenizer::{StreamDecoder, Tokenizer};

pub fn info(args: &ModelArgs) -> Result<()> {
    let path = args.path()?;
    let file = GgufFile::open(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = std::io::stdout().lock();
    file.write_info(&mut out)?;
    out.flush()?;
    Ok(())
}

pub fn tokenize(args: &ModelArgs, no_bos: bool, no_special: bool, text: &str) -> Result<()> {
    let path = args.path()?;
    let file = GgufFile::open(&path).with_context(|| format!("reading {}", path.display()))?;
    let tokenizer = Tokenizer::from_gguf(&file).with_context(|| format!("building the tokenizer of {}", path.display()))?;
    let ids = tokenizer.encode(text, tokenizer.add_bos_default() && !no_bos, !no_special)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", serde_json::to_string(&ids)?)?;
    Ok(())
}

/// Flags of `run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub threads: ThreadArgs,
    /// The prompt; read from stdin when absent.
    #[arg(short = 'p', long = "prompt")]
    pub prompt: Option<String>,
    /// Tokens to generate at most.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    pub n_predict: usize,
    /// Context size in tokens [default: the model's training context, at most 4096].
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,
    /// Temperature; 0 is greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temperature: f32,
    /// Keep the K most likely tokens (0: all).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    /// Keep the most likely tokens whose mass reaches P.
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than P times the best.
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalty for repeating one of the last --repeat-last-n tokens (1.0: off).
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Random seed [default: from the clock].
    #[arg(short = 's', long = "seed")]
    pub seed: Option<u64>,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Do not add BOS even if the model asks for one.
    #[arg(long)]
    pub no_bos: bool,
    /// KV cache block size in tokens.
    #[arg(long = "block-size", default_value_t = generate::DEFAULT_BLOCK_SIZE)]
    pub block_size: usize,
}

/// The context size: asked for, or the model's, capped to keep the KV cache small.
fn context_size(asked: Option<usize>, n_ctx_train: usize) -> Result<usize> {
    match asked {
        Some(0) => bail!("--ctx-size must be at least 1"),
        Some(c) => Ok(c),
        None => Ok(n_ctx_train.min(4096)),
    }
}

pub fn run(args: &RunArgs) -> Result<()> {
    args.threads.init()?;
    if args.block_size == 0 || args.block_size > 1024 {
        bail!("--block-size must be between 1 and 1024, got {}", args.block_size);
    }
    let prompt = match &args.prompt {
        Some(p) => p.clone(),
        None => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).context("reading the prompt from stdin")?;
            s
        }
    };
    let sampling = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repeat_penalty: args.repeat_penalty,
        repeat_last_n: args.repeat_last_n,
        seed: args.seed.unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
        }),
        ..Default::default()
    };
    sampling.validate().map_err(anyhow::Error::msg)?;
    let model = args.model.load()?;
    let n_ctx = context_size(args.ctx_size, model.config.n_ctx_train)?;
    let tok = &model.tokenizer;
    let ids = tok.encode(&prompt, tok.add_bos_default() && !args.no_bos, true)?;
    let mut runner = SequenceRunner::new(&model, n_ctx, args.block_size);
    let opts = GenerateOptions { n_predict: args.n_predict, ignore_eos: args.ignore_eos, sampling };
    let mut out = std::io::stdout().lock();
    let mut decoder = StreamDecoder::new();
    let mut write_err = None;
    let started = std::time::Instant::now();
    let mut n_generated = 0;
    let reason = generate::generate(&mut runner, &ids, &opts, |id| {
        n_generated += 1;
        let piece = decoder.push(tok, id);
        match out.write_all(piece.as_bytes()).and_then(|_| out.flush()) {
            Ok(()) => true,
            Err(e) => {
                write_err = Some(e);
                false
            }
        }
    })?;
    if let Some(e) = write_err {
        return Err(e.into());
    }
    out.write_all(decoder.finish().as_bytes())?;
    if out.is_terminal() {
        out.write_all(b"\n")?;
    }
    out.flush()?;
    if std::io::stderr().is_terminal() {
        let secs = started.elapsed().as_secs_f64();
        eprintln!(
            "[{} prompt tokens, {n_generated} generated in {secs:.2} s ({:.1} tokens/s), stop: {}]",
            ids.len(),
            n_generated as f64 / secs,
            match reason {
                FinishReason::Stop => "end of generation",
                FinishReason::Length => "length",
                FinishReason::Abort => "abort",
            }
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
    /// The text file to score.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Tokens per chunk.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
    pub ctx_size: usize,
    /// Score at most this many chunks.
    #[arg(long = "chunks")]
    pub chunks: Option<usize>,
}

pub fn perplexity(args: &PerplexityArgs) -> Result<()> {
    args.threads.init()?;
    let text = std::fs::read(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    let text = String::from_utf8_lossy(&text);
    let model = args.model.load()?;
    let started = std::time::Instant::now();
    let stats = crate::perplexity::perplexity(&model, &text, args.ctx_size, args.chunks, |s| {
        eprint!("[{}]{:.4},", s.num_chunks, s.ppl());
    })?;
    eprintln!();
    eprintln!(
        "{} chunks of {} tokens in {:.1} s ({:.1} tokens/s)",
        stats.num_chunks,
        args.ctx_size,
        started.elapsed().as_secs_f64(),
        (stats.num_chunks * args.ctx_size) as f64 / started.elapsed().as_secs_f64()
    );
    let mut out = std::io::stdout().lock();
    writeln!(out, "Final estimate: PPL = {:.4} +/- {:.5}", stats.ppl(), stats.ppl_error())?;
    Ok(())
}

//! `edge-llm perplexity --kl-divergence-base FILE --kl-divergence`: compares the model with a
//! base file written by llama.cpp or by edge-llm and prints what `llama-perplexity
//! --kl-divergence` prints: a line per chunk on stderr, the statistics on stdout.

use std::io::Write;
use std::path::Path;

use anyhow::Result;

use super::commands::PerplexityArgs;
use crate::device::Device;
use crate::model::Model;

pub fn compare(
    model: &Model,
    device: Device,
    base: &Path,
    text: Option<&str>,
    args: &PerplexityArgs,
) -> Result<()> {
    eprintln!(
        "chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p"
    );
    let stats = crate::kl_divergence::compare_with_base(
        model,
        device,
        base,
        Some(args.ctx_size),
        text,
        args.chunks,
        |s| eprintln!("{}", s.chunk_line()),
    )?;
    eprintln!();
    let mut out = std::io::stdout().lock();
    out.write_all(stats.report().as_bytes())?;
    out.flush()?;
    Ok(())
}

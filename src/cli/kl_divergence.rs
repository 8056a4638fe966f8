//! `edge-llm perplexity --kl-divergence-base FILE --kl-divergence`: compares the model with a
//! base file written by llama.cpp or by edge-llm and prints what `llama-perplexity
//! --kl-divergence` prints: a line per chunk on stderr, the statistics on stdout.

use std::io::Write;
use std::path::Path;

use anyhow::Result;

use super::commands::PerplexityArgs;
use crate::device::Placement;
use crate::model::Model;

const HEADER: &str = "chunk             PPL               ln(PPL(Q)/PPL(base))          \
     KL Divergence              Δp RMS            Same top p";

pub fn compare(
    model: &Model,
    device: Placement,
    base: &Path,
    text: Option<&str>,
    args: &PerplexityArgs,
) -> Result<()> {
    let stats = crate::scoring::kl_divergence::compare_with_base(
        model,
        device,
        base,
        Some(args.ctx_size),
        text,
        args.chunks,
        |s| {
            // After the first chunk, so that a bad base file's error stays one line.
            if s.num_chunks == 1 {
                eprintln!("{HEADER}");
            }
            eprintln!("{}", s.chunk_line())
        },
    )?;
    eprintln!();
    let mut out = std::io::stdout().lock();
    out.write_all(stats.report().as_bytes())?;
    out.flush()?;
    Ok(())
}

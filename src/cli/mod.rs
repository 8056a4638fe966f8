//! The terminal faces: `info`, `tokenize`, `run` (and its pipe mode `run --jsonl`),
//! `perplexity`, `bench`, `chat` and `embed`, one module per subcommand; their flags are parsed by clap
//! (the ones shared with `serve` live in `crate::flags`) and errors go back to `main` as an
//! `anyhow` chain. A sibling of `crate::server`: neither imports the other; `main.rs` holds
//! the subcommand list and calls either.

mod beam;
mod bench;
mod bench_embed;
mod bench_schema;
mod bench_spec;
mod chat;
mod commands;
mod constrain;
mod embed;
mod jsonl;
mod kl_divergence;
mod sampling_flags;

use anyhow::Result;

pub use crate::flags::ModelArgs;
pub use bench::BenchArgs;
pub use chat::ChatArgs;
pub use commands::{PerplexityArgs, RunArgs};
pub use embed::EmbedArgs;

/// `edge-llm info`: a GGUF file's metadata and tensor table.
pub fn info(model: &ModelArgs) -> Result<()> {
    commands::info(model)
}

/// `edge-llm tokenize`: the token ids of `text` as a JSON array.
pub fn tokenize(model: &ModelArgs, no_bos: bool, no_special: bool, text: &str) -> Result<()> {
    commands::tokenize(model, no_bos, no_special, text)
}

/// `edge-llm run`, or `run --jsonl` when asked.
pub fn run(args: &RunArgs) -> Result<()> {
    commands::run(args)
}

/// `edge-llm perplexity`.
pub fn perplexity(args: &PerplexityArgs) -> Result<()> {
    commands::perplexity(args)
}

/// `edge-llm bench`.
pub fn bench(args: &BenchArgs) -> Result<()> {
    bench::bench(args)
}

/// `edge-llm embed`.
pub fn embed(args: &EmbedArgs) -> Result<()> {
    embed::run(args)
}

/// `edge-llm chat`.
pub fn chat(args: &ChatArgs) -> Result<()> {
    chat::run(args)
}

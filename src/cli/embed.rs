//! `edge-llm embed`: one embedding per input line, for pipes. Lines come from stdin (or
//! `-f FILE`); each is read as the server reads one `input` string (`crate::api::embeddings`),
//! so a line's vector equals `/v1/embeddings`' for the same text and flags. Lines go to the
//! engine `--batch` at a time, so they are batched together; each result is one JSON line on
//! stdout, in input order (an encoder model, bert or nomic-bert, embeds on its own worker): `{"index": i, "embedding": [...]}` (with `--pooling none`, a list
//! of every token's vector), or `{"index": i, "error": "..."}` for a line that cannot be
//! embedded (an empty one, one longer than the context); the others go on.

use std::io::{BufRead, Write};
use std::path::PathBuf;

use anyhow::{anyhow, Context, Result};
use clap::Args;
use serde_json::{json, Map, Value};

use crate::api::embeddings::{self, EmbeddingSetting, EmbeddingsPlan, Shape};
use crate::engine::{Embedder, Embedding, EngineParts, Pooling};
use crate::flags::embedding::{start_embedder, EmbeddingArgs};
use crate::flags::{EngineArgs, ModelArgs, ThreadArgs};

/// Flags of `embed`.
#[derive(Args, Debug)]
pub struct EmbedArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub threads: ThreadArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub embedding: EmbeddingArgs,
    /// Read the lines from FILE instead of stdin.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// Lines handed to the engine together.
    #[arg(long = "batch", default_value_t = 32)]
    pub batch: usize,
}

pub fn run(args: &EmbedArgs) -> Result<()> {
    args.threads.init()?;
    let (embedder, pooling) = start_embedder(&args.model, &args.embedding, |model| {
        args.engine.start(model, false, EngineParts::default())
    })?;
    let input: Box<dyn BufRead> = match &args.file {
        Some(path) => Box::new(std::io::BufReader::new(
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?,
        )),
        None => Box::new(std::io::stdin().lock()),
    };
    let setting = EmbeddingSetting {
        tokenizer: embedder.tokenizer(),
        pooling,
        normalize: args.embedding.embd_normalize,
        n_embd: embedder.n_embd(),
        max_seq_len: embedder.max_seq_len(),
    };
    let mut out = std::io::stdout().lock();
    let mut lines = input.lines().enumerate().peekable();
    while lines.peek().is_some() {
        let batch: Vec<(usize, String)> = lines
            .by_ref()
            .take(args.batch.max(1))
            .map(|(i, l)| l.map(|l| (i, l)).context("reading the input"))
            .collect::<Result<_>>()?;
        // Every line of the batch submitted before any is waited for.
        let submitted: Vec<(usize, Result<(EmbeddingsPlan, Embedding)>)> = batch
            .into_iter()
            .map(|(i, line)| (i, submit(&embedder, &setting, line)))
            .collect();
        for (index, job) in submitted {
            let done = job.and_then(|(plan, embedding)| {
                let (vectors, _) = embedding.wait_blocking().map_err(|e| anyhow!(e))?;
                Ok((vectors, plan))
            });
            let line = match done {
                Ok((vectors, plan)) => {
                    let mut vectors = embeddings::finish_vectors(&plan, vectors);
                    let embedding = match plan.pooling {
                        Pooling::None => json!(vectors),
                        _ => json!(vectors.swap_remove(0)),
                    };
                    json!({"index": index, "embedding": embedding})
                }
                Err(e) => json!({"index": index, "error": format!("{e:#}")}),
            };
            writeln!(out, "{line}")?;
        }
        out.flush()?;
    }
    Ok(())
}

/// Reads one line as the server reads an `input` string and submits it.
fn submit(
    embedder: &Embedder,
    setting: &EmbeddingSetting,
    line: String,
) -> Result<(EmbeddingsPlan, Embedding)> {
    let body: Map<String, Value> = [("input".to_string(), Value::String(line))]
        .into_iter()
        .collect();
    let plan = embeddings::plan(&body, setting, Shape::Llama).map_err(|e| anyhow!(e.message))?;
    let embedding = embedder.submit(plan.prompts[0].clone(), plan.pooling, None)?;
    Ok((plan, embedding))
}

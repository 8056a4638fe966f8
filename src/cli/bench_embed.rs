//! `edge-llm bench --embed N`: embedding throughput. N sentences of 24 to 48 random tokens
//! (the same ones every repetition) go to the engine in batches of 32, each batch submitted
//! whole before any result is awaited, as a client of `/v1/embeddings` sends them; the figures
//! are sentences and prompt tokens per second, medians over `-r` repetitions. An encoder model
//! (bert, nomic-bert) runs on its own worker, pooled as its file says.

use std::io::Write;
use std::time::Instant;

use anyhow::{anyhow, bail, Result};

use super::bench::{median, BenchArgs};
use crate::engine::sampler::Rng;
use crate::engine::{Embedder, EngineParts, Pooling};
use crate::flags::embedding::start_embedder;

/// Sentences handed to the engine together.
const BATCH: usize = 32;

pub fn run(args: &BenchArgs, num_sentences: usize) -> Result<()> {
    if num_sentences == 0 || args.repetitions == 0 {
        bail!("--embed and -r must be at least 1");
    }
    let embedding_args = crate::flags::embedding::EmbeddingArgs {
        embeddings: true,
        pooling: None,
        embd_normalize: -1,
        rerank: false,
    };
    let mut vocab = 0;
    let (embedder, pooling) = start_embedder(&args.model, &embedding_args, |model| {
        vocab = model.config.vocab_size as u64;
        let mut engine_args = args.engine.clone();
        engine_args.ctx_size.get_or_insert(64);
        if engine_args.kv_mem.is_none() {
            engine_args.parallel = BATCH;
        }
        engine_args.start(model, true, EngineParts::default())
    })?;
    // A decoder's last token has seen the whole sentence; an encoder pools as its file says
    // (mean for none, which would answer every token's vector).
    let pooling = match &embedder {
        Embedder::Decoder(_) => Pooling::Last,
        Embedder::Encoder(e) => {
            vocab = e.config().vocab_size as u64;
            if pooling == Pooling::None {
                Pooling::Mean
            } else {
                pooling
            }
        }
    };
    let mut rng = Rng::new(1234);
    let sentences: Vec<Vec<u32>> = (0..num_sentences)
        .map(|_| {
            let len = 24 + (rng.next_u64() % 25) as usize;
            (0..len)
                .map(|_| 100 + (rng.next_u64() % (vocab - 100)) as u32)
                .collect()
        })
        .collect();
    let num_tokens: usize = sentences.iter().map(Vec::len).sum();
    let mut seconds = Vec::new();
    for _ in 0..args.repetitions {
        let start = Instant::now();
        for batch in sentences.chunks(BATCH) {
            let pending = batch
                .iter()
                .map(|s| embedder.submit(s.clone(), pooling, None))
                .collect::<Result<Vec<_>, _>>()?;
            for embedding in pending {
                embedding.wait_blocking().map_err(|e| anyhow!(e))?;
            }
        }
        seconds.push(start.elapsed().as_secs_f64());
    }
    let s = median(seconds);
    let (per_s, tok_s) = (num_sentences as f64 / s, num_tokens as f64 / s);
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "| sentences | tokens | batch | sentences/s | tokens/s |"
    )?;
    writeln!(out, "|---|---|---|---|---|")?;
    writeln!(
        out,
        "| {num_sentences} | {num_tokens} | {BATCH} | {per_s:.1} | {tok_s:.1} |"
    )?;
    if args.json {
        let line = serde_json::json!({"embed": {"sentences": num_sentences, "tokens": num_tokens,
            "batch": BATCH, "sentences_per_s": per_s, "tokens_per_s": tok_s}});
        writeln!(out, "{line}")?;
    }
    Ok(())
}

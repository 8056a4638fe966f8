//! The embedding flags `serve` and `embed` share: `--pooling` and `--embd-normalize` (as
//! llama.cpp names them), and llama-server's `--embeddings`, accepted for its command lines
//! (edge-llm always serves embeddings), and `--rerank`; [`start_embedder`] picks the encoder's
//! worker or the engine for the `-m` file.

use std::path::Path;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::engine::{Embedder, EncoderHandle, EngineHandle};
use crate::gguf::GgufFile;
use crate::model::encoder::Encoder;
use crate::model::Pooling;

#[derive(Args, Debug, Clone)]
pub struct EmbeddingArgs {
    /// Accepted for llama-server's command lines; embeddings are always served.
    #[arg(long = "embeddings", alias = "embedding")]
    pub embeddings: bool,
    /// How a prompt's hidden states become one embedding: none (every token's), mean, cls,
    /// last [default: the model's {arch}.pooling_type, else last]
    #[arg(long = "pooling", value_name = "TYPE")]
    pub pooling: Option<String>,
    /// Normalization of pooled embeddings, as llama.cpp's: -1 none, 0 max absolute (int16
    /// range), 1 taxicab, 2 euclidean, p a p-norm
    #[arg(
        long = "embd-normalize",
        alias = "normalize",
        value_name = "N",
        default_value_t = 2,
        allow_negative_numbers = true
    )]
    pub embd_normalize: i32,
    /// Serve a reranker's /v1/rerank (llama-server's flag; implies pooling rank): the model
    /// must be one (pooling_type rank: a bert with a cls head, a Qwen3-Reranker); a reranker
    /// serves it without the flag too
    #[arg(long = "rerank", alias = "reranking")]
    pub rerank: bool,
}

impl EmbeddingArgs {
    /// `--rerank`, or llama.cpp's `--pooling rank`.
    pub fn wants_rank(&self) -> bool {
        self.rerank || self.pooling.as_deref() == Some("rank")
    }

    /// The pooling to use with the model of `file`: `--pooling` (which wins, as in llama.cpp),
    /// else the file's `{arch}.pooling_type`, else last (a decoder's last token has seen the
    /// whole prompt; llama.cpp would pool nothing and refuse `/v1/embeddings`).
    pub fn pooling(&self, file: &GgufFile) -> Result<Pooling> {
        let rank = Pooling::is_rank(file);
        if self.wants_rank() && !rank {
            bail!(
                "--rerank: {} is not a reranker (its pooling_type is not rank)",
                file.path().display()
            );
        }
        // A decoder reranker's embedding is its last token's (what its score reads).
        if rank && self.pooling.as_deref().is_none_or(|p| p == "rank") {
            return Ok(Pooling::Last);
        }
        if let Some(p) = &self.pooling {
            return Pooling::parse(p).context("--pooling");
        }
        Ok(Pooling::from_gguf(file)?.unwrap_or(Pooling::Last))
    }
}

/// The pooling of an encoder's embeddings: `--pooling`, else the file's; `--rerank` (or
/// `--pooling rank`) needs a reranker.
pub fn encoder_pooling(args: &EmbeddingArgs, encoder: &Encoder, path: &Path) -> Result<Pooling> {
    if args.wants_rank() && encoder.head.is_none() {
        bail!(
            "--rerank: {} is not a reranker (its pooling_type is not rank)",
            path.display()
        );
    }
    match args.pooling.as_deref() {
        None | Some("rank") => Ok(encoder.config.pooling),
        Some(p) => Pooling::parse(p).context("--pooling"),
    }
}

/// Whether `path` is an encoder's file (bert, nomic-bert): served by the encoder's worker,
/// not the engine.
pub fn is_encoder_file(path: &Path) -> Result<bool> {
    let file = GgufFile::open(path).with_context(|| format!("opening model {}", path.display()))?;
    Ok(crate::model::encoder::is_encoder(&file))
}

/// What computes the embeddings of the `-m` model and their pooling: an encoder's worker for an
/// encoder file, else the engine (started by `start_engine` on the loaded decoder).
pub fn start_embedder(
    model: &super::ModelArgs,
    args: &EmbeddingArgs,
    start_engine: impl FnOnce(crate::model::Model) -> Result<EngineHandle>,
) -> Result<(Embedder, Pooling)> {
    let path = model.path()?;
    if is_encoder_file(&path)? {
        let encoder = Encoder::load(&path)?;
        let pooling = encoder_pooling(args, &encoder, &path)?;
        return Ok((Embedder::Encoder(EncoderHandle::start(encoder)?), pooling));
    }
    let decoder = model.load()?;
    let pooling = args.pooling(&decoder.file)?;
    Ok((Embedder::Decoder(start_engine(decoder)?), pooling))
}

//! Encoder models (`bert`, `nomic-bert`): a whole sequence in, every token's final hidden state
//! out, for embeddings. Apart from the generation path ([`crate::model::Model`], the paged KV
//! cache, the batch): an encoder attends over the whole sequence at once, so it needs neither.
//!
//! [`Encoder::load`] reads and checks the file (`config.rs`, `weights.rs`); [`Encoder::encode`]
//! runs the CPU forward pass (`forward.rs`); [`Encoder::embed`] pools and normalizes as
//! llama.cpp's embeddings do (`crate::model::pooling`). Callers: the engine's embeddings path
//! (to come) and tests/encoder_models.rs. The generation path refuses these architectures
//! (`ModelConfig::from_gguf`), on every backend.

pub mod config;
mod forward;
pub mod rank;
pub mod weights;

use std::path::Path;

use anyhow::{bail, Context, Result};

pub use config::{EncoderConfig, EncoderKind, ENCODER_ARCHITECTURES};

use crate::gguf::GgufFile;
use crate::model::pooling::{self, Pooling};
use crate::tokenizer::Tokenizer;
use rank::ClassifierHead;
use weights::EncoderWeights;

/// A loaded encoder: the mapped file, its hyperparameters, its checked weights, its tokenizer.
pub struct Encoder {
    pub file: GgufFile,
    pub config: EncoderConfig,
    pub weights: EncoderWeights,
    pub tokenizer: Tokenizer,
    /// A reranker's classifier head (`config.rank`); None for an embedding model.
    pub head: Option<ClassifierHead>,
}

/// Whether the file's architecture is an encoder's (then [`Encoder::load`] it, not `Model`).
pub fn is_encoder(g: &GgufFile) -> bool {
    g.architecture()
        .is_ok_and(|a| ENCODER_ARCHITECTURES.contains(&a))
}

impl Encoder {
    /// Opens and validates an encoder GGUF: every key and tensor the forward pass reads.
    pub fn load(path: &Path) -> Result<Encoder> {
        let file =
            GgufFile::open(path).with_context(|| format!("opening model {}", path.display()))?;
        let config = EncoderConfig::from_gguf(&file)
            .with_context(|| format!("reading hyperparameters of {}", path.display()))?;
        let weights = EncoderWeights::from_gguf(&file, &config)
            .with_context(|| format!("reading weights of {}", path.display()))?;
        let tokenizer = Tokenizer::from_gguf(&file)
            .with_context(|| format!("building the tokenizer of {}", path.display()))?;
        if tokenizer.vocab_size() != config.vocab_size {
            bail!(
                "{}: the tokenizer has {} tokens, token_embd {} rows",
                path.display(),
                tokenizer.vocab_size(),
                config.vocab_size
            );
        }
        let head = match config.rank {
            true => Some(
                ClassifierHead::from_gguf(&file, config.n_embd)
                    .with_context(|| format!("reading the classifier of {}", path.display()))?,
            ),
            false => None,
        };
        Ok(Encoder {
            file,
            config,
            weights,
            tokenizer,
            head,
        })
    }

    /// Every token's final hidden state, `[tokens.len()][n_embd]` (llama.cpp's embeddings with
    /// pooling none). Errors: no tokens, more than the trained positions, an id outside the
    /// vocabulary.
    pub fn encode(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        forward::encode(&self.file, &self.config, &self.weights, tokens)
    }

    /// The tokens' embedding pooled by `pooling` (the model's own: `config.pooling`) and
    /// normalized by llama.cpp's `common_embd_normalize(norm)` (2: euclidean, -1: none):
    /// `[n_embd]`, or `[tokens.len()][n_embd]` for [`Pooling::None`] (each row normalized).
    pub fn embed(&self, tokens: &[u32], pooling: Pooling, norm: i32) -> Result<Vec<f32>> {
        let hidden = self.encode(tokens)?;
        let n = self.config.n_embd;
        let rows = match pooling {
            Pooling::Cls => &hidden[..n],
            Pooling::Last => &hidden[hidden.len() - n..],
            Pooling::None | Pooling::Mean => &hidden[..],
        };
        let mut out = pooling::pool(pooling, rows, n);
        for row in out.chunks_exact_mut(n) {
            pooling::normalize(row, norm);
        }
        Ok(out)
    }

    /// A reranker's relevance score of a pair's tokens ([`Encoder::pair_tokens`]): its
    /// classifier head over the CLS token's hidden state. Errors on an embedding model.
    pub fn score(&self, tokens: &[u32]) -> Result<f32> {
        let Some(head) = &self.head else {
            bail!(
                "this model is not a reranker ({}.pooling_type is not rank)",
                self.config.architecture
            );
        };
        let hidden = self.encode(tokens)?;
        Ok(head.score(&self.file, &hidden[..self.config.n_embd]))
    }

    /// The tokens of a (query, document) pair, as llama-server's rerank makes them.
    pub fn pair_tokens(&self, query: &str, document: &str) -> Result<Vec<u32>> {
        rank::pair_tokens(&self.file, &self.tokenizer, query, document)
    }
}

//! The embedding flags `serve` and `embed` share: `--pooling` and `--embd-normalize` (as
//! llama.cpp names them), and llama-server's `--embeddings`, accepted for its command lines
//! (edge-llm always serves embeddings).

use anyhow::{Context, Result};
use clap::Args;

use crate::gguf::GgufFile;
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
}

impl EmbeddingArgs {
    /// The pooling to use with the model of `file`: `--pooling` (which wins, as in llama.cpp),
    /// else the file's `{arch}.pooling_type`, else last (a decoder's last token has seen the
    /// whole prompt; llama.cpp would pool nothing and refuse `/v1/embeddings`).
    pub fn pooling(&self, file: &GgufFile) -> Result<Pooling> {
        if let Some(p) = &self.pooling {
            return Pooling::parse(p).context("--pooling");
        }
        Ok(Pooling::from_gguf(file)?.unwrap_or(Pooling::Last))
    }
}

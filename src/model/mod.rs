//! The model layer: hyperparameters read from a GGUF file (`config`), weights that stay in the
//! mmap (`weights`), the flat batch the engine hands over (`batch`), the paged KV pool
//! (`crate::kv_cache`) and the forward pass over a batch (`forward`).
//!
//! Callers (the CLI today, the engine loop later) build a [`Batch`], call [`Model::forward`],
//! and get logits back only for the rows that asked for them.

pub mod batch;
pub mod config;
pub mod forward;
pub mod weights;

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};

pub use batch::Batch;
pub use config::ModelConfig;
pub use weights::Weights;

use crate::gguf::GgufFile;
use crate::tokenizer::Tokenizer;

/// A loaded model: the mapped file, its hyperparameters, weights and tokenizer.
pub struct Model {
    pub file: Arc<GgufFile>,
    pub config: ModelConfig,
    pub weights: Weights,
    pub tokenizer: Tokenizer,
}

impl Model {
    /// Opens and validates a GGUF model: every required key and tensor is checked here, so the
    /// forward pass never meets a missing or misshapen tensor.
    pub fn load(path: &Path) -> Result<Model> {
        let file =
            GgufFile::open(path).with_context(|| format!("opening model {}", path.display()))?;
        let config = ModelConfig::from_gguf(&file)
            .with_context(|| format!("reading hyperparameters of {}", path.display()))?;
        let weights = Weights::from_gguf(&file, &config)
            .with_context(|| format!("reading weights of {}", path.display()))?;
        let tokenizer = Tokenizer::from_gguf(&file)
            .with_context(|| format!("building the tokenizer of {}", path.display()))?;
        Ok(Model {
            file: Arc::new(file),
            config,
            weights,
            tokenizer,
        })
    }
}

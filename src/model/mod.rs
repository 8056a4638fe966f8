//! The model layer: hyperparameters read from a GGUF file (`config`), the weights
//! (`weights`, one struct for every backend), the flat batch the engine hands over (`batch`),
//! and the forward pass (`forward`): one layer loop, written against the operations of a
//! [`Backend`] (`backend`). The CPU backend (`cpu`) wraps `crate::kernels` and the paged KV pool
//! (`crate::model::kv_cache`); the CUDA backend lives in `crate::cuda`.
//!
//! Callers (the engine, through `crate::device::Executor`) load the weights onto a backend
//! once, build a [`Batch`] per step, run [`forward::forward`], and get logits back only for the
//! rows that asked for them.

mod arena;
pub mod backend;
pub mod batch;
pub mod config;
mod config_layers;
mod config_moe;
pub mod cpu;
pub mod delta_net;
pub mod encoder;
pub mod forward;
pub mod hybrid;
pub mod key_centers;
pub mod kv_cache;
pub mod layer_shapes;
pub mod mamba2;
mod mamba2_cpu;
pub mod moe;
pub mod moe_gemma4;
pub mod moe_qwen35;
pub mod per_layer;
pub mod pooling;
pub mod rank;
pub mod state_pool;
pub mod weights;
pub mod weights_load;

use std::path::Path;
use std::sync::{Arc, OnceLock};

use anyhow::{Context, Result};

pub use backend::{Backend, WeightStore};
pub use batch::Batch;
pub use config::ModelConfig;
pub use cpu::Cpu;
pub use forward::{forward, forward_rows, Loaded, StepOutput};
pub use pooling::Pooling;
pub use weights::{InFile, Weights};

use crate::gguf::GgufFile;
use crate::tokenizer::Tokenizer;

/// A loaded model: the mapped file, its hyperparameters, its weights as the file holds them
/// (checked) and its tokenizer.
pub struct Model {
    pub file: Arc<GgufFile>,
    pub config: ModelConfig,
    pub weights: Weights<InFile>,
    pub tokenizer: Tokenizer,
    /// The weights as the CPU backend keeps them, made by the first [`Model::cpu_weights`]
    /// and shared by every CPU executor of this model.
    cpu_weights: OnceLock<Arc<Weights<Cpu>>>,
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
            cpu_weights: OnceLock::new(),
        })
    }

    /// The weights on the CPU (with the interleaved copies of the `kernels::has_x8` types), made on
    /// the first call, when the first CPU executor is made, never during a step.
    pub fn cpu_weights(&self) -> Arc<Weights<Cpu>> {
        Arc::clone(
            self.cpu_weights
                .get_or_init(|| Arc::new(cpu::load_weights(&self.file, &self.weights))),
        )
    }

    /// A CPU backend with a KV pool of `num_blocks` blocks of `block_size` tokens of
    /// `kv_types` (checked against the head size by the caller: `KvTypes::check`), and the
    /// weights loaded on it.
    pub fn on_cpu(
        &self,
        kv_types: crate::kernels::KvTypes,
        block_size: usize,
        num_blocks: usize,
    ) -> Loaded<Cpu> {
        let mut backend = Cpu::new(&self.config, kv_types, block_size, num_blocks);
        if kv_types.k.block_size() > 1 {
            backend.set_key_centers(self.key_centers());
        }
        Loaded {
            backend,
            weights: self.cpu_weights(),
        }
    }

    /// Each layer's key center, [kv_dim] or none (`key_centers`): what a quantized K cache
    /// subtracts from every key, on any backend.
    pub fn key_centers(&self) -> Vec<Option<Vec<f32>>> {
        let layers = &self.weights.layers;
        let k_biases: Vec<Option<&[f32]>> = layers
            .iter()
            .map(|l| l.attention().and_then(|a| a.wk.bias.as_deref()))
            .collect();
        let k_normed: Vec<bool> = layers
            .iter()
            .map(|l| l.attention().is_some_and(|a| a.attn_k_norm.is_some()))
            .collect();
        key_centers::key_centers(&self.config, &k_biases, &k_normed)
    }
}

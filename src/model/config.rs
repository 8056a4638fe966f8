//! Hyperparameters of a model, read from its GGUF metadata. The differences between model
//! families are expressed here as data, so the forward pass stays one function.

use anyhow::{bail, Context, Result};

use crate::gguf::GgufFile;
use crate::kernels::{Activation, Rope, RopeStyle};

/// Architectures the forward pass implements.
pub const SUPPORTED_ARCHITECTURES: &[&str] = &["llama"];

#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub architecture: String,
    pub num_layers: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    /// Context length the model was trained for.
    pub n_ctx_train: usize,
    pub rms_eps: f32,
    pub rope: Rope,
    pub activation: Activation,
    /// Softmax scale of attention scores.
    pub attn_scale: f32,
}

impl ModelConfig {
    pub fn from_gguf(g: &GgufFile) -> Result<ModelConfig> {
        let arch = g.architecture()?.to_string();
        if !SUPPORTED_ARCHITECTURES.contains(&arch.as_str()) {
            bail!(
                "unsupported architecture '{arch}' (general.architecture); edge-llm runs: {}",
                SUPPORTED_ARCHITECTURES.join(", ")
            );
        }
        let key = |k: &str| format!("{arch}.{k}");
        let usize_key = |k: &str| -> Result<usize> {
            let v = g.get_u64(&key(k))?;
            usize::try_from(v).ok().filter(|&v| v > 0 && v < (1 << 24)).with_context(|| format!("{} = {v} is out of range", key(k)))
        };
        let n_embd = usize_key("embedding_length")?;
        let num_layers = usize_key("block_count")?;
        let n_ff = usize_key("feed_forward_length")?;
        let n_heads = usize_key("attention.head_count")?;
        let n_kv_heads = if g.get(&key("attention.head_count_kv")).is_some() {
            usize_key("attention.head_count_kv")?
        } else {
            n_heads
        };
        if n_heads % n_kv_heads != 0 {
            bail!("{} = {n_heads} is not a multiple of {} = {n_kv_heads}", key("attention.head_count"), key("attention.head_count_kv"));
        }
        let head_dim = if g.get(&key("attention.key_length")).is_some() {
            usize_key("attention.key_length")?
        } else {
            if n_embd % n_heads != 0 {
                bail!("{} = {n_embd} is not a multiple of the head count {n_heads}", key("embedding_length"));
            }
            n_embd / n_heads
        };
        if head_dim > crate::kernels::EL_MAX_HEAD_DIM as usize || head_dim % 2 != 0 {
            bail!("head size {head_dim} is not supported (even, at most {})", crate::kernels::EL_MAX_HEAD_DIM);
        }
        let rope_dim = if g.get(&key("rope.dimension_count")).is_some() { usize_key("rope.dimension_count")? } else { head_dim };
        if rope_dim > head_dim || rope_dim % 2 != 0 {
            bail!("{} = {rope_dim} does not fit the head size {head_dim}", key("rope.dimension_count"));
        }
        let freq_base = if g.get(&key("rope.freq_base")).is_some() { g.get_f32(&key("rope.freq_base"))? } else { 10000.0 };
        let mut freq_scale = 1.0;
        if let Ok(kind) = g.get_str(&key("rope.scaling.type")) {
            match kind {
                "none" => {}
                "linear" => freq_scale = 1.0 / g.get_f32(&key("rope.scaling.factor"))?,
                other => bail!("rope scaling '{other}' ({}) is not supported", key("rope.scaling.type")),
            }
        }
        let rms_eps = g.get_f32(&key("attention.layer_norm_rms_epsilon"))?;
        let n_ctx_train = usize_key("context_length")?;
        let embd = g.tensor("token_embd.weight")?;
        let vocab_size = if g.get(&key("vocab_size")).is_some() { usize_key("vocab_size")? } else { embd.n_rows() };
        Ok(ModelConfig {
            architecture: arch,
            num_layers,
            n_embd,
            n_ff,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab_size,
            n_ctx_train,
            rms_eps,
            rope: Rope { head_dim, rope_dim, freq_base, freq_scale, style: RopeStyle::Normal },
            activation: Activation::SwiGlu,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
        })
    }

    /// Width of one token's keys (or values) in one layer.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Width of one token's queries.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
}

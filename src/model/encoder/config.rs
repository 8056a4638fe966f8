//! Hyperparameters of an encoder (`bert`, `nomic-bert`), read from its GGUF metadata as
//! llama.cpp's `llama_model_bert` and `llama_model_nomic_bert` read them.

use anyhow::{bail, Context, Result};

use crate::gguf::GgufFile;
use crate::kernels::{Rope, RopeStyle};
use crate::model::pooling::Pooling;

/// Encoder architectures (`general.architecture`).
pub const ENCODER_ARCHITECTURES: &[&str] = &["bert", "nomic-bert"];

/// What sets the two encoder families apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncoderKind {
    /// Learned absolute positions (`position_embd`), GELU feed-forward with biases.
    Bert,
    /// Rotary positions (neox), SwiGLU feed-forward (`ffn_gate`, `ffn_up`, `ffn_down`).
    NomicBert,
}

#[derive(Clone, Debug)]
pub struct EncoderConfig {
    pub architecture: String,
    pub kind: EncoderKind,
    pub num_layers: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    /// Positions the model was trained for: the rows of `position_embd` (bert), and the longest
    /// sequence [`super::Encoder::encode`] takes.
    pub n_ctx_train: usize,
    /// `{arch}.attention.layer_norm_epsilon`.
    pub norm_eps: f32,
    /// `{arch}.attention.causal` (false for every converted encoder; llama.cpp's default true).
    pub causal: bool,
    /// `{arch}.pooling_type` (None when absent, as llama.cpp).
    pub pooling: Pooling,
    /// `{arch}.pooling_type` = 4: a reranker, scored by its classifier head (`rank.rs`).
    pub rank: bool,
    /// `tokenizer.ggml.token_type_count`: rows of `token_types` (llama.cpp requires it).
    pub n_token_types: usize,
    /// nomic-bert's rotary embedding.
    pub rope: Option<Rope>,
}

impl EncoderConfig {
    pub fn from_gguf(g: &GgufFile) -> Result<EncoderConfig> {
        let arch = g.architecture()?.to_string();
        let kind = match arch.as_str() {
            "bert" => EncoderKind::Bert,
            "nomic-bert" => EncoderKind::NomicBert,
            other => bail!(
                "architecture '{other}' is not an encoder (edge-llm encodes with: {})",
                ENCODER_ARCHITECTURES.join(", ")
            ),
        };
        let key = |k: &str| format!("{arch}.{k}");
        let has = |k: &str| g.get(&key(k)).is_some();
        let usize_at = |k: &str| -> Result<usize> {
            let v = g.get_u64(k)?;
            usize::try_from(v)
                .ok()
                .filter(|&v| v > 0 && v < (1 << 24))
                .with_context(|| format!("{k} = {v} is out of range"))
        };
        let usize_key = |k: &str| usize_at(&key(k));

        let n_embd = usize_key("embedding_length")?;
        let num_layers = usize_key("block_count")?;
        let n_ff = usize_key("feed_forward_length")?;
        let n_heads = usize_key("attention.head_count")?;
        let n_kv_heads = if has("attention.head_count_kv") {
            usize_key("attention.head_count_kv")?
        } else {
            n_heads
        };
        if n_embd % n_heads != 0 || n_heads % n_kv_heads != 0 {
            bail!(
                "{} = {n_embd}, {} = {n_heads} and {} = {n_kv_heads} do not divide evenly",
                key("embedding_length"),
                key("attention.head_count"),
                key("attention.head_count_kv")
            );
        }
        let head_dim = n_embd / n_heads;
        let norm_eps = g.get_f32(&key("attention.layer_norm_epsilon"))?;
        if !(norm_eps.is_finite() && norm_eps > 0.0) {
            bail!(
                "{} is {norm_eps}; it must be a positive finite number",
                key("attention.layer_norm_epsilon")
            );
        }
        let causal = g.get_bool_or(&key("attention.causal"), true)?;
        // A reranker (pooling_type rank) embeds by its CLS token, as its score reads it.
        let rank = Pooling::is_rank(g);
        let pooling = if rank {
            Pooling::Cls
        } else {
            Pooling::from_gguf(g)?.unwrap_or(Pooling::None)
        };
        let n_token_types = usize_at("tokenizer.ggml.token_type_count")
            .context("an encoder needs tokenizer.ggml.token_type_count")?;
        let n_ctx_train = usize_key("context_length")?;
        let vocab_size = g.tensor("token_embd.weight")?.n_rows();
        let rope = match kind {
            EncoderKind::Bert => None,
            EncoderKind::NomicBert => {
                let rope_dim = if has("rope.dimension_count") {
                    usize_key("rope.dimension_count")?
                } else {
                    head_dim
                };
                if rope_dim > head_dim || rope_dim % 2 != 0 {
                    bail!(
                        "{} = {rope_dim} does not fit the head size {head_dim}",
                        key("rope.dimension_count")
                    );
                }
                let freq_base = g.get_f32_or(&key("rope.freq_base"), 10000.0)?;
                if !(freq_base.is_finite() && freq_base > 0.0) {
                    bail!("{} = {freq_base} is out of range", key("rope.freq_base"));
                }
                Some(Rope {
                    head_dim,
                    rope_dim,
                    freq_base,
                    freq_scale: 1.0,
                    style: RopeStyle::Neox,
                    freq_factors: None,
                    yarn: None,
                })
            }
        };
        if head_dim > crate::kernels::EL_MAX_HEAD_DIM as usize || head_dim % 2 != 0 {
            bail!(
                "head size {head_dim} is not supported (even, at most {})",
                crate::kernels::EL_MAX_HEAD_DIM
            );
        }
        Ok(EncoderConfig {
            architecture: arch,
            kind,
            num_layers,
            n_embd,
            n_ff,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab_size,
            n_ctx_train,
            norm_eps,
            causal,
            pooling,
            rank,
            n_token_types,
            rope,
        })
    }

    /// Width of one token's keys (or values).
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}

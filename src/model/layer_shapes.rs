//! Per-layer attention geometry, as llama.cpp's hparams give it: a KV head count per layer
//! (`{arch}.attention.head_count_kv` as an array), and sliding-window layers with their own head
//! size and rotary width (`{arch}.attention.key_length_swa`, `.value_length_swa`,
//! `.rope.dimension_count_swa`). Also Gemma 4's differences from gemma3 that are hyperparameters
//! (attention scale 1, V normed without a weight). Called by `super::config::ModelConfig::from_gguf`
//! once its uniform reading is done; the forward pass, the weights and the KV cache then read
//! each layer's [`LayerOptions`](super::config::LayerOptions).

use super::hybrid::LayerKind;
use anyhow::{bail, Result};

use super::config::ModelConfig;
use crate::gguf::{GgufFile, MetaArray, MetaValue};

/// The values of an integer array of any width (`None` when `key` is absent or a scalar), each
/// in (0, 2^24).
fn int_array(g: &GgufFile, key: &str) -> Result<Option<Vec<usize>>> {
    let v: Vec<i128> = match g.get(key) {
        Some(MetaValue::Array(a)) => match a {
            MetaArray::U8(v) => v.iter().map(|&x| x as i128).collect(),
            MetaArray::I8(v) => v.iter().map(|&x| x as i128).collect(),
            MetaArray::U16(v) => v.iter().map(|&x| x as i128).collect(),
            MetaArray::I16(v) => v.iter().map(|&x| x as i128).collect(),
            MetaArray::U32(v) => v.iter().map(|&x| x as i128).collect(),
            MetaArray::I32(v) => v.iter().map(|&x| x as i128).collect(),
            MetaArray::U64(v) => v.iter().map(|&x| x as i128).collect(),
            MetaArray::I64(v) => v.iter().map(|&x| x as i128).collect(),
            _ => bail!("{key} is an array of something other than integers"),
        },
        _ => return Ok(None),
    };
    // 0 is LFM2's mark of a layer with no KV heads; whoever reads the array checks the rest.
    if let Some(bad) = v.iter().find(|&&x| !(0..(1 << 24)).contains(&x)) {
        bail!("{key} holds {bad}, out of range");
    }
    Ok(Some(v.into_iter().map(|x| x as usize).collect()))
}

/// `{arch}.attention.head_count_kv` as one count: the scalar, or the largest of a per-layer
/// array of `num_layers` entries (the layers then take theirs in [`apply`]).
pub(super) fn kv_heads_or_max(g: &GgufFile, key: &str, num_layers: usize) -> Result<usize> {
    match int_array(g, key)? {
        Some(v) if v.len() != num_layers => {
            bail!("{key} has {} entries for {num_layers} layers", v.len())
        }
        Some(v) => match v.into_iter().max() {
            Some(m) if m > 0 => Ok(m),
            _ => bail!("{key} gives no layer a KV head"),
        },
        None => {
            let v = g.get_usize(key)?;
            if v == 0 || v >= 1 << 24 {
                bail!("{key} = {v} is out of range");
            }
            Ok(v)
        }
    }
}

/// Sets each layer's head size, KV head count and rotary width from the per-layer keys, and
/// Gemma 4's attention scale and V norm. `is_local[l]`: layer l is a sliding-window layer.
pub(super) fn apply(g: &GgufFile, c: &mut ModelConfig, is_local: &[bool]) -> Result<()> {
    let arch = c.architecture.clone();
    let key = |k: &str| format!("{arch}.{k}");
    let count = |k: &str| -> Result<Option<usize>> {
        match g.get(&key(k)) {
            None => Ok(None),
            Some(_) => {
                let v = g.get_usize(&key(k))?;
                if v == 0 || v >= 1 << 24 {
                    bail!("{} = {v} is out of range", key(k));
                }
                Ok(Some(v))
            }
        }
    };
    let kv_heads = int_array(g, &key("attention.head_count_kv"))?;
    let head_dim_swa = count("attention.key_length_swa")?.unwrap_or(c.head_dim);
    if let Some(v) = count("attention.value_length_swa")? {
        if v != head_dim_swa {
            bail!(
                "{} = {v} differs from {} = {head_dim_swa}: not supported",
                key("attention.value_length_swa"),
                key("attention.key_length_swa")
            );
        }
    }
    let rope_dim_swa = count("rope.dimension_count_swa")?;
    let max = crate::kernels::EL_MAX_HEAD_DIM as usize;
    if head_dim_swa > max || head_dim_swa % 2 != 0 {
        bail!("sliding-window head size {head_dim_swa} is not supported (even, at most {max})");
    }
    for (l, lo) in c.layers.iter_mut().enumerate() {
        // A recurrent layer (LFM2's zero KV heads) keeps the attention layers' count: it has no
        // cache (`layer_cache_dim` is 0 there).
        if let (Some(v), LayerKind::Attention) = (&kv_heads, lo.kind) {
            lo.n_kv_heads = v[l];
            if lo.n_kv_heads == 0 {
                bail!(
                    "{} gives attention layer {l} 0 KV heads, out of range",
                    key("attention.head_count_kv")
                );
            }
            if c.n_heads % lo.n_kv_heads != 0 {
                bail!(
                    "layer {l}: {} heads are not a multiple of its {} KV heads",
                    c.n_heads,
                    lo.n_kv_heads
                );
            }
        }
        if is_local[l] {
            lo.head_dim = head_dim_swa;
            if let Some(rope) = &mut lo.rope {
                rope.head_dim = head_dim_swa;
                rope.rope_dim = rope_dim_swa.unwrap_or(rope.rope_dim);
                if rope.rope_dim > head_dim_swa || rope.rope_dim % 2 != 0 {
                    bail!(
                        "{} = {} does not fit the head size {head_dim_swa}",
                        key("rope.dimension_count_swa"),
                        rope.rope_dim
                    );
                }
            }
        }
    }
    if arch == "gemma4" {
        // llama.cpp: f_attention_scale = 1 (no query pre-scaling); V goes through an RMSNorm
        // without a weight.
        c.attn_scale = 1.0;
        c.v_norm = true;
        c.per_layer_embd = match g.get(&key("embedding_length_per_layer_input")) {
            None => 0,
            Some(_) => g.get_usize(&key("embedding_length_per_layer_input"))?,
        };
        if c.per_layer_embd >= 1 << 16 {
            bail!(
                "{} = {} is out of range",
                key("embedding_length_per_layer_input"),
                c.per_layer_embd
            );
        }
        let shared = match g.get(&key("attention.shared_kv_layers")) {
            None => 0,
            Some(_) => g.get_usize(&key("attention.shared_kv_layers"))?,
        };
        share_kv(c, is_local, shared)?;
        // 26B-A4B: experts beside the dense network (`super::moe_gemma4`).
        if g.get(&key("expert_count")).is_some() {
            let n = |k: &str| -> Result<usize> {
                let v = g.get_usize(&key(k))?;
                if v == 0 || v > super::config::MAX_EXPERTS.max(1 << 16) {
                    bail!("{} = {v} is out of range", key(k));
                }
                Ok(v)
            };
            let (num_experts, num_experts_used) = (n("expert_count")?, n("expert_used_count")?);
            if num_experts > super::config::MAX_EXPERTS || num_experts_used > num_experts {
                bail!(
                    "{} = {num_experts_used} of {} = {num_experts}: not supported",
                    key("expert_used_count"),
                    key("expert_count")
                );
            }
            c.experts = Some(super::config::Experts {
                num_experts,
                num_experts_used,
                n_ff_exp: n("expert_feed_forward_length")?,
                gating: super::config::ExpertGating::SoftmaxNormalized,
                n_ff_shexp: 0,
            });
        }
    }
    Ok(())
}

/// The last `shared` layers attend over an earlier layer's KV cache (llama.cpp's reuse for
/// gemma3n/gemma4): a local layer over layer `first - 2`'s, a global one over `first - 1`'s,
/// `first` the first sharing layer; each must have the geometry and kind of the layer it reads.
fn share_kv(c: &mut ModelConfig, is_local: &[bool], shared: usize) -> Result<()> {
    if shared == 0 {
        return Ok(());
    }
    let n = c.num_layers;
    if shared + 2 > n {
        bail!("{shared} KV-sharing layers of {n}: at least two must keep their own KV");
    }
    let first = n - shared;
    for l in first..n {
        let src = first - if is_local[l] { 2 } else { 1 };
        let (a, b) = (&c.layers[l], &c.layers[src]);
        if is_local[src] != is_local[l] || a.head_dim != b.head_dim || a.n_kv_heads != b.n_kv_heads
        {
            bail!("layer {l} would read layer {src}'s KV cache, which is of another kind or shape");
        }
        c.layers[l].kv_layer = src;
    }
    Ok(())
}

impl ModelConfig {
    /// Width of one token's keys (or values) in layer `l`.
    pub fn layer_kv_dim(&self, l: usize) -> usize {
        let lo = &self.layers[l];
        lo.n_kv_heads * lo.head_dim
    }

    /// Width of one token's keys (or values) in layer `l`'s own KV cache: 0 for a layer that
    /// reads another's.
    pub fn layer_cache_dim(&self, l: usize) -> usize {
        let lo = &self.layers[l];
        match lo.kv_layer == l && lo.kind == LayerKind::Attention {
            true => self.layer_kv_dim(l),
            false => 0,
        }
    }

    /// Width of one token's queries in layer `l`.
    pub fn layer_q_dim(&self, l: usize) -> usize {
        self.n_heads * self.layers[l].head_dim
    }

    /// Whether every layer has the model's head size and KV head count (what a backend with
    /// one attention geometry for all layers needs).
    pub fn uniform_layers(&self) -> bool {
        self.layers
            .iter()
            .all(|lo| lo.head_dim == self.head_dim && lo.n_kv_heads == self.n_kv_heads)
    }
}

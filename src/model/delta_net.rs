//! Qwen3.5's gated delta-net layers (llama.cpp's `src/models/qwen35.cpp` and `delta-net-base.cpp`):
//! which layers are recurrent and their shape, read from the GGUF ([`read_qwen35`], called by
//! `super::config`); the layer's weights ([`DeltaNet`], read by `super::weights`); and the block
//! the layer loop runs on them ([`block`], called by `super::forward`): the fused q/k/v
//! projection, the gate `z`, `alpha` and `beta` from one quantized input; the core (causal conv,
//! SiLU, L2-normed q and k, the gated delta rule: `Backend::gated_delta_net` over each sequence's
//! state slot); each head's RMSNorm times silu(z); the output projection.
//!
//! Qwen3.5's attention layers differ from qwen3's in two ways handled in `super::forward`: the q
//! projection carries a gate per head (`[q_h, gate_h]` interleaved, `Backend::split_q_gate`) that
//! multiplies the attention output through a sigmoid (`Backend::sigmoid_gate`); and the rope is
//! IMROPE over `rope.dimension_sections`, which for text (every section at the token's position)
//! is NEOX rope over `rope.dimension_count` dimensions, as checked here.

use anyhow::{bail, Result};

use super::backend::{Backend, WeightStore};
use super::hybrid::{HybridLayers, LayerKind};
use super::weights::{load_vector, InFile, MatrixInfo};
use super::weights_load::{MakeMatrix, MakeVector};
use super::ModelConfig;
use crate::gguf::{GgufFile, MetaArray, MetaValue};
use crate::kernels::{Activation, DeltaNetShape};

/// The largest head size and convolution window accepted (Qwen3.5's are 128 and 4).
pub const MAX_DELTA_NET_HEAD_DIM: usize = 1024;
pub const MAX_D_CONV: usize = 64;

/// Qwen3.5's layers: recurrent per `attention.recurrent_layers` (one bool per layer) or, without
/// it, all but every `full_attention_interval`-th (default 4); the KV heads of the attention
/// layers; the delta-net shape from the `ssm.*` keys.
pub fn read_qwen35(
    g: &GgufFile,
    arch: &str,
    num_layers: usize,
    n_heads: usize,
) -> Result<HybridLayers> {
    let key = |k: &str| format!("{arch}.{k}");
    let usize_in = |k: &str, lo: usize, hi: usize| -> Result<usize> {
        let v = g.get_usize(&key(k))?;
        if !(lo..=hi).contains(&v) {
            bail!("{} = {v} is out of range ({lo} to {hi})", key(k));
        }
        Ok(v)
    };
    if g.get(&key("nextn_predict_layers")).is_some()
        && usize_in("nextn_predict_layers", 0, num_layers)? > 0
    {
        bail!(
            "{}: MTP (next-n) layers are not supported yet",
            key("nextn_predict_layers")
        );
    }
    let recurrent: Vec<bool> = match g.get(&key("attention.recurrent_layers")) {
        Some(MetaValue::Array(MetaArray::Bool(v))) if v.len() == num_layers => v.clone(),
        Some(_) => bail!(
            "{} must be an array of {num_layers} bools",
            key("attention.recurrent_layers")
        ),
        None => {
            let interval = match g.get(&key("full_attention_interval")) {
                Some(_) => usize_in("full_attention_interval", 1, num_layers.max(1))?,
                None => 4,
            };
            (0..num_layers).map(|i| (i + 1) % interval != 0).collect()
        }
    };
    let n_kv_heads = usize_in("attention.head_count_kv", 1, n_heads)?;
    if n_heads % n_kv_heads != 0 {
        bail!(
            "{}: {n_kv_heads} KV heads do not divide {n_heads} heads",
            key("attention.head_count_kv")
        );
    }
    let head_dim = usize_in("ssm.state_size", 1, MAX_DELTA_NET_HEAD_DIM)?;
    let n_k_heads = usize_in("ssm.group_count", 1, 1 << 12)?;
    let n_v_heads = usize_in("ssm.time_step_rank", 1, 1 << 12)?;
    let inner = usize_in("ssm.inner_size", 1, 1 << 24)?;
    if n_v_heads % n_k_heads != 0 {
        bail!(
            "{}: {n_v_heads} value heads are not a multiple of {n_k_heads} key heads",
            key("ssm.time_step_rank")
        );
    }
    if inner != n_v_heads * head_dim {
        bail!(
            "{} = {inner}: value heads of a size other than the key heads' ({n_v_heads} x {head_dim}) are not supported",
            key("ssm.inner_size")
        );
    }
    let shape = DeltaNetShape {
        n_k_heads,
        n_v_heads,
        head_dim,
        d_conv: usize_in("ssm.conv_kernel", 2, MAX_D_CONV)?,
        eps: g.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
    };
    check_text_rope(g, arch)?;
    Ok(HybridLayers {
        kinds: recurrent
            .iter()
            .map(|&r| {
                if r {
                    LayerKind::DeltaNet
                } else {
                    LayerKind::Attention
                }
            })
            .collect(),
        n_kv_heads,
        l_cache: 0,
        delta_net: Some(shape),
    })
}

/// IMROPE gives pair i of the rotated dimensions the position of section i % 3 while
/// `i % 3 == s` and `i < 3 * sections[s]` (ggml's `ggml_mrope_cache_init`), else the fourth
/// ("e") position, which is 0 for text tokens. Text puts the token's position in the other three,
/// so when every pair lands in one of them IMROPE is NEOX rope; a file where some pair would read
/// the fourth is refused.
fn check_text_rope(g: &GgufFile, arch: &str) -> Result<()> {
    let key = format!("{arch}.rope.dimension_sections");
    let sections: Vec<i64> = match g.get(&key) {
        Some(MetaValue::Array(MetaArray::I32(v))) => v.iter().map(|&x| x as i64).collect(),
        Some(MetaValue::Array(MetaArray::U32(v))) => v.iter().map(|&x| x as i64).collect(),
        _ => bail!("{key} is missing or not an array of integers"),
    };
    if sections.len() != 4 || sections.iter().any(|&s| !(0..=1 << 16).contains(&s)) {
        bail!("{key} must hold 4 non-negative sections");
    }
    let rope_key = format!("{arch}.rope.dimension_count");
    let n_pairs = g.get_usize(&rope_key)? / 2;
    let sect_dims: i64 = sections.iter().sum();
    if sect_dims == 0 || sect_dims > n_pairs as i64 {
        bail!("{key} {sections:?} does not fit {rope_key} / 2 = {n_pairs} pairs");
    }
    for i in 0..n_pairs as i64 {
        let sector = i % sect_dims;
        let s = (sector % 3) as usize;
        if sector >= 3 * sections[s] {
            bail!("{key} {sections:?}: rotated pair {i} would take the vision position; not supported for text");
        }
    }
    Ok(())
}

/// A delta-net layer's weights (GGUF names `blk.N.*`).
pub struct DeltaNet<S: WeightStore> {
    /// `attn_qkv`: [n_embd] -> [conv_dim] (q heads, k heads, v heads).
    pub qkv: S::Matrix,
    /// `attn_gate`: [n_embd] -> [value_dim], the output gate `z`.
    pub gate: S::Matrix,
    /// `ssm_alpha`, `ssm_beta`: [n_embd] -> [n_v_heads].
    pub alpha: S::Matrix,
    pub beta: S::Matrix,
    /// `ssm_conv1d`: [conv_dim][d_conv] (f32).
    pub conv: S::Vector,
    /// `ssm_dt.bias`, `ssm_a` (-exp(A_log)): [n_v_heads].
    pub dt_bias: S::Vector,
    pub a: S::Vector,
    /// `ssm_norm`: [head_dim], each head's RMSNorm before the gate.
    pub norm: S::Vector,
    /// `ssm_out`: [value_dim] -> [n_embd].
    pub out: S::Matrix,
}

impl DeltaNet<InFile> {
    pub(super) fn read(g: &GgufFile, c: &ModelConfig, i: usize) -> Result<Self> {
        let Some(s) = c.delta_net else {
            bail!("layer {i}: a delta-net layer without the ssm.* shape");
        };
        let m = |name: &str, n_in, n_out| {
            MatrixInfo::load(g, &format!("blk.{i}.{name}.weight"), n_in, n_out)
        };
        let v = |name: &str, n| load_vector(g, &format!("blk.{i}.{name}"), n);
        let d = c.n_embd;
        Ok(DeltaNet {
            qkv: m("attn_qkv", d, s.conv_dim())?,
            gate: m("attn_gate", d, s.value_dim())?,
            alpha: m("ssm_alpha", d, s.n_v_heads)?,
            beta: m("ssm_beta", d, s.n_v_heads)?,
            conv: v("ssm_conv1d.weight", s.conv_dim() * s.d_conv)?,
            dt_bias: v("ssm_dt.bias", s.n_v_heads)?,
            a: v("ssm_a", s.n_v_heads)?,
            norm: v("ssm_norm.weight", s.head_dim)?,
            out: m("ssm_out", s.value_dim(), d)?,
        })
    }

    /// The same weights in store `S` (`super::weights_load`).
    pub(super) fn load<S: WeightStore, E>(
        &self,
        matrix: &mut MakeMatrix<S, E>,
        vector: &mut MakeVector<S, E>,
    ) -> Result<DeltaNet<S>, E> {
        Ok(DeltaNet {
            qkv: matrix(&self.qkv)?,
            gate: matrix(&self.gate)?,
            alpha: matrix(&self.alpha)?,
            beta: matrix(&self.beta)?,
            conv: vector(&self.conv)?,
            dt_bias: vector(&self.dt_bias)?,
            a: vector(&self.a)?,
            norm: vector(&self.norm)?,
            out: matrix(&self.out)?,
        })
    }
}

/// The delta-net block of recurrent layer `r` on `h` (the normed input, [n][n_embd]) into `out`
/// ([n][n_embd], before the residual add).
pub fn block<B: Backend>(
    b: &mut B,
    w: &DeltaNet<B>,
    c: &ModelConfig,
    r: usize,
    h: &B::Acts,
    n: usize,
    out: &mut B::Acts,
) -> Result<()> {
    let Some(s) = c.delta_net else {
        bail!("a delta-net layer without the ssm.* shape");
    };
    let mut qkv = b.acts(n, s.conv_dim())?;
    let mut z = b.acts(n, s.value_dim())?;
    let (mut alpha, mut beta) = (b.acts(n, s.n_v_heads)?, b.acts(n, s.n_v_heads)?);
    let mut hq = b.input(h); // quantized once for the four products
    b.matmul_many(
        &mut hq,
        &mut [
            (&w.qkv, &mut qkv),
            (&w.gate, &mut z),
            (&w.alpha, &mut alpha),
            (&w.beta, &mut beta),
        ],
    )?;
    drop(hq);
    let mut core = b.acts(n, s.value_dim())?;
    b.gated_delta_net(r, &s, &qkv, &alpha, &beta, w, &mut core)?;
    b.rms_norm_inplace(&mut core, &w.norm, c.rms_eps)?; // each head
    b.glu(&mut z, &core, Activation::SwiGlu)?; // z = silu(z) * norm(core)
    let mut zq = b.input(&z);
    b.matmul(&mut zq, &w.out, out)?;
    drop(zq);
    for x in [qkv, z, alpha, beta, core] {
        b.recycle(x);
    }
    Ok(())
}

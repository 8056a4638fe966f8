//! Granite 4's Mamba-2 layers (llama.cpp's `granitehybrid`: src/models/granite-hybrid.cpp and
//! `build_mamba2_layer` in mamba-base.cpp): which layers are Mamba-2 (no KV heads in the per-layer
//! `{arch}.attention.head_count_kv`), their shape from the `{arch}.ssm.*` keys, and their weights.
//! Called by `super::config` (the layers and shape), `super::weights` (reading a layer's tensors),
//! `super::weights_load` (a backend's copy) and `super::forward` (the block). The block's
//! arithmetic per sequence is in the backend (`Backend::mamba2`; the CPU's in `super::mamba2_cpu`).

use anyhow::{bail, Result};

use super::backend::WeightStore;
use super::config_moe::{ExpertGating, Experts};
use super::hybrid::{read_layer_kinds, HybridLayers, LayerKind};
use super::weights::{load_vector, InFile, MatrixInfo};
use super::weights_load::{MakeMatrix, MakeVector};
use super::ModelConfig;
use crate::gguf::GgufFile;
pub use crate::kernels::ssm::SsmShape;

/// The largest accepted convolution window, state size, group and head count.
const MAX_D_CONV: usize = 64;
const MAX_D_STATE: usize = 1024;

/// A Mamba-2 block's weights: in_proj to z, xBC and dt; the causal convolution of xBC; the
/// selective scan; the D skip, SiLU(z) gate and grouped RMSNorm; out_proj.
pub struct Mamba2<S: WeightStore> {
    /// [n_embd] -> [d_in_proj]: z [d_inner], xBC [conv_dim], dt [n_head].
    pub in_proj: S::Matrix,
    /// The depthwise kernel, [conv_dim][d_conv], and its bias [conv_dim] (zeros if absent).
    pub conv: S::Vector,
    pub conv_bias: S::Vector,
    /// Per head: dt's bias, the decay A (`ssm_a`, negative), the skip D.
    pub dt_bias: S::Vector,
    pub a: S::Vector,
    pub d: S::Vector,
    /// The grouped RMSNorm's weights, [d_inner].
    pub norm: S::Vector,
    /// [d_inner] -> [n_embd]
    pub out_proj: S::Matrix,
}

/// The layers of a `granitehybrid` file and the Mamba-2 shape.
pub fn read_layers(
    g: &GgufFile,
    arch: &str,
    num_layers: usize,
    n_embd: usize,
    n_heads: usize,
) -> Result<(HybridLayers, SsmShape)> {
    let (kinds, n_kv_heads) = read_layer_kinds(g, arch, num_layers, n_heads, LayerKind::Mamba2)?;
    let key = |k: &str| format!("{arch}.ssm.{k}");
    let get = |k: &str, max: usize| -> Result<usize> {
        let v = g.get_usize(&key(k))?;
        if v == 0 || v > max {
            bail!("{} = {v} is out of range (1 to {max})", key(k));
        }
        Ok(v)
    };
    let d_conv = get("conv_kernel", MAX_D_CONV)?;
    let d_inner = get("inner_size", 1 << 20)?;
    let d_state = get("state_size", MAX_D_STATE)?;
    let n_head = get("time_step_rank", d_inner)?;
    let n_group = get("group_count", n_head)?;
    if d_conv < 2 {
        bail!(
            "{} = {d_conv}: a convolution needs a window of 2 or more",
            key("conv_kernel")
        );
    }
    if !d_inner.is_multiple_of(n_head) || !n_head.is_multiple_of(n_group) {
        bail!(
            "{} = {d_inner}, {} = {n_head} and {} = {n_group} do not divide in turn",
            key("inner_size"),
            key("time_step_rank"),
            key("group_count")
        );
    }
    if d_inner != 2 * n_embd {
        bail!(
            "{} = {d_inner} is not twice the embedding ({n_embd}), as llama.cpp requires",
            key("inner_size")
        );
    }
    let shape = SsmShape {
        d_conv,
        n_head,
        head_dim: d_inner / n_head,
        d_state,
        n_group,
    };
    let layers = HybridLayers {
        kinds,
        n_kv_heads,
        l_cache: 0,
        delta_net: None,
    };
    Ok((layers, shape))
}

/// Granite 4.0-H-Tiny's and -Small's experts (where the file has `{arch}.expert_count`):
/// softmax gating renormalised over the chosen ones (`build_moe_ffn` with `norm_w`), each expert
/// `n_ff` wide unless `expert_feed_forward_length` says otherwise (llama.cpp's granite loader
/// takes `feed_forward_length`), a shared expert of `expert_shared_feed_forward_length` if given.
pub fn read_experts(
    usize_key: &dyn Fn(&str) -> Result<usize>,
    has: &dyn Fn(&str) -> bool,
    key: &dyn Fn(&str) -> String,
    n_ff: usize,
) -> Result<Experts> {
    let gating = ExpertGating::SoftmaxNormalized;
    let mut x = super::config_moe::read_experts(usize_key, has, key, n_ff, gating)?;
    if !has("expert_feed_forward_length") {
        x.n_ff_exp = n_ff;
    }
    if has("expert_shared_feed_forward_length") {
        x.n_ff_shexp = usize_key("expert_shared_feed_forward_length")?;
    }
    Ok(x)
}

impl Mamba2<InFile> {
    /// Layer `i`'s Mamba-2 tensors, checked against the shape.
    pub fn read(g: &GgufFile, c: &ModelConfig, s: SsmShape, i: usize) -> Result<Mamba2<InFile>> {
        let name = |t: &str| format!("blk.{i}.{t}");
        let vector = |t: &str, n| load_vector(g, &name(t), n);
        let conv_bias = if g.find_tensor(&name("ssm_conv1d.bias")).is_some() {
            vector("ssm_conv1d.bias", s.conv_dim())?
        } else {
            vec![0.0; s.conv_dim()]
        };
        let m: Mamba2<InFile> = Mamba2 {
            in_proj: MatrixInfo::load(g, &name("ssm_in.weight"), c.n_embd, s.d_in_proj())?,
            conv: vector("ssm_conv1d.weight", s.conv_dim() * s.d_conv)?,
            conv_bias,
            dt_bias: vector("ssm_dt.bias", s.n_head)?,
            a: vector("ssm_a", s.n_head)?,
            d: vector("ssm_d", s.n_head)?,
            norm: vector("ssm_norm.weight", s.d_inner())?,
            out_proj: MatrixInfo::load(g, &name("ssm_out.weight"), s.d_inner(), c.n_embd)?,
        };
        let finite = |v: &Vec<f32>| v.iter().all(|x| x.is_finite());
        if !finite(&m.a) || m.a.iter().any(|&a| a > 0.0) {
            bail!(
                "tensor '{}' holds a decay that is not a finite non-positive number",
                name("ssm_a")
            );
        }
        if !(finite(&m.dt_bias) && finite(&m.d)) {
            bail!(
                "tensor '{}' or '{}' holds a value that is not finite",
                name("ssm_dt.bias"),
                name("ssm_d")
            );
        }
        Ok(m)
    }

    /// The same weights in store `S` (`Weights::load`).
    pub fn convert<S: WeightStore, E>(
        &self,
        matrix: &mut MakeMatrix<S, E>,
        vector: &mut MakeVector<S, E>,
    ) -> Result<Mamba2<S>, E> {
        Ok(Mamba2 {
            in_proj: matrix(&self.in_proj)?,
            conv: vector(&self.conv)?,
            conv_bias: vector(&self.conv_bias)?,
            dt_bias: vector(&self.dt_bias)?,
            a: vector(&self.a)?,
            d: vector(&self.d)?,
            norm: vector(&self.norm)?,
            out_proj: matrix(&self.out_proj)?,
        })
    }
}

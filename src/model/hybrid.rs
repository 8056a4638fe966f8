//! Hybrid models' layers, read from the GGUF: which layers attend (through the paged KV cache)
//! and which carry a fixed-size recurrent state instead, and that state's shape. LFM2 marks its
//! short-convolution layers with a zero in the per-layer `{arch}.attention.head_count_kv` array
//! and sizes their state with `{arch}.shortconv.l_cache` (llama.cpp's `llama_model_lfm2`).
//! Called by `super::config` when it reads a hybrid family; the engine sizes its state slots
//! from [`ModelConfig::state_floats`](super::ModelConfig::state_floats).

use anyhow::{bail, Result};

use crate::gguf::{GgufFile, MetaArray, MetaValue};

/// What mixes a layer's tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    /// Attention over the sequence's cached keys and values.
    Attention,
    /// LFM2's gated short convolution, its state the last `l_cache - 1` inputs of each channel.
    ShortConv,
    /// Granite 4's Mamba-2 (`super::mamba2`), its state the convolution's last inputs and the scan's.
    Mamba2,
    /// Qwen3.5's gated delta-net (`super::delta_net`): its conv state and a matrix per head.
    DeltaNet,
}

/// The layers of a hybrid file.
#[derive(Clone, Debug)]
pub struct HybridLayers {
    pub kinds: Vec<LayerKind>,
    /// The attention layers' KV heads (all alike).
    pub n_kv_heads: usize,
    /// The short convolution's window (`{arch}.shortconv.l_cache`).
    pub l_cache: usize,
    /// The delta-net layers' shape (Qwen3.5).
    pub delta_net: Option<crate::kernels::DeltaNetShape>,
}

/// The longest short-convolution window accepted (LFM2's is 3).
pub const MAX_L_CACHE: usize = 64;

impl super::ModelConfig {
    /// Layers with a KV cache (the others carry a recurrent state).
    pub fn num_kv_layers(&self) -> usize {
        self.layers
            .iter()
            .filter(|l| l.kind == LayerKind::Attention)
            .count()
    }

    /// Layers that carry a recurrent state.
    pub fn num_recurrent_layers(&self) -> usize {
        self.layers.len() - self.num_kv_layers()
    }

    /// Floats of layer `l`'s recurrent state in one sequence (0 for an attention layer). Each
    /// recurrent kind sizes its own: the state pool lays a slot out as these, layer by layer.
    pub fn layer_state_floats(&self, l: usize) -> usize {
        match self.layers[l].kind {
            LayerKind::Attention => 0,
            LayerKind::ShortConv => self.conv_l_cache.saturating_sub(1) * self.n_embd,
            LayerKind::Mamba2 => self.ssm.map_or(0, |s| s.state_floats()),
            LayerKind::DeltaNet => self
                .delta_net
                .map_or(0, |s| s.conv_state_floats() + s.ssm_state_floats()),
        }
    }

    /// Floats of one sequence's recurrent state over every layer (0: the model has none): what a
    /// state slot holds.
    pub fn state_floats(&self) -> usize {
        (0..self.layers.len())
            .map(|l| self.layer_state_floats(l))
            .sum()
    }

    /// Whether sequences of this model carry a recurrent state.
    pub fn is_recurrent(&self) -> bool {
        self.state_floats() > 0
    }
}

/// Each layer's kind from the per-layer `{arch}.attention.head_count_kv` (0: `recurrent`, else
/// attention) and the attention layers' KV head count (all alike).
pub fn read_layer_kinds(
    g: &GgufFile,
    arch: &str,
    num_layers: usize,
    n_heads: usize,
    recurrent: LayerKind,
) -> Result<(Vec<LayerKind>, usize)> {
    let key = format!("{arch}.attention.head_count_kv");
    let per_layer: Vec<u64> = match g.get(&key) {
        Some(MetaValue::Array(a)) => integers(a)
            .ok_or_else(|| anyhow::anyhow!("{key} must be an array of non-negative integers"))?,
        Some(_) => vec![g.get_u64(&key)?; num_layers],
        None => bail!("{key} is missing: it tells attention layers from recurrent ones"),
    };
    if per_layer.len() != num_layers {
        bail!(
            "{key} has {} entries for {num_layers} layers",
            per_layer.len()
        );
    }
    let kinds: Vec<LayerKind> = per_layer
        .iter()
        .map(|&h| match h {
            0 => recurrent,
            _ => LayerKind::Attention,
        })
        .collect();
    let mut heads = per_layer.iter().copied().filter(|&h| h > 0);
    let n_kv_heads = heads.next().unwrap_or(n_heads as u64);
    if heads.any(|h| h != n_kv_heads) {
        bail!("{key}: attention layers with different KV head counts are not supported");
    }
    if n_kv_heads == 0 || !(n_heads as u64).is_multiple_of(n_kv_heads) {
        bail!("{key}: {n_kv_heads} KV heads do not divide {n_heads} heads");
    }
    Ok((kinds, n_kv_heads as usize))
}

/// The layers of a hybrid family whose recurrent layers are of kind `recurrent` (None: not a
/// hybrid family), and for Mamba-2 their shape (`super::mamba2`).
pub fn read(
    g: &GgufFile,
    arch: &str,
    recurrent: Option<LayerKind>,
    num_layers: usize,
    n_embd: usize,
    n_heads: usize,
) -> Result<(Option<HybridLayers>, Option<super::mamba2::SsmShape>)> {
    let Some(kind) = recurrent else {
        return Ok((None, None));
    };
    let swa = format!("{arch}.attention.sliding_window");
    if g.get(&swa).is_some() {
        bail!("{swa} on a hybrid model is not supported");
    }
    Ok(match kind {
        LayerKind::Mamba2 => {
            let (layers, shape) = super::mamba2::read_layers(g, arch, num_layers, n_embd, n_heads)?;
            (Some(layers), Some(shape))
        }
        LayerKind::DeltaNet => (
            Some(super::delta_net::read_qwen35(g, arch, num_layers, n_heads)?),
            None,
        ),
        _ => (Some(read_lfm2(g, arch, num_layers, n_heads)?), None),
    })
}

/// LFM2's layers: per-layer KV heads (0: a short-convolution layer) and the window.
pub fn read_lfm2(
    g: &GgufFile,
    arch: &str,
    num_layers: usize,
    n_heads: usize,
) -> Result<HybridLayers> {
    let (kinds, n_kv_heads) = read_layer_kinds(g, arch, num_layers, n_heads, LayerKind::ShortConv)?;
    let l_key = format!("{arch}.shortconv.l_cache");
    let l_cache = g.get_usize(&l_key)?;
    if !(2..=MAX_L_CACHE).contains(&l_cache) {
        bail!("{l_key} = {l_cache} is out of range (2 to {MAX_L_CACHE})");
    }
    Ok(HybridLayers {
        kinds,
        n_kv_heads,
        l_cache,
        delta_net: None,
    })
}

/// An array's elements as non-negative integers, if it holds integers.
fn integers(a: &MetaArray) -> Option<Vec<u64>> {
    fn all<T: Copy>(v: &[T], f: impl Fn(T) -> Option<u64>) -> Option<Vec<u64>> {
        v.iter().map(|&x| f(x)).collect()
    }
    match a {
        MetaArray::U8(v) => all(v, |x| Some(x as u64)),
        MetaArray::U16(v) => all(v, |x| Some(x as u64)),
        MetaArray::U32(v) => all(v, |x| Some(x as u64)),
        MetaArray::U64(v) => all(v, Some),
        MetaArray::I8(v) => all(v, |x| u64::try_from(x).ok()),
        MetaArray::I16(v) => all(v, |x| u64::try_from(x).ok()),
        MetaArray::I32(v) => all(v, |x| u64::try_from(x).ok()),
        MetaArray::I64(v) => all(v, |x| u64::try_from(x).ok()),
        _ => None,
    }
}

//! Gemma 4's per-layer inputs (E2B, E4B): a second token embedding of `n_layer * n_pl` per token
//! (`per_layer_token_embd`), mixed with a projection of the scaled token embedding
//! (`per_layer_model_proj`, normed per layer by `per_layer_proj_norm`) into one [n_pl] input per
//! layer; each layer then gates its output by it (`blk.N.inp_gate`, GELU, times the input,
//! `blk.N.proj`, `blk.N.post_norm`, added to the residual stream). As llama.cpp's
//! `project_per_layer_inputs` and the per-layer block of `src/models/gemma4.cpp`.
//! The weights are read by `super::weights`; `super::forward` calls [`inputs`] once per step
//! and [`block`] at the end of each layer.

use anyhow::Result;

use super::backend::{Backend, WeightStore};
use super::weights::{load_vector, InFile, MatrixInfo};
use super::ModelConfig;
use crate::gguf::GgufFile;
use crate::kernels::Activation;

/// The model-wide weights of the per-layer inputs.
pub struct PerLayerInputs<S: WeightStore> {
    /// [vocab] rows of [n_layer * n_pl] (rows looked up, never multiplied by).
    pub token_embd: S::Matrix,
    /// [n_embd] -> [n_layer * n_pl]
    pub model_proj: S::Matrix,
    /// [n_pl]
    pub proj_norm: S::Vector,
}

/// One layer's per-layer-input block.
pub struct PerLayerBlock<S: WeightStore> {
    /// [n_embd] -> [n_pl]
    pub inp_gate: S::Matrix,
    /// [n_pl] -> [n_embd]
    pub proj: S::Matrix,
    /// [n_embd]
    pub post_norm: S::Vector,
}

impl PerLayerInputs<InFile> {
    pub(super) fn read(g: &GgufFile, c: &ModelConfig) -> Result<Option<Self>> {
        let n_pl = c.per_layer_embd;
        if n_pl == 0 {
            return Ok(None);
        }
        let all = n_pl * c.num_layers;
        let mut token_embd = MatrixInfo::load(g, "per_layer_token_embd.weight", all, c.vocab_size)?;
        token_embd.product = false;
        Ok(Some(PerLayerInputs {
            token_embd,
            model_proj: MatrixInfo::load(g, "per_layer_model_proj.weight", c.n_embd, all)?,
            proj_norm: load_vector(g, "per_layer_proj_norm.weight", n_pl)?,
        }))
    }
}

impl PerLayerBlock<InFile> {
    pub(super) fn read(g: &GgufFile, c: &ModelConfig, i: usize) -> Result<Option<Self>> {
        let n_pl = c.per_layer_embd;
        if n_pl == 0 {
            return Ok(None);
        }
        let name = |t: &str| format!("blk.{i}.{t}.weight");
        Ok(Some(PerLayerBlock {
            inp_gate: MatrixInfo::load(g, &name("inp_gate"), c.n_embd, n_pl)?,
            proj: MatrixInfo::load(g, &name("proj"), n_pl, c.n_embd)?,
            post_norm: load_vector(g, &name("post_norm"), c.n_embd)?,
        }))
    }
}

/// Every layer's input, [n][n_layer * n_pl] (layer l's at columns l*n_pl..): from the scaled
/// token embeddings `x` ([n][n_embd]), `(rms_norm(model_proj @ x / sqrt(n_embd)) +
/// token_embd[tok] * sqrt(n_pl)) / sqrt(2)`.
pub fn inputs<B: Backend>(
    b: &mut B,
    p: &PerLayerInputs<B>,
    c: &ModelConfig,
    x: &B::Acts,
    n: usize,
) -> Result<B::Acts> {
    let (n_pl, all) = (c.per_layer_embd, c.per_layer_embd * c.num_layers);
    let mut proj = b.acts(n, all)?;
    let mut xq = b.input(x);
    b.matmul(&mut xq, &p.model_proj, &mut proj)?;
    drop(xq);
    b.scale(&mut proj, 1.0 / (c.n_embd as f32).sqrt())?;
    b.rms_norm_inplace(&mut proj, &p.proj_norm, c.rms_eps)?; // each layer's n_pl apart
    let mut sel = b.acts(n, all)?;
    b.embed(&p.token_embd, (n_pl as f32).sqrt(), &mut sel)?;
    b.add(&mut proj, &sel)?;
    b.recycle(sel);
    b.scale(&mut proj, std::f32::consts::FRAC_1_SQRT_2)?;
    Ok(proj)
}

/// `x += post_norm(proj @ (gelu(inp_gate @ x) * input_l))`, layer `l`'s input taken from `all`
/// ([n][n_layer * n_pl], what [`inputs`] returned; given back reshaped as it came).
pub fn block<B: Backend>(
    b: &mut B,
    blk: &PerLayerBlock<B>,
    c: &ModelConfig,
    l: usize,
    all: B::Acts,
    x: &mut B::Acts,
    n: usize,
) -> Result<B::Acts> {
    let n_pl = c.per_layer_embd;
    let mut gate = b.acts(n, n_pl)?;
    let mut xq = b.input(x);
    b.matmul(&mut xq, &blk.inp_gate, &mut gate)?;
    drop(xq);
    // Layer l's inputs: rows t * n_layer + l of the inputs seen as [n * n_layer][n_pl].
    let rows: Vec<u32> = (0..n).map(|t| (t * c.num_layers + l) as u32).collect();
    let flat = b.reshape(all, n * c.num_layers, n_pl)?;
    let mut inp = b.acts(n, n_pl)?;
    b.gather_rows(&flat, &rows, &mut inp)?;
    let all = b.reshape(flat, n, n_pl * c.num_layers)?;
    b.glu(&mut gate, &inp, Activation::GeGlu)?; // gelu(gate) * input
    b.recycle(inp);
    let mut out = b.acts(n, c.n_embd)?;
    let mut gq = b.input(&gate);
    b.matmul(&mut gq, &blk.proj, &mut out)?;
    drop(gq);
    b.recycle(gate);
    b.rms_norm_inplace(&mut out, &blk.post_norm, c.rms_eps)?;
    b.add(x, &out)?;
    b.recycle(out);
    Ok(all)
}

//! The model's weights, one struct for every backend: [`Weights<S>`] holds each tensor as the
//! [`WeightStore`] `S` keeps it. [`Model::load`](super::Model::load) reads [`Weights<InFile>`]:
//! every tensor's presence, type and shape checked (naming the tensor on failure), matrices
//! described by where they are in the mapped file, the small norm and bias vectors converted to
//! f32. A backend then makes its own copy with [`Weights::load`] (the CPU keeps most matrices
//! in the mmap, the GPU uploads them) before the first step, never during one.

use anyhow::{bail, Context, Result};

use super::backend::WeightStore;
use super::delta_net::DeltaNet;
use super::moe_gemma4::Gemma4Moe;
use super::moe_qwen35::Qwen35Moe;
use super::per_layer::{PerLayerBlock, PerLayerInputs};
use crate::gguf::{GgufFile, TensorInfo};
use crate::kernels;
use crate::kernels::tensor_type::TensorType;
use crate::model::config::LayerKind;
use crate::model::ModelConfig;

/// The store of [`Weights<InFile>`]: matrices as [`MatrixInfo`], vectors in f32.
#[derive(Clone, Debug)]
pub struct InFile;

impl WeightStore for InFile {
    type Matrix = MatrixInfo;
    type Vector = Vec<f32>;
}

/// A weight matrix of `n_out` rows of `n_in` elements as the file stores it.
#[derive(Clone, Debug)]
pub struct MatrixInfo {
    pub info: TensorInfo,
    pub ttype: TensorType,
    pub n_in: usize,
    pub n_out: usize,
    /// Whether the forward pass multiplies by it (all but an untied token embedding, which
    /// only has rows looked up).
    pub product: bool,
}

impl MatrixInfo {
    pub(crate) fn load(g: &GgufFile, name: &str, n_in: usize, n_out: usize) -> Result<MatrixInfo> {
        MatrixInfo::from_info(g.tensor(name)?.clone(), n_in, n_out)
    }

    /// Rows `[row0, row0 + n_out)` of the fused matrix `name` (a QKV or gate/up tensor), as a
    /// matrix of its own: the same bytes in the file, a narrower view.
    pub(crate) fn load_rows(
        g: &GgufFile,
        name: &str,
        n_in: usize,
        row0: usize,
        n_out: usize,
    ) -> Result<MatrixInfo> {
        let info = g.tensor(name)?;
        let rb = info.ttype.row_bytes(n_in);
        if info.dims.len() != 2
            || info.row_len() != n_in
            || info.n_rows() < row0 + n_out
            || rb.is_none()
        {
            bail!(
                "tensor '{name}' has shape {:?}, expected [{n_in}, at least {}]",
                info.dims,
                row0 + n_out
            );
        }
        let rb = rb.expect("checked above") as u64;
        let view = TensorInfo {
            name: format!("{name}[rows {row0}..{}]", row0 + n_out),
            dims: vec![n_in as u64, n_out as u64],
            ttype: info.ttype,
            offset: info.offset + row0 as u64 * rb,
            n_bytes: n_out as u64 * rb,
        };
        MatrixInfo::from_info(view, n_in, n_out)
    }

    /// Expert `e` of the stacked expert matrices `name` (GGUF dims [n_in, n_out, num_experts]),
    /// as a matrix of its own: the same bytes in the file, a narrower view.
    pub(crate) fn load_expert(
        g: &GgufFile,
        name: &str,
        n_in: usize,
        n_out: usize,
        num_experts: usize,
        e: usize,
    ) -> Result<MatrixInfo> {
        let info = g.tensor(name)?;
        let want = [n_in as u64, n_out as u64, num_experts as u64];
        let Some(rb) = info.ttype.row_bytes(n_in).filter(|_| info.dims == want) else {
            bail!(
                "tensor '{name}' has shape {:?}, expected {want:?}",
                info.dims
            );
        };
        let bytes = (n_out * rb) as u64;
        let view = TensorInfo {
            name: format!("{name}[expert {e}]"),
            dims: vec![n_in as u64, n_out as u64],
            ttype: info.ttype,
            offset: info.offset + e as u64 * bytes,
            n_bytes: bytes,
        };
        MatrixInfo::from_info(view, n_in, n_out)
    }

    /// Rows `[row0, row0 + n_out)` of this matrix, as a matrix of its own (a view).
    pub(crate) fn rows(&self, row0: usize, n_out: usize) -> Result<MatrixInfo> {
        let rb = self.row_bytes();
        let view = TensorInfo {
            name: format!("{}[rows {row0}..{}]", self.info.name, row0 + n_out),
            dims: vec![self.n_in as u64, n_out as u64],
            ttype: self.ttype,
            offset: self.info.offset + (row0 * rb) as u64,
            n_bytes: (n_out * rb) as u64,
        };
        if row0 + n_out > self.n_out {
            bail!(
                "rows {row0}..{} of '{}' of {} rows",
                row0 + n_out,
                self.info.name,
                self.n_out
            );
        }
        MatrixInfo::from_info(view, self.n_in, n_out)
    }

    fn from_info(info: TensorInfo, n_in: usize, n_out: usize) -> Result<MatrixInfo> {
        let name = info.name.clone();
        if info.dims.len() != 2 || info.row_len() != n_in || info.n_rows() != n_out {
            bail!(
                "tensor '{name}' has shape {:?}, expected [{n_in}, {n_out}]",
                info.dims
            );
        }
        if info.ttype.row_bytes(n_in).is_none()
            || info.ttype == TensorType::Q8_1
            || info.ttype == TensorType::Q8_K
        {
            bail!(
                "tensor '{name}' of type {} cannot hold rows of {n_in}",
                info.ttype
            );
        }
        Ok(MatrixInfo {
            ttype: info.ttype,
            info,
            n_in,
            n_out,
            product: true,
        })
    }

    /// The raw bytes of the matrix in `g`: [n_out] rows of `row_bytes()`.
    pub fn bytes<'a>(&self, g: &'a GgufFile) -> &'a [u8] {
        g.tensor_data(&self.info)
    }

    pub fn row_bytes(&self) -> usize {
        self.ttype.row_bytes(self.n_in).expect("checked at load")
    }
}

/// A vector (norm weight) converted to f32.
pub(crate) fn load_vector(g: &GgufFile, name: &str, n: usize) -> Result<Vec<f32>> {
    let info = g.tensor(name)?;
    if info.n_elements() != n as u64 {
        bail!("tensor '{name}' has shape {:?}, expected [{n}]", info.dims);
    }
    let mut out = vec![0.0; n];
    match info.ttype {
        TensorType::F32 | TensorType::F16 | TensorType::BF16 => {
            kernels::dequantize_row(info.ttype, g.tensor_data(info), &mut out)
        }
        t => bail!("tensor '{name}' has type {t}, expected a float type"),
    }
    Ok(out)
}

/// A linear layer: a weight matrix and, where the file has one, a bias of `n_out`.
pub struct Linear<S: WeightStore> {
    pub weight: S::Matrix,
    pub bias: Option<S::Vector>,
}

impl Linear<InFile> {
    /// `{name}.weight`, and `{name}.bias` if the file has it (llama.cpp treats Q/K/V/output
    /// biases as optional in every family it runs here).
    fn read(g: &GgufFile, name: &str, n_in: usize, n_out: usize) -> Result<Linear<InFile>> {
        let weight = MatrixInfo::load(g, &format!("{name}.weight"), n_in, n_out)?;
        let bias_name = format!("{name}.bias");
        let bias = match g.find_tensor(&bias_name) {
            Some(_) => Some(load_vector(g, &bias_name, n_out)?),
            None => None,
        };
        Ok(Linear { weight, bias })
    }

    /// Rows `[row0, row0 + n_out)` of the fused `{name}.weight` (and of `{name}.bias`, if any).
    fn load_rows(
        g: &GgufFile,
        name: &str,
        n_in: usize,
        row0: usize,
        n_out: usize,
    ) -> Result<Linear<InFile>> {
        let weight = MatrixInfo::load_rows(g, &format!("{name}.weight"), n_in, row0, n_out)?;
        let bias_name = format!("{name}.bias");
        let bias = match g.find_tensor(&bias_name) {
            Some(info) => {
                let n = info.n_elements() as usize;
                Some(load_vector(g, &bias_name, n)?[row0..row0 + n_out].to_vec())
            }
            None => None,
        };
        Ok(Linear { weight, bias })
    }
}

/// A gated feed-forward network: gate and up [n_embd] -> [n_ff], down [n_ff] -> [n_embd],
/// with a bias on each where the file has them (gpt-oss's experts).
pub struct Mlp<S: WeightStore> {
    pub gate: S::Matrix,
    pub up: S::Matrix,
    pub down: S::Matrix,
    /// [n_ff], [n_ff], [n_embd]
    pub gate_bias: Option<S::Vector>,
    pub up_bias: Option<S::Vector>,
    pub down_bias: Option<S::Vector>,
}

impl Mlp<InFile> {
    fn dense(gate: MatrixInfo, up: MatrixInfo, down: MatrixInfo) -> Mlp<InFile> {
        Mlp {
            gate,
            up,
            down,
            gate_bias: None,
            up_bias: None,
            down_bias: None,
        }
    }
}

/// Expert `e`'s row of the stacked expert biases `name` (GGUF dims [n, num_experts]), if the
/// file has them.
fn expert_bias(
    g: &GgufFile,
    name: &str,
    n: usize,
    num_experts: usize,
) -> Result<Option<Vec<Vec<f32>>>> {
    let Some(info) = g.find_tensor(name) else {
        return Ok(None);
    };
    let want = [n as u64, num_experts as u64];
    if info.dims != want {
        bail!(
            "tensor '{name}' has shape {:?}, expected {want:?}",
            info.dims
        );
    }
    let all = load_vector(g, name, n * num_experts)?;
    Ok(Some(all.chunks_exact(n).map(<[f32]>::to_vec).collect()))
}

/// A block's feed-forward weights: one network, or a mixture of experts.
pub enum FeedForward<S: WeightStore> {
    Dense(Mlp<S>),
    Experts {
        /// [n_embd] -> [num_experts]: each expert's logit (plus a bias, gpt-oss).
        router: Linear<S>,
        /// [num_experts] networks of n_ff_exp (views of the stacked `ffn_*_exps` tensors).
        experts: Vec<Mlp<S>>,
        /// A network every row runs beside its experts, added to theirs (`ffn_*_shexp`,
        /// granitehybrid's MoE files).
        shared: Option<Box<Mlp<S>>>,
    },
    /// gemma4's dense network beside its experts (`super::moe_gemma4`).
    SharedExperts(Box<Gemma4Moe<S>>),
    /// Qwen3.5-MoE's experts and sigmoid-gated shared expert (`super::moe_qwen35`).
    SharedGated(Box<Qwen35Moe<S>>),
}

/// The weights of one transformer block. The optional norms are there exactly when the
/// model's family uses them (`ModelConfig::qk_norm`, `ModelConfig::post_norms`).
pub struct LayerWeights<S: WeightStore> {
    /// [n_embd]
    pub attn_norm: S::Vector,
    /// What mixes the tokens: attention, or a recurrent layer (`ModelConfig::layers[l].kind`).
    pub mixer: Mixer<S>,
    /// [n_embd]
    pub ffn_norm: S::Vector,
    pub ffn: FeedForward<S>,
    /// RMSNorm of the feed-forward output before its residual add, [n_embd].
    pub ffn_post_norm: Option<S::Vector>,
    /// Factor on the residual stream at the end of the layer (gemma4's `layer_output_scale`).
    pub out_scale: Option<f32>,
    /// gemma4's per-layer-input block (E2B, E4B).
    pub per_layer: Option<PerLayerBlock<S>>,
}

impl<S: WeightStore> LayerWeights<S> {
    /// The attention weights, on an attention layer.
    pub fn attention(&self) -> Option<&Attention<S>> {
        match &self.mixer {
            Mixer::Attention(a) => Some(a),
            Mixer::ShortConv(_) | Mixer::Mamba2(_) | Mixer::DeltaNet(_) => None,
        }
    }
}

/// A block's token mixer.
pub enum Mixer<S: WeightStore> {
    Attention(Attention<S>),
    ShortConv(ShortConv<S>),
    Mamba2(Box<super::mamba2::Mamba2<S>>),
    DeltaNet(Box<DeltaNet<S>>),
}

/// LFM2's short convolution block: in_proj to b, c and x; y = c * conv(b * x); out_proj.
pub struct ShortConv<S: WeightStore> {
    /// [n_embd] -> [3 * n_embd]: b, then c, then x.
    pub in_proj: S::Matrix,
    /// The depthwise causal kernel, [n_embd][l_cache] (f32).
    pub conv: S::Vector,
    /// [n_embd] -> [n_embd]
    pub out_proj: S::Matrix,
}

/// An attention block's weights.
pub struct Attention<S: WeightStore> {
    /// Each head's sink logit, [n_heads] (gpt-oss).
    pub attn_sinks: Option<S::Vector>,
    /// [n_embd] -> [q_dim], [kv_dim], [kv_dim]
    pub wq: Linear<S>,
    pub wk: Linear<S>,
    pub wv: Linear<S>,
    /// Per-head RMSNorm weights of queries and keys, [head_dim] each.
    pub attn_q_norm: Option<S::Vector>,
    pub attn_k_norm: Option<S::Vector>,
    /// [q_dim] -> [n_embd]
    pub wo: Linear<S>,
    /// RMSNorm of the attention output before its residual add, [n_embd].
    pub attn_post_norm: Option<S::Vector>,
    /// Ones of [head_dim]: the weightless RMSNorm of each head's values (gemma4).
    pub attn_v_norm: Option<S::Vector>,
    /// `wq` gives each head's queries then its output gate (`[n_embd] -> [2 * q_dim]`), and the
    /// output is multiplied by sigmoid(gate) (Qwen3.5, `super::delta_net`).
    pub q_gate: bool,
}

/// `blk.{i}.layer_output_scale.weight`, one float, if the file has it.
fn out_scale(g: &GgufFile, i: usize) -> Result<Option<f32>> {
    let name = format!("blk.{i}.layer_output_scale.weight");
    if g.find_tensor(&name).is_none() {
        return Ok(None);
    }
    let s = load_vector(g, &name, 1)?[0];
    if !s.is_finite() {
        bail!("tensor '{name}' is {s}, not a finite number");
    }
    Ok(Some(s))
}

pub struct Weights<S: WeightStore> {
    /// [vocab_size] rows of [n_embd]
    pub token_embd: S::Matrix,
    pub layers: Vec<LayerWeights<S>>,
    /// [n_embd]
    pub output_norm: S::Vector,
    /// The output projection, [n_embd] -> [vocab_size]; `None` when the file ties it to the
    /// token embedding (which is then multiplied by).
    pub output: Option<Linear<S>>,
    /// gemma4's per-layer inputs (E2B, E4B).
    pub per_layer: Option<PerLayerInputs<S>>,
}

impl Weights<InFile> {
    /// Reads and checks every tensor the model's family needs.
    pub fn from_gguf(g: &GgufFile, c: &ModelConfig) -> Result<Weights<InFile>> {
        let mut token_embd = MatrixInfo::load(g, "token_embd.weight", c.n_embd, c.vocab_size)?;
        let layers = (0..c.num_layers)
            .map(|i| {
                let linear = |name: &str, n_in, n_out| {
                    Linear::read(g, &format!("blk.{i}.{name}"), n_in, n_out)
                };
                let m = |name: &str, n_in, n_out| {
                    MatrixInfo::load(g, &format!("blk.{i}.{name}.weight"), n_in, n_out)
                };
                let norm = |name: &str, n| load_vector(g, &format!("blk.{i}.{name}.weight"), n);
                let norm_if = |used: bool, name: &str, n| used.then(|| norm(name, n)).transpose();
                // Q, K and V from one fused `attn_qkv` tensor (rows q, then k, then v) where the
                // file has one, as llama.cpp's create_tensor_qkv; else three tensors.
                let qkv = format!("blk.{i}.attn_qkv");
                let sinks = format!("blk.{i}.attn_sinks.weight");
                let attention = || -> Result<Mixer<InFile>> {
                    let (q_dim, kv_dim, head_dim) =
                        (c.layer_q_dim(i), c.layer_kv_dim(i), c.layers[i].head_dim);
                    let (wq, wk, wv) = if g.find_tensor(&format!("{qkv}.weight")).is_some() {
                        let (q, kv) = (q_dim, kv_dim);
                        (
                            Linear::load_rows(g, &qkv, c.n_embd, 0, q)?,
                            Linear::load_rows(g, &qkv, c.n_embd, q, kv)?,
                            Linear::load_rows(g, &qkv, c.n_embd, q + kv, kv)?,
                        )
                    } else {
                        // gemma4 (use_alternative_attention): without `attn_v`, the keys' projection
                        // is the values' too (the same matrix, multiplied twice). A layer reading an
                        // earlier layer's KV (shared_kv_layers) computes neither: without its own
                        // K/V tensors it holds that layer's, never multiplied.
                        let has = |b: usize, t: &str| {
                            g.find_tensor(&format!("blk.{b}.{t}.weight")).is_some()
                        };
                        let src = c.layers[i].kv_layer;
                        let kb = if src != i && !has(i, "attn_k") {
                            src
                        } else {
                            i
                        };
                        let v = if c.v_norm && !has(kb, "attn_v") {
                            "attn_k"
                        } else {
                            "attn_v"
                        };
                        let kv_linear = |name: &str| {
                            Linear::read(g, &format!("blk.{kb}.{name}"), c.n_embd, kv_dim)
                        };
                        let q_rows = if c.delta_net.is_some() {
                            2 * q_dim
                        } else {
                            q_dim
                        };
                        (
                            linear("attn_q", c.n_embd, q_rows)?,
                            kv_linear("attn_k")?,
                            kv_linear(v)?,
                        )
                    };
                    Ok(Mixer::Attention(Attention {
                        attn_sinks: c
                            .attn_sinks
                            .then(|| load_vector(g, &sinks, c.n_heads))
                            .transpose()?,
                        wq,
                        wk,
                        wv,
                        attn_q_norm: norm_if(c.qk_norm, "attn_q_norm", head_dim)?,
                        attn_k_norm: norm_if(
                            c.qk_norm
                                && (c.layers[i].kv_layer == i
                                    || g.find_tensor(&format!("blk.{i}.attn_k_norm.weight"))
                                        .is_some()),
                            "attn_k_norm",
                            head_dim,
                        )?,
                        attn_v_norm: c.v_norm.then(|| vec![1.0; head_dim]),
                        q_gate: c.delta_net.is_some(),
                        wo: linear("attn_output", q_dim, c.n_embd)?,
                        attn_post_norm: norm_if(c.post_norms, "post_attention_norm", c.n_embd)?,
                    }))
                };
                let mixer = match c.layers[i].kind {
                    LayerKind::Attention => attention()?,
                    LayerKind::ShortConv => Mixer::ShortConv(ShortConv {
                        in_proj: m("shortconv.in_proj", c.n_embd, 3 * c.n_embd)?,
                        conv: load_vector(
                            g,
                            &format!("blk.{i}.shortconv.conv.weight"),
                            c.n_embd * c.conv_l_cache,
                        )?,
                        out_proj: m("shortconv.out_proj", c.n_embd, c.n_embd)?,
                    }),
                    LayerKind::Mamba2 => {
                        let s = c.ssm.context("Mamba-2 layers without their shape")?;
                        Mixer::Mamba2(Box::new(super::mamba2::Mamba2::read(g, c, s, i)?))
                    }
                    LayerKind::DeltaNet => Mixer::DeltaNet(Box::new(DeltaNet::read(g, c, i)?)),
                };
                let ffn = match &c.experts {
                    Some(_) if c.architecture == "gemma4" => {
                        let mlp = Mlp {
                            gate: m("ffn_gate", c.n_embd, c.n_ff)?,
                            up: m("ffn_up", c.n_embd, c.n_ff)?,
                            down: m("ffn_down", c.n_ff, c.n_embd)?,
                            gate_bias: None,
                            up_bias: None,
                            down_bias: None,
                        };
                        FeedForward::SharedExperts(Box::new(Gemma4Moe::read(g, c, i, mlp)?))
                    }
                    Some(_) if c.architecture == "qwen35moe" => {
                        FeedForward::SharedGated(Box::new(Qwen35Moe::read(g, c, i)?))
                    }
                    Some(x) => {
                        let exps = |name: &str, n_in, n_out, e| {
                            let name = format!("blk.{i}.{name}.weight");
                            MatrixInfo::load_expert(g, &name, n_in, n_out, x.num_experts, e)
                        };
                        let (d, f, n) = (c.n_embd, x.n_ff_exp, x.num_experts);
                        let bias = |name: &str, len| {
                            expert_bias(g, &format!("blk.{i}.{name}.bias"), len, n)
                        };
                        let (gate_b, up_b, down_b) = (
                            bias("ffn_gate_exps", f)?,
                            bias("ffn_up_exps", f)?,
                            bias("ffn_down_exps", d)?,
                        );
                        let pick =
                            |b: &Option<Vec<Vec<f32>>>, e: usize| b.as_ref().map(|b| b[e].clone());
                        FeedForward::Experts {
                            router: linear("ffn_gate_inp", d, n)?,
                            experts: (0..n)
                                .map(|e| {
                                    Ok(Mlp {
                                        gate: exps("ffn_gate_exps", d, f, e)?,
                                        up: exps("ffn_up_exps", d, f, e)?,
                                        down: exps("ffn_down_exps", f, d, e)?,
                                        gate_bias: pick(&gate_b, e),
                                        up_bias: pick(&up_b, e),
                                        down_bias: pick(&down_b, e),
                                    })
                                })
                                .collect::<Result<_>>()?,
                            shared: match x.n_ff_shexp {
                                0 => None,
                                s => Some(Box::new(Mlp::dense(
                                    m("ffn_gate_shexp", d, s)?,
                                    m("ffn_up_shexp", d, s)?,
                                    m("ffn_down_shexp", s, d)?,
                                ))),
                            },
                        }
                    }
                    // phi3: gate and up are one `ffn_up` of 2 * n_ff rows, gate first
                    // (ggml_swiglu of the fused product takes silu of its first half).
                    None if c.fused_gate_up => {
                        let up = format!("blk.{i}.ffn_up.weight");
                        FeedForward::Dense(Mlp::dense(
                            MatrixInfo::load_rows(g, &up, c.n_embd, 0, c.n_ff)?,
                            MatrixInfo::load_rows(g, &up, c.n_embd, c.n_ff, c.n_ff)?,
                            m("ffn_down", c.n_ff, c.n_embd)?,
                        ))
                    }
                    None => FeedForward::Dense(Mlp::dense(
                        m("ffn_gate", c.n_embd, c.n_ff)?,
                        m("ffn_up", c.n_embd, c.n_ff)?,
                        m("ffn_down", c.n_ff, c.n_embd)?,
                    )),
                };
                Ok(LayerWeights {
                    attn_norm: norm("attn_norm", c.n_embd)?,
                    mixer,
                    ffn_norm: norm(c.ffn_norm, c.n_embd)?,
                    ffn,
                    ffn_post_norm: norm_if(c.post_norms, "post_ffw_norm", c.n_embd)?,
                    out_scale: out_scale(g, i)?,
                    per_layer: PerLayerBlock::read(g, c, i)?,
                })
            })
            .collect::<Result<Vec<_>>>()
            .context("loading transformer blocks")?;
        let output_norm = load_vector(g, c.output_norm, c.n_embd)?;
        let output = if g.find_tensor("output.weight").is_some() {
            Some(Linear::read(g, "output", c.n_embd, c.vocab_size)?)
        } else {
            None
        };
        token_embd.product = output.is_none();
        Ok(Weights {
            token_embd,
            layers,
            output_norm,
            output,
            per_layer: PerLayerInputs::read(g, c)?,
        })
    }
}

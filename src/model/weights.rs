//! The model's weights as views into the mapped GGUF file: matrices stay quantized in the mmap;
//! only the small norm and bias vectors are converted to f32 at load time. The one exception: a
//! Q4_1 or Q8_0 matrix is read from a copy with its rows interleaved in eights, made on first use, whose
//! mapped pages are then released ([`Matrix::interleaved`]).
//! Every tensor's presence, type and shape is checked here, naming the tensor on failure.

use std::fmt;
use std::sync::{Arc, OnceLock};

use anyhow::{bail, Context, Result};

use crate::gguf::{GgufFile, TensorInfo};
use crate::kernels;
use crate::model::ModelConfig;
use crate::tensor_type::TensorType;

/// A weight matrix of `n_out` rows of `n_in` elements, stored as in the file.
#[derive(Clone, Debug)]
pub struct Matrix {
    pub info: TensorInfo,
    pub ttype: TensorType,
    pub n_in: usize,
    pub n_out: usize,
    interleaved: Interleaved,
}

/// A matrix's rows interleaved in eights, made on first use and shared by clones.
#[derive(Clone, Default)]
struct Interleaved(Arc<OnceLock<Vec<u8>>>);

impl fmt::Debug for Interleaved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.get() {
            Some(bytes) => write!(f, "Interleaved({} bytes)", bytes.len()),
            None => f.write_str("Interleaved(not made)"),
        }
    }
}

impl Matrix {
    fn load(g: &GgufFile, name: &str, n_in: usize, n_out: usize) -> Result<Matrix> {
        Matrix::from_info(g.tensor(name)?.clone(), n_in, n_out)
    }

    /// Rows `[row0, row0 + n_out)` of the fused matrix `name` (a QKV or gate/up tensor), as a
    /// matrix of its own: the same bytes in the mmap, a narrower view.
    fn load_rows(
        g: &GgufFile,
        name: &str,
        n_in: usize,
        row0: usize,
        n_out: usize,
    ) -> Result<Matrix> {
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
        Matrix::from_info(view, n_in, n_out)
    }

    fn from_info(info: TensorInfo, n_in: usize, n_out: usize) -> Result<Matrix> {
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
        Ok(Matrix {
            ttype: info.ttype,
            info,
            n_in,
            n_out,
            interleaved: Interleaved::default(),
        })
    }

    /// For a Q4_1 or Q8_0 matrix of whole groups of eight rows: its rows interleaved in eights
    /// (`kernels::repack_x8`), the layout `kernels::matmul_x8` reads, made on the first call;
    /// the matrix's mapped pages are released then, so the copy replaces them in memory. `None` for
    /// other matrices.
    pub fn interleaved<'a>(&'a self, g: &GgufFile) -> Option<&'a [u8]> {
        if !kernels::has_x8(self.ttype) || !self.n_out.is_multiple_of(8) {
            return None;
        }
        Some(self.interleaved.0.get_or_init(|| {
            // A slice of rows at a time, each slice's mapped pages released once it is copied,
            // so the copy never sits in memory beside the whole mapped matrix.
            const CHUNK_BYTES: usize = 1 << 20;
            let (w, rb) = (self.bytes(g), self.row_bytes());
            let chunk_rows = (CHUNK_BYTES / rb).next_multiple_of(8);
            let mut w8 = vec![0u8; w.len()];
            for r0 in (0..self.n_out).step_by(chunk_rows) {
                let r1 = (r0 + chunk_rows).min(self.n_out);
                let rows = r0 * rb..r1 * rb;
                kernels::repack_x8_into(
                    self.ttype,
                    &w[rows.clone()],
                    self.n_in,
                    r1 - r0,
                    &mut w8[rows.clone()],
                );
                g.release_pages(&w[rows]);
            }
            w8
        }))
    }

    /// The raw bytes of the matrix: [n_out] rows of `row_bytes()`.
    pub fn bytes<'a>(&self, g: &'a GgufFile) -> &'a [u8] {
        g.tensor_data(&self.info)
    }

    pub fn row_bytes(&self) -> usize {
        self.ttype.row_bytes(self.n_in).expect("checked at load")
    }

    /// Row `r` dequantized into `out` (`n_in` floats), for embedding lookups.
    pub fn dequantize_row(&self, g: &GgufFile, r: usize, out: &mut [f32]) {
        let rb = self.row_bytes();
        kernels::dequantize_row(self.ttype, &self.bytes(g)[r * rb..(r + 1) * rb], out);
    }
}

/// A vector (norm weight) converted to f32.
fn load_vector(g: &GgufFile, name: &str, n: usize) -> Result<Vec<f32>> {
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

/// A linear layer: a weight matrix and, where the file has one, an f32 bias of `n_out`.
#[derive(Clone, Debug)]
pub struct Linear {
    pub weight: Matrix,
    pub bias: Option<Vec<f32>>,
}

impl Linear {
    /// `{name}.weight`, and `{name}.bias` if the file has it (llama.cpp treats Q/K/V/output
    /// biases as optional in every family it runs here).
    fn load(g: &GgufFile, name: &str, n_in: usize, n_out: usize) -> Result<Linear> {
        let weight = Matrix::load(g, &format!("{name}.weight"), n_in, n_out)?;
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
    ) -> Result<Linear> {
        let weight = Matrix::load_rows(g, &format!("{name}.weight"), n_in, row0, n_out)?;
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

/// The weights of one transformer block. The optional norms are there exactly when the
/// model's family uses them (`ModelConfig::qk_norm`, `ModelConfig::post_norms`).
#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub wq: Linear,
    pub wk: Linear,
    pub wv: Linear,
    /// Per-head RMSNorm weights of queries and keys, [head_dim] each.
    pub attn_q_norm: Option<Vec<f32>>,
    pub attn_k_norm: Option<Vec<f32>>,
    pub wo: Linear,
    /// RMSNorm of the attention output before its residual add, [n_embd].
    pub attn_post_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub w_gate: Matrix,
    pub w_up: Matrix,
    pub w_down: Matrix,
    /// RMSNorm of the feed-forward output before its residual add, [n_embd].
    pub ffn_post_norm: Option<Vec<f32>>,
}

#[derive(Clone, Debug)]
pub struct Weights {
    pub token_embd: Matrix,
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>,
    /// The output projection; the token embedding itself when the file ties them.
    pub output: Linear,
}

impl Weights {
    pub fn from_gguf(g: &GgufFile, c: &ModelConfig) -> Result<Weights> {
        let token_embd = Matrix::load(g, "token_embd.weight", c.n_embd, c.vocab_size)?;
        let layers = (0..c.num_layers)
            .map(|i| {
                let linear = |name: &str, n_in, n_out| {
                    Linear::load(g, &format!("blk.{i}.{name}"), n_in, n_out)
                };
                let m = |name: &str, n_in, n_out| {
                    Matrix::load(g, &format!("blk.{i}.{name}.weight"), n_in, n_out)
                };
                let norm = |name: &str, n| load_vector(g, &format!("blk.{i}.{name}.weight"), n);
                let norm_if = |used: bool, name: &str, n| used.then(|| norm(name, n)).transpose();
                // Q, K and V from one fused `attn_qkv` tensor (rows q, then k, then v) where the
                // file has one, as llama.cpp's create_tensor_qkv; else three tensors.
                let qkv = format!("blk.{i}.attn_qkv");
                let (wq, wk, wv) = if g.find_tensor(&format!("{qkv}.weight")).is_some() {
                    let (q, kv) = (c.q_dim(), c.kv_dim());
                    (
                        Linear::load_rows(g, &qkv, c.n_embd, 0, q)?,
                        Linear::load_rows(g, &qkv, c.n_embd, q, kv)?,
                        Linear::load_rows(g, &qkv, c.n_embd, q + kv, kv)?,
                    )
                } else {
                    (
                        linear("attn_q", c.n_embd, c.q_dim())?,
                        linear("attn_k", c.n_embd, c.kv_dim())?,
                        linear("attn_v", c.n_embd, c.kv_dim())?,
                    )
                };
                // phi3: gate and up are one `ffn_up` of 2 * n_ff rows, gate first (ggml_swiglu
                // of the fused product takes silu of its first half).
                let up = format!("blk.{i}.ffn_up.weight");
                let (w_gate, w_up) = if c.fused_gate_up {
                    (
                        Matrix::load_rows(g, &up, c.n_embd, 0, c.n_ff)?,
                        Matrix::load_rows(g, &up, c.n_embd, c.n_ff, c.n_ff)?,
                    )
                } else {
                    (
                        m("ffn_gate", c.n_embd, c.n_ff)?,
                        m("ffn_up", c.n_embd, c.n_ff)?,
                    )
                };
                Ok(LayerWeights {
                    attn_norm: norm("attn_norm", c.n_embd)?,
                    wq,
                    wk,
                    wv,
                    attn_q_norm: norm_if(c.qk_norm, "attn_q_norm", c.head_dim)?,
                    attn_k_norm: norm_if(c.qk_norm, "attn_k_norm", c.head_dim)?,
                    wo: linear("attn_output", c.q_dim(), c.n_embd)?,
                    attn_post_norm: norm_if(c.post_norms, "post_attention_norm", c.n_embd)?,
                    ffn_norm: norm("ffn_norm", c.n_embd)?,
                    w_gate,
                    w_up,
                    w_down: m("ffn_down", c.n_ff, c.n_embd)?,
                    ffn_post_norm: norm_if(c.post_norms, "post_ffw_norm", c.n_embd)?,
                })
            })
            .collect::<Result<Vec<_>>>()
            .context("loading transformer blocks")?;
        let output_norm = load_vector(g, "output_norm.weight", c.n_embd)?;
        let output = if g.find_tensor("output.weight").is_some() {
            Linear::load(g, "output", c.n_embd, c.vocab_size)?
        } else {
            Linear {
                weight: token_embd.clone(),
                bias: None,
            }
        };
        Ok(Weights {
            token_embd,
            layers,
            output_norm,
            output,
        })
    }
}

//! An encoder's tensors, checked at load as llama.cpp's `load_arch_tensors` of `bert` and
//! `nomic-bert` names them: matrices stay in the mapped file ([`MatrixInfo`]), norms and biases
//! are converted to f32. Every required tensor missing or misshapen is a one-line error naming it.

use anyhow::{bail, Result};

use super::config::{EncoderConfig, EncoderKind};
use crate::gguf::GgufFile;
use crate::model::weights::{load_vector, MatrixInfo};

/// A matrix and, where the file has one, its bias.
pub struct Dense {
    pub weight: MatrixInfo,
    pub bias: Option<Vec<f32>>,
}

/// A LayerNorm's scale and shift.
pub struct Norm {
    pub weight: Vec<f32>,
    pub bias: Vec<f32>,
}

pub struct EncoderLayer {
    pub q: Dense,
    pub k: Dense,
    pub v: Dense,
    pub output: Dense,
    /// Post-attention LayerNorm (`attn_output_norm`).
    pub attn_norm: Norm,
    /// nomic-bert's SwiGLU gate (`ffn_gate`); bert has none.
    pub gate: Option<Dense>,
    pub up: Dense,
    pub down: Dense,
    /// Post-feed-forward LayerNorm (`layer_output_norm`).
    pub out_norm: Norm,
}

pub struct EncoderWeights {
    /// `token_embd`, [vocab][n_embd]: rows looked up.
    pub token_embd: MatrixInfo,
    /// Row 0 of `token_types` (every token is of type 0, "sentence A"), when the file has it.
    pub token_type0: Option<Vec<f32>>,
    /// bert's `position_embd`, [n_ctx_train][n_embd]: rows looked up.
    pub position_embd: Option<MatrixInfo>,
    /// The LayerNorm of the summed embeddings (`token_embd_norm`).
    pub embd_norm: Norm,
    pub layers: Vec<EncoderLayer>,
}

pub(super) fn dense(g: &GgufFile, name: &str, n_in: usize, n_out: usize) -> Result<Dense> {
    Ok(Dense {
        weight: MatrixInfo::load(g, &format!("{name}.weight"), n_in, n_out)?,
        bias: optional_vector(g, &format!("{name}.bias"), n_out)?,
    })
}

fn optional_vector(g: &GgufFile, name: &str, n: usize) -> Result<Option<Vec<f32>>> {
    match g.find_tensor(name) {
        Some(_) => Ok(Some(load_vector(g, name, n)?)),
        None => Ok(None),
    }
}

fn norm(g: &GgufFile, name: &str, n: usize) -> Result<Norm> {
    Ok(Norm {
        weight: load_vector(g, &format!("{name}.weight"), n)?,
        bias: load_vector(g, &format!("{name}.bias"), n)?,
    })
}

/// Q, K and V: the fused `attn_qkv` (its bias fused too, or separate Q/K/V biases), else
/// `attn_q`, `attn_k`, `attn_v` (llama.cpp's `create_tensor_qkv`).
fn qkv(g: &GgufFile, p: &str, c: &EncoderConfig) -> Result<[Dense; 3]> {
    let (n, kv) = (c.n_embd, c.kv_dim());
    let fused = format!("{p}attn_qkv.weight");
    if g.find_tensor(&fused).is_none() {
        return Ok([
            dense(g, &format!("{p}attn_q"), n, n)?,
            dense(g, &format!("{p}attn_k"), n, kv)?,
            dense(g, &format!("{p}attn_v"), n, kv)?,
        ]);
    }
    let info = g.tensor(&fused)?;
    if info.dims.len() != 2 || info.n_rows() != n + 2 * kv {
        bail!(
            "tensor '{fused}' has shape {:?}, expected [{n}, {}]",
            info.dims,
            n + 2 * kv
        );
    }
    let fused_bias = optional_vector(g, &format!("{p}attn_qkv.bias"), n + 2 * kv)?;
    let part = |row0: usize, n_out: usize, name: &str| -> Result<Dense> {
        let bias = match &fused_bias {
            Some(b) => Some(b[row0..row0 + n_out].to_vec()),
            None => optional_vector(g, &format!("{p}attn_{name}.bias"), n_out)?,
        };
        Ok(Dense {
            weight: MatrixInfo::load_rows(g, &fused, n, row0, n_out)?,
            bias,
        })
    };
    Ok([part(0, n, "q")?, part(n, kv, "k")?, part(n + kv, kv, "v")?])
}

impl EncoderWeights {
    pub fn from_gguf(g: &GgufFile, c: &EncoderConfig) -> Result<EncoderWeights> {
        let n = c.n_embd;
        let token_embd = MatrixInfo::load(g, "token_embd.weight", n, c.vocab_size)?;
        let token_type0 = match g.find_tensor("token_types.weight") {
            None => None,
            Some(_) => {
                let types = MatrixInfo::load(g, "token_types.weight", n, c.n_token_types)?;
                let mut row = vec![0.0; n];
                crate::kernels::dequantize_row(
                    types.ttype,
                    &types.bytes(g)[..types.row_bytes()],
                    &mut row,
                );
                Some(row)
            }
        };
        let position_embd = match c.kind {
            EncoderKind::Bert => Some(MatrixInfo::load(
                g,
                "position_embd.weight",
                n,
                c.n_ctx_train,
            )?),
            EncoderKind::NomicBert => None,
        };
        let embd_norm = norm(g, "token_embd_norm", n)?;
        let mut layers = Vec::with_capacity(c.num_layers);
        for i in 0..c.num_layers {
            let p = format!("blk.{i}.");
            let [q, k, v] = qkv(g, &p, c)?;
            let gate = match c.kind {
                EncoderKind::Bert => None,
                EncoderKind::NomicBert => Some(dense(g, &format!("{p}ffn_gate"), n, c.n_ff)?),
            };
            layers.push(EncoderLayer {
                q,
                k,
                v,
                output: dense(g, &format!("{p}attn_output"), n, n)?,
                attn_norm: norm(g, &format!("{p}attn_output_norm"), n)?,
                gate,
                up: dense(g, &format!("{p}ffn_up"), n, c.n_ff)?,
                down: dense(g, &format!("{p}ffn_down"), c.n_ff, n)?,
                out_norm: norm(g, &format!("{p}layer_output_norm"), n)?,
            });
        }
        Ok(EncoderWeights {
            token_embd,
            token_type0,
            position_embd,
            embd_norm,
            layers,
        })
    }
}

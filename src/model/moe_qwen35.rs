//! Qwen3.5-MoE's feed-forward block (llama.cpp's `src/models/qwen35moe.cpp`, `build_layer_ffn`):
//! the routed experts as qwen3moe's (softmax over every expert, the top k renormalized: through
//! `super::moe`'s expert products), plus a shared expert, a dense SwiGLU network of
//! `expert_shared_feed_forward_length` on the same input whose output is multiplied by
//! sigmoid(`ffn_gate_inp_shexp` . x), one gate per token; the two added. Read by
//! `super::weights` (a `FeedForward::SharedGated`), run by `super::forward` through [`ffn`].

use anyhow::{bail, Result};

use super::backend::{Backend, WeightStore};
use super::moe::experts_ffn;
use super::weights::{load_vector, InFile, Linear, MatrixInfo, Mlp};
use super::weights_load::{MakeMatrix, MakeVector};
use super::ModelConfig;
use crate::gguf::GgufFile;
use crate::kernels::Activation;

pub struct Qwen35Moe<S: WeightStore> {
    /// [n_embd] -> [num_experts]
    pub router: Linear<S>,
    pub experts: Vec<Mlp<S>>,
    /// The shared expert: [n_embd] -> [n_ff_shexp] -> [n_embd].
    pub shared: Mlp<S>,
    /// `ffn_gate_inp_shexp`, [n_embd]: the shared expert's gate logit is its dot product with
    /// the input, computed on the host (one value per token).
    pub shared_gate: Vec<f32>,
    /// The shared expert's width (`expert_shared_feed_forward_length`).
    pub n_ff_shexp: usize,
}

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

impl Qwen35Moe<InFile> {
    pub(super) fn read(g: &GgufFile, c: &ModelConfig, i: usize) -> Result<Self> {
        let Some(x) = &c.experts else {
            bail!("qwen35moe experts without an expert count");
        };
        let arch = &c.architecture;
        let scale_key = format!("{arch}.expert_weights_scale");
        if g.get(&scale_key).is_some() && g.get_f32(&scale_key)? != 1.0 {
            bail!("{scale_key} other than 1 is not supported");
        }
        let shexp_key = format!("{arch}.expert_shared_feed_forward_length");
        // llama.cpp: the dense width when the key is absent.
        let n_ff_shexp = match g.get(&shexp_key) {
            Some(_) => g.get_usize(&shexp_key)?,
            None => c.n_ff,
        };
        if !(1..1 << 20).contains(&n_ff_shexp) {
            bail!("{shexp_key} = {n_ff_shexp} is out of range");
        }
        let (d, f, ne) = (c.n_embd, x.n_ff_exp, x.num_experts);
        let m = |name: &str, n_in, n_out| {
            MatrixInfo::load(g, &format!("blk.{i}.{name}.weight"), n_in, n_out)
        };
        let exps = |name: &str, n_in, n_out, e| {
            MatrixInfo::load_expert(g, &format!("blk.{i}.{name}.weight"), n_in, n_out, ne, e)
        };
        Ok(Qwen35Moe {
            router: Linear {
                weight: m("ffn_gate_inp", d, ne)?,
                bias: None,
            },
            experts: (0..ne)
                .map(|e| {
                    Ok(dense(
                        exps("ffn_gate_exps", d, f, e)?,
                        exps("ffn_up_exps", d, f, e)?,
                        exps("ffn_down_exps", f, d, e)?,
                    ))
                })
                .collect::<Result<_>>()?,
            shared: dense(
                m("ffn_gate_shexp", d, n_ff_shexp)?,
                m("ffn_up_shexp", d, n_ff_shexp)?,
                m("ffn_down_shexp", n_ff_shexp, d)?,
            ),
            shared_gate: load_vector(g, &format!("blk.{i}.ffn_gate_inp_shexp.weight"), d)?,
            n_ff_shexp,
        })
    }

    /// The same weights in store `S` (`super::weights_load`).
    pub(super) fn load<S: WeightStore, E>(
        &self,
        matrix: &mut MakeMatrix<S, E>,
        vector: &mut MakeVector<S, E>,
    ) -> Result<Qwen35Moe<S>, E> {
        let shared = self.shared.load(matrix, vector)?;
        let experts = self
            .experts
            .iter()
            .map(|m| m.load(matrix, vector))
            .collect::<Result<_, E>>()?;
        Ok(Qwen35Moe {
            router: Linear {
                weight: matrix(&self.router.weight)?,
                bias: None,
            },
            experts,
            shared,
            shared_gate: self.shared_gate.clone(),
            n_ff_shexp: self.n_ff_shexp,
        })
    }
}

/// The block on `h` (the normed input, [n][n_embd]) into `out` ([n][n_embd]).
pub fn ffn<B: Backend>(
    b: &mut B,
    m: &Qwen35Moe<B>,
    c: &ModelConfig,
    h: &B::Acts,
    n: usize,
    out: &mut B::Acts,
) -> Result<()> {
    experts_ffn(b, &m.router, &m.experts, c, h, n, out)?;
    // The shared expert: silu(gate) * up, down.
    let n_sh = m.n_ff_shexp;
    let (mut gate, mut up) = (b.acts(n, n_sh)?, b.acts(n, n_sh)?);
    let mut hq = b.input(h);
    b.matmul_many(
        &mut hq,
        &mut [(&m.shared.gate, &mut gate), (&m.shared.up, &mut up)],
    )?;
    drop(hq);
    b.glu(&mut gate, &up, Activation::SwiGlu)?;
    let mut sh = b.acts(n, c.n_embd)?;
    let mut gq = b.input(&gate);
    b.matmul(&mut gq, &m.shared.down, &mut sh)?;
    drop(gq);
    // Each token's gate: sigmoid(x . w), as ggml's sigmoid of a one-row product.
    let hv = b.read(h)?;
    let gates: Vec<f32> = hv
        .chunks_exact(c.n_embd)
        .map(|row| {
            let dot = row
                .iter()
                .zip(&m.shared_gate)
                .fold(0.0f32, |s, (x, w)| s + x * w);
            1.0 / (1.0 + (-dot).exp())
        })
        .collect();
    let mut gated = b.acts(n, c.n_embd)?;
    b.weighted_sum(&sh, &gates, 1, &mut gated)?;
    b.add(out, &gated)?;
    for x in [gate, up, sh, gated] {
        b.recycle(x);
    }
    Ok(())
}

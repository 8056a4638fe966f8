//! Gemma 4's mixture-of-experts feed-forward block (26B-A4B), as `src/models/gemma4.cpp` builds
//! it: the dense network on the `ffn_norm`ed input as a shared expert (then `post_ffw_norm_1`),
//! plus the experts on the `pre_ffw_norm_2`ed input (then `post_ffw_norm_2`), the two added.
//! The router reads its own input: the residual stream RMS-normed, over sqrt(n_embd), times
//! `ffn_gate_inp.scale`; each expert's output is multiplied by its `ffn_down_exps.scale`. Gate
//! and up of the experts come fused (`ffn_gate_up_exps`, gate rows first) or apart.
//! Read by `super::weights` (a `FeedForward::SharedExperts`), run by `super::forward` through
//! [`ffn`], the expert products through `super::moe`.

use anyhow::{bail, Result};

use super::backend::{Backend, WeightStore};
use super::moe::{route, run_experts};
use super::weights::{load_vector, InFile, MatrixInfo, Mlp};
use super::weights_load::{MakeMatrix, MakeVector};
use super::ModelConfig;
use crate::gguf::GgufFile;

pub struct Gemma4Moe<S: WeightStore> {
    /// The shared expert: the dense network, and the norm of its output.
    pub mlp: Mlp<S>,
    pub post_norm_1: S::Vector,
    /// The experts' input norm and output norm.
    pub pre_norm_2: S::Vector,
    pub post_norm_2: S::Vector,
    /// `ffn_gate_inp.scale / sqrt(n_embd)`: the weight of the router input's RMSNorm.
    pub router_norm: S::Vector,
    /// [n_embd] -> [num_experts]
    pub router: S::Matrix,
    pub experts: Vec<Mlp<S>>,
    /// Each expert's output factor (`ffn_down_exps.scale`), 1 when absent.
    pub expert_scale: Vec<f32>,
}

impl Gemma4Moe<InFile> {
    pub(super) fn read(g: &GgufFile, c: &ModelConfig, i: usize, mlp: Mlp<InFile>) -> Result<Self> {
        let Some(x) = &c.experts else {
            bail!("gemma4 experts without an expert count");
        };
        let (d, f, ne) = (c.n_embd, x.n_ff_exp, x.num_experts);
        let name = |t: &str| format!("blk.{i}.{t}");
        let norm = |t: &str| load_vector(g, &name(&format!("{t}.weight")), d);
        let scale = load_vector(g, &name("ffn_gate_inp.scale"), d)?;
        let inv = 1.0 / (d as f32).sqrt();
        let exps = |t: &str, n_in, n_out, e| {
            MatrixInfo::load_expert(g, &name(&format!("{t}.weight")), n_in, n_out, ne, e)
        };
        let fused = g.find_tensor(&name("ffn_gate_up_exps.weight")).is_some();
        let experts = (0..ne)
            .map(|e| {
                let (gate, up) = if fused {
                    let gu = exps("ffn_gate_up_exps", d, 2 * f, e)?;
                    (gu.rows(0, f)?, gu.rows(f, f)?)
                } else {
                    (
                        exps("ffn_gate_exps", d, f, e)?,
                        exps("ffn_up_exps", d, f, e)?,
                    )
                };
                Ok(Mlp {
                    gate,
                    up,
                    down: exps("ffn_down_exps", f, d, e)?,
                    gate_bias: None,
                    up_bias: None,
                    down_bias: None,
                })
            })
            .collect::<Result<_>>()?;
        let expert_scale = match g.find_tensor(&name("ffn_down_exps.scale")) {
            Some(_) => load_vector(g, &name("ffn_down_exps.scale"), ne)?,
            None => vec![1.0; ne],
        };
        if expert_scale.iter().any(|s| !s.is_finite()) {
            bail!(
                "tensor '{}' holds a factor that is not finite",
                name("ffn_down_exps.scale")
            );
        }
        Ok(Gemma4Moe {
            mlp,
            post_norm_1: norm("post_ffw_norm_1")?,
            pre_norm_2: norm("pre_ffw_norm_2")?,
            post_norm_2: norm("post_ffw_norm_2")?,
            router_norm: scale.iter().map(|s| s * inv).collect(),
            router: MatrixInfo::load(g, &name("ffn_gate_inp.weight"), d, ne)?,
            experts,
            expert_scale,
        })
    }

    /// The same weights in store `S` (see `Weights::load`).
    pub(super) fn load<S: WeightStore, E>(
        &self,
        matrix: &mut MakeMatrix<S, E>,
        vector: &mut MakeVector<S, E>,
    ) -> Result<Gemma4Moe<S>, E> {
        let shared = self.mlp.load(matrix, vector)?;
        let experts = self
            .experts
            .iter()
            .map(|m| m.load(matrix, vector))
            .collect::<Result<_, E>>()?;
        Ok(Gemma4Moe {
            mlp: shared,
            post_norm_1: vector(&self.post_norm_1)?,
            pre_norm_2: vector(&self.pre_norm_2)?,
            post_norm_2: vector(&self.post_norm_2)?,
            router_norm: vector(&self.router_norm)?,
            router: matrix(&self.router)?,
            experts,
            expert_scale: self.expert_scale.clone(),
        })
    }
}

/// `out = post_norm_1(mlp(h)) + post_norm_2(experts(pre_norm_2(x)))`, `x` the residual stream
/// after attention ([n][n_embd]) and `h` its `ffn_norm`.
pub fn ffn<B: Backend>(
    b: &mut B,
    m: &Gemma4Moe<B>,
    c: &ModelConfig,
    x: &B::Acts,
    h: &B::Acts,
    n: usize,
    out: &mut B::Acts,
) -> Result<()> {
    let (mut gate, mut up) = (b.acts(n, c.n_ff)?, b.acts(n, c.n_ff)?);
    let mut hq = b.input(h);
    b.matmul_many(
        &mut hq,
        &mut [(&m.mlp.gate, &mut gate), (&m.mlp.up, &mut up)],
    )?;
    drop(hq);
    b.glu(&mut gate, &up, c.activation)?;
    let mut gq = b.input(&gate);
    b.matmul(&mut gq, &m.mlp.down, out)?;
    drop(gq);
    b.rms_norm_inplace(out, &m.post_norm_1, c.rms_eps)?;

    let mut r = b.acts(n, c.n_embd)?; // the router's input
    b.rms_norm(x, &m.router_norm, c.rms_eps, &mut r)?;
    let mut routing = route(b, &m.router, &None, c, &r, n)?;
    for (w, &e) in routing.weights.iter_mut().zip(&routing.chosen) {
        *w *= m.expert_scale[e as usize];
    }
    b.rms_norm(x, &m.pre_norm_2, c.rms_eps, &mut r)?;
    let mut moe = b.acts(n, c.n_embd)?;
    run_experts(b, &routing, &m.experts, c, &r, n, &mut moe)?;
    b.rms_norm_inplace(&mut moe, &m.post_norm_2, c.rms_eps)?;
    b.add(out, &moe)?;
    for buffer in [gate, up, r, moe] {
        b.recycle(buffer);
    }
    Ok(())
}

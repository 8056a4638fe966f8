//! The CPU backend's Qwen3.5 operations (a child module of `super`, the CPU backend, whose
//! `Backend` impl calls these): the gated delta-net core over each sequence row's run of tokens
//! with its state slot (`kernels::gated_delta_net`), and the gated attention's split of the q
//! projection and its sigmoid gate on the attention output (ggml's `1 / (1 + expf(-x))`).

use anyhow::{ensure, Result};

use super::Cpu;
use crate::kernels::{self, DeltaNetParams, DeltaNetShape};
use crate::model::delta_net::DeltaNet;

impl Cpu {
    /// `Backend::gated_delta_net`: each run's rows through the kernel with its slot's state in
    /// recurrent layer `r`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn delta_net_runs(
        &mut self,
        r: usize,
        s: &DeltaNetShape,
        qkv: &[f32],
        alpha: &[f32],
        beta: &[f32],
        w: &DeltaNet<Cpu>,
        out: &mut [f32],
    ) -> Result<()> {
        let n = self.step.batch.n_tokens();
        let (cd, hv, vd) = (s.conv_dim(), s.n_v_heads, s.value_dim());
        ensure!(
            qkv.len() == n * cd
                && alpha.len() == n * hv
                && beta.len() == n * hv
                && out.len() == n * vd,
            "gated delta-net activations of the wrong shape for {n} tokens"
        );
        let p = DeltaNetParams {
            conv_w: &w.conv,
            dt_bias: &w.dt_bias,
            a: &w.a,
        };
        for run in &self.step.state_runs {
            let (t0, t1) = (run.first, run.first + run.len);
            kernels::gated_delta_net(
                s,
                &qkv[t0 * cd..t1 * cd],
                &alpha[t0 * hv..t1 * hv],
                &beta[t0 * hv..t1 * hv],
                &p,
                self.states.layer_mut(run.slot, r),
                run.reset,
                &mut out[t0 * vd..t1 * vd],
            );
        }
        Ok(())
    }
}

/// `q[t][h] = qg[t][h][0]`: each head's queries out of `[n][n_heads][2][head_dim]`.
pub(super) fn split_q_gate(qg: &[f32], head_dim: usize, q: &mut [f32]) -> Result<()> {
    ensure!(
        head_dim > 0 && qg.len() == 2 * q.len() && q.len() % head_dim == 0,
        "split_q_gate shapes"
    );
    for (dst, src) in q
        .chunks_exact_mut(head_dim)
        .zip(qg.chunks_exact(2 * head_dim))
    {
        dst.copy_from_slice(&src[..head_dim]);
    }
    Ok(())
}

/// `x[t][h][d] *= sigmoid(qg[t][h][1][d])`.
pub(super) fn sigmoid_gate(x: &mut [f32], qg: &[f32], head_dim: usize) -> Result<()> {
    ensure!(
        head_dim > 0 && qg.len() == 2 * x.len() && x.len() % head_dim == 0,
        "sigmoid_gate shapes"
    );
    for (dst, src) in x
        .chunks_exact_mut(head_dim)
        .zip(qg.chunks_exact(2 * head_dim))
    {
        for (v, g) in dst.iter_mut().zip(&src[head_dim..]) {
            *v *= 1.0 / (1.0 + (-g).exp());
        }
    }
    Ok(())
}

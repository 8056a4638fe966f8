//! The CPU backend's Mamba-2 block (`Backend::mamba2` of `super::cpu`): for each sequence run of
//! the step, the causal convolution of xBC and the selective scan over the run's tokens with the
//! layer's state in the sequence's slot (conv state first, then the scan's), then the D skip, the
//! SiLU(z) gate and the grouped RMSNorm (the kernels of `crate::kernels::ssm`).

use anyhow::{ensure, Result};

use super::backend::WeightStore;
use super::mamba2::{Mamba2, SsmShape};
use super::state_pool::{StatePool, StateRun};
use crate::kernels::ssm::{self, ScanInputs};

/// `zxbcdt` [n_tokens][d_in_proj] -> `out` [n_tokens][d_inner], run by run.
#[allow(clippy::too_many_arguments)]
pub(super) fn run<S: WeightStore<Vector = Vec<f32>>>(
    states: &mut StatePool,
    runs: &[StateRun],
    r: usize,
    zxbcdt: &[f32],
    m: &Mamba2<S>,
    s: SsmShape,
    eps: f32,
    out: &mut [f32],
) -> Result<()> {
    let (d_inner, conv_dim, width) = (s.d_inner(), s.conv_dim(), s.d_in_proj());
    let n = zxbcdt.len() / width;
    ensure!(
        zxbcdt.len() == n * width && out.len() == n * d_inner,
        "mamba2: {} inputs and {} outputs for rows of {width} and {d_inner}",
        zxbcdt.len(),
        out.len()
    );
    let bc = s.n_group * s.d_state;
    let mut xbc = Vec::new(); // [run.len][conv_dim]: the convolution's output
    for run in runs {
        let rows = &zxbcdt[run.first * width..(run.first + run.len) * width];
        let y = &mut out[run.first * d_inner..(run.first + run.len) * d_inner];
        let state = states.layer_mut(run.slot, r);
        ensure!(
            state.len() == s.state_floats(),
            "mamba2: a state slot of the wrong size"
        );
        let (conv_state, scan_state) = state.split_at_mut(s.conv_state_floats());
        xbc.clear();
        xbc.resize(run.len * conv_dim, 0.0);
        ssm::ssm_conv(
            &rows[d_inner..],
            width,
            &m.conv,
            Some(&m.conv_bias),
            conv_state,
            run.reset,
            conv_dim,
            &mut xbc,
        );
        let inputs = ScanInputs {
            x: &xbc,
            x_stride: conv_dim,
            b: &xbc[d_inner..],
            c: &xbc[d_inner + bc..],
            bc_stride: conv_dim,
            dt: &rows[d_inner + conv_dim..],
            dt_stride: width,
            dt_bias: &m.dt_bias,
            a: &m.a,
        };
        ssm::ssm_scan(s, &inputs, scan_state, run.reset, y);
        ssm::ssm_gate_norm(s, y, &xbc, conv_dim, rows, width, &m.d, &m.norm, eps);
    }
    Ok(())
}

//! Safe wrappers over the recurrent layers' kernels, one sequence's tokens at a time with its
//! state: LFM2's short convolution (`csrc/short_conv.c`) and Qwen3.5's gated delta-net core
//! (`csrc/delta_net.c`). Called by the CPU backend's recurrent layers (`crate::model::cpu`,
//! `crate::model::cpu_delta_net`) and the kernel tests.

use super::bindings as ffi;
use super::pool::{for_each_task, SharedMut};

/// LFM2's short convolution of one sequence's consecutive tokens (`el_short_conv`): `bcx` is
/// [n_tokens][3][d] (b, c, x of each token, `d` channels), `w` [d][l_cache], `state` [l_cache - 1][d] (the
/// inputs before the first token; zeroed first when `reset`), `y` [n_tokens][d]. Afterwards
/// `state` covers the last token. A chunk gives bit for bit what its tokens one by one give.
pub fn short_conv(bcx: &[f32], w: &[f32], state: &mut [f32], reset: bool, d: usize, y: &mut [f32]) {
    assert!(d > 0, "short_conv of no channels");
    let n_tokens = y.len() / d;
    assert!(
        y.len() == n_tokens * d && bcx.len() == n_tokens * 3 * d && w.len() % d == 0,
        "short_conv shapes"
    );
    let l_cache = w.len() / d;
    assert!(
        l_cache >= 2 && state.len() == (l_cache - 1) * d,
        "short_conv state shape"
    );
    // SAFETY: bcx holds n_tokens rows of 3 * d, y n_tokens rows of d, w d rows of l_cache and
    // state l_cache - 1 rows of d floats, as checked above.
    unsafe {
        ffi::el_short_conv(
            bcx.as_ptr(),
            w.as_ptr(),
            state.as_mut_ptr(),
            i32::from(reset),
            n_tokens as i64,
            d as i64,
            l_cache as i64,
            y.as_mut_ptr(),
        );
    }
}

/// The shape of a Qwen3.5 gated delta-net layer: `n_k_heads` q/k heads and `n_v_heads` value
/// heads (a multiple), all of `head_dim`; the convolution's window `d_conv`; the L2 norm's `eps`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeltaNetShape {
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    pub head_dim: usize,
    pub d_conv: usize,
    pub eps: f32,
}

impl DeltaNetShape {
    /// Channels of the fused q/k/v projection (and of the convolution).
    pub fn conv_dim(&self) -> usize {
        (2 * self.n_k_heads + self.n_v_heads) * self.head_dim
    }
    /// Width of the output (and of the gate `z`): the value heads.
    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.head_dim
    }
    /// Floats of the convolution's state: the last `d_conv - 1` projections.
    pub fn conv_state_floats(&self) -> usize {
        (self.d_conv - 1) * self.conv_dim()
    }
    /// Floats of the delta rule's state: a [head_dim][head_dim] matrix per value head.
    pub fn ssm_state_floats(&self) -> usize {
        self.n_v_heads * self.head_dim * self.head_dim
    }
}

/// The weights `el_delta_net_conv` and `el_delta_net_rule` read: the convolution
/// [conv_dim][d_conv], `dt_bias` and `a` [n_v_heads].
pub struct DeltaNetParams<'a> {
    pub conv_w: &'a [f32],
    pub dt_bias: &'a [f32],
    pub a: &'a [f32],
}

/// Qwen3.5's gated delta-net core over one sequence's consecutive tokens (`el_delta_net_conv`,
/// then `el_delta_net_rule` per range of value heads): `qkv` [n_tokens][conv_dim], `alpha` and `beta` [n_tokens][n_v_heads] (the raw projections),
/// `state` the conv state then the delta rule's state ([`DeltaNetShape::conv_state_floats`] +
/// [`DeltaNetShape::ssm_state_floats`], zeroed first when `reset`), `out`
/// [n_tokens][n_v_heads][head_dim]. A chunk gives bit for bit what its tokens one by one give,
/// and the value heads run in ranges over the kernels' pool (each head's arithmetic unchanged).
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_net(
    s: &DeltaNetShape,
    qkv: &[f32],
    alpha: &[f32],
    beta: &[f32],
    p: &DeltaNetParams<'_>,
    state: &mut [f32],
    reset: bool,
    out: &mut [f32],
) {
    assert!(
        s.n_k_heads > 0 && s.n_v_heads % s.n_k_heads == 0 && s.head_dim > 0 && s.d_conv >= 2,
        "gated_delta_net shape {s:?}"
    );
    let n_tokens = out.len() / s.value_dim();
    assert!(
        out.len() == n_tokens * s.value_dim()
            && qkv.len() == n_tokens * s.conv_dim()
            && alpha.len() == n_tokens * s.n_v_heads
            && beta.len() == n_tokens * s.n_v_heads,
        "gated_delta_net activation shapes"
    );
    assert!(
        p.conv_w.len() == s.conv_dim() * s.d_conv
            && p.dt_bias.len() == s.n_v_heads
            && p.a.len() == s.n_v_heads
            && state.len() == s.conv_state_floats() + s.ssm_state_floats(),
        "gated_delta_net weight or state shapes"
    );
    let (conv_state, ssm_state) = state.split_at_mut(s.conv_state_floats());
    let mut x = vec![0.0f32; n_tokens * s.conv_dim()];
    // SAFETY: every slice's length is checked above against the shapes the kernel touches.
    unsafe {
        ffi::el_delta_net_conv(
            qkv.as_ptr(),
            p.conv_w.as_ptr(),
            conv_state.as_mut_ptr(),
            i32::from(reset),
            n_tokens as i64,
            s.n_k_heads as i64,
            s.n_v_heads as i64,
            s.head_dim as i64,
            s.d_conv as i64,
            s.eps,
            x.as_mut_ptr(),
        );
    }
    // The value heads in ranges over the pool: each range its own heads' states and outputs
    // (one range when the whole is too small to pay for the split: about 2^16 state elements).
    let work = n_tokens * s.n_v_heads * s.head_dim * s.head_dim;
    let n_tasks = match work < 1 << 16 {
        true => 1,
        false => s.n_v_heads.min(super::num_threads().max(1) * 2),
    };
    let (state_ptr, out_ptr) = (
        SharedMut(ssm_state.as_mut_ptr()),
        SharedMut(out.as_mut_ptr()),
    );
    let x = &x;
    for_each_task(n_tasks, &|task| {
        let (h0, h1) = (
            task * s.n_v_heads / n_tasks,
            (task + 1) * s.n_v_heads / n_tasks,
        );
        let mut delta = vec![0.0f32; s.head_dim];
        // SAFETY: the lengths are checked above; task ranges of heads are disjoint, and the
        // kernel touches only heads [h0, h1) of the state and of each output row.
        unsafe {
            ffi::el_delta_net_rule(
                x.as_ptr(),
                alpha.as_ptr(),
                beta.as_ptr(),
                p.dt_bias.as_ptr(),
                p.a.as_ptr(),
                state_ptr.ptr(),
                i32::from(reset),
                n_tokens as i64,
                s.n_k_heads as i64,
                s.n_v_heads as i64,
                s.head_dim as i64,
                h0 as i64,
                h1 as i64,
                delta.as_mut_ptr(),
                out_ptr.ptr(),
            );
        }
    });
}

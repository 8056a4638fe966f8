//! Safe wrappers over Mamba-2's kernels (`csrc/ssm_scan.c`): the causal convolution of xBC with
//! its state, the selective scan with its state, and the gate and grouped norm before out_proj,
//! one sequence's consecutive tokens at a time. Called by the CPU backend's Mamba-2 layers
//! (`crate::model::mamba2_cpu`) and the kernel tests (tests/kernels_ssm.rs).

use super::bindings as ffi;

/// The shape of a Mamba-2 layer (llama.cpp's `ssm_*` hyperparameters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SsmShape {
    /// The convolution's window (`ssm.conv_kernel`).
    pub d_conv: usize,
    /// Heads (`ssm.time_step_rank`) and each head's channels: d_inner = n_head * head_dim.
    pub n_head: usize,
    pub head_dim: usize,
    /// State elements per channel (`ssm.state_size`).
    pub d_state: usize,
    /// Groups sharing B and C (`ssm.group_count`), dividing the heads.
    pub n_group: usize,
}

impl SsmShape {
    /// Channels of x (and of z, and of the scan's output).
    pub fn d_inner(&self) -> usize {
        self.n_head * self.head_dim
    }
    /// Channels of the convolution: x, then B and C (n_group * d_state each).
    pub fn conv_dim(&self) -> usize {
        self.d_inner() + 2 * self.n_group * self.d_state
    }
    /// Width of in_proj's output: z, xBC, dt.
    pub fn d_in_proj(&self) -> usize {
        self.d_inner() + self.conv_dim() + self.n_head
    }
    /// Floats of the convolution's state: the last d_conv - 1 inputs.
    pub fn conv_state_floats(&self) -> usize {
        (self.d_conv - 1) * self.conv_dim()
    }
    /// Floats of the scan's state: [n_head][head_dim][d_state].
    pub fn scan_state_floats(&self) -> usize {
        self.d_inner() * self.d_state
    }
    /// Floats of one layer's whole state, conv state first.
    pub fn state_floats(&self) -> usize {
        self.conv_state_floats() + self.scan_state_floats()
    }
}

/// `el_ssm_conv`: `xbc` holds `n_tokens` rows `stride` floats apart whose first `d` are the
/// inputs; `w` [d][d_conv], `bias` [d], `state` [d_conv - 1][d] (zeroed first when `reset`),
/// `y` [n_tokens][d] = SiLU(conv + bias). Afterwards `state` covers the last token.
#[allow(clippy::too_many_arguments)]
pub fn ssm_conv(
    xbc: &[f32],
    stride: usize,
    w: &[f32],
    bias: Option<&[f32]>,
    state: &mut [f32],
    reset: bool,
    d: usize,
    y: &mut [f32],
) {
    assert!(
        d > 0 && stride >= d,
        "ssm_conv of no channels or a short stride"
    );
    let n_tokens = y.len() / d;
    assert!(
        y.len() == n_tokens * d && w.len().is_multiple_of(d),
        "ssm_conv shapes"
    );
    let d_conv = w.len() / d;
    assert!(
        d_conv >= 2 && state.len() == (d_conv - 1) * d,
        "ssm_conv state shape"
    );
    assert!(
        n_tokens == 0 || xbc.len() >= (n_tokens - 1) * stride + d,
        "ssm_conv input shape"
    );
    assert!(bias.is_none_or(|b| b.len() == d), "ssm_conv bias shape");
    // SAFETY: xbc holds n_tokens rows of stride (the last at least d), y n_tokens rows of d, w d
    // rows of d_conv, state d_conv - 1 rows of d and bias d floats, as checked above.
    unsafe {
        ffi::el_ssm_conv(
            xbc.as_ptr(),
            stride as i64,
            w.as_ptr(),
            bias.map_or(std::ptr::null(), |b| b.as_ptr()),
            state.as_mut_ptr(),
            i32::from(reset),
            n_tokens as i64,
            d as i64,
            d_conv as i64,
            y.as_mut_ptr(),
        );
    }
}

/// One sequence's tokens for [`ssm_scan`]: rows of in_proj's and the convolution's outputs.
pub struct ScanInputs<'a> {
    /// x at the start of each row, `x_stride` floats apart: [n_head][head_dim].
    pub x: &'a [f32],
    pub x_stride: usize,
    /// B then C at the start of each row, `bc_stride` apart: [n_group][d_state] each.
    pub b: &'a [f32],
    pub c: &'a [f32],
    pub bc_stride: usize,
    /// dt at the start of each row, `dt_stride` apart: [n_head].
    pub dt: &'a [f32],
    pub dt_stride: usize,
    /// Per head: dt's bias and the decay A (negative).
    pub dt_bias: &'a [f32],
    pub a: &'a [f32],
}

fn rows_fit(v: &[f32], n_tokens: usize, stride: usize, width: usize) -> bool {
    n_tokens == 0 || (stride >= width && v.len() >= (n_tokens - 1) * stride + width)
}

/// `el_ssm_scan` of `y.len() / d_inner` tokens: `state` [n_head][head_dim][d_state] (zeroed
/// first when `reset`) is carried through them, `y` [n_tokens][d_inner] gets each token's scan.
pub fn ssm_scan(s: SsmShape, inp: &ScanInputs, state: &mut [f32], reset: bool, y: &mut [f32]) {
    let d_inner = s.d_inner();
    assert!(
        d_inner > 0 && s.d_state > 0 && s.n_group > 0 && s.n_head.is_multiple_of(s.n_group),
        "ssm_scan shape {s:?}"
    );
    let n_tokens = y.len() / d_inner;
    let bc = s.n_group * s.d_state;
    assert!(
        y.len() == n_tokens * d_inner
            && state.len() == s.scan_state_floats()
            && rows_fit(inp.x, n_tokens, inp.x_stride, d_inner)
            && rows_fit(inp.b, n_tokens, inp.bc_stride, bc)
            && rows_fit(inp.c, n_tokens, inp.bc_stride, bc)
            && rows_fit(inp.dt, n_tokens, inp.dt_stride, s.n_head)
            && inp.dt_bias.len() == s.n_head
            && inp.a.len() == s.n_head,
        "ssm_scan shapes"
    );
    // SAFETY: every pointer covers the rows and widths the kernel reads or writes, as checked.
    unsafe {
        ffi::el_ssm_scan(
            state.as_mut_ptr(),
            i32::from(reset),
            inp.x.as_ptr(),
            inp.x_stride as i64,
            inp.dt.as_ptr(),
            inp.dt_stride as i64,
            inp.dt_bias.as_ptr(),
            inp.a.as_ptr(),
            inp.b.as_ptr(),
            inp.c.as_ptr(),
            inp.bc_stride as i64,
            n_tokens as i64,
            s.n_head as i64,
            s.head_dim as i64,
            s.d_state as i64,
            s.n_group as i64,
            y.as_mut_ptr(),
        );
    }
}

/// `el_ssm_gate_norm` in place on `y` [n_tokens][d_inner]: `y = SiLU(z) * (y + x * d_skip)`, then
/// each group's RMSNorm with `norm` [d_inner]. `x` and `z` are rows `x_stride`, `z_stride` apart.
#[allow(clippy::too_many_arguments)]
pub fn ssm_gate_norm(
    s: SsmShape,
    y: &mut [f32],
    x: &[f32],
    x_stride: usize,
    z: &[f32],
    z_stride: usize,
    d_skip: &[f32],
    norm: &[f32],
    eps: f32,
) {
    let d_inner = s.d_inner();
    assert!(
        d_inner > 0 && s.n_group > 0 && d_inner.is_multiple_of(s.n_group),
        "ssm_gate_norm shape"
    );
    let n_tokens = y.len() / d_inner;
    assert!(
        y.len() == n_tokens * d_inner
            && rows_fit(x, n_tokens, x_stride, d_inner)
            && rows_fit(z, n_tokens, z_stride, d_inner)
            && d_skip.len() == s.n_head
            && norm.len() == d_inner,
        "ssm_gate_norm shapes"
    );
    // SAFETY: as checked above.
    unsafe {
        ffi::el_ssm_gate_norm(
            y.as_mut_ptr(),
            x.as_ptr(),
            x_stride as i64,
            z.as_ptr(),
            z_stride as i64,
            d_skip.as_ptr(),
            norm.as_ptr(),
            n_tokens as i64,
            s.n_head as i64,
            s.head_dim as i64,
            s.n_group as i64,
            eps,
        );
    }
}

//! Safe wrappers over the recurrent layers' kernels (`csrc/short_conv.c`): LFM2's short
//! convolution, one sequence's tokens at a time with its state. Called by the CPU backend's conv
//! layers (`crate::model::cpu`) and the kernel tests.

use super::bindings as ffi;

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

//! The CUDA backend's checks of the activations an operation is given (shapes, row lists),
//! before anything is launched. Called by `super` (backend.rs).

use anyhow::{bail, Result};

use super::DevActs;

/// Fails unless `x` and `out` have rows of the same width, `rows` has `len` entries and each is
/// below `bound`.
pub(super) fn check_rows(
    what: &str,
    x: &DevActs,
    rows: &[u32],
    out: &DevActs,
    len: usize,
    bound: usize,
) -> Result<()> {
    if x.width != out.width || rows.len() != len || rows.iter().any(|&r| r as usize >= bound) {
        bail!("{what}: {} rows between {x:?} and {out:?}", rows.len());
    }
    Ok(())
}

pub(super) fn as_i32(rows: &[u32]) -> Vec<i32> {
    rows.iter().map(|&r| r as i32).collect()
}

pub(super) fn same_shape(a: &DevActs, b: &DevActs, what: &str) -> Result<()> {
    if (a.n_rows, a.width) != (b.n_rows, b.width) {
        bail!(
            "{what}: activations [{}][{}] and [{}][{}]",
            a.n_rows,
            a.width,
            b.n_rows,
            b.width
        );
    }
    Ok(())
}

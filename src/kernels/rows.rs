//! The row operations' split over the kernels' pool: a batch's rows (RMSNorm, RoPE, the gated
//! activation, residual and bias adds) cut into contiguous runs, one task each, when the batch is
//! large enough for a hand-off (about a microsecond or two) to pay; a small batch (decode) stays
//! on the calling thread. Every row is computed by the same kernel call on the same data
//! whichever run it falls in, so the results are bit-identical to one call over all the rows.

use std::ops::Range;

use super::pool;

/// Below this many f32 elements in a call the rows stay on the calling thread: an RMSNorm of
/// 16,384 floats takes a few microseconds, about what the threads' hand-off costs.
pub const PAR_MIN_ELEMENTS: usize = 16 * 1024;

/// Runs per thread: more than one, so a thread the operating system delays takes fewer.
const RUNS_PER_THREAD: usize = 4;

/// Calls `f(rows)` over runs of `[0, n_rows)` covering each row exactly once: one call on this
/// thread when `n_rows * row_len < min_elements` (or there is one thread), else runs of whole
/// multiples of `align` rows (a kernel's vector width in rows) spread over the pool. `f` must
/// write only its own rows' outputs.
pub fn for_row_runs(
    n_rows: usize,
    row_len: usize,
    align: usize,
    min_elements: usize,
    f: &(dyn Fn(Range<usize>) + Sync),
) {
    let threads = pool::num_threads();
    if n_rows == 0 {
        return;
    }
    if threads == 1 || n_rows.saturating_mul(row_len) < min_elements {
        return f(0..n_rows);
    }
    let align = align.max(1);
    let per_run = n_rows
        .div_ceil(threads * RUNS_PER_THREAD)
        .next_multiple_of(align);
    let n_runs = n_rows.div_ceil(per_run);
    pool::for_each_task(n_runs, &|i| {
        let begin = i * per_run;
        f(begin..(begin + per_run).min(n_rows));
    });
}

/// [`for_row_runs`] over `x` (`[n_rows][row_len]`) in place: `f(first row, its rows)`.
pub fn for_row_runs_mut(
    x: &mut [f32],
    row_len: usize,
    align: usize,
    min_elements: usize,
    f: &(dyn Fn(usize, &mut [f32]) + Sync),
) {
    assert!(
        row_len > 0 && x.len().is_multiple_of(row_len),
        "{} floats are not rows of {row_len}",
        x.len()
    );
    let n_rows = x.len() / row_len;
    let shared = super::pool::SharedMut(x.as_mut_ptr());
    for_row_runs(n_rows, row_len, align, min_elements, &|rows| {
        // SAFETY: x holds n_rows rows of row_len floats and the runs are disjoint (each row in
        // exactly one), so this run's slice is the only one touching these floats; `x` stays
        // borrowed mutably until for_row_runs returns.
        let run = unsafe {
            std::slice::from_raw_parts_mut(
                shared.ptr().add(rows.start * row_len),
                rows.len() * row_len,
            )
        };
        f(rows.start, run);
    });
}

/// Element-wise operations' unit of work: a few cache lines.
const ELEMENT_UNIT: usize = 64;

/// Calls `f(first element, its elements)` over runs of `x` covering each element once, every run
/// but the last a multiple of [`ELEMENT_UNIT`]; on this thread alone below [`PAR_MIN_ELEMENTS`].
fn for_element_runs_mut(x: &mut [f32], f: &(dyn Fn(usize, &mut [f32]) + Sync)) {
    let n = x.len();
    let shared = super::pool::SharedMut(x.as_mut_ptr());
    let n_units = n.div_ceil(ELEMENT_UNIT);
    for_row_runs(n_units, ELEMENT_UNIT, 1, PAR_MIN_ELEMENTS, &|units| {
        let run = units.start * ELEMENT_UNIT..(units.end * ELEMENT_UNIT).min(n);
        // SAFETY: the run is inside x and no other run touches it; `x` stays borrowed mutably
        // until for_row_runs returns.
        let xs = unsafe { std::slice::from_raw_parts_mut(shared.ptr().add(run.start), run.len()) };
        f(run.start, xs);
    });
}

/// `x[i] = op(x[i], y[i])` over the pool when large.
fn zip_inplace(x: &mut [f32], y: &[f32], op: impl Fn(&mut f32, f32) + Sync) {
    assert_eq!(x.len(), y.len(), "element-wise shapes");
    for_element_runs_mut(x, &|start, xs| {
        let ys = &y[start..start + xs.len()];
        xs.iter_mut().zip(ys).for_each(|(a, &b)| op(a, b));
    });
}

/// `x[i] += y[i]`.
pub fn add_inplace(x: &mut [f32], y: &[f32]) {
    zip_inplace(x, y, |a, b| *a += b);
}

/// `x[r] += bias` for every row of `bias.len()` elements.
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    for_row_runs_mut(x, bias.len(), 1, PAR_MIN_ELEMENTS, &|_, run| {
        for row in run.chunks_exact_mut(bias.len()) {
            row.iter_mut().zip(bias).for_each(|(a, b)| *a += b);
        }
    });
}

/// `x *= s`.
pub fn scale(x: &mut [f32], s: f32) {
    for_element_runs_mut(x, &|_, xs| xs.iter_mut().for_each(|z| *z *= s));
}

/// `out[r] = w[r*k] * x[r*k] + w[r*k + 1] * x[r*k + 1] + ...`, added in that order (llama.cpp's
/// sum of the weighted expert outputs, `build_moe_ffn`): `out` [n][width], `x` [n * k][width],
/// `w` [n * k].
pub fn weighted_sum(x: &[f32], w: &[f32], k: usize, out: &mut [f32]) {
    let width = out.len() / (w.len() / k.max(1)).max(1);
    for (r, o) in out.chunks_exact_mut(width).enumerate() {
        for j in 0..k {
            let (s, wj) = (r * k + j, w[r * k + j]);
            let xs = &x[s * width..(s + 1) * width];
            if j == 0 {
                o.iter_mut().zip(xs).for_each(|(o, &v)| *o = v * wj);
            } else {
                o.iter_mut().zip(xs).for_each(|(o, &v)| *o += v * wj);
            }
        }
    }
}

//! Safe wrappers over the tensor-type kernels in `csrc/quants.c` and `csrc/quants_k.c`: block
//! geometry, dequantize, quantize, dot products and the threaded matrix product.
//!
//! The model calls `quantize_rows` on its activations and `matmul` against its weight matrices;
//! `tests/kernels_quant.rs` checks every type through these functions. Shapes are internal
//! contracts: each wrapper asserts its slice lengths (and the alignment the C block structs need)
//! before any unsafe call, and treats a non-zero kernel status as a bug.

use std::ffi::c_void;

use super::bindings;
use super::pool::{self, SharedMut};
use crate::kernels::tensor_type::TensorType;

/// Output columns per matmul task. One activation row (decode) streams each weight row once:
/// 32-column tasks (four 8-column tiles) keep both threads streaming to the end. Batches reuse
/// each 4-row group's prepared activation scales across a task's columns, so their tasks are
/// wider: about `TASKS_PER_THREAD` per thread (a thread slowed by other work on the machine hands
/// its share to the rest), whole tiles, at least 32 columns.
fn cols_per_task(n_out: usize, n_rows: usize) -> usize {
    const TASKS_PER_THREAD: usize = 4;
    const MIN_COLS_PER_TASK: usize = 32;
    if n_rows < 4 {
        return MIN_COLS_PER_TASK;
    }
    let per_task = n_out.div_ceil(TASKS_PER_THREAD * pool::num_threads());
    per_task.next_multiple_of(8).max(MIN_COLS_PER_TASK)
}

fn type_id(t: TensorType) -> i32 {
    t.ggml_id() as i32
}

/// Bytes of a row of `n` elements of `t`; panics when `n` is not a whole number of blocks.
fn row_bytes(t: TensorType, n: usize) -> usize {
    t.row_bytes(n)
        .unwrap_or_else(|| panic!("{n} elements is not a whole number of {t} blocks"))
}

/// The alignment the C kernels read a `t` row with: its block struct's widest field.
fn block_align(t: TensorType) -> usize {
    match t {
        TensorType::F32 | TensorType::Q8_K => 4,
        _ => 2,
    }
}

fn is_aligned(t: TensorType, bytes: &[u8]) -> bool {
    bytes.is_empty() || (bytes.as_ptr() as usize).is_multiple_of(block_align(t))
}

fn assert_aligned(t: TensorType, bytes: &[u8], what: &str) {
    assert!(
        is_aligned(t, bytes),
        "{what}: a {t} row must be {}-byte aligned",
        block_align(t)
    );
}

fn check_status(status: i32, kernel: &str) {
    assert!(
        status == bindings::el_status_EL_OK,
        "{kernel} returned status {status}"
    );
}

/// Elements per block of `t`, as the C kernels' own table says (tests compare it with
/// `TensorType::block_size`).
pub fn c_block_size(t: TensorType) -> usize {
    // SAFETY: a pure table lookup.
    unsafe { bindings::el_type_block_size(type_id(t)) as usize }
}

/// Bytes per block of `t`, as the C kernels' own table says.
pub fn c_block_bytes(t: TensorType) -> usize {
    // SAFETY: a pure table lookup.
    unsafe { bindings::el_type_block_bytes(type_id(t)) as usize }
}

/// The activation type the C kernels dot a `t` row against, or `None` if they do not know `t`.
pub fn c_vec_dot_type(t: TensorType) -> Option<TensorType> {
    // SAFETY: a pure table lookup.
    let id = unsafe { bindings::el_type_vec_dot_type(type_id(t)) };
    u32::try_from(id).ok().and_then(TensorType::from_ggml_id)
}

/// `dst[n]` = the dequantized `src` (a row of `n` elements of `t`; several rows of the same
/// width may be passed as one).
pub fn dequantize_row(t: TensorType, src: &[u8], dst: &mut [f32]) {
    let n = dst.len();
    assert_eq!(
        src.len(),
        row_bytes(t, n),
        "dequantize_row: {t} bytes for {n} elements"
    );
    assert_aligned(t, src, "dequantize_row");
    // SAFETY: src holds exactly the blocks of n elements and dst n floats, both checked above.
    let status = unsafe {
        bindings::el_dequantize_row(
            type_id(t),
            src.as_ptr().cast::<c_void>(),
            dst.as_mut_ptr(),
            n as i64,
        )
    };
    check_status(status, "el_dequantize_row");
}

/// `dst` = `src[n]` quantized to `t`.
pub fn quantize_row(t: TensorType, src: &[f32], dst: &mut [u8]) {
    let n = src.len();
    assert_eq!(
        dst.len(),
        row_bytes(t, n),
        "quantize_row: {t} bytes for {n} elements"
    );
    assert_aligned(t, dst, "quantize_row");
    // SAFETY: src holds n floats and dst exactly the blocks of n elements, both checked above.
    let status = unsafe {
        bindings::el_quantize_row(
            type_id(t),
            src.as_ptr(),
            dst.as_mut_ptr().cast::<c_void>(),
            n as i64,
        )
    };
    check_status(status, "el_quantize_row");
}

/// `sum_i w[i] * a[i]` for a weight row `w` of `n` elements of `t` and an activation row `a`
/// of `t.vec_dot_type()` (from `quantize_row`/`quantize_rows`).
pub fn vec_dot(t: TensorType, n: usize, w: &[u8], a: &[u8]) -> f32 {
    let a_type = t.vec_dot_type();
    assert_eq!(
        w.len(),
        row_bytes(t, n),
        "vec_dot: {t} weight bytes for {n} elements"
    );
    assert_eq!(
        a.len(),
        row_bytes(a_type, n),
        "vec_dot: {a_type} activation bytes for {n} elements"
    );
    assert_aligned(t, w, "vec_dot weights");
    assert_aligned(a_type, a, "vec_dot activations");
    let mut out = 0.0f32;
    // SAFETY: w and a hold exactly the blocks of n elements of their types, checked above.
    let status = unsafe {
        bindings::el_vec_dot(
            type_id(t),
            n as i64,
            w.as_ptr().cast(),
            a.as_ptr().cast(),
            &mut out,
        )
    };
    check_status(status, "el_vec_dot");
    out
}

/// Quantizes `x` (`[n_rows][n_in]`) to `t`, row by row in parallel: returns `[n_rows]` rows of
/// `t.row_bytes(n_in)` bytes.
pub fn quantize_rows(t: TensorType, x: &[f32], n_in: usize) -> Vec<u8> {
    let mut out = Vec::new();
    quantize_rows_into(t, x, n_in, &mut out);
    out
}

/// [`quantize_rows`] into `out`, resized to the rows (a reused buffer: only growth is zeroed,
/// every byte is written).
pub fn quantize_rows_into(t: TensorType, x: &[f32], n_in: usize, out: &mut Vec<u8>) {
    assert!(
        n_in > 0 && x.len().is_multiple_of(n_in),
        "quantize_rows: {} floats are not rows of {n_in}",
        x.len()
    );
    let rb = row_bytes(t, n_in);
    let n_rows = x.len() / n_in;
    out.resize(n_rows * rb, 0); // [n_rows][rb]
    let shared = SharedMut(out.as_mut_ptr());
    pool::for_each_task(n_rows, &|r| {
        // SAFETY: out holds n_rows rows of rb bytes and task r alone writes row r (see
        // SharedMut); the slice ends before `out` is read or dropped.
        let dst = unsafe { std::slice::from_raw_parts_mut(shared.ptr().add(r * rb), rb) };
        quantize_row(t, &x[r * n_in..(r + 1) * n_in], dst);
    });
}

/// The shape and alignment checks of `name` (`matmul`, `matmul_x8`: the same bytes in either
/// layout) before the C kernels read the buffers; returns the activations' row bytes.
#[allow(clippy::too_many_arguments)]
fn check_product(
    name: &str,
    t: TensorType,
    w: &[u8],
    n_in: usize,
    n_out: usize,
    a: &[u8],
    n_rows: usize,
    out: &[f32],
) -> usize {
    let a_type = t.vec_dot_type();
    let a_rb = row_bytes(a_type, n_in);
    assert_eq!(
        w.len(),
        n_out * row_bytes(t, n_in),
        "{name}: {t} weights for [{n_out}][{n_in}]"
    );
    assert_eq!(
        a.len(),
        n_rows * a_rb,
        "{name}: {a_type} activations for [{n_rows}][{n_in}]"
    );
    assert_eq!(
        out.len(),
        n_rows * n_out,
        "{name}: output for [{n_rows}][{n_out}]"
    );
    // The message is built only on failure: this runs for every product of every step.
    assert!(
        is_aligned(t, w),
        "{name} weights: a {t} row must be {}-byte aligned",
        block_align(t)
    );
    assert!(
        is_aligned(a_type, a),
        "{name} activations: a {a_type} row must be {}-byte aligned",
        block_align(a_type)
    );
    a_rb
}

/// `out[r][o] = vec_dot(w row o, a row r)`: `w` is `[n_out]` rows of `n_in` elements of `t`, `a`
/// is `[n_rows]` rows of `t.vec_dot_type()` (from `quantize_rows`), `out` is `[n_rows][n_out]`.
/// Chunks of output columns run in parallel; each element is bit-identical to `vec_dot`, whatever
/// `n_rows` and the thread count.
pub fn matmul(
    t: TensorType,
    w: &[u8],
    n_in: usize,
    n_out: usize,
    a: &[u8],
    n_rows: usize,
    out: &mut [f32],
) {
    let p = Product {
        t,
        w,
        interleaved: false,
        n_in,
        n_out,
        a,
        n_rows,
        out,
    };
    matmuls(&mut [p]);
}

/// One matrix product for [`matmuls`]: `out[r][o] = vec_dot(w row o, a row r)` with `w` as
/// [`matmul`] reads it, or as [`matmul_x8`] does when `interleaved`.
pub struct Product<'a> {
    pub t: TensorType,
    pub w: &'a [u8],
    pub interleaved: bool,
    pub n_in: usize,
    pub n_out: usize,
    pub a: &'a [u8],
    pub n_rows: usize,
    pub out: &'a mut [f32],
}

/// Several products (q, k and v of one input; gate and up) in one parallel call: their column
/// chunks are one list of tasks, so the threads meet once instead of once per product. Each
/// element is computed exactly as the product alone computes it ([`matmul`], [`matmul_x8`]).
pub fn matmuls(products: &mut [Product<'_>]) {
    // (first task, columns per task, w row bytes, a row bytes, out) of each product.
    let mut plan = Vec::with_capacity(products.len());
    let mut n_tasks = 0;
    for p in products.iter_mut() {
        let name = if p.interleaved { "matmul_x8" } else { "matmul" };
        if p.interleaved {
            assert!(has_x8(p.t), "matmul_x8: {} has no interleaved layout", p.t);
            assert!(
                p.n_out.is_multiple_of(8),
                "matmul_x8: {} rows are not groups of 8",
                p.n_out
            );
        }
        let a_rb = check_product(name, p.t, p.w, p.n_in, p.n_out, p.a, p.n_rows, p.out);
        let cols = cols_per_task(p.n_out, p.n_rows);
        plan.push((
            n_tasks,
            cols,
            row_bytes(p.t, p.n_in),
            a_rb,
            SharedMut(p.out.as_mut_ptr()),
        ));
        n_tasks += p.n_out.div_ceil(cols);
    }
    let (products, plan) = (&*products, &plan);
    pool::for_each_task(n_tasks, &|task| {
        let k = plan.partition_point(|e| e.0 <= task) - 1;
        let (first, cols, w_rb, a_rb, out) = plan[k];
        let p = &products[k];
        let o_begin = (task - first) * cols;
        let o_end = (o_begin + cols).min(p.n_out);
        // SAFETY: w holds n_out rows of w_rb bytes (or their interleaved groups), a n_rows rows
        // of a_rb bytes and out n_rows * n_out floats (all checked above); cols is a multiple of
        // 8 and so is an interleaved n_out, so [o_begin, o_end) is whole groups; this task writes
        // only those columns of its product's out, which no other task touches (see SharedMut).
        let status = unsafe {
            if p.interleaved {
                bindings::el_matmul_x8(
                    type_id(p.t),
                    p.w.as_ptr().cast(),
                    p.a.as_ptr().cast(),
                    a_rb as i64,
                    out.ptr(),
                    p.n_out as i64,
                    p.n_in as i64,
                    p.n_rows as i64,
                    o_begin as i64,
                    o_end as i64,
                )
            } else {
                bindings::el_matmul(
                    type_id(p.t),
                    p.w.as_ptr().cast(),
                    w_rb as i64,
                    p.a.as_ptr().cast(),
                    a_rb as i64,
                    out.ptr(),
                    p.n_out as i64,
                    p.n_in as i64,
                    p.n_rows as i64,
                    o_begin as i64,
                    o_end as i64,
                )
            }
        };
        check_status(
            status,
            if p.interleaved {
                "el_matmul_x8"
            } else {
                "el_matmul"
            },
        );
    });
}

/// Whether `t` has an interleaved layout ([`repack_x8`], [`matmul_x8`]): Q4_1, Q8_0, Q4_K, Q5_K
/// and Q6_K.
pub fn has_x8(t: TensorType) -> bool {
    // SAFETY: a pure table lookup.
    unsafe { bindings::el_type_has_x8(type_id(t)) != 0 }
}

/// `w` (`[n_out]` rows of `n_in` elements of `t`, a type with [`has_x8`], `n_out` a multiple of
/// 8) copied into groups of eight rows with their blocks interleaved (`el_repack_x8`), the layout
/// [`matmul_x8`] reads: the same number of bytes.
pub fn repack_x8(t: TensorType, w: &[u8], n_in: usize, n_out: usize) -> Vec<u8> {
    let mut out = vec![0u8; w.len()];
    repack_x8_into(t, w, n_in, n_out, &mut out);
    out
}

/// [`repack_x8`] into `dst` (as many bytes as `w`). Rows `[8k, 8m)` of `w` become bytes
/// `[8k, 8m) * row_bytes` of the copy, so a matrix can be repacked a slice of rows at a time.
pub fn repack_x8_into(t: TensorType, w: &[u8], n_in: usize, n_out: usize, dst: &mut [u8]) {
    assert!(has_x8(t), "repack_x8: {t} has no interleaved layout");
    let rb = row_bytes(t, n_in);
    assert!(
        n_out.is_multiple_of(8),
        "repack_x8: {n_out} rows are not groups of 8"
    );
    assert_eq!(
        w.len(),
        n_out * rb,
        "repack_x8: {t} weights for [{n_out}][{n_in}]"
    );
    assert_eq!(
        dst.len(),
        w.len(),
        "repack_x8: the copy of [{n_out}][{n_in}]"
    );
    assert_aligned(t, w, "repack_x8 weights");
    // SAFETY: w holds n_out rows of n_in / block_size blocks and dst as many bytes (checked
    // above); the kernel writes exactly n_out / 8 * nb interleaved blocks of eight blocks each.
    let status = unsafe {
        bindings::el_repack_x8(
            type_id(t),
            w.as_ptr().cast(),
            n_out as i64,
            (n_in / t.block_size()) as i64,
            dst.as_mut_ptr().cast(),
        )
    };
    check_status(status, "el_repack_x8");
}

/// [`matmul`] of a `t` matrix from its interleaved copy `w8` (from [`repack_x8`]):
/// `out[r][o] = vec_dot(t row o, a row r)` for `a` `[n_rows]` rows of `t.vec_dot_type()`,
/// bit-identical to `matmul`. Chunks of output columns (whole groups of 8) run in parallel, as
/// `matmul`'s.
pub fn matmul_x8(
    t: TensorType,
    w8: &[u8],
    n_in: usize,
    n_out: usize,
    a: &[u8],
    n_rows: usize,
    out: &mut [f32],
) {
    let p = Product {
        t,
        w: w8,
        interleaved: true,
        n_in,
        n_out,
        a,
        n_rows,
        out,
    };
    matmuls(&mut [p]);
}

/// The statuses the C kernels return for a raw `type_id` and row length `n`, from dequantize,
/// quantize, vec_dot and matmul in that order: a probe of the kernels' own argument checks, for
/// tests.
#[doc(hidden)]
pub fn kernel_statuses(type_id: i32, n: usize) -> [i32; 4] {
    // A row of n elements of any type fits in n floats (4 bytes per element at most); 256 more
    // cover a block of slack. f32 storage is aligned for every block struct.
    let src = vec![0f32; n + 256];
    let mut dst = vec![0f32; n + 256];
    let mut out = 0.0f32;
    let rows: *const c_void = src.as_ptr().cast();
    let n = n as i64;
    // SAFETY: each kernel reads or writes at most one row of n elements of some type (plus a
    // block, were it wrong about n), and every buffer above is larger.
    unsafe {
        [
            bindings::el_dequantize_row(type_id, rows, dst.as_mut_ptr(), n),
            bindings::el_quantize_row(type_id, src.as_ptr(), dst.as_mut_ptr().cast(), n),
            bindings::el_vec_dot(type_id, n, rows, rows, &mut out),
            bindings::el_matmul(type_id, rows, 0, rows, 0, &mut out, 1, n, 1, 0, 1),
        ]
    }
}

//! Safe wrappers over the C kernels declared in `csrc/edge_kernels.h`.
//!
//! This module and its children hold all of edge-llm's `unsafe` FFI. Every wrapper checks the
//! lengths of the slices it is given against the shapes the kernel will touch, so a caller can
//! never make a kernel read or write out of bounds. `quant` covers the tensor types (dequantize,
//! quantize, dot products, matrix products); `ops` the row operations, the KV write and attention;
//! `isa` which instruction set (scalar references or SIMD variants) the kernels run.
//!
//! The threaded wrappers (matmul, quantize_rows, paged_attention) split their work over rayon's
//! global pool. Called from a thread outside the pool, each call hands its work over and waits
//! (about 10 us on a 2-core machine, hundreds of times per forward step); [`in_pool`] runs a whole
//! step on a pool thread instead, where each split costs well under a microsecond.

#[allow(non_camel_case_types, non_upper_case_globals, dead_code, clippy::all)]
mod bindings;
mod isa;
mod ops;
mod quant;

pub use bindings::EL_MAX_HEAD_DIM;
pub use isa::*;
pub use ops::*;
pub use quant::*;

/// Runs `f` on a thread of rayon's global pool (the calling thread waits), so that the kernels it
/// calls split their work without a cross-thread hand-off each. Already on a pool thread, `f`
/// runs in place.
pub fn in_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    rayon::scope(|_| f())
}

//! Safe wrappers over the C kernels declared in `csrc/edge_kernels.h`.
//!
//! This module and its children hold all of edge-llm's `unsafe` FFI. Every wrapper checks the
//! lengths of the slices it is given against the shapes the kernel will touch, so a caller can
//! never make a kernel read or write out of bounds. `quant` covers the tensor types (dequantize,
//! quantize, dot products, matrix products); `ops` the row operations and the KV write;
//! `attention` paged attention;
//! `isa` which instruction set (scalar references or SIMD variants) the kernels run.
//!
//! The threaded wrappers (matmul, quantize_rows, paged_attention) split their work over the
//! kernels' own pool (`pool`): the calling thread plus workers that spin briefly between jobs,
//! so each of the hundreds of splits of a forward step costs well under a microsecond. The row
//! operations of large batches (RMSNorm, RoPE, the gated activations, adds) split by runs of
//! rows the same way (`rows`).

mod attention;
#[allow(non_camel_case_types, non_upper_case_globals, dead_code, clippy::all)]
mod bindings;
mod isa;
mod kv_type;
mod ops;
mod pool;
mod quant;
pub mod recurrent;
pub mod rows;
pub mod ssm;
pub mod tensor_type;

pub use attention::*;
pub use bindings::EL_MAX_HEAD_DIM;
pub use isa::*;
pub use kv_type::*;
pub use ops::*;
pub use pool::{init_threads, num_threads, serial};
pub use quant::*;
pub use recurrent::*;

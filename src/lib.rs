//! edge-llm: a Rust inference engine for GGUF language models on edge machines.
//!
//! Layers only look down:
//! - the faces (`cli`: `run`, `run --jsonl`, `chat`, `bench`; `server`: `serve`), siblings that
//!   never import each other, share `flags` (the flags every face takes) and `api` (a request
//!   body read by one set of rules into an engine request), send requests to the engine and read
//!   token events back;
//! - the engine (`engine`: sequences, block manager, scheduler, the one thread that steps) turns
//!   scheduled sequences into a flat `model::Batch` and runs it on a `device::Executor`;
//! - the model (`gguf` reader, `tokenizer`, `model`: config, weights, the `Backend` trait and the
//!   ONE layer loop over it, `model::forward`) runs on a backend: `model::Cpu` (the `kernels`,
//!   wrapping the C code in `csrc/`, and the paged `kv_cache`) or, with the `cuda` feature,
//!   `cuda::CudaBackend` (the kernels in `csrc/cuda/` on a GPU, or on their CPU emulator in tests).
//!
//! A new model family or option is an edit to `model::config`, `model::weights` and
//! `model::forward`; a new device is a new `Backend`.

pub mod api;
pub mod chat_template;
pub mod cli;
pub mod constraint;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;
pub mod engine;
pub mod flags;
pub mod fuzz;
pub mod gguf;
pub mod kernels;
pub mod model;
pub mod scoring;
pub mod server;
pub mod tokenizer;

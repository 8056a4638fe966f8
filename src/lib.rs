//! edge-llm: a Rust inference engine for GGUF language models on edge machines.
//!
//! Layers only look down: the faces (`cli`: `run`, `run --jsonl`, `chat`, `bench`; `server`:
//! `serve`), siblings that never import each other, share `flags` (the flags every face takes)
//! and `api` (a request body read by one set of rules into an engine request); they use the
//! engine (`engine`: one thread batching every sequence over the paged KV cache); the model (GGUF
//! reader, weights, forward pass) uses the kernels; the kernels wrap the C code in `csrc/`.

pub mod api;
pub mod chat_template;
pub mod cli;
pub mod constraint;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;
pub mod flags;
pub mod engine;
pub mod fuzz_entry;
pub mod generate;
pub mod gguf;
pub mod kernels;
pub mod kv_cache;
pub mod kv_events;
pub mod memory;
pub mod model;
pub mod perplexity;
pub mod sampler;
pub mod server;
pub mod tensor_type;
pub mod tokenizer;

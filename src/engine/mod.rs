//! The engine: one thread owns the model, the KV pool and the scheduler, and advances every
//! live sequence in each forward step (continuous batching). Front ends (`run`, `bench`, the
//! chat terminal, the HTTP server) hold a cloneable [`EngineHandle`]: they submit requests,
//! read a stream of [`Event`]s, and abort by id (dropping the stream aborts too). None of them
//! touches model state.
//!
//! Along the data's way:
//! - `request`: the request, its events, finish reasons, usage and submit errors;
//! - `handle`: `EngineHandle::start` and the client side (submit, streams, abort, metrics);
//! - `worker`: the engine thread's loop and its step;
//! - `sequence`, `block_manager`, `scheduler`: integer bookkeeping, tested without a model;
//!   the model's `Batch` builder turns scheduled sequences into one flat batch;
//! - `output`: each request's client-side state (sampling, n>1 forks, detokenizing, stop
//!   strings, logprobs), answering the worker with an outcome it applies to the scheduler;
//! - `sampler`, `masks` (constraint masks beside the forward pass);
//! - `encoder`: the worker of an encoder model (bert, nomic-bert), for embeddings and rerank;
//!   `embedder`: embeddings through either, for every face;
//! - `embeddings`: embedding requests' hidden rows, pooled and sent once their prompt is computed;
//! - `prompt_scores`: prompt log-probabilities (echo, lm-eval) and the kept scores of cached
//!   prompt blocks;
//! - `disk_cache`: the prefix cache's disk tier (blocks that survive restarts, its own I/O
//!   thread) and the parking of sequences waiting for its loads;
//! - `speculative`: proposals (prompt lookup, a draft model) and their exact verification;
//! - `kv_events`: prefix-cache changes for routers, queued without ever blocking the engine;
//! - `step_time`: what a step costs, learnt from measured steps, and the cap on a step's
//!   prefill while sequences decode (`--max-step-ms`);
//! - `config`, `metrics`, `memory`: sizes and their defaults, counters, the memory check.

pub mod batch_builder;
pub mod block_manager;
mod config;
pub mod disk_cache;
mod embedder;
mod embeddings;
pub mod encoder;
mod handle;
pub mod kv_events;
mod least_squares;
mod masks;
pub mod memory;
pub mod metrics;
mod output;
mod pins;
mod prompt_scores;
mod request;
mod rows;
pub mod sampler;
pub mod scheduler;
pub mod sequence;
pub mod speculative;
pub mod state_slots;
pub mod step_time;
mod worker;

pub use crate::model::Pooling;
pub use config::EngineConfig;
pub use embedder::{Embedder, Embedding};
pub use encoder::EncoderHandle;
pub use handle::{EngineHandle, EngineParts, RequestStream};
pub use metrics::{Metrics, SequenceInfo, TenantMetrics};
pub use request::{Event, FinishReason, Request, SubmitError, TokenLogprobs, Usage};
pub use speculative::SpecConfig;

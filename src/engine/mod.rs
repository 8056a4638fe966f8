//! The engine: one thread owns the model, the KV pool and the scheduler, and advances every
//! live sequence in each forward step (continuous batching). Front ends (`run`, `bench`, the
//! chat terminal, the HTTP server) hold a cloneable [`EngineHandle`]: they submit requests,
//! read a stream of [`Event`]s, and abort by id (dropping the stream aborts too). None of them
//! touches model state.
//!
//! - `sequence`, `block_manager`, `scheduler`: integer bookkeeping, tested without a model.
//! - `batch_builder`: the one bridge from scheduled sequences to the model's flat batch.
//! - `worker`: the loop that runs steps, samples, and reports to clients.
//! - `kv_events`: prefix-cache changes for routers, queued without ever blocking the engine.
//! - `step_time`: what a step costs, learnt from measured steps, and the time cap on a step's
//!   prefill while sequences decode (`--max-step-ms`).
//! - `disk_cache`: the prefix cache's disk tier (blocks that survive restarts), with its own
//!   I/O thread.

pub mod batch_builder;
pub mod block_manager;
pub mod disk_cache;
pub mod kv_events;
mod least_squares;
mod masks;
pub mod memory;
pub mod metrics;
pub mod sampler;
pub mod scheduler;
pub mod sequence;
pub mod speculative;
pub mod step_time;
mod worker;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use anyhow::{bail, Context, Result};
use tokio::sync::mpsc as events;

pub use metrics::Metrics;
pub use speculative::SpecConfig;

use crate::constraint::Grammars;
use crate::device::Executor;
use crate::engine::sampler::SamplingParams;
use crate::model::kv_cache::KvCache;
use crate::model::Model;

/// Sizes fixed at start-up.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Tokens per KV block.
    pub block_size: usize,
    /// Blocks in the KV pool.
    pub num_blocks: usize,
    /// Most tokens one sequence may hold (prompt and generated).
    pub max_seq_len: usize,
    /// Most tokens one step runs (chunked prefill cuts prompts to fit).
    pub max_batched_tokens: usize,
    /// Most sequences running at once.
    pub max_seqs: usize,
    /// Most requests waiting or running; more are refused.
    pub max_queue: usize,
    /// While any sequence decodes, a step's prefill is cut so the step takes about this long
    /// (`--max-step-ms`); None: prompts fill the token budget.
    pub max_step_ms: Option<u64>,
}

impl EngineConfig {
    /// A pool sized from a memory budget in MiB, or else from `ctx_size * parallel` tokens.
    pub fn sized(
        model: &Model,
        block_size: usize,
        kv_mem_mib: Option<usize>,
        ctx_size: usize,
        parallel: usize,
    ) -> Result<Self> {
        if block_size == 0 || block_size > 1024 {
            bail!("--block-size must be between 1 and 1024, got {block_size}");
        }
        if ctx_size < 2 || parallel == 0 {
            bail!("--ctx-size must be at least 2 and --parallel at least 1");
        }
        let per_block = KvCache::bytes_per_block(&model.config, block_size);
        let num_blocks = match kv_mem_mib {
            Some(mib) => {
                mib.checked_mul(1 << 20).with_context(|| {
                    format!("--kv-mem {mib} MiB is more memory than can be addressed")
                })? / per_block
            }
            None => ctx_size
                .div_ceil(block_size)
                .checked_mul(parallel)
                .with_context(|| {
                    format!("--ctx-size {ctx_size} times --parallel {parallel} is too large")
                })?,
        };
        if num_blocks * block_size < ctx_size.min(2 * block_size) {
            bail!("the KV memory budget holds {} blocks of {block_size} tokens: too small for one sequence", num_blocks);
        }
        let max_seq_len = ctx_size.min(num_blocks * block_size);
        Ok(EngineConfig {
            block_size,
            num_blocks,
            max_seq_len,
            max_batched_tokens: 512,
            max_seqs: 256,
            max_queue: 1024,
            max_step_ms: Some(step_time::DEFAULT_MAX_STEP_MS),
        })
    }

    pub fn kv_bytes(&self, model: &Model) -> usize {
        self.num_blocks * KvCache::bytes_per_block(&model.config, self.block_size)
    }

    /// What this engine will hold in host memory: the KV pool, the weights and an estimate of
    /// one step's activations and logits (for `memory::admit`).
    pub fn footprint(&self, model: &Model) -> crate::engine::memory::Footprint {
        let c = &model.config;
        let per_token = 4 * c.n_embd + 3 * c.n_ff + c.q_dim() + 2 * c.kv_dim();
        let rows = self.max_batched_tokens.min(self.max_seqs) as u64;
        let scratch =
            (self.max_batched_tokens * per_token * 4) as u64 + rows * c.vocab_size as u64 * 4;
        crate::engine::memory::Footprint {
            kv: (self.num_blocks as u64)
                .saturating_mul(KvCache::bytes_per_block(c, self.block_size) as u64),
            weights: model.file.file_bytes(),
            scratch,
        }
    }
}

/// One generation request.
#[derive(Clone, Debug)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    /// Most tokens to generate (the context may end it sooner).
    pub max_tokens: usize,
    /// Completions to produce from the one prompt (copy-on-write forks after the prompt).
    pub n: usize,
    /// Strings that end generation; they are not part of the output.
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    /// Report the sampled token's log-probability and this many top alternatives.
    pub logprobs: Option<usize>,
    /// Whether the engine may speculate for this request when speculation is on (it never
    /// changes the output; off only to compare).
    pub speculate: bool,
    /// Salts the prompt's prefix-cache blocks (a tenant's API key): requests with another key
    /// never reuse them. None shares the one cache.
    pub cache_key: Option<u64>,
    /// Compute the prompt and pin its full blocks (never evicted) instead of generating: the
    /// request finishes with no tokens.
    pub pin: bool,
}

impl Request {
    pub fn new(prompt: Vec<u32>, sampling: SamplingParams, max_tokens: usize) -> Self {
        Request {
            prompt,
            sampling,
            max_tokens,
            n: 1,
            stop: Vec::new(),
            ignore_eos: false,
            logprobs: None,
            speculate: true,
            cache_key: None,
            pin: false,
        }
    }
}

/// Why a completion ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens` or the context length.
    Length,
    /// Aborted by the client.
    Abort,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// Log-probabilities of one sampled token.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    pub logprob: f32,
    /// The most likely tokens and their log-probabilities, best first.
    pub top: Vec<(u32, f32)>,
}

/// Token counts of one finished completion.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
    /// Of those, the ones loaded from the disk tier for this request, and the ones held by
    /// pinned prompts (the rest were in memory).
    pub cached_disk_tokens: usize,
    pub cached_pinned_tokens: usize,
    /// Time from submission to the first token.
    pub ttft_ms: u64,
}

/// What a client hears about its request. `index` is the completion (0..n).
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A sampled token and the text it completes (may be empty while UTF-8 or a possible
    /// stop string is incomplete).
    Token {
        index: usize,
        token: u32,
        text: String,
        logprobs: Option<TokenLogprobs>,
    },
    /// Completion `index` ended; its last text is flushed in `text`.
    Finished {
        index: usize,
        reason: FinishReason,
        text: String,
        usage: Usage,
    },
    /// The request failed; no more events follow.
    Error(String),
}

/// Why a request was not accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {prompt} tokens, but the context holds {max} (prompt and completion together)")]
    PromptTooLong { prompt: usize, max: usize },
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("too many requests: {0} are already queued")]
    QueueFull(usize),
    #[error("the engine has stopped")]
    Stopped,
}

enum Command {
    Submit {
        id: u64,
        request: Request,
        events: events::UnboundedSender<Event>,
    },
    Abort(u64),
}

/// The client side of the engine; cheap to clone and to share between threads.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Command>,
    next_id: Arc<AtomicU64>,
    /// Requests submitted and not yet finished, for queue limits.
    in_flight: Arc<AtomicU64>,
    /// The engine's counters as of its last step or command.
    metrics: Arc<Mutex<Metrics>>,
    /// The disk tier's counters, read live (its thread writes between steps).
    disk_stats: Option<disk_cache::DiskStatsHandle>,
    pub config: Arc<EngineConfig>,
    pub model: Arc<Model>,
    /// Compiles and caches the constraints of requests for this model.
    pub grammars: Arc<Grammars>,
}

/// The events of one request. Dropping it before the request finished aborts the request.
pub struct RequestStream {
    pub id: u64,
    rx: events::UnboundedReceiver<Event>,
    remaining: usize,
    handle: EngineHandle,
}

impl RequestStream {
    /// The next event (blocking), or None once every completion has finished.
    pub fn next_blocking(&mut self) -> Option<Event> {
        if self.remaining == 0 {
            return None;
        }
        let e = self.rx.blocking_recv();
        self.track(e)
    }

    /// The next event, or None once every completion has finished.
    pub async fn next(&mut self) -> Option<Event> {
        if self.remaining == 0 {
            return None;
        }
        let e = self.rx.recv().await;
        self.track(e)
    }

    /// The next event if one is ready now.
    pub fn try_next(&mut self) -> Option<Event> {
        if self.remaining == 0 {
            return None;
        }
        let e = self.rx.try_recv().ok();
        e.and_then(|e| self.track(Some(e)))
    }

    fn track(&mut self, e: Option<Event>) -> Option<Event> {
        match &e {
            Some(Event::Finished { .. }) => self.remaining -= 1,
            Some(Event::Error(_)) | None => self.remaining = 0,
            _ => {}
        }
        e
    }

    pub fn is_done(&self) -> bool {
        self.remaining == 0
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if self.remaining > 0 {
            self.handle.abort(self.id);
        }
    }
}

impl EngineHandle {
    /// Starts the engine thread on the CPU; it owns `model`'s KV pool and scheduler from now on.
    pub fn start(model: Arc<Model>, config: EngineConfig) -> Result<EngineHandle> {
        let exec = Executor::cpu(&model, config.block_size, config.num_blocks);
        Self::start_with(model, config, exec)
    }

    /// Starts the engine thread with `exec` (made for `config`'s pool: see [`Executor::new`])
    /// running its forward passes.
    pub fn start_with(
        model: Arc<Model>,
        config: EngineConfig,
        exec: Executor,
    ) -> Result<EngineHandle> {
        Self::start_with_events(model, config, exec, None)
    }

    /// As [`EngineHandle::start_with`], and the prefix cache's changes go to `kv_events`
    /// (`AllBlocksCleared` first).
    pub fn start_with_events(
        model: Arc<Model>,
        config: EngineConfig,
        exec: Executor,
        kv_events: Option<kv_events::KvEventSink>,
    ) -> Result<EngineHandle> {
        Self::start_full(model, config, exec, kv_events, SpecConfig::default(), None)
    }

    /// Starts the engine on the CPU with speculative decoding as `spec` says.
    pub fn start_with_spec(
        model: Arc<Model>,
        config: EngineConfig,
        spec: SpecConfig,
    ) -> Result<EngineHandle> {
        let exec = Executor::cpu(&model, config.block_size, config.num_blocks);
        Self::start_full(model, config, exec, None, spec, None)
    }

    /// As [`EngineHandle::start_with_events`], with the prefix cache's disk tier in `disk`
    /// (CPU pools only; on a GPU it is left off with a warning).
    pub fn start_with_cache(
        model: Arc<Model>,
        config: EngineConfig,
        exec: Executor,
        kv_events: Option<kv_events::KvEventSink>,
        disk: Option<disk_cache::DiskCacheConfig>,
    ) -> Result<EngineHandle> {
        Self::start_full(model, config, exec, kv_events, SpecConfig::default(), disk)
    }

    /// The engine with every option: KV events, speculative decoding as `spec` says, and the
    /// prefix cache's disk tier in `disk`.
    pub fn start_full(
        model: Arc<Model>,
        config: EngineConfig,
        exec: Executor,
        kv_events: Option<kv_events::KvEventSink>,
        spec: SpecConfig,
        disk: Option<disk_cache::DiskCacheConfig>,
    ) -> Result<EngineHandle> {
        spec.validate().map_err(anyhow::Error::msg)?;
        if exec.block_size() != config.block_size {
            bail!(
                "the executor's KV blocks hold {} tokens, the engine's {}",
                exec.block_size(),
                config.block_size
            );
        }
        let (tx, rx) = mpsc::channel();
        let in_flight = Arc::new(AtomicU64::new(0));
        let config = Arc::new(config);
        let metrics = Arc::new(Mutex::new(Metrics::default()));
        let speculator = speculative::Speculator::start(
            spec,
            &model,
            exec.device(),
            config.block_size,
            config.max_batched_tokens,
        )?;
        let worker = worker::Worker::new(
            model.clone(),
            (*config).clone(),
            exec,
            worker::SharedWithHandle {
                in_flight: in_flight.clone(),
                metrics: metrics.clone(),
            },
            kv_events,
            speculator,
            disk,
        );
        let disk_stats = worker.disk_stats();
        std::thread::Builder::new()
            .name("edge-llm-engine".into())
            .spawn(move || worker.run(rx))?;
        Ok(EngineHandle {
            tx,
            next_id: Arc::new(AtomicU64::new(1)),
            in_flight,
            metrics,
            disk_stats,
            config,
            grammars: Arc::new(Grammars::new(model.clone())),
            model,
        })
    }

    /// Checks and queues a request; its events arrive on the returned stream.
    pub fn submit(&self, request: Request) -> Result<RequestStream, SubmitError> {
        if request.prompt.is_empty() {
            return Err(SubmitError::EmptyPrompt);
        }
        if request.prompt.len() >= self.config.max_seq_len {
            return Err(SubmitError::PromptTooLong {
                prompt: request.prompt.len(),
                max: self.config.max_seq_len,
            });
        }
        if let Some(&bad) = request
            .prompt
            .iter()
            .find(|&&t| t as usize >= self.model.config.vocab_size)
        {
            return Err(SubmitError::Invalid(format!(
                "token id {bad} is outside the vocabulary"
            )));
        }
        if request.max_tokens == 0 {
            return Err(SubmitError::Invalid("max_tokens must be at least 1".into()));
        }
        if request.n == 0 || request.n > 16 {
            return Err(SubmitError::Invalid(format!(
                "n must be between 1 and 16, got {}",
                request.n
            )));
        }
        if request.logprobs.is_some_and(|k| k > 20) {
            return Err(SubmitError::Invalid(
                "top_logprobs must be at most 20".into(),
            ));
        }
        request.sampling.validate().map_err(SubmitError::Invalid)?;
        let queued = self.in_flight.fetch_add(1, Ordering::SeqCst);
        if queued >= self.config.max_queue as u64 {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            return Err(SubmitError::QueueFull(queued as usize));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (etx, erx) = events::unbounded_channel();
        let n = request.n;
        if self
            .tx
            .send(Command::Submit {
                id,
                request,
                events: etx,
            })
            .is_err()
        {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            return Err(SubmitError::Stopped);
        }
        Ok(RequestStream {
            id,
            rx: erx,
            remaining: n,
            handle: self.clone(),
        })
    }

    /// Aborts a request: its sequences end and their blocks are freed at once.
    pub fn abort(&self, id: u64) {
        let _ = self.tx.send(Command::Abort(id));
    }

    /// The engine's counters as of its last step or command. Never waits for a step.
    pub fn metrics(&self) -> Option<Metrics> {
        let mut m = self.metrics.lock().ok().map(|m| m.clone())?;
        m.disk_cache = self.disk_stats.as_ref().map(|d| d.stats());
        Some(m)
    }

    /// Requests submitted and not finished.
    pub fn num_in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::SeqCst)
    }
}

//! The client side of the engine: [`EngineHandle::start`] (the one way to start it, with
//! [`EngineParts`]), submitting requests, reading their [`RequestStream`]s, aborting, and what
//! the faces may know of the model (its tokenizer, its config, its chat template).

use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use anyhow::{bail, Result};
use tokio::sync::mpsc as events;

use super::disk_cache::{self, DiskCacheConfig};
use super::kv_events::KvEventSink;
use super::memory;
use super::speculative::{SpecConfig, Speculator};
use super::worker::{SharedWithHandle, Worker};
use super::{EngineConfig, Event, Metrics, Request, SubmitError};
use crate::chat_template::ChatTemplate;
use crate::constraint::Grammars;
use crate::device::{Device, Executor};
use crate::model::{Model, ModelConfig};
use crate::tokenizer::Tokenizer;

/// What [`EngineHandle::start`] takes besides the model and its sizes. The default: the CPU,
/// no memory check, no KV events, no speculation, no disk tier.
pub struct EngineParts {
    /// The executor to run on (tests: the CUDA emulator); None makes one on `device`.
    pub executor: Option<Executor>,
    /// Where to make the executor when none is given (`--device`).
    pub device: Device,
    /// Check the pool, weights and step buffers against the machine's memory first, naming
    /// this flag in the refusal; None skips the check.
    pub memory_flag: Option<&'static str>,
    /// The weights may be paged in from the file (`--mmap-anyway`): the memory check leaves
    /// them out of resident memory.
    pub weights_paged: bool,
    /// Where the prefix cache's changes go (`serve --kv-events`); `AllBlocksCleared` first.
    pub kv_events: Option<KvEventSink>,
    /// Speculative decoding (off by default).
    pub spec: SpecConfig,
    /// The prefix cache's disk tier (CPU pools only; on a GPU it is left off with a warning).
    pub disk: Option<DiskCacheConfig>,
    /// Reuse no cached prompt block (`--no-prefix-cache`: every prompt is computed whole).
    pub no_prefix_cache: bool,
    /// A model with recurrent layers: besides at each prompt's last full block, snapshot the
    /// state every this many blocks of a prompt (`--state-snapshot-every`; 0: only there).
    pub state_snapshot_every: usize,
}

impl Default for EngineParts {
    fn default() -> Self {
        EngineParts {
            executor: None,
            device: Device::Cpu,
            memory_flag: None,
            weights_paged: false,
            kv_events: None,
            spec: SpecConfig::default(),
            disk: None,
            no_prefix_cache: false,
            state_snapshot_every: super::state_slots::DEFAULT_SNAPSHOT_EVERY,
        }
    }
}

pub(super) enum Command {
    Submit {
        id: u64,
        request: Request,
        events: events::UnboundedSender<Event>,
    },
    Abort(u64),
    /// Releases pin `pin` (the id of the request that pinned); says whether there was one.
    Unpin {
        pin: u64,
        done: mpsc::Sender<bool>,
    },
}

/// The client side of the engine; cheap to clone and to share between threads.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Command>,
    next_id: Arc<AtomicU64>,
    /// Requests submitted and not yet finished, for queue limits.
    in_flight: Arc<AtomicU64>,
    /// The most tokens a sequence can hold now: the context, or less while pinned prompts hold
    /// part of the pool (the worker updates it).
    max_seq_len: Arc<AtomicUsize>,
    /// The engine's counters as of its last step or command.
    metrics: Arc<Mutex<Metrics>>,
    /// The disk tier's counters, read live (its thread writes between steps).
    disk_stats: Option<disk_cache::DiskStatsHandle>,
    pub config: Arc<EngineConfig>,
    model: Arc<Model>,
    /// The device the forward pass runs on, as a line for logs.
    device: String,
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

/// What a model with recurrent layers cannot run with yet, refused at start-up in one line:
/// speculation (a recurrent state cannot roll back rejected proposals) and a pool with no state
/// slot.
fn check_recurrent(model: &Model, config: &EngineConfig, spec: &SpecConfig) -> Result<()> {
    let arch = &model.config.architecture;
    if spec
        .draft
        .as_ref()
        .is_some_and(|d| d.model.config.is_recurrent())
    {
        bail!("--spec draft: the draft model has recurrent layers, which cannot roll back rejected proposals");
    }
    if !model.config.is_recurrent() {
        return Ok(());
    }
    if spec.enabled {
        bail!("speculative decoding is not supported on '{arch}': its recurrent layers cannot roll back rejected proposals; use --spec off");
    }
    if config.num_state_slots == 0 {
        bail!("'{arch}' has recurrent layers, but the memory budget holds no state slot for them; raise --parallel");
    }
    Ok(())
}

impl EngineHandle {
    /// Bytes of the KV pool and of the recurrent state slots.
    pub fn kv_bytes(&self) -> usize {
        self.config.kv_bytes(&self.model)
    }

    /// Starts the engine thread on `model` with the sizes of `config` and the optional `parts`;
    /// the thread owns the model's KV pool and scheduler from now on. Without an executor in
    /// `parts`, one is made on `parts.device` for the config's pool, after checking that the
    /// machine has the memory (`parts.memory_flag` names the flag to lower when it does not).
    pub fn start(
        model: Arc<Model>,
        config: EngineConfig,
        parts: EngineParts,
    ) -> Result<EngineHandle> {
        let EngineParts {
            executor,
            device,
            memory_flag,
            weights_paged,
            kv_events,
            spec,
            disk,
            no_prefix_cache,
            state_snapshot_every,
        } = parts;
        spec.validate().map_err(anyhow::Error::msg)?;
        check_recurrent(&model, &config, &spec)?;
        let exec = match executor {
            Some(exec) => exec,
            None => {
                let device = crate::device::Placement {
                    device,
                    kv_types: config.kv_types,
                }
                .resolve()?
                .device;
                if let (Device::Cpu, Some(flag)) = (device, memory_flag) {
                    let mut footprint = config.footprint(&model);
                    footprint.weights_paged = weights_paged;
                    if let Some(draft) = &spec.draft {
                        // The draft's weights, KV pool and step buffers are held beside the target's.
                        let draft_config = EngineConfig {
                            num_blocks: draft.num_blocks,
                            ..config.clone()
                        };
                        footprint = footprint.plus(&draft_config.footprint(&draft.model));
                    }
                    memory::admit(&footprint, &memory::limits(), flag)?;
                }
                let placement = crate::device::Placement {
                    device,
                    kv_types: config.kv_types,
                };
                Executor::new(&model, placement, config.block_size, config.num_blocks)?
            }
        };
        let mut exec = exec;
        let pool_slots = super::state_slots::StateSlots::pool_slots(config.state_slots_for(&model));
        exec.set_state_slots(&model, pool_slots)?;
        if exec.block_size() != config.block_size {
            bail!(
                "the executor's KV blocks hold {} tokens, the engine's {}",
                exec.block_size(),
                config.block_size
            );
        }
        let (tx, rx) = mpsc::channel();
        let in_flight = Arc::new(AtomicU64::new(0));
        let max_seq_len = Arc::new(AtomicUsize::new(config.max_seq_len));
        let config = Arc::new(config);
        let metrics = Arc::new(Mutex::new(Metrics::default()));
        let device = exec.describe();
        let speculator = Speculator::start(
            spec,
            &model,
            crate::device::Placement {
                device: exec.device(),
                kv_types: config.kv_types,
            },
            config.block_size,
            config.max_batched_tokens,
        )?;
        let mut worker = Worker::new(
            model.clone(),
            (*config).clone(),
            exec,
            SharedWithHandle {
                in_flight: in_flight.clone(),
                max_seq_len: max_seq_len.clone(),
                metrics: metrics.clone(),
            },
            kv_events,
            speculator,
            disk,
        );
        let disk_stats = worker.disk_stats();
        worker.sched.prefix_cache = !no_prefix_cache;
        worker.sched.snapshot_every = state_snapshot_every;
        std::thread::Builder::new()
            .name("edge-llm-engine".into())
            .spawn(move || worker.run(rx))?;
        Ok(EngineHandle {
            tx,
            next_id: Arc::new(AtomicU64::new(1)),
            in_flight,
            max_seq_len,
            metrics,
            disk_stats,
            config,
            grammars: Arc::new(Grammars::new(model.clone())),
            model,
            device,
        })
    }

    /// The model's tokenizer (the faces encode prompts and decode tokens with it).
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.model.tokenizer
    }

    /// The model's hyperparameters (architecture, vocabulary, training context).
    pub fn model_config(&self) -> &ModelConfig {
        &self.model.config
    }

    /// The model's chat template, or `--chat-template FILE` when given.
    pub fn chat_template(&self, override_path: Option<&Path>) -> Result<ChatTemplate> {
        ChatTemplate::load(&self.model.file, &self.model.tokenizer, override_path)
    }

    /// The model's GGUF file.
    pub fn model_path(&self) -> &Path {
        self.model.file.path()
    }

    /// Where the forward pass runs, as a line for logs (`cpu`, or the GPU's name).
    pub fn device(&self) -> &str {
        &self.device
    }

    /// Checks and queues a request; its events arrive on the returned stream.
    pub fn submit(&self, request: Request) -> Result<RequestStream, SubmitError> {
        if request.prompt.is_empty() {
            return Err(SubmitError::EmptyPrompt);
        }
        let max_seq_len = self.max_seq_len();
        // An embedding needs no room after its prompt.
        let room = usize::from(request.embed.is_none());
        if request.prompt.len() + room > max_seq_len {
            return Err(SubmitError::PromptTooLong {
                prompt: request.prompt.len(),
                max: max_seq_len,
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
        if request.n == 0 || request.n > 16 {
            return Err(SubmitError::Invalid(format!(
                "n must be between 1 and 16, got {}",
                request.n
            )));
        }
        if [request.logprobs, request.prompt_logprobs]
            .iter()
            .flatten()
            .any(|&k| k > 20)
        {
            return Err(SubmitError::Invalid(
                "top_logprobs must be at most 20".into(),
            ));
        }
        if request.embed.is_some()
            && (request.n != 1 || request.pin || request.prompt_logprobs.is_some())
        {
            return Err(SubmitError::Invalid(
                "an embedding request has one completion, no pin and no prompt scores".into(),
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

    /// Releases the prompt pinned by request `pin` (its blocks become evictable again);
    /// false when no such pin exists. Waits for the engine (at most one step).
    pub fn unpin(&self, pin: u64) -> bool {
        let (done, answer) = mpsc::channel();
        if self.tx.send(Command::Unpin { pin, done }).is_err() {
            return false;
        }
        answer.recv().unwrap_or(false)
    }

    /// The engine's counters as of its last step or command. Never waits for a step.
    pub fn metrics(&self) -> Option<Metrics> {
        let mut m = self.metrics.lock().ok().map(|m| m.clone())?;
        m.disk_cache = self.disk_stats.as_ref().map(|d| d.stats());
        Some(m)
    }

    /// Requests submitted and not finished.
    /// The most tokens one sequence can hold now, prompt and completion together: the
    /// configured context (`config.max_seq_len`), or what the pool holds besides pinned prompts
    /// when that is less. Requests are admitted, and completions cut, against this.
    pub fn max_seq_len(&self) -> usize {
        self.max_seq_len.load(Ordering::SeqCst)
    }

    pub fn num_in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::SeqCst)
    }
}

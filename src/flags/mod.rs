//! The flags every face shares (`run`, `run --jsonl`, `chat`, `bench`, `perplexity`, `serve`):
//! which model to load (`ModelArgs`), the engine's sizes and device (`EngineArgs`, which also
//! starts the engine), and the compute threads (`ThreadArgs`). The faces (`cli`, `server`) are
//! siblings that both flatten these into their own flags; neither imports the other.

pub mod cache;
pub mod embedding;
pub mod kv_type;

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use crate::device::Device;
use crate::engine::speculative::DraftSetup;
use crate::engine::{memory, EngineConfig, EngineHandle, EngineParts};
use crate::model::Model;

/// File name of the default model in `models/`.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Which model to load.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// GGUF model file [default: models/SmolLM2-135M-Instruct.Q4_1.gguf]; `serve` takes it
    /// more than once to serve several models, loaded on demand
    #[arg(short = 'm', long = "model", action = clap::ArgAction::Append)]
    pub model: Vec<PathBuf>,
    /// Lock the model's weights in RAM (mlock), so the OS never pages them out
    #[arg(long = "mlock")]
    pub mlock: bool,
}

/// Sizes of the engine: the KV pool and the step budget.
#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// KV cache memory in MiB [default: enough for --ctx-size tokens times --parallel]
    #[arg(long = "kv-mem")]
    pub kv_mem: Option<usize>,
    /// Most tokens one sequence holds [default: the model's training context, halved until
    /// --parallel sequences of it fit in memory (not below 4096)]
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,
    /// Sequences the KV pool is sized for when --kv-mem is not given.
    #[arg(long = "parallel", default_value_t = EngineConfig::DEFAULT_PARALLEL)]
    pub parallel: usize,
    /// Tokens per KV block.
    #[arg(long = "block-size", default_value_t = EngineConfig::DEFAULT_BLOCK_SIZE)]
    pub block_size: usize,
    #[command(flatten)]
    pub kv_types: kv_type::KvTypeArgs,
    /// Most tokens one forward step runs (prompts are cut into chunks to fit).
    #[arg(long = "max-batched-tokens", default_value_t = EngineConfig::DEFAULT_MAX_BATCHED_TOKENS)]
    pub max_batched_tokens: usize,
    /// Most requests queued or running; more are refused.
    #[arg(long = "max-queue", default_value_t = EngineConfig::DEFAULT_MAX_QUEUE)]
    pub max_queue: usize,
    /// While any session decodes, cut each step's prefill so the step (the gap between two
    /// streamed tokens) takes about MS milliseconds, from step times the engine measures; 0
    /// turns the cap off. A prefill with nothing decoding beside it is never capped.
    #[arg(
        long = "max-step-ms",
        value_name = "MS",
        default_value_t = EngineConfig::DEFAULT_MAX_STEP_MS
    )]
    pub max_step_ms: u64,
    /// Most milliseconds a step waits, after its forward pass, for a constrained row's token
    /// mask (computed beside the pass): a row still computing then ends its own request with
    /// an error (`constraint_failed`) instead of holding the step of every other session.
    #[arg(
        long = "mask-budget-ms",
        value_name = "MS",
        default_value_t = EngineConfig::DEFAULT_MASK_BUDGET_MS,
        value_parser = clap::value_parser!(u64).range(1..=600_000)
    )]
    pub mask_budget_ms: u64,
    /// Memory for compiled grammars (JSON schemas, regexes, Lark, tool calls) kept for reuse,
    /// in MiB, charged by an estimate from each grammar's size; the least recently used go
    /// first. 0 keeps none.
    #[arg(long = "grammar-cache-mib", value_name = "MIB", default_value_t = 128)]
    pub grammar_cache_mib: usize,
    /// Where the model runs: cuda when built with it and a GPU is usable (auto), or cpu, or cuda.
    #[arg(long = "device", value_enum, default_value_t = Device::Auto)]
    pub device: Device,
    /// Speculative decoding: ngram (prompt lookup: proposals from the sequence's own prompt and
    /// output, checked in the batched step), draft (a small model of the same vocabulary,
    /// --draft-model, proposes) or off. It never changes the output.
    #[arg(long = "spec", value_enum, default_value_t = SpecMode::Off)]
    pub spec: SpecMode,
    /// The draft model of --spec draft: a GGUF file with the target's vocabulary.
    #[arg(long = "draft-model", value_name = "FILE")]
    pub draft_model: Option<PathBuf>,
    /// KV memory of the draft model in MiB [default: as many tokens as the target's pool].
    #[arg(long = "draft-kv-mem", value_name = "MIB")]
    pub draft_kv_mem: Option<usize>,
    /// Most tokens proposed per sequence and step (speculative decoding).
    #[arg(long = "spec-max-tokens", default_value_t = 8)]
    pub spec_max_tokens: usize,
    /// N-gram sizes prompt lookup matches, MIN..MAX (longest first).
    #[arg(long = "spec-ngram", default_value = "2..4", value_name = "MIN..MAX")]
    pub spec_ngram: String,
    /// Always propose --spec-max-tokens when there is a match, instead of following acceptance
    /// and switching off when proposals do not pay.
    #[arg(long = "spec-fixed")]
    pub spec_fixed: bool,
    /// Start even when the model file is larger than the memory available: its weights are
    /// then paged in from disk as each step reads them, and decode slows to the disk's speed
    /// (a mixture of experts' unused experts page out first). Without it such a file is refused.
    #[arg(long = "mmap-anyway")]
    pub mmap_anyway: bool,
}

/// `--spec`: which proposer speculative decoding uses.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecMode {
    Off,
    Ngram,
    Draft,
}

impl EngineArgs {
    /// The speculative-decoding configuration the `--spec*` flags ask for.
    pub fn spec_config(&self) -> Result<crate::engine::SpecConfig> {
        let (min, max) = self
            .spec_ngram
            .split_once("..")
            .and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)))
            .with_context(|| {
                format!(
                    "--spec-ngram must look like 2..4 (MIN..MAX), got {:?}",
                    self.spec_ngram
                )
            })?;
        let spec = crate::engine::SpecConfig {
            enabled: self.spec != SpecMode::Off,
            max_tokens: self.spec_max_tokens,
            ngram_min: min,
            ngram_max: max,
            adaptive: !self.spec_fixed,
            draft: None,
        };
        spec.validate().map_err(anyhow::Error::msg)?;
        match (self.spec, &self.draft_model) {
            (SpecMode::Draft, None) => anyhow::bail!("--spec draft needs --draft-model FILE"),
            (SpecMode::Off | SpecMode::Ngram, Some(_)) => {
                anyhow::bail!("--draft-model is used only with --spec draft")
            }
            _ => {}
        }
        if self.draft_kv_mem.is_some() && self.spec != SpecMode::Draft {
            anyhow::bail!("--draft-kv-mem is used only with --spec draft");
        }
        Ok(spec)
    }

    /// Loads the draft model of `--spec draft` and sizes its KV pool (`--draft-kv-mem`, else
    /// the tokens of the target's pool, `config`).
    fn draft_setup(&self, config: &EngineConfig) -> Result<Option<DraftSetup>> {
        let Some(path) = self
            .draft_model
            .as_ref()
            .filter(|_| self.spec == SpecMode::Draft)
        else {
            return Ok(None);
        };
        let model = Model::load(path).context("--draft-model")?;
        config
            .kv_types
            .check(model.config.head_dim)
            .map_err(|e| anyhow::anyhow!("the draft model: {e}"))?;
        let per_block = crate::model::kv_cache::KvCache::bytes_per_block_as(
            config.kv_types,
            &model.config,
            config.block_size,
        );
        let num_blocks = match self.draft_kv_mem {
            Some(mib) => mib.saturating_mul(1 << 20) / per_block,
            None => config.num_blocks,
        };
        if num_blocks == 0 {
            anyhow::bail!(
                "--draft-kv-mem {} MiB holds no KV block of the draft ({per_block} bytes each)",
                self.draft_kv_mem.unwrap_or(0)
            );
        }
        Ok(Some(DraftSetup {
            model: std::sync::Arc::new(model),
            num_blocks,
        }))
    }

    /// The engine configuration for `model`.
    pub fn config(&self, model: &Model) -> Result<EngineConfig> {
        Ok(self.config_and_context(model)?.0)
    }

    /// The engine configuration for `model`, and how its context was chosen when `-c` was not
    /// given (for the start-up log).
    fn config_and_context(&self, model: &Model) -> Result<(EngineConfig, Option<String>)> {
        let kv_types = self.kv_types.kv_types();
        let sized = |ctx| {
            EngineConfig::sized(
                model,
                kv_types,
                self.block_size,
                self.kv_mem,
                ctx,
                self.parallel,
            )
        };
        let (mut config, note) = match self.ctx_size {
            Some(c) => (sized(c)?, None),
            None => {
                let (ctx, note) = default_context(model.config.n_ctx_train, |ctx| {
                    let config = sized(ctx)?;
                    let footprint = memory::Footprint {
                        weights_paged: self.mmap_anyway,
                        ..config.footprint(model)
                    };
                    let fits = memory::admit(&footprint, &memory::limits(), "").is_ok();
                    Ok(fits)
                })?;
                (sized(ctx)?, Some(note))
            }
        };
        if self.max_batched_tokens == 0 {
            anyhow::bail!("--max-batched-tokens must be at least 1");
        }
        if self.max_queue == 0 {
            anyhow::bail!("--max-queue must be at least 1");
        }
        config.max_batched_tokens = self.max_batched_tokens;
        config.max_queue = self.max_queue;
        config.max_step_ms = (self.max_step_ms > 0).then_some(self.max_step_ms);
        config.mask_budget_ms = self.mask_budget_ms;
        Ok((config, note))
    }

    /// Starts the engine thread on `model` and `--device` with `parts` (KV events, the disk
    /// tier; speculation, the device and the memory check come from these flags), logging the
    /// KV pool's size on a terminal (`verbose` logs it anywhere).
    pub fn start(&self, model: Model, verbose: bool, parts: EngineParts) -> Result<EngineHandle> {
        let (config, context_note) = self.config_and_context(&model)?;
        let mut spec = self.spec_config()?;
        spec.draft = self.draft_setup(&config)?;
        if let Some(ctx) = self.ctx_size.filter(|&c| c > model.config.n_ctx_train) {
            // As llama.cpp does: allowed, with a warning, for models that extrapolate.
            eprintln!(
                "warning: -c {ctx} is above the {} tokens this model was trained on; past them its output degrades",
                model.config.n_ctx_train
            );
        }
        let memory_flag = match &spec.draft {
            Some(_) if self.draft_kv_mem.is_some() => "--draft-kv-mem or --kv-mem",
            Some(_) => "-c/--ctx-size or --parallel (the draft's KV pool is sized as the target's)",
            None if self.kv_mem.is_some() => "--kv-mem",
            None => "-c/--ctx-size or --parallel",
        };
        let kv_bytes = config.kv_bytes(&model);
        let state_note = match config.state_slots_for(&model) {
            0 => String::new(),
            n => format!(
                ", {n} recurrent state slots and {n} snapshot slots ({:.1} MiB, {:.1} KiB each) in it",
                config.state_bytes(&model) as f64 / (1 << 20) as f64,
                crate::model::state_pool::StatePool::slot_bytes(&model.config) as f64 / 1024.0
            ),
        };
        let engine = EngineHandle::start(
            std::sync::Arc::new(model),
            config,
            EngineParts {
                device: self.device,
                memory_flag: Some(memory_flag),
                weights_paged: self.mmap_anyway,
                spec,
                ..parts
            },
        )?;
        engine
            .grammars
            .set_budget(self.grammar_cache_mib.saturating_mul(1 << 20));
        let config = &engine.config;
        if let Some(note) = context_note.filter(|_| verbose || std::io::stderr().is_terminal()) {
            eprintln!("context: {note}");
        }
        if verbose || std::io::stderr().is_terminal() {
            let tokens = config.num_blocks * config.block_size;
            eprintln!(
                "KV cache on {} ({}): {} blocks of {} tokens ({} tokens, {:.1} MiB{state_note}, {} sequences of {}); max {} tokens per sequence, {} per step",
                engine.device(),
                config.kv_types,
                config.num_blocks,
                config.block_size,
                tokens,
                kv_bytes as f64 / (1 << 20) as f64,
                tokens / config.max_seq_len.max(1),
                config.max_seq_len,
                config.max_seq_len,
                config.max_batched_tokens
            );
        }
        Ok(engine)
    }
}

/// Compute threads.
#[derive(Args, Debug, Clone)]
pub struct ThreadArgs {
    /// Threads for computation [default: physical cores]
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
}

impl ModelArgs {
    /// The model path: -m, or the default model in ./models or in the source tree's models/.
    pub fn path(&self) -> Result<PathBuf> {
        match self.model.as_slice() {
            [] => {}
            [p] => return Ok(p.clone()),
            several => anyhow::bail!(
                "-m is given {} times: only `serve` loads several models",
                several.len()
            ),
        }
        let candidates = [
            PathBuf::from("models").join(DEFAULT_MODEL_FILE),
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("models")
                .join(DEFAULT_MODEL_FILE),
        ];
        candidates
            .iter()
            .find(|p| p.is_file())
            .cloned()
            .with_context(|| format!("no -m given and the default model {DEFAULT_MODEL_FILE} is not in models/; run scripts/fetch-model.sh"))
    }

    /// Loads the model, with a spinner on a terminal and silence in a pipe.
    pub fn load(&self) -> Result<Model> {
        let path = self.path()?;
        let spinner = std::io::stderr().is_terminal().then(|| {
            let s = indicatif::ProgressBar::new_spinner();
            s.set_message(format!("loading {}", path.display()));
            s.enable_steady_tick(std::time::Duration::from_millis(100));
            s
        });
        let started = std::time::Instant::now();
        let model = Model::load(&path);
        if let Some(s) = spinner {
            match &model {
                Ok(m) => s.finish_with_message(format!(
                    "loaded {} ({}, {} layers, {} MB) in {:.2} s",
                    path.display(),
                    m.config.architecture,
                    m.config.num_layers,
                    m.file.file_bytes() / 1_000_000,
                    started.elapsed().as_secs_f64()
                )),
                Err(_) => s.finish_and_clear(),
            }
        }
        let model = model?;
        if self.mlock {
            // As llama.cpp does: a failed lock is a warning, the model still runs (paged).
            match model.file.lock_in_memory() {
                Ok(()) => eprintln!("locked {} MB of weights in RAM", model.file.file_bytes() / 1_000_000),
                Err(e) => eprintln!(
                    "warning: --mlock: could not lock {} MB in RAM ({e}); raise the limit with `ulimit -l` (RLIMIT_MEMLOCK) or run without --mlock",
                    model.file.file_bytes() / 1_000_000
                ),
            }
        }
        Ok(model)
    }
}

impl ThreadArgs {
    /// Sets up the global compute pool once.
    pub fn init(&self) -> Result<()> {
        let n = match self.threads {
            Some(0) => anyhow::bail!("--threads must be at least 1"),
            Some(n) => n,
            None => physical_cores(),
        };
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .context("starting the compute threads")?;
        crate::kernels::init_threads(n).map_err(anyhow::Error::msg)
    }
}

/// Physical cores (distinct core ids in /proc/cpuinfo), else the available parallelism.
pub fn physical_cores() -> usize {
    let logical = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
        return logical;
    };
    let mut cores = std::collections::HashSet::new();
    let mut physical = "";
    for line in info.lines() {
        let mut kv = line.splitn(2, ':').map(str::trim);
        match (kv.next(), kv.next()) {
            (Some("physical id"), Some(v)) => physical = v,
            (Some("core id"), Some(v)) => {
                cores.insert((physical.to_string(), v.to_string()));
            }
            _ => {}
        }
    }
    if cores.is_empty() {
        logical
    } else {
        cores.len().min(logical)
    }
}

/// The smallest context chosen by default when memory is short (unless the model was trained
/// on less).
const MIN_DEFAULT_CONTEXT: usize = 4096;

/// The context when `-c` is not given: the model's training context `trained`, halved while
/// `fits` says the engine sized for it would not fit in memory, down to
/// [`MIN_DEFAULT_CONTEXT`] (the memory check at start then refuses with its message). Also
/// says, for the log, what was chosen and why.
fn default_context(
    trained: usize,
    fits: impl Fn(usize) -> Result<bool>,
) -> Result<(usize, String)> {
    let floor = trained.clamp(2, MIN_DEFAULT_CONTEXT);
    let mut ctx = trained.max(2);
    while ctx > floor && !fits(ctx)? {
        ctx = (ctx / 2).max(floor);
    }
    let note = if ctx == trained {
        format!("{ctx} tokens (the model's training context; -c to change)")
    } else {
        format!(
            "{ctx} tokens (the model's training context of {trained} does not fit in memory with --parallel sequences; -c to change)"
        )
    };
    Ok((ctx, note))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_context_is_the_trained_one_halved_until_it_fits() {
        assert_eq!(default_context(32768, |_| Ok(true)).unwrap().0, 32768);
        assert_eq!(default_context(32768, |c| Ok(c <= 8192)).unwrap().0, 8192);
        // Never below 4096 (the memory check then says what to lower), nor above the trained.
        assert_eq!(default_context(32768, |_| Ok(false)).unwrap().0, 4096);
        assert_eq!(default_context(2048, |_| Ok(false)).unwrap().0, 2048);
        assert_eq!(default_context(40960, |c| Ok(c <= 6000)).unwrap().0, 5120);
    }
}

//! Flags of the prefix cache shared by `serve` and `chat`: the disk tier (`--cache-dir`,
//! `--cache-disk-mib`, `--no-disk-cache`) and pinned prompts (`--pin-prompt`), and the one
//! function that pins a prompt through the engine (start-up, `POST /v1/cache/pin`, `/pin`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::chat_template::{encode_prompt, ChatTemplate};
use crate::engine::disk_cache::{DiskCacheConfig, DEFAULT_DISK_MIB};
use crate::engine::sampler::SamplingParams;
use crate::engine::{EngineHandle, Event, Request};
use crate::tokenizer::Tokenizer;

#[derive(Args, Debug, Clone, Default)]
pub struct CacheArgs {
    /// Keep the prefix cache's blocks on disk under DIR, so they survive restarts
    /// [default: $XDG_CACHE_HOME/edge-llm, else ~/.cache/edge-llm]
    #[arg(long = "cache-dir", value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Most MiB the disk tier keeps (least recently used blocks are deleted past it)
    #[arg(long = "cache-disk-mib", default_value_t = DEFAULT_DISK_MIB)]
    pub cache_disk_mib: u64,
    /// Keep the prefix cache in memory only
    #[arg(long = "no-disk-cache", conflicts_with = "cache_dir")]
    pub no_disk_cache: bool,
    /// Reuse no cached prompt block: every prompt is computed whole (to measure what the prefix
    /// cache saves)
    #[arg(long = "no-prefix-cache")]
    pub no_prefix_cache: bool,
    /// A model with recurrent layers (LFM2): keep a snapshot of the state every this many KV
    /// blocks of a prompt, besides at its last full block, for later prompts sharing a prefix to
    /// resume from (0: only at the last full block)
    #[arg(long = "state-snapshot-every", value_name = "BLOCKS",
          default_value_t = crate::engine::state_slots::DEFAULT_SNAPSHOT_EVERY)]
    pub state_snapshot_every: usize,
    /// Compute this prompt at start-up (or load it from disk) and never evict it: a text file,
    /// or a JSON array of chat messages rendered through the chat template. Repeatable; pinned
    /// prompts are shared by every API key
    #[arg(long = "pin-prompt", value_name = "FILE")]
    pub pin_prompt: Vec<PathBuf>,
}

impl CacheArgs {
    /// The disk tier's place and budget; None with `--no-disk-cache`.
    pub fn disk_config(&self) -> Result<Option<DiskCacheConfig>> {
        if self.no_disk_cache {
            return Ok(None);
        }
        if self.cache_disk_mib == 0 {
            bail!("--cache-disk-mib must be at least 1 (or use --no-disk-cache)");
        }
        let budget_bytes = self
            .cache_disk_mib
            .checked_mul(1 << 20)
            .context("--cache-disk-mib is too large")?;
        let root = match &self.cache_dir {
            Some(d) => d.clone(),
            None => match DiskCacheConfig::default_root() {
                Some(r) => r,
                None => {
                    eprintln!("warning: neither XDG_CACHE_HOME nor HOME is set: the disk cache is off (--cache-dir DIR turns it on)");
                    return Ok(None);
                }
            },
        };
        Ok(Some(DiskCacheConfig { root, budget_bytes }))
    }

    /// Pins every `--pin-prompt` file, in order, telling how each went on stderr; returns
    /// each file's name and what pinning did.
    pub fn pin_all(
        &self,
        engine: &EngineHandle,
        template: Option<&ChatTemplate>,
    ) -> Result<Vec<(String, Pinned)>> {
        let mut out = Vec::new();
        for path in &self.pin_prompt {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading --pin-prompt {}", path.display()))?;
            let tokens = pin_tokens(engine.tokenizer(), template, &text)
                .with_context(|| format!("--pin-prompt {}", path.display()))?;
            let done = pin_blocking(engine, tokens)
                .with_context(|| format!("pinning --pin-prompt {}", path.display()))?;
            eprintln!(
                "pinned {}: {} tokens ({} were cached)",
                display(path),
                done.prompt_tokens,
                done.cached_tokens
            );
            out.push((display(path), done));
        }
        Ok(out)
    }
}

fn display(p: &Path) -> String {
    p.display().to_string()
}

/// The token ids of a prompt to pin: JSON chat messages (an array, or an object with
/// `messages`) rendered through `template` without a generation prompt, or else the text as
/// it is (special tokens such as `<|im_start|>` written in it count as such).
pub fn pin_tokens(
    tokenizer: &Tokenizer,
    template: Option<&ChatTemplate>,
    text: &str,
) -> Result<Vec<u32>> {
    let json: Option<serde_json::Value> = serde_json::from_str(text.trim()).ok();
    let messages = match &json {
        Some(serde_json::Value::Array(m)) => Some(m.as_slice()),
        Some(serde_json::Value::Object(o)) => o
            .get("messages")
            .and_then(|m| m.as_array())
            .map(|m| m.as_slice()),
        _ => None,
    };
    let tokens = match messages {
        Some(messages) => {
            let template = template.context("JSON messages need a chat template")?;
            if let Some(bad) = messages.iter().find(|m| !m.is_object()) {
                bail!("every message must be an object with role and content, got {bad}");
            }
            let rendered = template.render_json(messages, None, false)?;
            encode_prompt(tokenizer, &rendered)?
        }
        None => encode_prompt(tokenizer, text)?,
    };
    if tokens.is_empty() {
        bail!("the prompt to pin is empty");
    }
    Ok(tokens)
}

/// What pinning a prompt did.
#[derive(Clone, Copy, Debug)]
pub struct Pinned {
    /// The pin's id (its request's): `EngineHandle::unpin` takes it.
    pub pin: u64,
    pub prompt_tokens: usize,
    /// Tokens that were already cached (in memory, on disk, or pinned before).
    pub cached_tokens: usize,
}

/// The pin request for `tokens`.
pub fn pin_request(tokens: Vec<u32>) -> Request {
    let mut r = Request::new(tokens, SamplingParams::default(), 1);
    r.pin = true;
    r
}

/// Reads the end of pin request `pin`'s stream.
pub fn pinned_from(pin: u64, event: Option<Event>) -> Result<Pinned> {
    match event {
        Some(Event::Finished { usage, .. }) => Ok(Pinned {
            pin,
            prompt_tokens: usage.prompt_tokens,
            cached_tokens: usage.cached_tokens,
        }),
        Some(Event::Error(e)) => bail!("{e}"),
        _ => bail!("the engine stopped before the prompt was pinned"),
    }
}

/// Computes (or loads) `tokens` and pins their full blocks, waiting until done.
pub fn pin_blocking(engine: &EngineHandle, tokens: Vec<u32>) -> Result<Pinned> {
    let mut stream = engine.submit(pin_request(tokens))?;
    loop {
        match stream.next_blocking() {
            Some(Event::Token { .. }) => continue,
            e => return pinned_from(stream.id, e),
        }
    }
}

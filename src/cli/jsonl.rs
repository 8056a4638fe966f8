//! `edge-llm run --jsonl`: a batch of requests, one JSON object per stdin line, all handed to
//! the engine together (at most `--concurrency` at a time) so they are batched and share cached
//! prefixes; one JSON result per line on stdout, in input order, each carrying its request's
//! `id`. A bad line gets an error line and the rest go on.
//!
//! Input: `{"id": any, "prompt": "..."}` or `{"id": any, "messages": [{"role", "content"}...]}`
//! (rendered with the chat template), plus optional `max_tokens`, `temperature`, `top_p`,
//! `top_k`, `min_p`, `seed`, `stop` (a string or a list), `repeat_penalty`, `presence_penalty`,
//! `frequency_penalty`, `ignore_eos`; absent fields take the command line's values.
//! Output: `{"id", "text", "finish_reason", "usage": {...}}` or `{"id", "error"}`.
//!
//! Called by `commands::run` when `--jsonl` is given. Threads: one reads and submits lines,
//! one per request in flight collects its tokens, and the calling thread writes results.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::sync::mpsc;

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::commands::RunArgs;
use crate::chat_template::{ChatMessage, ChatTemplate};
use crate::engine::{EngineHandle, Event, Request, RequestStream, SubmitError, Usage};
use crate::sampler::SamplingParams;

/// One input line.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LineRequest {
    #[serde(default)]
    #[allow(dead_code)] // read from the raw object, so that error lines carry it too
    id: Option<Value>,
    prompt: Option<String>,
    messages: Option<Vec<ChatMessage>>,
    max_tokens: Option<usize>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<usize>,
    min_p: Option<f32>,
    seed: Option<u64>,
    stop: Option<Stop>,
    repeat_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    ignore_eos: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Serialize)]
struct Completion<'a> {
    id: &'a Value,
    text: String,
    finish_reason: &'static str,
    usage: UsageOut,
}

#[derive(Serialize)]
struct UsageOut {
    prompt_tokens: usize,
    completion_tokens: usize,
    total_tokens: usize,
    cached_tokens: usize,
}

impl From<Usage> for UsageOut {
    fn from(u: Usage) -> Self {
        UsageOut {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens + u.completion_tokens,
            cached_tokens: u.cached_tokens,
        }
    }
}

#[derive(Serialize)]
struct Failure<'a> {
    id: &'a Value,
    error: String,
}

fn error_line(id: &Value, error: String) -> String {
    serde_json::to_string(&Failure { id, error }).expect("serialisable")
}

/// What the other threads tell the writer.
enum Msg {
    /// The output line of input `index`; `permit`: it held a place among those in flight.
    Result {
        index: usize,
        line: String,
        permit: bool,
    },
    /// All input was read: this many results in all.
    End {
        total: usize,
    },
    Fatal(anyhow::Error),
}

/// What turns a line into a request; lives on the reader thread.
struct Builder {
    engine: EngineHandle,
    base: SamplingParams,
    max_tokens: usize,
    ignore_eos: bool,
    add_bos: bool,
    template_path: Option<std::path::PathBuf>,
    /// Loaded when the first `messages` request comes.
    template: Option<std::result::Result<ChatTemplate, String>>,
}

impl Builder {
    fn request(&mut self, value: Value) -> Result<Request> {
        let r = parse_fields(value)?;
        let tokenizer = &self.engine.model.tokenizer;
        let prompt = match (r.prompt, r.messages) {
            (Some(p), None) => tokenizer.encode(&p, self.add_bos, true)?,
            (None, Some(messages)) => {
                let engine = &self.engine;
                let path = self.template_path.as_deref();
                let template = self.template.get_or_insert_with(|| {
                    ChatTemplate::load(&engine.model, path).map_err(|e| format!("{e:#}"))
                });
                let template = template.as_ref().map_err(|e| anyhow!("{e}"))?;
                template.encode(tokenizer, &messages, true)?
            }
            _ => bail!("give exactly one of \"prompt\" and \"messages\""),
        };
        let mut sampling = self.base.clone();
        sampling.temperature = r.temperature.unwrap_or(sampling.temperature);
        sampling.top_p = r.top_p.unwrap_or(sampling.top_p);
        sampling.top_k = r.top_k.unwrap_or(sampling.top_k);
        sampling.min_p = r.min_p.unwrap_or(sampling.min_p);
        sampling.seed = r.seed.unwrap_or(sampling.seed);
        sampling.repeat_penalty = r.repeat_penalty.unwrap_or(sampling.repeat_penalty);
        sampling.presence_penalty = r.presence_penalty.unwrap_or(sampling.presence_penalty);
        sampling.frequency_penalty = r.frequency_penalty.unwrap_or(sampling.frequency_penalty);
        let max_tokens = r.max_tokens.unwrap_or(self.max_tokens);
        if max_tokens == 0 {
            bail!("max_tokens must be at least 1");
        }
        let mut request = Request::new(prompt, sampling, max_tokens);
        request.ignore_eos = r.ignore_eos.unwrap_or(self.ignore_eos);
        request.stop = match r.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s],
            Some(Stop::Many(v)) => v,
        };
        Ok(request)
    }
}

/// The request in `value`; a wrong type is reported with the field's name.
pub(crate) fn parse_fields(value: Value) -> Result<LineRequest> {
    match serde_json::from_value::<LineRequest>(value.clone()) {
        Ok(r) => Ok(r),
        Err(e) => {
            // serde names the type, not the field: find the field that fails alone.
            if let Value::Object(map) = value {
                for (key, v) in map {
                    let alone = Value::Object([(key.clone(), v)].into_iter().collect());
                    if let Err(e) = serde_json::from_value::<LineRequest>(alone) {
                        return Err(anyhow!("{key}: {e}"));
                    }
                }
            }
            Err(e.into())
        }
    }
}

pub fn run(args: &RunArgs) -> Result<()> {
    if args.prompt.is_some() {
        bail!("--jsonl reads its prompts from stdin; drop -p");
    }
    if args.concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    args.threads.init()?;
    let base = args.sampling.params()?;
    let model = args.model.load()?;
    let add_bos = model.tokenizer.add_bos_default() && !args.no_bos;
    let engine = args.engine.start(model, false)?;
    let builder = Builder {
        engine: engine.clone(),
        base,
        max_tokens: args.n_predict,
        ignore_eos: args.ignore_eos,
        add_bos,
        template_path: args.chat_template.clone(),
        template: None,
    };
    let (tx, rx) = mpsc::channel();
    // A place among those in flight is a slot in this channel's buffer.
    // More in flight than the engine queues would only turn lines into "queue full" errors.
    let concurrency = args.concurrency.min(engine.config.max_queue);
    let (permit_tx, permit_rx) = mpsc::sync_channel::<()>(concurrency);
    std::thread::Builder::new()
        .name("edge-llm-jsonl-reader".into())
        .spawn(move || read_and_submit(builder, tx, permit_tx))
        .context("starting the reader thread")?;
    let mut ready: BTreeMap<usize, String> = BTreeMap::new();
    let mut next = 0;
    let mut total = None;
    let mut out = std::io::stdout().lock();
    while total != Some(next) {
        match rx.recv().context("the reader thread ended early")? {
            Msg::Result {
                index,
                line,
                permit,
            } => {
                if permit {
                    let _ = permit_rx.recv();
                }
                ready.insert(index, line);
                while let Some(line) = ready.remove(&next) {
                    writeln!(out, "{line}")?;
                    next += 1;
                }
                out.flush()?;
            }
            Msg::End { total: t } => total = Some(t),
            Msg::Fatal(e) => return Err(e),
        }
    }
    Ok(())
}

/// The reader thread: parses each line, submits it when a place is free, and starts a
/// collector for it; bad lines become error results at once.
fn read_and_submit(mut builder: Builder, tx: mpsc::Sender<Msg>, permits: mpsc::SyncSender<()>) {
    let stdin = std::io::stdin().lock();
    let mut index = 0;
    for (line_no, line) in stdin.lines().enumerate() {
        let line = match line {
            Ok(l) => l,
            Err(e) => {
                let _ = tx.send(Msg::Fatal(
                    anyhow!(e).context(format!("reading stdin line {}", line_no + 1)),
                ));
                return;
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        let this = index;
        index += 1;
        let value: Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(e) => {
                let error = format!("line {}: malformed JSON: {e}", line_no + 1);
                let _ = tx.send(Msg::Result {
                    index: this,
                    line: error_line(&Value::Null, error),
                    permit: false,
                });
                continue;
            }
        };
        let id = match &value {
            Value::Object(map) => map.get("id").cloned().unwrap_or(Value::Null),
            _ => Value::Null,
        };
        if !value.is_object() {
            let error = format!("line {}: expected a JSON object", line_no + 1);
            let _ = tx.send(Msg::Result {
                index: this,
                line: error_line(&id, error),
                permit: false,
            });
            continue;
        }
        let request = match builder.request(value) {
            Ok(r) => r,
            Err(e) => {
                let error = format!("line {}: {e:#}", line_no + 1);
                let _ = tx.send(Msg::Result {
                    index: this,
                    line: error_line(&id, error),
                    permit: false,
                });
                continue;
            }
        };
        if permits.send(()).is_err() {
            return;
        }
        match submit(&builder.engine, request) {
            Ok(stream) => {
                let results = tx.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("edge-llm-jsonl-{this}"))
                    .spawn(move || {
                        let line = collect(stream, &id);
                        let _ = results.send(Msg::Result {
                            index: this,
                            line,
                            permit: true,
                        });
                    });
                if let Err(e) = spawned {
                    let _ = tx.send(Msg::Fatal(
                        anyhow!(e).context("starting a collector thread"),
                    ));
                    return;
                }
            }
            Err(e) => {
                let error = format!("line {}: {e}", line_no + 1);
                let _ = tx.send(Msg::Result {
                    index: this,
                    line: error_line(&id, error),
                    permit: true,
                });
            }
        }
    }
    let _ = tx.send(Msg::End { total: index });
}

/// Submits, waiting a little when the engine's queue is full: a request that just finished
/// may not have left the engine's count yet when its result arrives.
fn submit(engine: &EngineHandle, request: Request) -> Result<RequestStream, SubmitError> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match engine.submit(request.clone()) {
            Err(SubmitError::QueueFull(_)) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            result => return result,
        }
    }
}

/// Reads one request's events to the end; its output line.
fn collect(mut stream: RequestStream, id: &Value) -> String {
    let mut text = String::new();
    while let Some(event) = stream.next_blocking() {
        match event {
            Event::Token { text: t, .. } => text.push_str(&t),
            Event::Finished {
                reason,
                text: t,
                usage,
                ..
            } => {
                text.push_str(&t);
                let done = Completion {
                    id,
                    text,
                    finish_reason: reason.as_str(),
                    usage: usage.into(),
                };
                return serde_json::to_string(&done).expect("serialisable");
            }
            Event::Error(e) => return error_line(id, e),
        }
    }
    error_line(id, "the engine stopped".into())
}

//! `edge-llm run --jsonl`: a batch of requests, one JSON object per stdin line, all handed to
//! the engine together (at most `--concurrency` at a time) so they are batched and share cached
//! prefixes; one JSON result per line on stdout, in input order, each carrying its request's
//! `id`. A bad line gets an error line and the rest go on.
//!
//! Input: the body of a `/v1/completions` request (`prompt`) or of a `/v1/chat/completions`
//! one (`messages`, rendered with the chat template), plus an optional `id`; the body is read
//! by the rules the server reads its bodies by (`crate::api::plan`), so a line is accepted or
//! refused as the server would accept or refuse its body, and unknown fields are ignored.
//! Absent fields take the command line's values. `n` must be 1 and `stream` changes nothing
//! (each result is one line); `logprobs` (`top_logprobs` on chat lines) and `echo` are written as
//! the server writes them, in a `logprobs` field.
//! `response_format`, `regex`, `grammar`, and on `messages` lines `tools`, `tool_choice` and
//! `parallel_tool_calls`, are read there too, and the reply is taken apart as the server's is
//! (`crate::api::reply`).
//! Output: `{"id", "text", "finish_reason", "usage": {...}}` or `{"id", "error"}`; a chat line
//! whose reply called tools adds `tool_calls` (as the server's `message.tool_calls`, `text`
//! then holds the rest, `finish_reason` is `tool_calls`), and one whose template thinks adds
//! `reasoning_content`.
//!
//! Called by `commands::run` when `--jsonl` is given. Threads: one reads and submits lines,
//! one per request in flight collects its tokens, and the calling thread writes results.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::sync::mpsc;

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use serde_json::{json, Map, Value};

use super::commands::RunArgs;
use crate::api::logprobs::{
    chat_logprobs, echo_text, legacy_logprobs, prompt_entries, PromptScores,
};
use crate::api::plan::{self, Setting};
use crate::api::reply::{self, ReplyParsing};
use crate::api::request::{json_too_deep, too_deep_message, Endpoint};
use crate::api::RequestError;
use crate::chat_template::ChatTemplate;
use crate::engine::sampler::SamplingParams;
use crate::engine::{EngineHandle, EngineParts, Event, Request, RequestStream, SubmitError, Usage};

#[derive(Serialize)]
struct Completion<'a> {
    id: &'a Value,
    text: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<Value>,
    finish_reason: &'static str,
    usage: UsageOut,
    /// With `logprobs`: the server's layout for the line's endpoint (with `echo`, the prompt's
    /// tokens first).
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<Value>,
}

/// How one line's result is written: what to take apart in its reply, and whether it carries
/// logprobs and the echoed prompt.
struct LineReply {
    parsing: ReplyParsing,
    endpoint: Endpoint,
    logprobs: bool,
    echo: bool,
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
    /// The request in one line's object, read by the rules the server reads a body by
    /// (`crate::api::plan`), so that a body is accepted or refused the same way by both; the
    /// field that carried its prompt; what to take apart in its reply.
    fn request(
        &mut self,
        map: &Map<String, Value>,
    ) -> Result<(Request, &'static str, LineReply), RequestError> {
        let endpoint = plan::endpoint_of(map)?;
        if endpoint == Endpoint::Chat && self.template.is_none() {
            let loaded = self.engine.chat_template(self.template_path.as_deref());
            self.template = Some(loaded.map_err(|e| format!("{e:#}")));
        }
        let template = match &self.template {
            Some(Ok(t)) => Ok(t),
            Some(Err(why)) => Err(why.as_str()),
            None => Err("no chat template was loaded"),
        };
        let setting = Setting {
            tokenizer: self.engine.tokenizer(),
            template,
            grammars: Some(&self.engine.grammars),
            max_seq_len: self.engine.max_seq_len(),
            tenant: None,
            sampling: self.base.clone(),
            max_tokens: Some(self.max_tokens),
            add_bos: self.add_bos,
            ignore_eos: self.ignore_eos,
        };
        let p = plan::plan(&setting, endpoint, map)?;
        if p.params.n != 1 {
            return Err(RequestError::invalid(
                "n",
                "`n` must be 1 in --jsonl (one result per line)",
            ));
        }
        let reply = LineReply {
            parsing: p.parsing,
            endpoint,
            logprobs: p.params.logprobs.is_some(),
            echo: p.params.echo,
        };
        Ok((p.request, p.prompt_param, reply))
    }
}

/// One error line's text: the line number, then the field at fault if one is.
fn line_error(line_no: usize, e: &RequestError) -> String {
    match &e.param {
        Some(param) if !e.message.contains(param.as_str()) => {
            format!("line {line_no}: {param}: {}", e.message)
        }
        _ => format!("line {line_no}: {}", e.message),
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
    let engine = args.engine.start(model, false, EngineParts::default())?;
    let builder = Builder {
        engine: engine.clone(),
        base,
        max_tokens: super::commands::max_tokens_flag(args.n_predict, "-n/--n-predict")?,
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
    let mut stdin = std::io::stdin().lock();
    let mut index = 0;
    let mut bytes = Vec::new();
    for line_no in 0.. {
        bytes.clear();
        match stdin.read_until(b'\n', &mut bytes) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => {
                let _ = tx.send(Msg::Fatal(
                    anyhow!(e).context(format!("reading stdin line {}", line_no + 1)),
                ));
                return;
            }
        }
        // A line that is not UTF-8 is one bad line, not the end of the input.
        let line = match std::str::from_utf8(&bytes) {
            Ok(l) => Some(l.trim_end_matches(['\n', '\r'])),
            Err(_) => None,
        };
        if line.is_some_and(|l| l.trim().is_empty()) {
            continue;
        }
        let this = index;
        index += 1;
        let Some(line) = line else {
            let error = format!("line {}: not valid UTF-8", line_no + 1);
            let _ = tx.send(Msg::Result {
                index: this,
                line: error_line(&Value::Null, error),
                permit: false,
            });
            continue;
        };
        let value: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(e) => {
                let error = if json_too_deep(&e) {
                    too_deep_message(&format!("line {}", line_no + 1), &e)
                } else {
                    format!("line {}: malformed JSON: {e}", line_no + 1)
                };
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
        let (request, prompt_param, reply) =
            match builder.request(value.as_object().expect("checked above")) {
                Ok(r) => r,
                Err(e) => {
                    let error = line_error(line_no + 1, &e);
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
                let engine = builder.engine.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("edge-llm-jsonl-{this}"))
                    .spawn(move || {
                        let line = collect(stream, &id, this, &reply, &engine);
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
                let error = match RequestError::from_submit(&e, prompt_param) {
                    Some(refused) => line_error(line_no + 1, &refused),
                    None => format!("line {}: {e}", line_no + 1),
                };
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

/// Reads one request's events to the end; its output line (the reply of input `index` taken
/// apart as `parsing` says).
fn collect(
    mut stream: RequestStream,
    id: &Value,
    index: usize,
    shape: &LineReply,
    engine: &EngineHandle,
) -> String {
    let tok = engine.tokenizer();
    let mut text = String::new();
    let mut prompt = None;
    let mut entries = Vec::new();
    while let Some(event) = stream.next_blocking() {
        match event {
            Event::Prompt { tokens, logprobs } => prompt = Some(PromptScores { tokens, logprobs }),
            Event::Embedding { .. } => {} // never asked for here
            Event::Token {
                text: t,
                token,
                logprobs,
                ..
            } => {
                text.push_str(&t);
                entries.extend(logprobs.map(|l| (token, l)));
            }
            Event::Finished {
                reason,
                text: t,
                usage,
                ..
            } => {
                text.push_str(&t);
                let reply =
                    reply::assistant_reply(&text, &format!("jsonl-{index}"), 0, &shape.parsing);
                let finish_reason = reply::finish_reason(reason, !reply.tool_calls.is_empty());
                let echoed = prompt.as_ref().filter(|_| shape.echo);
                let logprobs = shape.logprobs.then(|| match shape.endpoint {
                    Endpoint::Completions => {
                        let generated = entries.iter().map(|(id, l)| (*id, Some(l)));
                        let all = echoed.map(prompt_entries).into_iter().flatten();
                        legacy_logprobs(tok, all.chain(generated), &mut 0)
                    }
                    Endpoint::Chat => json!({"content": chat_logprobs(tok, &entries)}),
                });
                let done = Completion {
                    id,
                    text: echoed.map_or(String::new(), |p| echo_text(tok, &p.tokens))
                        + &reply.content,
                    reasoning_content: reply.reasoning,
                    tool_calls: reply.tool_calls,
                    finish_reason,
                    usage: usage.into(),
                    logprobs,
                };
                return serde_json::to_string(&done).expect("serialisable");
            }
            Event::Error(e) => return error_line(id, e),
        }
    }
    error_line(id, "the engine stopped".into())
}

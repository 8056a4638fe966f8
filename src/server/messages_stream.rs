//! The Messages API's content blocks, built the same way for whole and streamed replies: a
//! reply taken apart by `api::reply_stream::ReplyStream` becomes `thinking`, `text` and
//! `tool_use` blocks ([`Blocks`]), and a streamed reply becomes Anthropic's server-sent events
//! (`message_start`, `ping`, `content_block_start`/`_delta`/`_stop`, `message_delta`,
//! `message_stop`; `error` if the engine fails; a `ping` every 10 s while nothing else comes). The body owns the engine's `RequestStream`:
//! when the client hangs up, the body is dropped with it and the engine aborts the request and
//! frees its blocks. Called by `messages`.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::body::Bytes;
use axum::response::Response;
use serde_json::{json, Value};

use super::middleware::RequestInfo;
use super::response::{generation_error, log_note};
use super::stream::StreamLog;
use crate::api::reply_stream::{ReplyPiece, ReplyStream};
use crate::engine::{Event, FinishReason, RequestStream, Usage};

/// How long a stream stays silent before a `ping`.
const PING_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// The signature given to thinking blocks: this server signs nothing, and drops thinking
/// blocks fed back.
pub const SIGNATURE: &str = "edge-llm-unsigned";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Thinking,
    Text,
    Tool,
}

/// Content blocks as a reply's pieces arrive: the events that open, extend and close them, and
/// the finished blocks.
pub struct Blocks {
    /// The message id, whose tail names the tool calls (`toolu_...`).
    id: String,
    open: Option<(Kind, Value, String)>,
    /// Finished blocks, in order.
    pub done: Vec<Value>,
    num_started: usize,
    num_calls: usize,
}

impl Blocks {
    pub fn new(id: &str) -> Self {
        Blocks {
            id: id.to_string(),
            open: None,
            done: Vec::new(),
            num_started: 0,
            num_calls: 0,
        }
    }

    /// The events for one piece of the reply.
    pub fn push(&mut self, piece: ReplyPiece) -> Vec<Value> {
        let mut events = Vec::new();
        let (kind, delta) = match piece {
            ReplyPiece::Reasoning(t) => (
                Kind::Thinking,
                json!({"type": "thinking_delta", "thinking": t}),
            ),
            ReplyPiece::Content(t) => (Kind::Text, json!({"type": "text_delta", "text": t})),
            ReplyPiece::CallStart { name, .. } => {
                events.extend(self.close());
                let base = self.id.rsplit('_').next().unwrap_or(&self.id);
                let id = format!("toolu_{base}_{}", self.num_calls);
                self.num_calls += 1;
                let block = json!({"type": "tool_use", "id": id, "name": name, "input": {}});
                events.push(self.start(Kind::Tool, block));
                return events;
            }
            ReplyPiece::Arguments { text, .. } => (
                Kind::Tool,
                json!({"type": "input_json_delta", "partial_json": text}),
            ),
        };
        if kind == Kind::Tool && self.open.as_ref().map(|o| o.0) != Some(Kind::Tool) {
            return events; // arguments always follow their call's start
        }
        if self.open.as_ref().map(|o| o.0) != Some(kind) {
            events.extend(self.close());
            let block = match kind {
                Kind::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
                _ => json!({"type": "text", "text": ""}),
            };
            events.push(self.start(kind, block));
        }
        let index = self.num_started - 1;
        if let Some((_, block, args)) = self.open.as_mut() {
            match kind {
                Kind::Thinking => append(block, "thinking", &delta["thinking"]),
                Kind::Text => append(block, "text", &delta["text"]),
                Kind::Tool => args.push_str(delta["partial_json"].as_str().unwrap_or("")),
            }
        }
        events.push(json!({"type": "content_block_delta", "index": index, "delta": delta}));
        events
    }

    fn start(&mut self, kind: Kind, block: Value) -> Value {
        let index = self.num_started;
        self.num_started += 1;
        let event = json!({"type": "content_block_start", "index": index, "content_block": block});
        self.open = Some((kind, block, String::new()));
        event
    }

    /// Closes the open block, if any: its events (a thinking block's signature, the stop).
    pub fn close(&mut self) -> Vec<Value> {
        let Some((kind, mut block, args)) = self.open.take() else {
            return Vec::new();
        };
        let index = self.num_started - 1;
        let mut events = Vec::new();
        match kind {
            Kind::Thinking => {
                block["signature"] = json!(SIGNATURE);
                events.push(json!({"type": "content_block_delta", "index": index,
                                   "delta": {"type": "signature_delta", "signature": SIGNATURE}}));
                self.done.push(block);
            }
            Kind::Text => self.done.push(block),
            Kind::Tool => {
                let input = if args.trim().is_empty() {
                    Some(json!({}))
                } else {
                    serde_json::from_str::<Value>(&args)
                        .ok()
                        .filter(Value::is_object)
                };
                // A call the reply ended inside (cut by max_tokens) is left out of a whole reply.
                if let Some(input) = input {
                    block["input"] = input;
                    self.done.push(block);
                }
            }
        }
        events.push(json!({"type": "content_block_stop", "index": index}));
        events
    }

    /// Whether a tool call was made.
    pub fn made_calls(&self) -> bool {
        self.num_calls > 0
    }
}

fn append(block: &mut Value, key: &str, more: &Value) {
    let joined = format!(
        "{}{}",
        block[key].as_str().unwrap_or(""),
        more.as_str().unwrap_or("")
    );
    block[key] = json!(joined);
}

/// Anthropic's `stop_reason`.
pub fn stop_reason(reason: Option<FinishReason>, usage: &Usage, made_calls: bool) -> &'static str {
    match reason {
        Some(FinishReason::Length) => "max_tokens",
        _ if made_calls => "tool_use",
        _ if usage.stop_sequence.is_some() => "stop_sequence",
        _ => "end_turn",
    }
}

/// Anthropic's `stop_sequence`: the one of `stop` that ended the reply, or null.
pub fn stop_sequence(usage: &Usage, stop: &[String]) -> Value {
    usage
        .stop_sequence
        .and_then(|k| stop.get(k))
        .map_or(Value::Null, |s| json!(s))
}

/// Anthropic's `usage`: `input_tokens` counts only the prompt tokens not read from the cache.
pub fn usage(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens - u.cached_tokens.min(u.prompt_tokens),
        "output_tokens": u.completion_tokens,
        "cache_read_input_tokens": u.cached_tokens,
        "cache_creation_input_tokens": 0,
    })
}

/// The state of one streamed message.
struct MessageSse {
    stream: RequestStream,
    reply: ReplyStream,
    blocks: Blocks,
    queue: VecDeque<Bytes>,
    usage: Usage,
    /// The request's stop strings (`stop_sequences`), to name the one that ended it.
    stop: Vec<String>,
    finish: Option<FinishReason>,
    done: bool,
    /// The request's log line (written once, at the end or at a hang-up).
    log: StreamLog,
}

/// A `text/event-stream` response of Anthropic's events, fed by `stream`; `message` is the
/// message object `message_start` carries.
pub fn sse_response(
    message: Value,
    stream: RequestStream,
    reply: ReplyStream,
    stop: Vec<String>,
    info: RequestInfo,
) -> Response {
    let id = message["id"].as_str().unwrap_or("msg").to_string();
    let mut state = MessageSse {
        stream,
        reply,
        blocks: Blocks::new(&id),
        queue: VecDeque::new(),
        usage: Usage::default(),
        stop,
        finish: None,
        done: false,
        log: StreamLog::new(info),
    };
    state.push(&json!({"type": "message_start", "message": message}));
    state.push(&json!({"type": "ping"}));
    let body = futures_util::stream::unfold(state, |mut st| async move {
        let bytes = st.next_bytes().await?;
        Some((Ok::<Bytes, Infallible>(bytes), st))
    });
    super::stream::event_stream(body)
}

impl MessageSse {
    fn push(&mut self, event: &Value) {
        let name = event["type"].as_str().unwrap_or("message");
        self.queue
            .push_back(Bytes::from(format!("event: {name}\ndata: {event}\n\n")));
    }

    fn push_text(&mut self, text: &str, end: bool) {
        let pieces = self.reply.push(text, end);
        for piece in pieces {
            for event in self.blocks.push(piece) {
                self.push(&event);
            }
        }
    }

    async fn next_bytes(&mut self) -> Option<Bytes> {
        loop {
            if let Some(b) = self.queue.pop_front() {
                return Some(b);
            }
            if self.done {
                return None;
            }
            // A `ping` while nothing else comes (a long prefill): clients such as Claude Code
            // (Node's fetch) give up on a body that sends nothing for 300 s.
            let next = tokio::time::timeout(PING_EVERY, self.stream.next()).await;
            let Ok(next) = next else {
                self.push(&json!({"type": "ping"}));
                continue;
            };
            match next {
                Some(Event::Prompt { .. } | Event::Embedding { .. }) => {} // never asked for here
                Some(Event::Token { index: 0, text, .. }) => {
                    self.log.num_tokens += 1;
                    self.push_text(&text, false);
                }
                Some(Event::Finished {
                    index: 0,
                    reason,
                    text,
                    usage,
                }) => {
                    self.usage = usage;
                    self.finish = Some(reason);
                    self.push_text(&text, true);
                }
                Some(Event::Token { .. } | Event::Finished { .. }) => {}
                Some(Event::Error(e)) => {
                    let err = generation_error(&e);
                    let body = super::messages::anthropic_body(err.status, &err.message);
                    self.push(&body);
                    self.end(&format!("error: {e}"));
                }
                None => {
                    for event in self.blocks.close() {
                        self.push(&event);
                    }
                    let reason = stop_reason(self.finish, &self.usage, self.blocks.made_calls());
                    let sequence = stop_sequence(&self.usage, &self.stop);
                    self.push(&json!({"type": "message_delta",
                        "delta": {"stop_reason": reason, "stop_sequence": sequence},
                        "usage": usage(&self.usage)}));
                    self.push(&json!({"type": "message_stop"}));
                    let note = log_note(&[self.usage], &[self.finish], true);
                    self.end(&note);
                }
            }
        }
    }

    fn end(&mut self, note: &str) {
        self.done = true;
        self.log.end(note);
    }
}

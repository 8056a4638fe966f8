//! Streamed responses: engine events become server-sent events in OpenAI's chunk format,
//! ending with `data: [DONE]` (after a `usage` chunk with `stream_options.include_usage`).
//! The body owns the engine's `RequestStream`: when the client hangs up, hyper drops the
//! body, the stream is dropped, and the engine aborts the request and frees its blocks.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};

use super::middleware::{LoggedByBody, RequestInfo};
use super::response::{
    chat_logprobs, completion_logprobs, echo_text, finish_str, generation_error, legacy_logprobs,
    log_note, prompt_entries, usage_json, PromptScores, Reply,
};
use super::structured;
use crate::api::reply::ReplyParsing;
use crate::api::reply_stream::ReplyStream;
use crate::api::request::Endpoint;
use crate::engine::{EngineHandle, Event, FinishReason, RequestStream, TokenLogprobs, Usage};

/// The state of one streamed response.
struct SseState {
    reply: Reply,
    engine: EngineHandle,
    stream: RequestStream,
    include_usage: bool,
    with_logprobs: bool,
    /// Encoded events ready to send.
    queue: VecDeque<Bytes>,
    usages: Vec<Usage>,
    finishes: Vec<Option<FinishReason>>,
    /// Per choice: bytes of completion text so far (completions `text_offset`).
    offsets: Vec<usize>,
    done: bool,
    /// The request's log line (written once, at the end or at a hang-up).
    log: StreamLog,
    /// Per choice, the parsers that take the reply apart (tool calls, `<think>` reasoning);
    /// None when there is nothing to take apart.
    replies: Option<Vec<ReplyStream>>,
}

/// What a streamed reply holds besides the tokens.
pub struct StreamShape {
    /// Choices streamed side by side.
    pub n: usize,
    /// A final `usage` chunk (`stream_options.include_usage`).
    pub include_usage: bool,
    pub with_logprobs: bool,
}

/// A `text/event-stream` response fed by `stream`.
pub fn sse_response(
    reply: Reply,
    engine: EngineHandle,
    stream: RequestStream,
    shape: StreamShape,
    info: RequestInfo,
    parsing: ReplyParsing,
) -> Response {
    let StreamShape {
        n,
        include_usage,
        with_logprobs,
    } = shape;
    let mut state = SseState {
        reply,
        engine,
        stream,
        include_usage,
        with_logprobs,
        queue: VecDeque::new(),
        usages: vec![Usage::default(); n],
        finishes: vec![None; n],
        offsets: vec![0; n],
        done: false,
        log: StreamLog::new(info),
        replies: parsing.any().then(|| vec![ReplyStream::new(&parsing); n]),
    };
    if state.reply.endpoint == Endpoint::Chat {
        // OpenAI opens each choice with the assistant's role; it also sends the headers now.
        for index in 0..n {
            let choice = json!({"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null});
            state.push_chunk(vec![choice]);
        }
    }
    let body = futures_util::stream::unfold(state, |mut st| async move {
        let bytes = st.next_bytes().await?;
        Some((Ok::<Bytes, Infallible>(bytes), st))
    });
    event_stream(body)
}

/// A `text/event-stream` response over `body` (every streamed route's: chat completions, the
/// Responses and Messages APIs). The body logs its request when it ends; a client that hangs up
/// drops it, and with it the engine's stream, which aborts the request and frees its blocks.
pub fn event_stream(
    body: impl futures_util::Stream<Item = Result<Bytes, Infallible>> + Send + 'static,
) -> Response {
    let mut response = Response::new(Body::from_stream(body));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-cache"),
    );
    response.extensions_mut().insert(LoggedByBody);
    response
}

impl SseState {
    fn push_data(&mut self, v: &Value) {
        self.queue.push_back(Bytes::from(format!("data: {v}\n\n")));
    }

    fn push_chunk(&mut self, choices: Vec<Value>) {
        let usage = self.include_usage.then_some(Value::Null);
        let chunk = self.reply.chunk(choices, usage);
        self.push_data(&chunk);
    }

    /// The chunk of one choice: new text, its tokens' logprobs, and the finish reason.
    fn choice(
        &mut self,
        index: usize,
        text: String,
        logprobs: &[(u32, TokenLogprobs)],
        finish: Option<FinishReason>,
    ) -> Value {
        let tok = self.engine.tokenizer();
        let lp = if self.with_logprobs && !logprobs.is_empty() {
            match self.reply.endpoint {
                Endpoint::Completions => {
                    completion_logprobs(tok, logprobs, &mut self.offsets[index])
                }
                Endpoint::Chat => json!({"content": chat_logprobs(tok, logprobs)}),
            }
        } else {
            Value::Null
        };
        match self.reply.endpoint {
            Endpoint::Completions => {
                json!({"index": index, "text": text, "logprobs": lp, "finish_reason": finish_str(finish)})
            }
            Endpoint::Chat => {
                let delta = if text.is_empty() && finish.is_some() {
                    json!({})
                } else {
                    json!({"content": text})
                };
                json!({"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish_str(finish)})
            }
        }
    }

    /// The next bytes to send, or None when the response is complete.
    async fn next_bytes(&mut self) -> Option<Bytes> {
        loop {
            if let Some(b) = self.queue.pop_front() {
                return Some(b);
            }
            if self.done {
                return None;
            }
            match self.stream.next().await {
                Some(Event::Embedding { .. }) => {} // never asked for here
                Some(Event::Prompt { tokens, logprobs }) => {
                    // `echo`: every choice starts with the prompt (completions only).
                    let p = PromptScores { tokens, logprobs };
                    let engine = self.engine.clone();
                    let tok = engine.tokenizer();
                    for index in 0..self.usages.len() {
                        let lp = if self.with_logprobs {
                            legacy_logprobs(tok, prompt_entries(&p), &mut self.offsets[index])
                        } else {
                            Value::Null
                        };
                        let text = echo_text(tok, &p.tokens);
                        let choice = json!({"index": index, "text": text, "logprobs": lp, "finish_reason": null});
                        self.push_chunk(vec![choice]);
                    }
                }
                Some(Event::Token {
                    index,
                    token,
                    text,
                    logprobs,
                }) => {
                    self.log.num_tokens += 1;
                    if index >= self.usages.len() {
                        continue;
                    }
                    let entries: Vec<(u32, TokenLogprobs)> =
                        logprobs.map(|l| (token, l)).into_iter().collect();
                    if self.replies.is_some() {
                        self.push_parsed(index, &text, None);
                    } else if !text.is_empty() || (self.with_logprobs && !entries.is_empty()) {
                        let choice = self.choice(index, text, &entries, None);
                        self.push_chunk(vec![choice]);
                    }
                }
                Some(Event::Finished {
                    index,
                    reason,
                    text,
                    usage,
                }) => {
                    if index >= self.usages.len() {
                        continue;
                    }
                    self.usages[index] = usage;
                    self.finishes[index] = Some(reason);
                    if self.replies.is_some() {
                        self.push_parsed(index, &text, Some(reason));
                        continue;
                    }
                    let choice = self.choice(index, text, &[], Some(reason));
                    self.push_chunk(vec![choice]);
                }
                Some(Event::Error(e)) => {
                    let err = generation_error(&e);
                    self.push_data(&err.body());
                    self.end(&format!("error: {e}"));
                }
                None => {
                    if self.include_usage {
                        let usage = usage_json(&self.usages);
                        let chunk = self.reply.chunk(Vec::new(), Some(usage));
                        self.push_data(&chunk);
                    }
                    let note = log_note(&self.usages, &self.finishes, true);
                    self.end(&note);
                }
            }
        }
    }

    /// Chunks for a choice whose reply is taken apart: reasoning (`delta.reasoning_content`),
    /// content and tool-call deltas, and at the end the finish reason (`tool_calls` when it
    /// made any).
    fn push_parsed(&mut self, index: usize, text: &str, finish: Option<FinishReason>) {
        let Some(reply) = self.replies.as_mut().and_then(|r| r.get_mut(index)) else {
            return;
        };
        let pieces = reply.push(text, finish.is_some());
        let made_calls = !reply.calls().is_empty();
        for delta in structured::deltas(pieces, &self.reply.id, index) {
            let choice =
                json!({"index": index, "delta": delta, "logprobs": null, "finish_reason": null});
            self.push_chunk(vec![choice]);
        }
        if let Some(reason) = finish {
            let choice = json!({"index": index, "delta": {}, "logprobs": null,
                                "finish_reason": structured::finish_reason(reason, made_calls)});
            self.push_chunk(vec![choice]);
        }
    }

    /// Queues `[DONE]` and logs the request.
    fn end(&mut self, note: &str) {
        self.queue
            .push_back(Bytes::from_static(b"data: [DONE]\n\n"));
        self.done = true;
        self.log.end(note);
    }
}

/// The log line of one streamed response: written once, when the stream ends, or when the
/// client hangs up and the body is dropped (saying after how many tokens).
pub struct StreamLog {
    pub info: RequestInfo,
    pub num_tokens: usize,
    logged: bool,
}

impl StreamLog {
    pub fn new(info: RequestInfo) -> Self {
        StreamLog {
            info,
            num_tokens: 0,
            logged: false,
        }
    }

    /// Logs the request as ended with `note`.
    pub fn end(&mut self, note: &str) {
        self.logged = true;
        self.info.log(StatusCode::OK, note);
    }
}

impl Drop for StreamLog {
    fn drop(&mut self) {
        if !self.logged {
            let note = format!(
                "client disconnected after {} tokens; aborted",
                self.num_tokens
            );
            self.info.log(StatusCode::OK, &note);
        }
    }
}

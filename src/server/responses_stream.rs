//! A streamed Responses API reply: server-sent events `event: TYPE` / `data: JSON` in OpenAI's
//! order, each with its `sequence_number`: `response.created`, `response.in_progress`, the
//! output items' events (`responses_output`), then `response.completed` (or
//! `response.incomplete`, `response.failed`) carrying the whole response with its `usage`. The
//! body owns the engine's `RequestStream`: when the client hangs up, hyper drops the body, the
//! stream is dropped, and the engine aborts the request and frees its blocks. Called by
//! `responses::create`.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::response::Response;
use serde_json::{json, Value};

use super::middleware::RequestInfo;
use super::response::log_note;
use super::responses::{finish, response_object, Meta};
use super::responses_output::Output;
use super::stream::StreamLog;
use super::AppState;
use crate::api::reply::ReplyParsing;
use crate::api::reply_stream::ReplyStream;
use crate::engine::{Event, RequestStream};

struct ResponseSse {
    state: Arc<AppState>,
    /// The request's log line (written once, at the end or at a hang-up).
    log: StreamLog,
    stream: RequestStream,
    meta: Meta,
    reply: ReplyStream,
    output: Output,
    queue: VecDeque<Bytes>,
    sequence_number: u64,
    done: bool,
}

/// A `text/event-stream` response fed by `stream`.
pub(super) fn sse(
    state: Arc<AppState>,
    info: RequestInfo,
    stream: RequestStream,
    parsing: ReplyParsing,
    meta: Meta,
) -> Response {
    let output =
        Output::new(&meta.id, meta.t.custom_tools.clone()).forcing(meta.t.forced_custom.clone());
    let mut st = ResponseSse {
        state,
        log: StreamLog::new(info),
        stream,
        meta,
        reply: ReplyStream::new(&parsing),
        output,
        queue: VecDeque::new(),
        sequence_number: 0,
        done: false,
    };
    let opening = response_object(&st.meta, "in_progress", Vec::new());
    st.send("response.created", json!({ "response": opening }));
    st.send("response.in_progress", json!({ "response": opening }));
    let body = futures_util::stream::unfold(st, |mut st| async move {
        let bytes = st.next_bytes().await?;
        Some((Ok::<Bytes, Infallible>(bytes), st))
    });
    super::stream::event_stream(body)
}

impl ResponseSse {
    /// Queues one event of `kind` with `fields`.
    fn send(&mut self, kind: &str, fields: Value) {
        let mut event = json!({"type": kind, "sequence_number": self.sequence_number});
        if let (Some(e), Value::Object(f)) = (event.as_object_mut(), fields) {
            e.extend(f);
        }
        self.sequence_number += 1;
        self.queue
            .push_back(Bytes::from(format!("event: {kind}\ndata: {event}\n\n")));
    }

    /// Queues the output's events so far.
    fn send_output(&mut self) {
        for mut e in std::mem::take(&mut self.output.events) {
            let kind = e["type"].as_str().unwrap_or("").to_string();
            if let Some(o) = e.as_object_mut() {
                o.remove("type");
            }
            self.send(&kind, e);
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
            match self.stream.next().await {
                Some(Event::Prompt { .. } | Event::Embedding { .. }) => {} // never asked for here
                Some(Event::Token { index: 0, text, .. }) => {
                    self.log.num_tokens += 1;
                    let pieces = self.reply.push(&text, false);
                    self.output.push(pieces);
                    self.send_output();
                }
                Some(Event::Token { .. }) => {}
                Some(Event::Finished {
                    index: 0,
                    reason,
                    text,
                    usage,
                }) => {
                    let pieces = self.reply.push(&text, true);
                    self.output.push(pieces);
                    let body = finish(
                        &self.state,
                        &self.log.info,
                        &self.meta,
                        &mut self.output,
                        Some(reason),
                        &usage,
                    );
                    self.send_output();
                    let kind = if body["status"] == "incomplete" {
                        "response.incomplete"
                    } else {
                        "response.completed"
                    };
                    self.send(kind, json!({ "response": body }));
                    let note = log_note(&[usage], &[Some(reason)], true);
                    self.end(&note);
                }
                Some(Event::Finished { .. }) => {}
                Some(Event::Error(e)) => {
                    self.output.close(true);
                    self.send_output();
                    let mut body = response_object(&self.meta, "failed", self.output.items.clone());
                    body["error"] = json!({"code": "server_error", "message": format!("generation failed: {e}")});
                    self.send("response.failed", json!({ "response": body }));
                    self.end(&format!("error: {e}"));
                }
                None => self.end("ended without a finish"),
            }
        }
    }

    fn end(&mut self, note: &str) {
        self.done = true;
        self.log.end(note);
    }
}

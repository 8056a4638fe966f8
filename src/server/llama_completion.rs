//! llama-server's native generation routes, for the front ends written for it (llama.vscode,
//! llama.vim, its web UI, scripts): `POST /completion` (a prompt as text, token ids or both) and
//! `POST /infill` (fill-in-the-middle with repository context, built from the model's FIM
//! tokens). Bodies are read by `crate::api::llama` (sampling through the shared rules) on the
//! planner pool; the reply is llama-server's (`content`, `tokens_cached`, `timings`,
//! `completion_probabilities`, ...), whole or streamed as `data: {...}` chunks with no
//! `[DONE]`, built by `llama_reply`. One of llama-server's own stops aborts the request (and
//! reads its last events for the prompt's counts), as does a client that hangs up; what it
//! evaluated stays in the prefix cache.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use super::body::json_object;
use super::error::ApiError;
use super::llama_reply::Generation;
use super::middleware::{LogNote, RequestInfo};
use super::routes::setting;
use super::stream::{event_stream, StreamLog};
use super::AppState;
use crate::api::infill::LLAMA_SERVER_N_BATCH;
use crate::api::llama::{self, LlamaPlan};
use crate::api::plan::Setting;
use crate::engine::RequestStream;

type Shared = State<Arc<AppState>>;
type Body = Result<Bytes, BytesRejection>;

#[derive(Clone, Copy)]
enum Route {
    Completion,
    Infill,
}

/// `POST /completion`.
pub async fn completion(
    State(state): Shared,
    Extension(info): Extension<RequestInfo>,
    body: Body,
) -> Result<Response, ApiError> {
    generate(state, info, body, Route::Completion).await
}

/// `POST /infill`.
pub async fn infill(
    State(state): Shared,
    Extension(info): Extension<RequestInfo>,
    body: Body,
) -> Result<Response, ApiError> {
    generate(state, info, body, Route::Infill).await
}

/// Reads the body on the planner pool (llama-server's sampling defaults, a fresh seed),
/// submits it under the caller's cache key, and answers whole or streamed.
async fn generate(
    state: Arc<AppState>,
    info: RequestInfo,
    body: Body,
    route: Route,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let planned = state.clone();
    let tenant = info.cache_key;
    let LlamaPlan { plan, options } = state
        .planner
        .run(move || {
            let map = json_object(body, planned.max_body_bytes)?;
            let setting = Setting {
                sampling: llama::llama_sampling(super::random_seed()),
                ..setting(&planned, tenant)
            };
            Ok(match route {
                Route::Completion => llama::completion(setting, &map)?,
                Route::Infill => llama::infill(setting, &map, LLAMA_SERVER_N_BATCH)?,
            })
        })
        .await?;
    let mut request = plan.request;
    request.cache_key = info.cache_key;
    let param = match route {
        Route::Completion => "prompt",
        Route::Infill => "input_prefix",
    };
    let stream = state
        .engine
        .submit(request.clone())
        .map_err(|e| ApiError::from_submit(e, param))?;
    let gen = Generation::new(
        request,
        options,
        state.model_id.clone(),
        state.engine.max_seq_len(),
        started,
    );
    if gen.options.stream {
        return Ok(streamed(state, info, stream, gen));
    }
    whole(state, stream, gen).await
}

/// Waits for the whole generation (or one of llama-server's own stops, after which the request
/// is aborted and its last events read for the prompt's counts) and answers its reply.
async fn whole(
    state: Arc<AppState>,
    mut stream: RequestStream,
    mut gen: Generation,
) -> Result<Response, ApiError> {
    let tok = state.engine.tokenizer();
    let mut aborted = false;
    while let Some(event) = stream.next().await {
        gen.on_event(tok, event)?;
        if gen.stopped_here && !aborted {
            // Its last events bring the prompt's counts.
            state.engine.abort(stream.id);
            aborted = true;
        }
    }
    let reply = gen.final_json(tok, false);
    let mut response = Json(reply).into_response();
    response.extensions_mut().insert(LogNote(log_note(&gen)));
    Ok(response)
}

fn log_note(gen: &Generation) -> String {
    format!(
        "prompt={} cached={} completion={} stop={}",
        gen.request.prompt.len(),
        gen.tokens_cached(),
        gen.num_predicted(),
        gen.stop_type_str()
    )
}

/// The stream's state: the engine's events to read until the generation is done, then the
/// final chunk.
struct Sse {
    state: Arc<AppState>,
    stream: Option<RequestStream>,
    gen: Generation,
    log: StreamLog,
    /// The engine was told to stop (generation is done here).
    aborted: bool,
    finished: bool,
}

/// llama-server's stream: one `data: {...}` chunk per token with its `content`, then the
/// final reply (`stop: true`, `timings`); an error as `data: {"error": ...}`.
fn streamed(
    state: Arc<AppState>,
    info: RequestInfo,
    stream: RequestStream,
    gen: Generation,
) -> Response {
    let sse = Sse {
        state,
        stream: Some(stream),
        gen,
        log: StreamLog::new(info),
        aborted: false,
        finished: false,
    };
    let body = futures_util::stream::unfold(sse, |mut sse| async move {
        let bytes = sse.next_bytes().await?;
        Some((Ok::<Bytes, Infallible>(bytes), sse))
    });
    event_stream(body)
}

impl Sse {
    async fn next_bytes(&mut self) -> Option<Bytes> {
        if self.finished {
            return None;
        }
        let data = |v: serde_json::Value| Some(Bytes::from(format!("data: {v}\n\n")));
        loop {
            let tok = self.state.engine.tokenizer();
            let event = match self.stream.as_mut() {
                Some(stream) => {
                    if self.gen.stopped_here && !self.aborted {
                        self.state.engine.abort(stream.id);
                        self.aborted = true;
                    }
                    stream.next().await
                }
                None => None,
            };
            let Some(event) = event else {
                // Done (or the engine's stream ended): abort what is left, send the reply.
                self.stream = None;
                self.finished = true;
                self.log.end(&log_note(&self.gen));
                return data(self.gen.final_json(tok, true));
            };
            match self.gen.on_event(tok, event) {
                Ok(Some(piece)) => {
                    self.log.num_tokens += usize::from(piece.token.is_some());
                    return data(self.gen.chunk(&piece));
                }
                Ok(None) => continue,
                Err(e) => {
                    self.stream = None;
                    self.finished = true;
                    self.log.end(&format!("error: {}", e.message));
                    return data(e.body());
                }
            }
        }
    }
}

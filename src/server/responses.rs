//! The OpenAI Responses API: `POST /v1/responses` (whole or streamed), `GET` and `DELETE
//! /v1/responses/{id}` (the store), and `POST /v1/responses/input_tokens`. A body is translated
//! into a chat body (`crate::api::responses`) on the planner pool, with the stored conversation
//! of `previous_response_id` first, and submitted like a chat completion
//! (`routes::submit`); the reply is taken apart by `api::reply_stream::ReplyStream` into output
//! items (`responses_output`), whole here or streamed by `responses_stream`. Errors are
//! OpenAI-shaped and name the Responses field. Registered by `server::router`.

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{json, Map, Value};

use super::body::json_object;
use super::error::ApiError;
use super::middleware::{LogNote, RequestInfo};
use super::response::{collect, log_note};
use super::response_store::Stored;
use super::responses_output::Output;
use super::routes::{self, Submitted};
use super::AppState;
use crate::api::plan;
use crate::api::reply_stream::ReplyStream;
use crate::api::request::Endpoint;
use crate::api::responses::{self, Translated};
use crate::engine::{FinishReason, Usage};

type Shared = State<Arc<AppState>>;
type Body = Result<Bytes, BytesRejection>;

/// What a response needs besides its output: the translated body and its identity.
pub(super) struct Meta {
    pub t: Translated,
    pub id: String,
    pub created: u64,
    pub model: String,
}

/// Reads and translates a body (on a planner thread), with the conversation it continues.
fn read(
    state: &AppState,
    map: &Map<String, Value>,
    owner: Option<u64>,
) -> Result<Translated, ApiError> {
    let previous = match responses::previous_response_id(map)? {
        Some(id) => {
            state
                .responses
                .get(id, owner)
                .ok_or_else(|| not_found("previous_response_id", id))?
                .conversation
        }
        None => Vec::new(),
    };
    let t = responses::translate(map, &previous)?;
    if !t.ignored_tools.is_empty() {
        eprintln!(
            "edge-llm serve: /v1/responses: tools left out (not run by this server): {}",
            t.ignored_tools.join(", ")
        );
    }
    Ok(t)
}

fn not_found(param: &str, id: &str) -> ApiError {
    let mut e = ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!("`{param}`: no response with id '{id}' is stored here (for this API key)"),
    );
    e.param = Some(param.to_string());
    if param == "previous_response_id" {
        e.with_code("previous_response_not_found")
    } else {
        e.with_code("response_not_found")
    }
}

/// An error about the chat body named as the Responses field it came from.
fn renamed(mut e: ApiError, t: Option<&Translated>) -> ApiError {
    if let (Some(p), Some(t)) = (e.param.as_deref(), t) {
        let renamed = responses::responses_param(p, t);
        if renamed != p {
            e.message = e.message.replace(p, &renamed);
            e.param = Some(renamed);
        }
    }
    e
}

/// `POST /v1/responses`.
pub async fn create(
    State(state): Shared,
    Extension(info): Extension<RequestInfo>,
    body: Body,
) -> Result<Response, ApiError> {
    let side: Arc<Mutex<Option<Translated>>> = Arc::default();
    let put = side.clone();
    let owner = info.cache_key;
    let submitted = routes::submit(&state, &info, Endpoint::Chat, "resp", move |s| {
        let map = json_object(body, s.max_body_bytes)?;
        let t = read(s, &map, owner)?;
        let chat = t.chat.clone();
        *put.lock().unwrap_or_else(|e| e.into_inner()) = Some(t);
        Ok(chat)
    })
    .await;
    let t = side.lock().unwrap_or_else(|e| e.into_inner()).take();
    let Submitted {
        mut stream,
        parsing,
        id,
        ..
    } = submitted.map_err(|e| renamed(e, t.as_ref()))?;
    let Some(t) = t else {
        return Err(ApiError::internal("the body was not read"));
    };
    let meta = Meta {
        t,
        id: id.replace('-', "_"),
        created: super::unix_now(),
        model: state.model_id.clone(),
    };
    if meta.t.stream {
        return Ok(super::responses_stream::sse(
            state, info, stream, parsing, meta,
        ));
    }
    let choice = collect(&mut stream, 1).await?.remove(0);
    let mut output =
        Output::new(&meta.id, meta.t.custom_tools.clone()).forcing(meta.t.forced_custom.clone());
    output.push(ReplyStream::new(&parsing).push(&choice.text, true));
    let body = finish(
        &state,
        &info,
        &meta,
        &mut output,
        choice.finish,
        &choice.usage,
    );
    let mut response = Json(body).into_response();
    response
        .extensions_mut()
        .insert(LogNote(log_note(&[choice.usage], &[choice.finish], false)));
    Ok(response)
}

/// Closes the output, builds the final response and stores it when asked to.
pub(super) fn finish(
    state: &AppState,
    info: &RequestInfo,
    meta: &Meta,
    output: &mut Output,
    finish: Option<FinishReason>,
    usage: &Usage,
) -> Value {
    let incomplete = finish == Some(FinishReason::Length);
    output.close(incomplete);
    let reasoning_tokens = output
        .items
        .iter()
        .filter(|i| i["type"] == "reasoning")
        .filter_map(|i| i["content"][0]["text"].as_str())
        .map(|t| {
            state
                .engine
                .tokenizer()
                .encode(t, false, false)
                .map_or(0, |ids| ids.len())
        })
        .sum::<usize>();
    let status = if incomplete {
        "incomplete"
    } else {
        "completed"
    };
    let mut body = response_object(meta, status, output.items.clone());
    body["usage"] = json!({
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens.min(usage.completion_tokens)},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    });
    if incomplete {
        body["incomplete_details"] = json!({"reason": "max_output_tokens"});
    }
    if meta.t.store {
        let mut conversation = meta.t.conversation.clone();
        conversation.extend(output.assistant_messages());
        state.responses.insert(
            &meta.id,
            info.cache_key,
            Stored {
                response: body.clone(),
                conversation,
            },
        );
    }
    body
}

/// The response object with `status` and `output` (no `usage` yet).
pub(super) fn response_object(meta: &Meta, status: &str, output: Vec<Value>) -> Value {
    let chat = &meta.t.chat;
    let mut body = json!({
        "id": meta.id,
        "object": "response",
        "created_at": meta.created,
        "status": status,
        "background": false,
        "error": null,
        "incomplete_details": null,
        "instructions": null,
        "metadata": {},
        "model": meta.model,
        "output": output,
        "parallel_tool_calls": true,
        "temperature": chat.get("temperature").cloned().unwrap_or(json!(1.0)),
        "top_p": chat.get("top_p").cloned().unwrap_or(json!(1.0)),
        "tool_choice": "auto",
        "tools": [],
        "store": meta.t.store,
        "usage": null,
    });
    for (k, v) in &meta.t.echo {
        body[k] = v.clone();
    }
    body
}

/// `GET /v1/responses/{id}`.
pub async fn get(
    State(state): Shared,
    Extension(info): Extension<RequestInfo>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    state
        .responses
        .get(&id, info.cache_key)
        .map(|s| Json(s.response))
        .ok_or_else(|| not_found("id", &id))
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete(
    State(state): Shared,
    Extension(info): Extension<RequestInfo>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if state.responses.remove(&id, info.cache_key) {
        Ok(Json(
            json!({"id": id, "object": "response.deleted", "deleted": true}),
        ))
    } else {
        Err(not_found("id", &id))
    }
}

/// `POST /v1/responses/input_tokens`: the prompt tokens the body would run.
pub async fn input_tokens(
    State(state): Shared,
    Extension(info): Extension<RequestInfo>,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let planned = state.clone();
    let owner = info.cache_key;
    let n = state
        .planner
        .run(move || {
            let map = json_object(body, planned.max_body_bytes)?;
            let t = read(&planned, &map, owner)?;
            let setting = routes::setting(&planned, owner);
            plan::prompt_ids(&setting, Endpoint::Chat, &t.chat)
                .map(|ids| ids.len())
                .map_err(|e| renamed(e.into(), Some(&t)))
        })
        .await?;
    Ok(Json(
        json!({"object": "response.input_tokens", "input_tokens": n}),
    ))
}

//! Anthropic's Messages API on the chat path: `POST /v1/messages` (also `/messages`, any query
//! such as `?beta=true`) and `POST /v1/messages/count_tokens`. A body is translated by
//! `api::messages` into a chat body on the planner pool, planned by the shared rules and
//! submitted; the reply comes back as a message object (whole) or as Anthropic's events
//! (`messages_stream`). [`anthropic_errors`] answers every error on these paths, the
//! middleware's too (auth, body limits, a busy planner), in Anthropic's shape. The model
//! named in a body is not checked: the loaded model serves every name, and `model` in the
//! reply says which it is.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{json, Map, Value};

use super::body::json_object;
use super::error::ApiError;
use super::messages_stream::{self, stop_reason, stop_sequence, Blocks};
use super::middleware::{LogNote, RequestInfo};
use super::response::{collect, log_note};
use super::routes::{setting, submit_capped, Submitted};
use super::AppState;
use crate::api::messages::{messages_param, translate, DEFAULT_MAX_TOKENS};
use crate::api::plan;
use crate::api::reply_stream::ReplyStream;
use crate::api::request::Endpoint;

type Shared = State<Arc<AppState>>;
type Body = Result<Bytes, BytesRejection>;

/// Whether `path` is one of the Messages routes (or under them), whose errors are Anthropic's.
pub fn is_messages_path(path: &str) -> bool {
    ["/v1/messages", "/messages"]
        .iter()
        .any(|p| path == *p || path.starts_with(&format!("{p}/")))
}

/// Anthropic's error type for an HTTP status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

/// `{"type": "error", "error": {"type", "message"}}`.
pub fn anthropic_body(status: StatusCode, message: &str) -> Value {
    json!({"type": "error", "error": {"type": error_type(status), "message": message}})
}

/// Rewrites every `ApiError` answered on a Messages path into Anthropic's shape (the status
/// and headers kept).
pub async fn anthropic_errors(req: Request, next: Next) -> Response {
    if !is_messages_path(req.uri().path()) {
        return next.run(req).await;
    }
    let response = next.run(req).await;
    let Some(e) = response.extensions().get::<ApiError>().cloned() else {
        return response;
    };
    let (mut parts, _) = response.into_parts();
    let body = serde_json::to_vec(&anthropic_body(e.status, &e.message)).unwrap_or_default();
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(body))
}

/// A chat-rule refusal with its field named as the Messages body names it.
fn renamed(mut e: ApiError) -> ApiError {
    if let Some(old) = e.param.clone() {
        let new = messages_param(&old);
        if new != old {
            e.message = e.message.replace(&old, &new);
            e.param = Some(new);
        }
    }
    e
}

/// The body read and translated, with `max_tokens` as a cap (see `routes::submit_capped`).
fn read(state: &AppState, body: Body) -> Result<(Map<String, Value>, Option<usize>), ApiError> {
    let map = json_object(body, state.max_body_bytes)?;
    let t = translate(&map)?;
    if !t.ignored_tools.is_empty() {
        eprintln!(
            "messages: ignoring Anthropic server tools {} (this server runs client tools only)",
            t.ignored_tools.join(", ")
        );
    }
    let mut chat = t.chat;
    let cap = chat
        .remove("max_tokens")
        .and_then(|v| v.as_u64())
        .unwrap_or(DEFAULT_MAX_TOKENS);
    Ok((chat, Some(cap as usize)))
}

/// `POST /v1/messages`.
pub async fn messages(
    State(state): Shared,
    Extension(info): Extension<RequestInfo>,
    body: Body,
) -> Result<Response, ApiError> {
    let stream_wanted = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stream_wanted.clone();
    let Submitted {
        mut stream,
        params,
        parsing,
        id,
        num_prompt,
    } = submit_capped(&state, &info, Endpoint::Chat, "msg", move |s| {
        let (chat, cap) = read(s, body)?;
        flag.store(
            chat.get("stream") == Some(&Value::Bool(true)),
            std::sync::atomic::Ordering::Relaxed,
        );
        Ok((chat, cap))
    })
    .await
    .map_err(renamed)?;
    let id = id.replacen("msg-", "msg_", 1);
    let mut reply = ReplyStream::new(&parsing);
    if stream_wanted.load(std::sync::atomic::Ordering::Relaxed) {
        let message = json!({"id": id, "type": "message", "role": "assistant",
            "model": state.model_id, "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": num_prompt, "output_tokens": 0,
                      "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}});
        return Ok(messages_stream::sse_response(
            message,
            stream,
            reply,
            params.stop,
            info,
        ));
    }
    let choices = collect(&mut stream, 1).await?;
    let choice = choices.into_iter().next().unwrap_or_default();
    let mut blocks = Blocks::new(&id);
    for piece in reply.push(&choice.text, true) {
        blocks.push(piece);
    }
    blocks.close();
    let body = json!({
        "id": id, "type": "message", "role": "assistant", "model": state.model_id,
        "content": blocks.done,
        "stop_reason": stop_reason(choice.finish, &choice.usage, blocks.made_calls()),
        "stop_sequence": stop_sequence(&choice.usage, &params.stop),
        "usage": messages_stream::usage(&choice.usage),
    });
    let mut response = Json(body).into_response();
    response
        .extensions_mut()
        .insert(LogNote(log_note(&[choice.usage], &[choice.finish], false)));
    Ok(response)
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens": N}`, the prompt tokens a generation of
/// the same body reports (`input_tokens` + `cache_read_input_tokens`).
pub async fn count_tokens(
    State(state): Shared,
    Extension(info): Extension<RequestInfo>,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let planned = state.clone();
    let tenant = info.cache_key;
    let n = state
        .planner
        .run(move || {
            let (chat, _) = read(&planned, body)?;
            plan::prompt_ids(&setting(&planned, tenant), Endpoint::Chat, &chat)
                .map(|ids| ids.len())
                .map_err(|e| renamed(e.into()))
        })
        .await?;
    Ok(Json(json!({"input_tokens": n})))
}

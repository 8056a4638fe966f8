//! The prefix cache's routes: `GET /v1/cache` (what is pinned, blocks in memory and on disk)
//! and `POST /v1/cache/pin` (compute a prompt, or load it from disk, and pin its blocks).
//! Behind the API-key guard like every route; pinned prompts are shared by every key.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use super::body::json_object;
use super::error::ApiError;
use super::AppState;
use crate::api::request::{self as params, Fields};
use crate::chat_template::encode_prompt;
use crate::engine::{Event, SubmitError};
use crate::flags::cache::{pin_request, pinned_from};

/// A pinned prompt, as `GET /v1/cache` lists it.
#[derive(Clone, Debug)]
pub struct PinRecord {
    /// Where it came from: a `--pin-prompt` file or `POST /v1/cache/pin`.
    pub source: String,
    pub prompt_tokens: usize,
}

impl PinRecord {
    fn json(&self) -> Value {
        json!({"source": self.source, "prompt_tokens": self.prompt_tokens})
    }
}

pub async fn cache_info(State(state): State<Arc<AppState>>) -> Json<Value> {
    let m = state.engine.metrics().unwrap_or_default();
    let pinned: Vec<Value> = state
        .pins
        .lock()
        .map(|p| p.iter().map(PinRecord::json).collect())
        .unwrap_or_default();
    let disk = match &m.disk_cache {
        Some(d) => json!({
            "enabled": true,
            "blocks": d.blocks,
            "bytes": d.bytes,
            "budget_bytes": d.budget_bytes,
            "hit_blocks": d.hit_blocks,
            "rejected_files": d.rejected_files,
        }),
        None => json!({"enabled": false}),
    };
    Json(json!({
        "object": "cache",
        "block_size": state.engine.config.block_size,
        "pinned": pinned,
        "memory": {
            "blocks_total": m.blocks_total,
            "blocks_used": m.blocks_used,
            "blocks_cached": m.blocks_cached,
            "blocks_free": m.blocks_free,
            "blocks_pinned": m.blocks_pinned,
        },
        "disk": disk,
    }))
}

pub async fn pin(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let planned = state.clone();
    let (tokens, param) = state
        .planner
        .run(move || pin_tokens(&planned, body))
        .await?;
    if tokens.is_empty() {
        return Err(ApiError::from_submit(SubmitError::EmptyPrompt, param));
    }
    let mut stream = state
        .engine
        .submit(pin_request(tokens))
        .map_err(|e| ApiError::from_submit(e, param))?;
    let end = loop {
        match stream.next().await {
            Some(Event::Token { .. }) => continue,
            e => break e,
        }
    };
    let pinned = pinned_from(end).map_err(|e| ApiError::invalid(param, format!("{e:#}")))?;
    let record = PinRecord {
        source: "POST /v1/cache/pin".into(),
        prompt_tokens: pinned.prompt_tokens,
    };
    if let Ok(mut p) = state.pins.lock() {
        p.push(record);
    }
    let m = state.engine.metrics().unwrap_or_default();
    Ok(Json(json!({
        "object": "cache.pin",
        "pinned": true,
        "prompt_tokens": pinned.prompt_tokens,
        "cached_tokens": pinned.cached_tokens,
        "blocks_pinned": m.blocks_pinned,
    })))
}

/// The token ids of a pin body and the field they came from, on a planner thread.
fn pin_tokens(
    state: &AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<(Vec<u32>, &'static str), ApiError> {
    let map = json_object(body, state.max_body_bytes)?;
    let f = Fields(&map);
    let tok = &state.engine.tokenizer();
    Ok(if f.get("messages").is_some() {
        let messages = params::messages(&f)?;
        let template = state
            .template
            .as_ref()
            .map_err(|why| ApiError::bad_request(why.clone()).with_code("no_chat_template"))?;
        let text = template
            .render(&messages, false)
            .map_err(|e| ApiError::invalid("messages", format!("{e:#}")))?;
        let ids = encode_prompt(tok, &text)
            .map_err(|e| ApiError::invalid("messages", format!("cannot tokenize: {e:#}")))?;
        (ids, "messages")
    } else {
        let Some(text) = f.str("prompt")? else {
            return Err(ApiError::invalid(
                "prompt",
                "give the text to pin in `prompt`, or chat messages in `messages`",
            ));
        };
        let ids = encode_prompt(tok, text)
            .map_err(|e| ApiError::invalid("prompt", format!("cannot tokenize: {e:#}")))?;
        (ids, "prompt")
    })
}

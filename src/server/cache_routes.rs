//! The prefix cache's routes: `GET /v1/cache` (what is pinned, blocks in memory and on disk),
//! `POST /v1/cache/pin` (compute a prompt, or load it from disk, and pin its blocks) and
//! `DELETE /v1/cache/pin/{id}` (release a pin). A pinned prompt's blocks serve every key, but
//! each pin belongs to the key that made it: only that key (or an admin key) lists and removes
//! it, a key's pins together hold at most `--pin-budget-tokens`, the same prompt pinned twice by
//! one key is one pin, and with API keys only an `--admin-api-key` may pin (pins hold memory
//! every tenant shares). `--pin-prompt` pins belong to the server.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde_json::{json, Value};

use super::body::json_object;
use super::error::ApiError;
use super::middleware::RequestInfo;
use super::AppState;
use crate::api::request::{self as params, Fields};
use crate::chat_template::{encode_prompt, ChatTemplate};
use crate::engine::{Event, SubmitError};
use crate::flags::cache::{pin_request, pinned_from};
use crate::tokenizer::Tokenizer;

/// A pinned prompt, as `GET /v1/cache` lists it.
#[derive(Clone, Debug)]
pub struct PinRecord {
    /// The engine's pin id.
    pub pin: u64,
    /// Where it came from: a `--pin-prompt` file or `POST /v1/cache/pin`.
    pub source: String,
    pub prompt_tokens: usize,
    /// The key that pinned it (its cache salt); None: the server (`--pin-prompt`), or a server
    /// without keys.
    pub owner: Option<u64>,
    /// A digest of its token ids (one key pinning the same prompt twice gets the same pin).
    pub digest: u64,
}

impl PinRecord {
    fn json(&self) -> Value {
        json!({"id": pin_name(self.pin), "source": self.source, "prompt_tokens": self.prompt_tokens})
    }
}

fn pin_name(pin: u64) -> String {
    format!("pin-{pin}")
}

/// The digest of a prompt's token ids.
pub fn digest(tokens: &[u32]) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    tokens.hash(&mut h);
    h.finish()
}

/// Whether the caller (`owner`: its key's salt) sees and may remove pin `p`: its own, and
/// everything for an admin key or a server without keys.
fn visible(state: &AppState, owner: Option<u64>, p: &PinRecord) -> bool {
    p.owner == owner || state.sees_server(owner)
}

pub async fn cache_info(
    State(state): State<Arc<AppState>>,
    Extension(info): Extension<RequestInfo>,
) -> Json<Value> {
    let m = state.engine.metrics().unwrap_or_default();
    let pinned: Vec<Value> = state
        .pins
        .lock()
        .map(|p| {
            p.iter()
                .filter(|p| visible(&state, info.cache_key, p))
                .map(PinRecord::json)
                .collect()
        })
        .unwrap_or_default();
    let disk = match &m.disk_cache {
        Some(d) => json!({
            "enabled": true,
            "blocks": d.blocks,
            "bytes": d.bytes,
            "budget_bytes": d.budget_bytes,
            "hit_blocks": d.hit_blocks,
            "rejected_files": d.rejected_files,
            "state_snapshots": d.states,
            "hit_state_snapshots": d.hit_states,
        }),
        None => json!({"enabled": false}),
    };
    if !state.sees_server(info.cache_key) {
        // Another key's prompts show in the pool's figures: this key sees its own pins only.
        return Json(json!({
            "object": "cache",
            "block_size": state.engine.config.block_size,
            "pinned": pinned,
        }));
    }
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
    Extension(info): Extension<RequestInfo>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let owner = info.cache_key;
    let admin = owner.is_some_and(|o| state.admin_salts.contains(&o));
    if !state.api_keys.is_empty() && !admin {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "permission_error",
            "pinning needs an admin key (--admin-api-key): pinned prompts hold memory every key shares",
        )
        .with_code("pin_not_allowed"));
    }
    let planned = state.clone();
    let (tokens, param) = state
        .planner
        .run(move || pin_tokens(&planned, body))
        .await?;
    if tokens.is_empty() {
        return Err(ApiError::from_submit(SubmitError::EmptyPrompt, param));
    }
    let digest = digest(&tokens);
    let (held, same) = state.pins.lock().map_or((0, None), |pins| {
        let mine = pins.iter().filter(|p| p.owner == owner);
        let held = mine.clone().map(|p| p.prompt_tokens).sum::<usize>();
        (held, mine.into_iter().find(|p| p.digest == digest).cloned())
    });
    if let Some(p) = same {
        return Ok(Json(pin_answer(&state, &p, p.prompt_tokens, true)));
    }
    if held + tokens.len() > state.pin_budget_tokens {
        return Err(ApiError::invalid(
            param,
            format!(
                "this key's pins hold {held} tokens; {} more would pass its budget of {} (--pin-budget-tokens); remove a pin first (DELETE /v1/cache/pin/ID)",
                tokens.len(),
                state.pin_budget_tokens
            ),
        )
        .with_code("pin_budget_exceeded"));
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
    let pinned =
        pinned_from(stream.id, end).map_err(|e| ApiError::invalid(param, format!("{e:#}")))?;
    let record = PinRecord {
        pin: pinned.pin,
        source: "POST /v1/cache/pin".into(),
        prompt_tokens: pinned.prompt_tokens,
        owner,
        digest,
    };
    if let Ok(mut p) = state.pins.lock() {
        p.push(record.clone());
    }
    Ok(Json(pin_answer(
        &state,
        &record,
        pinned.cached_tokens,
        false,
    )))
}

/// The answer to a pin: its id, its size, and the pool's pinned blocks now.
fn pin_answer(state: &AppState, p: &PinRecord, cached_tokens: usize, existing: bool) -> Value {
    let m = state.engine.metrics().unwrap_or_default();
    json!({
        "object": "cache.pin",
        "id": pin_name(p.pin),
        "pinned": true,
        "already_pinned": existing,
        "prompt_tokens": p.prompt_tokens,
        "cached_tokens": cached_tokens,
        "blocks_pinned": m.blocks_pinned,
    })
}

/// `DELETE /v1/cache/pin/{id}`: releases one of the caller's pins (any, for an admin key).
pub async fn unpin(
    State(state): State<Arc<AppState>>,
    Extension(info): Extension<RequestInfo>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let pin = id.strip_prefix("pin-").unwrap_or(&id).parse::<u64>().ok();
    let found = pin.and_then(|pin| {
        let mut pins = state.pins.lock().ok()?;
        let at = pins
            .iter()
            .position(|p| p.pin == pin && visible(&state, info.cache_key, p))?;
        Some(pins.remove(at))
    });
    let Some(record) = found else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("no pin `{id}` of this key (GET /v1/cache lists them)"),
        )
        .with_code("pin_not_found"));
    };
    let engine = state.engine.clone();
    let released = tokio::task::spawn_blocking(move || engine.unpin(record.pin))
        .await
        .unwrap_or(false);
    let m = state.engine.metrics().unwrap_or_default();
    Ok(Json(json!({
        "object": "cache.pin",
        "id": pin_name(record.pin),
        "deleted": released,
        "blocks_pinned": m.blocks_pinned,
    })))
}

/// The token ids of a pin body and the field they came from, on a planner thread.
fn pin_tokens(
    state: &AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<(Vec<u32>, &'static str), ApiError> {
    let map = json_object(body, state.max_body_bytes)?;
    pin_body_tokens(&map, &state.engine.tokenizer(), state.template.as_ref())
}

/// The token ids of a pin body (`prompt`, or chat `messages` rendered with `template`) and the
/// field they came from. Also the fuzz target `request`'s.
pub fn pin_body_tokens(
    map: &serde_json::Map<String, Value>,
    tok: &Tokenizer,
    template: Result<&ChatTemplate, &String>,
) -> Result<(Vec<u32>, &'static str), ApiError> {
    let f = Fields(map);
    Ok(if f.get("messages").is_some() {
        let messages = params::messages(&f)?;
        let template = template
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

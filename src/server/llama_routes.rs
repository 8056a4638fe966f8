//! llama-server's discovery routes, in its shapes, for the front ends and agents written for it:
//! `GET /props` (the context length, the model, its chat template and special tokens, the
//! default sampling settings), `POST /apply-template` (a chat body's prompt text, rendered as
//! the request would be) and `GET /slots` (the live sequences: counts, never their text; a key
//! that is not an admin key sees only its own); and vLLM's `GET /tokenizer_info`, which
//! lm-evaluation-harness reads.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::{Extension, Json};
use serde_json::{json, Value};

use super::body::json_object;
use super::error::ApiError;
use super::middleware::RequestInfo;
use super::routes::setting;
use super::AppState;
use crate::api::plan;

type Shared = State<Arc<AppState>>;

/// `GET /props`.
pub async fn props(State(state): Shared) -> Json<Value> {
    let tok = state.engine.tokenizer();
    let token = |id: Option<u32>| id.map_or(String::new(), |id| tok.token_text(id).to_string());
    let sampling = setting(&state, None).sampling;
    let n_ctx = state.engine.max_seq_len();
    Json(json!({
        "default_generation_settings": {
            "n_ctx": n_ctx,
            "params": {
                "n_predict": -1,
                "temperature": sampling.temperature,
                "top_k": sampling.top_k,
                "top_p": sampling.top_p,
                "min_p": sampling.min_p,
                "repeat_penalty": sampling.repeat_penalty,
                "repeat_last_n": sampling.repeat_last_n,
                "presence_penalty": sampling.presence_penalty,
                "frequency_penalty": sampling.frequency_penalty,
                "dry_multiplier": sampling.dry_multiplier,
                "dry_base": sampling.dry_base,
                "dry_allowed_length": sampling.dry_allowed_length,
                "dry_penalty_last_n": sampling.dry_penalty_last_n,
                "dry_sequence_breakers": sampling.dry_sequence_breakers,
                "xtc_probability": sampling.xtc_probability,
                "xtc_threshold": sampling.xtc_threshold,
                "typical_p": sampling.typical_p,
                "top_n_sigma": sampling.top_n_sigma,
                "mirostat": sampling.mirostat,
                "mirostat_tau": sampling.mirostat_tau,
                "mirostat_eta": sampling.mirostat_eta,
                "dynatemp_range": sampling.dynatemp_range,
                "dynatemp_exponent": sampling.dynatemp_exponent,
                "min_keep": sampling.min_keep,
                "samplers": sampling.samplers.iter().map(|k| k.name()).collect::<Vec<_>>(),
                "stream": false,
            },
        },
        "total_slots": state.engine.config.max_seqs,
        "model_alias": state.model_id,
        "model_path": state.engine.model_path().display().to_string(),
        "modalities": {"vision": false, "video": false, "audio": false},
        "endpoint_slots": true,
        "endpoint_props": true,
        "endpoint_metrics": true,
        "chat_template": state.template.as_ref().map_or("", |t| t.source()),
        "bos_token": token(tok.bos_id()),
        "eos_token": token(tok.eos_id()),
        "build_info": format!("edge-llm {}", env!("CARGO_PKG_VERSION")),
        "is_sleeping": false,
    }))
}

/// `POST /apply-template`: `{"prompt": TEXT}`, the text a chat body's messages (and tools)
/// render to, as `/v1/chat/completions` would run it.
pub async fn apply_template(
    State(state): Shared,
    Extension(info): Extension<RequestInfo>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let planned = state.clone();
    let prompt = state
        .planner
        .run(move || {
            let map = json_object(body, planned.max_body_bytes)?;
            Ok(plan::chat_text(&setting(&planned, info.cache_key), &map)?)
        })
        .await?;
    Ok(Json(json!({ "prompt": prompt })))
}

/// `GET /slots`: one entry per live sequence, llama-server's fields where they map (`id`,
/// `n_ctx`, `is_processing`, `n_prompt_tokens`, `n_prompt_tokens_cache`, `next_token`).
pub async fn slots(State(state): Shared, Extension(info): Extension<RequestInfo>) -> Json<Value> {
    let m = state.engine.metrics().unwrap_or_default();
    let everyone = state.sees_server(info.cache_key);
    let n_ctx = state.engine.max_seq_len();
    let slots: Vec<Value> = m
        .sequences
        .iter()
        .filter(|s| everyone || s.tenant == info.cache_key)
        .map(|s| {
            json!({
                "id": s.seq_id,
                "n_ctx": n_ctx,
                "is_processing": s.running,
                "n_prompt_tokens": s.prompt_tokens,
                "n_prompt_tokens_cache": s.cached_tokens,
                "n_prompt_tokens_processed": s.computed_tokens.min(s.prompt_tokens),
                "next_token": [{
                    "n_decoded": s.generated_tokens,
                    "n_remain": s.max_tokens.saturating_sub(s.generated_tokens),
                    "has_next_token": s.generated_tokens < s.max_tokens,
                }],
            })
        })
        .collect();
    Json(Value::Array(slots))
}

/// `GET /tokenizer_info` (vLLM's): the special tokens and the chat template, for clients that
/// tokenize through the server (lm-evaluation-harness's remote tokenizer).
pub async fn tokenizer_info(State(state): Shared) -> Json<Value> {
    let tok = state.engine.tokenizer();
    let token = |id: Option<u32>| id.map(|id| tok.token_text(id).to_string());
    Json(json!({
        "tokenizer_class": "gguf",
        "bos_token": token(tok.bos_id()),
        "eos_token": token(tok.eos_id()),
        "add_bos_token": tok.add_bos_default(),
        "chat_template": state.template.as_ref().ok().map(|t| t.source()),
        "model_max_length": state.engine.max_seq_len(),
        "vocab_size": tok.vocab_size(),
    }))
}

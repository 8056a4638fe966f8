//! The handlers: `/v1/completions` and `/v1/chat/completions` (prompt to engine request,
//! then a whole JSON response or a stream), `/v1/models`, `/health`, `/metrics`,
//! `/tokenize` and `/detokenize`. Each reads its body by the rules every face shares
//! (`crate::api`) and answers errors as `ApiError`. Reading bodies, rendering and tokenizing
//! run on the planner pool (`super::planner`); `/health` answers from the HTTP thread at once.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{json, Map, Value};

use super::body::json_object;
use super::error::ApiError;
use super::middleware::{LogNote, RequestInfo};
use super::response::{collect, full_response, log_note, Reply};
use super::stream::{sse_response, StreamShape};
use super::structured;
use super::AppState;
use crate::api::plan::{self, Plan, Setting};
use crate::api::reply::ReplyParsing;
use crate::api::request::{self, Endpoint, Fields};
use crate::chat_template::encode_prompt;
use crate::engine::RequestStream;

type Shared = State<Arc<AppState>>;
type Body = Result<Bytes, BytesRejection>;

pub async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

fn model_card(state: &AppState) -> Value {
    let cfg = state.engine.model_config();
    json!({
        "id": state.model_id,
        "object": "model",
        "created": state.created,
        "owned_by": "edge-llm",
        "meta": {
            "architecture": cfg.architecture,
            "n_ctx": state.engine.config.max_seq_len,
            "n_ctx_train": cfg.n_ctx_train,
            "n_vocab": cfg.vocab_size,
            "n_layers": cfg.num_layers,
        },
    })
}

pub async fn models(State(state): Shared) -> Json<Value> {
    Json(json!({"object": "list", "data": [model_card(&state)]}))
}

pub async fn model(State(state): Shared, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    if id == state.model_id {
        Ok(Json(model_card(&state)))
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("no model `{id}`; this server serves `{}`", state.model_id),
        )
        .with_code("model_not_found"))
    }
}

/// `GET /metrics`: the server's figures for an admin key or a server without keys; another
/// key gets only its own counters (`metrics::tenant`).
pub async fn metrics(
    State(state): Shared,
    Extension(info): Extension<RequestInfo>,
) -> Result<Response, ApiError> {
    let engine = state.engine.clone();
    let snapshot = tokio::task::spawn_blocking(move || engine.metrics())
        .await
        .ok()
        .flatten();
    let m = snapshot.ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "the engine did not answer",
        )
    })?;
    let text = if state.sees_server(info.cache_key) {
        let mut text = super::metrics::prometheus(&m);
        text.push_str(&super::metrics::kv_pool(
            &state.engine.config,
            state.engine.kv_bytes(),
        ));
        text.push_str(&super::metrics::grammar_cache(
            state.engine.grammars.stats(),
            state.engine.grammars.usage(),
        ));
        text.push_str(&super::router_api::worker_metrics(&state, &m));
        text.push_str(&super::metrics::tenants(&m, |salt| {
            state.api_keys.iter().position(|(_, s)| *s == salt)
        }));
        text
    } else {
        let own = info.cache_key.and_then(|k| m.tenants.get(&k));
        super::metrics::tenant(&own.copied().unwrap_or_default())
    };
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

pub async fn completions(
    State(state): Shared,
    Extension(info): Extension<RequestInfo>,
    body: Body,
) -> Result<Response, ApiError> {
    generate(state, info, Endpoint::Completions, body).await
}

pub async fn chat_completions(
    State(state): Shared,
    Extension(info): Extension<RequestInfo>,
    body: Body,
) -> Result<Response, ApiError> {
    generate(state, info, Endpoint::Chat, body).await
}

/// What the server knows that a body does not: OpenAI's sampling defaults with a fresh seed,
/// the template, the grammar cache (`tenant`'s: the API key's salt) and the context length.
pub(super) fn setting(state: &AppState, tenant: Option<u64>) -> Setting<'_> {
    Setting {
        tokenizer: state.engine.tokenizer(),
        template: state.template.as_ref().map_err(String::as_str),
        grammars: Some(&state.engine.grammars),
        max_seq_len: state.engine.max_seq_len(),
        tenant,
        sampling: crate::engine::sampler::SamplingParams {
            temperature: state.default_temperature,
            ..request::openai_sampling(super::random_seed())
        },
        max_tokens: None,
        add_bos: true,
        ignore_eos: false,
    }
}

/// A body planned by the shared rules and submitted: the engine's stream of the request and
/// how to answer it.
pub(super) struct Submitted {
    pub stream: RequestStream,
    /// The fields as read (`stream`, `n`, `logprobs`, ...).
    pub params: request::GenParams,
    /// What to take apart in the reply (tool calls, reasoning).
    pub parsing: ReplyParsing,
    /// The response's id: `prefix`, the server instance and the request's number.
    pub id: String,
    /// The prompt's length in tokens.
    pub num_prompt: usize,
}

/// Plans a body on the planner pool (`read` turns the raw body into the chat or completions
/// body the shared rules read: the Responses and Messages APIs translate theirs there) and
/// submits it under the caller's cache key.
pub(super) async fn submit<F>(
    state: &Arc<AppState>,
    info: &RequestInfo,
    endpoint: Endpoint,
    prefix: &str,
    read: F,
) -> Result<Submitted, ApiError>
where
    F: FnOnce(&AppState) -> Result<Map<String, Value>, ApiError> + Send + 'static,
{
    submit_capped(state, info, endpoint, prefix, move |s| Ok((read(s)?, None))).await
}

/// [`submit`] where `read` may also give a cap on the completion that, unlike `max_tokens`,
/// shrinks to the room the prompt leaves in the context (Anthropic's `max_tokens`, which
/// agents set far above a local model's context).
pub(super) async fn submit_capped<F>(
    state: &Arc<AppState>,
    info: &RequestInfo,
    endpoint: Endpoint,
    prefix: &str,
    read: F,
) -> Result<Submitted, ApiError>
where
    F: FnOnce(&AppState) -> Result<(Map<String, Value>, Option<usize>), ApiError> + Send + 'static,
{
    let planned = state.clone();
    let tenant = info.cache_key;
    let Plan {
        mut request,
        params,
        prompt_param,
        parsing,
    } = state
        .planner
        .run(move || {
            let (map, cap) = read(&planned)?;
            let setting = Setting {
                max_tokens: cap,
                ..setting(&planned, tenant)
            };
            Ok(plan::plan(&setting, endpoint, &map)?)
        })
        .await?;
    request.cache_key = info.cache_key;
    let num_prompt = request.prompt.len();
    let stream = state
        .engine
        .submit(request)
        .map_err(|e| ApiError::from_submit(e, prompt_param))?;
    let id = format!("{prefix}-{:x}{:06x}", state.instance, stream.id);
    Ok(Submitted {
        stream,
        params,
        parsing,
        id,
        num_prompt,
    })
}

/// Reads the body by the shared rules (`crate::api::plan`), submits, and answers with a stream
/// or the whole response.
async fn generate(
    state: Arc<AppState>,
    info: RequestInfo,
    endpoint: Endpoint,
    body: Body,
) -> Result<Response, ApiError> {
    let prefix = match endpoint {
        Endpoint::Completions => "cmpl",
        Endpoint::Chat => "chatcmpl",
    };
    let read = state.clone();
    let (map, beam) = state
        .planner
        .run(move || {
            let mut map = json_object(body, read.max_body_bytes)?;
            let beam = crate::api::beam_fields::take(&mut map, endpoint)?;
            Ok((map, beam))
        })
        .await?;
    if let Some(beam) = beam {
        return super::beam::answer(state, info, endpoint, prefix, map, beam).await;
    }
    let Submitted {
        mut stream,
        params,
        parsing,
        id,
        ..
    } = submit(&state, &info, endpoint, prefix, move |_| Ok(map)).await?;
    let reply = Reply {
        endpoint,
        id,
        created: super::unix_now(),
        model: state.model_id.clone(),
    };
    let with_logprobs = params.logprobs.is_some();
    if params.stream {
        return Ok(sse_response(
            reply,
            state.engine.clone(),
            stream,
            StreamShape {
                n: params.n,
                include_usage: params.include_usage,
                with_logprobs,
            },
            info,
            parsing,
        ));
    }
    let choices = collect(&mut stream, params.n).await?;
    let mut body = full_response(&reply, state.engine.tokenizer(), &choices, with_logprobs);
    if parsing.any() {
        if let Some(items) = body["choices"].as_array_mut() {
            for (index, choice) in items.iter_mut().enumerate() {
                structured::apply_to_choice(choice, &reply.id, index, &parsing);
            }
        }
    }
    let usages: Vec<_> = choices.iter().map(|c| c.usage).collect();
    let finishes: Vec<_> = choices.iter().map(|c| c.finish).collect();
    let mut response = Json(body).into_response();
    response
        .extensions_mut()
        .insert(LogNote(log_note(&usages, &finishes, false)));
    Ok(response)
}

/// llama-server's `/tokenize`: `{"content": TEXT, "add_special": false, "parse_special": true,
/// "with_pieces": false}`, or `{"messages": [...]}` to tokenize a chat through the template.
pub async fn tokenize(State(state): Shared, body: Body) -> Result<Json<Value>, ApiError> {
    let planned = state.clone();
    let tokens = state.planner.run(move || tokens_of(&planned, body)).await?;
    Ok(Json(tokens))
}

/// `/tokenize`'s answer, on a planner thread.
fn tokens_of(state: &AppState, body: Body) -> Result<Value, ApiError> {
    let map = json_object(body, state.max_body_bytes)?;
    let f = Fields(&map);
    let tok = &state.engine.tokenizer();
    // `add_special_tokens`: vLLM's name (lm-evaluation-harness sends it).
    let add_special = match f.bool("add_special")? {
        Some(b) => b,
        None => f.bool("add_special_tokens")?.unwrap_or(false),
    };
    let parse_special = f.bool("parse_special")?.unwrap_or(true);
    let with_pieces = f.bool("with_pieces")?.unwrap_or(false);
    let ids = if f.get("messages").is_some() {
        let messages = request::messages(&f)?;
        let template = state
            .template
            .as_ref()
            .map_err(|why| ApiError::bad_request(why.clone()).with_code("no_chat_template"))?;
        let add_generation_prompt = f.bool("add_generation_prompt")?.unwrap_or(true);
        let prompt = template
            .render(&messages, add_generation_prompt)
            .map_err(|e| ApiError::invalid("messages", format!("{e:#}")))?;
        encode_prompt(tok, &prompt)
    } else {
        let field = if f.get("content").is_some() {
            "content"
        } else {
            "prompt"
        };
        let text = f.str(field)?.ok_or_else(|| {
            ApiError::invalid("content", "`content` (the text to tokenize) is required")
        })?;
        tok.encode(text, add_special && tok.add_bos_default(), parse_special)
    }
    .map_err(|e| ApiError::bad_request(format!("cannot tokenize: {e:#}")))?;
    let tokens: Vec<Value> = if with_pieces {
        ids.iter()
            .map(|&id| json!({"id": id, "piece": String::from_utf8_lossy(&tok.token_bytes(id))}))
            .collect()
    } else {
        ids.iter().map(|&id| json!(id)).collect()
    };
    Ok(
        json!({"tokens": tokens, "count": ids.len(), "max_model_len": state.engine.config.max_seq_len}),
    )
}

/// llama-server's `/detokenize`: `{"tokens": [ids]}` to `{"content": TEXT}` (and vLLM's
/// `"prompt"`, the same text).
pub async fn detokenize(State(state): Shared, body: Body) -> Result<Json<Value>, ApiError> {
    let planned = state.clone();
    let content = state.planner.run(move || text_of(&planned, body)).await?;
    Ok(Json(content))
}

/// `/detokenize`'s answer, on a planner thread.
fn text_of(state: &AppState, body: Body) -> Result<Value, ApiError> {
    let map = json_object(body, state.max_body_bytes)?;
    let f = Fields(&map);
    let ids = match f.get("tokens") {
        Some(Value::Array(items)) => {
            request::token_ids(items).map_err(|e| ApiError::invalid("tokens", e))?
        }
        Some(other) => {
            return Err(ApiError::invalid(
                "tokens",
                format!(
                    "`tokens` must be an array of token ids, got {}",
                    request::type_name(other)
                ),
            ))
        }
        None => return Err(ApiError::invalid("tokens", "`tokens` is required")),
    };
    let tok = &state.engine.tokenizer();
    if let Some(bad) = ids.iter().find(|&&id| id as usize >= tok.vocab_size()) {
        return Err(ApiError::invalid(
            "tokens",
            format!(
                "token id {bad} is outside the vocabulary of {} tokens",
                tok.vocab_size()
            ),
        ));
    }
    let text = tok.decode(&ids);
    Ok(json!({"content": text, "prompt": text}))
}

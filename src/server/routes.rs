//! The handlers: `/v1/completions` and `/v1/chat/completions` (prompt to engine request,
//! then a whole JSON response or a stream), `/v1/models`, `/health`, `/metrics`,
//! `/tokenize` and `/detokenize`. Each reads its body through `params` and answers errors
//! as `ApiError`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{json, Value};

use super::error::ApiError;
use super::middleware::{LogNote, RequestInfo};
use super::params::{self, Endpoint, Fields, GenParams, Prompt};
use super::response::{collect, full_response, log_note, Reply};
use super::stream::sse_response;
use super::structured;
use super::AppState;
use crate::chat_template::encode_prompt;
use crate::engine::{Request, SubmitError};

type Shared = State<Arc<AppState>>;
type Body = Result<Bytes, BytesRejection>;

/// `max_tokens` when the client gives none: OpenAI's 16 for completions, the rest of the
/// context for chat.
const COMPLETIONS_DEFAULT_MAX_TOKENS: usize = 16;

pub async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

fn model_card(state: &AppState) -> Value {
    let cfg = &state.engine.model.config;
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

pub async fn metrics(State(state): Shared) -> Result<Response, ApiError> {
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
    let mut text = super::metrics::prometheus(&m);
    text.push_str(&super::router_api::worker_metrics(&state, &m));
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
    let map = params::json_object(body, state.max_body_bytes)?;
    let f = Fields(&map);
    let mut params = params::gen_params(&f, Endpoint::Completions, super::random_seed())?;
    params.sampling.constraint = structured::completion_constraint(&state.engine, &map)?;
    let ids = completion_prompt_ids(&state, &f)?;
    generate(
        &state,
        info,
        Endpoint::Completions,
        ids,
        params,
        "prompt",
        false,
    )
    .await
}

/// The token ids a completions body runs (`/v1/completions` and its `/render`).
pub(super) fn completion_prompt_ids(state: &AppState, f: &Fields) -> Result<Vec<u32>, ApiError> {
    let tok = &state.engine.model.tokenizer;
    Ok(match params::prompt(f)? {
        // BOS as the model wants it, but not twice if the prompt already starts with it.
        Prompt::Text(text) => encode_prompt(tok, &text)
            .map_err(|e| ApiError::invalid("prompt", format!("cannot tokenize `prompt`: {e:#}")))?,
        Prompt::Tokens(ids) => ids,
    })
}

pub async fn chat_completions(
    State(state): Shared,
    Extension(info): Extension<RequestInfo>,
    body: Body,
) -> Result<Response, ApiError> {
    let map = params::json_object(body, state.max_body_bytes)?;
    let f = Fields(&map);
    let mut params = params::gen_params(&f, Endpoint::Chat, super::random_seed())?;
    let (ids, plan) = chat_prompt_plan(&state, &f)?;
    params.sampling.constraint = plan.constraint;
    generate(
        &state,
        info,
        Endpoint::Chat,
        ids,
        params,
        "messages",
        plan.tool_calls,
    )
    .await
}

/// The token ids a chat body runs: its messages (and `tools`) through the template, then the
/// tokenizer (`/v1/chat/completions` and its `/render`).
pub(super) fn chat_prompt_ids(state: &AppState, f: &Fields) -> Result<Vec<u32>, ApiError> {
    chat_prompt_plan(state, f).map(|(ids, _)| ids)
}

/// The token ids of a chat body and its plan (the constraint, whether to parse tool calls).
fn chat_prompt_plan(
    state: &AppState,
    f: &Fields,
) -> Result<(Vec<u32>, structured::ChatPlan), ApiError> {
    let messages = params::messages(f)?;
    let add_generation_prompt = f.bool("add_generation_prompt")?.unwrap_or(true);
    let template = state
        .template
        .as_ref()
        .map_err(|why| ApiError::bad_request(why.clone()).with_code("no_chat_template"))?;
    let plan = structured::chat_plan(
        &state.engine,
        template,
        f.0,
        &messages,
        add_generation_prompt,
    )?;
    let ids = encode_prompt(&state.engine.model.tokenizer, &plan.prompt).map_err(|e| {
        ApiError::invalid(
            "messages",
            format!("cannot tokenize the chat prompt: {e:#}"),
        )
    })?;
    Ok((ids, plan))
}

/// Checks the prompt and `max_tokens` against the context, submits, and answers with a
/// stream or the whole response. `prompt_param` names the field the prompt came from;
/// `tool_calls` looks for tool calls in the reply.
async fn generate(
    state: &AppState,
    info: RequestInfo,
    endpoint: Endpoint,
    prompt: Vec<u32>,
    params: GenParams,
    prompt_param: &str,
    tool_calls: bool,
) -> Result<Response, ApiError> {
    let max_seq_len = state.engine.config.max_seq_len;
    let num_prompt = prompt.len();
    if num_prompt == 0 {
        return Err(ApiError::from_submit(
            SubmitError::EmptyPrompt,
            prompt_param,
        ));
    }
    if num_prompt >= max_seq_len {
        return Err(ApiError::from_submit(
            SubmitError::PromptTooLong {
                prompt: num_prompt,
                max: max_seq_len,
            },
            prompt_param,
        ));
    }
    let room = max_seq_len - num_prompt;
    let max_tokens = match params.max_tokens {
        Some(m) if m > room => {
            return Err(ApiError::invalid(
                params.max_tokens_field,
                format!(
                    "This model's maximum context length is {max_seq_len} tokens. However, you requested {} tokens \
                     ({num_prompt} in the prompt, {m} for the completion). Please reduce `{}` or the prompt.",
                    num_prompt + m,
                    params.max_tokens_field
                ),
            )
            .with_code("context_length_exceeded"))
        }
        Some(m) => m,
        None if endpoint == Endpoint::Completions => COMPLETIONS_DEFAULT_MAX_TOKENS.min(room),
        None => room,
    };
    let mut request = Request::new(prompt, params.sampling, max_tokens);
    request.n = params.n;
    request.stop = params.stop;
    request.ignore_eos = params.ignore_eos;
    request.logprobs = params.logprobs;
    request.cache_key = info.cache_key;
    let mut stream = state
        .engine
        .submit(request)
        .map_err(|e| ApiError::from_submit(e, prompt_param))?;
    let prefix = match endpoint {
        Endpoint::Completions => "cmpl",
        Endpoint::Chat => "chatcmpl",
    };
    let reply = Reply {
        endpoint,
        id: format!("{prefix}-{:x}{:06x}", state.instance, stream.id),
        created: super::unix_now(),
        model: state.model_id.clone(),
    };
    let with_logprobs = params.logprobs.is_some();
    if params.stream {
        let model = state.engine.model.clone();
        return Ok(sse_response(
            reply,
            model,
            stream,
            params.n,
            params.include_usage,
            with_logprobs,
            info,
            tool_calls,
        ));
    }
    let choices = collect(&mut stream, params.n).await?;
    let mut body = full_response(
        &reply,
        &state.engine.model.tokenizer,
        &choices,
        with_logprobs,
    );
    if tool_calls {
        if let Some(items) = body["choices"].as_array_mut() {
            for (index, choice) in items.iter_mut().enumerate() {
                structured::apply_to_choice(choice, &reply.id, index);
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
    let map = params::json_object(body, state.max_body_bytes)?;
    let f = Fields(&map);
    let tok = &state.engine.model.tokenizer;
    let add_special = f.bool("add_special")?.unwrap_or(false);
    let parse_special = f.bool("parse_special")?.unwrap_or(true);
    let with_pieces = f.bool("with_pieces")?.unwrap_or(false);
    let ids = if f.get("messages").is_some() {
        let messages = params::messages(&f)?;
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
    Ok(Json(
        json!({"tokens": tokens, "count": ids.len(), "max_model_len": state.engine.config.max_seq_len}),
    ))
}

/// llama-server's `/detokenize`: `{"tokens": [ids]}` to `{"content": TEXT}`.
pub async fn detokenize(State(state): Shared, body: Body) -> Result<Json<Value>, ApiError> {
    let map = params::json_object(body, state.max_body_bytes)?;
    let f = Fields(&map);
    let ids = match f.get("tokens") {
        Some(Value::Array(items)) => {
            params::token_ids(items).map_err(|e| ApiError::invalid("tokens", e))?
        }
        Some(other) => {
            return Err(ApiError::invalid(
                "tokens",
                format!(
                    "`tokens` must be an array of token ids, got {}",
                    params::type_name(other)
                ),
            ))
        }
        None => return Err(ApiError::invalid("tokens", "`tokens` is required")),
    };
    let tok = &state.engine.model.tokenizer;
    if let Some(bad) = ids.iter().find(|&&id| id as usize >= tok.vocab_size()) {
        return Err(ApiError::invalid(
            "tokens",
            format!(
                "token id {bad} is outside the vocabulary of {} tokens",
                tok.vocab_size()
            ),
        ));
    }
    Ok(Json(json!({"content": tok.decode(&ids)})))
}

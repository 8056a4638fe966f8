//! `use_beam_search: true` on `/v1/completions` and `/v1/chat/completions`: the body planned by
//! the shared rules (`crate::api::plan`, after `crate::api::beam_fields` took the beam fields
//! out), then the search of `crate::api::beam` driven over the engine: each step submits one
//! request per live beam at once (the engine batches them; the prefix cache shares their
//! blocks) and waits for their top tokens. The answer is the `n` best beams as the choices,
//! with their `token_ids` and `cumulative_logprob` (extensions). A client that goes away drops
//! this future and with it the step's streams: the engine aborts them and frees their blocks.

use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};

use super::error::ApiError;
use super::middleware::{LogNote, RequestInfo};
use super::response::{full_response, generation_error, log_note, Choice, Reply};
use super::routes::setting;
use super::AppState;
use crate::api::beam::{BeamParams, BeamSearch};
use crate::api::beam_fields::BeamFields;
use crate::api::plan;
use crate::api::request::Endpoint;
use crate::engine::{Event, RequestStream, Usage};

/// Plans `body` (its beam fields already taken out as `beam`), searches, and answers the
/// whole response.
pub(super) async fn answer(
    state: Arc<AppState>,
    info: RequestInfo,
    endpoint: Endpoint,
    prefix: &str,
    body: Map<String, Value>,
    beam: BeamFields,
) -> Result<Response, ApiError> {
    let planned = state.clone();
    let tenant = info.cache_key;
    let plan = state
        .planner
        .run(move || Ok(plan::plan(&setting(&planned, tenant), endpoint, &body)?))
        .await?;
    let request = plan.request;
    let tok = state.engine.tokenizer();
    let room = state
        .engine
        .max_seq_len()
        .saturating_sub(request.prompt.len() + 1);
    let params = BeamParams {
        width: beam.width,
        length_penalty: beam.length_penalty,
        early_stopping: beam.early_stopping,
        // At least one step, so the engine judges a prompt too long for the context.
        max_tokens: request.max_tokens.min(room).max(1),
        stop: request.stop.clone(),
        ignore_eos: request.ignore_eos,
    };
    let num_prompt = request.prompt.len();
    let mut search = BeamSearch::new(request.prompt, params);
    let mut first: Option<(u64, Usage)> = None;
    while !search.is_done() {
        let mut streams = Vec::with_capacity(search.live().len());
        for live in search.live() {
            let step = search.step_request(live, info.cache_key);
            let stream = state
                .engine
                .submit(step)
                .map_err(|e| ApiError::from_submit(e, plan.prompt_param))?;
            streams.push(stream);
        }
        let mut tops = Vec::with_capacity(streams.len());
        for stream in &mut streams {
            let (top, usage) = next_top(stream).await?;
            first.get_or_insert((stream.id, usage));
            tops.push(top);
        }
        search.advance(&tops, tok);
    }
    let (stream_id, first_usage) = first.unwrap_or_default();
    let reply = Reply {
        endpoint,
        id: format!("{prefix}-{:x}{:06x}", state.instance, stream_id),
        created: super::unix_now(),
        model: state.model_id.clone(),
    };
    let beams = search.best(beam.n);
    let choices: Vec<Choice> = beams
        .iter()
        .map(|b| Choice {
            text: b.text(tok),
            finish: b.finish,
            usage: Usage {
                prompt_tokens: num_prompt,
                completion_tokens: b.tokens.len(),
                cached_tokens: first_usage.cached_tokens,
                ttft_ms: first_usage.ttft_ms,
                ..Usage::default()
            },
            ..Choice::default()
        })
        .collect();
    let mut body = full_response(&reply, tok, &choices, false);
    if let Some(items) = body["choices"].as_array_mut() {
        for (item, b) in items.iter_mut().zip(&beams) {
            item["token_ids"] = json!(b.tokens);
            item["cumulative_logprob"] = json!(b.cum_logprob);
        }
    }
    let usages: Vec<_> = choices.iter().map(|c| c.usage).collect();
    let finishes: Vec<_> = choices.iter().map(|c| c.finish).collect();
    let mut response = Json(body).into_response();
    let note = format!(
        "{} beams={}",
        log_note(&usages, &finishes, false),
        beam.width
    );
    response.extensions_mut().insert(LogNote(note));
    Ok(response)
}

/// The top next tokens of one step request, and its usage (for the prompt's cached tokens).
async fn next_top(stream: &mut RequestStream) -> Result<(Vec<(u32, f32)>, Usage), ApiError> {
    let mut top = None;
    let mut usage = Usage::default();
    while let Some(event) = stream.next().await {
        match event {
            Event::Token { logprobs, .. } => top = logprobs.map(|l| l.top),
            Event::Finished { usage: u, .. } => usage = u,
            Event::Error(e) => return Err(generation_error(&e)),
            Event::Prompt { .. } | Event::Embedding { .. } => {}
        }
    }
    let top = top.ok_or_else(|| ApiError::internal("a beam step produced no token"))?;
    Ok((top, usage))
}

//! `POST /v1/embeddings` (OpenAI's shape) and llama-server's `POST /embedding` and
//! `/embeddings` (its shape: every token's vector with pooling none). The body is read on the
//! planner pool by the shared rules (`crate::api::embeddings`); each input is one engine
//! request (`Request::embedding`), all submitted at once so the engine batches them with
//! whatever else runs, and the answer waits for them all.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::{Extension, Json};
use serde_json::Value;

use super::body::json_object;
use super::error::ApiError;
use super::middleware::RequestInfo;
use super::AppState;
use crate::api::embeddings::{self, EmbeddingSetting, Shape};
use crate::engine::{Event, Pooling, Request, RequestStream};

/// How the server pools and normalizes embeddings (`--pooling`, `--embd-normalize`).
#[derive(Clone, Copy, Debug)]
pub struct EmbeddingSetup {
    pub pooling: Pooling,
    pub normalize: i32,
}

type Shared = State<Arc<AppState>>;
type Body = Result<Bytes, BytesRejection>;

/// `POST /v1/embeddings`.
pub async fn v1_embeddings(
    State(state): Shared,
    Extension(info): Extension<RequestInfo>,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    answer(state, info, Shape::OpenAi, body).await
}

/// `POST /embedding` and `/embeddings` (llama-server's).
pub async fn embedding(
    State(state): Shared,
    Extension(info): Extension<RequestInfo>,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    answer(state, info, Shape::Llama, body).await
}

async fn answer(
    state: Arc<AppState>,
    info: RequestInfo,
    route: Shape,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let planned = state.clone();
    let plan = state
        .planner
        .run(move || {
            let map = json_object(body, planned.max_body_bytes)?;
            let setting = EmbeddingSetting {
                tokenizer: planned.engine.tokenizer(),
                pooling: planned.embedding.pooling,
                normalize: planned.embedding.normalize,
                n_embd: planned.engine.model_config().n_embd,
                max_seq_len: planned.engine.max_seq_len(),
            };
            Ok(embeddings::plan(&map, &setting, route)?)
        })
        .await?;
    let param = if route == Shape::OpenAi {
        "input"
    } else {
        "content"
    };
    let mut streams = Vec::with_capacity(plan.prompts.len());
    for prompt in &plan.prompts {
        let mut request = Request::embedding(prompt.clone(), plan.pooling);
        request.cache_key = info.cache_key;
        let stream = state
            .engine
            .submit(request)
            .map_err(|e| ApiError::from_submit(e, param))?;
        streams.push(stream);
    }
    let mut results = Vec::with_capacity(streams.len());
    for stream in &mut streams {
        let (vectors, num_tokens) = collect(stream).await?;
        results.push((embeddings::finish_vectors(&plan, vectors), num_tokens));
    }
    Ok(Json(embeddings::response(&plan, results, &state.model_id)))
}

/// One embedding request's vectors and its prompt's token count.
async fn collect(stream: &mut RequestStream) -> Result<(Vec<Vec<f32>>, usize), ApiError> {
    let mut vectors = None;
    while let Some(event) = stream.next().await {
        match event {
            Event::Embedding { vectors: v } => vectors = Some(v),
            Event::Finished { usage, .. } => {
                return vectors
                    .map(|v| (v, usage.prompt_tokens))
                    .ok_or_else(|| ApiError::internal("the engine sent no embedding"));
            }
            Event::Error(e) => return Err(ApiError::internal(format!("embedding failed: {e}"))),
            Event::Prompt { .. } | Event::Token { .. } => {}
        }
    }
    Err(ApiError::internal("the engine ended the request early"))
}

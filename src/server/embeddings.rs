//! `POST /v1/embeddings` (OpenAI's shape) and llama-server's `POST /embedding` and
//! `/embeddings` (its shape: every token's vector with pooling none). The body is read on the
//! planner pool by the shared rules (`crate::api::embeddings`); each input goes to the
//! [`Embedder`] (a decoder's engine, or an encoder's worker: `super::encoder_server`), all
//! submitted at once so they are computed together, and the answer waits for them all.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::{Extension, Json};
use serde_json::Value;

use super::body::json_object;
use super::error::ApiError;
use super::middleware::RequestInfo;
use super::planner::Planner;
use super::AppState;
use crate::api::embeddings::{self, EmbeddingSetting, Shape};
use crate::engine::{Embedder, Pooling};

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
    let site = Site {
        embedder: Embedder::Decoder(state.engine.clone()),
        planner: &state.planner,
        setup: state.embedding,
        model_id: &state.model_id,
        max_body_bytes: state.max_body_bytes,
    };
    answer_on(&site, info, route, body).await
}

/// What an embeddings answer needs of a server: the decoder's or the encoder's.
pub(super) struct Site<'a> {
    pub embedder: Embedder,
    pub planner: &'a Planner,
    pub setup: EmbeddingSetup,
    pub model_id: &'a str,
    pub max_body_bytes: usize,
}

/// Reads the body on the planner pool, submits every input at once (so they are computed
/// together), and answers once all are done.
pub(super) async fn answer_on(
    site: &Site<'_>,
    info: RequestInfo,
    route: Shape,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let embedder = site.embedder.clone();
    let (setup, max_body_bytes) = (site.setup, site.max_body_bytes);
    let plan = site
        .planner
        .run(move || {
            let map = json_object(body, max_body_bytes)?;
            let setting = EmbeddingSetting {
                tokenizer: embedder.tokenizer(),
                pooling: setup.pooling,
                normalize: setup.normalize,
                n_embd: embedder.n_embd(),
                max_seq_len: embedder.max_seq_len(),
            };
            Ok(embeddings::plan(&map, &setting, route)?)
        })
        .await?;
    let param = if route == Shape::OpenAi {
        "input"
    } else {
        "content"
    };
    let mut pending = Vec::with_capacity(plan.prompts.len());
    for prompt in &plan.prompts {
        let embedding = site
            .embedder
            .submit(prompt.clone(), plan.pooling, info.cache_key)
            .map_err(|e| ApiError::from_submit(e, param))?;
        pending.push(embedding);
    }
    let mut results = Vec::with_capacity(pending.len());
    for embedding in pending {
        let (vectors, num_tokens) = embedding.wait().await.map_err(ApiError::internal)?;
        results.push((embeddings::finish_vectors(&plan, vectors), num_tokens));
    }
    Ok(Json(embeddings::response(&plan, results, site.model_id)))
}

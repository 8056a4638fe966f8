//! `edge-llm serve` on an encoder GGUF (bert, nomic-bert): embeddings and, for a reranker,
//! rerank, on the encoder's worker (`crate::engine::encoder`) instead of the engine. Its own
//! small router: `/health`, `/v1/models`, the embeddings routes (the decoder server's handlers,
//! `super::embeddings::answer_on`), the rerank routes (`super::rerank`); the generation routes
//! answer a one-line 400 saying the model only embeds. The same guards as the decoder server:
//! the log line, the API keys, same-site requests, the body limits. Called by `super::serve`.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Result;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde_json::{json, Value};

use super::embeddings::{self, EmbeddingSetup, Site};
use super::error::ApiError;
use super::listener::{self, Limits};
use super::middleware::{self, RequestInfo};
use super::origin::{self, AllowedHosts};
use super::planner::{self, Planner};
use super::{rerank, ServeArgs};
use crate::api::embeddings::Shape;
use crate::engine::{Embedder, EncoderHandle};
use crate::model::encoder::Encoder;

/// What every handler of the encoder server shares.
pub struct EncoderState {
    pub encoder: EncoderHandle,
    pub model_id: String,
    pub embedding: EmbeddingSetup,
    pub planner: Planner,
    pub api_keys: Vec<(String, u64)>,
    pub allowed_hosts: AllowedHosts,
    pub max_body_bytes: usize,
    pub body_timeout: std::time::Duration,
    pub created: u64,
}

type Shared = State<Arc<EncoderState>>;
type Body = Result<Bytes, BytesRejection>;

/// The routes a decoder serves that an encoder does not: they answer [`embedding_only`].
const GENERATION_ROUTES: &[&str] = &[
    "/v1/chat/completions",
    "/chat/completions",
    "/v1/completions",
    "/completions",
    "/completion",
    "/infill",
    "/v1/responses",
    "/responses",
    "/v1/messages",
    "/messages",
];

/// The encoder server's routes behind the same guards as the decoder server's.
pub fn router(state: Arc<EncoderState>) -> Router {
    Router::new()
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/v1/models", get(models))
        .route("/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/v1/embeddings", post(v1_embeddings))
        .route("/embeddings", post(embedding))
        .route("/embedding", post(embedding))
        .route("/v1/rerank", post(rerank_route))
        .route("/rerank", post(rerank_route))
        .route("/v1/reranking", post(rerank_route))
        .route("/reranking", post(rerank_route))
        .fallback(fallback)
        .layer(DefaultBodyLimit::max(state.max_body_bytes))
        .layer(axum::middleware::from_fn({
            let (max, timeout) = (state.max_body_bytes, state.body_timeout);
            move |req, next| listener::read_body(max, timeout, req, next)
        }))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            |State(s): Shared, req, next| async move {
                origin::check_same_site(!s.api_keys.is_empty(), &s.allowed_hosts, req, next).await
            },
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            |State(s): Shared, req, next| async move {
                middleware::check_api_key(&s.api_keys, req, next).await
            },
        ))
        .layer(axum::middleware::from_fn(middleware::log_requests))
        .with_state(state)
}

fn model_card(state: &EncoderState) -> Value {
    let c = state.encoder.config();
    json!({
        "id": state.model_id,
        "object": "model",
        "created": state.created,
        "owned_by": "edge-llm",
        "meta": {
            "architecture": c.architecture,
            "n_ctx_train": c.n_ctx_train,
            "n_embd": c.n_embd,
            "n_vocab": c.vocab_size,
            "n_layers": c.num_layers,
            "pooling": state.embedding.pooling.as_str(),
            "rerank": state.encoder.is_reranker(),
        },
    })
}

async fn models(State(state): Shared) -> Json<Value> {
    Json(json!({"object": "list", "data": [model_card(&state)]}))
}

async fn model(State(state): Shared, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    if id == state.model_id {
        return Ok(Json(model_card(&state)));
    }
    Err(ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!("no model `{id}`; this server serves `{}`", state.model_id),
    )
    .with_code("model_not_found"))
}

fn site(state: &EncoderState) -> Site<'_> {
    Site {
        embedder: Embedder::Encoder(state.encoder.clone()),
        planner: &state.planner,
        setup: state.embedding,
        model_id: &state.model_id,
        max_body_bytes: state.max_body_bytes,
    }
}

async fn v1_embeddings(
    State(state): Shared,
    Extension(info): Extension<RequestInfo>,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    embeddings::answer_on(&site(&state), info, Shape::OpenAi, body).await
}

async fn embedding(
    State(state): Shared,
    Extension(info): Extension<RequestInfo>,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    embeddings::answer_on(&site(&state), info, Shape::Llama, body).await
}

async fn rerank_route(State(state): Shared, body: Body) -> Result<Json<Value>, ApiError> {
    rerank::answer(
        &state.encoder,
        &state.planner,
        &state.model_id,
        state.max_body_bytes,
        body,
    )
    .await
}

/// A generation route: the one-line refusal; any other path: 404.
async fn fallback(State(state): Shared, req: Request) -> ApiError {
    if GENERATION_ROUTES.contains(&req.uri().path()) {
        return embedding_only(&state.model_id, req.uri().path());
    }
    middleware::not_found(req).await
}

fn embedding_only(model_id: &str, path: &str) -> ApiError {
    ApiError::bad_request(format!(
        "{model_id} is an embedding model: it serves /v1/embeddings, /embedding and /v1/rerank \
         (a reranker), not {path}"
    ))
    .with_code("not_supported")
}

/// The encoder at `path`, started, under `model_id`: the state its routes share. Called by
/// [`serve`] and by `multi`'s loader (an encoder among several models).
pub(super) fn encoder_state(
    args: &ServeArgs,
    path: &std::path::Path,
    model_id: String,
    limits: &Limits,
    api_keys: Vec<(String, u64)>,
) -> Result<EncoderState> {
    let encoder = Encoder::load(path)?;
    let pooling = crate::flags::embedding::encoder_pooling(&args.embedding, &encoder, path)?;
    eprintln!(
        "edge-llm serve: {} is an encoder ({}, {} layers): embeddings{} only, pooling {}",
        path.display(),
        encoder.config.architecture,
        encoder.config.num_layers,
        if encoder.head.is_some() {
            " and rerank"
        } else {
            ""
        },
        pooling.as_str()
    );
    Ok(EncoderState {
        encoder: EncoderHandle::start(encoder)?,
        model_id,
        embedding: EmbeddingSetup {
            pooling,
            normalize: args.embedding.embd_normalize,
        },
        planner: Planner::new(args.max_planning, planner::NUM_PLANNER_THREADS),
        api_keys,
        allowed_hosts: AllowedHosts::new(&args.host, &args.allowed_host),
        max_body_bytes: args.max_body_bytes,
        body_timeout: limits.body_timeout,
        created: super::unix_now(),
    })
}

/// Serves the encoder at `path` until Ctrl+C or SIGTERM.
pub fn serve(
    args: &ServeArgs,
    path: &std::path::Path,
    addr: SocketAddr,
    limits: Limits,
    api_keys: Vec<(String, u64)>,
) -> Result<()> {
    let model_id = match &args.alias {
        Some(a) => a.clone(),
        None => path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into()),
    };
    let state = Arc::new(encoder_state(
        args,
        path,
        model_id.clone(),
        &limits,
        api_keys,
    )?);
    let keyed = !state.api_keys.is_empty();
    super::run_http(
        args,
        addr,
        &format!("model `{model_id}`"),
        router(state),
        keyed,
        limits,
    )
}

//! `POST /v1/rerank` (and llama-server's `/rerank`, `/reranking`, `/v1/reranking`): a query
//! scored against each document by a reranker (`crate::api::rerank` reads the body and writes
//! the answer). Two kinds: an encoder reranker (bert with a classifier head, on the encoder's
//! worker: [`answer`], from `super::encoder_server`) and a decoder reranker (Qwen3-Reranker: the
//! engine computes each pair's last hidden state, batched with whatever else runs, and
//! `model::rank::DecoderHead` scores it: [`decoder`]). Any other model refuses in one line.

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
use crate::api::rerank::{self, RerankPlan};
use crate::engine::encoder::EncoderOutput;
use crate::engine::{EncoderHandle, Pooling};

type Body = Result<Bytes, BytesRejection>;

/// Why `model_id` cannot rerank.
pub(super) fn not_a_reranker(model_id: &str) -> ApiError {
    ApiError::bad_request(format!(
        "model `{model_id}` is not a reranker: /v1/rerank needs a reranking model (pooling_type \
         rank: a bert with its cls head, or a Qwen3-Reranker)"
    ))
    .with_code("not_supported")
}

/// Reads the body on the planner pool and tokenizes every pair with `pair` (at most `max`
/// tokens each).
async fn plan_pairs<P>(
    planner: &Planner,
    max_body_bytes: usize,
    max: usize,
    pair: P,
    body: Body,
) -> Result<(RerankPlan, Vec<Vec<u32>>), ApiError>
where
    P: Fn(&str, &str) -> anyhow::Result<Vec<u32>> + Send + 'static,
{
    planner
        .run(move || {
            let map = json_object(body, max_body_bytes)?;
            let plan = rerank::plan(&map)?;
            let field = if plan.tei { "texts" } else { "documents" };
            let mut pairs = Vec::with_capacity(plan.documents.len());
            for (i, doc) in plan.documents.iter().enumerate() {
                let tokens = pair(&plan.query, doc)
                    .map_err(|e| ApiError::invalid(field, format!("{field}[{i}]: {e:#}")))?;
                if tokens.len() > max {
                    return Err(ApiError::invalid(
                        field,
                        format!(
                            "the query with {field}[{i}] has {} tokens, more than the {max} this model takes",
                            tokens.len()
                        ),
                    ));
                }
                pairs.push(tokens);
            }
            Ok((plan, pairs))
        })
        .await
}

/// The decoder server's rerank routes: a Qwen3-style reranker's scores, or the refusal.
pub async fn decoder(
    State(state): State<Arc<AppState>>,
    Extension(info): Extension<RequestInfo>,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let Some(head) = state.reranker.clone() else {
        return Err(not_a_reranker(&state.model_id));
    };
    let (engine, format) = (state.engine.clone(), head.format.clone());
    let pair = move |q: &str, d: &str| format.tokens(engine.tokenizer(), q, d);
    let max = state.engine.max_seq_len();
    let (plan, pairs) = plan_pairs(&state.planner, state.max_body_bytes, max, pair, body).await?;
    let embedder = crate::engine::Embedder::Decoder(state.engine.clone());
    let mut pending = Vec::with_capacity(pairs.len());
    for tokens in pairs {
        let embedding = embedder
            .submit(tokens, Pooling::Last, info.cache_key)
            .map_err(|e| ApiError::from_submit(e, "documents"))?;
        pending.push(embedding);
    }
    let mut scores = Vec::with_capacity(pending.len());
    for embedding in pending {
        let (vectors, n) = embedding
            .wait()
            .await
            .map_err(|e| ApiError::internal(format!("rerank failed: {e}")))?;
        scores.push((head.score(&vectors[0]), n));
    }
    Ok(Json(rerank::response(&plan, &scores, &state.model_id)))
}

/// An encoder reranker's answer: every pair scored on the encoder's worker (all queued at once),
/// best first.
pub(super) async fn answer(
    encoder: &EncoderHandle,
    planner: &Planner,
    model_id: &str,
    max_body_bytes: usize,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    if !encoder.is_reranker() {
        return Err(not_a_reranker(model_id));
    }
    let planned = encoder.clone();
    let pair = move |q: &str, d: &str| planned.encoder().pair_tokens(q, d);
    let max = encoder.config().n_ctx_train;
    let (plan, pairs) = plan_pairs(planner, max_body_bytes, max, pair, body).await?;
    let mut pending = Vec::with_capacity(pairs.len());
    for tokens in pairs {
        let n = tokens.len();
        let ticket = encoder
            .score(tokens)
            .map_err(|e| ApiError::from_submit(e, "documents"))?;
        pending.push((ticket, n));
    }
    let mut scores = Vec::with_capacity(pending.len());
    for (ticket, n) in pending {
        match ticket.await {
            Ok(Ok(EncoderOutput::Score(s))) => scores.push((s, n)),
            Ok(Err(e)) => return Err(ApiError::internal(format!("rerank failed: {e}"))),
            _ => return Err(ApiError::internal("the encoder gave no score")),
        }
    }
    Ok(Json(rerank::response(&plan, &scores, model_id)))
}

//! `POST /v1/rerank` (and llama-server's `/rerank`, `/reranking`, `/v1/reranking`): a query
//! scored against each document by a reranker (`crate::api::rerank` reads the body and writes
//! the answer). Only an encoder server with a reranking model answers it
//! (`super::encoder_server`); the decoder server refuses it in one line ([`refuse`]).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::Json;
use serde_json::Value;

use super::body::json_object;
use super::error::ApiError;
use super::planner::Planner;
use super::AppState;
use crate::api::rerank;
use crate::engine::encoder::EncoderOutput;
use crate::engine::EncoderHandle;

type Body = Result<Bytes, BytesRejection>;

/// Why `model_id` cannot rerank.
pub(super) fn not_a_reranker(model_id: &str) -> ApiError {
    ApiError::bad_request(format!(
        "model `{model_id}` is not a reranker: /v1/rerank needs a reranking model (a bert or \
         nomic-bert GGUF whose pooling_type is rank, with its cls head)"
    ))
    .with_code("not_supported")
}

/// The decoder server's answer on the rerank routes.
pub async fn refuse(State(state): State<Arc<AppState>>) -> ApiError {
    not_a_reranker(&state.model_id)
}

/// Scores every document against the query on the encoder's worker (all queued at once) and
/// answers best first.
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
    let (plan, pairs) = planner
        .run(move || {
            let map = json_object(body, max_body_bytes)?;
            let plan = rerank::plan(&map)?;
            let field = if plan.tei { "texts" } else { "documents" };
            let max = planned.config().n_ctx_train;
            let mut pairs = Vec::with_capacity(plan.documents.len());
            for (i, doc) in plan.documents.iter().enumerate() {
                let tokens = planned
                    .encoder()
                    .pair_tokens(&plan.query, doc)
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
        .await?;
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

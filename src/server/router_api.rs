//! What routers in front of several workers read from one: `POST /v1/chat/completions/render`
//! and `POST /v1/completions/render` (the token ids a request would run, through the same code
//! as the request itself, for routers that match prefixes on token ids), `GET /get_load`, and
//! the vLLM-named gauges appended to `/metrics` (which llm-d and the Gateway API inference
//! extension scrape), with the KV event publisher's counters.

use std::fmt::Write;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::Extension;
use axum::Json;
use serde_json::{json, Value};

use super::body::json_object;
use super::error::ApiError;
use super::middleware::RequestInfo;
use super::routes::setting;
use super::AppState;
use crate::api::plan;
use crate::api::request::Endpoint;
use crate::engine::Metrics;

type Shared = State<Arc<AppState>>;
type Body = Result<Bytes, BytesRejection>;

/// `POST /v1/chat/completions/render`: `{"token_ids": [...]}` for a chat request body.
pub async fn render_chat(
    State(state): Shared,
    Extension(info): Extension<RequestInfo>,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let ids = render(&state, info.cache_key, Endpoint::Chat, body).await?;
    Ok(Json(
        json!({"token_ids": ids, "num_tokens": ids.len(), "model": state.model_id}),
    ))
}

/// `POST /v1/completions/render`: `[{"token_ids": [...]}]` for a completions request body
/// (a list, one entry per prompt, as vLLM answers).
pub async fn render_completions(
    State(state): Shared,
    Extension(info): Extension<RequestInfo>,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let ids = render(&state, info.cache_key, Endpoint::Completions, body).await?;
    Ok(Json(
        json!([{"token_ids": ids, "num_tokens": ids.len(), "model": state.model_id}]),
    ))
}

/// The token ids of a body to `endpoint`, planned on the planner pool (a chat's tools compile
/// into `tenant`'s grammar cache).
async fn render(
    state: &Arc<AppState>,
    tenant: Option<u64>,
    endpoint: Endpoint,
    body: Body,
) -> Result<Vec<u32>, ApiError> {
    let planned = state.clone();
    state
        .planner
        .run(move || {
            let map = json_object(body, planned.max_body_bytes)?;
            Ok(plan::prompt_ids(
                &setting(&planned, tenant),
                endpoint,
                &map,
            )?)
        })
        .await
}

/// The two shapes routers poll `/get_load` in (they send no header telling them apart).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LoadFormat {
    /// vllm-router's `power_of_two` reads `load` from an object.
    Vllm,
    /// sglang-router's reads a list of per-rank entries (`num_tokens`, `num_reqs`, ...).
    Sglang,
}

/// `GET /get_load`: with `--load-format vllm` (the default) `{"load": requests in flight,
/// "num_reqs", "num_waiting_reqs", "num_tokens", "num_pending_tokens", "dp_rank"}`; with
/// `sglang`, SGLang's list of those entries (one: data-parallel rank 0).
pub async fn get_load(State(state): Shared) -> Json<Value> {
    let m = state.engine.metrics().unwrap_or_default();
    let rank = load_of_rank(&state, &m);
    match state.load_format {
        LoadFormat::Sglang => Json(json!([rank])),
        LoadFormat::Vllm => {
            let mut body = rank;
            body["load"] = json!(state.engine.num_in_flight());
            Json(body)
        }
    }
}

/// SGLang's per-rank load entry (`GET /get_load` answers a list of these there).
fn load_of_rank(state: &AppState, m: &Metrics) -> Value {
    let block_size = state.engine.config.block_size;
    let used_tokens = m.blocks_used * block_size;
    json!({
        "dp_rank": 0,
        "num_reqs": m.num_running + m.num_waiting,
        "num_waiting_reqs": m.num_waiting,
        "num_tokens": used_tokens,
        "num_pending_tokens": (state.engine.config.num_blocks * block_size).saturating_sub(used_tokens),
    })
}

/// The vLLM-named gauges and the KV event counters, in Prometheus text.
pub fn worker_metrics(state: &AppState, m: &Metrics) -> String {
    let mut out = String::with_capacity(1024);
    let model = state.model_id.replace(['\\', '"', '\n'], "_");
    let labels = format!("{{model_name=\"{model}\"}}");
    let mut gauge = |name: &str, help: &str, labels: &str, value: f64| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
        let _ = writeln!(out, "{name}{labels} {value}");
    };
    gauge(
        "vllm:num_requests_running",
        "Requests running now (vLLM's name).",
        &labels,
        m.num_running as f64,
    );
    gauge(
        "vllm:num_requests_waiting",
        "Requests waiting to run (vLLM's name).",
        &labels,
        m.num_waiting as f64,
    );
    // The pool's size from the configuration: the engine reports its counters only once it ran.
    let num_blocks = state.engine.config.num_blocks;
    let usage = m.blocks_used as f64 / num_blocks.max(1) as f64;
    gauge(
        "vllm:kv_cache_usage_perc",
        "Fraction of KV blocks in use, 0 to 1 (vLLM's name).",
        &labels,
        usage,
    );
    gauge(
        "vllm:cache_config_info",
        "The KV cache configuration, in labels (vLLM's name).",
        &format!(
            "{{model_name=\"{model}\",block_size=\"{}\",num_gpu_blocks=\"{}\",enable_prefix_caching=\"True\"}}",
            state.engine.config.block_size, num_blocks
        ),
        1.0,
    );
    if let Some(p) = &state.kv_events {
        let mut counter = |name: &str, help: &str, value: u64| {
            let _ = writeln!(out, "# HELP edge_llm_{name} {help}");
            let _ = writeln!(out, "# TYPE edge_llm_{name} counter");
            let _ = writeln!(out, "edge_llm_{name} {value}");
        };
        counter(
            "kv_events_published_total",
            "KV event messages published (--kv-events).",
            p.num_published(),
        );
        counter(
            "kv_events_dropped_total",
            "KV event batches dropped because the publisher fell behind.",
            p.num_dropped(),
        );
    }
    out
}

//! The routes of a server with several models that are about the models themselves, in the
//! shapes of llama-server's router mode: `GET /models` and `/v1/models` (every model with its
//! `status`: `loaded`, `loading`, `unloaded`, with `failed` and `error` when it cannot load),
//! `GET /v1/models/{id}`, `POST /models/load` and `/models/unload` (`{"model": ID}`), and
//! `/metrics` (each model's resident state and memory, labelled by model; `?model=ID` gives that
//! model's own figures).
//!
//! Called by `multi`'s router.

use std::fmt::Write;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::error::ApiError;
use super::multi::{query_model, refusal_error, through, Front};
use super::registry::{Status, View};

type Shared = State<Arc<Front>>;

/// `GET /models`, `GET /v1/models`: every model, resident or not.
pub async fn list(State(front): Shared) -> Json<Value> {
    let data: Vec<Value> = front
        .registry
        .views()
        .iter()
        .map(|v| card(&front, v))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// `GET /v1/models/{id}`.
pub async fn one(State(front): Shared, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let views = front.registry.views();
    match views.iter().find(|v| v.entry.id == id) {
        Some(v) => Ok(Json(card(&front, v))),
        None => Err(refusal_error(
            &id,
            super::registry::Refusal::Unknown {
                available: views.iter().map(|v| v.entry.id.clone()).collect(),
            },
        )),
    }
}

/// One model as OpenAI lists it, with llama-server's `status` and what its header says.
fn card(front: &Front, v: &View) -> Value {
    let mut status = json!({"value": match v.status {
        Status::Loaded => "loaded",
        Status::Loading => "loading",
        Status::Unloaded | Status::Failed(_) => "unloaded",
    }});
    if let Status::Failed(e) = &v.status {
        status["failed"] = json!(true);
        status["error"] = json!(e);
    }
    if let Some(idle) = v.idle_secs {
        status["idle_secs"] = json!((idle * 10.0).round() / 10.0);
        status["requests_in_flight"] = json!(v.in_flight);
    }
    let mut card = json!({
        "id": v.entry.id,
        "object": "model",
        "created": front.created,
        "owned_by": "edge-llm",
        "path": v.entry.path.display().to_string(),
        "status": status,
    });
    if let Ok(info) = &v.entry.info {
        card["meta"] = json!({
            "family": info.family,
            "n_ctx_train": info.context_length,
            "quantization": info.quantization,
            "size": info.size_bytes,
        });
    }
    card
}

/// The `model` of a load or unload body.
fn named_model(body: &Bytes) -> Result<String, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not JSON: {e}")))?;
    v.get("model")
        .and_then(Value::as_str)
        .map(String::from)
        .ok_or_else(|| ApiError::bad_request("the body needs `model`: the id of a model"))
}

/// `POST /models/load {"model": ID}`: loads the model (evicting the least recently used idle
/// one past `--models-max`) and answers once it is resident.
pub async fn load(State(front): Shared, body: Bytes) -> Result<Json<Value>, ApiError> {
    let id = named_model(&body)?;
    front
        .registry
        .load_now(&id)
        .await
        .map_err(|r| refusal_error(&id, r))?;
    Ok(Json(json!({"success": true})))
}

/// `POST /models/unload {"model": ID}`: unloads the model; requests in flight on it finish.
pub async fn unload(State(front): Shared, body: Bytes) -> Result<Json<Value>, ApiError> {
    let id = named_model(&body)?;
    match front.registry.unload(&id) {
        Ok(true) => Ok(Json(json!({"success": true}))),
        Ok(false) => Err(ApiError::bad_request(format!("model `{id}` is not loaded"))),
        Err(r) => Err(refusal_error(&id, r)),
    }
}

/// `GET /metrics`: each model's resident state and memory; with `?model=ID`, that model's own
/// figures when it is resident (a look that neither loads it nor keeps it alive).
pub async fn metrics(State(front): Shared, req: Request) -> Response {
    if let Some(lease) = query_model(req.uri().query()).and_then(|id| front.registry.peek(&id)) {
        return through(lease, req).await;
    }
    let views = front.registry.views();
    let mut out = String::new();
    let mut gauge = |name: &str, help: &str, value: &dyn Fn(&View) -> f64| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for v in &views {
            let _ = writeln!(out, "{name}{{model=\"{}\"}} {}", v.entry.id, value(v));
        }
    };
    gauge(
        "edge_llm_model_loaded",
        "Whether the model is resident (1) or not (0).",
        &|v| f64::from(u8::from(v.status == Status::Loaded)),
    );
    gauge(
        "edge_llm_model_failed",
        "Whether the model cannot be loaded (its file, or its last load).",
        &|v| f64::from(u8::from(matches!(v.status, Status::Failed(_)))),
    );
    gauge(
        "edge_llm_model_weights_bytes",
        "Bytes of the resident model's weights (0 when unloaded).",
        &|v| v.weights_bytes as f64,
    );
    gauge(
        "edge_llm_model_kv_bytes",
        "Bytes of the resident model's KV pool (0 when unloaded).",
        &|v| v.kv_bytes as f64,
    );
    gauge(
        "edge_llm_model_kv_blocks_used",
        "KV blocks held by the model's running requests.",
        &|v| v.blocks_used as f64,
    );
    gauge(
        "edge_llm_model_requests_in_flight",
        "Requests on the model not yet answered.",
        &|v| v.in_flight as f64,
    );
    let loaded = views.iter().filter(|v| v.status == Status::Loaded).count();
    let _ = writeln!(
        out,
        "# HELP edge_llm_models_loaded Models resident.\n# TYPE edge_llm_models_loaded gauge\nedge_llm_models_loaded {loaded}"
    );
    (
        StatusCode::OK,
        [("content-type", "text/plain; version=0.0.4")],
        out,
    )
        .into_response()
}

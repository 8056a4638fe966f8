//! `serve` with several models (`--models-dir DIR`, or `-m` more than once): the front router.
//! The routes about the models themselves (`GET /models`, `/v1/models`, `/models/load`,
//! `/models/unload`, `/metrics`, `/health`, the chat page) are answered here (`multi_routes`);
//! every other request is handed whole to the router of the model its `model` field (or, on a
//! GET, its `?model=` query) names, the one-model server of `router`, loaded first when it is
//! not resident (`registry`). A request naming no model goes to the first one listed.
//!
//! Called by `serve` (mod.rs) when `registry::Catalog::from_args` finds several models.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures_util::StreamExt;
use serde_json::Value;

use super::encoder_server::encoder_state;
use super::error::ApiError;
use super::registry::{Catalog, KeepAlive, Lease, Refusal, Registry, Served};
use super::{listener, multi_routes, webui, ServeArgs};

/// What the front router shares.
pub struct Front {
    pub registry: Arc<Registry>,
    /// The model of requests that name none: the first listed.
    pub default_model: String,
    pub api_keys: Vec<(String, u64)>,
    pub allowed_hosts: super::origin::AllowedHosts,
    pub created: u64,
}

/// Serves the models of `catalog` until Ctrl+C or SIGTERM.
pub fn serve(
    args: &ServeArgs,
    catalog: Catalog,
    api_keys: Vec<(String, u64)>,
    limits: listener::Limits,
    addr: SocketAddr,
) -> Result<()> {
    let keep_alive = match args.keep_alive {
        None => KeepAlive::Forever,
        Some(s) if s.is_finite() && s >= 0.0 => KeepAlive::For(Duration::from_secs_f64(s)),
        Some(s) if s < 0.0 => KeepAlive::Forever,
        Some(s) => anyhow::bail!("--keep-alive must be a number of seconds, got {s}"),
    };
    let ids: Vec<String> = catalog.entries.iter().map(|e| e.id.clone()).collect();
    let loader = {
        let (args, keys, limits) = (args.clone(), api_keys.clone(), limits.clone());
        let (presets, command_line) = (catalog.presets.clone(), super::presets::command_line());
        Arc::new(move |path: &std::path::Path, id: &str| {
            // The model's own flags, where a preset gives them.
            let args = match &presets {
                Some(p) => p.args_for(id, &command_line)?,
                None => args.clone(),
            };
            if crate::flags::embedding::is_encoder_file(path)? {
                let state = encoder_state(&args, path, id.to_string(), &limits, keys.clone())?;
                return Ok(Served::Encoder(Arc::new(state)));
            }
            let model_args = crate::flags::ModelArgs {
                model: vec![path.to_path_buf()],
                mlock: args.model.mlock,
            };
            let model = model_args.load()?;
            let app = super::state::app_state(&args, model, id.to_string(), &keys, None, &limits)?;
            Ok(Served::Decoder(Arc::new(app)))
        })
    };
    let registry = Registry::new(catalog, loader, served_router, args.models_max, keep_alive);
    // The reaper: idle models past their keep-alive unload.
    let reaped = Arc::downgrade(&registry);
    std::thread::Builder::new()
        .name("edge-llm-reaper".into())
        .spawn(move || {
            while let Some(registry) = reaped.upgrade() {
                registry.reap();
                drop(registry);
                std::thread::sleep(Duration::from_millis(200));
            }
        })?;
    let front = Arc::new(Front {
        registry,
        default_model: ids[0].clone(),
        allowed_hosts: super::origin::AllowedHosts::new(&args.host, &args.allowed_host),
        api_keys: api_keys.clone(),
        created: super::unix_now(),
    });
    let banner = format!(
        "{} models ({}; at most {} resident{})",
        ids.len(),
        ids.join(", "),
        args.models_max,
        match keep_alive {
            KeepAlive::For(d) => format!(", unloaded after {} s idle", d.as_secs_f64()),
            KeepAlive::Forever => String::new(),
        }
    );
    let app = router(front, args.max_body_bytes, limits.body_timeout);
    super::run_http(args, addr, &banner, app, !api_keys.is_empty(), limits)
}

/// A resident model's own routes: a decoder's server or an encoder's.
fn served_router(served: &Served) -> Router {
    match served {
        Served::Decoder(app) => super::router(app.clone()),
        Served::Encoder(enc) => super::encoder_server::router(enc.clone()),
    }
}

/// The front routes, behind the same body limit, API-key guard and same-site guard as one
/// model's (which also guard the request again when it is handed on).
fn router(front: Arc<Front>, max_body_bytes: usize, body_timeout: Duration) -> Router {
    use multi_routes::*;
    Router::new()
        .route("/health", get(super::routes::health))
        .route("/v1/models", get(list))
        .route("/models", get(list))
        .route("/v1/models/{id}", get(one))
        .route("/models/load", post(load))
        .route("/models/unload", post(unload))
        .route("/metrics", get(metrics))
        .route("/", get(webui::index))
        .route("/index.html", get(webui::index))
        .route("/webui/{name}", get(webui::asset))
        .fallback(dispatch)
        .layer(axum::middleware::from_fn(move |req, next| {
            listener::read_body(max_body_bytes, body_timeout, req, next)
        }))
        .layer(axum::middleware::from_fn_with_state(front.clone(), guard))
        .with_state(front)
}

/// The API-key and same-site checks of one model's router, for the front routes.
async fn guard(State(front): State<Arc<Front>>, req: Request, next: Next) -> Response {
    match super::middleware::key_refusal(&front.api_keys, &req).or_else(|| {
        super::origin::refusal_without_keys(&front.api_keys, &front.allowed_hosts, &req)
    }) {
        Some(e) => e.into_response(),
        None => next.run(req).await,
    }
}

/// Every request not about the models: to the model it names.
async fn dispatch(State(front): State<Arc<Front>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    // `listener::read_body` has read the body whole already.
    let bytes = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let fields: Option<Value> = serde_json::from_slice(&bytes).ok();
    let named = fields
        .as_ref()
        .and_then(|f| f.get("model"))
        .and_then(Value::as_str)
        .map(String::from)
        .or_else(|| query_model(parts.uri.query()));
    let keep_alive = match fields.as_ref().and_then(|f| f.get("keep_alive")) {
        None | Some(Value::Null) => None,
        Some(v) => match parse_keep_alive(v) {
            Some(k) => Some(k),
            None => {
                return ApiError::bad_request(format!(
                    "keep_alive must be seconds or a duration such as \"5m\", got {v}"
                ))
                .into_response()
            }
        },
    };
    let id = named.unwrap_or_else(|| front.default_model.clone());
    forward(
        &front,
        &id,
        Request::from_parts(parts, Body::from(bytes)),
        keep_alive,
    )
    .await
}

/// Hands `req` to model `id`'s router, loading the model first; the model counts the request in
/// flight until its response body has been sent.
async fn forward(front: &Front, id: &str, req: Request, keep_alive: Option<KeepAlive>) -> Response {
    let lease = match front.registry.acquire(id).await {
        Ok(lease) => lease,
        Err(refusal) => return refusal_error(id, refusal).into_response(),
    };
    if let Some(k) = keep_alive {
        lease.set_keep_alive(k);
    }
    through(lease, req).await
}

/// `req` answered by the model `lease` holds, which counts it in flight until its response
/// body has been sent.
pub async fn through(lease: Lease, req: Request) -> Response {
    let mut router = lease.router.clone();
    let response = match tower_service::Service::call(&mut router, req).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    let (parts, body) = response.into_parts();
    let body = body.into_data_stream().map(move |chunk| {
        let _held = &lease;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(body))
}

/// The error of a request for a model it cannot have.
pub fn refusal_error(id: &str, refusal: Refusal) -> ApiError {
    match refusal {
        Refusal::Unknown { available } => ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("no model `{id}`; the models: {}", available.join(", ")),
        )
        .with_code("model_not_found"),
        Refusal::Unavailable(e) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            format!("model `{id}` is unavailable: {e}"),
        )
        .with_code("model_unavailable"),
    }
}

/// `model=NAME` of a query string.
pub fn query_model(query: Option<&str>) -> Option<String> {
    query?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == "model").then(|| v.replace("%2F", "/").replace('+', " "))
    })
}

/// Ollama's `keep_alive`: seconds (a number, or a string with a unit: "300ms", "10s", "5m",
/// "1h"); negative keeps the model forever, 0 unloads it when the request ends.
fn parse_keep_alive(v: &Value) -> Option<KeepAlive> {
    let secs = match v {
        Value::Number(n) => n.as_f64()?,
        Value::String(s) => {
            let s = s.trim();
            let split = s.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(s.len());
            let (number, unit) = s.split_at(split);
            let n: f64 = number.trim().parse().ok()?;
            n * match unit {
                "" | "s" => 1.0,
                "ms" => 0.001,
                "m" => 60.0,
                "h" => 3600.0,
                _ => return None,
            }
        }
        _ => return None,
    };
    if !secs.is_finite() {
        return None;
    }
    Some(if secs < 0.0 {
        KeepAlive::Forever
    } else {
        KeepAlive::For(Duration::from_secs_f64(secs))
    })
}

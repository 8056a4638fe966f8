//! `edge-llm serve`: an OpenAI-compatible HTTP server (axum on a small tokio runtime) in
//! front of the one engine. Every request is submitted through a clone of the
//! `EngineHandle`, so concurrent requests are batched together and share cached prefixes;
//! the HTTP side never touches model state.
//!
//! - `body`: a request body as a JSON object; its fields are read by `crate::api`, the rules
//!   every face shares.
//! - `routes`: the handlers; `response` and `stream`: whole and streamed OpenAI bodies.
//! - `messages` and `messages_stream`: Anthropic's Messages API, on the chat path.
//! - `middleware`: the log line, the API-key guard, 404/405; `error`: OpenAI-style errors.
//! - `metrics`: Prometheus text.
//! - `planner`: the pool where bodies are read, templates rendered, prompts tokenized and
//!   grammars compiled, off the HTTP threads (`--max-planning`).
//! - `listener`: the accept loop and connection limits (timeouts, the connection cap, the
//!   body-read timeout and early 413).
//! - `webui`: the chat page at `/` and its embedded assets.
//! - `responses` (with `responses_output`, `responses_stream`, `response_store`): the OpenAI
//!   Responses API on the chat path.
//! - `router_api`: `/render`, `/get_load` and vLLM's gauges, for routers in front of workers.
//! - `llama_routes`: llama-server's discovery routes, `/props`, `/apply-template`, `/slots`.
//! - `embeddings`: `/v1/embeddings` (OpenAI's), `/embedding` and `/embeddings` (llama-server's).
//! - `rerank`: `/v1/rerank` and its aliases (a reranker's; refused on a decoder).
//! - `encoder_server`: the whole server of an encoder model (bert, nomic-bert): embeddings and
//!   rerank on the encoder's worker, the generation routes refused.
//! - `multi`, `multi_routes`, `registry`: several models in one server (`--models-dir`), each
//!   a state of its own behind the front router, loaded on demand.
//!
//! Called by `main.rs` (`edge-llm serve`). A sibling of `crate::cli`: neither imports the other;
//! the flags both take live in `crate::flags`.

mod beam;
pub(crate) mod body;
pub(crate) mod cache_routes;
mod embeddings;
mod encoder_server;
pub(crate) mod error;
pub mod kv_publisher;
mod listener;
mod llama_completion;
mod llama_reply;
mod llama_routes;
mod messages;
mod messages_stream;
mod metrics;
mod middleware;
mod model_file;
mod multi;
mod multi_routes;
mod origin;
mod planner;
mod presets;
mod registry;
mod rerank;
mod response;
mod response_store;
mod responses;
mod responses_output;
mod responses_stream;
mod router_api;
mod routes;
mod state;
mod stream;
pub(crate) mod structured;
mod webui;

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use axum::extract::DefaultBodyLimit;
use axum::routing::{delete, get, post};
use axum::Router;
use clap::Args;

use crate::chat_template::ChatTemplate;
use crate::engine::EngineHandle;
use crate::flags::{EngineArgs, ModelArgs, ThreadArgs};
use crate::server::kv_publisher::KvEventPublisher;

pub use error::ApiError;
pub use router_api::LoadFormat;

/// Flags of `serve`.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub threads: ThreadArgs,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port; the log says which).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// The temperature of requests that do not give one, as llama-server's --temp (OpenAI's
    /// default is 1; clients such as Codex CLI send none) [default: 1]
    #[arg(long = "temp", value_name = "T")]
    pub temp: Option<f32>,
    /// Without --api-key, also answer requests whose `Host` (or `Origin`) is NAME; repeatable;
    /// `*` answers any. IP addresses, localhost and the --host name are always answered.
    #[arg(long = "allowed-host", value_name = "NAME")]
    pub allowed_host: Vec<String>,
    /// An API key that may also pin prompts (POST /v1/cache/pin) and see and remove every
    /// key's pins; repeatable. With API keys and no admin key, nothing can be pinned over HTTP.
    #[arg(long = "admin-api-key", value_name = "KEY")]
    pub admin_api_key: Vec<String>,
    /// Most prompt tokens one key's pins (POST /v1/cache/pin) hold together [default: half the
    /// KV pool, the most the engine pins in all]
    #[arg(long = "pin-budget-tokens", value_name = "N")]
    pub pin_budget_tokens: Option<usize>,
    /// Require `Authorization: Bearer KEY` on every route but /health [default: $EDGE_LLM_API_KEY].
    /// Repeatable: each key's prompts get their own prefix cache (pinned prompts are shared)
    #[arg(long = "api-key")]
    pub api_key: Vec<String>,
    /// Read API keys from FILE, one per line (blank lines and lines starting with # skipped)
    #[arg(long = "api-key-file", value_name = "FILE")]
    pub api_key_file: Option<PathBuf>,
    /// Most requests waiting for or in planning (reading the body, rendering the template,
    /// tokenizing, compiling a grammar, on a pool of 2 threads); more get 503 with Retry-After.
    #[arg(long = "max-planning", default_value_t = 32)]
    pub max_planning: usize,
    /// Largest request body accepted; larger ones get 413.
    #[arg(long = "max-body-bytes", default_value_t = 2 << 20)]
    pub max_body_bytes: usize,
    /// A Jinja chat template file to use instead of the model's tokenizer.chat_template.
    #[arg(long = "chat-template")]
    pub chat_template: Option<PathBuf>,
    /// The model id reported by /v1/models and in responses [default: the file's stem]
    #[arg(long)]
    pub alias: Option<String>,
    /// Serve every .gguf file in DIR (and every -m), each loaded when a request first names it
    /// in `model` (its id: the file's stem)
    #[arg(long = "models-dir", value_name = "DIR")]
    pub models_dir: Option<PathBuf>,
    /// With several models: most resident at once; loading one more unloads the least
    /// recently used idle one
    #[arg(long = "models-max", value_name = "N", default_value_t = 4)]
    pub models_max: usize,
    /// With several models: an INI file of each model's flags (llama-server's
    /// `--models-preset`: `[id]` sections, `[*]` for all, `model = PATH` to add one)
    #[arg(long = "models-preset", value_name = "FILE")]
    pub models_preset: Option<PathBuf>,
    /// With several models: unload a model idle for SECONDS (a request's `keep_alive` overrides
    /// it for its model) [default: never]
    #[arg(
        long = "keep-alive",
        value_name = "SECONDS",
        allow_negative_numbers = true
    )]
    pub keep_alive: Option<f64>,
    #[command(flatten)]
    pub limits: listener::LimitArgs,
    #[command(flatten)]
    pub cache: crate::flags::cache::CacheArgs,
    #[command(flatten)]
    pub embedding: crate::flags::embedding::EmbeddingArgs,
    /// Publish KV cache events (vLLM's format) on a ZMQ PUB socket bound at tcp://HOST:PORT
    /// (or PORT: 127.0.0.1), for prefix-aware routers such as vllm-router's kv_aware
    #[arg(long = "kv-events", value_name = "ENDPOINT")]
    pub kv_events: Option<String>,
    /// Also answer replay requests for missed KV events on a ZMQ ROUTER socket at tcp://HOST:PORT
    #[arg(
        long = "kv-events-replay",
        value_name = "ENDPOINT",
        requires = "kv_events"
    )]
    pub kv_events_replay: Option<String>,
    /// The shape of GET /get_load: vllm (vllm-router's `{"load": N, ...}`) or sglang
    /// (sglang-router's `[{"dp_rank": 0, "num_tokens": N, ...}]`)
    #[arg(long = "load-format", value_enum, default_value = "vllm")]
    pub load_format: LoadFormat,
    /// The topic (first frame) of every KV event message
    #[arg(long = "kv-events-topic", default_value = "", requires = "kv_events")]
    pub kv_events_topic: String,
    /// Whether `BlockStored` events carry the blocks' token ids (routers such as vllm-router's
    /// kv_aware key on them; anyone who can subscribe reads them back as text): auto is on
    /// without API keys and off with them
    #[arg(
        long = "kv-events-token-ids",
        value_enum,
        default_value = "auto",
        requires = "kv_events"
    )]
    pub kv_events_token_ids: TokenIdsMode,
}

/// `--kv-events-token-ids`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenIdsMode {
    Auto,
    On,
    Off,
}

/// The environment variable read when --api-key is not given.
pub const API_KEY_ENV: &str = "EDGE_LLM_API_KEY";

/// What every handler shares.
pub struct AppState {
    pub engine: EngineHandle,
    /// The chat template, or why chat is unavailable.
    pub template: std::result::Result<ChatTemplate, String>,
    pub model_id: String,
    /// The accepted API keys (none: no key needed), each with its prefix-cache salt.
    pub api_keys: Vec<(String, u64)>,
    pub max_body_bytes: usize,
    /// How long a request body may take to arrive (`--body-timeout`).
    pub body_timeout: std::time::Duration,
    /// Unix time the server started (`created` of the model).
    pub created: u64,
    /// Distinguishes response ids across restarts.
    pub instance: u64,
    /// The shape `/get_load` answers in (`--load-format`).
    pub load_format: LoadFormat,
    /// The KV event publisher (`--kv-events`), for its counters.
    pub kv_events: Option<Arc<KvEventPublisher>>,
    /// The pinned prompts (`--pin-prompt`, `POST /v1/cache/pin`).
    pub pins: std::sync::Mutex<Vec<cache_routes::PinRecord>>,
    /// Where requests are planned, off the HTTP threads.
    pub planner: planner::Planner,
    /// The salts of the `--admin-api-key` keys.
    pub admin_salts: Vec<u64>,
    /// Most prompt tokens one key's pins hold (`--pin-budget-tokens`).
    pub pin_budget_tokens: usize,
    /// The temperature of requests without one (`--temp`).
    pub default_temperature: f32,
    /// The pooling and normalization of embeddings (`--pooling`, `--embd-normalize`).
    pub embedding: embeddings::EmbeddingSetup,
    /// The hosts and origins a server without keys answers (`origin`).
    pub allowed_hosts: origin::AllowedHosts,
    /// The Responses API's kept responses (`store`, `previous_response_id`).
    pub responses: response_store::ResponseStore,
    /// A reranker's head (Qwen3-Reranker: pooling_type rank), for `/v1/rerank`.
    pub reranker: Option<Arc<crate::model::rank::DecoderHead>>,
}

impl AppState {
    /// Whether a caller with key salt `owner` sees the whole server (its load, memory, every
    /// key's pins and figures): an admin key, anyone on a server without keys, and the one key
    /// of a server with a single key (there is no other tenant). Other keys see only their own.
    pub fn sees_server(&self, owner: Option<u64>) -> bool {
        self.api_keys.len() <= 1 || owner.is_some_and(|o| self.admin_salts.contains(&o))
    }
}

/// Every route, behind the log line, the API-key guard and the body limit.
pub fn router(state: Arc<AppState>) -> Router {
    use routes::*;
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route(
            "/v1/completions/render",
            post(router_api::render_completions),
        )
        .route("/v1/chat/completions/render", post(router_api::render_chat))
        .route("/get_load", get(router_api::get_load))
        .route("/tokenize", post(tokenize))
        .route("/v1/cache", get(cache_routes::cache_info))
        .route("/v1/cache/pin", post(cache_routes::pin))
        .route("/v1/cache/pin/{id}", delete(cache_routes::unpin))
        .route("/detokenize", post(detokenize))
        .route("/v1/embeddings", post(embeddings::v1_embeddings))
        .route("/embeddings", post(embeddings::embedding))
        .route("/embedding", post(embeddings::embedding))
        .route("/v1/rerank", post(rerank::decoder))
        .route("/rerank", post(rerank::decoder))
        .route("/v1/reranking", post(rerank::decoder))
        .route("/reranking", post(rerank::decoder))
        // llama-server's discovery routes (`llama_routes`).
        .route("/props", get(llama_routes::props))
        .route("/completion", post(llama_completion::completion))
        .route("/infill", post(llama_completion::infill))
        .route("/apply-template", post(llama_routes::apply_template))
        .route("/slots", get(llama_routes::slots))
        .route("/tokenizer_info", get(llama_routes::tokenizer_info))
        // The Responses API (`responses`).
        .route("/v1/responses", post(responses::create))
        .route("/responses", post(responses::create))
        .route("/v1/responses/input_tokens", post(responses::input_tokens))
        .route(
            "/v1/responses/{id}",
            get(responses::get).delete(responses::delete),
        )
        // Anthropic's Messages API (`messages`).
        .route("/v1/messages", post(messages::messages))
        .route("/messages", post(messages::messages))
        .route("/v1/messages/count_tokens", post(messages::count_tokens))
        .route("/messages/count_tokens", post(messages::count_tokens))
        // llama-server's paths without the /v1 prefix.
        .route("/models", get(models))
        .route("/completions", post(completions))
        .route("/chat/completions", post(chat_completions))
        // The chat page, compiled into the binary.
        .route("/", get(webui::index))
        .route("/index.html", get(webui::index))
        .route("/webui/{name}", get(webui::asset))
        .fallback(middleware::not_found)
        .layer(DefaultBodyLimit::max(state.max_body_bytes))
        .layer(axum::middleware::from_fn({
            let (max, timeout) = (state.max_body_bytes, state.body_timeout);
            move |req, next| listener::read_body(max, timeout, req, next)
        }))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            origin::same_site_only,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::require_api_key,
        ))
        .layer(axum::middleware::from_fn(middleware::log_requests))
        .layer(axum::middleware::from_fn(messages::anthropic_errors))
        .with_state(state)
}

/// Loads the model, starts the engine, and serves until Ctrl+C or SIGTERM.
pub fn serve(args: &ServeArgs) -> Result<()> {
    let api_keys = api_keys(args)?;
    if args.temp.is_some_and(|t| !(0.0..=100.0).contains(&t)) {
        bail!("--temp must be between 0 and 100");
    }
    if args.max_body_bytes == 0 {
        bail!("--max-body-bytes must be at least 1");
    }
    if args.max_planning == 0 {
        bail!("--max-planning must be at least 1");
    }
    let limits = args.limits.limits()?;
    let addr: SocketAddr = (args.host.as_str(), args.port)
        .to_socket_addrs()
        .with_context(|| format!("resolving --host {}", args.host))?
        .next()
        .with_context(|| format!("--host {} resolves to no address", args.host))?;
    args.threads.init()?;
    if let Some(catalog) = registry::Catalog::from_args(args)? {
        return multi::serve(args, catalog, api_keys, limits, addr);
    }
    let path = args.model.path()?;
    if crate::flags::embedding::is_encoder_file(&path)? {
        return encoder_server::serve(args, &path, addr, limits, api_keys);
    }
    let model = args.model.load()?;
    let model_id = match &args.alias {
        Some(a) => a.clone(),
        None => model
            .file
            .path()
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into()),
    };
    // With API keys a subscriber would read every tenant's prompts back from the token ids.
    let token_ids = match args.kv_events_token_ids {
        TokenIdsMode::Auto => api_keys.is_empty(),
        TokenIdsMode::On => true,
        TokenIdsMode::Off => false,
    };
    // The publisher binds first: the engine's first event (AllBlocksCleared) goes to it.
    let kv_events = match &args.kv_events {
        Some(endpoint) => {
            let p =
                crate::server::kv_publisher::start(crate::server::kv_publisher::KvEventsConfig {
                    endpoint: endpoint.clone(),
                    replay_endpoint: args.kv_events_replay.clone(),
                    topic: args.kv_events_topic.clone(),
                    block_size: args.engine.block_size,
                    token_ids,
                })?;
            eprintln!(
                "edge-llm serve: KV events on {}{}{}",
                p.endpoint,
                p.replay_endpoint
                    .as_ref()
                    .map(|r| format!(" (replay on {r})"))
                    .unwrap_or_default(),
                if token_ids {
                    ""
                } else {
                    " without token ids (--kv-events-token-ids on to add them)"
                }
            );
            Some(Arc::new(p))
        }
        None => None,
    };
    let state = Arc::new(state::app_state(
        args,
        model,
        model_id.clone(),
        &api_keys,
        kv_events,
        &limits,
    )?);
    let banner = format!("model `{model_id}`");
    run_http(
        args,
        addr,
        &banner,
        router(state),
        !api_keys.is_empty(),
        limits,
    )
}

/// Serves `app` on `addr` until Ctrl+C or SIGTERM, logging `banner` (what is served), the
/// limits and the planner. `keyed`: whether API keys are required.
pub(super) fn run_http(
    args: &ServeArgs,
    addr: SocketAddr,
    banner: &str,
    app: Router,
    keyed: bool,
    limits: listener::Limits,
) -> Result<()> {
    let max_planning = args.max_planning;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("edge-llm-http")
        .enable_all()
        .build()
        .context("starting the HTTP runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        let local = listener.local_addr()?;
        eprintln!(
            "edge-llm serve: {banner} listening on http://{local}{}",
            if keyed { " (API key required)" } else { "" }
        );
        if !keyed && !local.ip().is_loopback() {
            eprintln!(
                "warning: listening on {} without --api-key: anyone who can reach this address can use the server",
                local.ip()
            );
        }
        eprintln!(
            "edge-llm serve: at most {} connections; timeouts: headers {} s, body {} s, keep-alive {} s",
            limits.max_connections,
            limits.header_timeout.as_secs_f64(),
            limits.body_timeout.as_secs_f64(),
            limits.keep_alive_timeout.as_secs_f64()
        );
        eprintln!(
            "edge-llm serve: requests planned on {} threads, at most {} at a time (--max-planning)",
            planner::NUM_PLANNER_THREADS,
            max_planning
        );
        listener::serve(listener, app, limits, shutdown_signal()).await;
        anyhow::Ok(())
    })?;
    eprintln!("edge-llm serve: stopped");
    Ok(())
}

/// The API keys of `--api-key`, `--api-key-file`, else `$EDGE_LLM_API_KEY` (the environment and
/// the file keep keys out of `ps`), each with the salt of its prefix cache.
fn api_keys(args: &ServeArgs) -> Result<Vec<(String, u64)>> {
    let mut keys = args.api_key.clone();
    keys.extend(args.admin_api_key.iter().cloned());
    if keys.iter().any(|k| k.trim().is_empty()) {
        bail!("--api-key must not be empty");
    }
    if let Some(path) = &args.api_key_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading --api-key-file {}", path.display()))?;
        let before = keys.len();
        keys.extend(
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(String::from),
        );
        if keys.len() == before {
            bail!("--api-key-file {} holds no key", path.display());
        }
    }
    if keys.is_empty() {
        keys.extend(
            std::env::var(API_KEY_ENV)
                .ok()
                .filter(|k| !k.trim().is_empty()),
        );
    }
    // The first of each key stays in place: /metrics names a key by its place in this list.
    let mut seen = std::collections::HashSet::new();
    keys.retain(|k| seen.insert(k.clone()));
    Ok(keys
        .into_iter()
        .map(|k| {
            let salt = cache_salt(&k);
            (k, salt)
        })
        .collect())
}

/// The prefix-cache salt of an API key: stable across restarts (the disk tier keys on it).
fn cache_salt(key: &str) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    ("edge-llm api key", key).hash(&mut h);
    h.finish()
}

/// Resolves on Ctrl+C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    eprintln!(
        "edge-llm serve: shutting down (waiting for open requests; Ctrl+C again to quit now)"
    );
    // Streams still open keep a graceful shutdown waiting: a second signal, or a grace
    // period, ends the process.
    tokio::spawn(async {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = tokio::time::sleep(std::time::Duration::from_secs(SHUTDOWN_GRACE_SECS)) => {},
        }
        eprintln!("edge-llm serve: stopped with requests still open");
        std::process::exit(1);
    });
}

/// How long a shutdown waits for open requests.
const SHUTDOWN_GRACE_SECS: u64 = 30;

pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A seed for requests that name none: the clock mixed with a counter, so two requests in
/// the same instant differ.
pub(crate) fn random_seed() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut z = nanos
        ^ COUNTER
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z ^ (z >> 31)
}

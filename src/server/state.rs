//! One model's [`AppState`]: its chat template, embedding setup, engine and pinned prompts,
//! beside what every model of the server shares. Called by `serve` (one model) and by
//! `multi`'s loader (each model of several, when first asked for).

use std::sync::Arc;

use anyhow::{Context, Result};

use super::kv_publisher::KvEventPublisher;
use super::{
    cache_routes, cache_salt, embeddings, listener, origin, planner, random_seed, unix_now,
    AppState, ServeArgs,
};
use crate::chat_template::ChatTemplate;
use crate::engine::EngineParts;

/// One model's state: its chat template, its engine (started here, on `args`' flags) and
/// pinned prompts, beside what every model shares (the keys, the limits, the publisher).
/// Called once by `serve`, and per load by `multi` (several models).
pub(super) fn app_state(
    args: &ServeArgs,
    model: crate::model::Model,
    model_id: String,
    api_keys: &[(String, u64)],
    kv_events: Option<Arc<KvEventPublisher>>,
    limits: &listener::Limits,
) -> Result<AppState> {
    let reranker = crate::model::rank::DecoderHead::from_gguf(
        &model.file,
        &model.tokenizer,
        model.config.n_embd,
    )
    .with_context(|| format!("reading the reranker head of {model_id}"))?
    .map(Arc::new);
    let embedding = embeddings::EmbeddingSetup {
        pooling: args.embedding.pooling(&model.file)?,
        normalize: args.embedding.embd_normalize,
    };
    let template =
        match ChatTemplate::load(&model.file, &model.tokenizer, args.chat_template.as_deref()) {
            Ok(t) => Ok(t),
            Err(e) if args.chat_template.is_some() => return Err(e),
            Err(e) => {
                eprintln!("warning: {model_id}: {e:#}; /v1/chat/completions will answer 400");
                Err(format!("chat is unavailable: {e:#}"))
            }
        };
    let sink = kv_events.as_ref().map(|p| p.sink.clone());
    let disk = args.cache.disk_config()?;
    if let Some(d) = &disk {
        eprintln!(
            "edge-llm serve: prefix cache on disk under {} (at most {} MiB; --no-disk-cache turns it off)",
            d.root.display(),
            d.budget_bytes >> 20
        );
    }
    let engine = args.engine.start(
        model,
        true,
        EngineParts {
            kv_events: sink,
            disk,
            no_prefix_cache: args.cache.no_prefix_cache,
            state_snapshot_every: args.cache.state_snapshot_every,
            ..Default::default()
        },
    )?;
    let pins = args
        .cache
        .pin_all(&engine, template.as_ref().ok())?
        .into_iter()
        .map(|(source, p)| cache_routes::PinRecord {
            pin: p.pin,
            source,
            prompt_tokens: p.prompt_tokens,
            owner: None,
            digest: 0,
        })
        .collect();
    let pin_limit_tokens = engine.config.num_blocks / 2 * engine.config.block_size;
    Ok(AppState {
        engine,
        template,
        model_id,
        api_keys: api_keys.to_vec(),
        max_body_bytes: args.max_body_bytes,
        body_timeout: limits.body_timeout,
        created: unix_now(),
        instance: random_seed() & 0xffff_ffff,
        load_format: args.load_format,
        kv_events,
        pins: std::sync::Mutex::new(pins),
        allowed_hosts: origin::AllowedHosts::new(&args.host, &args.allowed_host),
        admin_salts: args.admin_api_key.iter().map(|k| cache_salt(k)).collect(),
        default_temperature: args.temp.unwrap_or(1.0),
        embedding,
        pin_budget_tokens: args.pin_budget_tokens.unwrap_or(pin_limit_tokens),
        planner: planner::Planner::new(args.max_planning, planner::NUM_PLANNER_THREADS),
        responses: Default::default(),
        reranker,
    })
}

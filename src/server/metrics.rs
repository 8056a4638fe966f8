//! `GET /metrics`: the engine's counters (`EngineHandle::metrics`) in Prometheus' text
//! format, every name prefixed `edge_llm_`.

use std::fmt::Write;

use crate::engine::{EngineConfig, Metrics, TenantMetrics};
use crate::kernels::kv_type_name;

/// One tenant's counters: their names, help and values. Its own view (`tenant`) writes them
/// under the server-wide names; the admin's view (`tenants`) writes every key's, labelled.
fn tenant_series(t: &TenantMetrics) -> [(&'static str, &'static str, u64); 7] {
    [
        (
            "requests_submitted_total",
            "Requests accepted by the engine.",
            t.requests_submitted,
        ),
        (
            "requests_finished_total",
            "Requests that ran to a stop or a length limit.",
            t.requests_finished,
        ),
        (
            "requests_aborted_total",
            "Requests aborted, e.g. by a client that hung up.",
            t.requests_aborted,
        ),
        (
            "requests_failed_total",
            "Requests that failed in the engine.",
            t.requests_failed,
        ),
        (
            "prompt_tokens_total",
            "Prompt tokens computed (prefill), excluding prefix-cache hits.",
            t.tokens_prefilled,
        ),
        (
            "generation_tokens_total",
            "Tokens generated.",
            t.tokens_generated,
        ),
        (
            "cached_prompt_tokens_total",
            "Prompt tokens served from the prefix cache.",
            t.tokens_cached,
        ),
    ]
}

/// What a key that is not an admin key sees: its own counters, under the server-wide names,
/// and nothing of the server's load, memory or other keys.
pub fn tenant(t: &TenantMetrics) -> String {
    let mut out = String::from(
        "# This key's own figures; the server's need an admin key (--admin-api-key).\n",
    );
    for (name, help, value) in tenant_series(t) {
        let _ = writeln!(out, "# HELP edge_llm_{name} {help} (this key)");
        let _ = writeln!(out, "# TYPE edge_llm_{name} counter");
        let _ = writeln!(out, "edge_llm_{name} {value}");
    }
    out
}

/// Every key's counters for an admin, labelled with the key's place among the server's keys
/// (`key="1"` is the first `--api-key`; then the other `--api-key`s, the `--admin-api-key`s and
/// `--api-key-file`'s lines, in the order given), never with the key.
pub fn tenants(m: &Metrics, place: impl Fn(u64) -> Option<usize>) -> String {
    let mut out = String::new();
    let keyed: Vec<(usize, _)> = m
        .tenants
        .iter()
        .filter_map(|(salt, t)| Some((place(*salt)? + 1, tenant_series(t))))
        .collect();
    for (i, (name, help, _)) in tenant_series(&TenantMetrics::default()).iter().enumerate() {
        let _ = writeln!(out, "# HELP edge_llm_key_{name} {help} (by API key)");
        let _ = writeln!(out, "# TYPE edge_llm_key_{name} counter");
        for (place, series) in &keyed {
            let _ = writeln!(
                out,
                "edge_llm_key_{name}{{key=\"{place}\"}} {}",
                series[i].2
            );
        }
    }
    out
}

/// The compiled-grammar cache: its counters (grammars compiled, requests served from the cache)
/// and its gauges (bytes charged, entries kept).
pub fn grammar_cache((compiled, hits): (u64, u64), (bytes, entries): (usize, usize)) -> String {
    let mut out = String::new();
    for (name, help, value) in [
        (
            "grammar_cache_bytes",
            "Memory charged for the compiled grammars kept (an estimate; --grammar-cache-mib bounds it).",
            bytes,
        ),
        (
            "grammar_cache_entries",
            "Compiled grammars kept.",
            entries,
        ),
    ] {
        let _ = writeln!(out, "# HELP edge_llm_{name} {help}");
        let _ = writeln!(out, "# TYPE edge_llm_{name} gauge");
        let _ = writeln!(out, "edge_llm_{name} {value}");
    }
    for (name, help, value) in [
        (
            "grammars_compiled_total",
            "Constraints compiled (each tenant's cache apart).",
            compiled,
        ),
        (
            "grammar_cache_hits_total",
            "Constraints served from the compiled-grammar cache.",
            hits,
        ),
    ] {
        let _ = writeln!(out, "# HELP edge_llm_{name} {help}");
        let _ = writeln!(out, "# TYPE edge_llm_{name} counter");
        let _ = writeln!(out, "edge_llm_{name} {value}");
    }
    out
}

/// The KV pool's size for its cache types (`--cache-type-k`, `--cache-type-v`, as labels): its
/// token slots and its bytes.
pub fn kv_pool(config: &EngineConfig, bytes: usize) -> String {
    let labels = format!(
        "{{cache_type_k=\"{}\",cache_type_v=\"{}\"}}",
        kv_type_name(config.kv_types.k),
        kv_type_name(config.kv_types.v)
    );
    let mut out = String::new();
    for (name, help, value) in [
        (
            "kv_pool_tokens",
            "Token slots in the KV pool (blocks times tokens per block).",
            config.num_blocks * config.block_size,
        ),
        (
            "kv_pool_bytes",
            "Bytes of the KV pool's keys and values in their cache types.",
            bytes,
        ),
    ] {
        let _ = writeln!(out, "# HELP edge_llm_{name} {help}");
        let _ = writeln!(out, "# TYPE edge_llm_{name} gauge");
        let _ = writeln!(out, "edge_llm_{name}{labels} {value}");
    }
    out
}

/// Prometheus exposition text of one metrics snapshot.
pub fn prometheus(m: &Metrics) -> String {
    let mut out = String::with_capacity(4096);
    let mut metric = |name: &str, kind: &str, help: &str, samples: &[(&str, f64)]| {
        let _ = writeln!(out, "# HELP edge_llm_{name} {help}");
        let _ = writeln!(out, "# TYPE edge_llm_{name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(out, "edge_llm_{name}{labels} {value}");
        }
    };
    let c = |v: u64| v as f64;
    metric(
        "requests_submitted_total",
        "counter",
        "Requests accepted by the engine.",
        &[("", c(m.requests_submitted))],
    );
    metric(
        "requests_finished_total",
        "counter",
        "Requests that ran to a stop or a length limit.",
        &[("", c(m.requests_finished))],
    );
    metric(
        "requests_aborted_total",
        "counter",
        "Requests aborted, e.g. by a client that hung up.",
        &[("", c(m.requests_aborted))],
    );
    metric(
        "requests_failed_total",
        "counter",
        "Requests that failed in the engine.",
        &[("", c(m.requests_failed))],
    );
    metric(
        "requests_constrained_total",
        "counter",
        "Requests with a constraint (JSON schema, regex, grammar, tool calls).",
        &[("", c(m.requests_constrained))],
    );
    metric(
        "mask_seconds_per_token",
        "gauge",
        "Mean time to compute one constrained row's token mask.",
        &[(
            "",
            if m.masks_computed == 0 {
                0.0
            } else {
                m.mask_time_us as f64 / 1e6 / m.masks_computed as f64
            },
        )],
    );
    metric(
        "masks_computed_total",
        "counter",
        "Token masks computed for constrained rows.",
        &[("", c(m.masks_computed))],
    );
    metric(
        "requests_running",
        "gauge",
        "Sequences running now.",
        &[("", m.num_running as f64)],
    );
    metric(
        "requests_waiting",
        "gauge",
        "Sequences waiting for KV blocks or a step.",
        &[("", m.num_waiting as f64)],
    );
    metric(
        "prompt_tokens_total",
        "counter",
        "Prompt tokens computed (prefill), excluding prefix-cache hits.",
        &[("", c(m.tokens_prefilled))],
    );
    metric(
        "generation_tokens_total",
        "counter",
        "Tokens generated.",
        &[("", c(m.tokens_generated))],
    );
    metric(
        "steps_total",
        "counter",
        "Forward steps run.",
        &[("", c(m.steps))],
    );
    metric(
        "spec_proposed_tokens_total",
        "counter",
        "Speculative decoding: tokens proposed (prompt lookup or the draft model).",
        &[("", c(m.spec_proposed_tokens))],
    );
    metric(
        "spec_accepted_tokens_total",
        "counter",
        "Speculative decoding: proposed tokens the model's own choice confirmed.",
        &[("", c(m.spec_accepted_tokens))],
    );
    metric(
        "preemptions_total",
        "counter",
        "Sequences preempted for lack of KV blocks.",
        &[("", c(m.preemptions))],
    );
    let p = &m.prefix_cache;
    metric(
        "prefix_cache_lookup_tokens_total",
        "counter",
        "Prompt tokens looked up in the prefix cache.",
        &[("", c(p.lookup_tokens))],
    );
    metric(
        "prefix_cache_hit_tokens_total",
        "counter",
        "Prompt tokens served from the prefix cache.",
        &[("", c(p.hit_tokens))],
    );
    metric(
        "prefix_cache_lookup_blocks_total",
        "counter",
        "Full prompt blocks looked up in the prefix cache.",
        &[("", c(p.lookup_blocks))],
    );
    metric(
        "prefix_cache_hit_blocks_total",
        "counter",
        "Full prompt blocks found in the prefix cache.",
        &[("", c(p.hit_blocks))],
    );
    metric(
        "prefix_cache_evictions_total",
        "counter",
        "Cached blocks reused for new tokens.",
        &[("", c(p.evictions))],
    );
    metric(
        "prefix_cache_hit_rate",
        "gauge",
        "Prefix-cache hit tokens over lookup tokens.",
        &[("", m.prefix_cache_hit_rate())],
    );
    metric(
        "kv_blocks_pinned",
        "gauge",
        "KV blocks held by pinned prompts (never evicted).",
        &[("", m.blocks_pinned as f64)],
    );
    metric(
        "prompt_scores_kept_blocks",
        "gauge",
        "Prompt blocks whose token scores are kept for echo/logprobs requests sharing them.",
        &[("", m.blocks_scored as f64)],
    );
    if let Some(d) = &m.disk_cache {
        let disk: [(&str, &str, &str, f64); 13] = [
            ("disk_cache_blocks", "gauge", "Prefix-cache blocks on disk.", d.blocks as f64),
            ("disk_cache_bytes", "gauge", "Bytes of prefix-cache blocks on disk.", d.bytes as f64),
            ("disk_cache_budget_bytes", "gauge", "The disk tier's budget (--cache-disk-mib).", d.budget_bytes as f64),
            ("disk_cache_hit_blocks_total", "counter", "Blocks loaded from disk into the KV pool instead of computed.", d.hit_blocks as f64),
            ("disk_cache_hit_bytes_total", "counter", "Bytes read from disk for loaded blocks.", d.hit_bytes as f64),
            ("disk_cache_load_seconds_total", "counter", "Time the disk thread spent loading blocks.", d.load_us as f64 / 1e6),
            ("disk_cache_written_blocks_total", "counter", "Blocks written to disk.", d.written_blocks as f64),
            ("disk_cache_written_bytes_total", "counter", "Bytes written to disk.", d.written_bytes as f64),
            ("disk_cache_rejected_files_total", "counter", "Block files rejected (torn, truncated, corrupt or another model's): deleted and recomputed.", d.rejected_files as f64),
            ("disk_cache_dropped_writes_total", "counter", "Block writes dropped because the disk thread was behind or the write failed.", d.dropped_writes as f64),
            ("disk_cache_state_snapshots", "gauge", "Recurrent state snapshots on disk, each beside its block (a model with recurrent layers).", d.states as f64),
            ("disk_cache_hit_state_snapshots_total", "counter", "State snapshots loaded from disk (a prompt resumed from one instead of recomputing its prefix).", d.hit_states as f64),
            ("disk_cache_written_state_snapshots_total", "counter", "State snapshots written to disk.", d.written_states as f64),
        ];
        for (name, kind, help, v) in disk {
            metric(name, kind, help, &[("", v)]);
        }
    }
    metric(
        "kv_tokens_stored",
        "gauge",
        "Tokens whose keys and values the used KV blocks hold (a shared block counted once).",
        &[("", m.kv_tokens_stored as f64)],
    );
    metric(
        "kv_waste_ratio",
        "gauge",
        "Share of the used KV blocks' token slots that hold no token (internal fragmentation).",
        &[("", m.kv_waste())],
    );
    metric(
        "kv_blocks_total",
        "gauge",
        "Blocks in the KV pool.",
        &[("", m.blocks_total as f64)],
    );
    metric(
        "kv_blocks",
        "gauge",
        "KV blocks by state: used by live sequences, free, and free but still holding a cached prefix.",
        &[
            ("{state=\"used\"}", m.blocks_used as f64),
            ("{state=\"free\"}", m.blocks_free as f64),
            ("{state=\"cached\"}", m.blocks_cached as f64),
        ],
    );
    metric(
        "kv_blocks_used_peak",
        "gauge",
        "The most KV blocks used at once since the server started.",
        &[("", m.blocks_used_peak as f64)],
    );
    if m.state_slots_total > 0 {
        metric(
            "state_slots",
            "gauge",
            "Recurrent state slots (one per running sequence of a model with recurrent layers): used and free.",
            &[
                ("{state=\"used\"}", (m.state_slots_total - m.state_slots_free) as f64),
                ("{state=\"free\"}", m.state_slots_free as f64),
            ],
        );
        metric(
            "state_slots_total",
            "gauge",
            "Recurrent state slots for running sequences (as many more hold snapshots), from the KV memory budget.",
            &[("", m.state_slots_total as f64)],
        );
        metric(
            "state_snapshots",
            "gauge",
            "Snapshots of recurrent states kept at the end of cached prompts (a later prompt resumes from one).",
            &[("", m.state_snapshots as f64)],
        );
        metric(
            "state_snapshot_bytes",
            "gauge",
            "Bytes of the recurrent state snapshots held (one state slot each, out of the KV memory budget).",
            &[("", m.state_snapshot_bytes as f64)],
        );
        metric(
            "state_slot_bytes",
            "gauge",
            "Bytes of one recurrent state slot (every recurrent layer's state of one sequence).",
            &[("", m.state_slot_bytes as f64)],
        );
    }
    if let Some((total, free)) = m.draft_blocks {
        metric(
            "draft_kv_blocks",
            "gauge",
            "The draft model's KV pool (--spec draft): blocks used by speculating sequences, and free.",
            &[
                ("{state=\"used\"}", (total - free) as f64),
                ("{state=\"free\"}", free as f64),
            ],
        );
    }
    let mut recent = m.ttft_ms.clone();
    recent.sort_unstable();
    let quantile = |q: f64| -> f64 {
        if recent.is_empty() {
            f64::NAN
        } else {
            let i = ((recent.len() - 1) as f64 * q).round() as usize;
            recent[i] as f64 / 1000.0
        }
    };
    metric(
        "time_to_first_token_seconds",
        "summary",
        "Time from submission to the first token (quantiles over the most recent 4096 requests).",
        &[
            ("{quantile=\"0.5\"}", quantile(0.5)),
            ("{quantile=\"0.9\"}", quantile(0.9)),
            ("{quantile=\"0.99\"}", quantile(0.99)),
        ],
    );
    let _ = writeln!(
        out,
        "edge_llm_time_to_first_token_seconds_sum {}",
        m.ttft_ms_sum as f64 / 1000.0
    );
    let _ = writeln!(
        out,
        "edge_llm_time_to_first_token_seconds_count {}",
        m.ttft_count
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_sees_only_its_own_counters_and_an_admin_sees_every_key_by_place() {
        let mine = TenantMetrics {
            requests_submitted: 4,
            tokens_generated: 9,
            ..Default::default()
        };
        let text = tenant(&mine);
        assert!(
            text.contains("edge_llm_requests_submitted_total 4\n"),
            "{text}"
        );
        assert!(
            text.contains("edge_llm_generation_tokens_total 9\n"),
            "{text}"
        );
        assert!(!text.contains("kv_blocks"), "{text}");
        let m = Metrics {
            tenants: [(77, mine), (5, TenantMetrics::default())].into(),
            ..Default::default()
        };
        let text = tenants(&m, |salt| [5u64, 77].iter().position(|&s| s == salt));
        assert!(
            text.contains("edge_llm_key_requests_submitted_total{key=\"2\"} 4\n"),
            "{text}"
        );
        assert!(text.contains("edge_llm_key_generation_tokens_total{key=\"1\"} 0\n"));
    }

    #[test]
    fn exposition_has_the_named_series() {
        let m = Metrics {
            blocks_used: 3,
            requests_aborted: 2,
            ttft_ms: vec![10, 30, 20],
            ttft_ms_sum: 60,
            ttft_count: 3,
            ..Default::default()
        };
        let text = prometheus(&m);
        assert!(
            text.contains("edge_llm_kv_blocks{state=\"used\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("edge_llm_requests_aborted_total 2\n"));
        assert!(text.contains("edge_llm_time_to_first_token_seconds{quantile=\"0.5\"} 0.02\n"));
        assert!(text.contains("edge_llm_time_to_first_token_seconds_count 3\n"));
        // Every sample line is `name{labels} value`.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok() || value == "NaN", "{line}");
        }
    }
}

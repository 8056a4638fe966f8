//! Issue 30, item 3: the compiled-grammar cache was bounded by count (256), not bytes; 262
//! distinct 330 KB enum schemas took the server from 134 MB to 3.8 GB resident, and it stayed
//! there. Now the cache is charged an estimate of each grammar's memory and bounded by
//! `--grammar-cache-mib` (128 by default): after 300 such schemas the server's resident memory
//! stays under 600 MB and /metrics shows the charge within the budget.

mod support;

use serde_json::{json, Value};
use support::harness::*;

fn resident_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        / 1024
}

/// A schema of one property whose value is one of 16,000 words unique to `k` (about 330 KB).
fn enum_schema(k: usize) -> Value {
    let words: Vec<String> = (0..16_000)
        .map(|i| format!("w{k}_{i}_{}", i * 7919 % 100_003))
        .collect();
    json!({"type": "object", "properties": {"a": {"enum": words}}, "required": ["a"]})
}

#[test]
fn three_hundred_large_schemas_leave_resident_memory_under_600_mib() {
    let Some(server) = Server::start(&[]) else {
        return;
    };
    let mut peak = 0;
    for k in 0..300 {
        let body = chat_body(
            "hi",
            json!({"max_tokens": 1, "response_format": {"type": "json_schema",
                   "json_schema": {"name": "x", "schema": enum_schema(k)}}}),
        );
        let (status, v) = server.post("/v1/chat/completions", &body);
        assert_eq!(status, 200, "{v}");
        if k % 25 == 24 {
            peak = peak.max(resident_mib(server.pid()));
        }
    }
    let resident = resident_mib(server.pid());
    assert!(
        peak < 600 && resident < 600,
        "resident memory {resident} MiB (peak {peak} MiB) after 300 large schemas"
    );
    let charged = server.metric("edge_llm_grammar_cache_bytes");
    assert!(charged > 0.0 && charged <= (128 << 20) as f64, "{charged}");
    assert_eq!(server.metric("edge_llm_grammars_compiled_total"), 300.0);
    eprintln!(
        "resident {resident} MiB (peak {peak} MiB), grammar cache charged {:.0} MiB",
        charged / (1 << 20) as f64
    );
}

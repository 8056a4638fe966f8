//! Issue 30, item 3: the compiled-grammar cache was bounded by count (256), not bytes; 262
//! distinct 330 KB enum schemas took the server from 134 MB to 3.8 GB resident, and it stayed
//! there. Now the cache is charged an estimate of each grammar's memory and bounded by
//! `--grammar-cache-mib` (128 by default): after 300 such schemas the server's resident memory
//! stays under 600 MB and /metrics shows the charge within the budget.
//!
//! Item 9 (the last of its list): one constrained row's slow mask (122 ms seen) held the whole
//! step. Now a step waits at most `--mask-budget-ms` after its forward pass; a row whose mask is
//! still computing ends its own request, and the others go on.

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

/// A Lark grammar of words, each one of 1,990 regular expressions (`/[a-z]{k}abcd/`): every mask
/// runs the vocabulary through a lexer of 1,990 lexemes and an Earley row of as many items (about
/// 15 ms a mask on a 2-core EPYC, a hundred times a JSON schema's), under llguidance's limits.
fn costly_grammar() -> String {
    let words: Vec<String> = (0..1990usize)
        .map(|i| {
            let tail: String = (0..4)
                .map(|j| (b'a' + ((i >> (3 * j)) & 7) as u8) as char)
                .collect();
            format!("/[a-z]{{{}}}{tail}/", i % 5 + 1)
        })
        .collect();
    format!("start: w (\" \" w)*\nw: {}", words.join(" | "))
}

#[test]
fn a_mask_past_its_budget_ends_only_its_own_request() {
    let Some(server) = Server::start(&["--mask-budget-ms", "1"]) else {
        return;
    };
    std::thread::scope(|s| {
        // A stream without a constraint, running while the costly grammar is tried.
        let stream = s.spawn(|| {
            server.post_stream(
                "/v1/completions",
                &completion_body(
                    "Once upon a time",
                    json!({"stream": true, "max_tokens": 48, "ignore_eos": true}),
                ),
            )
        });
        std::thread::sleep(std::time::Duration::from_millis(200));
        let (status, v) = server.post(
            "/v1/completions",
            &completion_body(
                "Write:",
                json!({"grammar": costly_grammar(), "max_tokens": 8}),
            ),
        );
        assert_eq!(status, 400, "{v}");
        assert_eq!(v["error"]["code"], "constraint_failed", "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains("--mask-budget-ms"), "{message}");
        let (events, done) = stream.join().unwrap();
        assert!(done, "the other stream ends with [DONE]");
        let text: String = events
            .iter()
            .filter_map(|e| e["choices"][0]["text"].as_str())
            .collect();
        assert!(!text.is_empty());
        let finish = events
            .iter()
            .find_map(|e| e["choices"][0]["finish_reason"].as_str());
        assert_eq!(
            finish,
            Some("length"),
            "the other stream ran to its max_tokens"
        );
    });
    assert_eq!(server.metric("edge_llm_requests_failed_total"), 1.0);
    // The server goes on: the same grammar under a server's default budget is served.
    drop(server);
    let server = Server::start(&[]).unwrap();
    let (status, v) = server.post(
        "/v1/completions",
        &completion_body(
            "Write:",
            json!({"grammar": costly_grammar(), "max_tokens": 8}),
        ),
    );
    assert_eq!(status, 200, "{v}");
}

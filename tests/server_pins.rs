//! Issue 30, item 2, over HTTP: any key could pin, pins were nobody's, could not be removed and
//! were appended again on every repeat, so key B's pins made key A's requests fail until a
//! restart. Now with API keys only an `--admin-api-key` pins; each pin has an id and an owner,
//! is listed to its owner (and admins) and removed with `DELETE /v1/cache/pin/{id}`; one key
//! pinning the same prompt twice gets the same pin; a key's pins stay within
//! `--pin-budget-tokens`, refused before anything is computed; and in any mix of pins, unpins
//! and requests on a small pool, no request fails with a 5xx.

mod support;

use serde_json::{json, Value};
use support::harness::*;

const ADMIN: (&str, &str) = ("Authorization", "Bearer admin");
const OTHER: (&str, &str) = ("Authorization", "Bearer key-b");

fn words(n: usize, salt: usize) -> String {
    (0..n)
        .map(|i| format!("w{}", (i * 7 + salt * 131) % 997))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A sample of /metrics read with `key`.
fn metric(server: &Server, key: (&str, &str), name: &str) -> f64 {
    let text = server.request("GET", "/metrics", &[key], b"").text();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

fn pinned_blocks(server: &Server, key: (&str, &str)) -> u64 {
    let (_, v) = server.send("GET", "/v1/cache", key, &Value::Null);
    v["memory"]["blocks_pinned"].as_u64().unwrap()
}

#[test]
fn pins_belong_to_admin_keys_are_deduplicated_budgeted_and_removable() {
    let Some(server) = Server::start(&[
        "--kv-mem",
        "12",
        "-c",
        "512",
        "--admin-api-key",
        "admin",
        "--api-key",
        "key-b",
        "--pin-budget-tokens",
        "200",
    ]) else {
        return;
    };
    let prompt = json!({"prompt": words(40, 1)});
    // A key that is not an admin cannot pin.
    let (status, v) = server.send("POST", "/v1/cache/pin", OTHER, &prompt);
    assert_eq!(status, 403, "{v}");
    assert_eq!(pinned_blocks(&server, ADMIN), 0);
    // The admin pins; the same prompt again is the same pin.
    let (status, first) = server.send("POST", "/v1/cache/pin", ADMIN, &prompt);
    assert_eq!(status, 200, "{first}");
    let id = first["id"].as_str().unwrap().to_string();
    let blocks = pinned_blocks(&server, ADMIN);
    assert!(blocks > 0);
    let (status, again) = server.send("POST", "/v1/cache/pin", ADMIN, &prompt);
    assert_eq!(status, 200, "{again}");
    assert_eq!(
        (
            again["id"].as_str().unwrap(),
            again["already_pinned"].as_bool()
        ),
        (id.as_str(), Some(true))
    );
    assert_eq!(pinned_blocks(&server, ADMIN), blocks);
    let (_, info) = server.send("GET", "/v1/cache", ADMIN, &Value::Null);
    assert_eq!(info["pinned"].as_array().unwrap().len(), 1, "{info}");
    // Another key sees nothing of it and cannot remove it.
    let (_, info) = server.send("GET", "/v1/cache", OTHER, &Value::Null);
    assert_eq!(info["pinned"], json!([]), "{info}");
    let (status, _) = server.send(
        "DELETE",
        &format!("/v1/cache/pin/{id}"),
        OTHER,
        &Value::Null,
    );
    assert_eq!(status, 404);
    // Past the key's budget: refused, nothing computed.
    let submitted = metric(&server, ADMIN, "edge_llm_requests_submitted_total");
    let (status, v) = server.send(
        "POST",
        "/v1/cache/pin",
        ADMIN,
        &json!({"prompt": words(150, 2)}),
    );
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "pin_budget_exceeded", "{v}");
    assert_eq!(
        metric(&server, ADMIN, "edge_llm_requests_submitted_total"),
        submitted
    );
    // Removed: its blocks are no longer pinned.
    let (status, v) = server.send(
        "DELETE",
        &format!("/v1/cache/pin/{id}"),
        ADMIN,
        &Value::Null,
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["deleted"], true);
    assert_eq!(pinned_blocks(&server, ADMIN), 0);
    let (status, _) = server.send(
        "DELETE",
        &format!("/v1/cache/pin/{id}"),
        ADMIN,
        &Value::Null,
    );
    assert_eq!(status, 404);
}

#[test]
fn no_request_fails_in_a_mix_of_pins_unpins_and_requests() {
    // 34 blocks of 16 tokens; pins may take up to half.
    let Some(server) = Server::start(&["--kv-mem", "12", "-c", "512"]) else {
        return;
    };
    let none = ("X-Nothing", "");
    let mut pins: Vec<String> = Vec::new();
    for round in 0..12 {
        let (status, v) = server.send(
            "POST",
            "/v1/cache/pin",
            none,
            &json!({"prompt": words(15 + 5 * (round % 4), round)}),
        );
        assert!(status == 200 || status == 400, "pin: {status} {v}");
        if status == 200 {
            pins.push(v["id"].as_str().unwrap().to_string());
        }
        for n in [20, 60, 100] {
            let body = completion_body(
                &words(n, 100 + round),
                json!({"max_tokens": 40, "ignore_eos": true}),
            );
            let (status, v) = server.post("/v1/completions", &body);
            assert!(
                status == 200 || status == 400,
                "{n}-word request: {status} {v}"
            );
        }
        if round % 3 == 2 {
            let id = pins.remove(0);
            let (status, v) =
                server.send("DELETE", &format!("/v1/cache/pin/{id}"), none, &Value::Null);
            assert_eq!(status, 200, "{v}");
        }
    }
    for id in pins {
        let (status, _) = server.send("DELETE", &format!("/v1/cache/pin/{id}"), none, &Value::Null);
        assert_eq!(status, 200);
    }
    assert_eq!(pinned_blocks(&server, none), 0);
    assert_eq!(server.metric("edge_llm_requests_failed_total"), 0.0);
}

/// Issue 30, item 8: key B's `/metrics` and `/v1/cache` showed key A's prompt sizes. Now a key
/// that is not an admin key sees its own counters and pins only; the admin sees the server's
/// figures and every key's counters, labelled by the key's place, never by the key.
#[test]
fn a_key_sees_only_its_own_figures_in_metrics_and_cache() {
    let Some(server) = Server::start(&[
        "--kv-mem",
        "12",
        "-c",
        "512",
        "--api-key",
        "key-a",
        "--admin-api-key",
        "admin",
        "--api-key",
        "key-b",
    ]) else {
        return;
    };
    const A: (&str, &str) = ("Authorization", "Bearer key-a");
    let (status, v) = server.send(
        "POST",
        "/v1/completions",
        A,
        &json!({"prompt": words(120, 3), "max_tokens": 3}),
    );
    assert_eq!(status, 200, "{v}");
    let prompt_tokens = v["usage"]["prompt_tokens"].as_f64().unwrap();
    // Key A sees its own request.
    assert_eq!(metric(&server, A, "edge_llm_requests_submitted_total"), 1.0);
    assert_eq!(
        metric(&server, A, "edge_llm_prompt_tokens_total"),
        prompt_tokens
    );
    // Key B sees nothing of it: its own zeros, no pool figures, no other key.
    let text = server.request("GET", "/metrics", &[OTHER], b"").text();
    for needle in ["kv_blocks", "vllm:", "key=", "grammar", "steps_total"] {
        assert!(!text.contains(needle), "key B sees {needle}:\n{text}");
    }
    assert_eq!(
        metric(&server, OTHER, "edge_llm_requests_submitted_total"),
        0.0
    );
    assert_eq!(metric(&server, OTHER, "edge_llm_prompt_tokens_total"), 0.0);
    let (_, cache) = server.send("GET", "/v1/cache", OTHER, &Value::Null);
    assert!(
        cache.get("memory").is_none() && cache.get("disk").is_none(),
        "{cache}"
    );
    assert_eq!(cache["pinned"], json!([]));
    // The admin sees the server, and key A (the first --api-key) by its place.
    let text = server.request("GET", "/metrics", &[ADMIN], b"").text();
    assert!(
        text.contains("edge_llm_kv_blocks{state=\"used\"}"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "edge_llm_key_prompt_tokens_total{{key=\"1\"}} {prompt_tokens}\n"
        )),
        "{text}"
    );
    assert!(!text.contains("key-a"));
    assert!(pinned_blocks(&server, ADMIN) == 0);
}

//! Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`) against the real
//! server on Qwen2.5 Coder 0.5B: whole and streamed replies (the event order, the deltas joining
//! to the whole reply at temperature 0), a tool round trip, `count_tokens` equal to a
//! generation's prompt, Anthropic-shaped errors naming the field, `x-api-key`, Claude Code's
//! billing line kept out of the prefix cache's way, a hang-up mid-stream freeing its blocks,
//! and the official `anthropic` Python client (tests/anthropic_client.py).

mod support;

use std::io::Read;
use std::path::PathBuf;
use std::process::Command;

use serde_json::{json, Value};
use support::harness::{post_json, Server};

const KEY: &str = "messages-key";

fn qwen_server(extra: &[&str]) -> Option<Server> {
    let qwen = support::fetched(support::qwen_path(), support::FETCH_EXTRA_MODELS)?;
    let qwen = qwen.to_string_lossy().into_owned();
    let mut args = vec!["-m", qwen.as_str(), "-c", "4096"];
    args.extend_from_slice(extra);
    Server::start(&args)
}

fn post(server: &Server, path: &str, body: &Value, key: Option<&str>) -> (u16, Value, String) {
    let mut headers = vec![
        ("Content-Type", "application/json"),
        ("anthropic-version", "2023-06-01"),
    ];
    if let Some(k) = key {
        headers.push(("x-api-key", k));
    }
    let r = server.request("POST", path, &headers, body.to_string().as_bytes());
    let text = r.text();
    let v = if r
        .header("content-type")
        .is_some_and(|c| c.starts_with("text/event-stream"))
    {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {text}"))
    };
    (r.status, v, text)
}

/// The `(event, data)` pairs of an Anthropic event stream.
fn events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .map(|b| {
            let mut lines = b.lines();
            let name = lines.next().and_then(|l| l.strip_prefix("event: "));
            let data = lines.next().and_then(|l| l.strip_prefix("data: "));
            let (Some(name), Some(data)) = (name, data) else {
                panic!("not an Anthropic event: {b:?}");
            };
            let v: Value = serde_json::from_str(data).unwrap();
            assert_eq!(v["type"], json!(name), "{b}");
            (name.to_string(), v)
        })
        .collect()
}

fn hello(extra: Value) -> Value {
    let mut body = json!({"model": "claude-sonnet-4-5-20250929", "max_tokens": 24, "temperature": 0,
        "messages": [{"role": "user", "content": "Say hello in one short sentence."}]});
    support::harness::merge(&mut body, extra);
    body
}

fn weather_tools() -> Value {
    json!([{"name": "get_weather", "description": "Get the current weather in a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                             "required": ["city"]}},
           {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}])
}

/// Anthropic's error shape, with the message naming `needle`.
fn assert_anthropic_error(v: &Value, kind: &str, needle: &str) {
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], kind, "{v}");
    let message = v["error"]["message"].as_str().unwrap_or("");
    assert!(
        message.contains(needle),
        "the message should name {needle:?}: {v}"
    );
}

#[test]
fn messages_whole_streamed_tools_count_tokens_and_hang_up() {
    let Some(server) = qwen_server(&[]) else {
        return;
    };
    let path = "/v1/messages?beta=true";
    let (status, whole, _) = post(&server, path, &hello(json!({})), None);
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["type"], "message");
    assert_eq!(whole["role"], "assistant");
    assert!(whole["id"].as_str().unwrap().starts_with("msg_"), "{whole}");
    let text = whole["content"][0]["text"].as_str().unwrap().to_string();
    assert!(!text.is_empty(), "{whole}");
    assert!(["end_turn", "max_tokens"].contains(&whole["stop_reason"].as_str().unwrap()));
    let usage = &whole["usage"];
    let prompt = usage["input_tokens"].as_u64().unwrap()
        + usage["cache_read_input_tokens"].as_u64().unwrap();

    // Streamed: the events in Anthropic's order, the deltas joining to the whole text.
    let (status, _, raw) = post(&server, path, &hello(json!({"stream": true})), None);
    assert_eq!(status, 200, "{raw}");
    let evs = events(&raw);
    let names: Vec<&str> = evs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names[..4],
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta"
        ],
        "{raw}"
    );
    assert_eq!(
        names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"],
        "{raw}"
    );
    let joined: String = evs
        .iter()
        .filter_map(|(_, v)| v["delta"]["text"].as_str())
        .collect();
    assert_eq!(joined, text);
    let delta = &evs[evs.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], whole["stop_reason"]);
    assert_eq!(
        delta["usage"]["output_tokens"], usage["output_tokens"],
        "{delta}"
    );

    // count_tokens: the prompt a generation of the same body reports.
    let (status, count, _) = post(
        &server,
        "/v1/messages/count_tokens",
        &hello(json!({})),
        None,
    );
    assert_eq!(status, 200, "{count}");
    assert_eq!(
        count["input_tokens"].as_u64(),
        Some(prompt),
        "{count} {whole}"
    );

    // A tool round trip: tool_use (whole and streamed alike), then tool_result.
    let ask = json!([{"role": "user", "content": "What is the weather in Paris?"}]);
    let call_body = json!({"model": "m", "max_tokens": 60, "temperature": 0, "messages": ask,
                           "tools": weather_tools(), "tool_choice": {"type": "any"}});
    let (status, call, _) = post(&server, "/v1/messages", &call_body, None);
    assert_eq!(status, 200, "{call}");
    assert_eq!(call["stop_reason"], "tool_use", "{call}");
    let tool_use = call["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap_or_else(|| panic!("no tool_use block: {call}"))
        .clone();
    assert_eq!(tool_use["name"], "get_weather");
    assert!(tool_use["input"]["city"].is_string(), "{tool_use}");
    assert!(tool_use["id"].as_str().unwrap().starts_with("toolu_"));
    let mut streamed = call_body.clone();
    streamed["stream"] = json!(true);
    let (_, _, raw) = post(&server, "/v1/messages", &streamed, None);
    let evs = events(&raw);
    let partial: String = evs
        .iter()
        .filter(|(_, v)| v["delta"]["type"] == "input_json_delta" && v["index"] == 0)
        .filter_map(|(_, v)| v["delta"]["partial_json"].as_str())
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&partial).unwrap(),
        tool_use["input"],
        "{raw}"
    );
    assert!(raw.contains("\"stop_reason\":\"tool_use\""), "{raw}");
    let id = tool_use["id"].as_str().unwrap();
    let answer_body = json!({"model": "m", "max_tokens": 40, "temperature": 0,
        "tools": weather_tools(),
        "messages": [ask[0], {"role": "assistant", "content": call["content"]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": id,
                "content": [{"type": "text", "text": "Sunny, 24 degrees Celsius."}]}]}]});
    let (status, answer, _) = post(&server, "/v1/messages", &answer_body, None);
    assert_eq!(status, 200, "{answer}");
    assert!(
        answer["content"].as_array().is_some_and(|c| !c.is_empty()),
        "{answer}"
    );
    assert!(
        server
            .log_text()
            .contains("ignoring Anthropic server tools web_search_20250305"),
        "the ignored server tool is logged"
    );

    // A hang-up mid-stream aborts the request and frees its blocks.
    let aborted_before = server.metric("edge_llm_requests_aborted_total");
    let long = json!({"model": "m", "max_tokens": 400, "stream": true,
        "messages": [{"role": "user", "content": "Tell me a very long story about a dragon."}]});
    let mut s = post_json(&server.addr, "/v1/messages", &long);
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("text_delta") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "ended early: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    drop(s);
    server.wait_for_metrics("the hung-up request's abort", |s| {
        s.metric("edge_llm_requests_aborted_total") >= aborted_before + 1.0
            && s.metric("edge_llm_kv_blocks{state=\"used\"}") == 0.0
    });
}

#[test]
fn claude_codes_billing_line_does_not_defeat_the_prefix_cache() {
    let Some(server) = qwen_server(&[]) else {
        return;
    };
    let rules = "You are a careful assistant for a software team. ".repeat(40);
    let body = |cch: &str| {
        json!({"model": "m", "max_tokens": 4, "temperature": 0,
            "system": [{"type": "text", "text": format!(
                "x-anthropic-billing-header: cc_version=2.1.332.abc; cc_entrypoint=sdk-cli; cch={cch};")},
                {"type": "text", "text": rules, "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": "Say hi."}]})
    };
    let (status, first, _) = post(&server, "/v1/messages", &body("1f2e3"), None);
    assert_eq!(status, 200, "{first}");
    let (_, second, _) = post(&server, "/v1/messages", &body("9a8b7"), None);
    let u = &second["usage"];
    let cached = u["cache_read_input_tokens"].as_u64().unwrap();
    let prompt = cached + u["input_tokens"].as_u64().unwrap();
    assert!(
        cached * 10 >= prompt * 9,
        "the second request (another cch=) should reuse nearly all of the first's prompt: {u}"
    );
}

#[test]
fn messages_errors_and_auth() {
    let Some(server) = qwen_server(&["--api-key", KEY]) else {
        return;
    };
    // Claude Code's first request.
    let head = server.request("HEAD", "/", &[], b"");
    assert_eq!(head.status, 200);
    // The key in x-api-key or as a bearer token; errors in Anthropic's shape.
    let (status, v, _) = post(&server, "/v1/messages", &hello(json!({})), None);
    assert_eq!(status, 401, "{v}");
    assert_anthropic_error(&v, "authentication_error", "x-api-key");
    let (status, v, _) = post(&server, "/v1/messages", &hello(json!({})), Some("wrong"));
    assert_eq!(status, 401, "{v}");
    assert_anthropic_error(&v, "authentication_error", "invalid API key");
    let bearer = server.request(
        "POST",
        "/v1/messages",
        &[
            ("Content-Type", "application/json"),
            ("Authorization", &format!("Bearer {KEY}")),
        ],
        hello(json!({})).to_string().as_bytes(),
    );
    assert_eq!(bearer.status, 200, "{}", bearer.text());
    let key = Some(KEY);

    let image = json!({"model": "m", "max_tokens": 8, "messages": [
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
        {"role": "user", "content": [{"type": "text", "text": "What is this?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]});
    let (status, v, _) = post(&server, "/v1/messages", &image, key);
    assert_eq!(status, 400, "{v}");
    assert_anthropic_error(&v, "invalid_request_error", "messages[2].content[1]");
    assert!(v.to_string().contains("no vision"), "{v}");
    for (bad, field) in [
        (hello(json!({"max_tokens": "many"})), "max_tokens"),
        (hello(json!({"temperature": 7})), "temperature"),
        (hello(json!({"stop_sequences": "END"})), "stop_sequences"),
        (
            hello(json!({"messages": [{"role": "robot", "content": "x"}]})),
            "messages[0].role",
        ),
        (
            hello(json!({"tool_choice": {"type": "sometimes"}})),
            "tool_choice.type",
        ),
        (
            hello(json!({"tools": [{"name": "f"}]})),
            "tools[0].input_schema",
        ),
        (
            hello(json!({"thinking": {"type": "maybe"}})),
            "thinking.type",
        ),
    ] {
        let (status, v, _) = post(&server, "/v1/messages", &bad, key);
        assert_eq!(status, 400, "{bad}: {v}");
        assert_anthropic_error(&v, "invalid_request_error", field);
        let (status, v, _) = post(&server, "/v1/messages/count_tokens", &bad, key);
        assert!(
            status == 400 || field == "max_tokens" || field == "temperature",
            "{v}"
        );
    }
    let r = server.request(
        "POST",
        "/v1/messages",
        &[("x-api-key", KEY), ("Content-Type", "application/json")],
        b"{not json",
    );
    assert_eq!(r.status, 400);
    let v: Value = serde_json::from_str(&r.text()).unwrap();
    assert_anthropic_error(&v, "invalid_request_error", "not valid JSON");
    let (status, v, _) = post(&server, "/v1/messages/batches", &hello(json!({})), key);
    assert_eq!(status, 404, "{v}");
    assert_anthropic_error(&v, "not_found_error", "/v1/messages/batches");
    // Thinking blocks fed back and Anthropic's extra fields are accepted; any model name is.
    let extra = hello(
        json!({"thinking": {"type": "adaptive"}, "metadata": {"user_id": "u"},
        "output_config": {"effort": "low"}, "context_management": {"edits": []},
        "messages": [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "x"},
                {"type": "text", "text": "Hello."}]},
            {"role": "user", "content": [{"type": "text", "text": "Bye.", "cache_control": {"type": "ephemeral"}}]}]}),
    );
    let (status, v, _) = post(&server, "/v1/messages", &extra, key);
    assert_eq!(status, 200, "{v}");
    assert_eq!(server.get("/health").0, 200);
}

/// The venv with the `anthropic` package (scripts/test.sh makes it; made here when missing).
fn anthropic_python() -> Option<PathBuf> {
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/messages-venv");
    let python = venv.join("bin/python");
    let ready = |py: &PathBuf| {
        Command::new(py)
            .args(["-c", "import anthropic, pydantic"])
            .status()
            .is_ok_and(|s| s.success())
    };
    if !ready(&python) {
        let _ = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status();
        let _ = Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "anthropic",
            ])
            .status();
    }
    if ready(&python) {
        Some(python)
    } else {
        support::skip_or_fail("the `anthropic` Python package could not be installed");
        None
    }
}

#[test]
fn anthropic_python_client() {
    let Some(python) = anthropic_python() else {
        return;
    };
    let Some(server) = qwen_server(&["--api-key", KEY]) else {
        return;
    };
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/anthropic_client.py");
    let out = Command::new(python)
        .arg(script)
        .arg(format!("http://{}", server.addr))
        .arg(KEY)
        .output()
        .expect("running tests/anthropic_client.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("all anthropic checks passed"),
        "anthropic checks failed:\n{stdout}\n{stderr}\nserver log:\n{}",
        server.log_text()
    );
}

/// A stop sequence that ends the reply is reported as such (`stop_reason: "stop_sequence"`,
/// `stop_sequence` naming it), whole and streamed, and its text is left out.
#[test]
fn a_stop_sequence_is_named_in_the_reply() {
    let Some(server) = qwen_server(&[]) else {
        return;
    };
    let body = json!({"model": "m", "max_tokens": 60, "temperature": 0, "stop_sequences": ["never", "5"],
        "messages": [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]});
    let (status, v, _) = post(&server, "/v1/messages", &body, None);
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (v["stop_reason"].as_str(), v["stop_sequence"].as_str()),
        (Some("stop_sequence"), Some("5")),
        "{v}"
    );
    let text = v["content"][0]["text"].as_str().unwrap();
    assert!(text.contains('4') && !text.contains('5'), "{text}");
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let events = server.post_events("/v1/messages", &streamed);
    let delta = events
        .iter()
        .find(|(name, _)| name == "message_delta")
        .map(|(_, v)| v["delta"].clone())
        .expect("a message_delta");
    assert_eq!(
        delta,
        json!({"stop_reason": "stop_sequence", "stop_sequence": "5"})
    );
    // Without a stop sequence hit: end_turn and null.
    let (_, v, _) = post(
        &server,
        "/v1/messages",
        &hello(json!({"stop_sequences": ["zzz"]})),
        None,
    );
    assert_eq!(
        (v["stop_reason"].as_str(), &v["stop_sequence"]),
        (Some("end_turn"), &Value::Null),
        "{v}"
    );
}

//! Agents' requests beyond plain structured output (issue 11's remainder). Reasoning replies
//! through the real server: with a chat template that thinks
//! (`tests/templates/think-chatml.jinja`, given with `--chat-template`, on Qwen2.5 Coder 0.5B),
//! the thoughts come back as `message.reasoning_content` / `delta.reasoning_content` apart from
//! `content`, and a JSON schema constrains only what follows `</think>`. Also: a grammar that
//! exceeds llguidance's per-token budget ends its request with a 400 instead of hanging, and a
//! JSON-schema keyword llguidance does not implement (or, under `strict`, one no draft knows)
//! is a 400 naming it. `run --jsonl` lines take `tools` and answer with `tool_calls`, and split
//! reasoning, through the server's own code.

mod support;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use support::harness::*;
use support::{fetched, qwen_path, FETCH_EXTRA_MODELS};

/// Qwen2.5 Coder 0.5B's path; None (see `support::skip_or_fail`) when it is missing.
fn thinking_server_model() -> Option<PathBuf> {
    fetched(qwen_path(), FETCH_EXTRA_MODELS)
}

fn thinking_server() -> Option<Server> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let path = thinking_server_model()?;
    let template = root.join("tests/templates/think-chatml.jinja");
    Server::start(&[
        "-m",
        path.to_str().unwrap(),
        "-c",
        "2048",
        "--chat-template",
        template.to_str().unwrap(),
    ])
}

fn person_format() -> Value {
    json!({"type": "json_schema", "json_schema": {"name": "person", "strict": true, "schema": {
        "type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"]}}})
}

#[test]
fn thoughts_are_split_out_and_the_schema_applies_after_them() {
    let Some(server) = thinking_server() else {
        return;
    };
    let body = chat_body(
        "Describe a person as JSON.",
        json!({"temperature": 0, "max_tokens": 120, "response_format": person_format()}),
    );
    let (status, r) = server.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{r}");
    let message = &r["choices"][0]["message"];
    let thoughts = message["reasoning_content"].as_str().unwrap_or_else(|| {
        panic!("no reasoning_content: the thoughts were not split out (or the schema applied from the start): {r}")
    });
    assert!(
        !thoughts.trim().is_empty() && !thoughts.contains("think>"),
        "{r}"
    );
    let content = message["content"].as_str().unwrap();
    assert!(!content.contains("think>"), "{r}");
    let person: Value = serde_json::from_str(content)
        .unwrap_or_else(|e| panic!("content is not the schema's JSON ({e}): {r}"));
    assert!(person["name"].is_string() && person["age"].is_i64(), "{r}");
    assert_eq!(r["choices"][0]["finish_reason"], json!("stop"));

    // Streamed: reasoning deltas and content deltas join to exactly the whole reply's fields.
    let mut b = body.clone();
    merge(&mut b, json!({"stream": true}));
    let (events, done) = server.post_stream("/v1/chat/completions", &b);
    assert!(done);
    let (mut streamed_thoughts, mut streamed_content) = (String::new(), String::new());
    for e in &events {
        let delta = &e["choices"][0]["delta"];
        streamed_thoughts.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
        streamed_content.push_str(delta["content"].as_str().unwrap_or(""));
    }
    assert_eq!(streamed_thoughts, thoughts);
    assert_eq!(streamed_content, content);

    // Without a constraint the split holds too; `reasoning_format: none` leaves the thoughts in
    // `content`, as llama-server does.
    let plain = chat_body(
        "Name a colour as JSON.",
        json!({"temperature": 0, "max_tokens": 60}),
    );
    let (_, r) = server.post("/v1/chat/completions", &plain);
    let message = &r["choices"][0]["message"];
    assert!(message["reasoning_content"].is_string(), "{r}");
    assert!(
        !message["content"].as_str().unwrap().contains("think>"),
        "{r}"
    );
    let mut raw = plain.clone();
    merge(&mut raw, json!({"reasoning_format": "none"}));
    let (_, r) = server.post("/v1/chat/completions", &raw);
    let message = &r["choices"][0]["message"];
    assert!(message.get("reasoning_content").is_none(), "{r}");
    assert!(
        message["content"].as_str().unwrap().contains("</think>"),
        "{r}"
    );
    assert_error(
        &server,
        "/v1/chat/completions",
        &chat_body("hi", json!({"reasoning_format": "sometimes"}))
            .to_string()
            .into_bytes(),
        400,
        Some("reasoning_format"),
        "none",
    );
    server.wait_for_metrics("blocks back", |s| {
        s.metric("edge_llm_kv_blocks{state=\"used\"}") == 0.0
    });
}

/// Lark with 3000 alternatives that all start alike: after the first token, llguidance's parser
/// row holds 9000 items, over its per-token limit of 2000.
fn budget_breaking_grammar() -> String {
    let n = 3000;
    let alternatives: Vec<String> = (0..n).map(|i| format!("r{i}")).collect();
    let mut g = format!("start: {}\n", alternatives.join(" | "));
    for i in 0..n {
        g.push_str(&format!("r{i}: \"a\" x{i}\nx{i}: \"b\" | \"c\"\n"));
    }
    g
}

#[test]
fn a_grammar_over_the_step_budget_is_a_400_and_the_server_goes_on() {
    let Some(server) = Server::start(&[]) else {
        return;
    };
    let body = completion_body(
        "hello",
        json!({"grammar": budget_breaking_grammar(), "max_tokens": 8, "temperature": 0}),
    );
    let (status, r) = server.post("/v1/completions", &body);
    assert_eq!(status, 400, "{r}");
    assert_eq!(r["error"]["code"], json!("constraint_failed"), "{r}");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(message.contains("max is 2000"), "{r}");
    assert!(message.len() < 400, "one short line: {message}");
    // Streamed: an error event, then [DONE].
    let mut b = body.clone();
    merge(&mut b, json!({"stream": true}));
    let (events, done) = server.post_stream("/v1/completions", &b);
    assert!(done, "no [DONE]");
    assert!(
        events
            .iter()
            .any(|e| e["error"]["code"] == json!("constraint_failed")),
        "{events:?}"
    );
    // The server keeps serving, and every block came back.
    let (status, _) = server.post(
        "/v1/completions",
        &completion_body("hello", json!({"max_tokens": 2})),
    );
    assert_eq!(status, 200);
    server.wait_for_metrics("blocks back", |s| {
        s.metric("edge_llm_kv_blocks{state=\"used\"}") == 0.0
    });
}

#[test]
fn unsupported_and_unknown_schema_keywords_are_400s_naming_them() {
    let Some(server) = Server::start(&[]) else {
        return;
    };
    let with = |schema: Value, strict: bool| {
        chat_body(
            "hi",
            json!({"max_tokens": 4, "response_format": {"type": "json_schema",
                "json_schema": {"name": "x", "strict": strict, "schema": schema}}}),
        )
        .to_string()
        .into_bytes()
    };
    let array_with = |kw: Value| {
        let mut items = json!({"type": "array", "items": {"type": "string"}});
        merge(&mut items, kw);
        json!({"type": "object", "properties": {"tags": items}})
    };
    // Keywords JSON Schema has and llguidance does not implement, strict or not.
    for (kw, name) in [
        (json!({"uniqueItems": true}), "uniqueItems"),
        (json!({"contains": {"const": "a"}}), "contains"),
    ] {
        for strict in [false, true] {
            assert_error(
                &server,
                "/v1/chat/completions",
                &with(array_with(kw.clone()), strict),
                400,
                Some("response_format"),
                &format!("`{name}` (in `schema.properties.tags`) is not supported"),
            );
        }
    }
    assert_error(
        &server,
        "/v1/chat/completions",
        &with(json!({"not": {"type": "string"}}), false),
        400,
        Some("response_format"),
        "`not`",
    );
    // A keyword no draft knows (a typo): refused under strict, ignored without (JSON Schema's
    // rule for unknown keywords); extensions (`x-...`) pass.
    let typo = array_with(json!({"minItemz": 1, "x-ui": "chips"}));
    assert_error(
        &server,
        "/v1/chat/completions",
        &with(typo.clone(), true),
        400,
        Some("response_format.json_schema.schema"),
        "`minItemz` (in `response_format.json_schema.schema.properties.tags`)",
    );
    let body: Value = serde_json::from_slice(&with(typo, false)).unwrap();
    let (status, r) = server.post("/v1/chat/completions", &body);
    assert_eq!(status, 200, "{r}");
}

fn run_jsonl(args: &[&str], input: &str) -> Vec<Value> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_edge-llm"))
        .arg("run")
        .arg("--jsonl")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn jsonl_lines_take_tools_and_split_reasoning_like_the_server() {
    let Some(qwen) = thinking_server_model() else {
        return;
    };
    let qwen = qwen.to_str().unwrap();
    let weather = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let line = |v: Value| v.to_string() + "\n";
    let ask = json!({"role": "user", "content": "What is the weather in Paris?"});
    let input = [
        line(json!({"id": "call", "messages": [ask], "tools": weather, "tool_choice": "required",
                    "parallel_tool_calls": false, "temperature": 0, "max_tokens": 60})),
        line(json!({"id": "bad", "messages": [ask],
                    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]})),
        line(json!({"id": "cmpl", "prompt": "hi", "tools": weather})),
        line(json!({"id": "unknown", "messages": [ask], "tools": weather,
                    "tool_choice": {"type": "function", "function": {"name": "nope"}}})),
    ]
    .concat();
    let lines = run_jsonl(&["-m", qwen], &input);
    assert_eq!(lines.len(), 4, "{lines:?}");
    let call = &lines[0];
    assert_eq!(call["id"], json!("call"));
    assert_eq!(call["finish_reason"], json!("tool_calls"), "{call}");
    let calls = call["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{call}");
    assert_eq!(calls[0]["type"], json!("function"));
    assert_eq!(calls[0]["function"]["name"], json!("get_weather"));
    let args: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(args["city"].is_string(), "{call}");
    assert!(
        !call["text"].as_str().unwrap().contains("<tool_call>"),
        "{call}"
    );
    // The server's own checks and messages.
    for (i, param) in [
        (1, "tools[0].function.parameters"),
        (2, "tools"),
        (3, "tool_choice"),
    ] {
        let e = lines[i]["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{}", lines[i]));
        assert!(e.contains(param), "{e}");
    }

    // A thinking template: the line carries `reasoning_content`, the schema applies after it.
    let template =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/templates/think-chatml.jinja");
    let input = line(
        json!({"id": 1, "messages": [{"role": "user", "content": "Describe a person as JSON."}],
        "temperature": 0, "max_tokens": 120, "response_format": person_format()}),
    );
    let lines = run_jsonl(
        &["-m", qwen, "--chat-template", template.to_str().unwrap()],
        &input,
    );
    let r = &lines[0];
    assert!(
        r["reasoning_content"]
            .as_str()
            .is_some_and(|t| !t.is_empty()),
        "{r}"
    );
    let person: Value =
        serde_json::from_str(r["text"].as_str().unwrap()).unwrap_or_else(|e| panic!("{e}: {r}"));
    assert!(person["name"].is_string() && person["age"].is_i64(), "{r}");
}

//! One rule for every face (issue 12, item 6; issue 13's one request parser): the same request
//! body is accepted or refused the same way by `serve` (`/v1/completions`,
//! `/v1/chat/completions`) and by `run --jsonl`, because both read it with `crate::api::plan`.
//! Each body below goes to both on the real default model with the same context (256); an
//! accepted one must be accepted by both, a refused one refused by both with the same message,
//! naming the same field (or none, for a refusal of the whole request).

mod support;

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use support::harness::*;

/// The context both faces run with.
const CONTEXT: &str = "256";

/// The field a refusal must name: `None`: accepted; `Some("")`: refused without naming a field.
fn cases() -> Vec<(Value, Option<&'static str>)> {
    let user = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0});
        merge(&mut b, extra);
        b
    };
    let text = |extra: Value| {
        let mut b = json!({"prompt": "Hi", "max_tokens": 2, "temperature": 0});
        merge(&mut b, extra);
        b
    };
    vec![
        (user(json!({})), None),
        (text(json!({})), None),
        // Unknown fields are ignored by both (routers add their own).
        (text(json!({"no_stop_trim": true, "max_tokenz": 3})), None),
        (text(json!({"prompt": [9906, 28]})), None),
        (
            json!({"messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}], "max_tokens": 2}),
            None,
        ),
        (
            json!({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": null}, {"role": "user", "content": "Go on"}], "max_tokens": 2}),
            None,
        ),
        (text(json!({"max_tokens": 0})), Some("max_tokens")),
        (user(json!({"max_tokens": -1})), Some("max_tokens")),
        (json!({"messages": [], "max_tokens": 2}), Some("messages")),
        (
            json!({"messages": [{"role": "wizard", "content": "Hi"}], "max_tokens": 2}),
            Some("messages[0].role"),
        ),
        (
            json!({"messages": [{"role": "user", "content": null}], "max_tokens": 2}),
            Some("messages[0].content"),
        ),
        (
            json!({"messages": [{"role": "user"}], "max_tokens": 2}),
            Some("messages[0].content"),
        ),
        (text(json!({"temperature": "hot"})), Some("temperature")),
        (text(json!({"temperature": -1})), Some("temperature")),
        (text(json!({"top_p": 7})), Some("top_p")),
        (text(json!({"stop": [1]})), Some("stop")),
        (text(json!({"prompt": 42})), Some("prompt")),
        (text(json!({"logit_bias": {"1": 2}})), None),
        (
            text(json!({"logit_bias": {"999999999": 2}})),
            Some("logit_bias"),
        ),
        (text(json!({"logit_bias": [["x"]]})), Some("logit_bias")),
        // The context (256): `max_tokens` beyond the room the prompt leaves, a prompt that
        // does not fit (refused by the engine's `submit`, named by the face).
        (text(json!({"max_tokens": 256})), Some("max_tokens")),
        (
            user(json!({"max_completion_tokens": 400})),
            Some("max_completion_tokens"),
        ),
        (text(json!({"prompt": vec![28; 300]})), Some("prompt")),
        (text(json!({"prompt": []})), Some("prompt")),
        // A token id outside the vocabulary: the engine refuses the whole request.
        (text(json!({"prompt": [9906, 999_999_999]})), Some("")),
        // Constraints are read and compiled the same way.
        (
            text(json!({"tools": [{"type": "function", "function": {"name": "f"}}]})),
            Some("tools"),
        ),
        (
            text(json!({"response_format": {"type": "bogus"}})),
            Some("response_format.type"),
        ),
        (text(json!({"regex": "("})), Some("regex")),
        (
            text(json!({"regex": "[ab]+", "grammar": "start: \"a\""})),
            Some("grammar"),
        ),
        (text(json!({"regex": "[ab]+"})), None),
    ]
}

#[test]
fn the_same_request_is_accepted_or_refused_the_same_way_by_serve_and_jsonl() {
    let cases = cases();
    // run --jsonl: all bodies at once, one result line each, in order.
    let model = support::model_path();
    assert!(
        model.is_file(),
        "{} is missing ({})",
        model.display(),
        support::FETCH_MODEL
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_edge-llm"))
        .args(["run", "--jsonl", "-c", CONTEXT, "-m"])
        .arg(&model)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let input: String = cases.iter().map(|(b, _)| format!("{b}\n")).collect();
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
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), cases.len(), "{lines:?}");

    let Some(server) = Server::start(&["-c", CONTEXT]) else {
        return;
    };
    for ((body, refused), line) in cases.iter().zip(&lines) {
        let path = if body.get("messages").is_some() {
            "/v1/chat/completions"
        } else {
            "/v1/completions"
        };
        let (status, reply) = server.post(path, body);
        match refused {
            None => {
                assert_eq!(status, 200, "serve refused {body}: {reply}");
                assert!(line.get("text").is_some(), "--jsonl refused {body}: {line}");
            }
            Some(param) => {
                assert_eq!(status, 400, "serve accepted {body}: {reply}");
                let want_param = if param.is_empty() {
                    Value::Null
                } else {
                    json!(param)
                };
                assert_eq!(reply["error"]["param"], want_param, "{body}: {reply}");
                let error = line["error"]
                    .as_str()
                    .unwrap_or_else(|| panic!("--jsonl accepted {body}: {line}"));
                assert!(
                    error.contains(param),
                    "{body}: {error:?} should name {param}"
                );
                // The same message: the line's error is `line N: [param: ]MESSAGE`.
                let message = reply["error"]["message"].as_str().unwrap();
                assert!(
                    error.ends_with(message),
                    "{body}: --jsonl said {error:?}, serve said {message:?}"
                );
            }
        }
    }
    assert_eq!(server.metric("edge_llm_kv_blocks{state=\"used\"}"), 0.0);
}

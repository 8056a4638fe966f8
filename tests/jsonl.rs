//! `edge-llm run --jsonl` on the real default model: results come back one per input line, in
//! input order, with their ids; a bad line in the middle gets an error line and the others go
//! on; greedy results equal `run -p` on the same prompt; requests sharing a prefix share it.

mod support;

use std::io::Write;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn edge_llm(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_edge-llm"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("binary starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn lines(out: &Output) -> Vec<Value> {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

const PREFIX: &str = "The following is a short note about the history of the city of Paris, written for visitors who arrive by train.";

#[test]
fn four_lines_with_a_bad_one_in_the_middle_come_back_in_order() {
    let m = support::model_path();
    let m = m.to_str().unwrap();
    let p1 = format!("{PREFIX} It begins");
    let p2 = format!("{PREFIX} The station");
    let input = [
        serde_json::json!({"id": "a", "prompt": p1, "max_tokens": 12, "temperature": 0}).to_string(),
        serde_json::json!({"id": 2, "prompt": p2, "max_tokens": 12, "temperature": 0.0}).to_string(),
        r#"{"id": "bad", "prompt": 42}"#.to_string(),
        serde_json::json!({"id": "m", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 12, "temperature": 0})
            .to_string(),
    ]
    .join("\n");
    let out = lines(&edge_llm(&["run", "--jsonl", "-m", m], &input));
    assert_eq!(out.len(), 4, "{out:?}");
    let ids: Vec<&Value> = out.iter().map(|l| &l["id"]).collect();
    assert_eq!(
        ids,
        [
            &Value::from("a"),
            &Value::from(2),
            &Value::from("bad"),
            &Value::from("m")
        ]
    );

    let error = out[2]["error"].as_str().expect("the bad line is an error");
    assert!(
        error.contains("line 3") && error.contains("prompt"),
        "{error}"
    );
    assert!(out[2].get("text").is_none());

    // Greedy results equal `run -p` with the same prompt and length.
    for (line, prompt) in [(&out[0], &p1), (&out[1], &p2)] {
        let single = edge_llm(
            &["run", "-m", m, "-p", prompt, "-n", "12", "--temp", "0"],
            "",
        );
        assert!(
            single.status.success(),
            "{}",
            String::from_utf8_lossy(&single.stderr)
        );
        assert_eq!(
            line["text"].as_str().unwrap(),
            String::from_utf8(single.stdout).unwrap(),
            "{prompt}"
        );
        assert_eq!(line["finish_reason"], "length");
        let usage = &line["usage"];
        assert_eq!(usage["completion_tokens"], 12);
        assert_eq!(
            usage["total_tokens"].as_u64().unwrap(),
            usage["prompt_tokens"].as_u64().unwrap() + 12
        );
    }
    // The two prompts share more than one block of prefix, and were submitted together.
    let cached: u64 = out[..2]
        .iter()
        .map(|l| l["usage"]["cached_tokens"].as_u64().unwrap())
        .sum();
    assert!(cached > 0, "no prefix shared: {out:?}");

    // The messages line went through the model's chat template.
    let chat = &out[3];
    assert!(!chat["text"].as_str().unwrap().is_empty(), "{chat}");
    assert!(
        chat["usage"]["prompt_tokens"].as_u64().unwrap() > 10,
        "{chat}"
    );
}

#[test]
fn every_kind_of_bad_line_gets_its_own_error_and_the_rest_go_on() {
    let m = support::model_path();
    let m = m.to_str().unwrap();
    let long_prompt = "word ".repeat(200);
    let input = [
        r#"{"id": 1, "prompt": "Hello"#.to_string(), // malformed JSON
        r#"["not", "an", "object"]"#.to_string(),    // not an object
        r#"{"id": 3, "prompt": "a", "messages": []}"#.to_string(), // both
        r#"{"id": 4}"#.to_string(),                  // neither
        r#"{"id": 5, "prompt": "a", "max_tokens": 0}"#.to_string(), // out of range (unknown fields are ignored, as by the server)
        r#"{"id": 6, "prompt": "a", "temperature": "hot"}"#.to_string(), // wrong type
        r#"{"id": 7, "prompt": "a", "top_p": 7}"#.to_string(),      // out of range
        serde_json::json!({"id": 8, "prompt": long_prompt}).to_string(), // too long
        r#"{"id": 9, "messages": [{"role": "user"}]}"#.to_string(), // no content
        String::new(),                                              // skipped
        r#"{"id": "ok", "prompt": "Hello", "max_tokens": 2, "temperature": 0}"#.to_string(),
    ]
    .join("\n");
    let out = lines(&edge_llm(
        &["run", "--jsonl", "-m", m, "-c", "64", "--concurrency", "2"],
        &input,
    ));
    assert_eq!(out.len(), 10, "{out:?}");
    let expect = [
        (Value::Null, "malformed JSON"),
        (Value::Null, "expected a JSON object"),
        (Value::from(3), "exactly one of"),
        (Value::from(4), "exactly one of"),
        (Value::from(5), "max_tokens"),
        (Value::from(6), "temperature"),
        (Value::from(7), "top_p"),
        (Value::from(8), "context"),
        (Value::from(9), "content"),
    ];
    for (line, (id, words)) in out.iter().zip(&expect) {
        assert_eq!(&line["id"], id, "{line}");
        let error = line["error"]
            .as_str()
            .unwrap_or_else(|| panic!("not an error: {line}"));
        assert!(error.contains(words), "{error:?} should mention {words:?}");
    }
    assert_eq!(out[9]["id"], "ok");
    assert_eq!(out[9]["usage"]["completion_tokens"], 2, "{}", out[9]);
}

/// Issue 30, item 9: a line nested deeper than serde_json's 128 levels was "malformed JSON". It
/// is valid, just too deep, and the error line says so.
#[test]
fn a_line_nested_past_128_levels_is_too_deep_not_malformed() {
    let m = support::model_path();
    let m = m.to_str().unwrap();
    let deep = format!(
        "{{\"id\": 1, \"prompt\": \"hi\", \"x\": {}{}}}",
        "[".repeat(200),
        "]".repeat(200)
    );
    let input = [
        deep,
        r#"{"id": "ok", "prompt": "Hello", "max_tokens": 1}"#.to_string(),
    ]
    .join("\n");
    let out = lines(&edge_llm(&["run", "--jsonl", "-m", m, "-c", "64"], &input));
    assert_eq!(out.len(), 2, "{out:?}");
    let error = out[0]["error"].as_str().unwrap();
    assert!(error.contains("line 1 is nested too deeply"), "{error:?}");
    assert!(!error.contains("malformed"), "{error:?}");
    assert_eq!(out[1]["id"], "ok");
}

/// `echo` and `logprobs` on a line are written as the server writes them: the same
/// `logprobs` object and echoed text, for a scored-only line (`max_tokens: 0`) and a generating
/// one, and chat lines' `top_logprobs` in the chat layout.
#[test]
fn echo_and_logprobs_are_written_as_the_server_writes_them() {
    let model = support::model_path();
    let bodies = [
        serde_json::json!({"prompt": PREFIX, "max_tokens": 0, "echo": true, "logprobs": 2}),
        serde_json::json!({"prompt": "The sky is", "max_tokens": 3, "echo": true, "logprobs": 1, "temperature": 0}),
        serde_json::json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "logprobs": true, "top_logprobs": 2, "temperature": 0}),
    ];
    let input: String = bodies.iter().map(|b| format!("{b}\n")).collect();
    let out = edge_llm(
        &[
            "run",
            "--jsonl",
            "-m",
            model.to_str().unwrap(),
            "-c",
            "1024",
        ],
        &input,
    );
    let got = lines(&out);
    assert_eq!(got.len(), bodies.len());
    let server = support::harness::Server::start(&[]).expect("the server starts");
    for (line, body) in got.iter().zip(&bodies) {
        let path = if body.get("messages").is_some() {
            "/v1/chat/completions"
        } else {
            "/v1/completions"
        };
        let (status, v) = server.post(path, body);
        assert_eq!(status, 200, "{v}");
        let choice = &v["choices"][0];
        assert_eq!(line["logprobs"], choice["logprobs"], "{body}");
        let text = choice.get("text").unwrap_or(&choice["message"]["content"]);
        assert_eq!(&line["text"], text, "{body}");
    }
    assert!(got[0]["text"].as_str().unwrap() == PREFIX);
    assert_eq!(got[0]["usage"]["completion_tokens"], 0);
}

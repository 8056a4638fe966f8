//! gpt-oss end to end through the server, on `target/synth/gpt-oss-o200k.gguf` (the real o200k
//! vocabulary and gpt-oss's real chat template; random weights, so what is tested is the
//! template, the parser and the constraint, never what the model says):
//! - the template renders every body of `tests/reference/harmony-templates.json` (system,
//!   developer, tools, a tool call with reasoning and its result, `reasoning_effort` and
//!   `chat_template_kwargs`) exactly as the newest llama-server's `/apply-template` did
//!   (`scripts/synth/harmony_reference.py`), the `Current date:` line aside;
//! - `tests/openai_harmony.py` drives the official `openai` client (and `anthropic` where
//!   installed) through a tool round trip under `tool_choice` required / named / auto, streamed
//!   equal to non-streamed, reasoning in `reasoning_content`, and the same over the Responses
//!   and Messages APIs.
//!
//! The file is made by `scripts/synth/synth.py models target/synth` (scripts/test.sh), which
//! downloads the vocabulary from the PyPI wheel quicktok-v1; missing, it fails under CI=true.

mod support;

use std::path::PathBuf;
use std::process::Command;

use serde_json::json;
use support::harness::Server;
use support::{root, skip_or_fail};

fn model() -> Option<PathBuf> {
    let dir = std::env::var_os("EDGE_LLM_SYNTH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/synth"));
    let path = dir.join("gpt-oss-o200k.gguf");
    if path.is_file() {
        return Some(path);
    }
    skip_or_fail(&format!(
        "{} not made (target/synth-venv/bin/python scripts/synth/synth.py models target/synth; \
         it downloads the o200k vocabulary from the PyPI wheel quicktok-v1)",
        path.display()
    ));
    None
}

fn server(extra: &[&str]) -> Option<Server> {
    let path = model()?;
    let path = path.to_str().expect("a UTF-8 path").to_string();
    let mut args = vec!["-m", path.as_str(), "-c", "4096"];
    args.extend_from_slice(extra);
    Server::start(&args)
}

/// The template's `Current date: YYYY-MM-DD` line with the date taken out (the reference was
/// rendered on another day).
fn without_date(prompt: &str) -> String {
    prompt
        .lines()
        .map(|l| {
            if l.starts_with("Current date: ") {
                "Current date: (today)"
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn harmony_template_renders_like_llama_server() {
    let Some(server) = server(&[]) else { return };
    let reference = support::synth::json("tests/reference/harmony-templates.json");
    let cases = reference["cases"].as_array().expect("cases");
    assert!(cases.len() >= 12);
    let mut failures = Vec::new();
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let (status, v) = server.post("/apply-template", &case["body"]);
        assert_eq!(status, 200, "{name}: {v}");
        let got = without_date(v["prompt"].as_str().expect("a prompt"));
        let want = without_date(case["prompt"].as_str().unwrap());
        if got != want {
            let at = got
                .bytes()
                .zip(want.bytes())
                .take_while(|(a, b)| a == b)
                .count();
            failures.push(format!(
                "{name}: differs at byte {at}:\n  got  {:?}\n  want {:?}",
                &got[at.saturating_sub(40)..(at + 80).min(got.len())],
                &want[at.saturating_sub(40)..(at + 80).min(want.len())],
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The date is today's, as llama-server's `strftime_now` writes it.
    let (_, v) = server.post("/apply-template", &cases[0]["body"]);
    assert!(v["prompt"].as_str().unwrap().contains("Current date: 20"));
}

#[test]
fn template_variables_are_checked() {
    let Some(server) = server(&[]) else { return };
    let hi = json!([{"role": "user", "content": "Hi"}]);
    for (body, param) in [
        (
            json!({"messages": hi, "reasoning_effort": "extreme"}),
            "reasoning_effort",
        ),
        (
            json!({"messages": hi, "reasoning_effort": 3}),
            "reasoning_effort",
        ),
        (
            json!({"messages": hi, "chat_template_kwargs": "x"}),
            "chat_template_kwargs",
        ),
        (
            json!({"messages": hi, "chat_template_kwargs": {"messages": []}}),
            "chat_template_kwargs",
        ),
    ] {
        let (status, v) = server.post("/v1/chat/completions", &body);
        assert_eq!(status, 400, "{body}: {v}");
        assert_eq!(v["error"]["param"], param, "{v}");
    }
    let (status, v) = server.post(
        "/apply-template",
        &json!({"messages": hi, "reasoning_effort": "none"}),
    );
    assert_eq!(status, 200, "{v}");
    // No effort passed: the template's default.
    assert!(v["prompt"].as_str().unwrap().contains("Reasoning: medium"));
}

/// A venv's python when it imports `modules` (scripts/test.sh makes target/structured-venv with
/// `openai` and `jsonschema`, target/messages-venv with `anthropic`); None (a skip) outside CI
/// when it is missing, a failure under CI=true.
fn python(venv: &str, modules: &str) -> Option<PathBuf> {
    let python = root().join("target").join(venv).join("bin/python");
    let ready = Command::new(&python)
        .args(["-c", &format!("import {modules}")])
        .status()
        .is_ok_and(|s| s.success());
    if ready {
        return Some(python);
    }
    skip_or_fail(&format!(
        "the harmony client checks: {modules} not installed in {} (scripts/test.sh installs it)",
        python.display()
    ));
    None
}

/// `tests/openai_harmony.py MODE URL` against a fresh server; its last line says it passed.
fn run_client(mode: &str, python: Option<PathBuf>) {
    let Some(python) = python else { return };
    let Some(server) = server(&[]) else { return };
    let out = Command::new(&python)
        .arg(root().join("tests/openai_harmony.py"))
        .arg(mode)
        .arg(format!("http://{}", server.addr))
        .output()
        .expect("running tests/openai_harmony.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success() && stdout.contains("all harmony checks passed"),
        "tests/openai_harmony.py {mode} failed:\n{stdout}\n{stderr}\nserver log (tail):\n{}",
        tail(&server.log_text(), 40)
    );
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Chat completions through the `openai` client: required, named and auto tool choices, the
/// analysis channel as `reasoning_content`, streamed equal to non-streamed, the round trip.
#[test]
fn openai_client_chat_tool_round_trip() {
    run_client("chat", python("structured-venv", "openai, jsonschema"));
}

/// The Responses API through the `openai` client: a reasoning item and a function_call item,
/// streamed equal to non-streamed, the call's output sent back and answered.
#[test]
fn openai_client_responses_tool_round_trip() {
    run_client("responses", python("structured-venv", "openai, jsonschema"));
}

/// The Messages API through the `anthropic` client: a thinking block and a tool_use block,
/// streamed equal to non-streamed, the tool_result sent back and answered.
#[test]
fn anthropic_client_messages_tool_round_trip() {
    run_client("messages", python("messages-venv", "anthropic, jsonschema"));
}

//! Issue 33: `grammar` in llama.cpp's GBNF, as front ends written for llama-server send it, read
//! into llguidance's Lark (`constraint::gbnf`). llama.cpp's own grammars (tests/grammars/gbnf/,
//! unchanged) constrain greedy output on the default model: each output matches its grammar,
//! checked here with an independent reading of what the grammar means.

mod support;

use serde_json::{json, Value};
use support::harness::*;

fn grammar(name: &str) -> String {
    let path = format!(
        "{}/tests/grammars/gbnf/{name}.gbnf",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A greedy completion of `prompt` under `name`'s grammar: its text and finish reason.
fn complete(server: &Server, name: &str, prompt: &str, max_tokens: u32) -> (String, String) {
    let (status, v) = server.post(
        "/v1/completions",
        &completion_body(
            prompt,
            json!({"grammar": grammar(name), "max_tokens": max_tokens, "temperature": 0}),
        ),
    );
    assert_eq!(status, 200, "{name}: {v}");
    let choice = &v["choices"][0];
    (
        choice["text"].as_str().unwrap().to_string(),
        choice["finish_reason"].as_str().unwrap().to_string(),
    )
}

#[test]
fn llama_cpps_own_grammars_constrain_the_output() {
    let Some(server) = Server::start(&[]) else {
        return;
    };
    // json.gbnf: an object; once the grammar is complete, the text parses.
    let (text, finish) = complete(&server, "json", "A JSON object describing a cat:", 120);
    assert!(text.starts_with('{'), "{text:?}");
    if finish == "stop" {
        let v: Value =
            serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(v.is_object());
    }
    let (text, _) = complete(&server, "json_arr", "A JSON list of fruits:", 60);
    assert!(text.starts_with('['), "{text:?}");
    // list.gbnf: lines "- " + text.
    let (text, _) = complete(&server, "list", "Three fruits:\n", 40);
    for line in text.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
        assert!(line.starts_with("- ") && line.len() > 3, "{text:?}");
    }
    assert!(text.starts_with("- "), "{text:?}");
    // chess.gbnf: starts "1. " and each whole line is a numbered pair of moves.
    let (text, _) = complete(&server, "chess", "A famous chess game:\n", 40);
    assert!(text.starts_with("1. "), "{text:?}");
    for l in text.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
        let parts: Vec<&str> = l.trim_end().split(' ').collect();
        let [number, a, b] = parts[..] else {
            panic!("{l:?} in {text:?}")
        };
        assert!(
            number.ends_with('.') && number[..number.len() - 1].parse::<u32>().is_ok(),
            "{l:?}"
        );
        assert!(is_move(a) && is_move(b), "{l:?} in {text:?}");
    }
    // arithmetic.gbnf: `expr = term` lines over identifiers, numbers and + - * /.
    let (text, _) = complete(&server, "arithmetic", "Some sums:\n", 40);
    for l in text.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
        assert!(l.contains('='), "{l:?}");
        assert!(
            l.chars()
                .all(|c| c.is_ascii_alphanumeric() || " \t_=+-*/()\n".contains(c)),
            "{l:?}"
        );
    }
    // c.gbnf: compiles and constrains (its grammar is large).
    let (text, _) = complete(&server, "c", "int main() {", 30);
    assert!(!text.is_empty());
    // A GBNF grammar that does not read is a 400 naming the field and the line.
    let (status, v) = server.post(
        "/v1/completions",
        &completion_body(
            "x",
            json!({"grammar": "root ::= item\nitem ::= \"a", "max_tokens": 2}),
        ),
    );
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "grammar");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("GBNF"),
        "{v}"
    );
}

/// A move as chess.gbnf writes it: a pawn or piece move ending on a square (a promotion
/// after it), or castling; then `+` or `#` optionally.
fn is_move(m: &str) -> bool {
    let m = m.trim_end_matches(['+', '#']);
    if m == "O-O" || m == "O-O-O" {
        return true;
    }
    let m = match m.find('=') {
        Some(i) => {
            let promoted = &m[i + 1..];
            if promoted.len() != 1 || !"NBKQR".contains(promoted) {
                return false;
            }
            &m[..i]
        }
        None => m,
    };
    let b = m.as_bytes();
    b.len() >= 2
        && (b'a'..=b'h').contains(&b[b.len() - 2])
        && (b'1'..=b'8').contains(&b[b.len() - 1])
        && m.chars().all(|c| "NBKQRabcdefgh12345678x".contains(c))
}

/// llama-server's top-level `json_schema` constrains the output as `response_format`'s schema
/// does (the same text, a JSON value of the schema's shape); with another constraint it is a
/// 400 naming both fields.
#[test]
fn llama_server_json_schema_field_constrains_the_output() {
    let Some(server) = Server::start(&[]) else {
        return;
    };
    let schema = json!({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"]});
    let prompt = "A person described in JSON:";
    let (status, a) = server.post(
        "/v1/completions",
        &completion_body(
            prompt,
            json!({"json_schema": schema, "max_tokens": 40, "temperature": 0}),
        ),
    );
    assert_eq!(status, 200, "{a}");
    let rf = json!({"type": "json_schema", "json_schema": {"name": "p", "schema": schema}});
    let (status, b) = server.post(
        "/v1/completions",
        &completion_body(
            prompt,
            json!({"response_format": rf, "max_tokens": 40, "temperature": 0}),
        ),
    );
    assert_eq!(status, 200, "{b}");
    let text = a["choices"][0]["text"].as_str().unwrap();
    assert_eq!(text, b["choices"][0]["text"].as_str().unwrap());
    if a["choices"][0]["finish_reason"] == "stop" {
        let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(v["name"].is_string() && v["age"].is_i64(), "{v}");
    } else {
        assert!(text.trim_start().starts_with('{'), "{text:?}");
    }
    let (status, e) = server.post(
        "/v1/completions",
        &completion_body(prompt, json!({"json_schema": schema, "regex": "a+"})),
    );
    assert_eq!(status, 400, "{e}");
    let (status, e) = server.post(
        "/v1/completions",
        &completion_body(prompt, json!({"json_schema": 3})),
    );
    assert_eq!(status, 400, "{e}");
    assert_eq!(e["error"]["param"], "json_schema", "{e}");
}

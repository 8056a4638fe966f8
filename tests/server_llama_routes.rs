//! Issue 33's discovery routes, in llama-server's shapes, on the real default model:
//! `GET /props` (what agents and front ends read: the context length, the model, its chat
//! template and special tokens), `POST /apply-template` (the prompt text a chat body renders to:
//! the same tokens `/v1/chat/completions/render` says the request runs) and `GET /slots` (the
//! live sequences, counts only; a key that is not an admin key sees only its own); and
//! `logit_bias`, refused before, in OpenAI's and llama.cpp's forms.

mod support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::harness::*;

const A: (&str, &str) = ("Authorization", "Bearer key-a");
const B: (&str, &str) = ("Authorization", "Bearer key-b");
const ADMIN: (&str, &str) = ("Authorization", "Bearer admin");

/// `method path` with `key`, answered 200: its JSON.
fn send(server: &Server, method: &str, path: &str, key: (&str, &str), body: &Value) -> Value {
    let (status, v) = server.send(method, path, key, body);
    assert_eq!(status, 200, "{method} {path}: {v}");
    v
}

#[test]
fn props_apply_template_and_slots_answer_in_llama_servers_shapes() {
    let Some(server) = Server::start(&[
        "-c",
        "768",
        "--api-key",
        "key-a",
        "--api-key",
        "key-b",
        "--admin-api-key",
        "admin",
    ]) else {
        return;
    };
    // /props: the fields clients read.
    let props = send(&server, "GET", "/props", A, &Value::Null);
    assert_eq!(
        props["default_generation_settings"]["n_ctx"], 768,
        "{props}"
    );
    assert_eq!(props["model_alias"], "SmolLM2-135M-Instruct.Q4_1");
    assert_eq!(props["eos_token"], "<|im_end|>", "{props}");
    assert!(props["chat_template"]
        .as_str()
        .unwrap()
        .contains("<|im_start|>"));
    assert_eq!(props["modalities"]["vision"], false);
    assert!(props["build_info"]
        .as_str()
        .unwrap()
        .starts_with("edge-llm "));

    // /apply-template: the text whose tokens are the ones the chat request runs.
    let chat = json!({"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a color."}
    ]});
    let text = send(&server, "POST", "/apply-template", A, &chat)["prompt"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        text.starts_with("<|im_start|>system\nBe brief.<|im_end|>")
            && text.ends_with("<|im_start|>assistant\n"),
        "{text:?}"
    );
    let rendered = send(&server, "POST", "/v1/chat/completions/render", A, &chat);
    let tokens = send(&server, "POST", "/tokenize", A, &json!({"content": text}));
    assert_eq!(tokens["tokens"], rendered["token_ids"]);

    // /slots: key A's running request, seen by A and the admin, not by B.
    assert_eq!(
        send(&server, "GET", "/slots", ADMIN, &Value::Null),
        json!([])
    );
    std::thread::scope(|s| {
        let stream = s.spawn(|| {
            let body = completion_body(
                "Once upon a time",
                json!({"stream": true, "max_tokens": 300, "ignore_eos": true}),
            );
            let r = server.request(
                "POST",
                "/v1/completions",
                &[("Content-Type", "application/json"), A],
                body.to_string().as_bytes(),
            );
            assert_eq!(r.status, 200, "{}", r.text());
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let seen = loop {
            let slots = send(&server, "GET", "/slots", A, &Value::Null);
            if let Some(slot) = slots.as_array().unwrap().first() {
                break slot.clone();
            }
            assert!(
                Instant::now() < deadline,
                "key A's request never showed in /slots"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(seen["n_ctx"], 768, "{seen}");
        assert!(seen["n_prompt_tokens"].as_u64().unwrap() > 0, "{seen}");
        assert!(seen.get("prompt").is_none(), "never the text: {seen}");
        let n_remain = seen["next_token"][0]["n_remain"].as_u64().unwrap();
        let n_decoded = seen["next_token"][0]["n_decoded"].as_u64().unwrap();
        assert_eq!(n_remain + n_decoded, 300, "{seen}");
        assert_eq!(send(&server, "GET", "/slots", B, &Value::Null), json!([]));
        let all = send(&server, "GET", "/slots", ADMIN, &Value::Null);
        assert_eq!(all.as_array().unwrap().len(), 1, "{all}");
        stream.join().unwrap();
    });
    server.wait_for_metrics("the finished request to leave /slots", |s| {
        s.request("GET", "/slots", &[ADMIN], b"").text() == "[]"
    });
}

/// The first token of a greedy completion of `prompt` with `extra` fields, and its text.
fn first_token(server: &Server, extra: Value) -> (u64, String) {
    let mut body = completion_body(
        "The capital of France is",
        json!({"max_tokens": 1, "temperature": 0, "logprobs": 1}),
    );
    merge(&mut body, extra);
    let (status, v) = server.post("/v1/completions", &body);
    assert_eq!(status, 200, "{v}");
    let text = v["choices"][0]["text"].as_str().unwrap().to_string();
    let (status, ids) = server.post(
        "/tokenize",
        &json!({"content": text, "parse_special": false}),
    );
    assert_eq!(status, 200);
    assert_eq!(ids["tokens"].as_array().unwrap().len(), 1, "{text:?}");
    (ids["tokens"][0].as_u64().unwrap(), text)
}

#[test]
fn logit_bias_bans_and_forces_tokens_in_both_forms() {
    let Some(server) = Server::start(&[]) else {
        return;
    };
    let (best, text) = first_token(&server, json!({}));
    // OpenAI's form: a ban moves greedy off its choice.
    let (banned, _) = first_token(&server, json!({"logit_bias": {best.to_string(): -100}}));
    assert_ne!(banned, best);
    // A large bias forces a token (42, never the greedy choice here).
    let (forced, _) = first_token(&server, json!({"logit_bias": {"42": 100}}));
    assert_eq!(forced, 42);
    // llama.cpp's form: [text, false] bans every token of the text; [id, bias] as above.
    let (by_text, _) = first_token(&server, json!({"logit_bias": [[text, false]]}));
    assert_eq!(by_text, banned, "the same ban, by text");
    let (by_pair, _) = first_token(&server, json!({"logit_bias": [[42, 100]]}));
    assert_eq!(by_pair, 42);
    // Chat completions take it too.
    let (status, v) = server.post(
        "/v1/chat/completions",
        &chat_body("Hi", json!({"max_tokens": 1, "logit_bias": {"42": 100}})),
    );
    assert_eq!(status, 200, "{v}");
    let (_, piece) = server.post("/detokenize", &json!({"tokens": [42]}));
    assert_eq!(v["choices"][0]["message"]["content"], piece["content"]);
    // Bad ones are refused naming the field.
    for bad in [
        json!({"9999999": 1}),
        json!({"x": 1}),
        json!({"42": "high"}),
        json!([[42]]),
        json!("all"),
    ] {
        let mut body = completion_body("Hi", json!({"max_tokens": 1}));
        merge(&mut body, json!({ "logit_bias": bad }));
        let (status, v) = server.post("/v1/completions", &body);
        assert_eq!(status, 400, "{bad}: {v}");
        assert_eq!(v["error"]["param"], "logit_bias", "{v}");
    }
}

/// Issue 32's remote-tokenizer routes as lm-evaluation-harness calls them (vLLM's shapes):
/// `GET /tokenizer_info`, `/tokenize` with `prompt` and `add_special_tokens`, and `/detokenize`
/// answering `prompt` beside llama-server's `content`.
#[test]
fn remote_tokenizer_routes_answer_in_vllms_shapes() {
    let Some(server) = Server::start(&[]) else {
        return;
    };
    let (status, info) = server.send("GET", "/tokenizer_info", ("X-None", ""), &Value::Null);
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["eos_token"], "<|im_end|>", "{info}");
    assert!(info["chat_template"]
        .as_str()
        .unwrap()
        .contains("<|im_start|>"));
    assert_eq!(info["model_max_length"], 1024);
    let (status, t) = server.post(
        "/tokenize",
        &json!({"prompt": "Hello, world!", "add_special_tokens": false}),
    );
    assert_eq!(status, 200, "{t}");
    assert_eq!(t["tokens"], json!([19556, 28, 905, 17]));
    let (status, d) = server.post("/detokenize", &json!({"tokens": [19556, 28, 905, 17]}));
    assert_eq!(status, 200, "{d}");
    assert_eq!(
        (&d["prompt"], &d["content"]),
        (&json!("Hello, world!"), &json!("Hello, world!"))
    );
}

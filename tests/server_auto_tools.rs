//! `tool_choice: "auto"` with the calls small models actually write (issue 26): Qwen2.5 Coder
//! 0.5B writes a bare `{"name": ..., "arguments": ...}` and the 1.5B a ```` ```json ```` fence
//! with the JSON over lines, not the `<tool_call>` their template teaches. Both come back as
//! `tool_calls` (with `finish_reason: "tool_calls"`), their arguments valid for the schema (the
//! lazy grammar started at the call's `{`: the `unit` enum holds values the models never pick
//! by themselves), and the streamed deltas join to exactly the same calls at temperature 0, on
//! chat completions, the Responses API and the Messages API.

mod support;

use std::path::PathBuf;

use serde_json::{json, Value};
use support::harness::*;
use support::{fetched, qwen_1_5b_path, qwen_path, FETCH_EXTRA_MODELS, FETCH_SPEC_MODELS};

const PROMPTS: [&str; 3] = [
    "What is the weather in Paris?",
    "Use the tool to get the weather in Tokyo and Berlin.",
    "Tell me the weather in London in celsius.",
];

fn tools() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["kelvin", "rankine"]}},
            "required": ["city", "unit"]}}}])
}

/// The calls of a whole response: (name, arguments parsed) each.
fn calls_of(message: &Value) -> Vec<(String, Value)> {
    message["tool_calls"]
        .as_array()
        .map(|calls| {
            calls
                .iter()
                .map(|c| {
                    let args = c["function"]["arguments"].as_str().expect("arguments text");
                    let args: Value = serde_json::from_str(args)
                        .unwrap_or_else(|e| panic!("arguments are not JSON ({e}): {args}"));
                    (c["function"]["name"].as_str().unwrap().to_string(), args)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The calls a stream's deltas join to, and its finish reason.
fn streamed_calls(events: &[Value]) -> (Vec<(String, Value)>, String) {
    let mut names: Vec<String> = Vec::new();
    let mut args: Vec<String> = Vec::new();
    let mut finish = String::new();
    for e in events {
        let choice = &e["choices"][0];
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_string();
        }
        for d in choice["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let k = d["index"].as_u64().unwrap() as usize;
            if k == names.len() {
                names.push(d["function"]["name"].as_str().unwrap().to_string());
                args.push(String::new());
            }
            args[k].push_str(d["function"]["arguments"].as_str().unwrap_or(""));
        }
    }
    let calls = names
        .into_iter()
        .zip(args)
        .map(|(n, a)| {
            let v = serde_json::from_str(&a)
                .unwrap_or_else(|e| panic!("streamed arguments are not JSON ({e}): {a}"));
            (n, v)
        })
        .collect();
    (calls, finish)
}

fn check_model(path: Option<PathBuf>) {
    let Some(path) = path else { return };
    let server = Server::start(&["-m", path.to_str().unwrap(), "-c", "2048"]).expect("server");
    for prompt in PROMPTS {
        let body = chat_body(
            prompt,
            json!({"tools": tools(), "tool_choice": "auto", "temperature": 0, "max_tokens": 100}),
        );
        let (status, v) = server.post("/v1/chat/completions", &body);
        assert_eq!(status, 200, "{v}");
        let choice = &v["choices"][0];
        let calls = calls_of(&choice["message"]);
        assert!(!calls.is_empty(), "{prompt}: no tool_calls: {v}");
        assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
        for (name, args) in &calls {
            assert_eq!(name, "get_weather");
            assert!(args["city"].is_string(), "{args}");
            assert!(
                args["unit"] == "kelvin" || args["unit"] == "rankine",
                "the arguments did not follow the schema: {args}"
            );
            assert_eq!(args.as_object().unwrap().len(), 2, "{args}");
        }
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let (events, done) = server.post_stream("/v1/chat/completions", &streamed);
        assert!(done);
        let (stream_calls, finish) = streamed_calls(&events);
        assert_eq!(stream_calls, calls, "{prompt}: streamed calls differ");
        assert_eq!(finish, "tool_calls");
        // The Responses API: the same calls as `function_call` items, whole and streamed.
        let body = json!({"input": prompt, "tools": [flat_tool()], "tool_choice": "auto",
                          "temperature": 0, "max_output_tokens": 100});
        let (status, v) = server.post("/v1/responses", &body);
        assert_eq!(status, 200, "{v}");
        let items: Vec<Value> = v["output"].as_array().unwrap().clone();
        assert_eq!(function_calls(&items), calls, "{prompt}: responses: {v}");
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let done: Vec<Value> = server
            .post_events("/v1/responses", &streamed)
            .into_iter()
            .filter(|(name, _)| name == "response.output_item.done")
            .map(|(_, v)| v["item"].clone())
            .collect();
        assert_eq!(function_calls(&done), calls, "{prompt}: streamed responses");
        // The Messages API: `tool_use` blocks, whole and streamed.
        let f = &tools()[0]["function"];
        let body = json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": 100,
            "temperature": 0, "tool_choice": {"type": "auto"},
            "tools": [{"name": f["name"], "description": f["description"], "input_schema": f["parameters"]}]});
        let (status, v) = server.post("/v1/messages", &body);
        assert_eq!(status, 200, "{v}");
        assert_eq!(tool_uses(&v["content"]), calls, "{prompt}: messages: {v}");
        assert_eq!(v["stop_reason"], "tool_use", "{v}");
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let events = server.post_events("/v1/messages", &streamed);
        assert_eq!(
            streamed_tool_uses(&events),
            calls,
            "{prompt}: streamed messages"
        );
    }
}

/// The (name, input) of the `tool_use` blocks of a message's `content`.
fn tool_uses(content: &Value) -> Vec<(String, Value)> {
    content
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .map(|b| (b["name"].as_str().unwrap().to_string(), b["input"].clone()))
        .collect()
}

/// The (name, input) of a streamed message's `tool_use` blocks: each block's
/// `input_json_delta` pieces joined.
fn streamed_tool_uses(events: &[(String, Value)]) -> Vec<(String, Value)> {
    let mut blocks: Vec<(usize, String, String)> = Vec::new();
    for (name, v) in events {
        match name.as_str() {
            "content_block_start" if v["content_block"]["type"] == "tool_use" => blocks.push((
                v["index"].as_u64().unwrap() as usize,
                v["content_block"]["name"].as_str().unwrap().to_string(),
                String::new(),
            )),
            "content_block_delta" if v["delta"]["type"] == "input_json_delta" => {
                let index = v["index"].as_u64().unwrap() as usize;
                let block = blocks
                    .iter_mut()
                    .find(|b| b.0 == index)
                    .expect("a started block");
                block
                    .2
                    .push_str(v["delta"]["partial_json"].as_str().unwrap());
            }
            _ => {}
        }
    }
    blocks
        .into_iter()
        .map(|(_, name, json)| (name, serde_json::from_str(&json).unwrap()))
        .collect()
}

/// `tools()`'s function in the Responses API's flat layout.
fn flat_tool() -> Value {
    let mut f = tools()[0]["function"].clone();
    f["type"] = json!("function");
    f
}

/// The (name, arguments) of the `function_call` items among `items`.
fn function_calls(items: &[Value]) -> Vec<(String, Value)> {
    items
        .iter()
        .filter(|i| i["type"] == "function_call")
        .map(|i| {
            let args = i["arguments"].as_str().unwrap();
            (
                i["name"].as_str().unwrap().to_string(),
                serde_json::from_str(args).unwrap(),
            )
        })
        .collect()
}

#[test]
fn qwen_0_5b_bare_json_calls_come_back_as_tool_calls() {
    check_model(fetched(qwen_path(), FETCH_EXTRA_MODELS));
}

#[test]
fn qwen_1_5b_fenced_calls_come_back_as_tool_calls() {
    check_model(fetched(qwen_1_5b_path(), FETCH_SPEC_MODELS));
}

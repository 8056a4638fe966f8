//! The server's side of tool calls: the calls found in a reply, whole (`message.tool_calls`) or
//! streamed (`delta.tool_calls`). (A request's constraint and its prompt rendered with `tools`
//! are read in `crate::api::plan`, the same way for every face.) Called by `routes` and
//! `stream`.

use serde_json::{json, Value};

use crate::api::tool_parser::{parse_all, ToolEvent};
use crate::engine::FinishReason;

/// The id of call `k` of choice `index` in response `reply_id`.
pub fn call_id(reply_id: &str, index: usize, k: usize) -> String {
    let base = reply_id.rsplit('-').next().unwrap_or(reply_id);
    format!("call_{base}_{index}_{k}")
}

/// A whole chat choice's `message` and `finish_reason` with its tool calls parsed out.
pub fn apply_to_choice(choice: &mut Value, reply_id: &str, index: usize) {
    let text = choice["message"]["content"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let (content, calls) = parse_all(&text);
    if calls.is_empty() {
        return;
    }
    let calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(k, c)| {
            json!({"id": call_id(reply_id, index, k), "type": "function",
                   "function": {"name": c.name, "arguments": c.arguments}})
        })
        .collect();
    choice["message"]["content"] = if content.is_empty() {
        Value::Null
    } else {
        json!(content)
    };
    choice["message"]["tool_calls"] = Value::Array(calls);
    if choice["finish_reason"] == json!("stop") {
        choice["finish_reason"] = json!("tool_calls");
    }
}

/// The `delta`s of one streamed choice for parser events, as OpenAI streams them: content as
/// text; a call's index, id, type and name once, with empty arguments; then argument pieces.
pub fn deltas(events: Vec<ToolEvent>, reply_id: &str, index: usize) -> Vec<Value> {
    events
        .into_iter()
        .map(|e| match e {
            ToolEvent::Content(text) => json!({"content": text}),
            ToolEvent::CallStart { index: k, name } => json!({"tool_calls": [{
                "index": k, "id": call_id(reply_id, index, k), "type": "function",
                "function": {"name": name, "arguments": ""}}]}),
            ToolEvent::Arguments { index: k, text } => {
                json!({"tool_calls": [{"index": k, "function": {"arguments": text}}]})
            }
        })
        .collect()
}

/// `finish_reason` of a streamed choice that made calls.
pub fn finish_reason(reason: FinishReason, made_calls: bool) -> Value {
    if made_calls && reason == FinishReason::Stop {
        json!("tool_calls")
    } else {
        json!(reason.as_str())
    }
}

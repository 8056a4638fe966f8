//! The server's side of tool calls and reasoning: a whole choice's `message` taken apart
//! (`message.reasoning_content`, `message.tool_calls`, by `crate::api::reply`) and the deltas of
//! streamed calls (`delta.tool_calls`). (A request's constraint and its prompt rendered with
//! `tools` are read in `crate::api::plan`, the same way for every face.) Called by `routes` and
//! `stream`.

use serde_json::{json, Value};

use crate::api::reply::{self, call_id, ReplyParsing};
use crate::api::reply_stream::ReplyPiece;
use crate::engine::FinishReason;

/// A whole chat choice's `message` and `finish_reason` with its reasoning and tool calls
/// parsed out as `parsing` says.
pub fn apply_to_choice(choice: &mut Value, reply_id: &str, index: usize, parsing: &ReplyParsing) {
    let text = choice["message"]["content"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let reply = reply::assistant_reply(&text, reply_id, index, parsing);
    if let Some(thoughts) = reply.reasoning {
        choice["message"]["reasoning_content"] = json!(thoughts);
    }
    if reply.tool_calls.is_empty() {
        choice["message"]["content"] = json!(reply.content);
        return;
    }
    choice["message"]["content"] = if reply.content.is_empty() {
        Value::Null
    } else {
        json!(reply.content)
    };
    choice["message"]["tool_calls"] = Value::Array(reply.tool_calls);
    if choice["finish_reason"] == json!("stop") {
        choice["finish_reason"] = json!("tool_calls");
    }
}

/// The `delta`s of one streamed choice for the pieces of its reply, as OpenAI streams them:
/// thoughts as `reasoning_content`, content as text; a call's index, id, type and name once,
/// with empty arguments; then argument pieces.
pub fn deltas(pieces: Vec<ReplyPiece>, reply_id: &str, index: usize) -> Vec<Value> {
    pieces
        .into_iter()
        .map(|e| match e {
            ReplyPiece::Reasoning(text) => json!({"reasoning_content": text}),
            ReplyPiece::Content(text) => json!({"content": text}),
            ReplyPiece::CallStart { index: k, name } => json!({"tool_calls": [{
                "index": k, "id": call_id(reply_id, index, k), "type": "function",
                "function": {"name": name, "arguments": ""}}]}),
            ReplyPiece::Arguments { index: k, text } => {
                json!({"tool_calls": [{"index": k, "function": {"arguments": text}}]})
            }
        })
        .collect()
}

/// `finish_reason` of a streamed choice that made calls.
pub fn finish_reason(reason: FinishReason, made_calls: bool) -> Value {
    json!(reply::finish_reason(reason, made_calls))
}

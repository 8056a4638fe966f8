//! A finished assistant reply taken apart, the same way for every face: its `<think>` thoughts
//! (`reasoning`), its text, and its tool calls (`tool_parser`) in the shape of OpenAI's
//! `message.tool_calls`. [`ReplyParsing`] (decided by `plan` from the body and the template) says
//! what to look for. Called by the server's whole responses and by `run --jsonl`; the server's
//! streamed deltas use `reasoning::ReasoningSplitter` and `tool_parser::ToolCallParser` piece by
//! piece and name calls with [`call_id`] too.

use serde_json::{json, Value};

use super::harmony::HarmonyParser;
use super::reasoning;
use super::reply_stream::ReplyPiece;
use super::tool_parser::{parse_all, ToolCall};
use crate::engine::FinishReason;

/// What to take apart in a chat reply: tool calls, `<think>` reasoning (Some(whether the
/// prompt opened the block)), or gpt-oss's harmony messages (reasoning, answer and calls at
/// once: `super::harmony`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplyParsing {
    pub tool_calls: bool,
    /// The functions offered: their calls are also recognised written without markup.
    pub tool_names: Vec<String>,
    pub reasoning: Option<bool>,
    /// The reply is harmony (the template speaks it): this replaces the two above.
    pub harmony: bool,
}

impl ReplyParsing {
    /// Whether anything is taken apart at all.
    pub fn any(&self) -> bool {
        self.tool_calls || self.reasoning.is_some() || self.harmony
    }
}

/// The id of call `k` of choice `index` in response `reply_id`.
pub fn call_id(reply_id: &str, index: usize, k: usize) -> String {
    let base = reply_id.rsplit('-').next().unwrap_or(reply_id);
    format!("call_{base}_{index}_{k}")
}

/// A whole assistant reply taken apart: its thoughts, its text and its tool calls (as
/// `message.tool_calls` holds them).
pub struct AssistantReply {
    pub reasoning: Option<String>,
    pub content: String,
    pub tool_calls: Vec<Value>,
}

/// Splits `text` (reply `reply_id`, choice `index`) as `parsing` says: reasoning first, then
/// tool calls in the rest.
pub fn assistant_reply(
    text: &str,
    reply_id: &str,
    index: usize,
    parsing: &ReplyParsing,
) -> AssistantReply {
    let (thoughts, content, calls) = if parsing.harmony {
        harmony_all(text)
    } else {
        let (thoughts, rest) = match parsing.reasoning {
            Some(forced_open) => reasoning::split_all(text, forced_open),
            None => (None, text.to_string()),
        };
        let (content, calls) = if parsing.tool_calls {
            parse_all(&rest, &parsing.tool_names)
        } else {
            (rest, Vec::new())
        };
        (thoughts, content, calls)
    };
    let calls = calls
        .iter()
        .enumerate()
        .map(|(k, c)| {
            json!({"id": call_id(reply_id, index, k), "type": "function",
                   "function": {"name": c.name, "arguments": c.arguments}})
        })
        .collect();
    AssistantReply {
        reasoning: thoughts,
        content,
        tool_calls: calls,
    }
}

/// A whole harmony reply through the streaming parser: its `analysis` text, its answer, its
/// calls.
fn harmony_all(text: &str) -> (Option<String>, String, Vec<ToolCall>) {
    let mut p = HarmonyParser::new();
    let mut pieces = p.push(text);
    pieces.extend(p.finish());
    let (mut thoughts, mut content) = (String::new(), String::new());
    for piece in pieces {
        match piece {
            ReplyPiece::Reasoning(t) => thoughts.push_str(&t),
            ReplyPiece::Content(t) => content.push_str(&t),
            ReplyPiece::CallStart { .. } | ReplyPiece::Arguments { .. } => {}
        }
    }
    ((!thoughts.is_empty()).then_some(thoughts), content, p.calls)
}

/// The `finish_reason` of a reply: `tool_calls` when it stopped by itself after making calls.
pub fn finish_reason(reason: FinishReason, made_calls: bool) -> &'static str {
    if made_calls && reason == FinishReason::Stop {
        "tool_calls"
    } else {
        reason.as_str()
    }
}

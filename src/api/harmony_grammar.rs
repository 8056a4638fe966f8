//! The grammar of a harmony reply (gpt-oss) when a chat request offers tools: what the model
//! writes after the prompt's `<|start|>assistant`, as llguidance Lark.
//!
//! - Reasoning first, at most once: `<|channel|>analysis<|message|>TEXT<|end|><|start|>assistant`
//!   (TEXT at most [`MAX_ANALYSIS_TOKENS`] tokens, so a model that would think forever still
//!   reaches its answer).
//! - Then, for `tool_choice` `required` or a named function, a call and nothing else:
//!   `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{ARGS}<|call|>` with
//!   ARGS valid under that function's schema; for `auto`, that call or a final answer
//!   (`<|channel|>final<|message|>TEXT`, ended by an end-of-generation token).
//!
//! The markers are token ids (`<[id]>`): gpt-oss's vocabulary has each as one token, and
//! llama.cpp renders `<|channel|>`, `<|message|>`, `<|start|>`, `<|constrain|>` as text, so free
//! text is kept from holding `<|` (it could otherwise spell a marker that the parser would take
//! for structure). One call per reply: `<|call|>` ends the turn. Called by `super::tools::grammar`
//! for templates that speak harmony; `super::harmony` parses what this lets through.

use serde_json::Value;

use super::tools::{Tool, ToolChoice, ToolRequest};
use crate::constraint::ConstraintSpec;
use crate::tokenizer::Tokenizer;

/// Most tokens of the reasoning message before a call or an answer.
pub const MAX_ANALYSIS_TOKENS: usize = 256;

/// Text with no `<|` in it (so no harmony marker spelled out).
const TEXT_RX: &str = r"/(?s:([^<]|<+[^<|])*<*)/";

/// The reply's grammar, or None when the vocabulary lacks a harmony marker (the call is then
/// only parsed) or `tool_choice` is `none`.
pub fn grammar(req: &ToolRequest, tok: &Tokenizer) -> Option<ConstraintSpec> {
    let offered: Vec<&Tool> = match &req.choice {
        ToolChoice::None => return None,
        ToolChoice::Named(n) => req.tools.iter().filter(|t| &t.name == n).collect(),
        ToolChoice::Auto | ToolChoice::Required => req.tools.iter().collect(),
    };
    let id = |text: &str| tok.find_token(text).map(|id| format!("<[{id}]>"));
    let channel = id("<|channel|>")?;
    let message = id("<|message|>")?;
    let end = id("<|end|>")?;
    let start = id("<|start|>")?;
    let constrain = id("<|constrain|>")?;
    let call_end = id("<|call|>")?;
    let mut src = format!(
        "start: (analysis {start} \"assistant\")? reply\n\
         analysis: {channel} \"analysis\" {message} thoughts {end}\n\
         thoughts[max_tokens={MAX_ANALYSIS_TOKENS}]: {TEXT_RX}\n"
    );
    let calls: Vec<String> = (0..offered.len()).map(|i| format!("call{i}")).collect();
    if req.choice == ToolChoice::Auto {
        src.push_str(&format!(
            "reply: {} | final\nfinal: {channel} \"final\" {message} answer\nanswer: {TEXT_RX}\n",
            calls.join(" | ")
        ));
    } else {
        src.push_str(&format!("reply: {}\n", calls.join(" | ")));
    }
    for (i, t) in offered.iter().enumerate() {
        let header = lark_string(&format!("commentary to=functions.{} ", t.name));
        src.push_str(&format!(
            "call{i}: {channel} {header} {constrain} \"json\" {message} args{i} {call_end}\n\
             args{i}: %json {}\n",
            compact(t.parameters.clone())
        ));
    }
    Some(ConstraintSpec::Lark(src))
}

/// The schema with the compact separators gpt-oss's template writes arguments with.
fn compact(mut schema: Value) -> Value {
    if let Some(o) = schema.as_object_mut() {
        o.insert(
            "x-guidance".into(),
            serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    schema
}

fn lark_string(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

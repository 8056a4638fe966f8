//! The server's side of structured output and tool calls: a request's constraint
//! (`response_format`, `regex`, `grammar`, or the grammar of its `tools`) compiled before
//! anything is queued; the chat prompt rendered with `tools` and the messages as sent (assistant
//! `tool_calls`, `tool` results); and the tool calls found in a reply, whole (`message.tool_calls`)
//! or streamed (`delta.tool_calls`). Called by `routes` and `stream`.

use serde_json::{json, Map, Value};

use super::error::ApiError;
use crate::api::tool_parser::{parse_all, ToolEvent};
use crate::api::tools::{self, ToolChoice, ToolFormat};
use crate::api::{reasoning, structured, FieldError};
use crate::chat_template::{ChatMessage, ChatTemplate};
use crate::constraint::{Constraint, ConstraintSpec};
use crate::engine::{EngineHandle, FinishReason};

impl From<FieldError> for ApiError {
    fn from(e: FieldError) -> Self {
        ApiError::invalid(&e.param, e.message)
    }
}

/// The constraint of a `/v1/completions` body.
pub fn completion_constraint(
    engine: &EngineHandle,
    body: &Map<String, Value>,
) -> Result<Option<Constraint>, ApiError> {
    if body
        .get("tools")
        .is_some_and(|t| t.as_array().is_none_or(|a| !a.is_empty()))
    {
        return Err(ApiError::invalid(
            "tools",
            "`tools` is for /v1/chat/completions; /v1/completions takes `response_format`, `regex` or `grammar`",
        ));
    }
    Ok(structured::constraint(&engine.grammars, body)?)
}

/// What to take apart in a chat reply: tool calls, `<think>` reasoning (Some(whether the
/// prompt opened the block)).
#[derive(Clone, Copy, Debug, Default)]
pub struct ReplyParsing {
    pub tool_calls: bool,
    pub reasoning: Option<bool>,
}

/// What a chat body needs beyond the plain fields.
pub struct ChatPlan {
    pub prompt: String,
    pub constraint: Option<Constraint>,
    /// What to take apart in the reply.
    pub parsing: ReplyParsing,
}

/// Renders the chat prompt and compiles its constraint. Where the template thinks, the
/// constraint applies only after the reply's `</think>` (`api::reasoning`).
pub fn chat_plan(
    engine: &EngineHandle,
    template: &ChatTemplate,
    body: &Map<String, Value>,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
) -> Result<ChatPlan, ApiError> {
    let tool_req = tools::parse(body)?;
    let spec = structured::spec(body)?;
    let split = reasoning::split_requested(body)?;
    // The constraint to compile: its spec, the field it came from, its lazy trigger.
    let mut wanted: Option<(ConstraintSpec, &str, Option<u32>)> = None;
    let mut tool_calls = false;
    if let Some(t) = &tool_req {
        let format = ToolFormat::of_template(template.source()).ok_or_else(|| {
            ApiError::invalid(
                "tools",
                "this model's chat template teaches no tool-call format (Hermes `<tool_call>`); \
                 `tools` cannot be used with it",
            )
        })?;
        if t.choice != ToolChoice::None {
            tool_calls = true;
            if let Some((_, param)) = &spec {
                return Err(ApiError::invalid(
                    param,
                    format!(
                        "`{param}` cannot be combined with `tools` unless `tool_choice` is `none`"
                    ),
                ));
            }
            if let Some((spec, trigger)) = tools::grammar(t, format, &engine.model.tokenizer) {
                wanted = Some((spec, "tools", trigger));
            }
        }
    }
    if wanted.is_none() {
        if let Some((spec, param)) = spec {
            wanted = Some((spec, param, None));
        }
    }
    let raw = body.get("messages").and_then(Value::as_array);
    let has_tool_turns = raw.is_some_and(|items| {
        items.iter().any(|m| {
            m.get("tool_calls").is_some_and(|c| !c.is_null())
                || m.get("role") == Some(&json!("tool"))
        })
    });
    let prompt = if tool_req.is_some() || has_tool_turns {
        let json_messages = messages_json(messages, raw.map(Vec::as_slice).unwrap_or(&[]))?;
        // As vLLM does, `tool_choice: none` leaves the tools out of the prompt: the model
        // answers in text instead of being taught to call.
        let offered = tool_req
            .as_ref()
            .filter(|t| t.choice != ToolChoice::None)
            .map(|t| &t.raw);
        template.render_json(&json_messages, offered, add_generation_prompt)
    } else {
        template.render(messages, add_generation_prompt)
    }
    .map_err(|e| ApiError::invalid("messages", format!("{e:#}")))?;
    let thinks = reasoning::template_thinks(template.source());
    let forced_open = thinks && reasoning::prompt_opens_thinking(&prompt);
    let constraint = match wanted {
        None => None,
        Some((spec, param, trigger)) => {
            // A lazy (triggered) grammar leaves the thoughts free already.
            let spec = if thinks && trigger.is_none() {
                reasoning::constraint_after_thinking(spec, forced_open, &engine.model.tokenizer)
            } else {
                spec
            };
            Some(structured::compile(
                &engine.grammars,
                &spec,
                param,
                trigger,
            )?)
        }
    };
    Ok(ChatPlan {
        prompt,
        constraint,
        parsing: ReplyParsing {
            tool_calls,
            reasoning: (thinks && split).then_some(forced_open),
        },
    })
}

/// The messages for a template that knows tools: role and text content as checked by
/// `params::messages`, plus `tool_calls` (arguments as objects, as Hugging Face templates expect
/// them), `tool_call_id` and `name` as sent.
fn messages_json(messages: &[ChatMessage], raw: &[Value]) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let mut v = json!({"role": m.role, "content": m.content});
        let Some(r) = raw.get(i) else {
            out.push(v);
            continue;
        };
        for key in ["tool_call_id", "name"] {
            if let Some(s) = r.get(key).and_then(Value::as_str) {
                v[key] = json!(s);
            }
        }
        if let Some(calls) = r.get("tool_calls").filter(|c| !c.is_null()) {
            let param = format!("messages[{i}].tool_calls");
            let Value::Array(calls) = calls else {
                return Err(ApiError::invalid(
                    &param,
                    format!("`{param}` must be an array"),
                ));
            };
            let mut fixed = Vec::new();
            for (k, c) in calls.iter().enumerate() {
                let f = c.get("function");
                let name = f.and_then(|f| f.get("name")).and_then(Value::as_str);
                let Some(name) = name else {
                    return Err(ApiError::invalid(
                        &format!("{param}[{k}].function.name"),
                        format!("`{param}[{k}].function.name` must be a string"),
                    ));
                };
                let arguments = match f.and_then(|f| f.get("arguments")) {
                    Some(Value::String(s)) => serde_json::from_str(s).unwrap_or(json!(s)),
                    Some(other) => other.clone(),
                    None => json!({}),
                };
                fixed.push(json!({
                    "id": c.get("id").cloned().unwrap_or(Value::Null),
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }));
            }
            v["tool_calls"] = Value::Array(fixed);
        }
        out.push(v);
    }
    Ok(out)
}

/// The id of call `k` of choice `index` in response `reply_id`.
pub fn call_id(reply_id: &str, index: usize, k: usize) -> String {
    let base = reply_id.rsplit('-').next().unwrap_or(reply_id);
    format!("call_{base}_{index}_{k}")
}

/// A whole assistant reply taken apart: its thoughts, its text and its tool calls (as
/// `message.tool_calls` holds them). Shared by the server and `run --jsonl`.
pub struct AssistantReply {
    pub reasoning: Option<String>,
    pub content: String,
    pub tool_calls: Vec<Value>,
}

/// Splits `text` (reply `reply_id`, choice `index`): reasoning first when `reasoning` is
/// Some(forced_open), then tool calls in the rest when `tool_calls`.
pub fn assistant_reply(
    text: &str,
    reply_id: &str,
    index: usize,
    tool_calls: bool,
    reasoning: Option<bool>,
) -> AssistantReply {
    let (thoughts, rest) = match reasoning {
        Some(forced_open) => reasoning::split_all(text, forced_open),
        None => (None, text.to_string()),
    };
    let (content, calls) = if tool_calls {
        parse_all(&rest)
    } else {
        (rest, Vec::new())
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

/// A whole chat choice's `message` and `finish_reason` with its reasoning and tool calls
/// parsed out.
pub fn apply_to_choice(
    choice: &mut Value,
    reply_id: &str,
    index: usize,
    tool_calls: bool,
    reasoning: Option<bool>,
) {
    let text = choice["message"]["content"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let reply = assistant_reply(&text, reply_id, index, tool_calls, reasoning);
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

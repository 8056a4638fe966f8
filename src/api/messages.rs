//! Anthropic's Messages API body (`POST /v1/messages`, `/v1/messages/count_tokens`) translated into
//! the chat-completions body that [`super::plan::plan`] reads, so a Messages request is planned,
//! rendered and constrained by the same rules as a chat request: `system` (a string or text blocks)
//! becomes the first system message; `messages` blocks become chat messages (`text`; `tool_use` as
//! `tool_calls`; `tool_result` as `tool` messages; `thinking` fed back is dropped); client `tools`
//! become function tools, Anthropic's server tools are left out; `tool_choice`, `stop_sequences`,
//! sampling fields and `max_tokens` map to their chat names. Claude Code's per-request billing line
//! is taken out of the system text (see [`strip_billing_lines`]) so that its prompts share a prefix
//! from turn to turn. Called by the server's Messages handlers on the planner pool. Errors name the
//! field by its path in the Messages body (`messages[2].content[1]`).

use serde_json::{json, Map, Value};

use super::request::type_name;
use super::FieldError;

/// The line Claude Code writes first in its system prompt, whose `cch=` value changes on every
/// request.
pub const BILLING_HEADER: &str = "x-anthropic-billing-header:";

/// A Messages body as a chat body, and what was left out of it.
#[derive(Debug)]
pub struct Translated {
    pub chat: Map<String, Value>,
    /// The names of the Anthropic server tools (`web_search_20250305`, ...) that were ignored.
    pub ignored_tools: Vec<String>,
    /// Whether a billing line was taken out of the system text.
    pub stripped_billing: bool,
}

/// The default `max_tokens` when a body has none (Anthropic requires it; clients may not).
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

fn err(param: &str, message: impl Into<String>) -> FieldError {
    FieldError::new(param, message)
}

/// Takes every line that starts with [`BILLING_HEADER`] (after leading whitespace) out of
/// `text`; returns the rest and whether a line was taken.
pub fn strip_billing_lines(text: &str) -> (String, bool) {
    if !text.contains(BILLING_HEADER) {
        return (text.to_string(), false);
    }
    let kept: Vec<&str> = text
        .split('\n')
        .filter(|line| !line.trim_start().starts_with(BILLING_HEADER))
        .collect();
    (kept.join("\n"), true)
}

/// The text of `value` at `param`: a string or an array of `text` blocks (`cache_control`
/// and `citations` allowed), joined with blank lines.
fn text_of(value: &Value, param: &str) -> Result<String, FieldError> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut parts = Vec::new();
            for (k, b) in blocks.iter().enumerate() {
                parts.push(one_text_block(b, &format!("{param}[{k}]"))?);
            }
            Ok(parts.join("\n\n"))
        }
        other => Err(err(
            param,
            format!(
                "`{param}` must be a string or an array of text blocks, got {}",
                type_name(other)
            ),
        )),
    }
}

/// The text of a system field or message, with the billing lines taken out of each block and
/// the blocks left empty dropped; and whether a line was taken.
fn system_text(value: &Value, param: &str) -> Result<(String, bool), FieldError> {
    let texts = match value {
        Value::Array(blocks) => {
            let mut texts = Vec::new();
            for (k, b) in blocks.iter().enumerate() {
                texts.push(one_text_block(b, &format!("{param}[{k}]"))?);
            }
            texts
        }
        other => vec![text_of(other, param)?],
    };
    let (mut parts, mut stripped) = (Vec::new(), false);
    for text in texts {
        let (text, s) = strip_billing_lines(&text);
        stripped |= s;
        if !(s && text.trim().is_empty()) {
            parts.push(text);
        }
    }
    Ok((parts.join("\n\n"), stripped))
}

/// The text of one block that must be a `text` block.
fn one_text_block(b: &Value, param: &str) -> Result<String, FieldError> {
    match block_type(b, param)? {
        "text" => block_text(b, param),
        other => Err(unsupported(other, param)),
    }
}

fn block_type<'a>(b: &'a Value, param: &str) -> Result<&'a str, FieldError> {
    match b.get("type") {
        Some(Value::String(t)) => Ok(t),
        _ if !b.is_object() => Err(err(
            param,
            format!(
                "`{param}` must be a content block object, got {}",
                type_name(b)
            ),
        )),
        _ => Err(err(
            &format!("{param}.type"),
            format!("`{param}.type` must be a string"),
        )),
    }
}

fn block_text(b: &Value, param: &str) -> Result<String, FieldError> {
    match b.get("text") {
        Some(Value::String(t)) => Ok(t.clone()),
        _ => Err(err(
            &format!("{param}.text"),
            format!("`{param}.text` must be a string"),
        )),
    }
}

/// The refusal of a block type this server cannot read.
fn unsupported(kind: &str, param: &str) -> FieldError {
    let why = match kind {
        "image" => "image blocks are not supported: this server has no vision".to_string(),
        "document" | "search_result" => {
            format!("{kind} blocks are not supported: this server reads text blocks only")
        }
        other => format!(
            "content blocks of type {} are not supported here",
            super::shown(other)
        ),
    };
    err(param, format!("`{param}`: {why}"))
}

/// The chat messages of one Messages turn.
fn turn(
    i: usize,
    m: &Value,
    chat: &mut Vec<Value>,
    system: &mut Vec<String>,
    stripped: &mut bool,
) -> Result<(), FieldError> {
    let param = format!("messages[{i}]");
    let Value::Object(m) = m else {
        return Err(err(
            &param,
            format!("`{param}` must be an object, got {}", type_name(m)),
        ));
    };
    let role = match m.get("role") {
        Some(Value::String(r)) if ["user", "assistant", "system"].contains(&r.as_str()) => r,
        _ => {
            return Err(err(
                &format!("{param}.role"),
                format!("`{param}.role` must be `user` or `assistant`"),
            ))
        }
    };
    let cparam = format!("{param}.content");
    let content = m
        .get("content")
        .ok_or_else(|| err(&cparam, format!("`{cparam}` is required")))?;
    if role == "system" {
        let (text, s) = system_text(content, &cparam)?;
        *stripped |= s;
        // Before the conversation starts it joins the system prompt; later it stays in place.
        if chat.is_empty() {
            system.push(text);
        } else {
            chat.push(json!({"role": "system", "content": text}));
        }
        return Ok(());
    }
    let blocks: Vec<Value> = match content {
        Value::String(s) => vec![json!({"type": "text", "text": s})],
        Value::Array(b) => b.clone(),
        other => {
            return Err(err(
                &cparam,
                format!(
                    "`{cparam}` must be a string or an array of content blocks, got {}",
                    type_name(other)
                ),
            ))
        }
    };
    let mut text = Vec::new();
    let mut calls = Vec::new();
    for (k, b) in blocks.iter().enumerate() {
        let p = format!("{cparam}[{k}]");
        match (block_type(b, &p)?, role.as_str()) {
            ("text", _) => text.push(block_text(b, &p)?),
            ("thinking" | "redacted_thinking", "assistant") => {}
            ("tool_use" | "server_tool_use", "assistant") => {
                let id = b.get("id").and_then(Value::as_str).unwrap_or("");
                let Some(name) = b.get("name").and_then(Value::as_str) else {
                    return Err(err(
                        &format!("{p}.name"),
                        format!("`{p}.name` must be a string"),
                    ));
                };
                let input = match b.get("input") {
                    None => json!({}),
                    Some(v @ Value::Object(_)) => v.clone(),
                    Some(other) => {
                        return Err(err(
                            &format!("{p}.input"),
                            format!("`{p}.input` must be an object, got {}", type_name(other)),
                        ))
                    }
                };
                calls.push(json!({"id": id, "type": "function",
                                  "function": {"name": name, "arguments": input.to_string()}}));
            }
            ("tool_result", "user") => {
                // The tool's answer goes before the user's own words, as the model called it.
                let id = match b.get("tool_use_id") {
                    Some(Value::String(id)) => id.clone(),
                    _ => {
                        return Err(err(
                            &format!("{p}.tool_use_id"),
                            format!("`{p}.tool_use_id` must be a string"),
                        ))
                    }
                };
                let mut result = match b.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(c) => text_of(c, &format!("{p}.content"))?,
                };
                if b.get("is_error") == Some(&Value::Bool(true)) {
                    result = format!("Error: {result}");
                }
                chat.push(json!({"role": "tool", "tool_call_id": id, "content": result}));
            }
            (kind @ ("tool_use" | "thinking" | "redacted_thinking" | "tool_result"), _) => {
                return Err(err(
                    &p,
                    format!("`{p}`: {kind} blocks belong in {} messages", {
                        if kind == "tool_result" {
                            "user"
                        } else {
                            "assistant"
                        }
                    }),
                ))
            }
            (kind, _) => return Err(unsupported(kind, &p)),
        }
    }
    let text = text.join("\n\n");
    if role == "assistant" {
        let mut msg = json!({"role": "assistant", "content": text});
        if !calls.is_empty() {
            msg["tool_calls"] = Value::Array(calls);
        }
        chat.push(msg);
    } else if !text.is_empty()
        || !blocks
            .iter()
            .any(|b| b.get("type") == Some(&json!("tool_result")))
    {
        chat.push(json!({"role": "user", "content": text}));
    }
    Ok(())
}

/// `tools`: client tools as chat function tools; server tools (entries with a `type` other
/// than `custom`) left out, their names returned.
fn tools(raw: &Value, out: &mut Map<String, Value>) -> Result<Vec<String>, FieldError> {
    let Value::Array(items) = raw else {
        return Err(err(
            "tools",
            format!("`tools` must be an array, got {}", type_name(raw)),
        ));
    };
    let mut ignored = Vec::new();
    let mut chat_tools = Vec::new();
    for (i, t) in items.iter().enumerate() {
        let p = format!("tools[{i}]");
        if !t.is_object() {
            return Err(err(
                &p,
                format!("`{p}` must be an object, got {}", type_name(t)),
            ));
        }
        match t.get("type") {
            None | Some(Value::Null) => {}
            Some(Value::String(k)) if k == "custom" => {}
            Some(Value::String(k)) => {
                ignored.push(k.clone());
                continue;
            }
            Some(_) => {
                return Err(err(
                    &format!("{p}.type"),
                    format!("`{p}.type` must be a string"),
                ))
            }
        }
        let Some(name) = t.get("name").and_then(Value::as_str) else {
            return Err(err(
                &format!("{p}.name"),
                format!("`{p}.name` must be a string"),
            ));
        };
        let schema = match t.get("input_schema") {
            Some(s @ Value::Object(_)) => s.clone(),
            _ => {
                return Err(err(
                    &format!("{p}.input_schema"),
                    format!("`{p}.input_schema` must be a JSON schema object"),
                ))
            }
        };
        let mut function = json!({"name": name, "parameters": schema});
        if let Some(d) = t.get("description").and_then(Value::as_str) {
            function["description"] = json!(d);
        }
        chat_tools.push(json!({"type": "function", "function": function}));
    }
    if !chat_tools.is_empty() {
        out.insert("tools".into(), Value::Array(chat_tools));
    }
    Ok(ignored)
}

/// `tool_choice`: `auto`, `any` (required), `tool` (named), `none`;
/// `disable_parallel_tool_use` as `parallel_tool_calls: false`.
fn tool_choice(raw: &Value, out: &mut Map<String, Value>) -> Result<(), FieldError> {
    let kind = raw.get("type").and_then(Value::as_str);
    let choice = match kind {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => match raw.get("name").and_then(Value::as_str) {
            Some(name) => json!({"type": "function", "function": {"name": name}}),
            None => {
                return Err(err(
                    "tool_choice.name",
                    "`tool_choice.name` must name a tool when `tool_choice.type` is `tool`",
                ))
            }
        },
        _ => {
            return Err(err(
                "tool_choice.type",
                "`tool_choice.type` must be `auto`, `any`, `tool` or `none`",
            ))
        }
    };
    if out.contains_key("tools") || kind == Some("none") || kind == Some("auto") {
        out.insert("tool_choice".into(), choice);
    }
    match raw.get("disable_parallel_tool_use") {
        None | Some(Value::Null) => {}
        Some(Value::Bool(d)) => {
            if *d && out.contains_key("tools") {
                out.insert("parallel_tool_calls".into(), json!(false));
            }
        }
        Some(_) => {
            return Err(err(
                "tool_choice.disable_parallel_tool_use",
                "`tool_choice.disable_parallel_tool_use` must be a boolean",
            ))
        }
    }
    Ok(())
}

/// The chat body of a Messages body (or of a `count_tokens` body, which has no `max_tokens`).
pub fn translate(body: &Map<String, Value>) -> Result<Translated, FieldError> {
    let mut chat = Map::new();
    let mut stripped = false;
    match body.get("model") {
        None | Some(Value::Null) | Some(Value::String(_)) => {}
        Some(other) => {
            return Err(err(
                "model",
                format!("`model` must be a string, got {}", type_name(other)),
            ))
        }
    }
    let mut system = Vec::new();
    if let Some(s) = body.get("system").filter(|s| !s.is_null()) {
        let (text, s) = system_text(s, "system")?;
        stripped |= s;
        system.push(text);
    }
    let items = match body.get("messages") {
        Some(Value::Array(items)) if !items.is_empty() => items,
        Some(Value::Array(_)) => {
            return Err(err("messages", "`messages` must hold at least one message"))
        }
        None => return Err(err("messages", "`messages` is required")),
        Some(other) => {
            return Err(err(
                "messages",
                format!("`messages` must be an array, got {}", type_name(other)),
            ))
        }
    };
    let mut messages = Vec::new();
    for (i, m) in items.iter().enumerate() {
        turn(i, m, &mut messages, &mut system, &mut stripped)?;
    }
    let system: Vec<String> = system
        .into_iter()
        .filter(|s| !s.trim().is_empty())
        .collect();
    if !system.is_empty() {
        messages.insert(0, json!({"role": "system", "content": system.join("\n\n")}));
    }
    chat.insert("messages".into(), Value::Array(messages));
    let ignored_tools = match body.get("tools").filter(|t| !t.is_null()) {
        Some(t) => tools(t, &mut chat)?,
        None => Vec::new(),
    };
    if let Some(c) = body.get("tool_choice").filter(|c| !c.is_null()) {
        tool_choice(c, &mut chat)?;
    }
    match body.get("max_tokens") {
        None | Some(Value::Null) => {}
        Some(v) if v.as_u64().is_some_and(|n| n >= 1) => {
            chat.insert("max_tokens".into(), v.clone());
        }
        Some(other) => {
            return Err(err(
                "max_tokens",
                format!("`max_tokens` must be a positive integer, got {other}"),
            ))
        }
    }
    match body.get("stop_sequences") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items))
            if items
                .iter()
                .all(|s| s.as_str().is_some_and(|s| !s.is_empty())) =>
        {
            if !items.is_empty() {
                chat.insert("stop".into(), Value::Array(items.clone()));
            }
        }
        Some(_) => {
            return Err(err(
                "stop_sequences",
                "`stop_sequences` must be an array of non-empty strings",
            ))
        }
    }
    // Anthropic's fields, then extensions sent in an extra body (llama.cpp's, the template's).
    const PASSED: [&str; 8] = [
        "temperature",
        "top_p",
        "top_k",
        "stream",
        "seed",
        "logit_bias",
        "chat_template_kwargs",
        "reasoning_effort",
    ];
    for key in PASSED {
        if let Some(v) = body.get(key).filter(|v| !v.is_null()) {
            chat.insert(key.into(), v.clone());
        }
    }
    if let Some(t) = body.get("thinking").filter(|t| !t.is_null()) {
        match t.get("type").and_then(Value::as_str) {
            Some("enabled" | "adaptive" | "disabled") => {}
            _ => {
                return Err(err(
                    "thinking.type",
                    "`thinking.type` must be `enabled`, `adaptive` or `disabled`",
                ))
            }
        }
        if let Some(b) = t.get("budget_tokens").filter(|b| !b.is_null()) {
            if b.as_u64().is_none() {
                return Err(err(
                    "thinking.budget_tokens",
                    "`thinking.budget_tokens` must be a non-negative integer",
                ));
            }
        }
    }
    if let Some(m) = body
        .get("metadata")
        .filter(|m| !m.is_null() && !m.is_object())
    {
        return Err(err(
            "metadata",
            format!("`metadata` must be an object, got {}", type_name(m)),
        ));
    }
    Ok(Translated {
        chat,
        ignored_tools,
        stripped_billing: stripped,
    })
}

/// The Messages field an error from the chat rules is about: the chat names mapped back
/// (`stop` is `stop_sequences`; a chat tool's `function.parameters` is `input_schema`).
pub fn messages_param(chat_param: &str) -> String {
    if chat_param == "stop" {
        return "stop_sequences".into();
    }
    chat_param
        .replace(".function.parameters", ".input_schema")
        .replace(".function.name", ".name")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn billing_lines_are_taken_out_and_the_rest_kept() {
        let (text, s) = strip_billing_lines(
            "x-anthropic-billing-header: cc_version=2.1.3; cc_entrypoint=cli; cch=ab12c;\nYou are helpful.",
        );
        assert!(s);
        assert_eq!(text, "You are helpful.");
        assert_eq!(strip_billing_lines("plain"), ("plain".to_string(), false));
    }

    #[test]
    fn a_tool_round_trip_becomes_chat_messages() {
        let t = translate(&body(json!({
            "model": "claude-x", "max_tokens": 50,
            "system": [{"type": "text", "text": "x-anthropic-billing-header: cch=1;"},
                       {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "tools": [{"name": "get_weather", "description": "d", "input_schema": {"type": "object"}},
                      {"type": "web_search_20250305", "name": "web_search"}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "sunny"}], "is_error": false}]}
            ]
        })))
        .unwrap();
        assert!(t.stripped_billing);
        assert_eq!(t.ignored_tools, vec!["web_search_20250305"]);
        let m = &t.chat["messages"];
        assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(
            m[2]["tool_calls"][0]["function"]["arguments"],
            "{\"city\":\"Oslo\"}"
        );
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"})
        );
        assert_eq!(m.as_array().unwrap().len(), 4);
        assert_eq!(t.chat["tool_choice"], "required");
        assert_eq!(t.chat["parallel_tool_calls"], false);
        assert_eq!(t.chat["tools"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn images_and_bad_types_name_the_field() {
        let e = translate(&body(json!({"messages": [{"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": [{"type": "text", "text": "c"},
                {"type": "image", "source": {}}]}]})))
        .unwrap_err();
        assert_eq!(e.param, "messages[2].content[1]");
        assert!(e.message.contains("no vision"), "{}", e.message);
        let e = translate(&body(
            json!({"max_tokens": "ten", "messages": [{"role": "user", "content": "a"}]}),
        ))
        .unwrap_err();
        assert_eq!(e.param, "max_tokens");
        let e = translate(&body(
            json!({"messages": [{"role": "robot", "content": "a"}]}),
        ))
        .unwrap_err();
        assert_eq!(e.param, "messages[0].role");
    }
}

//! The OpenAI Responses API's request body, translated into the chat-completions body that
//! [`super::plan::plan`] reads (`Endpoint::Chat`), so a response runs the chat path: one
//! request plan, one template render, the same constraint, tool and reasoning machinery.
//!
//! `instructions` becomes a system message first; `input` (a string, or items: `message`,
//! `function_call`, `function_call_output`, `custom_tool_call`, `custom_tool_call_output`,
//! `reasoning`) becomes the messages after the conversation of `previous_response_id` (which
//! the server looks up); `tools` (flat `function` entries, `custom` tools as a function with one
//! string parameter `input`) become chat tools, built-in tools (`web_search`, `mcp`, ...) are
//! left out and named in [`Translated::ignored_tools`]; `text.format` becomes `response_format`,
//! `max_output_tokens` `max_tokens`. Errors name the Responses field (`input[3].content[0]`).
//! Called by the server's `/v1/responses` handlers.

use serde_json::{json, Map, Value};

use super::request::type_name;
use super::responses_tools::{text_format, tool_choice, tools};
use super::RequestError;

/// A Responses body as a chat body, and what answering it needs besides.
#[derive(Clone, Debug, Default)]
pub struct Translated {
    /// The chat-completions body.
    pub chat: Map<String, Value>,
    /// The conversation without `instructions`: the stored turns of `previous_response_id`
    /// and this body's `input` (what the store keeps, with the reply added).
    pub conversation: Vec<Value>,
    /// Names of the `custom` tools: their calls come back as `custom_tool_call` items.
    pub custom_tools: Vec<String>,
    /// The `custom` tools with a grammar: (name, `lark` or `regex`, the definition).
    pub custom_grammars: Vec<(String, String, String)>,
    /// `tool_choice` named a `custom` tool with a grammar: the whole reply is that tool's
    /// input, constrained by its grammar through llguidance, and comes back as its call.
    pub forced_custom: Option<String>,
    /// Tool types left out (built-in tools a local server does not run).
    pub ignored_tools: Vec<String>,
    /// Per chat tool, the index of the Responses tool it came from (to name fields).
    pub tool_index: Vec<usize>,
    /// The Responses fields a response echoes: `tools` (the ones offered), `tool_choice`,
    /// `text`, `instructions`, `metadata`, ...
    pub echo: Map<String, Value>,
    pub stream: bool,
    /// Whether to keep the response (`store`, default true).
    pub store: bool,
}

/// `previous_response_id` of a body, checked.
pub fn previous_response_id(body: &Map<String, Value>) -> Result<Option<&str>, RequestError> {
    match body.get("previous_response_id") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(RequestError::invalid(
            "previous_response_id",
            format!(
                "`previous_response_id` must be a string, got {}",
                type_name(other)
            ),
        )),
    }
}

/// Translates `body`; `previous` is the stored conversation of `previous_response_id`.
pub fn translate(
    body: &Map<String, Value>,
    previous: &[Value],
) -> Result<Translated, RequestError> {
    let mut t = Translated {
        store: true,
        ..Default::default()
    };
    if body.get("background") == Some(&json!(true)) {
        return Err(RequestError::invalid(
            "background",
            "`background: true` is not supported by this server; send the request without it",
        ));
    }
    let mut chat = Map::new();
    let mut messages = Vec::new();
    match body.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::String(s)) => messages.push(json!({"role": "system", "content": s})),
        Some(other) => {
            return Err(RequestError::invalid(
                "instructions",
                format!("`instructions` must be a string, got {}", type_name(other)),
            ))
        }
    }
    t.conversation = previous.to_vec();
    let input = input_messages(body.get("input"))?;
    t.conversation.extend(input);
    messages.extend(t.conversation.iter().cloned());
    merge_system(&mut messages);
    chat.insert("messages".into(), Value::Array(messages));

    let tools = tools(body.get("tools"), &mut t)?;
    let choice = tool_choice(body.get("tool_choice"))?;
    let forced = choice
        .as_ref()
        .and_then(|c| c["function"]["name"].as_str())
        .and_then(|name| t.custom_grammars.iter().find(|(n, _, _)| n == name))
        .cloned();
    if let Some((name, syntax, definition)) = forced {
        // The reply is the tool's input, under its grammar: no tools, no JSON around it.
        let field = if syntax == "regex" {
            "regex"
        } else {
            "grammar"
        };
        chat.insert(field.into(), json!(definition));
        t.forced_custom = Some(name);
    } else if !tools.is_empty() {
        chat.insert("tools".into(), Value::Array(tools));
        if let Some(c) = choice {
            chat.insert("tool_choice".into(), c);
        }
    } else if let Some(c) = choice.filter(|c| c != "auto" && c != "none") {
        // No tool this server runs is offered: `tool_choice` needs one.
        chat.insert("tool_choice".into(), c);
    }
    // Besides OpenAI's fields, the chat path's extensions (llama.cpp's and vLLM's names).
    for key in [
        "parallel_tool_calls",
        "temperature",
        "top_p",
        "stream",
        "seed",
        "top_k",
        "min_p",
        "presence_penalty",
        "frequency_penalty",
        "repeat_penalty",
        "repetition_penalty",
        "stop",
        "ignore_eos",
        "adaptive_target",
        "adaptive_decay",
        "logit_bias",
        "chat_template_kwargs",
    ]
    .iter()
    .chain(&super::sampling_fields::FIELDS)
    {
        if let Some(v) = body.get(*key).filter(|v| !v.is_null()) {
            chat.insert((*key).into(), v.clone());
        }
    }
    if let Some(v) = body.get("max_output_tokens").filter(|v| !v.is_null()) {
        chat.insert("max_tokens".into(), v.clone());
    }
    // `reasoning.effort` is the chat body's `reasoning_effort` (the template's, as
    // llama-server passes it); a value OpenAI does not define is left out, as the rest of
    // `reasoning` is (agents send what their own server takes).
    let effort = body.get("reasoning").and_then(|r| r.get("effort"));
    if let Some(e) = effort.and_then(Value::as_str) {
        if super::template_args::EFFORTS.contains(&e) {
            chat.insert("reasoning_effort".into(), json!(e));
        }
    }
    if let Some(format) = text_format(body.get("text"))? {
        chat.insert("response_format".into(), format);
    }
    t.stream = body.get("stream") == Some(&json!(true));
    t.store = !matches!(body.get("store"), Some(Value::Bool(false)));
    for key in [
        "instructions",
        "metadata",
        "max_output_tokens",
        "previous_response_id",
        "reasoning",
        "truncation",
        "user",
        "prompt_cache_key",
        "service_tier",
        "top_logprobs",
    ] {
        if let Some(v) = body.get(key) {
            t.echo.insert(key.into(), v.clone());
        }
    }
    t.echo.insert(
        "tool_choice".into(),
        body.get("tool_choice")
            .filter(|c| !c.is_null())
            .cloned()
            .unwrap_or(json!("auto")),
    );
    t.echo.insert(
        "parallel_tool_calls".into(),
        json!(body
            .get("parallel_tool_calls")
            .and_then(Value::as_bool)
            .unwrap_or(true)),
    );
    let text = body
        .get("text")
        .and_then(|x| x.get("format"))
        .filter(|f| f.is_object())
        .cloned()
        .unwrap_or(json!({"type": "text"}));
    t.echo.insert("text".into(), json!({ "format": text }));
    t.chat = chat;
    Ok(t)
}

/// The field of the Responses body a chat field's error is about (`tools[0].function.name`
/// names the Responses tool it came from, `messages` is `input`, ...).
pub fn responses_param(param: &str, t: &Translated) -> String {
    if let Some(rest) = param.strip_prefix("tools[") {
        if let Some((k, rest)) = rest.split_once(']') {
            let orig = k
                .parse::<usize>()
                .ok()
                .and_then(|k| t.tool_index.get(k).copied());
            if let Some(i) = orig {
                let rest = rest.strip_prefix(".function").unwrap_or(rest);
                return format!("tools[{i}]{rest}");
            }
        }
    }
    if param == "messages" || param.starts_with("messages[") {
        return "input".into();
    }
    if let Some(rest) = param.strip_prefix("response_format") {
        let rest = rest.strip_prefix(".json_schema").unwrap_or(rest);
        return format!("text.format{rest}");
    }
    match param {
        "max_tokens" => "max_output_tokens".into(),
        "reasoning_effort" => "reasoning.effort".into(),
        other => other.to_string(),
    }
}

/// Leading system messages joined into one (many templates take one system message, first).
fn merge_system(messages: &mut Vec<Value>) {
    while messages.len() > 1 && messages[0]["role"] == "system" && messages[1]["role"] == "system" {
        let next = messages.remove(1);
        let joined = format!(
            "{}\n\n{}",
            messages[0]["content"].as_str().unwrap_or(""),
            next["content"].as_str().unwrap_or("")
        );
        messages[0]["content"] = json!(joined);
    }
}

pub(super) fn invalid(param: &str, message: impl Into<String>) -> RequestError {
    RequestError::invalid(param, message)
}

pub(super) fn str_field<'a>(
    item: &'a Value,
    key: &str,
    param: &str,
) -> Result<&'a str, RequestError> {
    match item.get(key) {
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(invalid(
            &format!("{param}.{key}"),
            format!("`{param}.{key}` must be a string, got {}", type_name(other)),
        )),
        None => Err(invalid(
            &format!("{param}.{key}"),
            format!("`{param}.{key}` is required"),
        )),
    }
}

/// `input` as chat messages.
fn input_messages(input: Option<&Value>) -> Result<Vec<Value>, RequestError> {
    let items = match input {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) => return Ok(vec![json!({"role": "user", "content": s})]),
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(invalid(
                "input",
                format!(
                    "`input` must be a string or an array of items, got {}",
                    type_name(other)
                ),
            ))
        }
    };
    let mut out: Vec<Value> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let param = format!("input[{i}]");
        if !item.is_object() {
            return Err(invalid(
                &param,
                format!("`{param}` must be an object, got {}", type_name(item)),
            ));
        }
        let kind = match item.get("type") {
            None | Some(Value::Null) if item.get("role").is_some() => "message",
            Some(Value::String(s)) => s.as_str(),
            _ => {
                return Err(invalid(
                    &format!("{param}.type"),
                    format!("`{param}.type` must be a string (`message`, `function_call`, ...)"),
                ))
            }
        };
        match kind {
            "message" => {
                let role = match str_field(item, "role", &param)? {
                    "system" | "developer" => "system",
                    r @ ("user" | "assistant") => r,
                    other => {
                        return Err(invalid(
                            &format!("{param}.role"),
                            format!("`{param}.role` must be system, developer, user or assistant; got {other:?}"),
                        ))
                    }
                };
                let content = text_of(item.get("content"), &format!("{param}.content"))?;
                out.push(json!({"role": role, "content": content}));
            }
            "function_call" | "custom_tool_call" => {
                let name = str_field(item, "name", &param)?;
                let call_id = str_field(item, "call_id", &param)?;
                let arguments = if kind == "function_call" {
                    str_field(item, "arguments", &param)?.to_string()
                } else {
                    json!({"input": str_field(item, "input", &param)?}).to_string()
                };
                let call = json!({"id": call_id, "type": "function",
                                  "function": {"name": name, "arguments": arguments}});
                match out.last_mut() {
                    Some(last) if last["role"] == "assistant" => {
                        if !last["tool_calls"].is_array() {
                            last["tool_calls"] = json!([]);
                        }
                        last["tool_calls"].as_array_mut().expect("set").push(call);
                    }
                    _ => out.push(json!({"role": "assistant", "content": "", "tool_calls": [call]})),
                }
            }
            "function_call_output" | "custom_tool_call_output" => {
                let call_id = str_field(item, "call_id", &param)?;
                let output = text_of(item.get("output"), &format!("{param}.output"))?;
                out.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
            }
            // Thoughts of an earlier turn: templates drop them from earlier turns anyway.
            "reasoning" => {}
            "item_reference" => {
                return Err(invalid(
                    &param,
                    format!("`{param}`: `item_reference` items are not supported by this server; send the item itself"),
                ))
            }
            other => {
                return Err(invalid(
                    &format!("{param}.type"),
                    format!("`{param}` is an item of type {}, which this server does not take (it takes message, function_call, function_call_output, custom_tool_call, custom_tool_call_output, reasoning)", super::shown(other)),
                ))
            }
        }
    }
    Ok(out)
}

/// A message's `content` (or a tool output): a string, or text parts joined.
fn text_of(content: Option<&Value>, param: &str) -> Result<String, RequestError> {
    let parts = match content {
        None | Some(Value::Null) => return Ok(String::new()),
        Some(Value::String(s)) => return Ok(s.clone()),
        Some(Value::Array(parts)) => parts,
        Some(other) => {
            return Err(invalid(
                param,
                format!(
                    "`{param}` must be a string or an array of parts, got {}",
                    type_name(other)
                ),
            ))
        }
    };
    let mut text = String::new();
    for (j, part) in parts.iter().enumerate() {
        let p = format!("{param}[{j}]");
        match part.get("type").and_then(Value::as_str) {
            Some("input_text" | "output_text" | "text" | "summary_text" | "reasoning_text") => {
                text.push_str(str_field(part, "text", &p)?);
            }
            Some("refusal") => text.push_str(str_field(part, "refusal", &p)?),
            Some(kind @ ("input_image" | "input_file" | "input_audio")) => {
                return Err(invalid(
                    &p,
                    format!("`{p}` is an `{kind}` part: this server's models read text only"),
                ))
            }
            Some(kind) => {
                return Err(invalid(
                    &p,
                    format!(
                        "`{p}` has type {}; parts must be `input_text` or `output_text`",
                        super::shown(kind)
                    ),
                ))
            }
            None => {
                return Err(invalid(
                    &format!("{p}.type"),
                    format!("`{p}.type` must be a string"),
                ))
            }
        }
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn items_become_chat_messages() {
        let b = body(json!({
            "instructions": "Be brief.",
            "input": [
                {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "dev"}]},
                {"role": "user", "content": "What is the weather?"},
                {"type": "reasoning", "summary": []},
                {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{\"city\":\"Paris\"}"},
                {"type": "function_call", "call_id": "c2", "name": "weather", "arguments": "{\"city\":\"Rome\"}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                {"type": "custom_tool_call", "call_id": "c3", "name": "patch", "input": "*** x"},
            ],
            "tools": [{"type": "function", "name": "weather", "parameters": {"type": "object"}},
                      {"type": "web_search"},
                      {"type": "custom", "name": "patch", "format": {"type": "grammar", "syntax": "regex", "definition": "a+"}}],
            "tool_choice": {"type": "function", "name": "weather"},
            "max_output_tokens": 9,
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        }));
        let t = translate(&b, &[json!({"role": "user", "content": "before"})]).unwrap();
        let m = t.chat["messages"].as_array().unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(m[1]["content"], "before");
        assert_eq!(m[2], json!({"role": "system", "content": "dev"}));
        assert_eq!(m[4]["tool_calls"].as_array().unwrap().len(), 2);
        assert_eq!(
            m[5],
            json!({"role": "tool", "tool_call_id": "c1", "content": "sunny"})
        );
        assert_eq!(
            m[6]["tool_calls"][0]["function"]["arguments"],
            "{\"input\":\"*** x\"}"
        );
        assert_eq!(t.conversation.len(), 6);
        assert_eq!(t.ignored_tools, vec!["web_search"]);
        assert_eq!(t.custom_tools, vec!["patch"]);
        assert_eq!(t.tool_index, vec![0, 2]);
        assert_eq!(
            t.chat["tools"][1]["function"]["parameters"]["properties"]["input"]["pattern"],
            "^(?:a+)$"
        );
        assert_eq!(t.chat["tool_choice"]["function"]["name"], "weather");
        assert_eq!(t.chat["max_tokens"], 9);
        assert_eq!(t.chat["response_format"]["json_schema"]["name"], "x");
        assert_eq!(
            responses_param("tools[1].function.parameters", &t),
            "tools[2].parameters"
        );
        assert_eq!(responses_param("max_tokens", &t), "max_output_tokens");
    }

    #[test]
    fn bad_items_name_the_field() {
        for (b, param) in [
            (json!({"input": 5}), "input"),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_image", "image_url": "x"}]}]}),
                "input[0].content[1]",
            ),
            (
                json!({"input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": 3}]}]}),
                "input[0].content[0].text",
            ),
            (
                json!({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}),
                "input[0].arguments",
            ),
            (
                json!({"input": [{"type": "item_reference", "id": "x"}]}),
                "input[0]",
            ),
            (json!({"input": "x", "background": true}), "background"),
            (
                json!({"input": "x", "text": {"format": {"type": "xml"}}}),
                "text.format.type",
            ),
            (json!({"input": "x", "tool_choice": 3}), "tool_choice"),
            (
                json!({"input": "x", "tools": [{"type": "function"}]}),
                "tools[0].name",
            ),
        ] {
            let e = translate(&body(b.clone()), &[]).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{b}: {}", e.message);
        }
    }
}

//! What a chat body passes to the chat template besides its messages and tools, as
//! llama-server does: `chat_template_kwargs` (an object whose keys become template variables)
//! and OpenAI's `reasoning_effort` (the template's `reasoning_effort`, which gpt-oss's writes
//! as `Reasoning: low|medium|high`; `none` passes nothing). And the message fields the harmony
//! template reads that clients send under other names: an assistant turn's `reasoning_content`
//! is its `thinking` (llama.cpp's gpt-oss handler does the same, dropping `content` beside
//! `tool_calls` there).
//!
//! Called by `super::plan` when it renders a chat body (and so by `/apply-template`).

use serde_json::{Map, Value};

use super::RequestError;

/// The template variables a request cannot replace: what the server itself passes.
const RESERVED: [&str; 5] = [
    "messages",
    "tools",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
];

/// OpenAI's `reasoning_effort` values.
pub const EFFORTS: [&str; 6] = ["none", "minimal", "low", "medium", "high", "xhigh"];

/// The extra template variables of a chat body: `chat_template_kwargs`, then
/// `reasoning_effort` over it (llama-server's order).
pub fn extra_variables(body: &Map<String, Value>) -> Result<Map<String, Value>, RequestError> {
    let mut vars = match body.get("chat_template_kwargs") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => {
            return Err(RequestError::invalid(
                "chat_template_kwargs",
                "`chat_template_kwargs` must be an object of template variables",
            ))
        }
    };
    if let Some(key) = RESERVED.iter().find(|k| vars.contains_key(**k)) {
        return Err(RequestError::invalid(
            "chat_template_kwargs",
            format!("`chat_template_kwargs.{key}` cannot replace the request's own `{key}`"),
        ));
    }
    match body.get("reasoning_effort") {
        None | Some(Value::Null) => {}
        Some(Value::String(e)) if EFFORTS.contains(&e.as_str()) => {
            if e == "none" {
                vars.remove("reasoning_effort");
            } else {
                vars.insert("reasoning_effort".into(), Value::String(e.clone()));
            }
        }
        Some(_) => {
            return Err(RequestError::invalid(
                "reasoning_effort",
                format!("`reasoning_effort` must be one of {}", EFFORTS.join(", ")),
            ))
        }
    }
    Ok(vars)
}

/// An assistant message as the harmony template wants it: `reasoning_content` (a string) also
/// as `thinking`, and no `content` beside `tool_calls` then.
pub fn harmony_message(mut message: Value, raw: &Value) -> Value {
    if let Some(thoughts) = raw.get("reasoning_content").and_then(Value::as_str) {
        message["thinking"] = Value::String(thoughts.to_string());
        let has_calls = message
            .get("tool_calls")
            .and_then(Value::as_array)
            .is_some_and(|c| !c.is_empty());
        if has_calls {
            if let Some(o) = message.as_object_mut() {
                o.remove("content");
            }
        }
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn kwargs_and_effort_become_variables() {
        let v = extra_variables(&body(json!({}))).unwrap();
        assert!(v.is_empty());
        let v = extra_variables(&body(json!({"chat_template_kwargs": {"reasoning_effort": "low", "x": 1}, "reasoning_effort": "high"}))).unwrap();
        assert_eq!(v["reasoning_effort"], "high");
        assert_eq!(v["x"], 1);
        let v = extra_variables(&body(json!({"chat_template_kwargs": {"reasoning_effort": "low"}, "reasoning_effort": "none"}))).unwrap();
        assert!(!v.contains_key("reasoning_effort"));
        let e = extra_variables(&body(json!({"chat_template_kwargs": [1]}))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("chat_template_kwargs"));
        let e =
            extra_variables(&body(json!({"chat_template_kwargs": {"messages": []}}))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("chat_template_kwargs"));
        let e = extra_variables(&body(json!({"reasoning_effort": "extreme"}))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("reasoning_effort"));
    }

    #[test]
    fn reasoning_content_is_thinking_and_drops_content_beside_calls() {
        let raw = json!({"role": "assistant", "content": "x", "reasoning_content": "why"});
        let m = harmony_message(json!({"role": "assistant", "content": "x"}), &raw);
        assert_eq!(m["thinking"], "why");
        assert_eq!(m["content"], "x");
        let m = harmony_message(
            json!({"role": "assistant", "content": "", "tool_calls": [{"id": "a"}]}),
            &raw,
        );
        assert_eq!(m["thinking"], "why");
        assert!(m.get("content").is_none());
    }
}

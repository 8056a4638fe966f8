//! `tools`, `tool_choice` and `parallel_tool_calls`: the functions a chat request offers, checked
//! field by field, and the grammar a call must follow in the format the model's chat template
//! teaches: the Hermes/Qwen format, `<tool_call>\n{"name": ..., "arguments":
//! {...}}\n</tool_call>`, recognised by `<tool_call>` in the template's text; or gpt-oss's
//! harmony, whose grammar `super::harmony_grammar` writes.
//!
//! `required` and a named function constrain the whole reply to calls; `auto` is lazy: the reply
//! is free until the model writes the `<tool_call>` token, then the call is constrained, so a
//! call once started is always valid JSON whose arguments validate against the function's schema.

use serde_json::{json, Map, Value};

use super::FieldError;
use crate::constraint::trigger::CLOSERS;
use crate::constraint::{ConstraintSpec, Trigger};
use crate::tokenizer::Tokenizer;

/// One function the model may call.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    pub name: String,
    /// The JSON schema of its arguments (an object schema).
    pub parameters: Value,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

/// The tool fields of a chat request.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolRequest {
    pub tools: Vec<Tool>,
    /// `tools` as sent, for the chat template.
    pub raw: Value,
    pub choice: ToolChoice,
    pub parallel: bool,
}

/// How a chat template asks for tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>{"name": ..., "arguments": ...}</tool_call>` (Hermes, Qwen 2.5).
    Hermes,
    /// gpt-oss's harmony: a `commentary` message `to=functions.NAME` whose text is the
    /// arguments (`super::harmony`), constrained by `super::harmony_grammar`.
    Harmony,
}

pub const HERMES_OPEN: &str = "<tool_call>";
pub const HERMES_CLOSE: &str = "</tool_call>";

impl ToolFormat {
    /// The format a template's text teaches, if any.
    pub fn of_template(source: &str) -> Option<ToolFormat> {
        if source.contains(HERMES_OPEN) {
            Some(ToolFormat::Hermes)
        } else if super::harmony::template_speaks_harmony(source) {
            Some(ToolFormat::Harmony)
        } else {
            None
        }
    }
}

/// Reads `tools`, `tool_choice` and `parallel_tool_calls`; None when no tools are offered.
pub fn parse(body: &Map<String, Value>) -> Result<Option<ToolRequest>, FieldError> {
    let raw = match body.get("tools") {
        None | Some(Value::Null) => {
            if body
                .get("tool_choice")
                .is_some_and(|c| !c.is_null() && c != "none" && c != "auto")
            {
                return Err(FieldError::new(
                    "tool_choice",
                    "`tool_choice` needs `tools`",
                ));
            }
            return Ok(None);
        }
        Some(Value::Array(items)) if items.is_empty() => return Ok(None),
        Some(Value::Array(_)) => body["tools"].clone(),
        Some(_) => return Err(FieldError::new("tools", "`tools` must be an array")),
    };
    let mut tools = Vec::new();
    for (i, item) in raw.as_array().expect("checked").iter().enumerate() {
        let param = format!("tools[{i}]");
        if item.get("type").and_then(Value::as_str) != Some("function") {
            return Err(FieldError::new(
                &format!("{param}.type"),
                format!("`{param}.type` must be `function`"),
            ));
        }
        let Some(Value::Object(f)) = item.get("function") else {
            return Err(FieldError::new(
                &format!("{param}.function"),
                format!("`{param}.function` must be an object with `name` and `parameters`"),
            ));
        };
        let name = match f.get("name") {
            Some(Value::String(n))
                if !n.is_empty()
                    && n.len() <= 64
                    && n.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.') =>
            {
                n.clone()
            }
            _ => {
                return Err(FieldError::new(
                    &format!("{param}.function.name"),
                    format!(
                        "`{param}.function.name` must be 1-64 letters, digits, `_`, `-` or `.`"
                    ),
                ))
            }
        };
        if tools.iter().any(|t: &Tool| t.name == name) {
            return Err(FieldError::new(
                &format!("{param}.function.name"),
                format!("two tools are named `{name}`"),
            ));
        }
        let pparam = format!("{param}.function.parameters");
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(Value::Object(p)) => {
                match p.get("type") {
                    None => {}
                    Some(Value::String(t)) if t == "object" => {}
                    _ => {
                        return Err(FieldError::new(
                            &pparam,
                            format!("`{pparam}` must be an object schema (`\"type\": \"object\"`)"),
                        ))
                    }
                }
                if p.get("properties").is_some_and(|v| !v.is_object()) {
                    return Err(FieldError::new(
                        &pparam,
                        format!("`{pparam}.properties` must be an object"),
                    ));
                }
                let mut p = p.clone();
                p.insert("type".into(), json!("object"));
                let mut p = Value::Object(p);
                super::structured::close_objects(&mut p);
                if let Some(cycle) = super::schema_refs::ref_cycle(&p) {
                    return Err(FieldError::new(
                        &pparam,
                        format!(
                            "`{pparam}` has a `$ref` cycle ({cycle}): each refers to the next \
                             with nothing in between, so no JSON can match it"
                        ),
                    ));
                }
                p
            }
            Some(_) => {
                return Err(FieldError::new(
                    &pparam,
                    format!("`{pparam}` must be an object schema (`\"type\": \"object\"`)"),
                ))
            }
        };
        tools.push(Tool { name, parameters });
    }
    let choice = match body.get("tool_choice") {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(FieldError::new(
                    "tool_choice",
                    format!("`tool_choice` must be `none`, `auto`, `required` or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got `{other}`"),
                ))
            }
        },
        Some(Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    FieldError::new(
                        "tool_choice",
                        "`tool_choice` must name a function: {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    )
                })?;
            if !tools.iter().any(|t| t.name == name) {
                return Err(FieldError::new(
                    "tool_choice",
                    format!("`tool_choice` names `{name}`, which is not among `tools`"),
                ));
            }
            ToolChoice::Named(name.to_string())
        }
        Some(_) => {
            return Err(FieldError::new(
                "tool_choice",
                "`tool_choice` must be a string or an object",
            ))
        }
    };
    let parallel = match body.get("parallel_tool_calls") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(FieldError::new(
                "parallel_tool_calls",
                "`parallel_tool_calls` must be a boolean",
            ))
        }
    };
    Ok(Some(ToolRequest {
        tools,
        raw,
        choice,
        parallel,
    }))
}

/// The JSON schema of one call: `{"name": <one of the functions>, "arguments": <its schema>}`.
fn call_schema(tools: &[&Tool]) -> Value {
    let variants: Vec<Value> = tools
        .iter()
        .map(|t| {
            json!({
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                "required": ["name", "arguments"],
                "additionalProperties": false,
            })
        })
        .collect();
    if variants.len() == 1 {
        variants.into_iter().next().expect("one")
    } else {
        json!({"anyOf": variants})
    }
}

/// The grammar of the calls a request allows, and what triggers a lazy one (`auto`): the
/// `<tool_call>` token, or a call written without markup (a bare `{"name": ...}`, in a fence or
/// after another tag: `crate::constraint::trigger`), whose grammar then starts at its `{` and
/// allows the JSON laid out freely and a closing fence or tag. None for `tool_choice: none`.
pub fn grammar(
    req: &ToolRequest,
    format: ToolFormat,
    tok: &Tokenizer,
) -> Option<(ConstraintSpec, Option<Trigger>)> {
    if format == ToolFormat::Harmony {
        return super::harmony_grammar::grammar(req, tok).map(|spec| (spec, None));
    }
    let offered: Vec<&Tool> = match &req.choice {
        ToolChoice::None => return None,
        ToolChoice::Named(n) => req.tools.iter().filter(|t| &t.name == n).collect(),
        _ => req.tools.iter().collect(),
    };
    let open_id = tok.find_token(HERMES_OPEN);
    let close_id = tok.find_token(HERMES_CLOSE);
    let open = open_id.map_or_else(|| lark_string(HERMES_OPEN), |id| format!("<[{id}]>"));
    let close = close_id.map_or_else(|| lark_string(HERMES_CLOSE), |id| format!("<[{id}]>"));
    let schema = call_schema(&offered);
    let call = format!("%json {}", with_separators(schema.clone(), false));
    // Parallel calls: up to max_calls(), each further one optional (`more1` .. `moreN`), so a
    // small model that would repeat calls forever stops.
    let extra = if req.parallel { max_calls(req) - 1 } else { 0 };
    let mut rules = String::new();
    for k in (1..=extra).rev() {
        let next = if k == extra {
            String::new()
        } else {
            format!(" more{}?", k + 1)
        };
        rules.push_str(&format!(
            "more{k}: \"\\n\" {open} \"\\n\" call \"\\n\" {close}{next}\n"
        ));
    }
    let more = if extra > 0 { " more1?" } else { "" };
    if req.choice != ToolChoice::Auto {
        let src =
            format!("start: {open} \"\\n\" call \"\\n\" {close}{more}\n{rules}call: {call}\n");
        return Some((ConstraintSpec::Lark(src), None));
    }
    // Lazy: after the `<tool_call>` token, the Hermes layout; from a bare call's `{`, that call
    // laid out freely, then whitespace and a closing fence or tag at most.
    let closers: Vec<String> = CLOSERS.iter().map(|c| lark_string(c)).collect();
    let src = format!(
        "start: hermes | bare\n\
         hermes: \"\\n\" call \"\\n\" {close}{more}\n{rules}call: {call}\n\
         bare: free_call /[ \\t\\r\\n]*/ closer?\n\
         closer: {}\n\
         free_call: %json {}\n",
        closers.join(" | "),
        with_separators(schema, true),
    );
    let trigger = Trigger {
        token: open_id,
        names: offered.iter().map(|t| t.name.clone()).collect(),
    };
    Some((ConstraintSpec::Lark(src), Some(trigger)))
}

/// Most calls in one reply with `parallel_tool_calls`: the number of tools, at least 2, at most 8.
pub fn max_calls(req: &ToolRequest) -> usize {
    req.tools.len().clamp(2, 8)
}

/// The compact separators the templates write calls with, or (`free`) any whitespace, as a
/// call written without markup is often laid out over lines.
fn with_separators(mut schema: Value, free: bool) -> Value {
    if let Some(o) = schema.as_object_mut() {
        let options = if free {
            json!({"whitespace_flexible": true})
        } else {
            json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
        };
        o.insert("x-guidance".into(), options);
    }
    schema
}

fn lark_string(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    fn weather() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
    }

    #[test]
    fn tools_and_choices_are_checked() {
        assert_eq!(parse(&body(json!({}))).unwrap(), None);
        let r = parse(&body(json!({"tools": weather()}))).unwrap().unwrap();
        assert_eq!(r.choice, ToolChoice::Auto);
        assert!(r.parallel);
        assert_eq!(r.tools[0].name, "get_weather");
        let r = parse(&body(json!({"tools": weather(), "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "parallel_tool_calls": false})))
            .unwrap()
            .unwrap();
        assert_eq!(r.choice, ToolChoice::Named("get_weather".into()));
        assert!(!r.parallel);
        let e = parse(&body(json!({"tools": weather(), "tool_choice": {"type": "function", "function": {"name": "nope"}}})))
            .unwrap_err();
        assert_eq!(e.param, "tool_choice");
        let e = parse(&body(json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]})))
            .unwrap_err();
        assert_eq!(e.param, "tools[0].function.parameters");
        let e = parse(&body(
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]}),
        ))
        .unwrap_err();
        assert_eq!(e.param, "tools[0].function.parameters");
        let e = parse(&body(
            json!({"tools": weather(), "tool_choice": "sometimes"}),
        ))
        .unwrap_err();
        assert_eq!(e.param, "tool_choice");
        let e = parse(&body(json!({"tool_choice": "required"}))).unwrap_err();
        assert_eq!(e.param, "tool_choice");
    }
}

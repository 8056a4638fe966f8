//! The tool and output fields of a Responses API body, as chat's: `tools` (flat `function`
//! tools, `custom` tools as a function with one string parameter `input`, a `namespace`'s
//! function tools; built-in tools left out and named), `tool_choice`, and `text.format` as
//! `response_format`. Called by `responses::translate`.

use serde_json::{json, Value};

use super::request::type_name;
use super::responses::{invalid, str_field, Translated};
use super::RequestError;

/// `tools` as chat tools; fills `custom_tools`, `ignored_tools`, `tool_index` and the echo.
pub(super) fn tools(tools: Option<&Value>, t: &mut Translated) -> Result<Vec<Value>, RequestError> {
    let items = match tools {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(invalid(
                "tools",
                format!("`tools` must be an array, got {}", type_name(other)),
            ))
        }
    };
    let mut out = Vec::new();
    let mut echo = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let param = format!("tools[{i}]");
        let kind = str_field(item, "type", &param)?;
        match kind {
            "function" => {
                let (chat, flat) = function_tool(item, &param)?;
                if out
                    .iter()
                    .any(|o: &Value| o["function"]["name"] == chat["function"]["name"])
                {
                    t.ignored_tools.push(format!(
                        "{} (a second tool of that name)",
                        chat["function"]["name"]
                    ));
                    continue;
                }
                out.push(chat);
                echo.push(flat);
                t.tool_index.push(i);
            }
            "custom" => {
                let name = str_field(item, "name", &param)?.to_string();
                out.push(custom_tool(item, &name, &param)?);
                if let Some(format) = item.get("format").filter(|f| f["type"] == "grammar") {
                    let syntax = format["syntax"].as_str().unwrap_or("lark").to_string();
                    let definition = format["definition"].as_str().unwrap_or("").to_string();
                    t.custom_grammars.push((name.clone(), syntax, definition));
                }
                echo.push(item.clone());
                t.tool_index.push(i);
                t.custom_tools.push(name);
            }
            // A group of tools: its function tools are offered, the rest left out.
            "namespace" => {
                let nested = item.get("tools").and_then(Value::as_array);
                let before = out.len();
                for (k, nested) in nested.into_iter().flatten().enumerate() {
                    let p = format!("{param}.tools[{k}]");
                    if nested.get("type").and_then(Value::as_str) != Some("function") {
                        continue;
                    }
                    let (chat, flat) = function_tool(nested, &p)?;
                    if out
                        .iter()
                        .any(|o: &Value| o["function"]["name"] == chat["function"]["name"])
                    {
                        continue;
                    }
                    out.push(chat);
                    echo.push(flat);
                    t.tool_index.push(i);
                }
                if out.len() == before {
                    let name = item.get("name").and_then(Value::as_str).unwrap_or("");
                    t.ignored_tools
                        .push(format!("namespace {name} (no function tools in it)"));
                }
            }
            other => t.ignored_tools.push(other.to_string()),
        }
    }
    t.echo.insert("tools".into(), Value::Array(echo));
    Ok(out)
}

/// A flat Responses `function` tool as a chat tool, and as the response echoes it.
fn function_tool(item: &Value, param: &str) -> Result<(Value, Value), RequestError> {
    // The chat shape (`{"type": "function", "function": {...}}`) is taken as well.
    let f = item
        .get("function")
        .filter(|f| f.is_object())
        .unwrap_or(item);
    let name = str_field(f, "name", param)?;
    let mut function = json!({"name": name});
    for key in ["description", "parameters", "strict"] {
        if let Some(v) = f.get(key).filter(|v| !v.is_null()) {
            function[key] = v.clone();
        }
    }
    let flat = json!({"type": "function", "name": name,
                      "description": f.get("description").cloned().unwrap_or(Value::Null),
                      "parameters": f.get("parameters").cloned().unwrap_or(Value::Null),
                      "strict": f.get("strict").cloned().unwrap_or(Value::Null)});
    Ok((json!({"type": "function", "function": function}), flat))
}

/// A `custom` tool as a function with one string parameter, `input`. Its grammar is shown to
/// the model in the description; a regex grammar also constrains `input` (a JSON-schema
/// `pattern`), a Lark grammar does not (inside a JSON string) unless `tool_choice` names the
/// tool: then the whole reply is its input, under its grammar (`responses::translate`).
fn custom_tool(item: &Value, name: &str, param: &str) -> Result<Value, RequestError> {
    let mut description = item
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let mut input = json!({"type": "string", "description": "the tool's input, as free text"});
    match item.get("format") {
        None | Some(Value::Null) => {}
        Some(format) => match format.get("type").and_then(Value::as_str) {
            Some("text") => {}
            Some("grammar") => {
                let syntax = format
                    .get("syntax")
                    .and_then(Value::as_str)
                    .unwrap_or("lark");
                let definition = str_field(format, "definition", &format!("{param}.format"))?;
                description.push_str(&format!(
                    "\n\nThe `input` must follow this {syntax} grammar:\n{definition}"
                ));
                if syntax == "regex" {
                    input["pattern"] = json!(format!("^(?:{definition})$"));
                }
            }
            _ => {
                return Err(invalid(
                    &format!("{param}.format.type"),
                    format!("`{param}.format.type` must be `text` or `grammar`"),
                ))
            }
        },
    }
    Ok(json!({"type": "function", "function": {
        "name": name,
        "description": description,
        "parameters": {"type": "object", "properties": {"input": input},
                       "required": ["input"], "additionalProperties": false},
    }}))
}

/// `tool_choice` as chat's.
pub(super) fn tool_choice(choice: Option<&Value>) -> Result<Option<Value>, RequestError> {
    let bad = || {
        invalid(
            "tool_choice",
            "`tool_choice` must be `auto`, `none`, `required`, {\"type\": \"function\", \"name\": ...} or {\"type\": \"custom\", \"name\": ...}",
        )
    };
    Ok(match choice {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if ["auto", "none", "required"].contains(&s.as_str()) => {
            Some(json!(s))
        }
        Some(Value::Object(o)) => match o.get("type").and_then(Value::as_str) {
            Some("function" | "custom") => {
                let name = o
                    .get("name")
                    .or_else(|| o.get("function").and_then(|f| f.get("name")))
                    .and_then(Value::as_str)
                    .ok_or_else(bad)?;
                Some(json!({"type": "function", "function": {"name": name}}))
            }
            Some("allowed_tools") => match o.get("mode").and_then(Value::as_str) {
                Some("required") => Some(json!("required")),
                _ => Some(json!("auto")),
            },
            _ => return Err(bad()),
        },
        Some(_) => return Err(bad()),
    })
}

/// `text.format` as chat's `response_format` (None for plain text).
pub(super) fn text_format(text: Option<&Value>) -> Result<Option<Value>, RequestError> {
    let format = match text {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(o)) => match o.get("format") {
            None | Some(Value::Null) => return Ok(None),
            Some(f) => f,
        },
        Some(other) => {
            return Err(invalid(
                "text",
                format!("`text` must be an object, got {}", type_name(other)),
            ))
        }
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let mut schema =
                json!({"name": format.get("name").cloned().unwrap_or(json!("response"))});
            for key in ["schema", "strict", "description"] {
                if let Some(v) = format.get(key).filter(|v| !v.is_null()) {
                    schema[key] = v.clone();
                }
            }
            if schema.get("schema").is_none() {
                return Err(invalid(
                    "text.format.schema",
                    "`text.format.schema` is required with `type: json_schema`",
                ));
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": schema})))
        }
        _ => Err(invalid(
            "text.format.type",
            "`text.format.type` must be `text`, `json_object` or `json_schema`",
        )),
    }
}

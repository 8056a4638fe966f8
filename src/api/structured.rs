//! `response_format` (`text`, `json_object`, `json_schema`), and the extension fields `regex`,
//! `json_schema` (llama-server's: a schema) and `grammar` (llguidance's Lark syntax, or llama.cpp's GBNF, read into Lark by
//! `constraint::gbnf`): at most one constraint per request, compiled at
//! once so that a schema llguidance rejects, a bad regex or a bad grammar is a 400 naming the
//! field before anything is queued.

use serde_json::{Map, Value};

use super::{schema_keywords, schema_refs, FieldError};
use crate::constraint::{Constraint, ConstraintSpec, Grammars, Trigger};

/// The constraint a body asks for, and the field it came from; None when it asks for none.
pub fn spec(
    body: &Map<String, Value>,
) -> Result<Option<(ConstraintSpec, &'static str)>, FieldError> {
    let mut found: Vec<(ConstraintSpec, &'static str)> = Vec::new();
    if let Some(rf) = body.get("response_format").filter(|v| !v.is_null()) {
        if let Some(spec) = response_format(rf)? {
            found.push((spec, "response_format"));
        }
    }
    // llama-server's top-level `json_schema`: a schema, read as `response_format`'s is.
    if let Some(schema) = body.get("json_schema").filter(|v| !v.is_null()) {
        let mut schema = schema_object(schema, "json_schema")?;
        close_objects(&mut schema);
        found.push((ConstraintSpec::JsonSchema(schema), "json_schema"));
    }
    for (field, make) in [
        (
            "regex",
            ConstraintSpec::Regex as fn(String) -> ConstraintSpec,
        ),
        ("grammar", ConstraintSpec::Lark),
    ] {
        match body.get(field) {
            None | Some(Value::Null) => {}
            // llama.cpp's GBNF, read into Lark.
            Some(Value::String(s)) if field == "grammar" && crate::constraint::gbnf::is_gbnf(s) => {
                let lark = crate::constraint::gbnf::to_lark(s)
                    .map_err(|e| FieldError::new(field, format!("bad GBNF grammar: {e}")))?;
                found.push((make(lark), field));
            }
            Some(Value::String(s)) if !s.is_empty() => found.push((make(s.clone()), field)),
            Some(_) => {
                return Err(FieldError::new(
                    field,
                    format!("`{field}` must be a non-empty string"),
                ))
            }
        }
    }
    if found.len() > 1 {
        return Err(FieldError::new(
            found[1].1,
            format!(
                "`{}` and `{}` cannot be used together: give one constraint",
                found[0].1, found[1].1
            ),
        ));
    }
    Ok(found.pop())
}

/// `response_format`: `{"type": "text"}`, `{"type": "json_object"}` (llama.cpp's optional
/// `"schema"` beside it is honoured), or `{"type": "json_schema", "json_schema": {"name",
/// "schema", "strict"}}`.
fn response_format(rf: &Value) -> Result<Option<ConstraintSpec>, FieldError> {
    let param = "response_format";
    let Value::Object(rf) = rf else {
        return Err(FieldError::new(
            param,
            "`response_format` must be an object such as {\"type\": \"json_object\"}",
        ));
    };
    match rf.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => match rf.get("schema").filter(|v| !v.is_null()) {
            Some(schema) => {
                let mut schema = schema_object(schema, param)?;
                close_objects(&mut schema);
                Ok(Some(ConstraintSpec::JsonSchema(schema)))
            }
            None => Ok(Some(ConstraintSpec::JsonObject)),
        },
        Some("json_schema") => {
            let Some(Value::Object(js)) = rf.get("json_schema") else {
                return Err(FieldError::new(
                    "response_format.json_schema",
                    "`response_format.json_schema` must be an object with `name` and `schema`",
                ));
            };
            if let Some(name) = js.get("name") {
                if !name.is_string() {
                    return Err(FieldError::new(
                        "response_format.json_schema.name",
                        "`response_format.json_schema.name` must be a string",
                    ));
                }
            }
            let strict = js.get("strict").and_then(Value::as_bool).unwrap_or(false);
            match js.get("schema").filter(|v| !v.is_null()) {
                Some(schema) => {
                    let param = "response_format.json_schema.schema";
                    let mut schema = schema_object(schema, param)?;
                    if strict {
                        if let Some((keyword, at)) = schema_keywords::first_unknown(&schema, param) {
                            return Err(FieldError::new(
                                param,
                                format!(
                                    "`{param}`: `{keyword}` (in `{at}`) is not a JSON Schema keyword; \
                                     `strict: true` refuses unknown keywords"
                                ),
                            ));
                        }
                    }
                    // With or without `strict`, as llama.cpp does: an object allows no
                    // properties beyond those listed unless `additionalProperties` says so.
                    close_objects(&mut schema);
                    Ok(Some(ConstraintSpec::JsonSchema(schema)))
                }
                None => Ok(Some(ConstraintSpec::JsonObject)),
            }
        }
        Some(other) => Err(FieldError::new(
            "response_format.type",
            format!("`response_format.type` must be `text`, `json_object` or `json_schema`, got `{other}`"),
        )),
        None => Err(FieldError::new(
            "response_format.type",
            "`response_format.type` is required",
        )),
    }
}

/// Objects that do not say otherwise allow no properties beyond those listed
/// (`additionalProperties: false`), in every nested schema: OpenAI's strict mode, and
/// llama.cpp's rule for every schema (response formats and tool parameters alike).
pub fn close_objects(schema: &mut Value) {
    match schema {
        Value::Object(o) => {
            let is_object =
                o.get("type") == Some(&Value::from("object")) || o.contains_key("properties");
            if is_object && !o.contains_key("additionalProperties") {
                o.insert("additionalProperties".into(), Value::Bool(false));
            }
            for (key, v) in o.iter_mut() {
                // Values under `properties`, `$defs` and `definitions` are schemas keyed by
                // name; `enum`, `const` and `default` hold data, never schemas.
                if !matches!(key.as_str(), "enum" | "const" | "default" | "examples") {
                    close_objects(v);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(close_objects),
        _ => {}
    }
}

fn schema_object(schema: &Value, param: &str) -> Result<Value, FieldError> {
    match schema {
        Value::Object(_) | Value::Bool(true) => Ok(schema.clone()),
        _ => Err(FieldError::new(
            param,
            format!("`{param}` must be a JSON schema object"),
        )),
    }
}

/// Compiles `spec` for the model, the error naming `param`.
pub fn compile(
    grammars: &Grammars,
    spec: &ConstraintSpec,
    param: &str,
    trigger: Option<Trigger>,
    tenant: Option<u64>,
) -> Result<Constraint, FieldError> {
    let schema = match spec {
        ConstraintSpec::JsonSchema(schema) => Some(schema),
        ConstraintSpec::AfterThinking { inner, .. } => match inner.as_ref() {
            ConstraintSpec::JsonSchema(schema) => Some(schema),
            _ => None,
        },
        _ => None,
    };
    if let Some(cycle) = schema.and_then(schema_refs::ref_cycle) {
        return Err(FieldError::new(
            param,
            format!(
                "`{param}`: the JSON schema has a `$ref` cycle ({cycle}): each refers to the \
                 next with nothing in between, so no JSON can match it"
            ),
        ));
    }
    grammars.compile_for(spec, trigger, tenant).map_err(|e| {
        let unsupported = schema_keywords::unimplemented_in(&e);
        if let Some(keyword) = unsupported.first() {
            let at = match spec {
                ConstraintSpec::JsonSchema(schema) => {
                    schema_keywords::locate(schema, "schema", keyword)
                }
                ConstraintSpec::AfterThinking { inner, .. } => match inner.as_ref() {
                    ConstraintSpec::JsonSchema(schema) => {
                        schema_keywords::locate(schema, "schema", keyword)
                    }
                    _ => None,
                },
                _ => None,
            };
            let at = at.map(|p| format!(" (in `{p}`)")).unwrap_or_default();
            return FieldError::new(
                param,
                format!(
                    "`{param}`: the JSON schema keyword `{keyword}`{at} is not supported \
                     (llguidance: {e})"
                ),
            );
        }
        FieldError::new(
            param,
            format!("`{param}`: the {} cannot be used: {e}", describe(spec)),
        )
    })
}

fn describe(spec: &ConstraintSpec) -> &'static str {
    match spec {
        ConstraintSpec::JsonObject | ConstraintSpec::JsonSchema(_) => "JSON schema",
        ConstraintSpec::Regex(_) => "regular expression",
        ConstraintSpec::Lark(_) => "grammar",
        ConstraintSpec::AfterThinking { inner, .. } => describe(inner),
    }
}

/// The compiled constraint of a body (see [`spec`]).
pub fn constraint(
    grammars: &Grammars,
    body: &Map<String, Value>,
) -> Result<Option<Constraint>, FieldError> {
    match spec(body)? {
        None => Ok(None),
        Some((spec, param)) => compile(grammars, &spec, param, None, None).map(Some),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn response_formats_and_extension_fields() {
        assert_eq!(spec(&body(json!({}))).unwrap(), None);
        assert_eq!(
            spec(&body(json!({"response_format": {"type": "text"}}))).unwrap(),
            None
        );
        assert_eq!(
            spec(&body(json!({"response_format": {"type": "json_object"}}))).unwrap(),
            Some((ConstraintSpec::JsonObject, "response_format"))
        );
        // With or without strict: objects allow no properties beyond those listed, nested ones
        // too, unless `additionalProperties` opens them.
        let s = json!({"type": "object", "properties": {"a": {"type": "object"}}});
        let closed = json!({"type": "object", "additionalProperties": false,
            "properties": {"a": {"type": "object", "additionalProperties": false}}});
        assert_eq!(
            spec(&body(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": s, "strict": true}}})))
                .unwrap(),
            Some((ConstraintSpec::JsonSchema(closed.clone()), "response_format"))
        );
        assert_eq!(
            spec(&body(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": s}}})))
                .unwrap(),
            Some((ConstraintSpec::JsonSchema(closed), "response_format"))
        );
        let open = json!({"type": "object", "additionalProperties": true,
            "properties": {"a": {"type": "object", "additionalProperties": {"type": "integer"}}}});
        assert_eq!(
            spec(&body(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": open}}})))
                .unwrap(),
            Some((ConstraintSpec::JsonSchema(open), "response_format"))
        );
        assert_eq!(
            spec(&body(json!({"regex": "[a-z]+"}))).unwrap(),
            Some((ConstraintSpec::Regex("[a-z]+".into()), "regex"))
        );
        let e = spec(&body(json!({"regex": "a", "grammar": "start: \"a\""}))).unwrap_err();
        assert_eq!(e.param, "grammar");
        let e = spec(&body(json!({"response_format": {"type": "xml"}}))).unwrap_err();
        assert_eq!(e.param, "response_format.type");
        let e = spec(&body(json!({"regex": 5}))).unwrap_err();
        assert_eq!(e.param, "regex");
        let e = spec(&body(
            json!({"response_format": {"type": "json_schema", "json_schema": {"schema": [1]}}}),
        ))
        .unwrap_err();
        assert_eq!(e.param, "response_format.json_schema.schema");
    }
}

//! The keywords of a JSON schema, checked before llguidance compiles it, so that a 400 names
//! the keyword and where it sits:
//! - unknown keywords (in no JSON Schema draft: a typo such as `minLenght`) are refused under
//!   OpenAI's `strict: true`; without `strict` they are ignored, as JSON Schema says, and so are
//!   extensions (`x-...`) everywhere;
//! - keywords JSON Schema has but llguidance does not implement (`uniqueItems`, `contains`,
//!   `if`, `not`, ...) are refused by llguidance itself ("Unimplemented keys"); [`locate`] finds
//!   where such a keyword sits for the message.

use serde_json::Value;

/// Every keyword of JSON Schema drafts 4 to 2020-12 (core, applicator, validation, format,
/// content, meta-data, unevaluated), plus llguidance's `x-guidance`.
const KNOWN: [&str; 62] = [
    "$schema",
    "$id",
    "id",
    "$ref",
    "$anchor",
    "$dynamicRef",
    "$dynamicAnchor",
    "$recursiveRef",
    "$recursiveAnchor",
    "$vocabulary",
    "$comment",
    "$defs",
    "definitions",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "if",
    "then",
    "else",
    "dependentSchemas",
    "dependencies",
    "prefixItems",
    "items",
    "additionalItems",
    "contains",
    "properties",
    "patternProperties",
    "additionalProperties",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
    "type",
    "enum",
    "const",
    "multipleOf",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "maxLength",
    "minLength",
    "pattern",
    "maxItems",
    "minItems",
    "uniqueItems",
    "maxContains",
    "minContains",
    "maxProperties",
    "minProperties",
    "required",
    "dependentRequired",
    "format",
    "contentEncoding",
    "contentMediaType",
    "contentSchema",
    "title",
    "description",
    "default",
    "deprecated",
    "readOnly",
    "writeOnly",
];

/// Keywords whose value is one schema.
const ONE_SCHEMA: [&str; 12] = [
    "not",
    "if",
    "then",
    "else",
    "items",
    "additionalItems",
    "contains",
    "additionalProperties",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contentSchema",
];
/// Keywords whose value is an array of schemas.
const SCHEMA_ARRAYS: [&str; 5] = ["allOf", "anyOf", "oneOf", "prefixItems", "items"];
/// Keywords whose value maps names to schemas.
const SCHEMA_MAPS: [&str; 6] = [
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
    "dependencies",
];

fn is_known(keyword: &str) -> bool {
    KNOWN.contains(&keyword) || keyword == "examples" || keyword.starts_with("x-")
}

/// Calls `visit(keyword, path)` for every keyword of every schema in `schema` (data under
/// `enum`, `const`, `default` and `examples` is not visited); stops at the first Some.
fn walk<T>(
    schema: &Value,
    path: &str,
    visit: &mut impl FnMut(&str, &str) -> Option<T>,
) -> Option<T> {
    let Value::Object(map) = schema else {
        return None;
    };
    for (key, value) in map {
        if let Some(found) = visit(key, path) {
            return Some(found);
        }
        let here = format!("{path}.{key}");
        let found = match value {
            Value::Object(_) if ONE_SCHEMA.contains(&key.as_str()) => walk(value, &here, visit),
            Value::Array(items) if SCHEMA_ARRAYS.contains(&key.as_str()) => items
                .iter()
                .enumerate()
                .find_map(|(i, v)| walk(v, &format!("{here}[{i}]"), visit)),
            Value::Object(entries) if SCHEMA_MAPS.contains(&key.as_str()) => entries
                .iter()
                .find_map(|(name, v)| walk(v, &format!("{here}.{name}"), visit)),
            _ => None,
        };
        if found.is_some() {
            return found;
        }
    }
    None
}

/// The first keyword in no JSON Schema draft, and the path of the schema holding it (`param`
/// followed by the keys leading there).
pub fn first_unknown(schema: &Value, param: &str) -> Option<(String, String)> {
    walk(schema, param, &mut |key, path| {
        (!is_known(key)).then(|| (key.to_string(), path.to_string()))
    })
}

/// Where `keyword` first sits in `schema` (the path of the schema holding it).
pub fn locate(schema: &Value, param: &str, keyword: &str) -> Option<String> {
    walk(schema, param, &mut |key, path| {
        (key == keyword).then(|| path.to_string())
    })
}

/// The keywords llguidance's "Unimplemented keys: [\"a\", \"b\"]" message names.
pub fn unimplemented_in(message: &str) -> Vec<String> {
    let Some(rest) = message.split("Unimplemented keys: ").nth(1) else {
        return Vec::new();
    };
    let list = rest.split(']').next().unwrap_or("");
    serde_json::from_str::<Vec<String>>(&format!("{list}]")).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_keywords_and_where_they_sit() {
        let s = json!({"type": "object", "x-note": 1, "properties": {
            "tags": {"type": "array", "items": {"type": "string", "minLenght": 2}},
            "kind": {"enum": [{"weird": 1}]}}});
        assert_eq!(
            first_unknown(&s, "schema"),
            Some(("minLenght".into(), "schema.properties.tags.items".into()))
        );
        assert_eq!(
            first_unknown(&json!({"anyOf": [{"type": "string"}]}), "s"),
            None
        );
        assert_eq!(
            locate(
                &json!({"anyOf": [{"uniqueItems": true}]}),
                "s",
                "uniqueItems"
            ),
            Some("s.anyOf[0]".into())
        );
        assert_eq!(
            unimplemented_in("JSON schema error: Unimplemented keys: [\"contains\", \"not\"] at x"),
            vec!["contains".to_string(), "not".to_string()]
        );
    }
}

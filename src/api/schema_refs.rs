//! `$ref` cycles in a JSON schema, found before llguidance compiles it: a `$ref` that comes back
//! to itself through `$ref`, `allOf`, `anyOf` and `oneOf` alone (no object or array in between)
//! stands for no JSON at all, and llguidance only fails on it at the first token. Recursion
//! through `properties` or `items` (a linked list, a tree) is fine and is not refused. Called by
//! `structured::compile` and `tools::parse`.

use std::collections::HashSet;

use serde_json::Value;

/// The first `$ref` cycle in `schema`, as the refs in order with the first repeated at the end
/// (`#/$defs/a -> #/$defs/b -> #/$defs/a`); None when there is none.
pub fn ref_cycle(schema: &Value) -> Option<String> {
    let mut done = HashSet::new();
    let mut starts = Vec::new();
    subschemas(schema, &mut starts);
    starts
        .into_iter()
        .find_map(|s| visit(schema, s, &mut Vec::new(), &mut done))
        .map(|cycle| cycle.join(" -> "))
}

/// Every object in `node` that may be a schema (not inside `enum`, `const`, `default`,
/// `examples`).
fn subschemas<'a>(node: &'a Value, out: &mut Vec<&'a Value>) {
    match node {
        Value::Object(o) => {
            out.push(node);
            for (key, v) in o {
                if !matches!(key.as_str(), "enum" | "const" | "default" | "examples") {
                    subschemas(v, out);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| subschemas(v, out)),
        _ => {}
    }
}

/// Follows `node`'s `$ref` and its `allOf`/`anyOf`/`oneOf` members; `path` holds the refs
/// followed so far, `done` the refs known to lead to no cycle.
fn visit(
    root: &Value,
    node: &Value,
    path: &mut Vec<String>,
    done: &mut HashSet<String>,
) -> Option<Vec<String>> {
    let Value::Object(o) = node else {
        return None;
    };
    if let Some(Value::String(r)) = o.get("$ref") {
        if let Some(i) = path.iter().position(|p| p == r) {
            let mut cycle = path[i..].to_vec();
            cycle.push(r.clone());
            return Some(cycle);
        }
        if !done.contains(r) {
            let target = r.strip_prefix('#').and_then(|p| root.pointer(p));
            if let Some(target) = target {
                path.push(r.clone());
                let found = visit(root, target, path, done);
                path.pop();
                if found.is_some() {
                    return found;
                }
            }
            done.insert(r.clone());
        }
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        if let Some(Value::Array(items)) = o.get(key) {
            for item in items {
                if let Some(cycle) = visit(root, item, path, done) {
                    return Some(cycle);
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn cycles_through_refs_alone_are_found_and_recursion_through_properties_is_not() {
        let two = json!({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"anyOf": [{"$ref": "#/$defs/a"}]}}});
        assert_eq!(
            ref_cycle(&two).as_deref(),
            Some("#/$defs/a -> #/$defs/b -> #/$defs/a")
        );
        let list = json!({"$ref": "#/$defs/n", "$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}}});
        assert_eq!(ref_cycle(&list), None);
    }
}

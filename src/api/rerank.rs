//! Rerank bodies, as llama-server's `POST /v1/rerank` reads them: Jina's shape (`query`,
//! `documents`, `top_n`; plus Cohere's and Jina's `return_documents`) and TEI's (`query`,
//! `texts`, `return_text`). [`response`] sorts the scores, best first, and writes them back in
//! the body's shape. Called by `crate::server::rerank`.

use serde_json::{json, Map, Value};

use super::request::type_name;
use super::RequestError;

/// A rerank body read.
#[derive(Clone, Debug)]
pub struct RerankPlan {
    pub query: String,
    pub documents: Vec<String>,
    /// Keep the best this many results (default: all).
    pub top_n: usize,
    /// Jina/Cohere: each result carries `document: {text}`.
    pub return_documents: bool,
    /// TEI's shape (`texts` given): a bare list of `{index, score}` (and `text` with
    /// `return_text`).
    pub tei: bool,
    pub return_text: bool,
    /// The `model` the body named, echoed back.
    pub model: Option<String>,
}

fn flag(map: &Map<String, Value>, name: &str) -> Result<bool, RequestError> {
    match map.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(RequestError::invalid(
            name,
            format!("\"{name}\" must be a boolean, not {}", type_name(v)),
        )),
    }
}

/// Reads a rerank body; every bad field is a one-line error naming it.
pub fn plan(map: &Map<String, Value>) -> Result<RerankPlan, RequestError> {
    let query = match map.get("query") {
        Some(Value::String(q)) => q.clone(),
        Some(v) => {
            return Err(RequestError::invalid(
                "query",
                format!("\"query\" must be a string, not {}", type_name(v)),
            ))
        }
        None => return Err(RequestError::invalid("query", "\"query\" must be provided")),
    };
    let tei = !map.contains_key("documents") && map.contains_key("texts");
    let field = if tei { "texts" } else { "documents" };
    let empty = || {
        RequestError::invalid(
            field,
            format!("\"{field}\" must be a non-empty string array"),
        )
    };
    let documents = match map.get(field) {
        Some(Value::Array(items)) if !items.is_empty() => items
            .iter()
            .enumerate()
            .map(|(i, d)| match d {
                Value::String(s) => Ok(s.clone()),
                other => Err(RequestError::invalid(
                    field,
                    format!(
                        "\"{field}[{i}]\" must be a string, not {}",
                        type_name(other)
                    ),
                )),
            })
            .collect::<Result<Vec<_>, _>>()?,
        _ => return Err(empty()),
    };
    let top_n = match map.get("top_n") {
        None | Some(Value::Null) => documents.len(),
        Some(v) => v.as_u64().map(|n| n as usize).ok_or_else(|| {
            RequestError::invalid("top_n", "\"top_n\" must be a non-negative integer")
        })?,
    };
    let model = match map.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(m)) => Some(m.clone()),
        Some(v) => {
            return Err(RequestError::invalid(
                "model",
                format!("\"model\" must be a string, not {}", type_name(v)),
            ))
        }
    };
    Ok(RerankPlan {
        query,
        documents,
        top_n,
        return_documents: flag(map, "return_documents")?,
        tei,
        return_text: flag(map, "return_text")?,
        model,
    })
}

/// The answer for `scores` (each document's score and its pair's token count, in document
/// order): results best first (ties in document order), the best `top_n` kept.
pub fn response(plan: &RerankPlan, scores: &[(f32, usize)], model_id: &str) -> Value {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].0.total_cmp(&scores[a].0));
    order.truncate(plan.top_n);
    let num_tokens: usize = scores.iter().map(|s| s.1).sum();
    let label = if plan.tei { "score" } else { "relevance_score" };
    let results: Vec<Value> = order
        .iter()
        .map(|&i| {
            let mut r = json!({"index": i, label: scores[i].0 as f64});
            if plan.tei && plan.return_text {
                r["text"] = json!(plan.documents[i]);
            }
            if !plan.tei && plan.return_documents {
                r["document"] = json!({"text": plan.documents[i]});
            }
            r
        })
        .collect();
    if plan.tei {
        return Value::Array(results);
    }
    json!({
        "model": plan.model.as_deref().unwrap_or(model_id),
        "object": "list",
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
        "results": results,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn sorts_best_first_and_keeps_top_n() {
        let p = plan(&body(
            json!({"query": "q", "documents": ["a", "b", "c"], "top_n": 2,
            "return_documents": true}),
        ))
        .unwrap();
        let r = response(&p, &[(0.1, 3), (0.9, 4), (0.5, 5)], "m");
        assert_eq!(r["usage"]["prompt_tokens"], 12);
        let idx: Vec<u64> = r["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["index"].as_u64().unwrap())
            .collect();
        assert_eq!(idx, [1, 2]);
        assert_eq!(r["results"][0]["document"]["text"], "b");
        assert_eq!(r["model"], "m");
    }

    #[test]
    fn bad_fields_name_themselves() {
        for (b, field) in [
            (json!({"documents": ["a"]}), "query"),
            (json!({"query": 1, "documents": ["a"]}), "query"),
            (json!({"query": "q", "documents": []}), "documents"),
            (json!({"query": "q"}), "documents"),
            (json!({"query": "q", "documents": ["a", 2]}), "documents"),
            (
                json!({"query": "q", "documents": ["a"], "top_n": -1}),
                "top_n",
            ),
            (
                json!({"query": "q", "documents": ["a"], "return_documents": "yes"}),
                "return_documents",
            ),
        ] {
            let e = plan(&body(b.clone())).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(field), "{b}");
            assert!(!e.message.contains('\n'));
        }
    }

    #[test]
    fn tei_shape() {
        let p = plan(&body(
            json!({"query": "q", "texts": ["a", "b"], "return_text": true}),
        ))
        .unwrap();
        let r = response(&p, &[(0.1, 1), (0.2, 1)], "m");
        assert_eq!(
            r,
            json!([{"index": 1, "score": 0.2f32 as f64, "text": "b"}, {"index": 0, "score": 0.1f32 as f64, "text": "a"}])
        );
    }
}

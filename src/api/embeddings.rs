//! Embedding bodies, read by the rules every face shares: OpenAI's `POST /v1/embeddings`
//! (`input`, `encoding_format`, `dimensions`, `model`) and llama-server's `POST /embedding`
//! (`content`), with llama-server's `embd_normalize`; the inputs become token prompts as
//! llama-server's `tokenize_input_prompts` makes them (a string, a list of token ids, or a list
//! of either). [`response`] writes the pooled vectors back in the route's shape. Called by
//! `crate::server::embeddings` and the `edge-llm embed` pipe.

use serde_json::{json, Map, Value};

use super::request::type_name;
use super::RequestError;
use crate::model::pooling::{normalize, Pooling};
use crate::tokenizer::Tokenizer;

/// Which route's shapes a body and its response take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// `/v1/embeddings`: `{object: "list", data: [{object, index, embedding}], model, usage}`.
    OpenAi,
    /// llama-server's `/embedding`: `[{index, embedding: [[...], ...]}]`, every token's vector
    /// with pooling none.
    Llama,
}

/// What the server knows that a body does not.
pub struct EmbeddingSetting<'a> {
    pub tokenizer: &'a Tokenizer,
    pub pooling: Pooling,
    /// `--embd-normalize`: llama.cpp's normalization of pooled vectors.
    pub normalize: i32,
    pub n_embd: usize,
    /// The most tokens one input may have.
    pub max_seq_len: usize,
}

/// A body read: its prompts and how to write their vectors.
#[derive(Clone, Debug)]
pub struct EmbeddingsPlan {
    pub prompts: Vec<Vec<u32>>,
    pub shape: Shape,
    /// `encoding_format: "base64"`: each vector as its little-endian f32 bytes in base64.
    pub base64: bool,
    /// Keep the first this many values of each vector, normalized again.
    pub dimensions: Option<usize>,
    /// llama.cpp's normalization (`embd_normalize`): -1 none, 0 max-abs int16, 2 euclidean,
    /// p the p-norm; pooled vectors only.
    pub normalize: i32,
    pub pooling: Pooling,
    /// The `model` the body named, echoed back.
    pub model: Option<String>,
}

/// Reads a body: `input` (or, llama-server's, `content`: then the response takes
/// [`Shape::Llama`] whatever the route) and the options, and tokenizes every input.
pub fn plan(
    map: &Map<String, Value>,
    s: &EmbeddingSetting,
    route: Shape,
) -> Result<EmbeddingsPlan, RequestError> {
    let (field, input, shape) = match (map.get("input"), map.get("content")) {
        (Some(v), _) => ("input", v, route),
        (None, Some(v)) => ("content", v, Shape::Llama),
        (None, None) => {
            return Err(RequestError::invalid(
                "input",
                "\"input\" or \"content\" must be provided",
            ))
        }
    };
    if shape == Shape::OpenAi && s.pooling == Pooling::None {
        return Err(RequestError::invalid(
            field,
            "pooling type 'none' is not OAI compatible; start the server with --pooling mean, cls or last, or use /embedding",
        ));
    }
    let base64 = match map.get("encoding_format") {
        None | Some(Value::Null) => false,
        Some(Value::String(f)) if f == "float" => false,
        Some(Value::String(f)) if f == "base64" => true,
        Some(other) => {
            return Err(RequestError::invalid(
                "encoding_format",
                format!("encoding_format must be \"float\" or \"base64\", not {other}"),
            ))
        }
    };
    let dimensions = match map.get("dimensions") {
        None | Some(Value::Null) => None,
        Some(v) => Some(dimensions(v, s)?),
    };
    let normalize = match map.get("embd_normalize") {
        None | Some(Value::Null) => s.normalize,
        Some(v) => v
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .ok_or_else(|| {
                RequestError::invalid("embd_normalize", "embd_normalize must be an integer")
            })?,
    };
    let model = match map.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(m)) => Some(m.clone()),
        Some(other) => {
            return Err(RequestError::invalid(
                "model",
                format!("model must be a string, not {}", type_name(other)),
            ))
        }
    };
    let prompts = prompts(field, input, s)?;
    Ok(EmbeddingsPlan {
        prompts,
        shape,
        base64,
        dimensions,
        normalize,
        pooling: s.pooling,
        model,
    })
}

/// `dimensions`: an integer from 1 to n_embd, with a pooled vector.
fn dimensions(v: &Value, s: &EmbeddingSetting) -> Result<usize, RequestError> {
    let n = v.as_u64().filter(|&n| n >= 1).ok_or_else(|| {
        RequestError::invalid("dimensions", "dimensions must be a positive integer")
    })?;
    if n as usize > s.n_embd {
        return Err(RequestError::invalid(
            "dimensions",
            format!(
                "dimensions {n} is larger than the model's {} (n_embd)",
                s.n_embd
            ),
        ));
    }
    if s.pooling == Pooling::None {
        return Err(RequestError::invalid(
            "dimensions",
            "dimensions needs a pooled vector (the server's pooling is none)",
        ));
    }
    Ok(n as usize)
}

/// The inputs as prompts: a string; a list of token ids (one prompt); or a list whose items
/// are strings or lists of token ids (one prompt each).
fn prompts(
    field: &str,
    input: &Value,
    s: &EmbeddingSetting,
) -> Result<Vec<Vec<u32>>, RequestError> {
    let items: Vec<&Value> = match input {
        Value::Array(a) if a.is_empty() => {
            return Err(RequestError::invalid(
                field,
                format!("\"{field}\" must not be empty"),
            ))
        }
        Value::Array(a) if a.iter().all(Value::is_number) => vec![input],
        Value::Array(a) => a.iter().collect(),
        other => vec![other],
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            let name = if matches!(input, Value::Array(a) if !a.iter().all(Value::is_number)) {
                format!("{field}[{i}]")
            } else {
                field.to_string()
            };
            let prompt = one_prompt(&name, item, s)?;
            if prompt.is_empty() {
                return Err(RequestError::invalid(
                    &name,
                    "input content cannot be empty",
                ));
            }
            if prompt.len() > s.max_seq_len {
                return Err(RequestError::invalid(
                    &name,
                    format!(
                        "the input has {} tokens, more than the context holds ({})",
                        prompt.len(),
                        s.max_seq_len
                    ),
                ));
            }
            Ok(prompt)
        })
        .collect()
}

/// One input: a string (tokenized as llama.cpp does, special tokens added and parsed) or a
/// list of token ids inside the vocabulary.
fn one_prompt(name: &str, item: &Value, s: &EmbeddingSetting) -> Result<Vec<u32>, RequestError> {
    let tok = s.tokenizer;
    match item {
        Value::String(text) if text.is_empty() => Ok(Vec::new()),
        Value::String(text) => tok
            .encode(text, tok.add_bos_default(), true)
            .map_err(|e| RequestError::invalid(name, format!("cannot tokenize: {e:#}"))),
        Value::Array(ids) => ids
            .iter()
            .map(|v| {
                v.as_u64()
                    .filter(|&id| (id as usize) < tok.vocab_size())
                    .map(|id| id as u32)
                    .ok_or_else(|| {
                        RequestError::invalid(
                            name,
                            format!(
                                "token ids must be integers below the vocabulary size {}, got {v}",
                                tok.vocab_size()
                            ),
                        )
                    })
            })
            .collect(),
        other => Err(RequestError::invalid(
            name,
            format!(
                "an input must be a string or a list of token ids, not {}",
                type_name(other)
            ),
        )),
    }
}

/// One input's pooled vector (or every token's, pooling none) made ready to send: cut to
/// `dimensions`, then normalized as the body asked (pooled vectors only, as llama-server).
pub fn finish_vectors(plan: &EmbeddingsPlan, mut vectors: Vec<Vec<f32>>) -> Vec<Vec<f32>> {
    if plan.pooling == Pooling::None {
        return vectors;
    }
    for v in &mut vectors {
        if let Some(d) = plan.dimensions {
            v.truncate(d);
        }
        normalize(v, plan.normalize);
    }
    vectors
}

/// The response body of `results` (per prompt: its vectors as [`finish_vectors`] made them,
/// and its prompt's tokens) for a server serving `model_id`.
pub fn response(
    plan: &EmbeddingsPlan,
    results: Vec<(Vec<Vec<f32>>, usize)>,
    model_id: &str,
) -> Value {
    let num_tokens: usize = results.iter().map(|(_, n)| n).sum();
    match plan.shape {
        Shape::Llama => Value::Array(
            results
                .into_iter()
                .enumerate()
                .map(|(index, (vectors, _))| json!({"index": index, "embedding": vectors}))
                .collect(),
        ),
        Shape::OpenAi => {
            let data: Vec<Value> = results
                .into_iter()
                .enumerate()
                .map(|(index, (mut vectors, _))| {
                    let v = vectors.swap_remove(0);
                    if plan.base64 {
                        json!({"object": "embedding", "index": index, "embedding": base64_f32(&v), "encoding_format": "base64"})
                    } else {
                        json!({"object": "embedding", "index": index, "embedding": v})
                    }
                })
                .collect();
            json!({
                "object": "list",
                "data": data,
                "model": plan.model.as_deref().unwrap_or(model_id),
                "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
            })
        }
    }
}

/// A vector as OpenAI's base64 encoding: its little-endian f32 bytes, in standard base64
/// with padding.
pub fn base64_f32(v: &[f32]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_of_f32_bytes() {
        // 1.0f32 is 00 00 80 3f little-endian; -2.5 is 00 00 20 c0.
        assert_eq!(base64_f32(&[1.0]), "AACAPw==");
        assert_eq!(base64_f32(&[1.0, -2.5]), "AACAPwAAIMA=");
        assert_eq!(base64_f32(&[1.0, -2.5, 0.0]), "AACAPwAAIMAAAAAA");
    }
}

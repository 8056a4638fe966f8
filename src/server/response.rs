//! OpenAI response bodies from engine events: the whole-response JSON of `/v1/completions`
//! and `/v1/chat/completions` (after [`collect`] has gathered every choice), the chunk JSON
//! that `stream` sends, `usage`, and both endpoints' `logprobs` layouts.

use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::{json, Value};

use super::error::ApiError;
use crate::api::request::Endpoint;
use crate::engine::{Event, FinishReason, RequestStream, TokenLogprobs, Usage};
use crate::tokenizer::Tokenizer;

/// What every body of one response shares.
#[derive(Clone, Debug)]
pub struct Reply {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Reply {
    /// `object` of a whole response, and of a streamed chunk.
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
        }
    }

    /// A streamed chunk carrying `choices` (and `usage` when given).
    pub fn chunk(&self, choices: Vec<Value>, usage: Option<Value>) -> Value {
        let mut v = json!({"id": self.id, "object": self.object(true), "created": self.created, "model": self.model, "choices": choices});
        if let Some(u) = usage {
            v["usage"] = u;
        }
        v
    }
}

/// One completion as gathered from its events.
#[derive(Clone, Debug, Default)]
pub struct Choice {
    pub text: String,
    pub finish: Option<FinishReason>,
    pub usage: Usage,
    /// Sampled tokens and their log-probabilities, when asked for.
    pub logprobs: Vec<(u32, TokenLogprobs)>,
    /// The prompt's tokens and scores (`echo`), shared by every choice.
    pub prompt: Option<Arc<PromptScores>>,
}

/// A prompt's tokens and each one's log-probability given those before it (the first none).
#[derive(Clone, Debug, Default)]
pub struct PromptScores {
    pub tokens: Vec<u32>,
    pub logprobs: Vec<Option<TokenLogprobs>>,
}

/// Waits for every completion of the request.
pub async fn collect(stream: &mut RequestStream, n: usize) -> Result<Vec<Choice>, ApiError> {
    let mut choices = vec![Choice::default(); n];
    while let Some(event) = stream.next().await {
        match event {
            Event::Prompt { tokens, logprobs } => {
                let prompt = Arc::new(PromptScores { tokens, logprobs });
                for c in &mut choices {
                    c.prompt = Some(prompt.clone());
                }
            }
            Event::Token {
                index,
                token,
                text,
                logprobs,
            } => {
                if let Some(c) = choices.get_mut(index) {
                    c.text.push_str(&text);
                    c.logprobs.extend(logprobs.map(|lp| (token, lp)));
                }
            }
            Event::Finished {
                index,
                reason,
                text,
                usage,
            } => {
                if let Some(c) = choices.get_mut(index) {
                    c.text.push_str(&text);
                    c.finish = Some(reason);
                    c.usage = usage;
                }
            }
            Event::Error(e) => return Err(generation_error(&e)),
        }
    }
    Ok(choices)
}

/// The error of a request the engine ended: a 400 when the request's own constraint failed
/// (its grammar exceeded llguidance's per-token budget, or allows no token), else a 500.
pub fn generation_error(e: &str) -> ApiError {
    if crate::constraint::is_constraint_error(e) {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!("generation stopped: {e}"),
        )
        .with_code("constraint_failed")
    } else {
        ApiError::internal(format!("generation failed: {e}"))
    }
}

pub fn finish_str(reason: Option<FinishReason>) -> Value {
    reason.map_or(Value::Null, |r| Value::from(r.as_str()))
}

/// `usage` over all choices of one prompt.
pub fn usage_json(usages: &[Usage]) -> Value {
    let prompt = usages.iter().map(|u| u.prompt_tokens).max().unwrap_or(0);
    let completion: usize = usages.iter().map(|u| u.completion_tokens).sum();
    let cached = usages.iter().map(|u| u.cached_tokens).max().unwrap_or(0);
    // Where the cached tokens came from (an extension): the first choice's split, as every
    // choice shares the one prompt.
    let (disk, pinned) = usages
        .iter()
        .find(|u| u.cached_tokens == cached)
        .map_or((0, 0), |u| (u.cached_disk_tokens, u.cached_pinned_tokens));
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {
            "cached_tokens": cached,
            "cached_tokens_sources": {
                "memory": cached - disk - pinned,
                "disk": disk,
                "pinned": pinned,
            },
        },
    })
}

/// The body of a non-streamed response.
pub fn full_response(
    reply: &Reply,
    tok: &Tokenizer,
    choices: &[Choice],
    with_logprobs: bool,
) -> Value {
    let body: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(index, c)| {
            let logprobs = if with_logprobs {
                match reply.endpoint {
                    Endpoint::Completions => {
                        let echoed = c.prompt.as_deref().map(|p| prompt_entries(p));
                        let generated = c.logprobs.iter().map(|(id, l)| (*id, Some(l)));
                        let entries = echoed.into_iter().flatten().chain(generated);
                        legacy_logprobs(tok, entries, &mut 0)
                    }
                    Endpoint::Chat => json!({"content": chat_logprobs(tok, &c.logprobs)}),
                }
            } else {
                Value::Null
            };
            match reply.endpoint {
                Endpoint::Completions => {
                    let echoed = c.prompt.as_deref().map(|p| echo_text(tok, &p.tokens));
                    let text = echoed.unwrap_or_default() + &c.text;
                    json!({"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_str(c.finish)})
                }
                Endpoint::Chat => json!({
                    "index": index,
                    "message": {"role": "assistant", "content": c.text},
                    "logprobs": logprobs,
                    "finish_reason": finish_str(c.finish),
                }),
            }
        })
        .collect();
    let usages: Vec<Usage> = choices.iter().map(|c| c.usage).collect();
    json!({
        "id": reply.id,
        "object": reply.object(false),
        "created": reply.created,
        "model": reply.model,
        "choices": body,
        "usage": usage_json(&usages),
    })
}

/// A log-probability as JSON (OpenAI writes -9999 for impossible tokens).
fn lp(v: f32) -> Value {
    json!(if v.is_finite() { v } else { -9999.0 })
}

fn piece(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tok.token_bytes(id);
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// The legacy completions layout: parallel arrays, `top_logprobs` as objects keyed by token
/// text, and each token's offset in the completion text (`offset` carries on across chunks).
pub fn completion_logprobs(
    tok: &Tokenizer,
    entries: &[(u32, TokenLogprobs)],
    offset: &mut usize,
) -> Value {
    legacy_logprobs(tok, entries.iter().map(|(id, l)| (*id, Some(l))), offset)
}

/// The prompt's entries for the legacy layout (`echo`): the first token has no score.
pub fn prompt_entries(p: &PromptScores) -> impl Iterator<Item = (u32, Option<&TokenLogprobs>)> {
    p.tokens
        .iter()
        .copied()
        .zip(p.logprobs.iter().map(Option::as_ref))
}

/// The prompt's text as echoed: its tokens' pieces, so that `text_offset` indexes it.
pub fn echo_text(tok: &Tokenizer, tokens: &[u32]) -> String {
    let bytes: Vec<u8> = tokens.iter().flat_map(|&t| tok.token_bytes(t)).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// [`completion_logprobs`] over entries that may have no score (an echoed prompt's first
/// token: `null` in `token_logprobs` and `top_logprobs`, as OpenAI and vLLM write it).
pub fn legacy_logprobs<'a>(
    tok: &Tokenizer,
    entries: impl Iterator<Item = (u32, Option<&'a TokenLogprobs>)>,
    offset: &mut usize,
) -> Value {
    let (mut tokens, mut token_logprobs, mut top_logprobs, mut text_offset) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (id, l) in entries {
        let (text, bytes) = piece(tok, id);
        text_offset.push(*offset);
        *offset += bytes.len();
        tokens.push(Value::from(text));
        let Some(l) = l else {
            token_logprobs.push(Value::Null);
            top_logprobs.push(Value::Null);
            continue;
        };
        token_logprobs.push(lp(l.logprob));
        let top: serde_json::Map<String, Value> = l
            .top
            .iter()
            .map(|&(t, v)| (piece(tok, t).0, lp(v)))
            .collect();
        top_logprobs.push(Value::Object(top));
    }
    json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs, "text_offset": text_offset})
}

/// The chat layout: one object per token with its bytes and its alternatives.
pub fn chat_logprobs(tok: &Tokenizer, entries: &[(u32, TokenLogprobs)]) -> Vec<Value> {
    entries
        .iter()
        .map(|(id, l)| {
            let (text, bytes) = piece(tok, *id);
            let top: Vec<Value> = l
                .top
                .iter()
                .map(|&(t, v)| {
                    let (text, bytes) = piece(tok, t);
                    json!({"token": text, "logprob": lp(v), "bytes": bytes})
                })
                .collect();
            json!({"token": text, "logprob": lp(l.logprob), "bytes": bytes, "top_logprobs": top})
        })
        .collect()
}

/// The log line's summary of a finished request.
pub fn log_note(usages: &[Usage], finishes: &[Option<FinishReason>], stream: bool) -> String {
    let prompt = usages.iter().map(|u| u.prompt_tokens).max().unwrap_or(0);
    let completion: usize = usages.iter().map(|u| u.completion_tokens).sum();
    let cached = usages.iter().map(|u| u.cached_tokens).max().unwrap_or(0);
    let ttft = usages.iter().map(|u| u.ttft_ms).min().unwrap_or(0);
    let finish: Vec<&str> = finishes
        .iter()
        .map(|f| f.map_or("none", FinishReason::as_str))
        .collect();
    format!(
        "prompt={prompt} cached={cached} completion={completion} ttft={ttft}ms finish={}{}",
        finish.join(","),
        if stream { " stream" } else { "" }
    )
}

//! OpenAI response bodies from engine events: the whole-response JSON of `/v1/completions`
//! and `/v1/chat/completions` (after [`collect`] has gathered every choice), the chunk JSON
//! that `stream` sends, `usage`, and both endpoints' `logprobs` layouts.

use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::{json, Value};

use super::error::ApiError;
pub use crate::api::logprobs::{
    chat_logprobs, completion_logprobs, echo_text, legacy_logprobs, prompt_entries, PromptScores,
};
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

/// Waits for every completion of the request.
pub async fn collect(stream: &mut RequestStream, n: usize) -> Result<Vec<Choice>, ApiError> {
    let mut choices = vec![Choice::default(); n];
    while let Some(event) = stream.next().await {
        match event {
            Event::Embedding { .. } => {} // never asked for here
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

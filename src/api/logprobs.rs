//! The two OpenAI layouts of log-probabilities, shared by the server and `run --jsonl`: the
//! legacy completions layout (parallel `tokens`, `token_logprobs`, `top_logprobs` keyed by token
//! text, `text_offset`), which with `echo` covers the prompt too, and the chat layout (one object
//! per token with its bytes and alternatives).

use serde_json::{json, Value};

use crate::engine::TokenLogprobs;
use crate::tokenizer::Tokenizer;

/// A prompt's tokens and each one's log-probability given those before it (the first none).
#[derive(Clone, Debug, Default)]
pub struct PromptScores {
    pub tokens: Vec<u32>,
    pub logprobs: Vec<Option<TokenLogprobs>>,
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

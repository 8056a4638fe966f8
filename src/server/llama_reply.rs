//! One `/completion` or `/infill` generation as llama-server reports it: the engine's events
//! folded into its text, tokens and `completion_probabilities`, the stops llama-server makes
//! itself (`t_max_prompt_ms`, `t_max_predict_ms` at a newline, `n_indent`), how it stopped
//! (`stop_type`, `stopping_word`, `truncated`), its `timings`, and the JSON of the whole reply
//! and of each streamed chunk (`to_json_non_oaicompat` in llama-server's server-task.cpp).
//! Called by `llama_completion`.

use std::time::Instant;

use serde_json::{json, Map, Value};

use super::error::ApiError;
use super::response::generation_error;
use crate::api::llama::LlamaOptions;
use crate::engine::{Event, FinishReason, Request, TokenLogprobs, Usage};
use crate::tokenizer::Tokenizer;

/// Why generation ended, as llama-server's `stop_type` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopType {
    None,
    Eos,
    Word,
    Limit,
}

impl StopType {
    fn as_str(self) -> &'static str {
        match self {
            StopType::None => "none",
            StopType::Eos => "eos",
            StopType::Word => "word",
            StopType::Limit => "limit",
        }
    }
}

/// What one event added, for a streamed chunk.
pub struct Piece {
    pub text: String,
    pub token: Option<u32>,
    pub probs: Option<Value>,
}

/// A generation in progress and, once `done`, finished.
pub struct Generation {
    /// The request as submitted (prompt, stop strings, sampling settings).
    pub request: Request,
    pub options: LlamaOptions,
    pub model: String,
    max_seq_len: usize,
    started: Instant,
    /// When the first token came (the prompt was evaluated), and the last.
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    ended: Option<Instant>,
    pub text: String,
    tokens: Vec<u32>,
    probs: Vec<Value>,
    has_new_line: bool,
    last_nl_pos: usize,
    stop_type: StopType,
    stopping_word: String,
    truncated: bool,
    usage: Usage,
    /// Generation has ended (the engine finished, or one of llama-server's own stops).
    pub done: bool,
    /// It ended here, by one of llama-server's own stops: the engine must be told to stop.
    pub stopped_here: bool,
}

impl Generation {
    pub fn new(
        request: Request,
        options: LlamaOptions,
        model: String,
        max_seq_len: usize,
        started: Instant,
    ) -> Self {
        Generation {
            request,
            options,
            model,
            max_seq_len,
            started,
            first_token: None,
            last_token: None,
            ended: None,
            text: String::new(),
            tokens: Vec::new(),
            probs: Vec::new(),
            has_new_line: false,
            last_nl_pos: 0,
            stop_type: StopType::None,
            stopping_word: String::new(),
            truncated: false,
            usage: Usage::default(),
            done: false,
            stopped_here: false,
        }
    }

    /// Folds in one engine event; the text it adds (for a stream) unless it adds none.
    /// After one of llama-server's own stops the request is aborted; its last events only
    /// bring the prompt's counts.
    pub fn on_event(&mut self, tok: &Tokenizer, event: Event) -> Result<Option<Piece>, ApiError> {
        if self.done {
            if let Event::Finished { usage, .. } = event {
                self.usage.prompt_tokens = usage.prompt_tokens;
                self.usage.cached_tokens = usage.cached_tokens;
            }
            return Ok(None);
        }
        match event {
            Event::Token {
                token,
                text,
                logprobs,
                ..
            } => Ok(self.on_token(tok, token, text, logprobs)),
            Event::Finished {
                reason,
                text,
                usage,
                ..
            } => {
                self.text.push_str(&text);
                self.usage = usage;
                let stop_type = match reason {
                    FinishReason::Stop => match usage.stop_sequence {
                        Some(i) => {
                            self.stopping_word =
                                self.request.stop.get(i).cloned().unwrap_or_default();
                            StopType::Word
                        }
                        None => StopType::Eos,
                    },
                    FinishReason::Length | FinishReason::Abort => {
                        let used = usage.prompt_tokens + usage.completion_tokens;
                        self.truncated = self.request.max_tokens > 0 && used >= self.max_seq_len;
                        StopType::Limit
                    }
                };
                self.end(stop_type);
                Ok((!text.is_empty()).then_some(Piece {
                    text,
                    token: None,
                    probs: None,
                }))
            }
            Event::Error(e) => Err(generation_error(&e)),
            // Prompt scores come only with `echo`, which these routes refuse; embeddings never.
            Event::Prompt { .. } | Event::Embedding { .. } => Ok(None),
        }
    }

    /// One of llama-server's own stops (`t_max_*_ms`, `n_indent`).
    fn stop_here(&mut self) {
        self.stopped_here = !self.done;
        self.end(StopType::Limit);
    }

    fn end(&mut self, stop_type: StopType) {
        if !self.done {
            self.done = true;
            self.stop_type = stop_type;
            self.ended = Some(Instant::now());
        }
    }

    /// A generated token, then llama-server's own stops (`process_token`).
    fn on_token(
        &mut self,
        tok: &Tokenizer,
        token: u32,
        text: String,
        logprobs: Option<TokenLogprobs>,
    ) -> Option<Piece> {
        let now = Instant::now();
        if self.first_token.is_none() {
            self.first_token = Some(now);
            if let Some(limit) = self.options.t_max_prompt_ms {
                if now.duration_since(self.started).as_millis() as u64 > limit {
                    // The prompt took too long: it stays evaluated and cached, nothing is made.
                    self.stop_here();
                    return None;
                }
            }
        }
        self.last_token = Some(now);
        self.tokens.push(token);
        self.usage.completion_tokens = self.tokens.len();
        let probs = logprobs.map(|l| token_probs(tok, token, &l));
        self.probs.extend(probs.clone());
        self.text.push_str(&text);

        // Every new line must be indented at least `n_indent` (the line that is not is cut).
        if self.has_new_line && self.options.n_indent > 0 {
            if self.last_nl_pos > 0 {
                let bytes = self.text.as_bytes();
                let mut pos = self.last_nl_pos;
                while pos < bytes.len() && (bytes[pos] == b' ' || bytes[pos] == b'\t') {
                    pos += 1;
                }
                if pos < bytes.len() && pos - self.last_nl_pos < self.options.n_indent {
                    self.text.truncate(pos);
                    self.stop_here();
                }
            }
            if let Some(pos) = self.text.get(self.last_nl_pos..).and_then(|t| t.find('\n')) {
                self.last_nl_pos += pos + 1;
            }
        }
        // After a newline, generation stops once it has taken `t_max_predict_ms`.
        if text.contains('\n') {
            self.has_new_line = true;
            if let (Some(limit), Some(first)) = (self.options.t_max_predict_ms, self.first_token) {
                if now.duration_since(first).as_millis() as u64 > limit {
                    self.stop_here();
                }
            }
        }
        Some(Piece {
            text,
            token: Some(token),
            probs,
        })
    }

    /// llama-server's `timings`: the prompt from submission to the first token (to the end for
    /// an evaluate-only request), generation from the first token to the last.
    pub fn timings(&self) -> Value {
        let prompt_end = self.first_token.or(self.ended).unwrap_or_else(Instant::now);
        let prompt_ms = prompt_end.duration_since(self.started).as_secs_f64() * 1e3;
        let prompt_n = self
            .usage
            .prompt_tokens
            .saturating_sub(self.usage.cached_tokens);
        let predicted_n = self.tokens.len();
        let predicted_ms = match (self.first_token, self.last_token) {
            (Some(a), Some(b)) => (b.duration_since(a).as_secs_f64() * 1e3).max(1e-3),
            _ => 0.0,
        };
        // The first token comes with the prompt's last step; the rest are decoding steps.
        let steps = predicted_n.saturating_sub(1);
        let per = |ms: f64, n: usize| if n > 0 { ms / n as f64 } else { 0.0 };
        let rate = |ms: f64, n: usize| if ms > 0.0 { 1e3 / ms * n as f64 } else { 0.0 };
        json!({
            "cache_n": self.usage.cached_tokens,
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": per(prompt_ms, prompt_n),
            "prompt_per_second": rate(prompt_ms, prompt_n),
            "predicted_n": predicted_n,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": per(predicted_ms, steps),
            "predicted_per_second": rate(predicted_ms, steps),
        })
    }

    pub fn num_predicted(&self) -> usize {
        self.tokens.len()
    }

    pub fn stop_type_str(&self) -> &'static str {
        self.stop_type.as_str()
    }

    /// The prompt tokens the engine reused from the prefix cache.
    pub fn tokens_cached(&self) -> usize {
        self.usage.cached_tokens
    }

    /// A streamed chunk carrying `piece`.
    pub fn chunk(&self, piece: &Piece) -> Value {
        let mut v = json!({
            "index": 0,
            "content": piece.text,
            "tokens": if self.options.return_tokens { piece.token.into_iter().collect() } else { Vec::new() },
            "stop": false,
            "id_slot": -1,
            "tokens_predicted": self.tokens.len(),
            "tokens_evaluated": self.request.prompt.len(),
        });
        if self.options.timings_per_token {
            v["timings"] = self.timings();
        }
        if let Some(p) = &piece.probs {
            v["completion_probabilities"] = json!([p]);
        }
        v
    }

    /// The final reply (the last chunk of a stream, with no content: the chunks carried it).
    pub fn final_json(&self, tok: &Tokenizer, stream: bool) -> Value {
        let s = &self.request.sampling;
        let n_predict = self.options.n_predict;
        let settings = json!({
            "seed": s.seed,
            "temperature": s.temperature,
            "top_k": s.top_k,
            "top_p": s.top_p,
            "min_p": s.min_p,
            "repeat_last_n": s.repeat_last_n,
            "repeat_penalty": s.repeat_penalty,
            "presence_penalty": s.presence_penalty,
            "frequency_penalty": s.frequency_penalty,
            "logit_bias": s.logit_bias.iter().map(|&(token, bias)| json!({"token": token, "bias": bias})).collect::<Vec<_>>(),
            "stop": self.request.stop,
            "n_predict": n_predict,
            "max_tokens": n_predict,
            "ignore_eos": self.request.ignore_eos,
            "stream": stream,
            "n_probs": self.options.n_probs,
            "cache_prompt": self.request.cache_prompt,
            "n_indent": self.options.n_indent,
            "t_max_prompt_ms": self.options.t_max_prompt_ms.map_or(-1, |v| v as i64),
            "t_max_predict_ms": self.options.t_max_predict_ms.map_or(-1, |v| v as i64),
            "timings_per_token": self.options.timings_per_token,
            "post_sampling_probs": false,
        });
        let mut v = json!({
            "index": 0,
            "content": if stream { "" } else { self.text.as_str() },
            "tokens": if self.options.return_tokens && !stream { self.tokens.clone() } else { Vec::new() },
            "id_slot": -1,
            "stop": true,
            "model": self.model,
            "tokens_predicted": self.tokens.len(),
            "tokens_evaluated": self.request.prompt.len(),
            "generation_settings": settings,
            "prompt": tok.decode(&self.request.prompt),
            "has_new_line": self.has_new_line,
            "truncated": self.truncated,
            "stop_type": self.stop_type.as_str(),
            "stopped_eos": self.stop_type == StopType::Eos,
            "stopped_word": self.stop_type == StopType::Word,
            "stopped_limit": self.stop_type == StopType::Limit,
            "stopping_word": self.stopping_word,
            "tokens_cached": self.tokens_cached(),
            "timings": self.timings(),
        });
        if !stream && self.options.n_probs > 0 {
            v["completion_probabilities"] = Value::Array(self.probs.clone());
        }
        match &self.options.response_fields {
            Some(paths) if !paths.is_empty() => nested_values(paths, &v),
            _ => v,
        }
    }
}

/// One generated token's `completion_probabilities` entry: its id, text, bytes and
/// log-probability, and the `n_probs` most likely tokens in the same form.
fn token_probs(tok: &Tokenizer, token: u32, l: &TokenLogprobs) -> Value {
    let entry = |id: u32, logprob: f32| {
        let bytes = tok.token_bytes(id);
        // llama-server writes the lowest float for an impossible token (JSON has no -inf).
        let logprob = if logprob.is_finite() {
            logprob
        } else {
            f32::MIN
        };
        json!({"id": id, "token": String::from_utf8_lossy(&bytes), "bytes": bytes, "logprob": logprob})
    };
    let mut v = entry(token, l.logprob);
    v["top_logprobs"] = l.top.iter().map(|&(id, lp)| entry(id, lp)).collect();
    v
}

/// llama-server's `response_fields`: only the fields named, `a/b` for a nested one (kept
/// under its whole path); missing ones left out.
fn nested_values(paths: &[String], v: &Value) -> Value {
    let mut out = Map::new();
    for path in paths {
        let mut cur = Some(v);
        for key in path.split('/') {
            cur = cur.and_then(|c| c.get(key));
        }
        if let Some(found) = cur {
            out.insert(path.clone(), found.clone());
        }
    }
    Value::Object(out)
}

//! Request bodies, read once for every face: the HTTP server (`serve`) and `run --jsonl` both
//! hand a JSON body to [`plan::plan`], which reads its fields by one set of rules (`request`:
//! sampling, limits, prompt, messages; `structured`: `response_format`, `regex`, `grammar`, with
//! the JSON-schema keywords checked by `schema_keywords`; `tools`: `tools`, `tool_choice`,
//! `parallel_tool_calls` with the grammar a call must follow), renders and tokenizes the prompt
//! and checks it against the context, and answers the engine request (with what to take apart in
//! its reply) or a [`RequestError`] naming the bad field. `tool_parser` finds tool calls in
//! generated text, whole or streamed; `reasoning` splits a `<think>` reply into
//! `reasoning_content` and `content`; `reply` takes a whole reply apart for every face.
//! `responses` (with `responses_tools`) translates an OpenAI Responses API body into the chat
//! body `plan` reads. `logprobs` writes the two OpenAI layouts of log-probabilities. `llama` reads
//! llama-server's native bodies (`/completion`, `/infill`, whose prompt `infill` builds).
//! `embeddings` reads embedding bodies (`/v1/embeddings`, `/embedding`) and writes their replies.
//!
//! Layers: the faces (`cli`, `server`) use this module; it uses the engine, the chat template and
//! the tokenizer, and never a face. The faces turn a [`RequestError`] into their own error (an
//! HTTP 400, a jsonl error line).

pub mod beam;
pub mod beam_fields;
pub mod embeddings;
pub mod harmony;
pub mod harmony_grammar;
pub mod infill;
pub mod llama;
pub mod logprobs;
pub mod messages;
pub mod plan;
pub mod reasoning;
pub mod reply;
pub mod reply_stream;
pub mod request;
pub mod rerank;
pub mod responses;
mod responses_tools;
pub mod sampling_fields;
pub mod schema_keywords;
pub mod schema_refs;
pub mod structured;
pub mod template_args;
pub mod tool_parser;
pub mod tools;

use crate::engine::SubmitError;

/// A value from a request quoted for an error message: escaped (so a newline cannot break the
/// one-line message) and cut to its first 64 characters.
pub fn shown(value: &str) -> String {
    let mut cut: String = value.chars().take(64).collect();
    if cut.len() < value.len() {
        cut.push_str("...");
    }
    format!("{cut:?}")
}

/// A request field that cannot be honoured: which field, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub param: String,
    pub message: String,
}

impl FieldError {
    pub fn new(param: &str, message: impl Into<String>) -> Self {
        FieldError {
            param: param.to_string(),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<FieldError> for RequestError {
    fn from(e: FieldError) -> Self {
        RequestError::invalid(&e.param, e.message)
    }
}

/// Why a request body is refused: the message, the field at fault if one is, and OpenAI's
/// error `code` where one applies (`context_length_exceeded`). Always the client's fault: the
/// server answers it with a 400.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestError {
    pub message: String,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl RequestError {
    /// About one request field.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        RequestError {
            param: Some(param.to_string()),
            ..RequestError::bad_request(message)
        }
    }

    /// About the request as a whole.
    pub fn bad_request(message: impl Into<String>) -> Self {
        RequestError {
            message: message.into(),
            param: None,
            code: None,
        }
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// A prompt longer than the context of `max_seq_len` tokens; `length` says how long
    /// (`12 tokens`, or a lower bound where the prompt was refused before tokenizing).
    pub fn prompt_too_long(param: &str, length: &str, max_seq_len: usize) -> Self {
        RequestError::invalid(
            param,
            format!(
                "This model's maximum context length is {max_seq_len} tokens, but the prompt has {length} \
                 (the prompt and the completion must fit together). Please shorten the prompt."
            ),
        )
        .with_code("context_length_exceeded")
    }

    /// Why the engine refused a request for its content (an empty or too long prompt, a token
    /// id outside the vocabulary...); `param` names the field that carried the prompt. `None`
    /// for refusals that are not the request's fault (a full queue, a stopped engine), which
    /// each face answers in its own way.
    pub fn from_submit(e: &SubmitError, param: &str) -> Option<Self> {
        Some(match e {
            SubmitError::EmptyPrompt => RequestError::invalid(param, "the prompt is empty"),
            SubmitError::PromptTooLong { prompt, max } => {
                RequestError::prompt_too_long(param, &format!("{prompt} tokens"), *max)
            }
            SubmitError::Invalid(message) => RequestError::bad_request(message.clone()),
            SubmitError::QueueFull(_) | SubmitError::Stopped => return None,
        })
    }
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

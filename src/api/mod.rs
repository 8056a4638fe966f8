//! Request fields for structured output and tool calls, shared by the HTTP server and
//! `run --jsonl`: `response_format`, `regex`, `grammar` (`structured`), `tools`, `tool_choice`
//! and `parallel_tool_calls` with the grammar a call must follow (`tools`), and the parser that
//! finds tool calls in generated text, whole or streamed (`tool_parser`); the `<think>` split of
//! a reasoning reply into `reasoning_content` and `content` (`reasoning`).
//!
//! Everything here reads a JSON body and answers a [`FieldError`] naming the bad field; the faces
//! turn it into their own error (a 400, a jsonl error line).

pub mod reasoning;
pub mod schema_keywords;
pub mod structured;
pub mod tool_parser;
pub mod tools;

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

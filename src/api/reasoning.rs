//! Reasoning (`<think>...</think>`) in chat replies, as llama-server (`reasoning_format`) and
//! vLLM (`--reasoning-parser`) return it: the thoughts go to `reasoning_content`, the rest to
//! `content`, whole or streamed (`delta.reasoning_content`). A chat template "thinks" when its
//! text holds both tags; a rendered prompt that ends inside an open `<think>` (templates that
//! force thinking on) starts the reply in its thoughts.
//!
//! The splitter here is fed the reply piece by piece and holds back only what may still turn
//! out to be a tag, so the streamed pieces join to exactly the non-streamed fields. The
//! constraint side (a request's grammar applies only after `</think>`) is
//! `constraint::ConstraintSpec::AfterThinking`, built by [`constraint_after_thinking`].

use serde_json::{Map, Value};

use super::FieldError;
use crate::constraint::ConstraintSpec;
use crate::tokenizer::Tokenizer;

pub const THINK_OPEN: &str = "<think>";
pub const THINK_CLOSE: &str = "</think>";

/// Whether a chat template's text teaches `<think>...</think>` reasoning.
pub fn template_thinks(source: &str) -> bool {
    source.contains(THINK_OPEN) && source.contains(THINK_CLOSE)
}

/// Whether a rendered prompt leaves the reply inside an open `<think>` block.
pub fn prompt_opens_thinking(prompt: &str) -> bool {
    let tail = prompt.trim_end();
    match (tail.rfind(THINK_OPEN), tail.rfind(THINK_CLOSE)) {
        (Some(open), close) => close.is_none_or(|c| c < open) && tail.ends_with(THINK_OPEN),
        (None, _) => false,
    }
}

/// `reasoning_format` (llama-server's field): `none` leaves the thoughts in `content`;
/// `auto` and `deepseek` (the default) split them out. Returns whether to split.
pub fn split_requested(body: &Map<String, Value>) -> Result<bool, FieldError> {
    match body.get("reasoning_format") {
        None | Some(Value::Null) => Ok(true),
        Some(Value::String(s)) if s == "none" => Ok(false),
        Some(Value::String(s)) if s == "auto" || s == "deepseek" => Ok(true),
        Some(other) => Err(FieldError::new(
            "reasoning_format",
            format!("`reasoning_format` must be `none`, `auto` or `deepseek`, got {other}"),
        )),
    }
}

/// `inner` applied only after the reply's `</think>` (and the whitespace after it): the
/// thoughts before are free text. `forced_open`: the prompt already opened the block. The tags
/// are matched as single tokens where the vocabulary has them, else as text.
pub fn constraint_after_thinking(
    inner: ConstraintSpec,
    forced_open: bool,
    tok: &Tokenizer,
) -> ConstraintSpec {
    let atom = |tag: &str| {
        tok.find_token(tag)
            .filter(|&id| tok.is_control(id))
            .map_or_else(
                || serde_json::to_string(tag).expect("a string serializes"),
                |id| format!("<[{id}]>"),
            )
    };
    ConstraintSpec::AfterThinking {
        inner: Box::new(inner),
        open: atom(THINK_OPEN),
        close: atom(THINK_CLOSE),
        forced_open,
    }
}

/// What a piece of reply turned out to be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    Reasoning(String),
    Content(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Before the first non-whitespace text: a `<think>` may still open.
    Start,
    /// Inside the thoughts; `started`: some non-whitespace thought was given out.
    Thinking {
        started: bool,
    },
    /// After `</think>`, before the answer's first non-whitespace text.
    AfterThinking,
    Content,
}

/// Splits one streamed reply into reasoning and content.
#[derive(Clone, Debug)]
pub struct ReasoningSplitter {
    state: State,
    /// Text not yet given out.
    buf: String,
}

impl ReasoningSplitter {
    /// `forced_open`: the prompt ended inside `<think>`, so the reply starts in its thoughts.
    pub fn new(forced_open: bool) -> Self {
        ReasoningSplitter {
            state: if forced_open {
                State::Thinking { started: false }
            } else {
                State::Start
            },
            buf: String::new(),
        }
    }

    /// Feeds the next piece; returns what it settles.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            let progressed = match self.state {
                State::Start => {
                    let rest = self.buf.trim_start();
                    if rest.starts_with(THINK_OPEN) {
                        let skip = self.buf.len() - rest.len() + THINK_OPEN.len();
                        self.buf.replace_range(..skip, "");
                        self.state = State::Thinking { started: false };
                        true
                    } else if rest.is_empty() || THINK_OPEN.starts_with(rest) {
                        false
                    } else {
                        self.state = State::Content;
                        true
                    }
                }
                State::Thinking { started } => {
                    if !started {
                        let n = self.buf.len() - self.buf.trim_start().len();
                        self.buf.replace_range(..n, "");
                    }
                    if let Some(end) = self.buf.find(THINK_CLOSE) {
                        let thought = self.buf[..end].trim_end().to_string();
                        if !thought.is_empty() {
                            out.push(Piece::Reasoning(thought));
                        }
                        self.buf.replace_range(..end + THINK_CLOSE.len(), "");
                        self.state = State::AfterThinking;
                        true
                    } else {
                        // Hold back trailing whitespace and what may grow into `</think>`.
                        let hold = held_suffix(&self.buf, THINK_CLOSE);
                        let cut = self.buf[..self.buf.len() - hold].trim_end().len();
                        if cut > 0 {
                            out.push(Piece::Reasoning(self.buf[..cut].to_string()));
                            self.buf.replace_range(..cut, "");
                            self.state = State::Thinking { started: true };
                        }
                        false
                    }
                }
                State::AfterThinking => {
                    let n = self.buf.len() - self.buf.trim_start().len();
                    self.buf.replace_range(..n, "");
                    if self.buf.is_empty() {
                        false
                    } else {
                        self.state = State::Content;
                        true
                    }
                }
                State::Content => {
                    if !self.buf.is_empty() {
                        out.push(Piece::Content(std::mem::take(&mut self.buf)));
                    }
                    false
                }
            };
            if !progressed {
                return out;
            }
        }
    }

    /// The end of the reply: whatever was held back (an unclosed block's thoughts as reasoning).
    pub fn finish(&mut self) -> Vec<Piece> {
        let rest = std::mem::take(&mut self.buf);
        let piece = match self.state {
            State::Start | State::Content => Piece::Content(rest),
            State::Thinking { .. } => Piece::Reasoning(rest.trim_end().to_string()),
            State::AfterThinking => return Vec::new(),
        };
        match &piece {
            Piece::Reasoning(t) | Piece::Content(t) if t.is_empty() => Vec::new(),
            _ => vec![piece],
        }
    }
}

/// Length of the longest suffix of `s` that is a proper prefix of `marker`.
fn held_suffix(s: &str, marker: &str) -> usize {
    (1..marker.len().min(s.len() + 1))
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && marker.starts_with(&s[s.len() - n..]))
        .unwrap_or(0)
}

/// The reasoning (None when the reply had no thoughts) and the content of a whole reply.
pub fn split_all(text: &str, forced_open: bool) -> (Option<String>, String) {
    let mut s = ReasoningSplitter::new(forced_open);
    let (mut reasoning, mut content) = (String::new(), String::new());
    for p in s.push(text).into_iter().chain(s.finish()) {
        match p {
            Piece::Reasoning(t) => reasoning.push_str(&t),
            Piece::Content(t) => content.push_str(&t),
        }
    }
    ((!reasoning.is_empty()).then_some(reasoning), content)
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPLY: &str =
        "\n<think>\nThe user wants a name.\nPick one.\n</think>\n\n{\"name\": \"Ann\"}";

    #[test]
    fn whole_replies() {
        assert_eq!(
            split_all(REPLY, false),
            (
                Some("The user wants a name.\nPick one.".into()),
                "{\"name\": \"Ann\"}".into()
            )
        );
        // Forced open: the reply starts in its thoughts, without the tag.
        assert_eq!(
            split_all("I think.</think>answer", true),
            (Some("I think.".into()), "answer".into())
        );
        // No thoughts, a tag not at the start, an unclosed block.
        assert_eq!(
            split_all("plain <think>x", false),
            (None, "plain <think>x".into())
        );
        assert_eq!(
            split_all("<think>still going", false),
            (Some("still going".into()), String::new())
        );
        assert_eq!(split_all("<thi", false), (None, "<thi".into()));
        assert!(prompt_opens_thinking("<|im_start|>assistant\n<think>\n"));
        assert!(!prompt_opens_thinking("<think>\n\n</think>\n\n"));
        assert!(!prompt_opens_thinking("assistant\n"));
    }

    #[test]
    fn streamed_pieces_join_to_the_whole() {
        for forced in [false, true] {
            let text = if forced { &REPLY[8..] } else { REPLY };
            let whole = split_all(text, forced);
            let chars: Vec<char> = text.chars().collect();
            for step in 1..10 {
                let mut s = ReasoningSplitter::new(forced);
                let (mut r, mut c) = (String::new(), String::new());
                let mut pieces = Vec::new();
                for chunk in chars.chunks(step) {
                    pieces.extend(s.push(&chunk.iter().collect::<String>()));
                }
                pieces.extend(s.finish());
                for p in pieces {
                    match p {
                        Piece::Reasoning(t) => r.push_str(&t),
                        Piece::Content(t) => c.push_str(&t),
                    }
                }
                assert_eq!((Some(r), c), whole, "step {step}, forced {forced}");
            }
        }
    }
}

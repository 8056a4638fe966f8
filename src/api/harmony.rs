//! gpt-oss's "harmony" replies taken apart, piece by piece as they stream: messages of the form
//! `<|channel|>CHANNEL<|message|>TEXT<|end|>`, each after the first opened by
//! `<|start|>assistant`. The `analysis` channel is reasoning (`reasoning_content`), `final` is
//! the answer (`content`), and a message addressed to a function (`<|channel|>commentary
//! to=functions.NAME <|constrain|>json<|message|>{...}<|call|>`, or with `to=functions.NAME`
//! before the channel) is a tool call whose arguments are the message's text; `commentary`
//! without a recipient is text for the user. A reply with no harmony markup at all is content.
//! The stop tokens (`<|return|>`, `<|call|>`) may or may not be in the text: the reply's end
//! closes its last message the same way.
//!
//! Used by `super::reply_stream::ReplyStream` (streamed) and `super::reply::assistant_reply`
//! (whole, through the same parser, so the streamed pieces join to the whole reply's fields)
//! when the chat template speaks harmony ([`template_speaks_harmony`]).

use super::reply_stream::ReplyPiece;
use super::tool_parser::ToolCall;

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
/// What ends a message's text.
const ENDS: [&str; 3] = ["<|end|>", "<|return|>", "<|call|>"];

/// Whether a chat template renders harmony messages (gpt-oss's).
pub fn template_speaks_harmony(source: &str) -> bool {
    source.contains(CHANNEL) && source.contains(MESSAGE)
}

/// Where a message's text goes.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Sink {
    Reasoning,
    Content,
    /// Arguments of call `index` (its start already given out).
    Call {
        index: usize,
        name: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    /// The reply's first text: a header (`<|channel|>...`) or plain content.
    Start,
    /// A message's header, up to `<|message|>`.
    Header,
    /// A message's text.
    Body(Sink),
    /// Between messages, before the next `<|start|>`.
    Between,
    /// Plain content to the end (no harmony markup).
    Plain,
}

/// The streaming parser of one harmony reply.
#[derive(Clone, Debug)]
pub struct HarmonyParser {
    state: State,
    buf: String,
    /// The current call's arguments so far.
    args: String,
    pub calls: Vec<ToolCall>,
    /// Calls the reply ended inside whose arguments are not whole JSON (their start was given
    /// out; left out of `calls`).
    pub num_dropped: usize,
}

impl Default for HarmonyParser {
    fn default() -> Self {
        Self::new()
    }
}

/// The length of the longest suffix of `s` that is a proper prefix of one of `tags`.
fn held_suffix(s: &str, tags: &[&str]) -> usize {
    let mut best = 0;
    for tag in tags {
        for n in (1..tag.len().min(s.len() + 1)).rev() {
            if s.is_char_boundary(s.len() - n) && tag.starts_with(&s[s.len() - n..]) {
                best = best.max(n);
                break;
            }
        }
    }
    best
}

/// The function a header addresses (`to=functions.NAME`), if any.
fn recipient(header: &str) -> Option<String> {
    let at = header.find("to=")?;
    let target = header[at + 3..]
        .split(|c: char| c.is_whitespace() || c == '<')
        .next()
        .unwrap_or("");
    let name = target.strip_prefix("functions.").unwrap_or(target);
    (!name.is_empty()).then(|| name.to_string())
}

/// The channel a header names (the word after `<|channel|>`), if any.
fn channel(header: &str) -> Option<&str> {
    let at = header.find(CHANNEL)?;
    header[at + CHANNEL.len()..]
        .split(|c: char| c.is_whitespace() || c == '<')
        .next()
}

impl HarmonyParser {
    pub fn new() -> Self {
        HarmonyParser {
            state: State::Start,
            buf: String::new(),
            args: String::new(),
            calls: Vec::new(),
            num_dropped: 0,
        }
    }

    /// Feeds the next piece of text; returns what it settles.
    pub fn push(&mut self, text: &str) -> Vec<ReplyPiece> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        while self.step(&mut out) {}
        out
    }

    /// The end of the reply: its last message closed, whatever is held back given out.
    pub fn finish(&mut self) -> Vec<ReplyPiece> {
        let mut out = Vec::new();
        while self.step(&mut out) {}
        let rest = std::mem::take(&mut self.buf);
        match std::mem::replace(&mut self.state, State::Between) {
            State::Start | State::Plain => emit(&mut out, ReplyPiece::Content(rest)),
            State::Body(sink) => {
                self.emit_body(&sink, rest, &mut out);
                self.close(sink);
            }
            State::Header | State::Between => {}
        }
        out.retain(
            |p| !matches!(p, ReplyPiece::Content(t) | ReplyPiece::Reasoning(t) if t.is_empty()),
        );
        out
    }

    /// One step; false when it needs more text.
    fn step(&mut self, out: &mut Vec<ReplyPiece>) -> bool {
        match self.state.clone() {
            State::Start => {
                let t = self.buf.trim_start();
                if t.is_empty() {
                    return false;
                }
                if t.starts_with(CHANNEL) || t.starts_with(START) || t.starts_with("to=") {
                    self.state = State::Header;
                    return true;
                }
                if CHANNEL.starts_with(t) || START.starts_with(t) || "to=".starts_with(t) {
                    return false;
                }
                self.state = State::Plain;
                true
            }
            State::Plain => {
                emit(out, ReplyPiece::Content(std::mem::take(&mut self.buf)));
                false
            }
            State::Between => match self.buf.find(START) {
                Some(at) => {
                    self.buf.replace_range(..at + START.len(), "");
                    self.state = State::Header;
                    true
                }
                None => {
                    // Text outside any message (not harmony): dropped, up to what may be a start.
                    let keep = held_suffix(&self.buf, &[START]);
                    self.buf.replace_range(..self.buf.len() - keep, "");
                    false
                }
            },
            State::Header => {
                let Some(at) = self.buf.find(MESSAGE) else {
                    return false;
                };
                let header: String = self.buf[..at].to_string();
                self.buf.replace_range(..at + MESSAGE.len(), "");
                let sink = match (recipient(&header), channel(&header)) {
                    (Some(name), _) => {
                        let index = self.calls.len() + self.num_dropped;
                        out.push(ReplyPiece::CallStart {
                            index,
                            name: name.clone(),
                        });
                        self.args.clear();
                        Sink::Call { index, name }
                    }
                    (None, Some("analysis")) => Sink::Reasoning,
                    (None, _) => Sink::Content,
                };
                self.state = State::Body(sink);
                true
            }
            State::Body(sink) => {
                let end = ENDS
                    .iter()
                    .filter_map(|e| self.buf.find(e).map(|at| (at, e.len())))
                    .min();
                match end {
                    Some((at, len)) => {
                        let text = self.buf[..at].to_string();
                        self.buf.replace_range(..at + len, "");
                        self.emit_body(&sink, text, out);
                        self.close(sink);
                        self.state = State::Between;
                        true
                    }
                    None => {
                        let keep = held_suffix(&self.buf, &ENDS);
                        let text: String = self.buf.drain(..self.buf.len() - keep).collect();
                        self.emit_body(&sink, text, out);
                        false
                    }
                }
            }
        }
    }

    fn emit_body(&mut self, sink: &Sink, text: String, out: &mut Vec<ReplyPiece>) {
        if text.is_empty() {
            return;
        }
        match sink {
            Sink::Reasoning => emit(out, ReplyPiece::Reasoning(text)),
            Sink::Content => emit(out, ReplyPiece::Content(text)),
            Sink::Call { index, .. } => {
                self.args.push_str(&text);
                out.push(ReplyPiece::Arguments {
                    index: *index,
                    text,
                });
            }
        }
    }

    /// A message ended: a call is kept when its arguments are whole JSON.
    fn close(&mut self, sink: Sink) {
        if let Sink::Call { name, .. } = sink {
            let arguments = std::mem::take(&mut self.args).trim().to_string();
            if serde_json::from_str::<serde_json::Value>(&arguments).is_ok() {
                self.calls.push(ToolCall { name, arguments });
            } else {
                self.num_dropped += 1;
            }
        }
    }
}

fn emit(out: &mut Vec<ReplyPiece>, p: ReplyPiece) {
    if !matches!(&p, ReplyPiece::Content(t) | ReplyPiece::Reasoning(t) if t.is_empty()) {
        out.push(p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pieces of `chunks` fed in order, neighbours of one kind joined.
    fn joined(chunks: &[&str]) -> (Vec<ReplyPiece>, Vec<ToolCall>) {
        let mut p = HarmonyParser::new();
        let mut out: Vec<ReplyPiece> = Vec::new();
        let mut pieces: Vec<ReplyPiece> = chunks.iter().flat_map(|c| p.push(c)).collect();
        pieces.extend(p.finish());
        for piece in pieces {
            match (out.last_mut(), piece) {
                (Some(ReplyPiece::Reasoning(a)), ReplyPiece::Reasoning(b)) => a.push_str(&b),
                (Some(ReplyPiece::Content(a)), ReplyPiece::Content(b)) => a.push_str(&b),
                (
                    Some(ReplyPiece::Arguments { text: a, index: i }),
                    ReplyPiece::Arguments { text: b, index: j },
                ) if *i == j => a.push_str(&b),
                (_, piece) => out.push(piece),
            }
        }
        (out, p.calls)
    }

    /// Every split of `text` into two pieces, and one character at a time, against the whole.
    fn same_streamed(text: &str) -> (Vec<ReplyPiece>, Vec<ToolCall>) {
        let whole = joined(&[text]);
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(joined(&refs), whole, "one character at a time");
        for (i, _) in text.char_indices() {
            assert_eq!(joined(&[&text[..i], &text[i..]]), whole, "split at {i}");
        }
        whole
    }

    #[test]
    fn analysis_is_reasoning_and_final_is_content() {
        let text = "<|channel|>analysis<|message|>The user greets. Reply kindly.<|end|>\
                    <|start|>assistant<|channel|>final<|message|>Hello! How can I help?<|return|>";
        let (pieces, calls) = same_streamed(text);
        assert_eq!(
            pieces,
            [
                ReplyPiece::Reasoning("The user greets. Reply kindly.".into()),
                ReplyPiece::Content("Hello! How can I help?".into())
            ]
        );
        assert!(calls.is_empty());
        // The stop token left out of the text (the engine stops on it): the same.
        assert_eq!(joined(&[text.trim_end_matches("<|return|>")]).0, pieces);
    }

    #[test]
    fn a_commentary_message_to_a_function_is_a_tool_call() {
        let text = "<|channel|>analysis<|message|>Need the weather.<|end|>\
                    <|start|>assistant<|channel|>commentary to=functions.get_weather \
                    <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>";
        let (pieces, calls) = same_streamed(text);
        assert_eq!(
            pieces,
            [
                ReplyPiece::Reasoning("Need the weather.".into()),
                ReplyPiece::CallStart {
                    index: 0,
                    name: "get_weather".into()
                },
                ReplyPiece::Arguments {
                    index: 0,
                    text: "{\"city\": \"Paris\"}".into()
                },
            ]
        );
        assert_eq!(
            calls,
            [ToolCall {
                name: "get_weather".into(),
                arguments: "{\"city\": \"Paris\"}".into()
            }]
        );
        // The recipient before the channel, and the reply cut at the stop token: the same call.
        let other = "<|start|>assistant to=functions.get_weather<|channel|>commentary json\
                     <|message|>{\"city\": \"Paris\"}";
        assert_eq!(joined(&[other]).1, calls);
    }

    #[test]
    fn two_calls_are_numbered_and_unfinished_arguments_are_dropped() {
        let text = "<|channel|>commentary to=functions.a <|constrain|>json<|message|>{}<|call|>\
                    <|start|>assistant<|channel|>commentary to=functions.b<|message|>{\"x\": [1, 2]}<|call|>";
        let (_, calls) = same_streamed(text);
        assert_eq!(calls.len(), 2);
        assert_eq!(
            (calls[0].name.as_str(), calls[0].arguments.as_str()),
            ("a", "{}")
        );
        assert_eq!(
            (calls[1].name.as_str(), calls[1].arguments.as_str()),
            ("b", "{\"x\": [1, 2]}")
        );
        let mut p = HarmonyParser::new();
        p.push("<|channel|>commentary to=functions.a<|message|>{\"x\": ");
        p.finish();
        assert_eq!((p.calls.len(), p.num_dropped), (0, 1));
    }

    #[test]
    fn plain_text_and_commentary_without_a_recipient_are_content() {
        assert_eq!(
            same_streamed("Just an answer, <|no markup|> here.").0,
            [ReplyPiece::Content(
                "Just an answer, <|no markup|> here.".into()
            )]
        );
        let text = "<|channel|>commentary<|message|>Checking now.<|end|>";
        assert_eq!(
            same_streamed(text).0,
            [ReplyPiece::Content("Checking now.".into())]
        );
    }

    #[test]
    fn templates_that_speak_harmony_are_recognised() {
        assert!(template_speaks_harmony(
            "{{- '<|start|>assistant<|channel|>final<|message|>' + m.content + '<|end|>' }}"
        ));
        assert!(!template_speaks_harmony("<|im_start|>assistant\n<think>"));
    }
}

//! Finds tool calls in generated text: Hermes' `<tool_call>\n{"name": "f", "arguments":
//! {...}}\n</tool_call>`, and the forms small models write instead (a bare `{"name": ...}`, a
//! Markdown fence, another tag, doubled braces: `crate::constraint::trigger`, recognised only for
//! the offered function names). Fed the text piece by piece as it streams, it says what is plain
//! content, when a call starts (its name) and which pieces of its arguments have arrived, holding
//! back only what could still turn out to be markup. The whole reply goes through the same parser,
//! so the streamed pieces of a call always join to exactly the non-streamed `arguments`.

use serde_json::Value;

use super::tools::{HERMES_CLOSE, HERMES_OPEN};
use crate::constraint::trigger::{self, CallStart, CLOSERS};

/// What a piece of text turned out to be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolEvent {
    Content(String),
    /// Call `index` opened, with this function name.
    CallStart {
        index: usize,
        name: String,
    },
    /// More of call `index`'s arguments (raw JSON text).
    Arguments {
        index: usize,
        text: String,
    },
}

/// One parsed call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as the model wrote them (a JSON object's text).
    pub arguments: String,
}

/// How the call being read ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Close {
    /// At `</tool_call>`.
    Tag,
    /// With its JSON object (a call written without markup), inside an extra `{` if `double`.
    Object { double: bool },
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    /// Plain content, looking for a call.
    Text,
    /// Inside a call, before `"arguments":` (or the call's end).
    Header(Close),
    /// Inside a call's arguments; `emitted` bytes of `buf` are out.
    Arguments { emitted: usize, close: Close },
    /// After a call written without markup: its closing fence or tag, if any, is dropped.
    After { double: bool },
}

/// The streaming parser of one reply.
#[derive(Clone, Debug)]
pub struct ToolCallParser {
    state: State,
    /// Text not yet settled (the current call, or content held back).
    buf: String,
    /// The markup before the call being read (given back as content if it is not a call).
    preamble: String,
    /// The functions offered: calls written without markup are recognised for these names.
    names: Vec<String>,
    pub calls: Vec<ToolCall>,
    /// Calls the reply ended inside, with arguments that are not whole JSON: left out of
    /// `calls` (a stream has already sent their start).
    pub num_dropped: usize,
}

impl Default for ToolCallParser {
    fn default() -> Self {
        Self::new()
    }
}

impl ToolCallParser {
    /// Finds `<tool_call>` calls only.
    pub fn new() -> Self {
        Self::with_names(Vec::new())
    }

    /// Also finds calls to `names` written without markup.
    pub fn with_names(names: Vec<String>) -> Self {
        ToolCallParser {
            state: State::Text,
            buf: String::new(),
            preamble: String::new(),
            names,
            calls: Vec::new(),
            num_dropped: 0,
        }
    }

    /// Feeds the next piece of text; returns what it settles.
    pub fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            let progressed = match self.state.clone() {
                State::Text => self.text(&mut out),
                State::Header(close) => self.header(close, &mut out),
                State::Arguments { emitted, close } => self.arguments(emitted, close, &mut out),
                State::After { double } => self.after(double, false),
            };
            if !progressed {
                return out;
            }
        }
    }

    /// The end of the reply: whatever is held back, as content; an unfinished call is kept only
    /// when its arguments are whole JSON (see `num_dropped`).
    pub fn finish(&mut self) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        if let State::After { double } = self.state {
            self.after(double, true);
        }
        let rest = std::mem::take(&mut self.buf);
        match self.state {
            State::Text | State::Header(_) | State::After { .. } => {
                let rest = match self.state {
                    State::Header(Close::Tag) => format!("{HERMES_OPEN}{rest}"),
                    State::Header(_) => format!("{}{rest}", self.preamble),
                    _ => rest,
                };
                // Whitespace after the last call is not content.
                if !rest.is_empty() && (self.calls.is_empty() || !rest.trim().is_empty()) {
                    out.push(ToolEvent::Content(rest));
                }
            }
            State::Arguments { emitted, close } => {
                // A call the reply ended inside (`max_tokens`, a stop sequence): kept if its
                // arguments are whole JSON (the call object's `}` aside), else dropped, so that
                // `calls` never holds arguments a client cannot parse.
                let index = self.calls.len() - 1;
                let tail = &rest[emitted.min(rest.len())..];
                let inner = tail.trim_end();
                let mut inner = inner.strip_suffix('}').unwrap_or(inner).trim_end();
                if close == (Close::Object { double: true }) {
                    inner = inner.strip_suffix('}').unwrap_or(inner).trim_end();
                }
                let whole = |t: &str| {
                    serde_json::from_str::<Value>(&format!("{}{t}", self.calls[index].arguments))
                        .is_ok()
                };
                let tail = ["", inner, tail].into_iter().find(|t| whole(t));
                match tail {
                    Some(tail) => {
                        if !tail.is_empty() {
                            self.calls[index].arguments.push_str(tail);
                            out.push(ToolEvent::Arguments {
                                index,
                                text: tail.to_string(),
                            });
                        }
                    }
                    None => {
                        self.calls.pop();
                        self.num_dropped += 1;
                    }
                }
            }
        }
        self.state = State::Text;
        out
    }

    fn text(&mut self, out: &mut Vec<ToolEvent>) -> bool {
        let hermes = self.buf.find(HERMES_OPEN);
        let bare = if self.names.is_empty() {
            None
        } else {
            trigger::find_call(&self.buf, &self.names)
        };
        let start = match (hermes, bare) {
            (Some(h), Some((b, _))) if b < h => bare,
            (Some(h), _) => {
                self.content_before(h, out);
                self.buf.replace_range(..HERMES_OPEN.len(), "");
                self.state = State::Header(Close::Tag);
                return true;
            }
            (None, bare) => bare,
        };
        if let Some((at, CallStart::At { brace, double })) = start {
            self.content_before(at, out);
            // `brace` counts from `at`, where `buf` now starts.
            self.preamble = self.buf[..brace].to_string();
            self.buf.replace_range(..brace, "");
            self.state = State::Header(Close::Object { double });
            return true;
        }
        // Hold back trailing whitespace and a tail that may grow into a call.
        let mut hold = self.buf.len() - held_suffix(&self.buf, HERMES_OPEN);
        if !self.names.is_empty() {
            if let Some(p) = trigger::partial_from(&self.buf, &self.names) {
                hold = hold.min(p);
            }
        }
        let cut = self.buf[..hold].trim_end().len();
        if cut > 0 {
            let text: String = self.buf[..cut].to_string();
            self.buf.replace_range(..cut, "");
            out.push(ToolEvent::Content(text));
        }
        false
    }

    /// Gives out the content before position `at` of `buf` (whitespace before a call is not
    /// content) and drops it from `buf`.
    fn content_before(&mut self, at: usize, out: &mut Vec<ToolEvent>) {
        let before = self.buf[..at].trim_end().to_string();
        if !before.is_empty() {
            out.push(ToolEvent::Content(before));
        }
        self.buf.replace_range(..at, "");
    }

    fn start_call(&mut self, name: String, arguments: Option<String>, out: &mut Vec<ToolEvent>) {
        let index = self.calls.len();
        self.calls.push(ToolCall {
            name: name.clone(),
            arguments: arguments.clone().unwrap_or_default(),
        });
        out.push(ToolEvent::CallStart { index, name });
        if let Some(text) = arguments {
            out.push(ToolEvent::Arguments { index, text });
        }
    }

    fn header(&mut self, close: Close, out: &mut Vec<ToolEvent>) -> bool {
        match parse_header(&self.buf) {
            Header::Done { name, consumed } => {
                self.start_call(name, None, out);
                self.buf.replace_range(..consumed, "");
                self.state = State::Arguments { emitted: 0, close };
                true
            }
            Header::Incomplete if close == Close::Tag && !self.buf.contains(HERMES_CLOSE) => false,
            // Another layout (arguments first, extra keys): parse the whole call at its end.
            _ => {
                let (body, end) = match close {
                    Close::Tag => match self.buf.find(HERMES_CLOSE) {
                        Some(end) => (self.buf[..end].trim().to_string(), end + HERMES_CLOSE.len()),
                        None => return false,
                    },
                    Close::Object { .. } => match json_value_end(&self.buf) {
                        Some(end) => (self.buf[..end].to_string(), end),
                        None => return false,
                    },
                };
                let whole = self.buf[..end].to_string();
                self.buf.replace_range(..end, "");
                self.state = match close {
                    Close::Tag => State::Text,
                    Close::Object { double } => State::After { double },
                };
                let call = serde_json::from_str::<Value>(&body).ok().and_then(|v| {
                    let name = v.get("name")?.as_str()?.to_string();
                    let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
                        Some(Value::String(s)) => s.clone(),
                        Some(a) => a.to_string(),
                        None => "{}".to_string(),
                    };
                    Some((name, arguments))
                });
                match (call, close) {
                    (Some((name, arguments)), _) => self.start_call(name, Some(arguments), out),
                    (None, Close::Tag) => out.push(ToolEvent::Content(format!(
                        "{HERMES_OPEN}{body}{HERMES_CLOSE}"
                    ))),
                    (None, Close::Object { .. }) => {
                        out.push(ToolEvent::Content(format!("{}{whole}", self.preamble)));
                        self.state = State::Text;
                    }
                }
                true
            }
        }
    }

    fn arguments(&mut self, emitted: usize, close: Close, out: &mut Vec<ToolEvent>) -> bool {
        let index = self.calls.len() - 1;
        if let Close::Object { double } = close {
            // The arguments are one JSON value: out as they come, up to the value's end.
            let end = json_value_end(&self.buf);
            let upto = end.unwrap_or(self.buf.len()).max(emitted);
            if upto > emitted {
                let text = self.buf[emitted..upto].to_string();
                self.calls[index].arguments.push_str(&text);
                out.push(ToolEvent::Arguments { index, text });
            }
            let Some(end) = end else {
                self.state = State::Arguments {
                    emitted: upto,
                    close,
                };
                return false;
            };
            // Then the call object's own `}`.
            let rest = self.buf[end..].trim_start();
            if rest.is_empty() {
                self.state = State::Arguments {
                    emitted: end,
                    close,
                };
                return false;
            }
            let skip = self.buf.len() - rest.len() + usize::from(rest.starts_with('}'));
            self.buf.replace_range(..skip, "");
            self.state = State::After { double };
            return true;
        }
        if let Some(end) = self.buf.find(HERMES_CLOSE) {
            // The arguments end before the call object's closing brace.
            let inner = self.buf[..end].trim_end();
            let args_end = inner.strip_suffix('}').unwrap_or(inner).trim_end().len();
            let args_end = args_end.max(emitted);
            let tail = self.buf[emitted..args_end].to_string();
            if !tail.is_empty() {
                self.calls[index].arguments.push_str(&tail);
                out.push(ToolEvent::Arguments { index, text: tail });
            }
            self.buf.replace_range(..end + HERMES_CLOSE.len(), "");
            self.state = State::Text;
            return true;
        }
        // Hold back what may be the call's closing `}`, whitespace and a partial `</tool_call>`.
        let hold = held_suffix(&self.buf, HERMES_CLOSE);
        let mut safe = self.buf[..self.buf.len() - hold].trim_end();
        if let Some(s) = safe.strip_suffix('}') {
            safe = s.trim_end();
        }
        let safe = safe.len().max(emitted);
        if safe > emitted {
            let text = self.buf[emitted..safe].to_string();
            self.calls[index].arguments.push_str(&text);
            out.push(ToolEvent::Arguments { index, text });
            self.state = State::Arguments {
                emitted: safe,
                close,
            };
        }
        false
    }

    /// Drops what closes a call written without markup: whitespace, the doubled `}`, a fence's
    /// end or a closing tag. Waits while the text may still grow into one (unless `end`).
    fn after(&mut self, double: bool, end: bool) -> bool {
        let rest = self.buf.trim_start();
        let mut skip = self.buf.len() - rest.len();
        let mut rest = rest;
        if double {
            if let Some(r) = rest.strip_prefix('}') {
                skip += 1 + r.len() - r.trim_start().len();
                rest = r.trim_start();
            }
        }
        let closer = CLOSERS.iter().find(|c| rest.starts_with(**c));
        let waiting = rest.is_empty()
            || CLOSERS
                .iter()
                .any(|c| c.len() > rest.len() && c.starts_with(rest));
        if closer.is_none() && waiting && !end {
            return false;
        }
        if let Some(c) = closer {
            skip += c.len();
        }
        self.buf.replace_range(..skip, "");
        self.state = State::Text;
        true
    }
}

/// Where the JSON value at the start of `s` (after whitespace) ends, if it does: the bytes up
/// to and with its last character. Strings, escapes and nesting are followed; a scalar ends at
/// the first byte that cannot continue it.
fn json_value_end(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    let start = s.len() - s.trim_start().len();
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    let first = *b.get(start)?;
    if !matches!(first, b'{' | b'[' | b'"') {
        // A number or a literal: up to the first delimiter (it cannot end at the text's end).
        let len =
            s[start..].find(|c: char| c == ',' || c == '}' || c == ']' || c.is_whitespace())?;
        return Some(start + len);
    }
    for (i, &c) in b.iter().enumerate().skip(start) {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => {
                    in_string = false;
                    if depth == 0 {
                        return Some(i + 1);
                    }
                }
                _ => {}
            }
            continue;
        }
        match c {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

/// Length of the longest suffix of `s` that is a proper prefix of `marker`.
fn held_suffix(s: &str, marker: &str) -> usize {
    (1..marker.len().min(s.len() + 1))
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && marker.starts_with(&s[s.len() - n..]))
        .unwrap_or(0)
}

enum Header {
    Incomplete,
    Mismatch,
    /// `{"name": "...", "arguments": ` read: the name and the bytes it took.
    Done {
        name: String,
        consumed: usize,
    },
}

/// Reads `\s*{\s*"name"\s*:\s*"NAME"\s*,\s*"arguments"\s*:\s*` at the start of `s`.
fn parse_header(s: &str) -> Header {
    let b = s.as_bytes();
    let mut i = 0;
    let ws = |i: &mut usize| trigger::skip_ws(b, i);
    let lit = |i: &mut usize, l: &[u8]| trigger::literal(b, i, l);
    macro_rules! expect {
        ($l:expr) => {
            ws(&mut i);
            match lit(&mut i, $l) {
                None => return Header::Incomplete,
                Some(false) => return Header::Mismatch,
                Some(true) => {}
            }
        };
    }
    expect!(b"{");
    expect!(b"\"name\"");
    expect!(b":");
    ws(&mut i);
    if i >= b.len() {
        return Header::Incomplete;
    }
    if b[i] != b'"' {
        return Header::Mismatch;
    }
    // The name string, escapes included.
    let start = i;
    i += 1;
    loop {
        if i >= b.len() {
            return Header::Incomplete;
        }
        match b[i] {
            b'\\' => i += 2,
            b'"' => break,
            _ => i += 1,
        }
    }
    i += 1;
    let Ok(name) = serde_json::from_str::<String>(&s[start..i]) else {
        return Header::Mismatch;
    };
    expect!(b",");
    expect!(b"\"arguments\"");
    expect!(b":");
    ws(&mut i);
    if i >= b.len() {
        return Header::Incomplete;
    }
    Header::Done { name, consumed: i }
}

/// The content and calls of a whole reply (calls without markup recognised for `names`).
pub fn parse_all(text: &str, names: &[String]) -> (String, Vec<ToolCall>) {
    let mut p = ToolCallParser::with_names(names.to_vec());
    let mut content = String::new();
    for e in p.push(text).into_iter().chain(p.finish()) {
        if let ToolEvent::Content(c) = e {
            content.push_str(&c);
        }
    }
    (content, p.calls)
}

#[cfg(test)]
#[path = "tool_parser_tests.rs"]
mod tests;

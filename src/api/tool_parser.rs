//! Finds Hermes-style tool calls in generated text: `<tool_call>\n{"name": "f", "arguments":
//! {...}}\n</tool_call>`. Fed the text piece by piece as it streams, it says what is plain
//! content, when a call starts (its name) and which pieces of its arguments have arrived, holding
//! back only what could still turn out to be markup. The whole reply goes through the same parser,
//! so the streamed pieces of a call always join to exactly the non-streamed `arguments`.

use serde_json::Value;

use super::tools::{HERMES_CLOSE, HERMES_OPEN};

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

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    /// Plain content, looking for `<tool_call>`.
    Text,
    /// Inside `<tool_call>`, before `"arguments":` (or the call's end).
    Header,
    /// Inside a call's arguments; `emitted` bytes of `buf` are out.
    Arguments { emitted: usize },
}

/// The streaming parser of one reply.
#[derive(Clone, Debug)]
pub struct ToolCallParser {
    state: State,
    /// Text not yet settled (the current call, or content held back).
    buf: String,
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
    pub fn new() -> Self {
        ToolCallParser {
            state: State::Text,
            buf: String::new(),
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
                State::Header => self.header(&mut out),
                State::Arguments { emitted } => self.arguments(emitted, &mut out),
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
        let rest = std::mem::take(&mut self.buf);
        match self.state {
            State::Text | State::Header => {
                let rest = if self.state == State::Header {
                    format!("{HERMES_OPEN}{rest}")
                } else {
                    rest
                };
                // Whitespace after the last call is not content.
                if !rest.is_empty() && (self.calls.is_empty() || !rest.trim().is_empty()) {
                    out.push(ToolEvent::Content(rest));
                }
            }
            State::Arguments { emitted } => {
                // A call the reply ended inside (`max_tokens`, a stop sequence): kept if its
                // arguments are whole JSON (the call object's `}` aside), else dropped, so that
                // `calls` never holds arguments a client cannot parse.
                let index = self.calls.len() - 1;
                let tail = &rest[emitted.min(rest.len())..];
                let inner = tail.trim_end();
                let inner = inner.strip_suffix('}').unwrap_or(inner).trim_end();
                let whole = |t: &str| {
                    serde_json::from_str::<Value>(&format!("{}{t}", self.calls[index].arguments))
                        .is_ok()
                };
                let tail = [inner, tail].into_iter().find(|t| whole(t));
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
        if let Some(pos) = self.buf.find(HERMES_OPEN) {
            // Whitespace before a call is not content.
            let before = self.buf[..pos].trim_end().to_string();
            if !before.is_empty() {
                out.push(ToolEvent::Content(before));
            }
            self.buf.replace_range(..pos + HERMES_OPEN.len(), "");
            self.state = State::Header;
            return true;
        }
        // Hold back trailing whitespace and a tail that may grow into `<tool_call>`.
        let hold = held_suffix(&self.buf, HERMES_OPEN);
        let keep_ws = self.buf[..self.buf.len() - hold].trim_end().len();
        let cut = keep_ws;
        if cut > 0 {
            let text: String = self.buf[..cut].to_string();
            self.buf.replace_range(..cut, "");
            out.push(ToolEvent::Content(text));
        }
        false
    }

    fn header(&mut self, out: &mut Vec<ToolEvent>) -> bool {
        match parse_header(&self.buf) {
            Header::Done { name, consumed } => {
                let index = self.calls.len();
                self.calls.push(ToolCall {
                    name: name.clone(),
                    arguments: String::new(),
                });
                out.push(ToolEvent::CallStart { index, name });
                self.buf.replace_range(..consumed, "");
                self.state = State::Arguments { emitted: 0 };
                true
            }
            Header::Incomplete if !self.buf.contains(HERMES_CLOSE) => false,
            // Another layout (arguments first, extra keys): parse the whole call at its end.
            _ => {
                let Some(end) = self.buf.find(HERMES_CLOSE) else {
                    return false;
                };
                let body = self.buf[..end].trim().to_string();
                self.buf.replace_range(..end + HERMES_CLOSE.len(), "");
                self.state = State::Text;
                match serde_json::from_str::<Value>(&body) {
                    Ok(v) if v.get("name").and_then(Value::as_str).is_some() => {
                        let name = v["name"].as_str().expect("checked").to_string();
                        let arguments = match v.get("arguments") {
                            Some(Value::String(s)) => s.clone(),
                            Some(a) => a.to_string(),
                            None => "{}".to_string(),
                        };
                        let index = self.calls.len();
                        self.calls.push(ToolCall {
                            name: name.clone(),
                            arguments: arguments.clone(),
                        });
                        out.push(ToolEvent::CallStart { index, name });
                        out.push(ToolEvent::Arguments {
                            index,
                            text: arguments,
                        });
                    }
                    _ => out.push(ToolEvent::Content(format!(
                        "{HERMES_OPEN}{body}{HERMES_CLOSE}"
                    ))),
                }
                true
            }
        }
    }

    fn arguments(&mut self, emitted: usize, out: &mut Vec<ToolEvent>) -> bool {
        let index = self.calls.len() - 1;
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
            self.state = State::Arguments { emitted: safe };
        }
        false
    }
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
    let ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    let lit = |i: &mut usize, l: &[u8]| -> Option<bool> {
        let n = l.len().min(b.len() - *i);
        if b[*i..*i + n] != l[..n] {
            return Some(false);
        }
        if n < l.len() {
            return None;
        }
        *i += n;
        Some(true)
    };
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

/// The content and calls of a whole reply.
pub fn parse_all(text: &str) -> (String, Vec<ToolCall>) {
    let mut p = ToolCallParser::new();
    let mut content = String::new();
    for e in p.push(text).into_iter().chain(p.finish()) {
        if let ToolEvent::Content(c) = e {
            content.push_str(&c);
        }
    }
    (content, p.calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPLY: &str = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"units\": {\"c\": true}}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";

    #[test]
    fn whole_reply() {
        let (content, calls) = parse_all(REPLY);
        assert_eq!(content, "Let me check.");
        assert_eq!(
            calls,
            vec![
                ToolCall {
                    name: "get_weather".into(),
                    arguments: "{\"city\": \"Paris\", \"units\": {\"c\": true}}".into()
                },
                ToolCall {
                    name: "get_time".into(),
                    arguments: "{}".into()
                }
            ]
        );
    }

    #[test]
    fn streamed_pieces_join_to_the_whole() {
        let whole = parse_all(REPLY);
        for step in 1..8 {
            let mut p = ToolCallParser::new();
            let mut events = Vec::new();
            let chars: Vec<char> = REPLY.chars().collect();
            for piece in chars.chunks(step) {
                events.extend(p.push(&piece.iter().collect::<String>()));
            }
            events.extend(p.finish());
            let mut content = String::new();
            let mut args = vec![String::new(); 2];
            let mut names = Vec::new();
            for e in events {
                match e {
                    ToolEvent::Content(c) => content.push_str(&c),
                    ToolEvent::CallStart { name, .. } => names.push(name),
                    ToolEvent::Arguments { index, text } => args[index].push_str(&text),
                }
            }
            assert_eq!(content, whole.0, "step {step}");
            assert_eq!(names, vec!["get_weather", "get_time"]);
            assert_eq!(args[0], whole.1[0].arguments, "step {step}");
            assert_eq!(args[1], whole.1[1].arguments, "step {step}");
        }
    }

    #[test]
    fn other_layouts_and_plain_text() {
        let (c, calls) =
            parse_all("<tool_call>{\"arguments\": {\"a\": 1}, \"name\": \"f\"}</tool_call>");
        assert_eq!(c, "");
        assert_eq!(calls[0].name, "f");
        assert_eq!(calls[0].arguments, "{\"a\":1}");
        let (c, calls) = parse_all("just <tool text");
        assert_eq!(c, "just <tool text");
        assert!(calls.is_empty());
        let (c, calls) = parse_all("<tool_call>not json</tool_call>");
        assert_eq!(c, "<tool_call>not json</tool_call>");
        assert!(calls.is_empty());
    }

    #[test]
    fn a_call_cut_inside_its_arguments_is_dropped() {
        let cut = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"city\": \"Par";
        let (content, calls) = parse_all(cut);
        assert_eq!(content, "");
        assert!(calls.is_empty(), "{calls:?}");
        let mut p = ToolCallParser::new();
        p.push(cut);
        p.finish();
        assert_eq!(p.num_dropped, 1);
        // Whole arguments without the closing markup are kept, the call's `}` aside.
        let (_, calls) = parse_all("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n");
        assert_eq!(calls[0].arguments, "{\"a\": 1}");
        let (_, calls) = parse_all("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}");
        assert_eq!(calls[0].arguments, "{\"a\": 1}");
    }
}

//! Where a tool call starts in text a model wrote without the template's markup. Small models
//! taught Hermes' `<tool_call>` often write the call bare (`{"name": "f", "arguments": ...}`),
//! in a Markdown fence (```` ```json ````), after another tag (`<function_call>`, `<tools>`,
//! ...) or inside doubled braces (`{{...}}`); llama.cpp's Hermes parser accepts all of these, and
//! so do we. A call is recognised once its object has opened with `"name"` and one of the offered
//! function names, so JSON that merely has a `name` key is not taken for a call.
//!
//! Used twice, so that what is constrained and what is parsed agree: by a lazy constraint to
//! start its grammar at the call's `{` (`super::ConstraintState`), and by `api::tool_parser` to
//! take the call out of the reply.

/// Tags a model may write before a bare call (llama.cpp's Hermes parser accepts the same).
pub const OPEN_TAGS: [&str; 8] = [
    "<tool_call>",
    "<function_call>",
    "<tools>",
    "<tool>",
    "<response>",
    "<json>",
    "<xml>",
    "<JSON>",
];

/// The closing markup a bare call may be followed by: a fence's end or one of the tags' ends.
pub const CLOSERS: [&str; 9] = [
    "```",
    "</tool_call>",
    "</function_call>",
    "</tools>",
    "</tool>",
    "</response>",
    "</json>",
    "</xml>",
    "</JSON>",
];

/// What the text at some position is, read as the start of a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallStart {
    /// Not a call.
    No,
    /// Could still become one (the text ends first).
    Partial,
    /// A call: its object opens at `brace` (after any fence, tag or doubled `{`), `double` when
    /// it sits inside an extra `{`.
    At { brace: usize, double: bool },
}

/// Reads `s` from its start as `(```[json|xml|JSON]?)? ws (TAG)? ws ({ ws)? { ws "name" ws : ws
/// "NAME"` with NAME one of `names`.
pub fn call_start(s: &str, names: &[String]) -> CallStart {
    let b = s.as_bytes();
    let mut i = 0;
    let ws = |i: &mut usize| skip_ws(b, i);
    let lit = |i: &mut usize, l: &[u8]| literal(b, i, l);
    // An optional fence and its language.
    match lit(&mut i, b"```") {
        None => return CallStart::Partial,
        Some(true) => {
            for lang in [&b"json"[..], b"JSON", b"xml"] {
                match lit(&mut i, lang) {
                    None => return CallStart::Partial,
                    Some(true) => break,
                    Some(false) => {}
                }
            }
            ws(&mut i);
        }
        Some(false) => {}
    }
    // An optional tag.
    if i < b.len() && b[i] == b'<' {
        let mut partial = false;
        let mut matched = false;
        for tag in OPEN_TAGS {
            match lit(&mut i, tag.as_bytes()) {
                None => partial = true,
                Some(true) => {
                    matched = true;
                    break;
                }
                Some(false) => {}
            }
        }
        if !matched {
            return if partial {
                CallStart::Partial
            } else {
                CallStart::No
            };
        }
        ws(&mut i);
    }
    if i >= b.len() {
        return CallStart::Partial;
    }
    if b[i] != b'{' {
        return CallStart::No;
    }
    let mut brace = i;
    i += 1;
    ws(&mut i);
    let mut double = false;
    if i < b.len() && b[i] == b'{' {
        double = true;
        brace = i;
        i += 1;
        ws(&mut i);
    }
    for l in [&b"\"name\""[..]] {
        match lit(&mut i, l) {
            None => return CallStart::Partial,
            Some(false) => return CallStart::No,
            Some(true) => {}
        }
    }
    ws(&mut i);
    match lit(&mut i, b":") {
        None => return CallStart::Partial,
        Some(false) => return CallStart::No,
        Some(true) => {}
    }
    ws(&mut i);
    match lit(&mut i, b"\"") {
        None => return CallStart::Partial,
        Some(false) => return CallStart::No,
        Some(true) => {}
    }
    let rest = &s[i..];
    let mut partial = false;
    for name in names {
        let quoted = format!("{name}\"");
        if rest.starts_with(&quoted) {
            return CallStart::At { brace, double };
        }
        partial |= quoted.starts_with(rest);
    }
    if partial {
        CallStart::Partial
    } else {
        CallStart::No
    }
}

/// Moves `i` past whitespace in `b`.
pub fn skip_ws(b: &[u8], i: &mut usize) {
    while *i < b.len() && b[*i].is_ascii_whitespace() {
        *i += 1;
    }
}

/// Reads `l` at `i` in `b`: `Some(true)` (and moves past it) when it is there, `Some(false)`
/// when it is not, None when `b` ends inside it.
pub fn literal(b: &[u8], i: &mut usize, l: &[u8]) -> Option<bool> {
    let n = l.len().min(b.len() - *i);
    if b[*i..*i + n] != l[..n] {
        return Some(false);
    }
    if n < l.len() {
        return None;
    }
    *i += n;
    Some(true)
}

/// Positions where a call's preamble may begin: a fence, a tag or a brace.
pub fn may_begin(c: u8) -> bool {
    matches!(c, b'`' | b'<' | b'{')
}

/// The first call in `s`: where its preamble begins and where its object opens.
pub fn find_call(s: &str, names: &[String]) -> Option<(usize, CallStart)> {
    s.bytes()
        .enumerate()
        .filter(|&(_, c)| may_begin(c))
        .find_map(|(p, _)| match call_start(&s[p..], names) {
            start @ CallStart::At { .. } => Some((p, start)),
            _ => None,
        })
}

/// Where the text that may still grow into a call begins (what a stream must hold back).
pub fn partial_from(s: &str, names: &[String]) -> Option<usize> {
    s.bytes()
        .enumerate()
        .filter(|&(_, c)| may_begin(c))
        .map(|(p, _)| p)
        .find(|&p| call_start(&s[p..], names) == CallStart::Partial)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["get_weather".into(), "f".into()]
    }

    #[test]
    fn the_forms_models_write_are_calls() {
        let n = names();
        let at = |s: &str| find_call(s, &n);
        assert_eq!(
            at("{\"name\": \"get_weather\", \"arguments\": {}}"),
            Some((
                0,
                CallStart::At {
                    brace: 0,
                    double: false
                }
            ))
        );
        assert_eq!(
            at("Sure.\n```json\n{\n  \"name\": \"get_weather\""),
            Some((
                6,
                CallStart::At {
                    brace: 8,
                    double: false
                }
            ))
        );
        assert_eq!(
            at("{{\"name\": \"f\", \"arguments\": {}}}"),
            Some((
                0,
                CallStart::At {
                    brace: 1,
                    double: true
                }
            ))
        );
        assert_eq!(
            at("<function_call> {\"name\":\"f\"}"),
            Some((
                0,
                CallStart::At {
                    brace: 16,
                    double: false
                }
            ))
        );
        // Not calls: another name, a `name` that is not first, plain JSON.
        assert_eq!(at("{\"name\": \"John\", \"age\": 3}"), None);
        assert_eq!(at("{\"city\": \"Paris\", \"name\": \"f\"}"), None);
        assert_eq!(at("<b>{\"name\": \"get_weatherx\"}</b>"), None);
    }

    #[test]
    fn partial_calls_are_held_back() {
        let n = names();
        assert_eq!(partial_from("text ```js", &n), Some(5));
        assert_eq!(partial_from("text {\"na", &n), Some(5));
        assert_eq!(partial_from("text {\"name\": \"get_w", &n), Some(5));
        assert_eq!(partial_from("text <func", &n), Some(5));
        assert_eq!(partial_from("a {\"x\": 1}", &n), None);
        assert_eq!(partial_from("a < b", &n), None);
    }
}

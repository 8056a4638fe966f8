//! llama.cpp's GBNF grammars, read into llguidance's Lark syntax, so a `grammar` written for
//! llama-server constrains the same way here. GBNF (llama.cpp's `grammars/README.md`): rules
//! `name ::= alternatives`, `root` the start, string literals, character classes `[...]` and
//! `[^...]`, `.`, groups, `*` `+` `?` `{m}` `{m,}` `{m,n}`, `#` comments; a rule goes on over
//! lines only inside parentheses or after `|`. In Lark, `root` becomes `start`, classes become
//! regular expressions, and a rule made only of literals, classes and other such rules becomes
//! a terminal (upper case): llguidance lexes it as one lexeme, as llama.cpp matches it character
//! by character; every other rule stays a rule. Called by `api::structured` for a `grammar` in
//! GBNF.

use std::collections::HashMap;
use std::fmt::Write;

/// Whether `text` is GBNF rather than Lark: some line defines a rule with `::=`, and none is a
/// Lark rule or directive (`start:`, `%llguidance`).
pub fn is_gbnf(text: &str) -> bool {
    let lines = || text.lines().map(str::trim_start);
    lines().any(|l| {
        let name_end = l
            .find(|c: char| !(c.is_alphanumeric() || c == '-' || c == '_'))
            .unwrap_or(l.len());
        name_end > 0 && l[name_end..].trim_start().starts_with("::=")
    }) && !lines().any(|l| l.starts_with("%llguidance") || l.starts_with("start:"))
}

/// `text` (GBNF) as Lark; an error names the line and what was expected.
pub fn to_lark(text: &str) -> Result<String, String> {
    let rules = Parser {
        s: text.as_bytes(),
        at: 0,
        depth: 0,
    }
    .grammar()?;
    let index: HashMap<&str, usize> = rules
        .iter()
        .enumerate()
        .map(|(i, r)| (r.name.as_str(), i))
        .collect();
    if !index.contains_key("root") {
        return Err("a GBNF grammar needs a `root` rule".into());
    }
    for rule in &rules {
        let mut missing = None;
        rule.body.refs(&mut |name| {
            if !index.contains_key(name) && missing.is_none() {
                missing = Some(name.to_string());
            }
        });
        if let Some(name) = missing {
            return Err(format!(
                "rule `{}` uses `{name}`, which is not defined",
                rule.name
            ));
        }
    }
    // Terminal rules: made of literals, classes and terminal rules only (a fixpoint).
    let mut terminal = vec![false; rules.len()];
    loop {
        let mut changed = false;
        for (i, rule) in rules.iter().enumerate() {
            if !terminal[i] && rule.name != "root" && rule.body.is_terminal(&|n| terminal[index[n]])
            {
                terminal[i] = true;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let names: Vec<String> = rules
        .iter()
        .enumerate()
        .map(|(i, r)| lark_name(&r.name, terminal[i]))
        .collect();
    let name_of = |n: &str| names[index[n]].clone();
    let mut out = String::from("%llguidance {}\n\n");
    for (i, rule) in rules.iter().enumerate() {
        let _ = writeln!(out, "{}: {}", names[i], rule.body.lark(&name_of, true));
    }
    Ok(out)
}

/// A Lark name for GBNF rule `name`: `root` is `start`; `-` becomes `_`; terminals upper case,
/// rules lower case (with a prefix that keeps the two apart, as GBNF names are case-sensitive).
fn lark_name(name: &str, terminal: bool) -> String {
    if name == "root" {
        return "start".into();
    }
    let base: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if terminal {
        format!("T_{}", base.to_ascii_uppercase())
    } else {
        format!("r_{}", base.to_ascii_lowercase())
    }
}

struct Rule {
    name: String,
    body: Expr,
}

enum Expr {
    /// A string literal, as Lark writes it (escapes kept).
    Literal(String),
    /// A character class or `.`, as a Lark regular expression body.
    Class(String),
    Ref(String),
    Seq(Vec<Expr>),
    Alt(Vec<Expr>),
    Repeat(Box<Expr>, u32, Option<u32>),
}

impl Expr {
    fn refs(&self, f: &mut impl FnMut(&str)) {
        match self {
            Expr::Ref(n) => f(n),
            Expr::Seq(v) | Expr::Alt(v) => v.iter().for_each(|e| e.refs(f)),
            Expr::Repeat(e, ..) => e.refs(f),
            Expr::Literal(_) | Expr::Class(_) => {}
        }
    }

    fn is_terminal(&self, terminal: &impl Fn(&str) -> bool) -> bool {
        match self {
            Expr::Literal(_) | Expr::Class(_) => true,
            Expr::Ref(n) => terminal(n),
            Expr::Seq(v) | Expr::Alt(v) => v.iter().all(|e| e.is_terminal(terminal)),
            Expr::Repeat(e, ..) => e.is_terminal(terminal),
        }
    }

    /// Lark text; `top`: a rule's whole body (alternatives need no parentheses).
    fn lark(&self, name: &dyn Fn(&str) -> String, top: bool) -> String {
        match self {
            Expr::Literal(s) => format!("\"{s}\""),
            Expr::Class(rx) => format!("/{rx}/"),
            Expr::Ref(n) => name(n),
            Expr::Seq(v) if v.is_empty() => "\"\"".into(),
            Expr::Seq(v) => v
                .iter()
                .map(|e| e.lark(name, false))
                .collect::<Vec<_>>()
                .join(" "),
            Expr::Alt(v) => {
                let alts: Vec<String> = v.iter().map(|e| e.lark(name, false)).collect();
                if top {
                    alts.join(" | ")
                } else {
                    format!("({})", alts.join(" | "))
                }
            }
            Expr::Repeat(e, min, max) => {
                let inner = match **e {
                    Expr::Seq(ref v) if v.len() > 1 => format!("({})", e.lark(name, false)),
                    _ => e.lark(name, false),
                };
                match (min, max) {
                    (0, None) => format!("{inner}*"),
                    (1, None) => format!("{inner}+"),
                    (0, Some(1)) => format!("{inner}?"),
                    (m, Some(n)) if m == n => format!("{inner}{{{m}}}"),
                    (m, Some(n)) => format!("{inner}{{{m},{n}}}"),
                    (m, None) => format!("{inner}{{{m},}}"),
                }
            }
        }
    }
}

/// A recursive-descent reader of GBNF, over bytes (names and syntax are ASCII; literals and
/// classes keep their UTF-8 as it is).
struct Parser<'a> {
    s: &'a [u8],
    at: usize,
    /// Parentheses open here (each a level of recursion: capped at MAX_DEPTH).
    depth: usize,
}

/// The deepest nesting of parentheses read (a hostile grammar must not exhaust the stack).
const MAX_DEPTH: usize = 100;

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.at).copied()
    }

    fn error(&self, what: &str) -> String {
        let line = 1 + self.s[..self.at].iter().filter(|&&b| b == b'\n').count();
        let near = String::from_utf8_lossy(&self.s[self.at..(self.at + 20).min(self.s.len())]);
        format!("GBNF line {line}: {what} (at {near:?})")
    }

    /// Skips spaces, tabs and comments, and newlines when `newlines`.
    fn space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                b' ' | b'\t' => self.at += 1,
                b'\r' | b'\n' if newlines => self.at += 1,
                b'#' => {
                    while self.peek().is_some_and(|c| c != b'\n') {
                        self.at += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn grammar(mut self) -> Result<Vec<Rule>, String> {
        let mut rules: Vec<Rule> = Vec::new();
        self.space(true);
        while self.peek().is_some() {
            let name = self.name()?;
            self.space(false);
            if !self.s[self.at..].starts_with(b"::=") {
                return Err(self.error("expected `::=`"));
            }
            self.at += 3;
            self.space(true);
            let body = self.alternatives(false)?;
            match self.peek() {
                None | Some(b'\n' | b'\r') => {}
                Some(_) => return Err(self.error("unexpected character")),
            }
            if let Some(previous) = rules.iter_mut().find(|r| r.name == name) {
                // llama.cpp adds a repeated rule's alternatives to the first.
                let old = std::mem::replace(&mut previous.body, Expr::Seq(Vec::new()));
                previous.body = Expr::Alt(vec![old, body]);
            } else {
                rules.push(Rule { name, body });
            }
            self.space(true);
        }
        if rules.is_empty() {
            return Err("the GBNF grammar defines no rule".into());
        }
        Ok(rules)
    }

    fn name(&mut self) -> Result<String, String> {
        let start = self.at;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
        {
            self.at += 1;
        }
        if self.at == start {
            return Err(self.error("expected a rule name"));
        }
        Ok(String::from_utf8_lossy(&self.s[start..self.at]).into_owned())
    }

    /// Alternatives; `nested`: inside parentheses, where newlines are spaces.
    fn alternatives(&mut self, nested: bool) -> Result<Expr, String> {
        let mut alts = vec![self.sequence(nested)?];
        while self.peek() == Some(b'|') {
            self.at += 1;
            self.space(true);
            alts.push(self.sequence(nested)?);
        }
        Ok(if alts.len() == 1 {
            alts.pop().expect("one")
        } else {
            Expr::Alt(alts)
        })
    }

    fn sequence(&mut self, nested: bool) -> Result<Expr, String> {
        let mut items = Vec::new();
        loop {
            let item = match self.peek() {
                Some(b'"') => self.literal()?,
                Some(b'[') => self.class()?,
                Some(b'.') => {
                    self.at += 1;
                    Expr::Class("(?s:.)".into())
                }
                Some(b'(') => {
                    if self.depth == MAX_DEPTH {
                        return Err(
                            self.error(&format!("parentheses nested deeper than {MAX_DEPTH}"))
                        );
                    }
                    self.at += 1;
                    self.depth += 1;
                    self.space(true);
                    let inner = self.alternatives(true)?;
                    self.depth -= 1;
                    if self.peek() != Some(b')') {
                        return Err(self.error("expected `)`"));
                    }
                    self.at += 1;
                    inner
                }
                Some(c) if c.is_ascii_alphanumeric() || c == b'-' || c == b'_' => {
                    // A name followed by `::=` starts the next rule (after a newline).
                    let save = self.at;
                    let name = self.name()?;
                    let mut look = Parser {
                        s: self.s,
                        at: self.at,
                        depth: 0,
                    };
                    look.space(false);
                    if look.s[look.at..].starts_with(b"::=") {
                        self.at = save;
                        break;
                    }
                    Expr::Ref(name)
                }
                _ => break,
            };
            self.space(nested);
            let item = self.repetition(item)?;
            self.space(nested);
            items.push(item);
        }
        Ok(if items.len() == 1 {
            items.pop().expect("one")
        } else {
            Expr::Seq(items)
        })
    }

    fn repetition(&mut self, item: Expr) -> Result<Expr, String> {
        let (min, max) = match self.peek() {
            Some(b'*') => (0, None),
            Some(b'+') => (1, None),
            Some(b'?') => (0, Some(1)),
            Some(b'{') => {
                self.at += 1;
                self.space(true);
                let min = self.int()?;
                self.space(true);
                let max = match self.peek() {
                    Some(b'}') => Some(min),
                    Some(b',') => {
                        self.at += 1;
                        self.space(true);
                        let max = if self.peek().is_some_and(|c| c.is_ascii_digit()) {
                            Some(self.int()?)
                        } else {
                            None
                        };
                        self.space(true);
                        if self.peek() != Some(b'}') {
                            return Err(self.error("expected `}`"));
                        }
                        max
                    }
                    _ => return Err(self.error("expected `,` or `}`")),
                };
                if max.is_some_and(|max| max < min) {
                    return Err(self.error("a repetition's maximum is below its minimum"));
                }
                (min, max)
            }
            _ => return Ok(item),
        };
        self.at += 1;
        Ok(Expr::Repeat(Box::new(item), min, max))
    }

    fn int(&mut self) -> Result<u32, String> {
        let start = self.at;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.at += 1;
        }
        std::str::from_utf8(&self.s[start..self.at])
            .ok()
            .and_then(|t| t.parse().ok())
            .filter(|&n: &u32| n <= 10_000)
            .ok_or_else(|| self.error("expected a count up to 10000"))
    }

    /// One character of a literal or class, escapes kept in the form Lark and the regex crate
    /// read (`\xHH`, `\uHHHH` and `\UHHHHHHHH` as `\u{...}`).
    fn char(&mut self) -> Result<String, String> {
        let Some(c) = self.peek() else {
            return Err(self.error("unexpected end of the grammar"));
        };
        if c != b'\\' {
            let len = utf8_len(c);
            let end = (self.at + len).min(self.s.len());
            let text = String::from_utf8_lossy(&self.s[self.at..end]).into_owned();
            self.at = end;
            return Ok(text);
        }
        let Some(&e) = self.s.get(self.at + 1) else {
            return Err(self.error("an escape at the end"));
        };
        self.at += 2;
        let hex = |p: &mut Self, n: usize| -> Result<String, String> {
            let digits = p.s.get(p.at..p.at + n).unwrap_or_default();
            if digits.len() != n || !digits.iter().all(u8::is_ascii_hexdigit) {
                return Err(p.error("a bad hexadecimal escape"));
            }
            p.at += n;
            let v =
                u32::from_str_radix(std::str::from_utf8(digits).unwrap_or("0"), 16).unwrap_or(0);
            Ok(format!("\\u{{{v:x}}}"))
        };
        match e {
            b'n' | b'r' | b't' | b'\\' | b'"' | b'[' | b']' | b'-' | b'^' | b'/' => {
                Ok(format!("\\{}", e as char))
            }
            b'x' => hex(self, 2),
            b'u' => hex(self, 4),
            b'U' => hex(self, 8),
            other => Err(self.error(&format!("an unknown escape `\\{}`", other as char))),
        }
    }

    fn literal(&mut self) -> Result<Expr, String> {
        self.at += 1;
        let mut s = String::new();
        while self.peek() != Some(b'"') {
            let c = self.char()?;
            // Lark strings: a `/` or `-` needs no escape, `\u{..}` is not a Lark string escape.
            match c.as_str() {
                "\\/" => s.push('/'),
                "\\-" => s.push('-'),
                "\\[" => s.push('['),
                "\\]" => s.push(']'),
                "\\^" => s.push('^'),
                c if c.starts_with("\\u{") => {
                    let v = u32::from_str_radix(&c[3..c.len() - 1], 16).unwrap_or(0);
                    match char::from_u32(v) {
                        Some(ch) if ch != '"' && ch != '\\' && !ch.is_control() => s.push(ch),
                        _ => {
                            let _ = write!(s, "\\u{v:04x}");
                        }
                    }
                }
                c => s.push_str(c),
            }
        }
        self.at += 1;
        Ok(Expr::Literal(s))
    }

    fn class(&mut self) -> Result<Expr, String> {
        self.at += 1;
        let mut rx = String::from("[");
        if self.peek() == Some(b'^') {
            self.at += 1;
            rx.push('^');
        }
        while self.peek() != Some(b']') {
            let c = self.char()?;
            match c.as_str() {
                // Special in a regex class, plain in GBNF's.
                "[" | "/" | "&" | "~" => {
                    rx.push('\\');
                    rx.push_str(&c);
                }
                "\\\"" => rx.push('"'),
                _ => rx.push_str(&c),
            }
        }
        self.at += 1;
        rx.push(']');
        Ok(Expr::Class(rx))
    }
}

fn utf8_len(first: u8) -> usize {
    match first {
        0xF0..=0xF7 => 4,
        0xE0..=0xEF => 3,
        0xC0..=0xDF => 2,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rules_classes_repetitions_and_comments() {
        let g = "# a list\nroot ::= item+\nitem ::= \"- \" [a-z]{1,8} \"\\n\" # one\n";
        assert!(is_gbnf(g));
        let lark = to_lark(g).unwrap();
        assert!(lark.contains("start: T_ITEM+"), "{lark}");
        assert!(
            lark.contains("T_ITEM: \"- \" /[a-z]/{1,8} \"\\n\""),
            "{lark}"
        );
    }

    #[test]
    fn rules_with_rule_references_stay_rules_and_lines_continue_in_groups() {
        let g = "root ::= (\n  expr\n  | \"x\"\n)\nexpr ::= term (\"+\" term)*\nterm ::= [0-9]+ | \"(\" expr \")\"\n";
        let lark = to_lark(g).unwrap();
        assert!(lark.contains("start: r_expr | \"x\""), "{lark}");
        assert!(
            lark.contains("r_term: /[0-9]/+ | \"(\" r_expr \")\""),
            "{lark}"
        );
    }

    #[test]
    fn errors_name_the_line() {
        assert!(to_lark("root ::= foo\n").unwrap_err().contains("`foo`"));
        assert!(to_lark("item ::= \"a\"\n").unwrap_err().contains("root"));
        assert!(to_lark("root ::= \"a\n").unwrap_err().contains("line"));
        assert!(to_lark("root ::= [a-z]{3,1}\n")
            .unwrap_err()
            .contains("maximum"));
        let deep = format!(
            "root ::= {}\"a\"{}\n",
            "(".repeat(100_000),
            ")".repeat(100_000)
        );
        assert!(to_lark(&deep).unwrap_err().contains("nested deeper"));
        assert!(!is_gbnf("start: \"a\"\n"));
        assert!(!is_gbnf("%llguidance {}\nstart: x\nx ::= 1"));
    }
}

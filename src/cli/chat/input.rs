//! Turning typed lines into chat inputs: multi-line messages (a trailing backslash continues
//! the line; `"""` opens and closes a block), keys typed ahead while a reply streamed, and the
//! history file's place. Used by both the terminal and the pipe mode of `chat`.

use std::path::PathBuf;

/// Collects lines until they make one complete input.
#[derive(Debug, Default)]
pub struct LineAssembler {
    lines: Vec<String>,
    /// Inside a `"""` block.
    in_block: bool,
}

impl LineAssembler {
    /// Whether a multi-line input has begun (the prompt shows `...`).
    pub fn in_progress(&self) -> bool {
        self.in_block || !self.lines.is_empty()
    }

    /// Forgets a half-typed multi-line input (Ctrl+C).
    pub fn reset(&mut self) {
        self.lines.clear();
        self.in_block = false;
    }

    /// Adds one line; returns the complete input once there is one.
    pub fn push(&mut self, line: &str) -> Option<String> {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if self.in_block {
            if let Some(before) = line.trim_end().strip_suffix("\"\"\"") {
                if !before.is_empty() {
                    self.lines.push(before.to_string());
                }
                self.in_block = false;
                return Some(self.take());
            }
            self.lines.push(line.to_string());
            return None;
        }
        if self.lines.is_empty() {
            if let Some(after) = line.trim_start().strip_prefix("\"\"\"") {
                // `"""text"""` on one line is a complete input.
                if let Some(inner) = after.trim_end().strip_suffix("\"\"\"") {
                    return Some(inner.to_string());
                }
                self.in_block = true;
                if !after.is_empty() {
                    self.lines.push(after.to_string());
                }
                return None;
            }
        }
        if let Some(before) = line.strip_suffix('\\') {
            self.lines.push(before.to_string());
            return None;
        }
        self.lines.push(line.to_string());
        Some(self.take())
    }

    /// What is left at end of input, as a last input.
    pub fn finish(&mut self) -> Option<String> {
        self.in_block = false;
        (!self.lines.is_empty()).then(|| self.take())
    }

    fn take(&mut self) -> String {
        std::mem::take(&mut self.lines).join("\n")
    }
}

/// Keys typed while a reply was streaming, to be read before the terminal is asked again.
#[derive(Debug, Default)]
pub struct TypeAhead {
    text: String,
}

impl TypeAhead {
    /// Adds raw key bytes: Enter ends a line, backspace erases, escape sequences (arrows)
    /// and other control keys are dropped.
    pub fn push_keys(&mut self, bytes: &[u8]) {
        let s = String::from_utf8_lossy(bytes);
        let mut chars = s.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\r' | '\n' => self.text.push('\n'),
                '\u{7f}' | '\u{8}' => {
                    if !self.text.ends_with('\n') {
                        self.text.pop();
                    }
                }
                '\u{1b}' => {
                    // ESC [ ... final byte, or ESC O x.
                    if let Some('[' | 'O') = chars.peek() {
                        chars.next();
                        while let Some(&n) = chars.peek() {
                            chars.next();
                            if n.is_ascii_alphabetic() || n == '~' {
                                break;
                            }
                        }
                    }
                }
                c if c.is_control() => {}
                c => self.text.push(c),
            }
        }
    }

    /// The first complete line typed ahead, if any.
    pub fn take_line(&mut self) -> Option<String> {
        let end = self.text.find('\n')?;
        let line = self.text[..end].to_string();
        self.text.replace_range(..=end, "");
        Some(line)
    }

    /// The unfinished rest, to pre-fill the next prompt with.
    pub fn take_partial(&mut self) -> String {
        std::mem::take(&mut self.text)
    }
}

/// The history file: `$XDG_DATA_HOME/edge-llm/history`, else `~/.local/share/edge-llm/history`.
pub fn history_path() -> Option<PathBuf> {
    let data = std::env::var_os("XDG_DATA_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .map(|h| PathBuf::from(h).join(".local/share"))
        })?;
    Some(data.join("edge-llm").join("history"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backslash_continues_and_blocks_span_lines() {
        let mut a = LineAssembler::default();
        assert_eq!(a.push("one line"), Some("one line".into()));
        assert_eq!(a.push("first \\"), None);
        assert!(a.in_progress());
        assert_eq!(a.push("second"), Some("first \nsecond".into()));
        assert_eq!(a.push("\"\"\"start"), None);
        assert_eq!(a.push(""), None);
        assert_eq!(a.push("  indented"), None);
        assert_eq!(a.push("end\"\"\""), Some("start\n\n  indented\nend".into()));
        assert_eq!(a.push("\"\"\"inline\"\"\""), Some("inline".into()));
        assert_eq!(a.push("\"\"\""), None);
        assert_eq!(a.push("x"), None);
        assert_eq!(a.finish(), Some("x".into()));
        assert!(!a.in_progress());
    }

    #[test]
    fn type_ahead_splits_lines_and_drops_escapes() {
        let mut t = TypeAhead::default();
        t.push_keys(b"/new\rhel\x1b[Dlx\x7fo\nwor");
        assert_eq!(t.take_line(), Some("/new".into()));
        assert_eq!(t.take_line(), Some("hello".into()));
        assert_eq!(t.take_line(), None);
        assert_eq!(t.take_partial(), "wor");
    }
}

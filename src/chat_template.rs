//! Chat formatting: a model's `tokenizer.chat_template` (or a `--chat-template FILE`) rendered
//! with minijinja the way Hugging Face's `apply_chat_template` renders it, and the rendered
//! prompt turned into token ids.
//!
//! Hugging Face's Jinja environment is reproduced where templates notice: `trim_blocks` and
//! `lstrip_blocks`, loop controls, Python string and dict methods (`minijinja-contrib`'s
//! pycompat), `raise_exception(msg)`, `strftime_now(fmt)`, a `tojson` that writes what Python's
//! `json.dumps(ensure_ascii=False)` writes, and the variables `messages`,
//! `add_generation_prompt`, `bos_token` and `eos_token`.
//!
//! Callers: the chat terminal, `run --jsonl` and the server's `/v1/chat/completions`.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{anyhow, Context, Result};
use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::model::Model;
use crate::tokenizer::Tokenizer;

/// The GGUF key holding the template.
pub const TEMPLATE_KEY: &str = "tokenizer.chat_template";

/// Built-in templates for GGUF files that carry none, keyed by the turn marker whose presence
/// in the vocabulary identifies the format.
const BUILTIN_TEMPLATES: [(&str, &str, &str); 2] = [
    (
        "<start_of_turn>",
        "Gemma",
        include_str!("chat_templates/gemma.jinja"),
    ),
    (
        "<|im_start|>",
        "ChatML",
        include_str!("chat_templates/chatml.jinja"),
    ),
];

/// The built-in template (name, source) for a vocabulary with a known turn marker.
pub fn builtin_for(tokenizer: &Tokenizer) -> Option<(&'static str, &'static str)> {
    BUILTIN_TEMPLATES
        .iter()
        .find(|(marker, _, _)| tokenizer.find_token(marker).is_some())
        .map(|&(_, name, source)| (name, source))
}

/// One turn of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template and the special-token texts it may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// The template's text (what it teaches about tool calls is read from it).
    source: String,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

impl ChatTemplate {
    /// The template stored in the model's GGUF, with the model's BOS and EOS texts. A file
    /// without one gets the built-in template its vocabulary's turn markers name (Gemma's
    /// `<start_of_turn>`, ChatML's `<|im_start|>`), said once on stderr; a vocabulary with
    /// neither is an error asking for `--chat-template FILE`.
    pub fn from_model(model: &Model) -> Result<ChatTemplate> {
        let path = model.file.path().display();
        let (source, what) = match model.file.get(TEMPLATE_KEY) {
            Some(_) => {
                let source = model
                    .file
                    .get_str(TEMPLATE_KEY)
                    .with_context(|| format!("reading {TEMPLATE_KEY}"))?;
                (source, TEMPLATE_KEY.to_string())
            }
            None => {
                let Some((name, source)) = builtin_for(&model.tokenizer) else {
                    anyhow::bail!(
                        "{path} has no {TEMPLATE_KEY}; pass a Jinja chat template with --chat-template FILE"
                    );
                };
                eprintln!("{path} has no {TEMPLATE_KEY}; using the built-in {name} template");
                (source, format!("the built-in {name} template"))
            }
        };
        let template = ChatTemplate::from_source(source)
            .with_context(|| format!("compiling {what} of {path}"))?;
        Ok(template.with_tokens_of(&model.tokenizer))
    }

    /// A template read from a file (the `--chat-template FILE` override). Its `bos_token` and
    /// `eos_token` are empty until [`ChatTemplate::with_tokens_of`] names the model's.
    pub fn from_file(path: &Path) -> Result<ChatTemplate> {
        let source = std::fs::read_to_string(path)
            .with_context(|| format!("reading chat template {}", path.display()))?;
        ChatTemplate::from_source(&source)
            .with_context(|| format!("compiling chat template {}", path.display()))
    }

    /// `--chat-template FILE` if given, else the model's own template; either way with the
    /// model's BOS and EOS texts.
    pub fn load(model: &Model, override_path: Option<&Path>) -> Result<ChatTemplate> {
        match override_path {
            Some(path) => Ok(ChatTemplate::from_file(path)?.with_tokens_of(&model.tokenizer)),
            None => ChatTemplate::from_model(model),
        }
    }

    /// Compiles a template from its text.
    pub fn from_source(source: &str) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| anyhow!("{e}"))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned("chat_template", source.to_string())
            .map_err(|e| anyhow!("{}", describe(&e)))?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            bos_token: String::new(),
            eos_token: String::new(),
        })
    }

    /// Sets `bos_token` and `eos_token` to the vocabulary's texts of those tokens.
    pub fn with_tokens_of(mut self, tokenizer: &Tokenizer) -> ChatTemplate {
        self.bos_token = tokenizer
            .bos_id()
            .map(|id| tokenizer.token_text(id).to_string())
            .unwrap_or_default();
        self.eos_token = tokenizer
            .eos_id()
            .map(|id| tokenizer.token_text(id).to_string())
            .unwrap_or_default();
        self
    }

    /// The prompt text for `messages`; with `add_generation_prompt` it ends where the
    /// assistant's reply begins.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let messages: Value = messages
            .iter()
            .map(|m| {
                let map: BTreeMap<String, Value> = [
                    ("role".to_string(), Value::from(m.role.as_str())),
                    ("content".to_string(), Value::from(m.content.as_str())),
                ]
                .into();
                Value::from_object(map)
            })
            .collect();
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        self.render_context(ctx)
    }

    /// Renders the template with `ctx`; both render paths end here.
    fn render_context(&self, ctx: minijinja::Value) -> Result<String> {
        let template = self
            .env
            .get_template("chat_template")
            .map_err(|e| anyhow!("{}", describe(&e)))?;
        template
            .render(ctx)
            .map_err(|e| anyhow!("cannot render the chat template: {}", describe(&e)))
    }

    /// The template's text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders messages given as JSON objects, passed to the template as they are (assistant
    /// `tool_calls`, `tool` messages with `tool_call_id`), and `tools` when given, the way Hugging
    /// Face's `apply_chat_template(messages, tools=...)` does.
    pub fn render_json(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let ctx = minijinja::context! {
            messages => messages.iter().map(from_json).collect::<Vec<_>>(),
            tools => tools.map(from_json),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        self.render_context(ctx)
    }

    /// Renders `messages` and tokenizes the result (see [`encode_prompt`]).
    pub fn encode(
        &self,
        tokenizer: &Tokenizer,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>> {
        let prompt = self.render(messages, add_generation_prompt)?;
        encode_prompt(tokenizer, &prompt)
    }
}

/// A JSON value as a template value (objects with their keys sorted).
fn from_json(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match v {
        J::Null => Value::from(()),
        J::Bool(b) => Value::from(*b),
        J::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Value::from(i),
            (None, Some(f)) => Value::from(f),
            _ => Value::from(n.to_string()),
        },
        J::String(s) => Value::from(s.as_str()),
        J::Array(items) => items.iter().map(from_json).collect::<Vec<_>>().into(),
        J::Object(map) => {
            let map: BTreeMap<String, Value> =
                map.iter().map(|(k, v)| (k.clone(), from_json(v))).collect();
            Value::from_object(map)
        }
    }
}

/// Token ids of a rendered chat prompt: special tokens written by the template become their
/// ids, and BOS goes first when the model wants one, unless the template already wrote it.
pub fn encode_prompt(tokenizer: &Tokenizer, prompt: &str) -> Result<Vec<u32>> {
    let mut ids = tokenizer.encode(prompt, false, true)?;
    if let Some(bos) = tokenizer.bos_id() {
        if tokenizer.add_bos_default() && ids.first() != Some(&bos) {
            ids.insert(0, bos);
        }
    }
    Ok(ids)
}

/// A minijinja error with its cause chain on one line (the template's own message for
/// `raise_exception`, the line for syntax errors).
fn describe(e: &Error) -> String {
    let mut out = match (e.kind(), e.detail()) {
        (ErrorKind::InvalidOperation, Some(detail)) if detail.starts_with(RAISED) => {
            detail[RAISED.len()..].to_string()
        }
        _ => e.to_string(),
    };
    if let Some(line) = e.line() {
        if !out.contains("line") {
            out.push_str(&format!(" (line {line})"));
        }
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

const RAISED: &str = "the template raised: ";

/// `raise_exception(msg)`: Hugging Face's way for a template to refuse a conversation.
fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISED}{msg}"),
    ))
}

/// `tojson`, as Hugging Face's: Python's `json.dumps(x, ensure_ascii=False, indent=indent)`
/// (keys in the order given, `", "` and `": "` separators, no HTML escaping).
fn tojson(value: Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(usize::try_from(v)?),
    };
    // Python's sort_keys and separators: accepted; separators are honoured only in their
    // default form.
    let _: Option<bool> = kwargs.get("sort_keys")?;
    let _: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let mut out = Vec::new();
    let mut writer = serde_json::Serializer::with_formatter(&mut out, PythonJson::new(indent));
    value
        .serialize(&mut writer)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let out = String::from_utf8(out).expect("serde_json writes UTF-8");
    Ok(Value::from_safe_string(out))
}

/// serde_json's output in Python's `json.dumps` layout: `", "` and `": "` on one line; with an
/// indent, `","` then a new line and `indent` spaces per level (serde_json's own pretty printer
/// with Python's separators). Non-finite floats come out as `null`, as serde_json writes them.
struct PythonJson {
    indent: Option<usize>,
    depth: usize,
    /// The container just closed held something (its closing bracket goes on a new line).
    has_value: bool,
}

impl PythonJson {
    fn new(indent: Option<usize>) -> Self {
        PythonJson {
            indent,
            depth: 0,
            has_value: false,
        }
    }

    /// Before an item: the separator, then (indented) a new line.
    fn item<W: ?Sized + std::io::Write>(&self, w: &mut W, first: bool) -> std::io::Result<()> {
        match self.indent {
            None if first => Ok(()),
            None => w.write_all(b", "),
            Some(n) => {
                w.write_all(if first { b"\n" } else { b",\n" })?;
                w.write_all(" ".repeat(n * self.depth).as_bytes())
            }
        }
    }

    fn close<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        bracket: &[u8],
    ) -> std::io::Result<()> {
        self.depth -= 1;
        if let (Some(n), true) = (self.indent, self.has_value) {
            w.write_all(b"\n")?;
            w.write_all(" ".repeat(n * self.depth).as_bytes())?;
        }
        self.has_value = true;
        w.write_all(bracket)
    }
}

impl serde_json::ser::Formatter for PythonJson {
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.depth += 1;
        self.has_value = false;
        w.write_all(b"[")
    }

    fn end_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.close(w, b"]")
    }

    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.item(w, first)
    }

    fn end_array_value<W: ?Sized + std::io::Write>(&mut self, _: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn begin_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.depth += 1;
        self.has_value = false;
        w.write_all(b"{")
    }

    fn end_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.close(w, b"}")
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.item(w, first)
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }

    fn end_object_value<W: ?Sized + std::io::Write>(&mut self, _: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}

/// `strftime_now(fmt)`: the current UTC time in a C `strftime` format (the common fields:
/// `%Y %y %m %d %e %B %b %A %a %H %I %M %S %p %j %%`).
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    strftime(&format, secs)
}

fn strftime(format: &str, unix_secs: u64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = (unix_secs / 86_400) as i64;
    let secs_of_day = unix_secs % 86_400;
    let (hour, minute, second) = (secs_of_day / 3600, secs_of_day / 60 % 60, secs_of_day % 60);
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let before: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = before[(month - 1) as usize] + day + i64::from(leap && month > 2);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday.
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:2}")),
            Some('B') => out.push_str(month_name),
            Some('b') | Some('h') => out.push_str(&month_name[..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('H') => out.push_str(&format!("{hour:02}")),
            Some('I') => out.push_str(&format!("{:02}", (hour + 11) % 12 + 1)),
            Some('M') => out.push_str(&format!("{minute:02}")),
            Some('S') => out.push_str(&format!("{second:02}")),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn default_model() -> Option<Model> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("models")
            .join(crate::flags::DEFAULT_MODEL_FILE);
        if !path.is_file() {
            eprintln!(
                "skipping: {} is missing (scripts/fetch-model.sh)",
                path.display()
            );
            return None;
        }
        Some(Model::load(&path).expect("loading the default model"))
    }

    #[test]
    fn default_model_template_renders_chatml_with_default_system_prompt() {
        let Some(model) = default_model() else { return };
        let t = ChatTemplate::from_model(&model).unwrap();
        let prompt = t
            .render(&[ChatMessage::new("user", "Hi there")], true)
            .unwrap();
        assert_eq!(
            prompt,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
             <|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
        );
        let own = t
            .render(
                &[
                    ChatMessage::new("system", "Be brief."),
                    ChatMessage::new("user", "Hi"),
                    ChatMessage::new("assistant", "Hello!"),
                ],
                false,
            )
            .unwrap();
        assert_eq!(own, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n");
        let ids = t
            .encode(&model.tokenizer, &[ChatMessage::new("user", "Hi")], true)
            .unwrap();
        assert_eq!(ids[0], 1, "<|im_start|> is one control token");
        assert_eq!(ids.iter().filter(|&&id| id == 1).count(), 3);
        assert_eq!(ids.iter().filter(|&&id| id == 2).count(), 2);
    }

    #[test]
    fn raise_exception_gives_a_clear_error() {
        let t = ChatTemplate::from_source(
            "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}\
             {{ raise_exception('Conversation roles must be user or assistant') }}{% endif %}\
             {{ m.content }}{% endfor %}",
        )
        .unwrap();
        assert_eq!(
            t.render(&[ChatMessage::new("user", "ok")], false).unwrap(),
            "ok"
        );
        let err = t
            .render(&[ChatMessage::new("system", "no")], false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot render the chat template"), "{err}");
        assert!(
            err.contains("Conversation roles must be user or assistant"),
            "{err}"
        );
    }

    #[test]
    fn syntax_errors_and_missing_files_are_reported() {
        let err = ChatTemplate::from_source("{% for m in messages %}").unwrap_err();
        assert!(
            format!("{err:#}").contains("line") || format!("{err:#}").contains("endfor"),
            "{err:#}"
        );
        let err = ChatTemplate::from_file(Path::new("/nonexistent/template.jinja")).unwrap_err();
        assert!(format!("{err:#}").contains("/nonexistent/template.jinja"));
    }

    #[test]
    fn huggingface_environment_features() {
        // trim_blocks + lstrip_blocks, pycompat methods, loop controls, bos/eos, tojson.
        let t = ChatTemplate::from_source(
            "{{ bos_token }}\n  {% for m in messages %}\n    {% if m.role == 'skip' %}{% continue %}{% endif %}\n\
             {{ m.role.upper() }}: {{ m.content.strip() }}|{{ m | tojson }}\n  {% endfor %}\n\
             {% if add_generation_prompt %}ASSISTANT:{% endif %}",
        )
        .unwrap();
        let mut t = t;
        t.bos_token = "<s>".into();
        let out = t
            .render(
                &[
                    ChatMessage::new("user", "  héllo <x> "),
                    ChatMessage::new("skip", "x"),
                ],
                true,
            )
            .unwrap();
        assert_eq!(
            out,
            "<s>\nUSER: héllo <x>|{\"content\": \"  héllo <x> \", \"role\": \"user\"}\nASSISTANT:"
        );
    }

    #[test]
    fn tojson_indent_and_strftime() {
        let t = ChatTemplate::from_source("{{ {'a': [1, 2.5, none, true]} | tojson(indent=2) }}")
            .unwrap();
        assert_eq!(
            t.render(&[], false).unwrap(),
            "{\n  \"a\": [\n    1,\n    2.5,\n    null,\n    true\n  ]\n}"
        );
        // Python's one-line separators, empty containers, nesting, no escaping of non-ASCII
        // or `<`, and an indent of 0 (new lines, no spaces).
        let t = ChatTemplate::from_source(
            "{{ {'b': [], 'c': {}, 'd': [{'e': 'é<'}, [1]]} | tojson }}|\
             {{ [1, {'x': [2]}] | tojson(indent=0) }}|{{ [] | tojson(indent=2) }}",
        )
        .unwrap();
        assert_eq!(
            t.render(&[], false).unwrap(),
            "{\"b\": [], \"c\": {}, \"d\": [{\"e\": \"é<\"}, [1]]}|\
             [\n1,\n{\n\"x\": [\n2\n]\n}\n]|[]"
        );
        // 2024-02-29 13:05:09 UTC, a Thursday.
        assert_eq!(
            strftime("%d %b %Y %H:%M:%S %A %j %%", 1_709_211_909),
            "29 Feb 2024 13:05:09 Thursday 060 %"
        );
    }

    #[test]
    fn bos_is_not_doubled() {
        let Some(model) = default_model() else { return };
        let tok = &model.tokenizer;
        let text = "<|im_start|>user\nHi<|im_end|>\n";
        let ids = encode_prompt(tok, text).unwrap();
        let plain = tok.encode(text, false, true).unwrap();
        match tok.bos_id().filter(|_| tok.add_bos_default()) {
            Some(bos) if plain[0] == bos => assert_eq!(ids, plain),
            Some(bos) => assert_eq!(ids[0], bos),
            None => assert_eq!(ids, plain),
        }
    }
}

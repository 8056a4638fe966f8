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
use minijinja::value::Value;
use minijinja::{Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::gguf::GgufFile;
use crate::tokenizer::Tokenizer;

mod python_json;
mod strftime;

use python_json::tojson;
use strftime::strftime_now;

/// The GGUF key holding the template.
pub const TEMPLATE_KEY: &str = "tokenizer.chat_template";

/// Built-in templates for GGUF files that carry none, keyed by the turn marker whose presence
/// in the vocabulary identifies the format.
const BUILTIN_TEMPLATES: [(&str, &str, &str); 2] = [
    ("<start_of_turn>", "Gemma", include_str!("gemma.jinja")),
    ("<|im_start|>", "ChatML", include_str!("chatml.jinja")),
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
    /// The template stored in the model's GGUF `file`, with the BOS and EOS texts of its
    /// `tokenizer`. A file without one gets the built-in template its vocabulary's turn markers
    /// name (Gemma's `<start_of_turn>`, ChatML's `<|im_start|>`), said once on stderr; a
    /// vocabulary with neither is an error asking for `--chat-template FILE`.
    pub fn from_gguf(file: &GgufFile, tokenizer: &Tokenizer) -> Result<ChatTemplate> {
        let path = file.path().display();
        let (source, what) = match file.get(TEMPLATE_KEY) {
            Some(_) => {
                let source = file
                    .get_str(TEMPLATE_KEY)
                    .with_context(|| format!("reading {TEMPLATE_KEY}"))?;
                (source, TEMPLATE_KEY.to_string())
            }
            None => {
                let Some((name, source)) = builtin_for(tokenizer) else {
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
        Ok(template.with_tokens_of(tokenizer))
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
    pub fn load(
        file: &GgufFile,
        tokenizer: &Tokenizer,
        override_path: Option<&Path>,
    ) -> Result<ChatTemplate> {
        match override_path {
            Some(path) => Ok(ChatTemplate::from_file(path)?.with_tokens_of(tokenizer)),
            None => ChatTemplate::from_gguf(file, tokenizer),
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
        self.render_json_with(
            messages,
            tools,
            add_generation_prompt,
            &serde_json::Map::new(),
        )
    }

    /// [`Self::render_json`] with further template variables (a request's
    /// `chat_template_kwargs` and `reasoning_effort`); the five above win over them.
    pub fn render_json_with(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        let extra: BTreeMap<String, Value> = extra
            .iter()
            .map(|(k, v)| (k.clone(), from_json(v)))
            .collect();
        let ctx = minijinja::context! {
            messages => messages.iter().map(from_json).collect::<Vec<_>>(),
            tools => tools.map(from_json),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
            ..Value::from_object(extra)
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

#[cfg(test)]
mod tests {
    use super::strftime::strftime;
    use super::*;

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
}

//! A request body's fields, read by the one set of rules both faces use (`serve`'s
//! `/v1/completions` and `/v1/chat/completions`, and each line of `run --jsonl`): the body is
//! read field by field, so that a wrong type or a value out of range is refused naming the
//! field (`param`). Unknown fields are ignored, as OpenAI clients send extras; fields this
//! engine cannot honour (`echo`, `functions`, ...) are refused rather than
//! ignored; `response_format`, `regex`, `grammar` and `tools` are read by `structured` and
//! `tools`. Called by `plan`, which turns a whole body into an engine request.

use serde_json::{Map, Value};

use super::RequestError;
use crate::chat_template::ChatMessage;
use crate::engine::sampler::SamplingParams;

/// Most completions per request (the engine's limit).
pub const MAX_N: u64 = 16;
/// Most alternatives per token in `logprobs`.
pub const MAX_TOP_LOGPROBS: u64 = 20;
/// Most stop strings.
pub const MAX_STOP: usize = 16;
/// The roles a message may have; OpenAI's `developer` is read as `system`.
pub const MESSAGE_ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

/// How deep serde_json lets arrays and objects nest before it refuses the text (its recursion
/// limit).
pub const MAX_JSON_DEPTH: usize = 128;

/// Whether serde_json refused JSON text because it nests past [`MAX_JSON_DEPTH`] levels, which
/// is not a syntax error and is reported apart (see [`too_deep_message`]).
pub fn json_too_deep(e: &serde_json::Error) -> bool {
    e.to_string().starts_with("recursion limit exceeded")
}

/// The message for JSON text (`what`: "the request body", "line 3") nested past
/// [`MAX_JSON_DEPTH`] levels.
pub fn too_deep_message(what: &str, e: &serde_json::Error) -> String {
    format!(
        "{what} is nested too deeply: more than {MAX_JSON_DEPTH} levels of arrays and objects \
         (at line {}, column {})",
        e.line(),
        e.column()
    )
}

pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Typed, named access to a body's fields; `null` counts as absent.
pub struct Fields<'a>(pub &'a Map<String, Value>);

impl<'a> Fields<'a> {
    pub fn get(&self, name: &str) -> Option<&'a Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    fn wrong(&self, name: &str, want: &str) -> RequestError {
        let got = match self.0.get(name) {
            Some(Value::Number(n)) => n.to_string(),
            Some(v) => type_name(v).to_string(),
            None => "nothing".to_string(),
        };
        RequestError::invalid(name, format!("`{name}` must be {want}, got {got}"))
    }

    pub fn bool(&self, name: &str) -> Result<Option<bool>, RequestError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(self.wrong(name, "a boolean")),
        }
    }

    pub fn str(&self, name: &str) -> Result<Option<&'a str>, RequestError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(self.wrong(name, "a string")),
        }
    }

    /// A number within `[lo, hi]`.
    pub fn number(&self, name: &str, lo: f64, hi: f64) -> Result<Option<f64>, RequestError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => {
                let v = n.as_f64().unwrap_or(f64::NAN);
                if v >= lo && v <= hi {
                    Ok(Some(v))
                } else {
                    Err(RequestError::invalid(
                        name,
                        format!("`{name}` must be between {lo} and {hi}, got {n}"),
                    ))
                }
            }
            Some(_) => Err(self.wrong(name, "a number")),
        }
    }

    /// An integer within `[lo, hi]`.
    pub fn integer(&self, name: &str, lo: i64, hi: i64) -> Result<Option<i64>, RequestError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => match n.as_i64() {
                Some(v) if (lo..=hi).contains(&v) => Ok(Some(v)),
                Some(_) => Err(RequestError::invalid(
                    name,
                    format!("`{name}` must be between {lo} and {hi}, got {n}"),
                )),
                None if n.as_u64().is_some() => Err(RequestError::invalid(
                    name,
                    format!("`{name}` must be at most {hi}, got {n}"),
                )),
                None => Err(self.wrong(name, "an integer")),
            },
            Some(_) => Err(self.wrong(name, "an integer")),
        }
    }

    /// A 400 if `name` is present with anything but an empty or default value.
    fn unsupported(&self, name: &str, ok: impl Fn(&Value) -> bool) -> Result<(), RequestError> {
        match self.get(name) {
            Some(v) if !ok(v) => Err(RequestError::invalid(
                name,
                format!("`{name}` is not supported by this server"),
            )),
            _ => Ok(()),
        }
    }
}

/// Which OpenAI endpoint a body was sent to (their fields differ a little).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    Chat,
}

/// The generation fields of a completions or chat body.
#[derive(Clone, Debug)]
pub struct GenParams {
    pub sampling: SamplingParams,
    /// As asked; `None` takes the endpoint's default.
    pub max_tokens: Option<usize>,
    /// The field `max_tokens` came from (`max_tokens` or `max_completion_tokens`).
    pub max_tokens_field: &'static str,
    pub n: usize,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// Report logprobs with this many alternatives per token.
    pub logprobs: Option<usize>,
    pub ignore_eos: bool,
    /// Completions' `echo`: the reply starts with the prompt (and, with `logprobs`, every
    /// prompt token's log-probability); `max_tokens` may then be 0 (score the prompt only).
    pub echo: bool,
}

/// Reads the sampling and output fields. Defaults are OpenAI's (temperature 1, top_p 1, no
/// top-k or min-p), not the CLI's.
pub fn gen_params(
    f: &Fields,
    endpoint: Endpoint,
    seed_default: u64,
) -> Result<GenParams, RequestError> {
    gen_params_over(f, endpoint, openai_sampling(seed_default))
}

/// OpenAI's sampling defaults: temperature 1, top_p 1, no top-k, min-p or penalties.
pub fn openai_sampling(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repeat_penalty: 1.0,
        repeat_last_n: 64,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        seed,
        logit_bias: Vec::new(),
        constraint: None,
    }
}

/// The one set of rules for a request body's generation fields, shared by the server and
/// `run --jsonl`: absent fields keep `base`'s values (OpenAI's defaults for the server, the
/// command line's for `--jsonl`); present ones are checked the same way for both.
pub fn gen_params_over(
    f: &Fields,
    endpoint: Endpoint,
    base: SamplingParams,
) -> Result<GenParams, RequestError> {
    let mut sampling = base;
    if let Some(t) = f.number("temperature", 0.0, 2.0)? {
        sampling.temperature = t as f32;
    }
    if let Some(p) = f.number("top_p", 0.0, 1.0)? {
        if p <= 0.0 {
            return Err(RequestError::invalid(
                "top_p",
                format!("`top_p` must be greater than 0, got {p}"),
            ));
        }
        sampling.top_p = p as f32;
    }
    if let Some(k) = f.integer("top_k", -1, i64::from(u32::MAX))? {
        sampling.top_k = k.max(0) as usize;
    }
    if let Some(p) = f.number("min_p", 0.0, 1.0)? {
        sampling.min_p = p as f32;
    }
    if let Some(p) = f.number("presence_penalty", -2.0, 2.0)? {
        sampling.presence_penalty = p as f32;
    }
    if let Some(p) = f.number("frequency_penalty", -2.0, 2.0)? {
        sampling.frequency_penalty = p as f32;
    }
    // llama.cpp's and vLLM's names for the multiplicative repetition penalty.
    for name in ["repeat_penalty", "repetition_penalty"] {
        if let Some(p) = f.number(name, f64::MIN_POSITIVE, 10.0)? {
            sampling.repeat_penalty = p as f32;
        }
    }
    if let Some(seed) = f.integer("seed", i64::MIN, i64::MAX)? {
        sampling.seed = seed as u64;
    }

    if endpoint == Endpoint::Chat {
        f.unsupported("echo", |v| v.as_bool() == Some(false))?;
    }
    let echo = f.bool("echo")?.unwrap_or(false);
    let limit = i64::from(u32::MAX);
    // 0 only with echo: score the prompt, generate nothing.
    let mut max_tokens = f
        .integer("max_tokens", i64::from(!echo), limit)?
        .map(|v| v as usize);
    let mut max_tokens_field = "max_tokens";
    if endpoint == Endpoint::Chat {
        if let Some(m) = f.integer("max_completion_tokens", 1, limit)? {
            max_tokens = Some(m as usize);
            max_tokens_field = "max_completion_tokens";
        }
    }
    let n = f.integer("n", 1, MAX_N as i64)?.unwrap_or(1) as usize;
    let stop = match f.get("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => {
            let mut stop = Vec::with_capacity(items.len());
            for item in items {
                match item {
                    Value::String(s) => stop.push(s.clone()),
                    other => {
                        return Err(RequestError::invalid(
                            "stop",
                            format!("`stop` must hold strings, got {}", type_name(other)),
                        ));
                    }
                }
            }
            stop
        }
        Some(other) => {
            return Err(RequestError::invalid(
                "stop",
                format!(
                    "`stop` must be a string or an array of strings, got {}",
                    type_name(other)
                ),
            ))
        }
    };
    if stop.len() > MAX_STOP {
        return Err(RequestError::invalid(
            "stop",
            format!(
                "`stop` holds at most {MAX_STOP} strings, got {}",
                stop.len()
            ),
        ));
    }
    if stop.iter().any(String::is_empty) {
        return Err(RequestError::invalid(
            "stop",
            "`stop` strings must not be empty",
        ));
    }
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match f.get("stream_options") {
        None => false,
        Some(Value::Object(o)) => Fields(o)
            .bool("include_usage")
            .map_err(|_| {
                RequestError::invalid(
                    "stream_options.include_usage",
                    "`stream_options.include_usage` must be a boolean",
                )
            })?
            .unwrap_or(false),
        Some(other) => {
            return Err(RequestError::invalid(
                "stream_options",
                format!(
                    "`stream_options` must be an object, got {}",
                    type_name(other)
                ),
            ))
        }
    };
    let logprobs = match endpoint {
        Endpoint::Completions => f
            .integer("logprobs", 0, MAX_TOP_LOGPROBS as i64)?
            .map(|k| k as usize),
        Endpoint::Chat => {
            let top = f.integer("top_logprobs", 0, MAX_TOP_LOGPROBS as i64)?;
            match (f.bool("logprobs")?.unwrap_or(false), top) {
                (true, top) => Some(top.unwrap_or(0) as usize),
                (false, Some(_)) => {
                    return Err(RequestError::invalid(
                        "top_logprobs",
                        "`top_logprobs` needs `logprobs: true`",
                    ))
                }
                (false, None) => None,
            }
        }
    };
    let ignore_eos = f.bool("ignore_eos")?.unwrap_or(false);

    f.unsupported("best_of", |v| v.as_u64() == Some(1))?;
    f.unsupported("suffix", |v| v.as_str() == Some(""))?;
    // `tools`, `tool_choice` and `response_format` are read by `structured` (crate::api).
    f.unsupported("functions", |v| v.as_array().is_some_and(Vec::is_empty))?;
    Ok(GenParams {
        sampling,
        max_tokens,
        max_tokens_field,
        n,
        stop,
        stream,
        include_usage,
        logprobs,
        ignore_eos,
        echo,
    })
}

/// What `/v1/completions` was asked to complete.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

/// `prompt`: a string, an array of one string, an array of token ids, or an array of one
/// array of token ids.
pub fn prompt(f: &Fields) -> Result<Prompt, RequestError> {
    let bad = |what: String| RequestError::invalid("prompt", what);
    match f.get("prompt") {
        None => Err(bad("`prompt` is required".into())),
        Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
        Some(Value::Array(items)) => match items.as_slice() {
            [] => Err(bad("`prompt` is empty".into())),
            [Value::String(s)] => Ok(Prompt::Text(s.clone())),
            [Value::Array(ids)] => token_ids(ids).map(Prompt::Tokens).map_err(bad),
            items if items.iter().all(Value::is_number) => token_ids(items).map(Prompt::Tokens).map_err(bad),
            items if items.len() > 1 && items.iter().all(|v| v.is_string() || v.is_array()) => {
                Err(bad(format!("`prompt` holds {} prompts; send one prompt per request (use `n` for several completions)", items.len())))
            }
            _ => Err(bad("`prompt` must be a string, an array of one string, or an array of token ids".into())),
        },
        Some(other) => Err(bad(format!("`prompt` must be a string or an array, got {}", type_name(other)))),
    }
}

/// An array of token ids (non-negative integers).
pub fn token_ids(items: &[Value]) -> Result<Vec<u32>, String> {
    items
        .iter()
        .map(|v| match v.as_u64() {
            Some(id) if id <= u64::from(u32::MAX) => Ok(id as u32),
            _ => Err(format!("token ids must be non-negative integers, got {v}")),
        })
        .collect()
}

/// `messages`: a non-empty array of `{role, content}`; the role one of [`MESSAGE_ROLES`] or
/// `developer` (passed to templates as `system`); content a string or an array of text parts,
/// or null/absent on an assistant message only.
pub fn messages(f: &Fields) -> Result<Vec<ChatMessage>, RequestError> {
    let items = match f.get("messages") {
        None => return Err(RequestError::invalid("messages", "`messages` is required")),
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(RequestError::invalid(
                "messages",
                format!("`messages` must be an array, got {}", type_name(other)),
            ))
        }
    };
    if items.is_empty() {
        return Err(RequestError::invalid(
            "messages",
            "`messages` must hold at least one message",
        ));
    }
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Value::Object(m) = item else {
            return Err(RequestError::invalid(
                &format!("messages[{i}]"),
                format!("`messages[{i}]` must be an object, got {}", type_name(item)),
            ));
        };
        let role = match m.get("role") {
            Some(Value::String(r)) => r.as_str(),
            _ => {
                return Err(RequestError::invalid(
                    &format!("messages[{i}].role"),
                    format!("`messages[{i}].role` must be a string"),
                ))
            }
        };
        let role = if role == "developer" { "system" } else { role };
        if !MESSAGE_ROLES.contains(&role) {
            return Err(RequestError::invalid(
                &format!("messages[{i}].role"),
                format!(
                    "`messages[{i}].role` must be one of system, developer, user, assistant, tool; got {}",
                    super::shown(role)
                ),
            ));
        }
        let param = format!("messages[{i}].content");
        let content = match m.get("content") {
            // OpenAI allows no content only on an assistant turn (one that called tools).
            None | Some(Value::Null) if role == "assistant" => String::new(),
            None | Some(Value::Null) => {
                return Err(RequestError::invalid(
                    &param,
                    format!("`{param}` is required on a {role} message (a string or an array of text parts)"),
                ))
            }
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for part in parts {
                    match (
                        part.get("type").and_then(Value::as_str),
                        part.get("text").and_then(Value::as_str),
                    ) {
                        (Some("text"), Some(t)) => text.push_str(t),
                        (Some(kind), _) if kind != "text" => {
                            return Err(RequestError::invalid(
                                &param,
                                format!(
                                    "content parts of type {} are not supported; only `text`",
                                    super::shown(kind)
                                ),
                            ));
                        }
                        _ => {
                            return Err(RequestError::invalid(
                                &param,
                                format!(
                                "`{param}` parts must be {{\"type\": \"text\", \"text\": STRING}}"
                            ),
                            ))
                        }
                    }
                }
                text
            }
            Some(other) => {
                return Err(RequestError::invalid(
                    &param,
                    format!(
                        "`{param}` must be a string or an array of text parts, got {}",
                        type_name(other)
                    ),
                ))
            }
        };
        out.push(ChatMessage {
            role: role.to_string(),
            content,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn defaults_are_openai_s() {
        let m = fields(json!({}));
        let p = gen_params(&Fields(&m), Endpoint::Chat, 7).unwrap();
        assert_eq!(
            (
                p.sampling.temperature,
                p.sampling.top_p,
                p.sampling.top_k,
                p.sampling.min_p
            ),
            (1.0, 1.0, 0, 0.0)
        );
        assert_eq!(
            (p.n, p.max_tokens, p.stream, p.logprobs, p.sampling.seed),
            (1, None, false, None, 7)
        );
    }

    #[test]
    fn wrong_types_name_the_field() {
        for (body, param) in [
            (json!({"temperature": "hot"}), "temperature"),
            (json!({"temperature": 3}), "temperature"),
            (json!({"max_tokens": 0}), "max_tokens"),
            (json!({"max_tokens": 1.5}), "max_tokens"),
            (json!({"n": 17}), "n"),
            (json!({"stop": 3}), "stop"),
            (json!({"stop": ["a", 1]}), "stop"),
            (json!({"stream": "yes"}), "stream"),
            (json!({"top_logprobs": 2}), "top_logprobs"),
        ] {
            let m = fields(body.clone());
            let e = gen_params(&Fields(&m), Endpoint::Chat, 0).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        }
    }

    #[test]
    fn prompts_and_messages() {
        let p = |v: Value| prompt(&Fields(&fields(json!({ "prompt": v }))));
        assert_eq!(p(json!("hi")).unwrap(), Prompt::Text("hi".into()));
        assert_eq!(p(json!(["hi"])).unwrap(), Prompt::Text("hi".into()));
        assert_eq!(p(json!([1, 2])).unwrap(), Prompt::Tokens(vec![1, 2]));
        assert_eq!(p(json!([[1, 2]])).unwrap(), Prompt::Tokens(vec![1, 2]));
        assert!(p(json!(["a", "b"]))
            .unwrap_err()
            .message
            .contains("one prompt per request"));
        assert!(p(json!([-1])).is_err());
        assert!(p(json!(5)).is_err());
        let m = fields(json!({"messages": [
            {"role": "developer", "content": "sys"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null}
        ]}));
        let msgs = messages(&Fields(&m)).unwrap();
        assert_eq!(
            msgs,
            vec![
                ChatMessage::new("system", "sys"),
                ChatMessage::new("user", "ab"),
                ChatMessage::new("assistant", "")
            ]
        );
        for (bad, param) in [
            (json!([]), "messages"),
            (
                json!([{"role": "wizard", "content": "hi"}]),
                "messages[0].role",
            ),
            (
                json!([{"role": "user", "content": null}]),
                "messages[0].content",
            ),
            (
                json!([{"role": "system", "content": "s"}, {"role": "user"}]),
                "messages[1].content",
            ),
        ] {
            let m = fields(json!({ "messages": bad }));
            let e = messages(&Fields(&m)).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{bad}: {}", e.message);
        }
        let m = fields(json!({"messages": [{"role": "user", "content": 5}]}));
        assert_eq!(
            messages(&Fields(&m)).unwrap_err().param.as_deref(),
            Some("messages[0].content")
        );
    }
}

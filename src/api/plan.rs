//! A request body to an engine request, the same way for every face: the generation fields
//! (`request`), the constraint (`structured`, or the grammar of `tools`), the prompt (a
//! completions `prompt` tokenized, or a chat's `messages` rendered with the template and its
//! `tools`), and `max_tokens` checked against the context. What the body cannot say (sampling
//! defaults, the template, the context length) comes from the face in a [`Setting`]. Where the
//! chat template thinks (`reasoning`), the constraint applies only after the reply's `</think>`
//! and the plan says to split the thoughts out of the reply ([`ReplyParsing`]).
//!
//! The engine's `submit` makes the prompt's own checks (empty, longer than the context, token ids
//! outside the vocabulary); a face maps its refusal with [`super::RequestError::from_submit`]
//! naming [`Plan::prompt_param`]. Only a text whose bytes cannot fit the context is refused here,
//! before it is tokenized. Called by the server's handlers, `run --jsonl` and the
//! `request` fuzz target.

use serde_json::{json, Map, Value};

use super::reply::ReplyParsing;
use super::request::{self, Endpoint, Fields, GenParams, Prompt};
use super::tools::{self, ToolChoice, ToolFormat};
use super::{harmony, reasoning, structured, template_args, RequestError};
use crate::chat_template::{encode_prompt, ChatMessage, ChatTemplate};
use crate::constraint::{Constraint, ConstraintSpec, Grammars, Trigger};
use crate::engine::sampler::SamplingParams;
use crate::engine::Request;
use crate::tokenizer::Tokenizer;

/// `max_tokens` when neither the body nor the face gives one: OpenAI's 16 for completions (the
/// rest of the context for chat).
pub const COMPLETIONS_DEFAULT_MAX_TOKENS: usize = 16;

/// What a face knows that the body does not.
pub struct Setting<'a> {
    pub tokenizer: &'a Tokenizer,
    /// The chat template, or why there is none (a `messages` body is then refused).
    pub template: Result<&'a ChatTemplate, &'a str>,
    /// Where constraints are compiled; `None` leaves them out (the fuzz target has no engine).
    pub grammars: Option<&'a Grammars>,
    /// Whose grammar cache compiled constraints go to (an API key's salt; None: the shared one).
    pub tenant: Option<u64>,
    /// Tokens the prompt and the completion share.
    pub max_seq_len: usize,
    /// The values of absent sampling fields: OpenAI's defaults for the server, the command
    /// line's for `--jsonl`.
    pub sampling: SamplingParams,
    /// `max_tokens` when the body has none (capped by the context); `None`: the endpoint's
    /// default (16 for completions, the rest of the context for chat).
    pub max_tokens: Option<usize>,
    /// Put BOS before a text prompt when the model wants one (`--no-bos` turns it off).
    pub add_bos: bool,
    /// Ignore end-of-generation tokens whatever the body says (`--ignore-eos`).
    pub ignore_eos: bool,
}

/// A body read by the rules: what to submit and how to answer.
pub struct Plan {
    pub request: Request,
    /// The fields as read (`stream`, `include_usage`, `n`, `logprobs` for the answer; the
    /// sampling values went to `request`).
    pub params: GenParams,
    /// The field the prompt came from (`prompt` or `messages`), for the engine's refusals.
    pub prompt_param: &'static str,
    /// What to take apart in the reply (tool calls, `<think>` reasoning); nothing for
    /// completions.
    pub parsing: ReplyParsing,
}

/// The endpoint a line of `--jsonl` is for: a body holds exactly one of `prompt` and
/// `messages`.
pub fn endpoint_of(body: &Map<String, Value>) -> Result<Endpoint, RequestError> {
    let f = Fields(body);
    match (f.get("prompt"), f.get("messages")) {
        (Some(_), None) => Ok(Endpoint::Completions),
        (None, Some(_)) => Ok(Endpoint::Chat),
        _ => Err(RequestError::bad_request(
            "give exactly one of \"prompt\" and \"messages\"",
        )),
    }
}

/// The engine request of a body sent to `endpoint`.
pub fn plan(
    setting: &Setting,
    endpoint: Endpoint,
    body: &Map<String, Value>,
) -> Result<Plan, RequestError> {
    let f = Fields(body);
    let params = request::gen_params_over(&f, endpoint, setting.sampling.clone())?;
    let (prompt, constraint, parsing) = match endpoint {
        Endpoint::Completions => {
            let constraint = completion_constraint(setting, body)?;
            let prompt = completion_prompt(setting, &f)?;
            (prompt, constraint, ReplyParsing::default())
        }
        Endpoint::Chat => {
            let chat = chat(setting, body)?;
            (chat.prompt, chat.constraint, chat.parsing)
        }
    };
    let max_tokens = max_tokens(setting, endpoint, &params, prompt.len())?;
    let mut sampling = params.sampling.clone();
    sampling.constraint = constraint;
    sampling.logit_bias = logit_bias(&f, setting.tokenizer)?;
    let mut request = Request::new(prompt, sampling, max_tokens);
    request.n = params.n;
    request.stop = params.stop.clone();
    request.ignore_eos = params.ignore_eos || setting.ignore_eos;
    request.logprobs = params.logprobs;
    // Echo needs the prompt's tokens back (the engine sends them with the scores).
    request.prompt_logprobs = params.echo.then_some(params.logprobs.unwrap_or(0));
    Ok(Plan {
        request,
        params,
        prompt_param: match endpoint {
            Endpoint::Completions => "prompt",
            Endpoint::Chat => "messages",
        },
        parsing,
    })
}

/// `logit_bias`: OpenAI's object of token ids (as strings) to biases, or llama.cpp's array of
/// `[token id or text, bias]` pairs, where a text biases every token it encodes to and `false`
/// bans. Biases of one token add up.
fn logit_bias(f: &Fields, tok: &Tokenizer) -> Result<Vec<(u32, f32)>, RequestError> {
    const FIELD: &str = "logit_bias";
    let bad = |why: String| RequestError::invalid(FIELD, why);
    let bias_of = |v: &Value| -> Result<f32, RequestError> {
        match v {
            Value::Bool(false) => Ok(f32::NEG_INFINITY),
            Value::Number(n) => n
                .as_f64()
                .filter(|b| b.is_finite() && b.abs() <= 1e4)
                .map(|b| b as f32)
                .ok_or_else(|| {
                    bad(format!(
                        "a bias must be a number in [-10000, 10000], got {n}"
                    ))
                }),
            other => Err(bad(format!(
                "a bias must be a number or `false` (ban), got {}",
                request::type_name(other)
            ))),
        }
    };
    let id_of = |id: u64| -> Result<u32, RequestError> {
        u32::try_from(id)
            .ok()
            .filter(|&id| (id as usize) < tok.vocab_size())
            .ok_or_else(|| {
                bad(format!(
                    "token id {id} is outside the vocabulary of {} tokens",
                    tok.vocab_size()
                ))
            })
    };
    let mut out: Vec<(u32, f32)> = Vec::new();
    match f.get(FIELD) {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (key, v) in map {
                let id = key
                    .trim()
                    .parse::<u64>()
                    .map_err(|_| bad(format!("keys must be token ids, got {key:?}")))?;
                out.push((id_of(id)?, bias_of(v)?));
            }
        }
        Some(Value::Array(pairs)) => {
            for pair in pairs {
                let Some([what, v]) = pair.as_array().map(Vec::as_slice) else {
                    return Err(bad(
                        "each entry must be a pair `[token id or text, bias]`".into()
                    ));
                };
                let bias = bias_of(v)?;
                match what {
                    Value::Number(n) => {
                        let id = n.as_u64().ok_or_else(|| bad(format!("bad token id {n}")))?;
                        out.push((id_of(id)?, bias));
                    }
                    Value::String(text) => {
                        let ids = tok
                            .encode(text, false, false)
                            .map_err(|e| bad(format!("cannot tokenize {text:?}: {e:#}")))?;
                        out.extend(ids.into_iter().map(|id| (id, bias)));
                    }
                    other => {
                        return Err(bad(format!(
                            "a pair starts with a token id or a text, got {}",
                            request::type_name(other)
                        )))
                    }
                }
            }
        }
        Some(other) => {
            return Err(bad(format!(
                "`logit_bias` must be an object of token ids to biases, or an array of pairs, \
             got {}",
                request::type_name(other)
            )))
        }
    }
    out.sort_by_key(|&(id, _)| id);
    out.dedup_by(|b, a| {
        let same = a.0 == b.0;
        if same {
            a.1 += b.1;
        }
        same
    });
    Ok(out)
}

/// The token ids a body would run, and nothing else (the routers' `/render` endpoints); a chat
/// body's constraint is still compiled, as its `tools` shape the prompt.
pub fn prompt_ids(
    setting: &Setting,
    endpoint: Endpoint,
    body: &Map<String, Value>,
) -> Result<Vec<u32>, RequestError> {
    match endpoint {
        Endpoint::Completions => completion_prompt(setting, &Fields(body)),
        Endpoint::Chat => chat(setting, body).map(|c| c.prompt),
    }
}

/// `max_tokens` as asked, or the default, checked against the room the prompt leaves. A prompt
/// that does not fit is left for the engine to refuse (it names the prompt, not `max_tokens`).
fn max_tokens(
    setting: &Setting,
    endpoint: Endpoint,
    params: &GenParams,
    num_prompt: usize,
) -> Result<usize, RequestError> {
    let max_seq_len = setting.max_seq_len;
    let fits = num_prompt > 0 && num_prompt < max_seq_len;
    let room = max_seq_len.saturating_sub(num_prompt);
    Ok(match params.max_tokens {
        Some(m) if fits && m > room => {
            let field = params.max_tokens_field;
            return Err(RequestError::invalid(
                field,
                format!(
                    "This model's maximum context length is {max_seq_len} tokens. However, you requested {} tokens \
                     ({num_prompt} in the prompt, {m} for the completion). Please reduce `{field}` or the prompt.",
                    num_prompt + m,
                ),
            )
            .with_code("context_length_exceeded"));
        }
        Some(m) => m,
        None => match (setting.max_tokens, endpoint) {
            (Some(m), _) => m.min(room),
            (None, Endpoint::Completions) => COMPLETIONS_DEFAULT_MAX_TOKENS.min(room),
            (None, Endpoint::Chat) => room,
        },
    })
}

/// A completions body's `prompt` as token ids: BOS as the model wants it, but not twice if the
/// prompt already starts with it.
fn completion_prompt(setting: &Setting, f: &Fields) -> Result<Vec<u32>, RequestError> {
    let tok = setting.tokenizer;
    Ok(match request::prompt(f)? {
        Prompt::Text(text) => {
            fits_context(setting, &text, "prompt")?;
            if setting.add_bos {
                encode_prompt(tok, &text)
            } else {
                tok.encode(&text, false, true)
            }
            .map_err(|e| {
                RequestError::invalid("prompt", format!("cannot tokenize `prompt`: {e:#}"))
            })?
        }
        Prompt::Tokens(ids) => ids,
    })
}

/// Refuses, before tokenizing, a prompt whose bytes need more tokens than the context holds
/// however they are spelled (the tokenizer's lower bound): tokenizing a prompt of megabytes
/// takes seconds, and the engine would refuse it all the same.
fn fits_context(setting: &Setting, text: &str, param: &str) -> Result<(), RequestError> {
    let min_tokens = setting.tokenizer.min_tokens(text);
    if min_tokens >= setting.max_seq_len {
        return Err(RequestError::prompt_too_long(
            param,
            &format!("at least {min_tokens} tokens ({} bytes)", text.len()),
            setting.max_seq_len,
        ));
    }
    Ok(())
}

/// The constraint of a `/v1/completions` body (which takes no `tools`).
fn completion_constraint(
    setting: &Setting,
    body: &Map<String, Value>,
) -> Result<Option<Constraint>, RequestError> {
    if body
        .get("tools")
        .is_some_and(|t| t.as_array().is_none_or(|a| !a.is_empty()))
    {
        return Err(RequestError::invalid(
            "tools",
            "`tools` is for /v1/chat/completions; /v1/completions takes `response_format`, `regex` or `grammar`",
        ));
    }
    let Some((spec, param)) = structured::spec(body)? else {
        return Ok(None);
    };
    match setting.grammars {
        Some(grammars) => Ok(Some(structured::compile(
            grammars,
            &spec,
            param,
            None,
            setting.tenant,
        )?)),
        None => Ok(None),
    }
}

/// What a chat body runs beyond the plain fields.
struct Chat {
    prompt: Vec<u32>,
    constraint: Option<Constraint>,
    parsing: ReplyParsing,
}

/// The prompt text a chat body renders to (its messages, and its tools unless `tool_choice` is
/// `none`), before tokenizing: llama-server's `/apply-template`.
pub fn chat_text(setting: &Setting, body: &Map<String, Value>) -> Result<String, RequestError> {
    ChatInput::read(setting, body)?.render(body)
}

/// What a chat body's prompt is rendered from: its messages, the template, its tools.
struct ChatInput<'a> {
    messages: Vec<ChatMessage>,
    add_generation_prompt: bool,
    template: &'a ChatTemplate,
    tool_req: Option<tools::ToolRequest>,
}

impl<'a> ChatInput<'a> {
    fn read(setting: &Setting<'a>, body: &Map<String, Value>) -> Result<Self, RequestError> {
        let f = Fields(body);
        Ok(ChatInput {
            messages: request::messages(&f)?,
            add_generation_prompt: f.bool("add_generation_prompt")?.unwrap_or(true),
            template: setting
                .template
                .map_err(|why| RequestError::bad_request(why).with_code("no_chat_template"))?,
            tool_req: tools::parse(body)?,
        })
    }

    /// The messages through the template: with tools or tool turns, as JSON messages with the
    /// tools offered (unless `tool_choice` is `none`), else as plain messages.
    fn render(&self, body: &Map<String, Value>) -> Result<String, RequestError> {
        let raw = body.get("messages").and_then(Value::as_array);
        let has_tool_turns = raw.is_some_and(|items| {
            items.iter().any(|m| {
                m.get("tool_calls").is_some_and(|c| !c.is_null())
                    || m.get("role") == Some(&json!("tool"))
            })
        });
        let g = self.add_generation_prompt;
        let extra = template_args::extra_variables(body)?;
        let harmony = harmony::template_speaks_harmony(self.template.source());
        if self.tool_req.is_some() || has_tool_turns || harmony || !extra.is_empty() {
            let raw = raw.map(Vec::as_slice).unwrap_or(&[]);
            let mut json_messages = messages_json(&self.messages, raw)?;
            if harmony {
                for (m, r) in json_messages.iter_mut().zip(raw) {
                    *m = template_args::harmony_message(std::mem::take(m), r);
                }
            }
            // As vLLM does, `tool_choice: none` leaves the tools out of the prompt: the model
            // answers in text instead of being taught to call.
            let offered = self
                .tool_req
                .as_ref()
                .filter(|t| t.choice != ToolChoice::None)
                .map(|t| &t.raw);
            self.template
                .render_json_with(&json_messages, offered, g, &extra)
        } else {
            self.template.render(&self.messages, g)
        }
        .map_err(|e| RequestError::invalid("messages", format!("{e:#}")))
    }
}

/// A chat body's prompt (its messages and `tools` through the template, then the tokenizer), its
/// constraint (after `</think>` where the template thinks) and what to take apart in its reply.
fn chat(setting: &Setting, body: &Map<String, Value>) -> Result<Chat, RequestError> {
    let input = ChatInput::read(setting, body)?;
    let (template, tool_req) = (input.template, &input.tool_req);
    let spec = structured::spec(body)?;
    let split = reasoning::split_requested(body)?;
    // The constraint to compile: its spec, the field it came from, its lazy trigger.
    let mut wanted: Option<(ConstraintSpec, &str, Option<Trigger>)> = None;
    let mut tool_calls = false;
    let mut tool_names = Vec::new();
    if let Some(t) = tool_req {
        let format = ToolFormat::of_template(template.source()).ok_or_else(|| {
            RequestError::invalid(
                "tools",
                "this model's chat template teaches no tool-call format (Hermes `<tool_call>`, or harmony); \
                 `tools` cannot be used with it",
            )
        })?;
        if t.choice != ToolChoice::None {
            tool_calls = true;
            tool_names = t.tools.iter().map(|t| t.name.clone()).collect();
            if let Some((_, param)) = &spec {
                return Err(RequestError::invalid(
                    param,
                    format!(
                        "`{param}` cannot be combined with `tools` unless `tool_choice` is `none`"
                    ),
                ));
            }
            if let Some((spec, trigger)) = tools::grammar(t, format, setting.tokenizer) {
                wanted = Some((spec, "tools", trigger));
            }
        }
    }
    if wanted.is_none() {
        if let Some((spec, param)) = spec {
            wanted = Some((spec, param, None));
        }
    }
    let prompt = input.render(body)?;
    fits_context(setting, &prompt, "messages")?;
    let thinks = reasoning::template_thinks(template.source());
    let forced_open = thinks && reasoning::prompt_opens_thinking(&prompt);
    let constraint = match (wanted, setting.grammars) {
        (Some((spec, param, trigger)), Some(grammars)) => {
            // A lazy (triggered) grammar leaves the thoughts free already.
            let spec = if thinks && trigger.is_none() {
                reasoning::constraint_after_thinking(spec, forced_open, setting.tokenizer)
            } else {
                spec
            };
            Some(structured::compile(
                grammars,
                &spec,
                param,
                trigger,
                setting.tenant,
            )?)
        }
        _ => None,
    };
    let prompt = encode_prompt(setting.tokenizer, &prompt).map_err(|e| {
        RequestError::invalid(
            "messages",
            format!("cannot tokenize the chat prompt: {e:#}"),
        )
    })?;
    Ok(Chat {
        prompt,
        constraint,
        parsing: ReplyParsing {
            harmony: harmony::template_speaks_harmony(template.source()) && (split || tool_calls),
            tool_calls,
            tool_names,
            reasoning: (thinks && split).then_some(forced_open),
        },
    })
}

/// The messages for a template that knows tools: role and text content as checked by
/// `request::messages`, plus `tool_calls` (arguments as objects, as Hugging Face templates
/// expect them), `tool_call_id` and `name` as sent.
fn messages_json(messages: &[ChatMessage], raw: &[Value]) -> Result<Vec<Value>, RequestError> {
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let mut v = json!({"role": m.role, "content": m.content});
        let Some(r) = raw.get(i) else {
            out.push(v);
            continue;
        };
        for key in ["tool_call_id", "name"] {
            if let Some(s) = r.get(key).and_then(Value::as_str) {
                v[key] = json!(s);
            }
        }
        if let Some(calls) = r.get("tool_calls").filter(|c| !c.is_null()) {
            let param = format!("messages[{i}].tool_calls");
            let Value::Array(calls) = calls else {
                return Err(RequestError::invalid(
                    &param,
                    format!("`{param}` must be an array"),
                ));
            };
            let mut fixed = Vec::new();
            for (k, c) in calls.iter().enumerate() {
                let f = c.get("function");
                let name = f.and_then(|f| f.get("name")).and_then(Value::as_str);
                let Some(name) = name else {
                    return Err(RequestError::invalid(
                        &format!("{param}[{k}].function.name"),
                        format!("`{param}[{k}].function.name` must be a string"),
                    ));
                };
                let arguments = match f.and_then(|f| f.get("arguments")) {
                    Some(Value::String(s)) => serde_json::from_str(s).unwrap_or(json!(s)),
                    Some(other) => other.clone(),
                    None => json!({}),
                };
                fixed.push(json!({
                    "id": c.get("id").cloned().unwrap_or(Value::Null),
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }));
            }
            v["tool_calls"] = Value::Array(fixed);
        }
        out.push(v);
    }
    Ok(out)
}

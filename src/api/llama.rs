//! llama-server's native bodies, `POST /completion` and `POST /infill`, read into the plan every
//! other route gets: the sampling fields, `stop`, `stream`, the constraint and the prompt go
//! through `plan` (the one shared parser) on a copy of the body from which the fields named
//! differently here were taken out (`n_predict` and its aliases, `n_probs`, `id_slot`, ...);
//! those are read here into [`LlamaOptions`], which the server honours while it answers
//! (`t_max_predict_ms`, `n_indent`, `return_tokens`, ...). `/infill`'s prompt is built from the
//! model's fill-in-the-middle tokens by `infill`. Called by the server's `llama_completion`.

use serde_json::{Map, Value};

use super::plan::{self, Plan, Setting};
use super::request::{self, Endpoint, Fields, MAX_TOP_LOGPROBS};
use super::RequestError;
use crate::engine::sampler::SamplingParams;
use crate::tokenizer::Tokenizer;

/// llama-server's sampling defaults (`common_params_sampling`): temperature 0.8, top-k 40,
/// top-p 0.95, min-p 0.05, no repetition penalty over the last 64 tokens.
pub fn llama_sampling(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.05,
        repeat_penalty: 1.0,
        repeat_last_n: 64,
        ..request::openai_sampling(seed)
    }
}

/// What a native body asks beyond the engine request, for the server to honour as it answers.
#[derive(Clone, Debug, Default)]
pub struct LlamaOptions {
    pub stream: bool,
    /// `n_predict` as asked (-1: until a stop or the context ends; 0: evaluate the prompt only).
    pub n_predict: i64,
    /// `n_probs`: alternatives per generated token in `completion_probabilities` (0: none).
    pub n_probs: usize,
    /// `return_tokens`: the generated token ids in `tokens`.
    pub return_tokens: bool,
    /// `t_max_prompt_ms`: when the first token comes later than this after the request arrived
    /// (queueing and evaluating the prompt), no token is generated (the prompt is still
    /// evaluated and cached). None: no limit.
    pub t_max_prompt_ms: Option<u64>,
    /// `t_max_predict_ms`: generation stops at the first newline after this long (measured
    /// from the first token), as llama-server does. None: no limit.
    pub t_max_predict_ms: Option<u64>,
    /// `n_indent`: a new line indented less than this ends generation (the line is cut).
    pub n_indent: usize,
    /// `timings_per_token`: `timings` in every streamed chunk.
    pub timings_per_token: bool,
    /// `response_fields`: only these fields of the final reply (`a/b` lifts a nested one).
    pub response_fields: Option<Vec<String>>,
}

/// A native body read: the engine request to submit and how to answer it.
pub struct LlamaPlan {
    pub plan: Plan,
    pub options: LlamaOptions,
}

/// The fields read here, taken out of the copy `plan` reads.
const NATIVE_FIELDS: &[&str] = &[
    "n_predict",
    "max_tokens",
    "max_completion_tokens",
    "n_probs",
    "logprobs",
    "post_sampling_probs",
    "id_slot",
    "cache_prompt",
    "return_tokens",
    "t_max_prompt_ms",
    "t_max_predict_ms",
    "n_indent",
    "timings_per_token",
    "response_fields",
    "n",
    "n_cmpl",
    "lora",
    "n_keep",
    "n_discard",
    "n_cache_reuse",
    "return_progress",
    "input_prefix",
    "input_suffix",
    "input_extra",
];

/// A `POST /completion` body: `prompt` a string, token ids or a list mixing both.
pub fn completion(setting: Setting, body: &Map<String, Value>) -> Result<LlamaPlan, RequestError> {
    let prompt = mixed_prompt(setting.tokenizer, body)?;
    planned(setting, body, prompt)
}

/// A `POST /infill` body: `input_prefix`, `input_suffix`, `input_extra` and `prompt` made into
/// llama-server's fill-in-the-middle prompt (see [`super::infill`]).
pub fn infill(
    setting: Setting,
    body: &Map<String, Value>,
    n_batch: usize,
) -> Result<LlamaPlan, RequestError> {
    let ids = super::infill::prompt(setting.tokenizer, body, n_batch, setting.max_seq_len)?;
    planned(setting, body, Some(ids))
}

/// The body through `plan` with the native fields taken out (and the prompt as token ids when
/// `prompt` is given), then the native options applied to the request.
fn planned(
    setting: Setting,
    body: &Map<String, Value>,
    prompt: Option<Vec<u32>>,
) -> Result<LlamaPlan, RequestError> {
    let f = Fields(body);
    let options = options(&f)?;
    let cache_prompt = f.bool("cache_prompt")?.unwrap_or(true);
    let mut map = body.clone();
    for name in NATIVE_FIELDS {
        map.remove(*name);
    }
    // llama-server's `seed: -1` is a random seed: the setting's.
    if f.get("seed").and_then(Value::as_i64) == Some(-1) {
        map.remove("seed");
    }
    if let Some(ids) = prompt {
        map.insert("prompt".into(), Value::from(ids));
    }
    // `n_predict` caps the completion at the room the prompt leaves, as llama-server stops at
    // the context's end instead of refusing.
    let cap = match options.n_predict {
        n if n > 0 => n as usize,
        _ => usize::MAX,
    };
    let setting = Setting {
        max_tokens: Some(cap),
        ..setting
    };
    let mut plan = plan::plan(&setting, Endpoint::Completions, &map)?;
    if options.n_predict == 0 {
        plan.request.max_tokens = 0;
    }
    plan.request.logprobs = (options.n_probs > 0).then_some(options.n_probs);
    plan.params.logprobs = plan.request.logprobs;
    plan.request.cache_prompt = cache_prompt;
    Ok(LlamaPlan { plan, options })
}

/// The native fields of a body, checked.
fn options(f: &Fields) -> Result<LlamaOptions, RequestError> {
    if let Some(slot) = f.integer("id_slot", -1, i64::MAX)? {
        if slot != -1 {
            return Err(RequestError::invalid(
                "id_slot",
                format!(
                    "`id_slot` {slot} names a llama-server slot; edge-llm has no fixed slots (every \
                     request gets its own sequence, listed by GET /slots), so only -1 is accepted"
                ),
            ));
        }
    }
    let limit = i64::from(i32::MAX);
    // llama-server reads `max_tokens` and `max_completion_tokens` when `n_predict` is absent.
    let n_predict = match f.integer("n_predict", -1, limit)? {
        Some(n) => n,
        None => match f.integer("max_tokens", -1, limit)? {
            Some(n) => n,
            None => f.integer("max_completion_tokens", -1, limit)?.unwrap_or(-1),
        },
    };
    let max = MAX_TOP_LOGPROBS as i64;
    let n_probs = match f.integer("n_probs", 0, max)? {
        Some(n) => n,
        None => f.integer("logprobs", 0, max)?.unwrap_or(0),
    } as usize;
    if f.bool("post_sampling_probs")? == Some(true) {
        return Err(RequestError::invalid(
            "post_sampling_probs",
            "`post_sampling_probs` is not supported: `n_probs` reports log-probabilities of the \
             model's distribution before sampling",
        ));
    }
    for name in ["n", "n_cmpl"] {
        if f.integer(name, 1, request::MAX_N as i64)?
            .is_some_and(|n| n > 1)
        {
            return Err(RequestError::invalid(
                name,
                format!("`{name}` must be 1 here; /v1/completions makes several completions"),
            ));
        }
    }
    if f.get("lora")
        .is_some_and(|v| v.as_array().is_none_or(|a| !a.is_empty()))
    {
        return Err(RequestError::invalid(
            "lora",
            "`lora` is not supported: edge-llm loads no LoRA adapters",
        ));
    }
    // Context shifting and KV-shifting reuse: edge-llm never shifts a sequence's context (a
    // prompt must fit), and reuses whole cached blocks of a prompt's prefix only.
    for (name, default) in [
        ("n_keep", -1..=0),
        ("n_discard", 0..=0),
        ("n_cache_reuse", 0..=0),
    ] {
        if let Some(v) = f
            .integer(name, -1, i64::MAX)?
            .filter(|v| !default.contains(v))
        {
            return Err(RequestError::invalid(
                name,
                format!(
                    "`{name}` {v} is not supported: edge-llm never shifts the context and reuses                      only whole cached blocks of the prompt's prefix"
                ),
            ));
        }
    }
    if f.get("echo").is_some_and(|v| v != &Value::Bool(false)) {
        return Err(RequestError::invalid(
            "echo",
            "`echo` is /v1/completions'; llama-server's routes reply with the completion only",
        ));
    }
    if f.bool("return_progress")? == Some(true) {
        return Err(RequestError::invalid(
            "return_progress",
            "`return_progress` is not supported: no prompt-progress events are streamed",
        ));
    }
    let ms = |name: &str| -> Result<Option<u64>, RequestError> {
        Ok(f.integer(name, -1, i64::MAX)?
            .filter(|&v| v > 0)
            .map(|v| v as u64))
    };
    let response_fields = match f.get("response_fields") {
        None => None,
        Some(Value::Array(items)) => Some(
            items
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    RequestError::invalid(
                        "response_fields",
                        "`response_fields` must be an array of strings",
                    )
                })?,
        ),
        Some(other) => {
            return Err(RequestError::invalid(
                "response_fields",
                format!(
                    "`response_fields` must be an array of strings, got {}",
                    request::type_name(other)
                ),
            ))
        }
    };
    Ok(LlamaOptions {
        stream: f.bool("stream")?.unwrap_or(false),
        n_predict,
        n_probs,
        return_tokens: f.bool("return_tokens")?.unwrap_or(false),
        t_max_prompt_ms: ms("t_max_prompt_ms")?,
        t_max_predict_ms: ms("t_max_predict_ms")?,
        n_indent: f.integer("n_indent", 0, limit)?.unwrap_or(0) as usize,
        timings_per_token: f.bool("timings_per_token")?.unwrap_or(false),
        response_fields,
    })
}

/// `prompt` as llama-server's `tokenize_mixed` reads a list mixing texts and token ids: each
/// text tokenized with special tokens parsed, BOS (where the model wants one) before a first
/// text; None when `prompt` is not such a list (`plan` reads strings and plain id lists).
fn mixed_prompt(
    tok: &Tokenizer,
    body: &Map<String, Value>,
) -> Result<Option<Vec<u32>>, RequestError> {
    let Some(Value::Array(items)) = body.get("prompt") else {
        return Ok(None);
    };
    let has_ids = items.iter().any(Value::is_number);
    let has_texts = items.iter().any(Value::is_string);
    if !(has_ids && has_texts) {
        return Ok(None);
    }
    let mut ids = Vec::new();
    for (i, item) in items.iter().enumerate() {
        match item {
            Value::String(s) => ids.extend(
                tok.encode(s, i == 0 && tok.add_bos_default(), true)
                    .map_err(|e| {
                        RequestError::invalid("prompt", format!("cannot tokenize `prompt`: {e:#}"))
                    })?,
            ),
            other => ids.extend(
                request::token_ids(std::slice::from_ref(other))
                    .map_err(|e| RequestError::invalid("prompt", format!("`prompt`: {e}")))?,
            ),
        }
    }
    Ok(Some(ids))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn options_of(v: Value) -> Result<LlamaOptions, RequestError> {
        options(&Fields(v.as_object().unwrap()))
    }

    #[test]
    fn native_fields_are_read_or_refused_by_name() {
        let o =
            options_of(json!({"max_tokens": 7, "logprobs": 3, "t_max_predict_ms": -1})).unwrap();
        assert_eq!((o.n_predict, o.n_probs, o.t_max_predict_ms), (7, 3, None));
        let o = options_of(json!({"n_predict": 0, "max_tokens": 7})).unwrap();
        assert_eq!(o.n_predict, 0);
        assert_eq!(options_of(json!({})).unwrap().n_predict, -1);
        for (body, param) in [
            (json!({"id_slot": 0}), "id_slot"),
            (json!({"id_slot": "a"}), "id_slot"),
            (json!({"n_predict": -2}), "n_predict"),
            (json!({"n_probs": 21}), "n_probs"),
            (json!({"post_sampling_probs": true}), "post_sampling_probs"),
            (json!({"n": 2}), "n"),
            (json!({"lora": [{"id": 0, "scale": 0.5}]}), "lora"),
            (json!({"response_fields": "content"}), "response_fields"),
            (json!({"n_indent": -1}), "n_indent"),
            (json!({"n_keep": 5}), "n_keep"),
            (json!({"n_cache_reuse": 256}), "n_cache_reuse"),
            (json!({"return_progress": true}), "return_progress"),
            (json!({"echo": true}), "echo"),
        ] {
            let e = options_of(body.clone())
                .err()
                .unwrap_or_else(|| panic!("{body} was accepted"));
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        }
        assert!(
            options_of(json!({"id_slot": -1, "lora": [], "n_keep": -1, "n_discard": 0})).is_ok()
        );
    }
}

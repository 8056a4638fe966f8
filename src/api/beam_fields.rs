//! vLLM's beam search fields of a completions or chat body: `use_beam_search`, `best_of` (the
//! width; `n` when absent), `length_penalty` (1.0) and `early_stopping` (`false`, `true` or
//! `"never"`), and the fields beam search refuses by name (`stream`, a `temperature` above 0,
//! `logprobs`, `echo`, constraints, `n` above the width). Called by the server's `generate`
//! before the body is planned by the shared rules (`plan`), which then read the rest.

use serde_json::{Map, Value};

use super::beam::{EarlyStopping, MAX_WIDTH};
use super::request::{type_name, Endpoint, Fields};
use super::RequestError;

/// A body's beam search, as asked.
#[derive(Clone, Debug, PartialEq)]
pub struct BeamFields {
    pub width: usize,
    /// Beams to return, best first (at most `width`).
    pub n: usize,
    pub length_penalty: f64,
    pub early_stopping: EarlyStopping,
}

/// Fields that constrain the output: beam search ranks the model's own log-probabilities.
const CONSTRAINTS: [&str; 9] = [
    "response_format",
    "tools",
    "regex",
    "grammar",
    "json_schema",
    "guided_json",
    "guided_regex",
    "guided_grammar",
    "guided_choice",
];

/// Sampling fields and the values that leave the distribution as it is.
const NEUTRAL_SAMPLING: [(&str, fn(&Value) -> bool); 20] = [
    ("top_p", |v| v.as_f64() == Some(1.0)),
    ("top_k", |v| matches!(v.as_i64(), Some(0 | -1))),
    ("min_p", |v| v.as_f64() == Some(0.0)),
    ("presence_penalty", |v| v.as_f64() == Some(0.0)),
    ("frequency_penalty", |v| v.as_f64() == Some(0.0)),
    ("repeat_penalty", |v| v.as_f64() == Some(1.0)),
    ("repetition_penalty", |v| v.as_f64() == Some(1.0)),
    ("logit_bias", |v| {
        v.as_object().is_some_and(Map::is_empty) || v.as_array().is_some_and(Vec::is_empty)
    }),
    ("typical_p", |v| v.as_f64() == Some(1.0)),
    ("top_n_sigma", |v| v.as_f64().is_some_and(|x| x <= 0.0)),
    ("mirostat", |v| v.as_i64() == Some(0)),
    ("dry_multiplier", |v| v.as_f64() == Some(0.0)),
    ("xtc_probability", |v| v.as_f64() == Some(0.0)),
    ("dynatemp_range", |v| v.as_f64() == Some(0.0)),
    ("samplers", |_| false),
    ("min_keep", |v| v.as_i64() == Some(0)),
    ("mirostat_tau", |_| false),
    ("mirostat_eta", |_| false),
    ("xtc_threshold", |_| false),
    ("dry_base", |_| false),
];

/// Reads the beam search of `body`: None without `use_beam_search: true`. With it, the beam
/// fields are taken out of `body` and `temperature` is set to 0, so the shared rules plan the
/// rest (prompt, `max_tokens`, `stop`) as for any body.
pub fn take(
    body: &mut Map<String, Value>,
    endpoint: Endpoint,
) -> Result<Option<BeamFields>, RequestError> {
    let f = Fields(body);
    if f.bool("use_beam_search")? != Some(true) {
        return Ok(None);
    }
    let refuse = |name: &str, why: &str| {
        Err(RequestError::invalid(
            name,
            format!("`{name}` {why} with `use_beam_search`"),
        ))
    };
    if f.bool("stream")? == Some(true) {
        return refuse(
            "stream",
            "is not supported (the beams are ranked at the end)",
        );
    }
    if f.number("temperature", 0.0, 2.0)?.is_some_and(|t| t > 0.0) {
        return refuse("temperature", "must be 0 (beam search is greedy)");
    }
    let logprobs = match endpoint {
        Endpoint::Completions => f.get("logprobs").is_some_and(|v| !v.is_null()),
        Endpoint::Chat => f.bool("logprobs")? == Some(true),
    };
    if logprobs {
        return refuse("logprobs", "is not supported");
    }
    if f.get("top_logprobs").is_some_and(|v| !v.is_null()) {
        return refuse("top_logprobs", "is not supported");
    }
    if f.bool("echo")? == Some(true) {
        return refuse("echo", "is not supported");
    }
    for name in CONSTRAINTS {
        let harmless = |v: &Value| {
            v.is_null()
                || v.as_array().is_some_and(Vec::is_empty)
                || v.get("type").and_then(Value::as_str) == Some("text")
        };
        if f.get(name).is_some_and(|v| !harmless(v)) {
            return refuse(name, "cannot be combined (no constraint)");
        }
    }
    // Beams rank the model's own log-probabilities: a field that would reshape them is refused
    // rather than ignored (its neutral value is accepted).
    for (name, neutral) in NEUTRAL_SAMPLING {
        if f.get(name).is_some_and(|v| !v.is_null() && !neutral(v)) {
            return refuse(
                name,
                "does not apply (beams rank the model's own log-probabilities)",
            );
        }
    }
    let n = f.integer("n", 1, MAX_WIDTH as i64)?.map(|v| v as usize);
    let best_of = f
        .integer("best_of", 1, MAX_WIDTH as i64)?
        .map(|v| v as usize);
    let width = best_of.or(n).unwrap_or(1);
    let n = n.unwrap_or(1);
    if n > width {
        return Err(RequestError::invalid(
            "n",
            format!("`n` ({n}) must be at most `best_of` ({width}), the beam width"),
        ));
    }
    let length_penalty = f.number("length_penalty", -10.0, 10.0)?.unwrap_or(1.0);
    let early_stopping = match f.get("early_stopping") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => EarlyStopping::Heuristic,
        Some(Value::Bool(true)) => EarlyStopping::Always,
        Some(Value::String(s)) if s == "never" => EarlyStopping::Never,
        Some(other) => {
            return Err(RequestError::invalid(
                "early_stopping",
                format!(
                    "`early_stopping` must be true, false or \"never\", got {}",
                    match other {
                        Value::String(s) => format!("{s:?}"),
                        v => type_name(v).to_string(),
                    }
                ),
            ))
        }
    };
    for name in [
        "use_beam_search",
        "best_of",
        "length_penalty",
        "early_stopping",
    ] {
        body.remove(name);
    }
    body.insert("n".into(), Value::from(1));
    body.insert("temperature".into(), Value::from(0.0));
    Ok(Some(BeamFields {
        width,
        n,
        length_penalty,
        early_stopping,
    }))
}

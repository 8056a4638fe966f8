//! llama-server's sampling fields beyond OpenAI's, read by the shared rules (`request::
//! gen_params_over`, so `/v1/completions`, `/v1/chat/completions` and `run --jsonl` alike):
//! `repeat_last_n`, DRY (`dry_multiplier`, `dry_base`, `dry_allowed_length`,
//! `dry_penalty_last_n`, `dry_sequence_breakers`), XTC (`xtc_probability`, `xtc_threshold`),
//! `typical_p`, `top_n_sigma`, Mirostat (`mirostat`, `mirostat_tau`, `mirostat_eta`), dynamic
//! temperature (`dynatemp_range`, `dynatemp_exponent`), `min_keep` and the chain's order
//! (`samplers`). Each is range-checked and refused naming the field; `adaptive_target` and
//! `adaptive_decay`, which edge-llm does not run, are refused unless they say "off".

use serde_json::Value;

use super::request::{type_name, Fields};
use super::RequestError;
use crate::engine::sampler::{SamplerKind, SamplingParams};

/// The fields read here, by their llama-server names (chat's `/set` takes them too).
pub const FIELDS: [&str; 17] = [
    "repeat_last_n",
    "dry_multiplier",
    "dry_base",
    "dry_allowed_length",
    "dry_penalty_last_n",
    "dry_sequence_breakers",
    "xtc_probability",
    "xtc_threshold",
    "typical_p",
    "top_n_sigma",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
    "dynatemp_range",
    "dynatemp_exponent",
    "min_keep",
    "samplers",
];

/// Largest value taken by the unbounded float fields (keeps them finite).
const BIG: f64 = 1e9;

/// A `*_last_n` field: a count of tokens, or -1 for all of them (llama.cpp's old "context
/// size").
fn last_n(f: &Fields, name: &str) -> Result<Option<usize>, RequestError> {
    Ok(f.integer(name, -1, i64::from(i32::MAX))?
        .map(|n| if n < 0 { usize::MAX } else { n as usize }))
}

/// Reads the fields into `s`; absent ones keep its values.
pub fn llama_sampling_fields(f: &Fields, s: &mut SamplingParams) -> Result<(), RequestError> {
    let float = |name: &str, lo: f64, hi: f64| -> Result<Option<f32>, RequestError> {
        Ok(f.number(name, lo, hi)?.map(|v| v as f32))
    };
    if let Some(n) = last_n(f, "repeat_last_n")? {
        s.repeat_last_n = n;
    }
    if let Some(v) = float("dry_multiplier", 0.0, BIG)? {
        s.dry_multiplier = v;
    }
    if let Some(v) = float("dry_base", 1.0, BIG)? {
        s.dry_base = v;
    }
    if let Some(v) = f.integer("dry_allowed_length", 0, i64::from(i32::MAX))? {
        s.dry_allowed_length = v as usize;
    }
    if let Some(n) = last_n(f, "dry_penalty_last_n")? {
        s.dry_penalty_last_n = n;
    }
    if let Some(b) = breakers(f)? {
        s.dry_sequence_breakers = b;
    }
    if let Some(v) = float("xtc_probability", 0.0, 1.0)? {
        s.xtc_probability = v;
    }
    if let Some(v) = float("xtc_threshold", 0.0, 1.0)? {
        s.xtc_threshold = v;
    }
    if let Some(v) = float("typical_p", 0.0, 1.0)? {
        s.typical_p = v;
    }
    if let Some(v) = float("top_n_sigma", -BIG, BIG)? {
        s.top_n_sigma = v;
    }
    if let Some(v) = f.integer("mirostat", 0, 2)? {
        s.mirostat = v as u8;
    }
    if let Some(v) = float("mirostat_tau", 0.0, BIG)? {
        s.mirostat_tau = v;
    }
    if let Some(v) = float("mirostat_eta", 0.0, BIG)? {
        s.mirostat_eta = v;
    }
    if let Some(v) = float("dynatemp_range", 0.0, BIG)? {
        s.dynatemp_range = v;
    }
    if let Some(v) = float("dynatemp_exponent", 0.0, BIG)? {
        s.dynatemp_exponent = v;
    }
    if let Some(v) = f.integer("min_keep", 0, i64::from(i32::MAX))? {
        s.min_keep = v as usize;
    }
    if let Some(order) = samplers(f)? {
        s.samplers = order;
    }
    // llama.cpp's adaptive-p sampler: edge-llm does not run it, so only "off" is taken.
    if let Some(v) = f.number("adaptive_target", -BIG, BIG)? {
        if v >= 0.0 {
            return Err(RequestError::invalid(
                "adaptive_target",
                "`adaptive_target` (llama.cpp's adaptive-p sampler) is not supported by this server; \
                 leave it out or negative",
            ));
        }
    }
    if f.get("adaptive_decay").is_some() {
        return Err(RequestError::invalid(
            "adaptive_decay",
            "`adaptive_decay` (llama.cpp's adaptive-p sampler) is not supported by this server",
        ));
    }
    // A fresh sequence starts Mirostat at 2 tau; nothing else to settle here.
    Ok(())
}

/// `dry_sequence_breakers`: a non-empty array of non-empty strings (llama-server's rule).
fn breakers(f: &Fields) -> Result<Option<Vec<String>>, RequestError> {
    const NAME: &str = "dry_sequence_breakers";
    let bad = |what: String| RequestError::invalid(NAME, what);
    match f.get(NAME) {
        None => Ok(None),
        Some(Value::Array(items)) if !items.is_empty() => items
            .iter()
            .map(|v| match v {
                Value::String(s) if !s.is_empty() => Ok(s.clone()),
                Value::String(_) => Err(bad(format!("`{NAME}` must not hold an empty string"))),
                other => Err(bad(format!(
                    "`{NAME}` must hold strings, got {}",
                    type_name(other)
                ))),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(other) => Err(bad(format!(
            "`{NAME}` must be a non-empty array of strings, got {}",
            match other {
                Value::Array(_) => "an empty array",
                v => type_name(v),
            }
        ))),
    }
}

/// `samplers`: an array of sampler names, or a string of one-letter codes.
fn samplers(f: &Fields) -> Result<Option<Vec<SamplerKind>>, RequestError> {
    const NAME: &str = "samplers";
    let bad = |what: String| RequestError::invalid(NAME, format!("`{NAME}`: {what}"));
    match f.get(NAME) {
        None => Ok(None),
        Some(Value::String(codes)) => SamplerKind::parse_codes(codes).map(Some).map_err(bad),
        Some(Value::Array(items)) => {
            let mut names = Vec::with_capacity(items.len());
            for v in items {
                match v {
                    Value::String(s) => names.push(s.as_str()),
                    other => {
                        return Err(bad(format!(
                            "must hold sampler names, got {}",
                            type_name(other)
                        )))
                    }
                }
            }
            SamplerKind::parse_names(&names).map(Some).map_err(bad)
        }
        Some(other) => Err(bad(format!(
            "must be an array of sampler names or a string of sampler codes, got {}",
            type_name(other)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(body: Value) -> Result<SamplingParams, RequestError> {
        let m = body.as_object().unwrap().clone();
        let mut s = SamplingParams::default();
        llama_sampling_fields(&Fields(&m), &mut s).map(|_| s)
    }

    #[test]
    fn reads_llama_server_fields() {
        let s = read(json!({
            "dry_multiplier": 0.8, "dry_base": 2, "dry_allowed_length": 3,
            "dry_penalty_last_n": -1, "dry_sequence_breakers": ["\n", "###"],
            "xtc_probability": 0.5, "xtc_threshold": 0.2, "typical_p": 0.9,
            "top_n_sigma": 1.5, "mirostat": 2, "mirostat_tau": 4, "mirostat_eta": 0.2,
            "dynatemp_range": 0.5, "dynatemp_exponent": 2, "min_keep": 3,
            "samplers": ["dry", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"],
            "repeat_last_n": 32, "adaptive_target": -1
        }))
        .unwrap();
        assert_eq!(
            (s.dry_multiplier, s.dry_base, s.dry_allowed_length),
            (0.8, 2.0, 3)
        );
        assert_eq!(s.dry_penalty_last_n, usize::MAX);
        assert_eq!(
            s.dry_sequence_breakers,
            vec!["\n".to_string(), "###".into()]
        );
        assert_eq!(
            (s.xtc_probability, s.xtc_threshold, s.typical_p),
            (0.5, 0.2, 0.9)
        );
        assert_eq!((s.top_n_sigma, s.mirostat, s.mirostat_tau), (1.5, 2, 4.0));
        assert_eq!(
            (s.dynatemp_range, s.dynatemp_exponent, s.min_keep),
            (0.5, 2.0, 3)
        );
        assert_eq!(s.samplers.len(), 7);
        assert_eq!(s.repeat_last_n, 32);
        let s = read(json!({"samplers": "kpt"})).unwrap();
        assert_eq!(
            s.samplers,
            vec![
                SamplerKind::TopK,
                SamplerKind::TopP,
                SamplerKind::Temperature
            ]
        );
    }

    #[test]
    fn bad_values_name_the_field() {
        for (body, param) in [
            (json!({"dry_multiplier": -1}), "dry_multiplier"),
            (json!({"dry_base": 0.5}), "dry_base"),
            (json!({"dry_allowed_length": 1.5}), "dry_allowed_length"),
            (json!({"dry_penalty_last_n": -2}), "dry_penalty_last_n"),
            (
                json!({"dry_sequence_breakers": []}),
                "dry_sequence_breakers",
            ),
            (
                json!({"dry_sequence_breakers": "\n"}),
                "dry_sequence_breakers",
            ),
            (
                json!({"dry_sequence_breakers": [""]}),
                "dry_sequence_breakers",
            ),
            (json!({"xtc_probability": 2}), "xtc_probability"),
            (json!({"xtc_threshold": -0.1}), "xtc_threshold"),
            (json!({"typical_p": 1.5}), "typical_p"),
            (json!({"top_n_sigma": "x"}), "top_n_sigma"),
            (json!({"mirostat": 3}), "mirostat"),
            (json!({"mirostat_tau": -1}), "mirostat_tau"),
            (json!({"mirostat_eta": -1}), "mirostat_eta"),
            (json!({"dynatemp_range": -1}), "dynatemp_range"),
            (json!({"dynatemp_exponent": -1}), "dynatemp_exponent"),
            (json!({"min_keep": -1}), "min_keep"),
            (json!({"samplers": ["top_k", "bogus"]}), "samplers"),
            (json!({"samplers": "kz"}), "samplers"),
            (json!({"samplers": ["adaptive_p"]}), "samplers"),
            (json!({"samplers": 3}), "samplers"),
            (json!({"adaptive_target": 0.5}), "adaptive_target"),
            (json!({"adaptive_decay": 0.9}), "adaptive_decay"),
            (json!({"repeat_last_n": -5}), "repeat_last_n"),
        ] {
            let e = read(body.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
            assert!(e.message.contains(param), "{body}: {}", e.message);
            assert!(!e.message.contains('\n'), "{body}: {}", e.message);
        }
    }
}

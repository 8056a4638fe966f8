//! `/infill`'s prompt: llama-server's `format_prompt_infill` (tools/server/server-common.cpp),
//! the repository-level fill-in-the-middle pattern of Qwen2.5-Coder's report
//! (arXiv:2409.12186), built token by token from the model's FIM tokens:
//!
//! ```text
//! [FIM_REP]myproject\n [FIM_SEP]filename0\n extra chunk 0 ... [FIM_SEP]filename\n
//! [BOS] [FIM_PRE]prefix prompt [FIM_SUF]suffix [FIM_MID]
//! ```
//!
//! The prefix keeps its last `3 * n_batch / 4` tokens, the suffix its first `n_batch / 4 - 2 -
//! prompt` tokens, and the extra chunks the last `n_ctx - n_batch + 2` tokens, as llama-server
//! cuts them (its `n_predict` default, -1, counted in). The prefix, suffix and chunks are
//! tokenized with special tokens left as text, `prompt` with them parsed. A vocabulary without
//! FIM tokens uses the chunk separator llama-server writes then. Called by `llama::infill`.

use serde_json::{Map, Value};

use super::request::{self, Fields};
use super::RequestError;
use crate::tokenizer::Tokenizer;

/// llama-server's default `--batch-size`, which decides how much prefix and suffix it keeps.
pub const LLAMA_SERVER_N_BATCH: usize = 2048;

/// The FIM prompt of an `/infill` body, for a context of `n_ctx` tokens.
pub fn prompt(
    tok: &Tokenizer,
    body: &Map<String, Value>,
    n_batch: usize,
    n_ctx: usize,
) -> Result<Vec<u32>, RequestError> {
    let fim = tok.fim_tokens();
    let (Some(pre), Some(suf), Some(mid)) = (fim.pre, fim.suf, fim.mid) else {
        let mut missing = Vec::new();
        for (id, what) in [
            (fim.pre, "prefix"),
            (fim.suf, "suffix"),
            (fim.mid, "middle"),
        ] {
            if id.is_none() {
                missing.push(format!("{what} token is missing"));
            }
        }
        return Err(RequestError::bad_request(format!(
            "infill is not supported by this model: {} (its vocabulary has no fill-in-the-middle \
             tokens)",
            missing.join(", ")
        ))
        .with_code("not_supported"));
    };
    let f = Fields(body);
    let text = |s: &str, parse_special: bool| {
        tok.encode(s, false, parse_special)
            .map_err(|e| RequestError::bad_request(format!("cannot tokenize: {e:#}")))
    };
    let mut prefix = mixed(tok, &f, "input_prefix")?;
    let mut suffix = mixed(tok, &f, "input_suffix")?;
    let prompt = text(f.str("prompt")?.unwrap_or(""), true)?;

    let mut extra = Vec::new();
    if let Some(rep) = fim.rep {
        extra.push(rep);
        extra.extend(text("myproject\n", false)?);
    }
    for (i, (filename, chunk)) in extra_chunks(&f)?.into_iter().enumerate() {
        match fim.sep {
            Some(sep) => {
                extra.push(sep);
                extra.extend(text(&format!("{filename}\n"), false)?);
            }
            // llama-server's separator where there is no file-separator token.
            None => extra.extend(text("\n\n--- snippet ---\n\n", false)?),
        }
        extra
            .extend(text(&chunk, false).map_err(|e| {
                RequestError::invalid(&format!("input_extra[{i}].text"), e.message)
            })?);
    }
    if let Some(sep) = fim.sep {
        extra.push(sep);
        extra.extend(text("filename\n", false)?);
    }

    let n_prefix_take = prefix.len().min(3 * (n_batch / 4));
    let n_suffix_take = suffix
        .len()
        .min((n_batch / 4).saturating_sub(2 + prompt.len()));
    // n_ctx - n_batch - 2 * n_predict, with llama-server's default n_predict of -1.
    let n_extra_take = (n_ctx + 2).saturating_sub(n_batch).min(extra.len());
    prefix.drain(..prefix.len() - n_prefix_take);
    suffix.truncate(n_suffix_take);

    let mut ids = extra[extra.len() - n_extra_take..].to_vec();
    if tok.add_bos_default() {
        ids.extend(tok.bos_id());
    }
    ids.push(pre);
    ids.extend(prefix);
    ids.extend(prompt);
    ids.push(suf);
    ids.extend(suffix);
    ids.push(mid);
    Ok(ids)
}

/// `name` (required): a text, or a list of texts and token ids, as llama-server's
/// `tokenize_mixed` takes it; texts tokenized with special tokens left as text.
fn mixed(tok: &Tokenizer, f: &Fields, name: &str) -> Result<Vec<u32>, RequestError> {
    let bad = |why: String| RequestError::invalid(name, why);
    let encode = |s: &str| {
        tok.encode(s, false, false)
            .map_err(|e| bad(format!("cannot tokenize `{name}`: {e:#}")))
    };
    match f.get(name) {
        None => Err(bad(format!("`{name}` is required"))),
        Some(Value::String(s)) => encode(s),
        Some(Value::Array(items)) => {
            let mut ids = Vec::new();
            for item in items {
                match item {
                    Value::String(s) => ids.extend(encode(s)?),
                    Value::Number(_) => ids.extend(
                        request::token_ids(std::slice::from_ref(item))
                            .map_err(|e| bad(format!("`{name}`: {e}")))?,
                    ),
                    other => {
                        return Err(bad(format!(
                            "`{name}` must hold texts and token ids, got {}",
                            request::type_name(other)
                        )))
                    }
                }
            }
            if let Some(&id) = ids.iter().find(|&&id| id as usize >= tok.vocab_size()) {
                return Err(bad(format!(
                    "token id {id} is outside the vocabulary of {} tokens",
                    tok.vocab_size()
                )));
            }
            Ok(ids)
        }
        Some(other) => Err(bad(format!(
            "`{name}` must be a string (or a list of texts and token ids), got {}",
            request::type_name(other)
        ))),
    }
}

/// `input_extra`: a list of `{"filename": STRING, "text": STRING}` (a missing filename is
/// llama-server's `tmp`).
fn extra_chunks(f: &Fields) -> Result<Vec<(String, String)>, RequestError> {
    const FIELD: &str = "input_extra";
    let items = match f.get(FIELD) {
        None => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(RequestError::invalid(
                FIELD,
                format!(
                    "`input_extra` must be an array of {{\"filename\": string, \"text\": string}}, \
                     got {}",
                    request::type_name(other)
                ),
            ))
        }
    };
    let mut chunks = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Value::Object(chunk) = item else {
            return Err(RequestError::invalid(
                &format!("{FIELD}[{i}]"),
                format!(
                    "`{FIELD}[{i}]` must be an object {{\"filename\": string, \"text\": string}}, \
                     got {}",
                    request::type_name(item)
                ),
            ));
        };
        let c = Fields(chunk);
        let named = |e: RequestError| {
            let field = format!("{FIELD}[{i}].{}", e.param.as_deref().unwrap_or("text"));
            RequestError::invalid(&field, format!("`{field}` must be a string"))
        };
        let text = c.str("text").map_err(named)?.ok_or_else(|| {
            let field = format!("{FIELD}[{i}].text");
            RequestError::invalid(&field, format!("`{field}` (a string) is required"))
        })?;
        let filename = c.str("filename").map_err(named)?.unwrap_or("tmp");
        chunks.push((filename.to_string(), text.to_string()));
    }
    Ok(chunks)
}

//! Rerankers: an encoder whose `{arch}.pooling_type` is rank scores a (query, document) pair
//! as llama.cpp's `build_pooling` does for `LLAMA_POOLING_TYPE_RANK` on a non-causal model:
//! the CLS token's final hidden state -> `cls` (+ bias) -> tanh -> `cls.output` (+ bias); the
//! score is the first value (llama-server's `send_rerank` reads `embd[0]`). Either matrix may
//! be missing (jina-reranker-v1 has no `cls.output`), as in llama.cpp.
//!
//! The pair's tokens follow llama-server's `format_prompt_rerank` for a model without a rerank
//! template: [BOS] query [EOS] [SEP] document [EOS], each special token where the vocabulary's
//! `add_bos` / `add_eos` / `add_sep` asks for it (WordPiece: bos yes, eos no, sep yes, so
//! `[CLS] query [SEP] document`), the EOS falling back to the SEP token. Called by
//! [`crate::model::encoder::Encoder`].

use anyhow::{Context, Result};

use super::forward::linear;
use super::weights::{dense, Dense};
use crate::gguf::GgufFile;
use crate::tokenizer::Tokenizer;

/// The classifier head of a reranker (`cls`, `cls.output`), each with its bias when present.
pub struct ClassifierHead {
    /// `cls`, [n_embd][n_embd], then tanh.
    pub cls: Option<Dense>,
    /// `cls.output`, [n_cls_out][n_embd]; the score is its first output.
    pub cls_out: Option<Dense>,
}

impl ClassifierHead {
    /// The head the file has (either matrix may be missing), checked against `n_embd`.
    pub fn from_gguf(g: &GgufFile, n_embd: usize) -> Result<ClassifierHead> {
        let cls = match g.find_tensor("cls.weight") {
            Some(_) => Some(dense(g, "cls", n_embd, n_embd).context("the classifier head")?),
            None => None,
        };
        let cls_out = match g.find_tensor("cls.output.weight") {
            Some(info) => {
                let n_out = info.n_rows().max(1);
                Some(dense(g, "cls.output", n_embd, n_out).context("the classifier head")?)
            }
            None => None,
        };
        Ok(ClassifierHead { cls, cls_out })
    }

    /// The relevance score of a pair from its CLS row (`[n_embd]`).
    pub fn score(&self, g: &GgufFile, cls_row: &[f32]) -> f32 {
        let mut x = cls_row.to_vec();
        if let Some(cls) = &self.cls {
            x = linear(g, cls, &x);
            for v in &mut x {
                *v = v.tanh();
            }
        }
        if let Some(out) = &self.cls_out {
            x = linear(g, out, &x);
        }
        x[0]
    }
}

/// Which special tokens a pair gets (`tokenizer.ggml.add_{bos,eos,sep}_token`, else
/// llama.cpp's defaults for the vocabulary: a WordPiece one adds BOS and SEP, not EOS).
struct PairTokens {
    bos: Option<u32>,
    eos: Option<u32>,
    sep: Option<u32>,
}

fn pair_specials(g: &GgufFile, t: &Tokenizer) -> Result<PairTokens> {
    let wpm = g.get_str("tokenizer.ggml.model").is_ok_and(|m| m == "bert");
    let add_bos = g.get_bool_or("tokenizer.ggml.add_bos_token", wpm)?;
    let add_eos = g.get_bool_or("tokenizer.ggml.add_eos_token", false)?;
    let add_sep = g.get_bool_or("tokenizer.ggml.add_sep_token", wpm)?;
    let sep_id = match g.get("tokenizer.ggml.seperator_token_id") {
        Some(_) => Some(g.get_u64("tokenizer.ggml.seperator_token_id")? as u32),
        None if wpm => Some(102),
        None => None,
    };
    Ok(PairTokens {
        bos: t.bos_id().filter(|_| add_bos),
        eos: t.eos_id().or(sep_id).filter(|_| add_eos),
        sep: sep_id.filter(|_| add_sep),
    })
}

/// The tokens of a (query, document) pair, as llama-server's `format_prompt_rerank` makes them
/// (special tokens in the texts are plain text).
pub fn pair_tokens(g: &GgufFile, t: &Tokenizer, query: &str, document: &str) -> Result<Vec<u32>> {
    let s = pair_specials(g, t)?;
    let mut out = Vec::new();
    out.extend(s.bos);
    out.extend(t.encode(query, false, false)?);
    out.extend(s.eos);
    out.extend(s.sep);
    out.extend(t.encode(document, false, false)?);
    out.extend(s.eos);
    Ok(out)
}

//! Rerankers: an encoder whose `{arch}.pooling_type` is rank scores a (query, document) pair
//! as llama.cpp's `build_pooling` does for `LLAMA_POOLING_TYPE_RANK` on a non-causal model:
//! the CLS token's final hidden state -> `cls` (+ bias) -> tanh -> `cls.output` (+ bias); the
//! score is the first value (llama-server's `send_rerank` reads `embd[0]`). Either matrix may
//! be missing (jina-reranker-v1 has no `cls.output`), as in llama.cpp.
//!
//! The pair's tokens follow llama-server's `format_prompt_rerank` (`crate::model::rank::PairFormat`:
//! `[CLS] query [SEP] document` for WordPiece). Called by [`crate::model::encoder::Encoder`].

use anyhow::{Context, Result};

use super::forward::linear;
use super::weights::{dense, Dense};
use crate::gguf::GgufFile;
use crate::model::rank::PairFormat;
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

/// The tokens of a (query, document) pair, as llama-server's `format_prompt_rerank` makes them
/// (special tokens in the texts are plain text).
pub fn pair_tokens(g: &GgufFile, t: &Tokenizer, query: &str, document: &str) -> Result<Vec<u32>> {
    PairFormat::from_gguf(g, t)?.tokens(t, query, document)
}

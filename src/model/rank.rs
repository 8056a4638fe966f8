//! Rerankers' shared parts: how a (query, document) pair becomes tokens ([`PairFormat`], as
//! llama-server's `format_prompt_rerank`), and the head of a decoder reranker ([`DecoderHead`],
//! Qwen3-Reranker as llama.cpp's converter writes it: pooling_type rank, `cls.output` the
//! lm_head's rows of "yes" and "no", a `tokenizer.chat_template.rerank` prompt). llama.cpp's
//! `build_pooling` for rank on a causal model takes the last token's normed hidden state,
//! multiplies by `cls.output` (+ bias), and for qwen3 takes the softmax; the score is the first
//! value (p("yes")). Encoders' heads are `crate::model::encoder::rank`. Callers: the encoder,
//! and the server's rerank route for a decoder (the engine computes the hidden state).

use anyhow::{bail, Result};

use crate::gguf::GgufFile;
use crate::model::pooling::Pooling;
use crate::tokenizer::Tokenizer;

/// The GGUF key of a reranker's prompt, `{query}` and `{document}` replaced.
pub const RERANK_TEMPLATE_KEY: &str = "tokenizer.chat_template.rerank";

/// How a pair is tokenized: the rerank prompt when the file has one (special tokens parsed, no
/// BOS added), else [BOS] query [EOS] [SEP] document [EOS], each where the vocabulary's
/// `add_bos` / `add_eos` / `add_sep` asks (WordPiece: BOS and SEP, so `[CLS] q [SEP] d`), EOS
/// falling back to SEP.
#[derive(Clone, Debug)]
pub struct PairFormat {
    template: Option<String>,
    bos: Option<u32>,
    eos: Option<u32>,
    sep: Option<u32>,
}

impl PairFormat {
    pub fn from_gguf(g: &GgufFile, t: &Tokenizer) -> Result<PairFormat> {
        let template = match g.get(RERANK_TEMPLATE_KEY) {
            Some(_) => Some(g.get_str(RERANK_TEMPLATE_KEY)?.to_string()),
            None => None,
        };
        let wpm = g.get_str("tokenizer.ggml.model").is_ok_and(|m| m == "bert");
        let add_bos = g.get_bool_or("tokenizer.ggml.add_bos_token", wpm)?;
        let add_eos = g.get_bool_or("tokenizer.ggml.add_eos_token", false)?;
        let add_sep = g.get_bool_or("tokenizer.ggml.add_sep_token", wpm)?;
        let sep_id = match g.get("tokenizer.ggml.seperator_token_id") {
            Some(_) => Some(g.get_u64("tokenizer.ggml.seperator_token_id")? as u32),
            None if wpm => Some(102),
            None => None,
        };
        Ok(PairFormat {
            template,
            bos: t.bos_id().filter(|_| add_bos),
            eos: t.eos_id().or(sep_id).filter(|_| add_eos),
            sep: sep_id.filter(|_| add_sep),
        })
    }

    /// The tokens of a (query, document) pair.
    pub fn tokens(&self, t: &Tokenizer, query: &str, document: &str) -> Result<Vec<u32>> {
        if let Some(template) = &self.template {
            let prompt = template
                .replace("{query}", query)
                .replace("{document}", document);
            return t.encode(&prompt, false, true);
        }
        let mut out = Vec::new();
        out.extend(self.bos);
        out.extend(t.encode(query, false, false)?);
        out.extend(self.eos);
        out.extend(self.sep);
        out.extend(t.encode(document, false, false)?);
        out.extend(self.eos);
        Ok(out)
    }
}

/// A decoder reranker: its pair format and `cls.output` as f32 ([n_out][n_embd], a few rows).
pub struct DecoderHead {
    pub format: PairFormat,
    cls_out: Vec<f32>,
    bias: Option<Vec<f32>>,
    n_embd: usize,
    /// qwen3's softmax over the outputs (llama.cpp applies it for qwen3 and qwen3vl).
    softmax: bool,
}

impl DecoderHead {
    /// The head of a decoder whose pooling_type is rank; None for any other decoder.
    pub fn from_gguf(g: &GgufFile, t: &Tokenizer, n_embd: usize) -> Result<Option<DecoderHead>> {
        if !Pooling::is_rank(g) {
            return Ok(None);
        }
        if g.find_tensor("cls.weight").is_some() {
            bail!("a decoder reranker with a `cls` matrix is not supported (only `cls.output`)");
        }
        let Some(info) = g.find_tensor("cls.output.weight") else {
            bail!("pooling_type is rank but the file has no cls.output.weight");
        };
        let n_out = info.n_rows();
        if info.row_len() != n_embd || n_out == 0 {
            bail!(
                "tensor 'cls.output.weight' has shape {:?}, expected [{n_embd}, N]",
                info.dims
            );
        }
        let m = crate::model::weights::MatrixInfo::load(g, "cls.output.weight", n_embd, n_out)?;
        let mut cls_out = vec![0.0f32; n_out * n_embd];
        let rb = m.row_bytes();
        for (r, row) in cls_out.chunks_exact_mut(n_embd).enumerate() {
            crate::kernels::dequantize_row(m.ttype, &m.bytes(g)[r * rb..(r + 1) * rb], row);
        }
        let bias = match g.find_tensor("cls.output.bias") {
            Some(_) => Some(crate::model::weights::load_vector(
                g,
                "cls.output.bias",
                n_out,
            )?),
            None => None,
        };
        let arch = g.architecture()?;
        Ok(Some(DecoderHead {
            format: PairFormat::from_gguf(g, t)?,
            cls_out,
            bias,
            n_embd,
            softmax: arch == "qwen3" || arch == "qwen3vl",
        }))
    }

    /// The score of a pair from the last token's normed hidden state (`[n_embd]`).
    pub fn score(&self, last: &[f32]) -> f32 {
        let mut out: Vec<f32> = self
            .cls_out
            .chunks_exact(self.n_embd)
            .map(|w| w.iter().zip(last).map(|(a, b)| a * b).sum())
            .collect();
        if let Some(b) = &self.bias {
            for (o, b) in out.iter_mut().zip(b) {
                *o += b;
            }
        }
        if self.softmax {
            let max = out.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let sum: f32 = out.iter().map(|&x| (x - max).exp()).sum();
            return (out[0] - max).exp() / sum;
        }
        out[0]
    }
}

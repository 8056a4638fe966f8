//! Perplexity the way llama.cpp's `llama-perplexity` computes it: the text is tokenized once,
//! cut into non-overlapping chunks of `n_ctx` tokens (the first token of each chunk replaced by
//! BOS when the model adds one), and each chunk is scored on its second half only, every token
//! predicted from all the tokens before it in the chunk.

use anyhow::{bail, Result};

use crate::device::{Device, Placement};
use crate::engine::sampler::log_softmax_at;
use crate::model::Model;
use crate::scoring::runner::SequenceRunner;

/// Running totals after each chunk.
#[derive(Clone, Debug, Default)]
pub struct PerplexityStats {
    /// Sum of negative log-likelihoods and of their squares.
    nll: f64,
    nll2: f64,
    pub count: usize,
    pub num_chunks: usize,
}

impl PerplexityStats {
    pub fn ppl(&self) -> f64 {
        (self.nll / self.count as f64).exp()
    }

    /// The standard error of the estimate, as llama-perplexity reports it.
    pub fn ppl_error(&self) -> f64 {
        let n = self.count as f64;
        let mean = self.nll / n;
        let var = self.nll2 / n - mean * mean;
        if var > 0.0 && self.count > 1 {
            (var / (n - 1.0)).sqrt() * self.ppl()
        } else {
            0.0
        }
    }
}

/// Scores `text` in chunks of `n_ctx` tokens, calling `on_chunk` with the running stats after
/// each. `max_chunks` limits the work (None: all chunks).
pub fn perplexity(
    model: &Model,
    text: &str,
    n_ctx: usize,
    max_chunks: Option<usize>,
    on_chunk: impl FnMut(&PerplexityStats),
) -> Result<PerplexityStats> {
    perplexity_on(model, Device::Cpu, text, n_ctx, max_chunks, on_chunk)
}

/// [`perplexity`] with the forward pass on `device`.
pub fn perplexity_on(
    model: &Model,
    device: impl Into<Placement>,
    text: &str,
    n_ctx: usize,
    max_chunks: Option<usize>,
    mut on_chunk: impl FnMut(&PerplexityStats),
) -> Result<PerplexityStats> {
    let tokens = chunk_tokens(model, text, n_ctx, max_chunks)?;
    let vocab = model.config.vocab_size;
    let mut stats = PerplexityStats::default();
    for_each_chunk(model, device, &tokens, n_ctx, |chunk, logits| {
        let targets = &tokens[chunk * n_ctx + n_ctx / 2 + 1..(chunk + 1) * n_ctx];
        for (row, &target) in logits.chunks_exact(vocab).zip(targets) {
            stats.add(-log_softmax_at(row, target as usize));
        }
        stats.num_chunks = chunk + 1;
        on_chunk(&stats);
        Ok(())
    })?;
    Ok(stats)
}

impl PerplexityStats {
    /// Counts one scored token with negative log-likelihood `nll`.
    pub fn add(&mut self, nll: f64) {
        self.nll += nll;
        self.nll2 += nll * nll;
        self.count += 1;
    }
}

/// The tokens perplexity scores: `text` tokenized once (BOS first when the model adds one),
/// cut to whole chunks of `n_ctx` tokens, at most `max_chunks` of them.
pub fn chunk_tokens(
    model: &Model,
    text: &str,
    n_ctx: usize,
    max_chunks: Option<usize>,
) -> Result<Vec<u32>> {
    if n_ctx < 8 {
        bail!("context size {n_ctx} is too small for perplexity (at least 8)");
    }
    if max_chunks == Some(0) {
        bail!("--chunks must be at least 1");
    }
    let tok = &model.tokenizer;
    let add_bos = tok.add_bos_default();
    let mut tokens = match max_chunks {
        // Only as much text as the chunks need (a large file is not tokenized whole).
        Some(m) => encode_prefix(tok, text, add_bos, m.max(2).saturating_mul(n_ctx))?,
        None => tok.encode(text, add_bos, false)?,
    };
    if tokens.len() < 2 * n_ctx {
        bail!(
            "the text has {} tokens; perplexity with context {n_ctx} needs at least {}",
            tokens.len(),
            2 * n_ctx
        );
    }
    let mut num_chunks = tokens.len() / n_ctx;
    if let Some(m) = max_chunks {
        num_chunks = num_chunks.min(m);
    }
    tokens.truncate(num_chunks * n_ctx);
    Ok(tokens)
}

/// Runs every chunk of `n_ctx` tokens in `tokens` (each alone, its first token replaced by BOS
/// when the model adds one) and calls `on_chunk(chunk, logits)` with the logits of the
/// positions `n_ctx/2 .. n_ctx-1` (the ones that predict the scored second half), row after row.
pub fn for_each_chunk(
    model: &Model,
    device: impl Into<Placement>,
    tokens: &[u32],
    n_ctx: usize,
    mut on_chunk: impl FnMut(usize, &[f32]) -> Result<()>,
) -> Result<()> {
    let tok = &model.tokenizer;
    let bos = tok.bos_id().filter(|_| tok.add_bos_default());
    let first = n_ctx / 2;
    let vocab = model.config.vocab_size;
    let mut runner = SequenceRunner::on(
        model,
        n_ctx,
        crate::engine::EngineConfig::DEFAULT_BLOCK_SIZE,
        device,
    )?;
    for (chunk, input) in tokens.chunks_exact(n_ctx).enumerate() {
        let mut input = input.to_vec();
        if let Some(bos) = bos {
            input[0] = bos;
        }
        runner.reset();
        let logits = runner.eval(&input, true)?;
        on_chunk(chunk, &logits[first * vocab..(n_ctx - 1) * vocab])?;
    }
    Ok(())
}

/// The first `need` tokens of `text` (or all, if it has fewer), tokenizing growing prefixes:
/// a prefix's last tokens may differ from the whole text's where it was cut, so a prefix counts
/// only when it yields a margin past `need`.
fn encode_prefix(
    tok: &crate::tokenizer::Tokenizer,
    text: &str,
    add_bos: bool,
    need: usize,
) -> Result<Vec<u32>> {
    const MARGIN: usize = 64;
    let mut bytes = need.saturating_add(MARGIN).saturating_mul(8);
    loop {
        if bytes >= text.len() {
            return tok.encode(text, add_bos, false);
        }
        let mut cut = bytes;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        let mut tokens = tok.encode(&text[..cut], add_bos, false)?;
        if tokens.len() >= need + MARGIN {
            tokens.truncate(need);
            return Ok(tokens);
        }
        bytes = bytes.saturating_mul(2);
    }
}

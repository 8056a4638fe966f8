//! One sequence run straight through the paged KV cache: the path `run` and `perplexity` use.
//! It builds the same flat [`Batch`] the engine builds for many sequences, with a block table
//! that grows one block at a time, so a single sequence walks the KV cache exactly as many will.

use anyhow::{bail, Result};

use crate::device::{Device, Executor};
use crate::kv_cache::BlockAllocator;
use crate::model::{Batch, Model};
use crate::sampler::{Sampler, SamplingParams};

/// Default KV block size in tokens.
pub const DEFAULT_BLOCK_SIZE: usize = 16;
/// Most tokens one forward step takes from a prompt.
pub const DEFAULT_BATCH_TOKENS: usize = 512;

pub struct SequenceRunner<'m> {
    model: &'m Model,
    /// The KV pool and the device the forward pass runs on.
    exec: Executor,
    allocator: BlockAllocator,
    /// This sequence's block table.
    block_table: Vec<u32>,
    /// Tokens whose keys and values are in the cache.
    num_computed: usize,
    n_ctx: usize,
    pub batch_tokens: usize,
}

impl<'m> SequenceRunner<'m> {
    /// A runner on the CPU with room for `n_ctx` tokens in blocks of `block_size`.
    pub fn new(model: &'m Model, n_ctx: usize, block_size: usize) -> Self {
        let num_blocks = n_ctx.div_ceil(block_size).max(1);
        Self::with_executor(model, n_ctx, Executor::cpu(model, block_size, num_blocks))
    }

    /// A runner on `device` (resolved as `--device` is) with room for `n_ctx` tokens.
    pub fn on(model: &'m Model, n_ctx: usize, block_size: usize, device: Device) -> Result<Self> {
        let num_blocks = n_ctx.div_ceil(block_size.max(1)).max(1);
        Ok(Self::with_executor(
            model,
            n_ctx,
            Executor::new(model, device, block_size, num_blocks)?,
        ))
    }

    fn with_executor(model: &'m Model, n_ctx: usize, exec: Executor) -> Self {
        let num_blocks = n_ctx.div_ceil(exec.block_size()).max(1);
        SequenceRunner {
            model,
            exec,
            allocator: BlockAllocator::new(num_blocks),
            block_table: Vec::new(),
            num_computed: 0,
            n_ctx,
            batch_tokens: DEFAULT_BATCH_TOKENS,
        }
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    pub fn num_computed(&self) -> usize {
        self.num_computed
    }

    /// Forgets the sequence and returns its blocks to the pool.
    pub fn reset(&mut self) {
        self.allocator.free(self.block_table.drain(..));
        self.num_computed = 0;
    }

    /// Number of free KV blocks (all of them after `reset`).
    pub fn num_free_blocks(&self) -> usize {
        self.allocator.num_free()
    }

    /// Appends `tokens` to the sequence and runs them, at most `batch_tokens` per step.
    /// Returns the logits of every token when `all_logits`, else of the last one only:
    /// [rows][vocab_size].
    pub fn eval(&mut self, tokens: &[u32], all_logits: bool) -> Result<Vec<f32>> {
        if self.num_computed + tokens.len() > self.n_ctx {
            bail!(
                "{} tokens do not fit the context: {} already used of {}",
                tokens.len(),
                self.num_computed,
                self.n_ctx
            );
        }
        let bs = self.exec.block_size();
        let mut logits = Vec::new();
        for (ci, chunk) in tokens.chunks(self.batch_tokens.max(1)).enumerate() {
            let is_last_chunk = (ci + 1) * self.batch_tokens.max(1) >= tokens.len();
            let end = self.num_computed + chunk.len();
            while self.block_table.len() * bs < end {
                let b = self
                    .allocator
                    .allocate()
                    .expect("runner sized its pool for n_ctx");
                self.block_table.push(b);
            }
            let mut batch = Batch {
                max_blocks_per_seq: self.block_table.len(),
                ..Default::default()
            };
            let seq = batch.push_block_table(&self.block_table);
            for (i, &tok) in chunk.iter().enumerate() {
                let pos = self.num_computed + i;
                let slot = self.block_table[pos / bs] as usize * bs + pos % bs;
                let want = all_logits || (is_last_chunk && i + 1 == chunk.len());
                batch.push_token(tok, pos, slot, seq, want);
            }
            logits.extend(self.exec.forward(self.model, &batch)?);
            self.num_computed = end;
        }
        Ok(logits)
    }
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// The model produced an end-of-generation token.
    Stop,
    /// `n_predict` tokens were generated.
    Length,
    /// The callback asked to stop.
    Abort,
}

/// Options of one plain generation.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub n_predict: usize,
    pub ignore_eos: bool,
    pub sampling: SamplingParams,
}

/// Runs `prompt` then samples up to `n_predict` tokens, handing each to `on_token` (which
/// returns false to stop). The end-of-generation token itself is not handed over.
pub fn generate(
    runner: &mut SequenceRunner<'_>,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<FinishReason> {
    if prompt.is_empty() {
        bail!("the prompt is empty");
    }
    if prompt.len() >= runner.n_ctx() {
        bail!(
            "the prompt has {} tokens, but the context holds {}",
            prompt.len(),
            runner.n_ctx()
        );
    }
    let tokenizer = &runner.model.tokenizer;
    let mut sampler = Sampler::new(opts.sampling.clone());
    let mut generated = Vec::new();
    let mut logits = runner.eval(prompt, false)?;
    while generated.len() < opts.n_predict {
        let tok = sampler.sample(&logits, prompt, &generated);
        if !opts.ignore_eos && tokenizer.is_eog(tok) {
            return Ok(FinishReason::Stop);
        }
        generated.push(tok);
        if !on_token(tok) {
            return Ok(FinishReason::Abort);
        }
        if generated.len() == opts.n_predict || runner.num_computed() + 1 > runner.n_ctx() {
            break;
        }
        logits = runner.eval(&[tok], false)?;
    }
    Ok(FinishReason::Length)
}

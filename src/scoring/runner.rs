//! One sequence's logits straight through the paged KV cache, for scoring text: `perplexity` and
//! the model tests (logits along a text, on every family) use it. Generation goes through the
//! engine (`crate::engine`), for one sequence as for many. It builds the same flat [`Batch`] the
//! engine builds, with a block table that grows one block at a time, so a single sequence walks
//! the KV cache exactly as many do; its pool is sized for its one sequence, so block `i` of the
//! table is simply block `i` of the pool (no allocator).

use anyhow::{bail, Result};

use crate::device::{Executor, Placement};
use crate::engine::EngineConfig;
use crate::model::kv_cache::BlockId;
use crate::model::{Batch, Model};

pub struct SequenceRunner<'m> {
    model: &'m Model,
    /// The KV pool and the device the forward pass runs on.
    exec: Executor,
    /// This sequence's block table: `0..n`, as the pool holds this sequence only.
    block_table: Vec<BlockId>,
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

    /// A runner on a device (resolved as `--device` is; a bare `Device` keeps an f16 cache) with
    /// room for `n_ctx` tokens.
    pub fn on(
        model: &'m Model,
        n_ctx: usize,
        block_size: usize,
        device: impl Into<Placement>,
    ) -> Result<Self> {
        let num_blocks = n_ctx.div_ceil(block_size.max(1)).max(1);
        Ok(Self::with_executor(
            model,
            n_ctx,
            Executor::new(model, device, block_size, num_blocks)?,
        ))
    }

    fn with_executor(model: &'m Model, n_ctx: usize, mut exec: Executor) -> Self {
        // One sequence: one recurrent state slot, if the model has recurrent layers. Only
        // the CUDA backend refuses it, and it refuses such a model at load already.
        let _ = exec.set_state_slots(model, 1);
        SequenceRunner {
            model,
            exec,
            block_table: Vec::new(),
            num_computed: 0,
            n_ctx,
            batch_tokens: EngineConfig::DEFAULT_MAX_BATCHED_TOKENS,
        }
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    pub fn num_computed(&self) -> usize {
        self.num_computed
    }

    /// Forgets the sequence: the next `eval` starts a new one at position 0.
    pub fn reset(&mut self) {
        self.block_table.clear();
        self.num_computed = 0;
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
            // The pool holds n_ctx tokens, checked above: the next block is always there.
            while self.block_table.len() * bs < end {
                self.block_table
                    .push(BlockId(self.block_table.len() as u32));
            }
            let mut batch = Batch::with_max_blocks(self.block_table.len());
            let start = self.num_computed;
            let logits_from = if all_logits {
                start
            } else if is_last_chunk {
                end - 1
            } else {
                end
            };
            let token_at = |pos: usize| chunk[pos - start];
            batch.push_sequence(&self.block_table, bs, start..end, token_at, logits_from);
            if self.model.config.is_recurrent() {
                batch.state_slots.push(0);
            }
            logits.extend(self.exec.forward(self.model, &batch)?);
            self.num_computed = end;
        }
        Ok(logits)
    }
}

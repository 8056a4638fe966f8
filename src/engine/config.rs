//! The engine's sizes, fixed at start-up, and their defaults (decided here once: the flags,
//! the scoring runner and the tests take them from [`EngineConfig`]).

use anyhow::{bail, Context, Result};

use super::state_slots::StateSlots;
use crate::kernels::KvTypes;
use crate::model::kv_cache::KvCache;
use crate::model::state_pool::StatePool;
use crate::model::Model;

/// Sizes fixed at start-up.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Tokens per KV block.
    pub block_size: usize,
    /// Blocks in the KV pool.
    pub num_blocks: usize,
    /// Most tokens one sequence may hold (prompt and generated).
    pub max_seq_len: usize,
    /// Most tokens one step runs (chunked prefill cuts prompts to fit).
    pub max_batched_tokens: usize,
    /// Most sequences running at once.
    pub max_seqs: usize,
    /// Most requests waiting or running; more are refused.
    pub max_queue: usize,
    /// While any sequence decodes, a step's prefill is cut so the step takes about this long
    /// (`--max-step-ms`); None: prompts fill the token budget.
    pub max_step_ms: Option<u64>,
    /// Most time a step waits after its forward pass for a constrained row's token mask
    /// (`--mask-budget-ms`): a row past it ends its own request with an error, so one costly
    /// grammar never holds every other row.
    pub mask_budget_ms: u64,
    /// What the KV pool's keys and values are held in (`--cache-type-k`, `--cache-type-v`).
    pub kv_types: KvTypes,
    /// Recurrent state slots (`crate::model::state_pool`), for a model with recurrent layers:
    /// the most sequences that run at once; as many again hold snapshots. Taken from the same
    /// memory budget as the blocks.
    /// Ignored (none allocated) for a model without.
    pub num_state_slots: usize,
}

impl EngineConfig {
    /// Tokens per KV block (`--block-size`).
    pub const DEFAULT_BLOCK_SIZE: usize = 16;
    /// Most tokens one step runs (`--max-batched-tokens`).
    pub const DEFAULT_MAX_BATCHED_TOKENS: usize = 512;
    /// Most sequences running at once.
    pub const DEFAULT_MAX_SEQS: usize = 256;
    /// Most requests queued or running (`--max-queue`).
    pub const DEFAULT_MAX_QUEUE: usize = 256;
    /// The step-time cap while sequences decode (`--max-step-ms`).
    pub const DEFAULT_MAX_STEP_MS: u64 = super::step_time::DEFAULT_MAX_STEP_MS;
    /// Sequences the pool is sized for without `--kv-mem` (`--parallel`).
    pub const DEFAULT_PARALLEL: usize = 4;
    /// The time one token mask may take (`--mask-budget-ms`): masks take well under 10 ms
    /// (a 330 KB enum about 100 ms), so only a pathological grammar reaches it.
    pub const DEFAULT_MASK_BUDGET_MS: u64 = 1000;

    /// A pool of `kv_types` sized from a memory budget in MiB, or else from
    /// `ctx_size * parallel` tokens.
    pub fn sized(
        model: &Model,
        kv_types: KvTypes,
        block_size: usize,
        kv_mem_mib: Option<usize>,
        ctx_size: usize,
        parallel: usize,
    ) -> Result<Self> {
        if block_size == 0 || block_size > 1024 {
            bail!("--block-size must be between 1 and 1024, got {block_size}");
        }
        if ctx_size < 2 || parallel == 0 {
            bail!("--ctx-size must be at least 2 and --parallel at least 1");
        }
        kv_types
            .check(model.config.head_dim)
            .map_err(anyhow::Error::msg)?;
        let per_block = KvCache::bytes_per_block_as(kv_types, &model.config, block_size);
        // A model with recurrent layers: one state slot per sequence of --parallel and as many
        // for snapshots (`StateSlots::pool_slots`), first.
        let slot_bytes = StatePool::slot_bytes(&model.config);
        let num_state_slots = if slot_bytes > 0 { parallel } else { 0 };
        let state_bytes = StateSlots::pool_slots(num_state_slots).saturating_mul(slot_bytes);
        let num_blocks = match kv_mem_mib {
            Some(mib) => {
                let budget = mib.checked_mul(1 << 20).with_context(|| {
                    format!("--kv-mem {mib} MiB is more memory than can be addressed")
                })?;
                budget.checked_sub(state_bytes).with_context(|| {
                    format!(
                        "--kv-mem {mib} MiB does not hold the recurrent state of {parallel} sequences ({}); raise --kv-mem or lower --parallel",
                        super::memory::size(state_bytes as u64)
                    )
                })? / per_block
            }
            None => ctx_size
                .div_ceil(block_size)
                .checked_mul(parallel)
                .with_context(|| {
                    format!("--ctx-size {ctx_size} times --parallel {parallel} is too large")
                })?,
        };
        if num_blocks * block_size < ctx_size.min(2 * block_size) {
            bail!("the KV memory budget holds {} blocks of {block_size} tokens: too small for one sequence", num_blocks);
        }
        let max_seq_len = ctx_size.min(num_blocks * block_size);
        Ok(EngineConfig {
            block_size,
            num_blocks,
            max_seq_len,
            max_batched_tokens: Self::DEFAULT_MAX_BATCHED_TOKENS,
            max_seqs: Self::DEFAULT_MAX_SEQS,
            max_queue: Self::DEFAULT_MAX_QUEUE,
            max_step_ms: Some(Self::DEFAULT_MAX_STEP_MS),
            mask_budget_ms: Self::DEFAULT_MASK_BUDGET_MS,
            kv_types,
            num_state_slots,
        })
    }

    /// Bytes of the KV pool and, for a model with recurrent layers, its state slots.
    pub fn kv_bytes(&self, model: &Model) -> usize {
        self.num_blocks * KvCache::bytes_per_block_as(self.kv_types, &model.config, self.block_size)
            + self.state_bytes(model)
    }

    /// State slots this engine allocates for `model` (none without recurrent layers).
    pub fn state_slots_for(&self, model: &Model) -> usize {
        match model.config.is_recurrent() {
            true => self.num_state_slots,
            false => 0,
        }
    }

    /// Bytes of the recurrent state slots, the snapshots' included.
    pub fn state_bytes(&self, model: &Model) -> usize {
        StateSlots::pool_slots(self.state_slots_for(model)) * StatePool::slot_bytes(&model.config)
    }

    /// What this engine will hold in host memory: the KV pool, the weights and an estimate of
    /// one step's activations and logits (for `memory::admit`).
    pub fn footprint(&self, model: &Model) -> crate::engine::memory::Footprint {
        let c = &model.config;
        let ffn = match &c.experts {
            // the router's logits, each chosen expert's output slot, its input, gate, up, output
            Some(x) => x.num_experts + x.num_experts_used * (3 * c.n_embd + 2 * x.n_ff_exp),
            None => 3 * c.n_ff,
        };
        let per_token = 4 * c.n_embd + ffn + c.q_dim() + 2 * c.kv_dim();
        let rows = self.max_batched_tokens.min(self.max_seqs) as u64;
        let scratch =
            (self.max_batched_tokens * per_token * 4) as u64 + rows * c.vocab_size as u64 * 4;
        crate::engine::memory::Footprint {
            kv: (self.num_blocks as u64).saturating_mul(KvCache::bytes_per_block_as(
                self.kv_types,
                c,
                self.block_size,
            ) as u64),
            state: self.state_bytes(model) as u64,
            weights: model.file.file_bytes(),
            scratch,
            weights_paged: false,
        }
    }
}

//! Counters kept by the engine thread and read by clients through `EngineHandle::metrics`
//! (the server's `/metrics`, the chat `/stats`, `bench`).

use std::collections::BTreeMap;

use super::block_manager::PrefixCacheStats;

#[derive(Clone, Debug, Default)]
pub struct Metrics {
    pub requests_submitted: u64,
    pub requests_finished: u64,
    pub requests_aborted: u64,
    pub requests_failed: u64,
    /// Prompt tokens computed (prefill), and tokens generated (decode).
    pub tokens_prefilled: u64,
    pub tokens_generated: u64,
    pub steps: u64,
    /// Steps whose prefill was cut shorter than the token budget allowed, so the sequences
    /// decoding beside it kept `--max-step-ms`.
    pub steps_prefill_capped: u64,
    pub preemptions: u64,
    pub prefix_cache: PrefixCacheStats,
    pub blocks_total: usize,
    pub blocks_used: usize,
    /// The most blocks used at once since the engine started (after any step's scheduling).
    pub blocks_used_peak: usize,
    /// Free blocks that still hold a cached prefix.
    pub blocks_cached: usize,
    pub blocks_free: usize,
    /// Recurrent state slots (a model with recurrent layers; else 0), and those free.
    pub state_slots_total: usize,
    pub state_slots_free: usize,
    /// Snapshots of recurrent states kept for prefix reuse (`engine::state_slots`).
    pub state_snapshots: usize,
    /// Bytes the snapshots held take (a state slot each), and one slot's bytes.
    pub state_snapshot_bytes: u64,
    pub state_slot_bytes: u64,
    pub num_running: usize,
    pub num_waiting: usize,
    /// Time to first token of every finished request, in ms (the most recent 4096).
    pub ttft_ms: Vec<u64>,
    pub ttft_ms_sum: u64,
    pub ttft_count: u64,
    /// Requests submitted with a constraint (JSON schema, regex, grammar, tool calls).
    pub requests_constrained: u64,
    /// Token masks computed for constrained rows, and the time spent on them (summed over rows).
    pub masks_computed: u64,
    pub mask_time_us: u64,
    /// Speculative decoding: tokens proposed and accepted, and blocks that held only rejected
    /// proposals given back to the pool.
    pub spec_proposed_tokens: u64,
    pub spec_accepted_tokens: u64,
    pub spec_blocks_rolled_back: u64,
    /// The draft model's KV pool (`--spec draft`): (blocks, free blocks); None without one.
    pub draft_blocks: Option<(usize, usize)>,
    /// Blocks held by pinned prompts.
    pub blocks_pinned: usize,
    /// Prompt blocks whose scores are kept for scoring requests (`echo` with `logprobs`).
    pub blocks_scored: usize,
    /// Tokens whose keys and values the used blocks hold, and the slots of those blocks
    /// (`Scheduler::kv_fill`): the pool's internal waste is `1 - tokens / slots`.
    pub kv_tokens_stored: usize,
    pub kv_slots_used: usize,
    /// The disk tier's counters; None when it is off.
    pub disk_cache: Option<super::disk_cache::DiskCacheStats>,
    /// Every live sequence, in id order (`/slots`).
    pub sequences: Vec<SequenceInfo>,
    /// Each tenant's own counters, by its key's salt (`Request::cache_key`); requests without
    /// a key are counted only in the figures above.
    pub tenants: BTreeMap<u64, TenantMetrics>,
}

/// One live sequence as `/slots` shows it: counts only, never its text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SequenceInfo {
    pub seq_id: u64,
    /// Running (in the batch) or waiting (for blocks or a step).
    pub running: bool,
    pub prompt_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
    /// Tokens whose keys and values are computed.
    pub computed_tokens: usize,
    pub generated_tokens: usize,
    pub max_tokens: usize,
    /// Its tenant's key salt (`Request::cache_key`).
    pub tenant: Option<u64>,
}

/// What one tenant (an API key) did: the figures a key may see of the server without learning
/// anything of the others.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TenantMetrics {
    pub requests_submitted: u64,
    pub requests_finished: u64,
    pub requests_aborted: u64,
    pub requests_failed: u64,
    pub tokens_prefilled: u64,
    pub tokens_generated: u64,
    /// Prompt tokens served from the prefix cache (the key's own blocks and the shared pins).
    pub tokens_cached: u64,
}

impl Metrics {
    /// Prompt tokens served from the prefix cache over all prompt tokens looked up.
    pub fn prefix_cache_hit_rate(&self) -> f64 {
        if self.prefix_cache.lookup_tokens == 0 {
            0.0
        } else {
            self.prefix_cache.hit_tokens as f64 / self.prefix_cache.lookup_tokens as f64
        }
    }

    /// The share of the used blocks' slots that hold no token (0 with no block used).
    pub fn kv_waste(&self) -> f64 {
        if self.kv_slots_used == 0 {
            0.0
        } else {
            1.0 - self.kv_tokens_stored as f64 / self.kv_slots_used as f64
        }
    }

    /// The counters of tenant `key`, or None for a request without a key.
    pub(super) fn tenant(&mut self, key: Option<u64>) -> Option<&mut TenantMetrics> {
        key.map(|k| self.tenants.entry(k).or_default())
    }

    /// A request of tenant `key` accepted.
    pub(super) fn submitted(&mut self, key: Option<u64>) {
        self.requests_submitted += 1;
        if let Some(t) = self.tenant(key) {
            t.requests_submitted += 1;
        }
    }

    /// `n` prompt tokens of tenant `key` computed.
    pub(super) fn prefilled(&mut self, key: Option<u64>, n: usize) {
        self.tokens_prefilled += n as u64;
        if let Some(t) = self.tenant(key) {
            t.tokens_prefilled += n as u64;
        }
    }

    /// A sequence of tenant `key` ended, `cached` of its prompt tokens from the prefix cache;
    /// `last_aborted` is Some(aborted) when it was its request's last.
    pub(super) fn finished(&mut self, key: Option<u64>, cached: usize, last_aborted: Option<bool>) {
        let (aborted, finished) = match last_aborted {
            Some(true) => (1, 0),
            Some(false) => (0, 1),
            None => (0, 0),
        };
        self.requests_aborted += aborted;
        self.requests_finished += finished;
        if let Some(t) = self.tenant(key) {
            t.tokens_cached += cached as u64;
            t.requests_aborted += aborted;
            t.requests_finished += finished;
        }
    }

    /// A request of tenant `key` failed.
    pub(super) fn failed(&mut self, key: Option<u64>) {
        self.requests_failed += 1;
        if let Some(t) = self.tenant(key) {
            t.requests_failed += 1;
        }
    }

    pub(super) fn record_ttft(&mut self, ms: u64) {
        if self.ttft_ms.len() == 4096 {
            self.ttft_ms.remove(0);
        }
        self.ttft_ms.push(ms);
        self.ttft_ms_sum += ms;
        self.ttft_count += 1;
    }
}

//! A sequence as the scheduler sees it: token ids, how many of them have their keys and values
//! in the KV cache, and its block table. There is no prefill or decode phase: a sequence just
//! has tokens not yet computed, and a step schedules some of them.

use crate::model::kv_cache::BlockId;
use crate::model::state_pool::StateSlot;
use crate::model::Pooling;

/// A live sequence's id: the key the scheduler, the output side (`engine::output`), speculation
/// and the disk tier's parking share. A request's completions (n > 1) are sequences of their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

impl std::fmt::Display for SeqId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Where a sequence is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeqStatus {
    Waiting,
    Running,
    Finished,
}

#[derive(Clone, Debug)]
pub struct Sequence {
    pub seq_id: SeqId,
    /// Arrival order: earlier arrivals keep running when blocks run out.
    pub arrival: u64,
    /// Prompt followed by the generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// Tokens whose keys and values are in the cache.
    pub num_computed: usize,
    /// Prompt tokens served from the prefix cache when the sequence (last) started.
    pub num_cached: usize,
    pub block_table: Vec<BlockId>,
    /// Its recurrent state's slot while it runs, for a model with recurrent layers.
    pub state_slot: Option<StateSlot>,
    /// Where its state is snapshotted (`engine::state_slots`): the tokens of its prompt's
    /// last full block and that block's hash; the prefill stops there once.
    pub snapshot_at: Option<(usize, u64)>,
    pub status: SeqStatus,
    /// Hashes of prompt blocks this sequence is computing that others may wait for:
    /// (block index, hash).
    pub pending_hashes: Vec<(usize, u64)>,
    /// Times the sequence was preempted.
    pub num_preemptions: u32,
    /// Proposed tokens (speculative decoding) to score after `tokens` in the next step; never
    /// part of `tokens` until verified.
    pub draft: Vec<u32>,
    /// Salts its prefix-cache chain (a tenant's API key); None shares the one cache.
    pub cache_key: Option<u64>,
    /// Start from the prompt's longest cached prefix (false: compute it all, as asked by
    /// llama-server's `cache_prompt: false`).
    pub cache_prompt: bool,
    /// While its prompt is being scored (`Request::prompt_logprobs`): the top alternatives
    /// wanted. Every prompt row then wants logits, and a cached prefix is reused only as far as
    /// its blocks' scores were kept (`Scheduler::scored`). None once the scores are out.
    pub prompt_logprobs: Option<usize>,
    /// An embedding request's pooling: the rows it pools want their hidden states, none wants
    /// logits, and the sequence ends once its prompt is computed (`Request::embed`).
    pub embed: Option<Pooling>,
}

impl Sequence {
    pub fn new(seq_id: SeqId, arrival: u64, prompt: Vec<u32>) -> Self {
        Sequence {
            seq_id,
            arrival,
            prompt_len: prompt.len(),
            tokens: prompt,
            num_computed: 0,
            num_cached: 0,
            block_table: Vec::new(),
            state_slot: None,
            snapshot_at: None,
            status: SeqStatus::Waiting,
            pending_hashes: Vec::new(),
            num_preemptions: 0,
            draft: Vec::new(),
            cache_key: None,
            cache_prompt: true,
            prompt_logprobs: None,
            embed: None,
        }
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn num_uncomputed(&self) -> usize {
        self.tokens.len() - self.num_computed
    }

    /// `n` tokens from its computed ones, cut to end at its next snapshot point if they cross
    /// it: its prompt's last full block, or before it a multiple of `every` tokens (0: none).
    pub fn snapshot_cut(&self, n: usize, every: usize) -> usize {
        let Some((at, _)) = self.snapshot_at else {
            return n;
        };
        let c = self.num_computed;
        let next = match every {
            0 => at,
            e => at.min((c / e + 1) * e),
        };
        if c < next && next < c + n {
            next - c
        } else {
            n
        }
    }

    pub fn generated(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }
}

//! The scheduler: waiting and running queues and one token budget per step. Running sequences
//! go first (in arrival order), each taking what it has not computed yet (one token for a
//! decode, a chunk for a prompt), then waiting sequences start, their cached prefix matched
//! first, with prompts cut into chunks that fit the budget. When blocks run out the most
//! recently arrived running sequence is preempted: its blocks are freed and it waits at the head
//! of the queue to be recomputed, keeping what it generated. Integers only; tested without a model.

use std::collections::{HashMap, VecDeque};

use super::block_manager::{BlockCopy, BlockId, BlockManager};
use super::pins::PinTable;
use super::sequence::{SeqId, SeqStatus, Sequence};
use super::state_slots::{StateCopy, StateSlots};
use super::step_time::{PrefillAllowance, StepShape, StepTime};

#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Most tokens one step may run.
    pub max_batched_tokens: usize,
    /// Most sequences running at once.
    pub max_seqs: usize,
}

/// What one step runs.
#[derive(Clone, Debug, Default)]
pub struct SchedulerOutput {
    /// (seq_id, number of tokens to compute from its num_computed on), in batch order.
    pub scheduled: Vec<(SeqId, usize)>,
    /// Block copies to make before the step (copy-on-write).
    pub copies: Vec<BlockCopy>,
    /// State copies to make before the step (forks of a model with recurrent layers).
    pub state_copies: Vec<StateCopy>,
    /// Sequences preempted while scheduling this step.
    pub preempted: Vec<SeqId>,
    /// Whether the time cap cut this step's prefill (`--max-step-ms`).
    pub prefill_capped: bool,
}

impl SchedulerOutput {
    pub fn is_empty(&self) -> bool {
        self.scheduled.is_empty()
    }
    pub fn num_tokens(&self) -> usize {
        self.scheduled.iter().map(|s| s.1).sum()
    }
}

pub struct Scheduler {
    pub config: SchedulerConfig,
    pub blocks: BlockManager,
    seqs: HashMap<SeqId, Sequence>,
    waiting: VecDeque<SeqId>,
    /// Running sequences in arrival order.
    running: Vec<SeqId>,
    next_arrival: u64,
    pub num_preemptions: u64,
    /// Prompt blocks being computed right now, by hash, and the sequence computing them. A
    /// waiting sequence whose next uncached block is among them waits for it instead of
    /// computing the same prefix a second time.
    in_flight: HashMap<u64, SeqId>,
    /// Pinned prompts: their blocks are held until unpinned, so they are never evicted.
    pub pins: PinTable,
    /// What steps cost, and the time cap on a step's prefill while sequences decode (none
    /// until `set_max_step_ms`).
    pub step_time: StepTime,
    /// Prompt blocks whose tokens' scores are kept (`Request::prompt_logprobs`), by hash, with
    /// how many top alternatives each kept: a scoring sequence reuses a cached prefix only this
    /// far. The scores themselves are the worker's (`engine::prompt_scores`).
    pub scored: HashMap<u64, usize>,
    /// Most prompt tokens a scoring sequence computes in one step (each is a row of logits).
    pub max_score_rows: usize,
    /// Whether a new sequence reuses cached prompt blocks (off: `--no-prefix-cache`).
    pub prefix_cache: bool,
    /// Recurrent state slots (none: no recurrent layers): each running sequence holds one; a
    /// prompt reuses cached blocks only as far as a state snapshot reaches (`StateSlots::plan`).
    pub states: StateSlots,
    /// Blocks between a prompt's state snapshots (0: only at its last full block).
    pub snapshot_every: usize,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig, blocks: BlockManager) -> Self {
        assert!(config.max_batched_tokens > 0 && config.max_seqs > 0);
        Scheduler {
            config,
            blocks,
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            next_arrival: 0,
            num_preemptions: 0,
            scored: HashMap::new(),
            max_score_rows: usize::MAX,
            prefix_cache: true,
            in_flight: HashMap::new(),
            pins: PinTable::default(),
            step_time: StepTime::new(None),
            states: StateSlots::default(),
            snapshot_every: 0,
        }
    }

    /// Caps each step's prefill so a step with decoding sequences takes about `ms` (None: no
    /// cap; chunks then fill the token budget).
    pub fn set_max_step_ms(&mut self, ms: Option<u64>) {
        self.step_time.max_step = StepTime::new(ms).max_step;
    }

    /// The prefill time this step has beside its decoding sequences (those with one token to
    /// compute, and their proposals).
    fn prefill_allowance(&self) -> PrefillAllowance {
        let mut decoding = StepShape::default();
        for id in &self.running {
            let seq = &self.seqs[id];
            if seq.num_uncomputed() == 1 {
                for i in 0..=seq.draft.len() {
                    decoding.add_rows(seq.num_computed + i, 1, true);
                }
            }
        }
        self.step_time.allowance(decoding)
    }

    /// Adds a new sequence at the back of the waiting queue.
    pub fn add(&mut self, seq_id: SeqId, prompt: Vec<u32>) {
        assert!(
            !prompt.is_empty(),
            "empty prompts are rejected before the scheduler"
        );
        let seq = Sequence::new(seq_id, self.next_arrival, prompt);
        self.next_arrival += 1;
        self.seqs.insert(seq_id, seq);
        self.waiting.push_back(seq_id);
    }

    /// Whether a prompt of `num_tokens` could ever run: the whole pool must hold it.
    pub fn fits(&self, num_tokens: usize) -> bool {
        self.blocks.blocks_for(num_tokens) <= self.blocks.num_blocks()
    }

    pub fn get(&self, seq_id: SeqId) -> Option<&Sequence> {
        self.seqs.get(&seq_id)
    }
    pub fn get_mut(&mut self, seq_id: SeqId) -> Option<&mut Sequence> {
        self.seqs.get_mut(&seq_id)
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }
    pub fn seq_ids(&self) -> impl Iterator<Item = &SeqId> {
        self.seqs.keys()
    }

    /// Picks the work of one step.
    pub fn schedule(&mut self) -> SchedulerOutput {
        let mut out = SchedulerOutput::default();
        let mut budget = self.config.max_batched_tokens;
        let mut prefill = self.prefill_allowance();

        // Running sequences first, oldest first.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let seq = self.seqs.get_mut(&id).expect("running ids are live");
            let uncomputed = seq.num_uncomputed();
            let mut n = uncomputed.min(budget);
            if seq.prompt_logprobs.is_some() {
                n = n.min(self.max_score_rows);
            }
            if n > 1 {
                // A prompt (or a recomputation) in chunks: as much as the step's time allows.
                n = prefill.take(seq.num_computed, n, seq.tokens.len());
                n = seq.snapshot_cut(n, self.snapshot_every * self.blocks.block_size);
            }
            if n == 0 {
                i += 1;
                continue;
            }
            // Proposed tokens ride along when the sequence's own tokens all fit.
            let extra = if n == uncomputed {
                seq.draft.len().min(budget - n)
            } else {
                0
            };
            seq.draft.truncate(extra);
            n += extra;
            loop {
                let seq = self.seqs.get_mut(&id).expect("running ids are live");
                let target = seq.num_computed + n;
                if let Some(copy) =
                    self.blocks
                        .allocate(&mut seq.block_table, seq.num_computed, target)
                {
                    out.copies.extend(copy);
                    out.scheduled.push((id, n));
                    budget -= n;
                    i += 1;
                    break;
                }
                // Out of blocks: drop the proposal before preempting anyone for it.
                if !seq.draft.is_empty() {
                    n -= seq.draft.len();
                    seq.draft.clear();
                    continue;
                }
                // Out of blocks: preempt the latest arrival (possibly this sequence itself).
                let victim = *self.running.last().expect("this sequence is running");
                self.preempt(victim);
                out.preempted.push(victim);
                out.scheduled.retain(|s| s.0 != victim);
                if victim == id {
                    break;
                }
            }
        }
        // Budget given back by preempted sequences that had been scheduled.
        budget = self.config.max_batched_tokens - out.num_tokens();

        // Then waiting sequences, in order, unless this step already had to preempt. One whose
        // next prompt block another sequence is computing now waits a step and reuses it.
        let mut w = 0;
        while out.preempted.is_empty()
            && budget > 0
            && self.running.len() < self.config.max_seqs
            && self.states.has_room()
            && w < self.waiting.len()
        {
            let id = self.waiting[w];
            let seq = self.seqs.get_mut(&id).expect("waiting ids are live");
            let hashes = self
                .blocks
                .prompt_block_hashes_keyed(seq.cache_key, &seq.tokens);
            seq.block_table = if seq.cache_prompt {
                self.blocks.match_prefix_keyed(seq.cache_key, &seq.tokens)
            } else {
                Vec::new()
            };
            if !self.prefix_cache {
                self.blocks.truncate(&mut seq.block_table, 0);
            }
            if let Some(k) = seq.prompt_logprobs {
                // A scoring sequence reuses only blocks whose scores were kept.
                let keep = hashes
                    .iter()
                    .take_while(|h| self.scored.get(h).is_some_and(|&kept| kept >= k))
                    .count();
                self.blocks.truncate(&mut seq.block_table, keep);
            }
            if self.states.is_on() {
                let (bs, caching) = (
                    self.blocks.block_size,
                    seq.cache_prompt && self.prefix_cache,
                );
                let scoring = seq.prompt_logprobs.is_some();
                let (keep, at) =
                    (self.states).plan(&hashes, seq.block_table.len(), bs, scoring, caching);
                self.blocks.truncate(&mut seq.block_table, keep);
                seq.snapshot_at = at;
            }
            let matched = seq.block_table.len();
            if seq.cache_prompt
                && !self.states.is_on()
                && hashes
                    .get(matched)
                    .is_some_and(|h| self.in_flight.get(h).is_some_and(|&owner| owner != id))
            {
                self.blocks.free(&mut seq.block_table);
                w += 1;
                continue;
            }
            seq.num_computed = matched * self.blocks.block_size;
            seq.num_cached = seq.num_computed;
            // A scoring sequence resuming after cached blocks also reruns the last cached
            // token's row (no KV write: `batch_builder`), one more token in the step.
            let reread = usize::from(seq.prompt_logprobs.is_some() && seq.num_cached > 0);
            let n = prefill.take(
                seq.num_computed,
                seq.num_uncomputed().min(budget.saturating_sub(reread)).min(
                    if seq.prompt_logprobs.is_some() {
                        self.max_score_rows
                    } else {
                        usize::MAX
                    },
                ),
                seq.tokens.len(),
            );
            let n = seq.snapshot_cut(n, self.snapshot_every * self.blocks.block_size);
            if n == 0 {
                // The step's prefill time is spent: it starts in a later step.
                self.blocks.free(&mut seq.block_table);
                seq.num_computed = 0;
                seq.num_cached = 0;
                break;
            }
            let target = seq.num_computed + n;
            match self
                .blocks
                .allocate(&mut seq.block_table, seq.num_computed, target)
            {
                Some(copy) => {
                    out.copies.extend(copy);
                    out.scheduled.push((id, n));
                    budget -= n + reread;
                    seq.status = SeqStatus::Running;
                    seq.state_slot = self.states.take();
                    if let (Some(slot), Some(&h)) =
                        (seq.state_slot, hashes.get(matched.wrapping_sub(1)))
                    {
                        self.states.resume(h, slot);
                    }
                    self.blocks.record_lookup(seq.tokens.len(), matched);
                    seq.pending_hashes = hashes.into_iter().enumerate().skip(matched).collect();
                    for &(_, h) in &seq.pending_hashes {
                        self.in_flight.entry(h).or_insert(id);
                    }
                    self.waiting.remove(w);
                    self.running.push(id);
                }
                None => {
                    // Give back the cached blocks it took; it will look them up again.
                    self.blocks.free(&mut seq.block_table);
                    seq.num_computed = 0;
                    seq.num_cached = 0;
                    break;
                }
            }
        }
        out.prefill_capped = prefill.cut();
        // Forks' and snapshots' copies since the last step, then this step's resumes.
        out.state_copies = self.states.take_copies();
        out
    }

    /// Forgets the in-flight prompt blocks of `seq_id` from block `from` on (all: 0).
    fn clear_in_flight(&mut self, seq_id: SeqId, from_block: usize) {
        let Some(seq) = self.seqs.get_mut(&seq_id) else {
            return;
        };
        let in_flight = &mut self.in_flight;
        seq.pending_hashes.retain(|&(i, h)| {
            let done = i < from_block;
            if done && in_flight.get(&h) == Some(&seq_id) {
                in_flight.remove(&h);
            }
            !done
        });
    }

    fn preempt(&mut self, seq_id: SeqId) {
        self.clear_in_flight(seq_id, usize::MAX);
        let seq = self.seqs.get_mut(&seq_id).expect("live");
        self.blocks.free(&mut seq.block_table);
        self.states.give(seq.state_slot.take());
        seq.draft.clear();
        seq.num_computed = 0;
        seq.num_cached = 0;
        seq.status = SeqStatus::Waiting;
        seq.num_preemptions += 1;
        self.num_preemptions += 1;
        self.running.retain(|&r| r != seq_id);
        // At the head of the queue, in arrival order among other preempted sequences.
        let arrival = seq.arrival;
        let pos = self
            .waiting
            .iter()
            .position(|w| self.seqs[w].arrival > arrival)
            .unwrap_or(self.waiting.len());
        self.waiting.insert(pos, seq_id);
    }

    /// Records that a step computed what `out` scheduled, and registers newly full blocks in
    /// the prefix cache. Returns the ids whose every token is now computed (they need a sample).
    /// Proposed tokens do not count as computed: they wait for `settle_draft`.
    pub fn step_done(&mut self, out: &SchedulerOutput) -> Vec<SeqId> {
        let mut ready = Vec::new();
        for &(id, n) in &out.scheduled {
            let Some(seq) = self.seqs.get_mut(&id) else {
                continue;
            };
            seq.num_computed += n.min(seq.num_uncomputed());
            self.blocks.register_full_blocks_keyed(
                seq.cache_key,
                &seq.block_table,
                &seq.tokens,
                seq.num_computed,
            );
            let (bs, blocks) = (self.blocks.block_size, &self.blocks);
            let hash = |c: usize| blocks.registered(seq.block_table[c / bs - 1]).map(|r| r.0);
            // A model with recurrent layers announces its blocks as far as a snapshot reaches.
            if let Some(h) = (self.states).after_step(seq, self.snapshot_every * bs, hash) {
                self.blocks.announce_through(&seq.block_table, h);
            }
            let full = seq.num_computed / self.blocks.block_size;
            self.clear_in_flight(id, full);
            let seq = &self.seqs[&id];
            if seq.num_computed == seq.tokens.len() {
                ready.push(id);
            }
        }
        ready
    }

    /// Ends a verification: the first `accepted` proposed tokens were appended to the sequence
    /// (their keys and values, written by the step, are now computed), the rest are rolled back.
    /// Blocks holding only rejected tokens go back to the pool; full blocks of verified tokens
    /// enter the prefix cache. Returns the blocks given back.
    pub fn settle_draft(&mut self, seq_id: SeqId, accepted: usize) -> usize {
        let Some(seq) = self.seqs.get_mut(&seq_id) else {
            return 0;
        };
        debug_assert!(accepted <= seq.draft.len());
        seq.draft.clear();
        seq.num_computed = (seq.num_computed + accepted).min(seq.tokens.len());
        self.blocks
            .register_full_blocks(&seq.block_table, &seq.tokens, seq.num_computed);
        let keep = self.blocks.blocks_for(seq.tokens.len());
        self.blocks.truncate(&mut seq.block_table, keep)
    }

    /// Appends a sampled token to a sequence.
    pub fn append_token(&mut self, seq_id: SeqId, token: u32) {
        if let Some(seq) = self.seqs.get_mut(&seq_id) {
            seq.tokens.push(token);
        }
    }

    /// A new running sequence sharing every block of `parent` (copy-on-write), with the same
    /// tokens and computed count. The parent must be running.
    pub fn fork(&mut self, parent: SeqId, child: SeqId) {
        let p = &self.seqs[&parent];
        assert_eq!(p.status, SeqStatus::Running, "only running sequences fork");
        let mut seq = p.clone();
        seq.seq_id = child;
        seq.pending_hashes.clear();
        seq.block_table = self.blocks.fork(&p.block_table);
        if let Some(parent_slot) = p.state_slot {
            seq.state_slot = self.states.fork(parent_slot);
            if seq.state_slot.is_none() {
                // No slot for it now: it waits and is recomputed from token 0, as if preempted.
                self.seqs.insert(child, seq);
                self.running.push(child);
                self.preempt(child);
                return;
            }
        }
        let pos = self
            .running
            .iter()
            .position(|&r| r == parent)
            .expect("parent runs")
            + 1;
        self.running.insert(pos, child);
        self.seqs.insert(child, seq);
    }

    /// Ends a sequence (finished or aborted): its blocks go back to the pool at once (full
    /// blocks stay in the prefix cache) and it is forgotten. Returns it, if it was live.
    pub fn finish(&mut self, seq_id: SeqId) -> Option<Sequence> {
        self.clear_in_flight(seq_id, usize::MAX);
        let mut seq = self.seqs.remove(&seq_id)?;
        self.blocks.free(&mut seq.block_table);
        self.states.give(seq.state_slot.take());
        self.running.retain(|&r| r != seq_id);
        self.waiting.retain(|&w| w != seq_id);
        seq.status = SeqStatus::Finished;
        Some(seq)
    }

    /// Pins every registered full block of `seq_id`'s table as pin `pin` (see `pins`); fails
    /// (pinning nothing) when more than `limit` blocks would be pinned in all.
    pub fn pin(&mut self, seq_id: SeqId, pin: u64, limit: usize) -> Result<usize, String> {
        let Some(seq) = self.seqs.get(&seq_id) else {
            return Ok(0);
        };
        self.pins
            .pin(&mut self.blocks, pin, &seq.block_table, limit)
    }

    /// Refuses a pin of `prompt` that cannot fit under `limit` pinned blocks, before its
    /// prefill: counts the prompt's full blocks not pinned already.
    pub fn pin_room(&self, prompt: &[u32], limit: usize) -> Result<(), String> {
        // Every full block (the last token's included: a pin holds it too); the hashes are
        // those of the blocks before one more token.
        let mut tokens = prompt.to_vec();
        tokens.push(0);
        let hashes = self.blocks.prompt_block_hashes(&tokens);
        let new = PinTable::new_blocks(&self.blocks, &hashes);
        if self.pins.num_blocks() + new > limit {
            return Err(format!(
                "pinning this prompt would add {new} blocks to the {} pinned, more than {limit} of the KV pool's {} blocks (at most half the pool is pinned)",
                self.pins.num_blocks(),
                self.blocks.num_blocks()
            ));
        }
        Ok(())
    }

    /// Releases pin `pin`; false when there is none.
    pub fn unpin(&mut self, pin: u64) -> bool {
        self.pins.unpin(&mut self.blocks, pin)
    }

    /// Blocks held by pinned prompts.
    pub fn num_pinned(&self) -> usize {
        self.pins.num_blocks()
    }

    /// Tokens the pool holds besides its pinned blocks: the most one sequence can grow to.
    pub fn unpinned_tokens(&self) -> usize {
        let unpinned = self.blocks.num_blocks().saturating_sub(self.num_pinned());
        unpinned * self.blocks.block_size
    }

    /// Tokens whose keys and values the used blocks hold, against the slots those blocks have
    /// (`blocks used x block size`): the pool's internal waste is `1 - tokens / slots`. A block
    /// shared by several sequences (a prefix, a fork) counts once, with its fullest use; pinned
    /// blocks are full.
    pub fn kv_fill(&self) -> (usize, usize) {
        let bs = self.blocks.block_size;
        // Published after every step: one flat array by block index, no map.
        let mut filled = vec![0usize; self.blocks.num_blocks()];
        for seq in self.seqs.values() {
            for (j, &id) in seq.block_table.iter().enumerate() {
                let n = seq.num_computed.saturating_sub(j * bs).min(bs);
                let f = &mut filled[id.index()];
                *f = (*f).max(n);
            }
        }
        for table in self.pins.tables() {
            for &id in table {
                filled[id.index()] = bs;
            }
        }
        (filled.iter().sum(), self.blocks.num_used() * bs)
    }

    /// Whether block `id` is pinned.
    pub fn is_pinned(&self, id: BlockId) -> bool {
        self.pins.contains_block(id)
    }

    /// Checks the block manager's invariants against every live sequence's block table, and
    /// that the queues hold each live sequence exactly once.
    pub fn check_invariants(&self) -> Result<(), String> {
        let tables = self.seqs.values().map(|s| s.block_table.as_slice());
        self.blocks
            .check_invariants(tables.chain(self.pins.tables()))?;
        let mut all: Vec<SeqId> = self.waiting.iter().chain(&self.running).copied().collect();
        all.sort_unstable();
        let mut live: Vec<SeqId> = self.seqs.keys().copied().collect();
        live.sort_unstable();
        if all != live {
            return Err(format!(
                "queues {all:?} differ from live sequences {live:?}"
            ));
        }
        let held = self.seqs.values();
        (self.states).check_held(held.map(|s| (s.status == SeqStatus::Running, s.state_slot)))?;
        for id in &self.waiting {
            if self.seqs[id].status != SeqStatus::Waiting {
                return Err(format!(
                    "sequence {id} waits with status {:?}",
                    self.seqs[id].status
                ));
            }
        }
        for (h, owner) in &self.in_flight {
            let ok = self.seqs.get(owner).is_some_and(|s| {
                s.status == SeqStatus::Running && s.pending_hashes.iter().any(|p| p.1 == *h)
            });
            if !ok {
                return Err(format!(
                    "in-flight block {h:x} owned by {owner}, which is not computing it"
                ));
            }
        }
        for s in self.seqs.values() {
            let cap = s.block_table.len() * self.blocks.block_size;
            if s.num_computed > cap || s.num_computed > s.tokens.len() {
                return Err(format!(
                    "sequence {}: {} computed, {} slots, {} tokens",
                    s.seq_id,
                    s.num_computed,
                    cap,
                    s.tokens.len()
                ));
            }
        }
        Ok(())
    }
}

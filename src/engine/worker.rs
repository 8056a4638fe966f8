//! The engine thread: takes commands from clients, runs one step at a time while there is
//! work (schedule, copy-on-write copies, one batched forward, sample), and sleeps on its
//! command channel when idle. Owns the model's KV pool, the scheduler and every sequence's
//! sampling state.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc as events;

use super::batch_builder::build_batch;
use super::block_manager::{BlockHash, BlockManager};
use super::disk_cache::{self, DiskCacheConfig, DiskTier};
use super::handle::Command;
use super::kv_events::{coalesce, KvCacheEvent, KvEventSink};
use super::masks::{self, MaskResult};
use super::scheduler::{Scheduler, SchedulerConfig};
use super::{EngineConfig, Event, FinishReason, Metrics, Request, TokenLogprobs, Usage};
use crate::constraint::{ConstraintState, Consumed};
use crate::device::Executor;
use crate::engine::sampler::Sampler;
use crate::model::Model;
use crate::tokenizer::StreamDecoder;

// Speculative decoding's part of the step: proposals before, verification after.
#[path = "speculative/step.rs"]
mod spec_step;

/// What the engine keeps per sequence beyond the scheduler's integers.
struct SeqState {
    request_id: u64,
    index: usize,
    sampler: Sampler,
    events: events::UnboundedSender<Event>,
    decoder: StreamDecoder,
    /// Decoded text held back because it may be the start of a stop string.
    pending: String,
    request: Arc<Request>,
    /// Completions still to fork from this one at its first token (n - 1 for the first).
    forks_pending: usize,
    submitted: Instant,
    ttft_ms: Option<u64>,
    num_cached: usize,
    /// Hashes of the blocks loaded from disk for this sequence (cache explain).
    from_disk: HashSet<BlockHash>,
    /// Where the sequence is in its grammar, for constrained requests.
    constraint: Option<ConstraintState>,
}

pub(super) struct Worker {
    model: Arc<Model>,
    config: EngineConfig,
    /// The KV pool and the device the forward pass runs on.
    exec: Executor,
    sched: Scheduler,
    seqs: HashMap<u64, SeqState>,
    /// Live sequences of each request.
    requests: HashMap<u64, Vec<u64>>,
    next_seq_id: u64,
    in_flight: Arc<AtomicU64>,
    metrics: Metrics,
    /// Where clients read the counters: refreshed after every step and command.
    published: Arc<Mutex<Metrics>>,
    /// Where the prefix cache's changes go after every step (`--kv-events`).
    kv_events: Option<KvEventSink>,
    /// Proposals and their adaptive lengths (speculative decoding; off by default).
    speculator: super::speculative::Speculator,
    /// The prefix cache's disk tier (`--no-disk-cache` leaves it None).
    disk: Option<DiskTier>,
    /// New sequences waiting for their prompt's blocks from disk before they are scheduled.
    parked: Vec<Parked>,
    next_ticket: u64,
}

/// A sequence whose prompt continues on disk: it waits for the load (at most
/// `DISK_LOAD_WAIT`) and is then scheduled, reusing what arrived.
struct Parked {
    seq_id: u64,
    ticket: u64,
    deadline: Instant,
    /// The hash of the block before the first one asked for.
    parent: Option<BlockHash>,
}

/// How long a new request waits for its blocks from disk; a slower disk degrades to
/// recomputing them.
const DISK_LOAD_WAIT: Duration = Duration::from_millis(500);

/// What the worker shares with its `EngineHandle`.
pub(super) struct SharedWithHandle {
    /// Requests queued or running (the handle's `--max-queue` check).
    pub in_flight: Arc<AtomicU64>,
    /// The metrics the worker publishes after each step.
    pub metrics: Arc<Mutex<Metrics>>,
}

impl Worker {
    pub(super) fn new(
        model: Arc<Model>,
        config: EngineConfig,
        exec: Executor,
        shared: SharedWithHandle,
        kv_events: Option<KvEventSink>,
        speculator: super::speculative::Speculator,
        disk: Option<DiskCacheConfig>,
    ) -> Self {
        // The salt names what the cached keys and values depend on besides the tokens (the
        // model's contents, the block size, the device): the disk tier's identity.
        let salt = disk_cache::identity(&model, config.block_size, exec.device().name());
        let mut blocks = BlockManager::new(config.num_blocks, config.block_size, salt);
        let disk = disk.and_then(|d| {
            let kv_bytes = exec.read_block(0).map(|b| b.len());
            let Some(kv_bytes) = kv_bytes else {
                eprintln!("warning: the disk cache is off: it does not reach the GPU's KV pool");
                return None;
            };
            match DiskTier::open(&d, &model, salt, kv_bytes) {
                Ok(t) => Some(t),
                Err(e) => {
                    eprintln!("warning: the disk cache is off: {e:#}");
                    None
                }
            }
        });
        if disk.is_some() {
            blocks.enable_eviction_log();
        }
        if let Some(sink) = &kv_events {
            blocks.enable_events();
            sink.send(vec![KvCacheEvent::AllBlocksCleared]);
        }
        let mut sched = Scheduler::new(
            SchedulerConfig {
                max_batched_tokens: config.max_batched_tokens,
                max_seqs: config.max_seqs,
            },
            blocks,
        );
        sched.set_max_step_ms(config.max_step_ms);
        Worker {
            model,
            config,
            exec,
            sched,
            seqs: HashMap::new(),
            requests: HashMap::new(),
            next_seq_id: 0,
            in_flight: shared.in_flight,
            metrics: Metrics::default(),
            published: shared.metrics,
            kv_events,
            speculator,
            disk,
            parked: Vec::new(),
            next_ticket: 0,
        }
    }

    pub(super) fn run(mut self, rx: mpsc::Receiver<Command>) {
        self.publish();
        loop {
            let mut took = false; // commands taken in since the last step
            if !self.sched.has_work() && self.parked.is_empty() {
                match rx.recv() {
                    Ok(cmd) => {
                        self.handle(cmd);
                        took = true;
                    }
                    Err(_) => return,
                }
            } else if !self.sched.has_work() {
                // Only disk loads to wait for: poll them and the commands in turn.
                match rx.recv_timeout(Duration::from_millis(1)) {
                    Ok(cmd) => {
                        self.handle(cmd);
                        took = true;
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => {
                        self.unpark_all();
                    }
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(cmd) => {
                        self.handle(cmd);
                        took = true;
                    }
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        if !self.sched.has_work() && self.parked.is_empty() {
                            return;
                        }
                        break;
                    }
                }
            }
            took |= self.poll_disk();
            // Published before the step too: a client that hears its first token must not read
            // a snapshot from before its request was counted in.
            if took {
                self.publish();
            }
            if self.sched.has_work() {
                self.step();
                self.publish();
                self.send_kv_events();
            }
        }
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Submit {
                id,
                request,
                events,
            } => {
                self.metrics.requests_submitted += 1;
                let constraint = request.sampling.constraint.as_ref().map(|c| c.new_state());
                if constraint.is_some() {
                    self.metrics.requests_constrained += 1;
                }
                let seq_id = self.new_seq_id();
                let request = Arc::new(request);
                self.seqs.insert(
                    seq_id,
                    SeqState {
                        request_id: id,
                        index: 0,
                        sampler: Sampler::new(request.sampling.clone()),
                        events,
                        decoder: StreamDecoder::new(),
                        pending: String::new(),
                        forks_pending: request.n - 1,
                        request,
                        submitted: Instant::now(),
                        ttft_ms: None,
                        num_cached: 0,
                        from_disk: HashSet::new(),
                        constraint,
                    },
                );
                self.requests.insert(id, vec![seq_id]);
                if !self.park(seq_id) {
                    self.enqueue(seq_id);
                }
            }
            Command::Abort(id) => {
                let seqs = self.requests.get(&id).cloned().unwrap_or_default();
                for &seq_id in &seqs {
                    self.unpark(seq_id);
                }
                for seq_id in seqs {
                    self.finish(seq_id, FinishReason::Abort);
                }
            }
        }
    }

    /// Hands a new sequence to the scheduler, with its request's cache key.
    fn enqueue(&mut self, seq_id: u64) {
        let Some(st) = self.seqs.get(&seq_id) else {
            return;
        };
        let (prompt, key) = (st.request.prompt.clone(), st.request.cache_key);
        self.sched.add(seq_id, prompt);
        if let Some(seq) = self.sched.get_mut(seq_id) {
            seq.cache_key = key;
        }
    }

    /// Parks a new sequence whose prompt continues on disk past what memory holds, and asks
    /// the disk tier for those blocks. False (nothing parked) when there is nothing to load.
    fn park(&mut self, seq_id: u64) -> bool {
        let (Some(disk), Some(st)) = (&self.disk, self.seqs.get(&seq_id)) else {
            return false;
        };
        let prompt = &st.request.prompt;
        let blocks = &self.sched.blocks;
        let hashes = blocks.prompt_block_hashes_keyed(st.request.cache_key, prompt);
        let Some(first) = hashes.iter().position(|&h| !blocks.is_cached(h)) else {
            return false;
        };
        if !disk.is_written(hashes[first]) {
            return false;
        }
        let bs = blocks.block_size;
        let wanted: Vec<_> = (first..hashes.len())
            .take_while(|&i| disk.is_written(hashes[i]))
            .map(|i| (hashes[i], prompt[i * bs..(i + 1) * bs].to_vec()))
            .collect();
        self.next_ticket += 1;
        let ticket = self.next_ticket;
        if !disk.load(ticket, wanted) {
            return false;
        }
        self.parked.push(Parked {
            seq_id,
            ticket,
            deadline: Instant::now() + DISK_LOAD_WAIT,
            parent: first.checked_sub(1).map(|i| hashes[i]),
        });
        true
    }

    /// Schedules a parked sequence now, with whatever has arrived from disk.
    fn unpark(&mut self, seq_id: u64) {
        if let Some(i) = self.parked.iter().position(|p| p.seq_id == seq_id) {
            self.parked.remove(i);
            self.enqueue(seq_id);
        }
    }

    fn unpark_all(&mut self) {
        for p in std::mem::take(&mut self.parked) {
            self.enqueue(p.seq_id);
        }
    }

    /// Takes in the disk tier's answers: loaded blocks enter the KV pool as cached blocks and
    /// their sequences are scheduled; sequences whose load is late are scheduled without it.
    /// True when a sequence was scheduled.
    fn poll_disk(&mut self) -> bool {
        let mut moved = false;
        while let Some(loaded) = self.disk.as_ref().and_then(|d| d.try_loaded()) {
            let Some(i) = self.parked.iter().position(|p| p.ticket == loaded.ticket) else {
                continue; // its request was aborted; the blocks stay on disk
            };
            let p = self.parked.remove(i);
            let mut parent = p.parent;
            let mut from_disk = HashSet::new();
            for (hash, token_ids, kv) in loaded.blocks {
                if !self.sched.blocks.is_cached(hash) {
                    let Some(id) = self.sched.blocks.insert_cached(hash, parent, &token_ids) else {
                        break;
                    };
                    self.save_evicted();
                    if let Err(e) = self.exec.write_block(id, &kv) {
                        eprintln!("warning: disk cache: {e:#}; leaving it off");
                        self.disk = None;
                        break;
                    }
                    from_disk.insert(hash);
                }
                parent = Some(hash);
            }
            if let Some(st) = self.seqs.get_mut(&p.seq_id) {
                st.from_disk = from_disk;
            }
            self.enqueue(p.seq_id);
            moved = true;
        }
        let now = Instant::now();
        let late: Vec<u64> = self
            .parked
            .iter()
            .filter(|p| p.deadline <= now || self.disk.is_none())
            .map(|p| p.seq_id)
            .collect();
        for seq_id in late {
            self.unpark(seq_id);
            moved = true;
        }
        moved
    }

    /// Hands the cached blocks just evicted from the pool to the disk tier (their slots still
    /// hold their keys and values), unless it has them.
    fn save_evicted(&mut self) {
        let evicted = self.sched.blocks.take_evicted();
        let Some(disk) = &self.disk else { return };
        for (id, hash, token_ids) in evicted {
            if !disk.contains(hash) {
                if let Some(kv) = self.exec.read_block(id) {
                    disk.write(hash, token_ids, kv);
                }
            }
        }
    }

    /// Writes behind: the full blocks of a sequence that ends go to the disk tier.
    fn write_behind(&mut self, seq_id: u64) {
        let (Some(disk), Some(seq)) = (&self.disk, self.sched.get(seq_id)) else {
            return;
        };
        for &id in &seq.block_table {
            let Some((hash, token_ids)) = self.sched.blocks.registered(id) else {
                continue;
            };
            if !disk.contains(hash) {
                if let Some(kv) = self.exec.read_block(id) {
                    disk.write(hash, token_ids.to_vec(), kv);
                }
            }
        }
    }

    /// The disk tier's live counters, when it is on.
    pub(super) fn disk_stats(&self) -> Option<disk_cache::DiskStatsHandle> {
        self.disk.as_ref().map(|d| d.stats_handle())
    }

    fn new_seq_id(&mut self) -> u64 {
        self.next_seq_id += 1;
        self.next_seq_id
    }

    fn publish(&self) {
        let snapshot = self.snapshot();
        if let Ok(mut m) = self.published.lock() {
            *m = snapshot;
        }
    }

    /// Hands the step's prefix-cache changes to the sink (never waits).
    fn send_kv_events(&mut self) {
        if let Some(sink) = &self.kv_events {
            sink.send(coalesce(self.sched.blocks.take_events()));
        }
    }

    fn snapshot(&self) -> Metrics {
        let b = &self.sched.blocks;
        Metrics {
            prefix_cache: b.stats,
            blocks_total: b.num_blocks(),
            blocks_used: b.num_used(),
            blocks_cached: b.num_cached_free(),
            blocks_free: b.num_free(),
            num_running: self.sched.num_running(),
            num_waiting: self.sched.num_waiting() + self.parked.len(),
            blocks_pinned: self.sched.num_pinned(),
            disk_cache: self.disk.as_ref().map(|d| d.stats()),
            preemptions: self.sched.num_preemptions,
            draft_blocks: self.speculator.draft_blocks(),
            ..self.metrics.clone()
        }
    }

    /// One step: schedule, copy shared blocks about to be written, run the batch, sample.
    fn step(&mut self) {
        let step_started = Instant::now();
        self.propose();
        let out = self.sched.schedule();
        for &id in &out.preempted {
            self.speculator.release(id); // its draft blocks too
        }
        // Before any slot is written: the cached blocks this schedule evicted go to disk.
        self.save_evicted();
        if out.is_empty() {
            // Nothing fits even alone (cannot happen with a pool of at least max_seq_len
            // tokens); fail the head of the queue rather than spin.
            let head = self.sched.seq_ids().next().copied();
            if let Some(id) = head {
                self.fail(id, "the request does not fit the KV cache".into());
            }
            return;
        }
        let copied = out
            .copies
            .iter()
            .try_for_each(|c| self.exec.copy_block(c.src, c.dst));
        let batch = build_batch(&self.sched, &out);
        let started = Instant::now();
        // The constrained rows that sample this step have their masks computed on rayon's pool
        // while the forward pass runs.
        let pending = masks::start(self.take_mask_jobs(&out.scheduled));
        let forward = copied.and_then(|()| self.exec.forward(&self.model, &batch));
        let mut masks = HashMap::new();
        match pending.map(masks::Pending::wait) {
            None => {}
            Some(Ok(done)) => {
                self.metrics.mask_time_us += done.micros;
                self.metrics.masks_computed += done.masks.len() as u64;
                for (id, state) in done.states {
                    if let Some(st) = self.seqs.get_mut(&id) {
                        st.constraint = Some(state);
                    }
                }
                masks = done.masks;
            }
            Some(Err(lost)) => {
                for id in lost {
                    masks.insert(id, Err("the constraint failed: its mask panicked".into()));
                }
            }
        }
        let logits = match forward {
            Ok(l) => l,
            Err(e) => {
                for &(id, _) in &out.scheduled {
                    self.fail(id, format!("forward pass failed: {e:#}"));
                }
                return;
            }
        };
        self.metrics.steps += 1;
        self.metrics.steps_prefill_capped += u64::from(out.prefill_capped);
        for &(id, n) in &out.scheduled {
            if let Some(seq) = self.sched.get(id) {
                // Tokens before the prompt's end are prefill; the rest recompute or decode.
                let prefill = (seq.num_computed + n)
                    .min(seq.prompt_len)
                    .saturating_sub(seq.num_computed);
                self.metrics.tokens_prefilled += prefill as u64;
            }
        }
        let ready = self.sched.step_done(&out);
        let vocab = self.model.config.vocab_size;
        // Each ready sequence has one row of logits, and one more per proposed token.
        let drafts: Vec<Vec<u32>> = ready
            .iter()
            .map(|&id| {
                self.sched
                    .get(id)
                    .map(|s| s.draft.clone())
                    .unwrap_or_default()
            })
            .collect();
        let mut row = 0;
        for (&seq_id, draft) in ready.iter().zip(drafts) {
            let mask = masks.remove(&seq_id);
            let rows = &logits[row * vocab..(row + 1 + draft.len()) * vocab];
            row += 1 + draft.len();
            if draft.is_empty() {
                self.sample(seq_id, rows, mask);
            } else {
                self.verify(seq_id, rows, &draft, mask);
            }
        }
        // A row whose constraint state was lost in a panicking mask and that did not sample
        // ends here, never unconstrained.
        for (id, mask) in masks {
            let lost = self.seqs.get(&id).is_some_and(|st| st.constraint.is_none());
            if let (true, Err(e)) = (lost, mask) {
                self.fail(id, e);
            }
        }
        // Only steps whose every row wants logits (decoding and verifying, no prompt chunk)
        // teach the cost of a proposed row: a prompt row skips the output matrix.
        self.speculator.record_step(
            batch.n_tokens(),
            started.elapsed().as_secs_f64(),
            batch.logits_rows.len() == batch.n_tokens(),
        );
        // The whole step, as a streaming client sees it between two tokens, teaches the cap.
        let shape = super::step_time::StepShape::of(&batch);
        self.sched
            .step_time
            .record(shape, step_started.elapsed().as_secs_f64());
    }

    /// Takes out the active constraint states of the scheduled sequences that will sample after
    /// this step (every token computed), to compute their masks beside the forward pass.
    fn take_mask_jobs(&mut self, scheduled: &[(u64, usize)]) -> Vec<(u64, ConstraintState)> {
        let mut jobs = Vec::new();
        for &(id, n) in scheduled {
            let samples = self
                .sched
                .get(id)
                .is_some_and(|seq| seq.num_computed + n == seq.len());
            let Some(st) = self.seqs.get_mut(&id) else {
                continue;
            };
            if samples && st.constraint.as_ref().is_some_and(|c| c.is_active()) {
                jobs.push((id, st.constraint.take().expect("checked")));
            }
        }
        jobs
    }

    /// The row's mask under its constraint, end-of-generation tokens included: the one computed
    /// beside the forward pass, or one computed now (forks, lazily triggered rows). None for an
    /// unconstrained row; Err ends the request.
    fn constrained_mask(
        &mut self,
        seq_id: u64,
        mask: Option<MaskResult>,
    ) -> Result<Option<toktrie::SimpleVob>, String> {
        let st = self
            .seqs
            .get_mut(&seq_id)
            .expect("state of a live sequence");
        if let Some(Err(e)) = mask {
            return Err(e);
        }
        let Some(state) = st.constraint.as_mut().filter(|c| c.is_active()) else {
            return Ok(None);
        };
        let mut mask = match mask {
            Some(m) => m?,
            None => {
                let t = Instant::now();
                let m = state.compute_mask();
                self.metrics.mask_time_us += t.elapsed().as_micros() as u64;
                self.metrics.masks_computed += 1;
                m?
            }
        };
        let tok = &self.model.tokenizer;
        masks::allow_eog(&mut mask, tok.eos_id(), tok.eog_ids());
        Ok(Some(mask))
    }

    /// Samples the next token of `seq_id` from its logits and tells the client. Returns the
    /// token when it was appended to the sequence.
    fn sample(&mut self, seq_id: u64, logits: &[f32], mask: Option<MaskResult>) -> Option<u32> {
        let seq = self.sched.get(seq_id)?;
        let first = seq.generated().is_empty();
        if first && self.seqs[&seq_id].request.pin {
            self.pin(seq_id);
            return None;
        }
        if first {
            let num_cached = seq.num_cached;
            let st = self
                .seqs
                .get_mut(&seq_id)
                .expect("state of a live sequence");
            st.num_cached = num_cached;
            // n > 1: the other completions fork here, sharing every block of the prompt.
            let forks = std::mem::take(&mut st.forks_pending);
            for i in 1..=forks {
                let child = self.new_seq_id();
                self.sched.fork(seq_id, child);
                let st = &self.seqs[&seq_id];
                let mut params = st.request.sampling.clone();
                params.seed = params.seed.wrapping_add(i as u64);
                let state = SeqState {
                    request_id: st.request_id,
                    index: i,
                    sampler: Sampler::new(params),
                    events: st.events.clone(),
                    decoder: StreamDecoder::new(),
                    pending: String::new(),
                    request: st.request.clone(),
                    forks_pending: 0,
                    submitted: st.submitted,
                    ttft_ms: None,
                    num_cached,
                    from_disk: st.from_disk.clone(),
                    constraint: st
                        .request
                        .sampling
                        .constraint
                        .as_ref()
                        .map(|c| c.new_state()),
                };
                let request_id = state.request_id;
                self.seqs.insert(child, state);
                self.requests
                    .get_mut(&request_id)
                    .expect("request is live")
                    .push(child);
                self.sample(child, logits, None);
            }
        }
        let mask = match self.constrained_mask(seq_id, mask) {
            Ok(m) => m,
            Err(e) => {
                self.fail(seq_id, e);
                return None;
            }
        };
        let seq = self.sched.get(seq_id)?;
        let tokenizer = &self.model.tokenizer;
        let st = self
            .seqs
            .get_mut(&seq_id)
            .expect("state of a live sequence");
        let (prompt, generated) = (&seq.tokens[..seq.prompt_len], seq.generated());
        // A constrained row samples under its mask (masked logits only where needed).
        let (token, masked) = match &mask {
            Some(m) => {
                let want = st.request.logprobs.is_some();
                masks::sample(&mut st.sampler, logits, m, prompt, generated, want)
            }
            None => (st.sampler.sample(logits, prompt, generated), None),
        };
        let logits = masked.as_deref().unwrap_or(logits);
        if st.ttft_ms.is_none() {
            let ms = st.submitted.elapsed().as_millis() as u64;
            st.ttft_ms = Some(ms);
            self.metrics.record_ttft(ms);
        }
        // An end token ends a constrained sequence even with ignore_eos: the constraint allowed it
        // only because its grammar is complete.
        let constrained_end = st.constraint.as_ref().is_some_and(|c| c.is_active());
        if (!st.request.ignore_eos || constrained_end) && tokenizer.is_eog(token) {
            self.finish(seq_id, FinishReason::Stop);
            return None;
        }
        let consumed = match st.constraint.as_mut().map(|c| c.consume(token)) {
            Some(Err(e)) => {
                self.fail(seq_id, e);
                return None;
            }
            Some(Ok(c)) => c,
            None => Consumed::Continue,
        };
        let logprobs = st
            .request
            .logprobs
            .map(|k| token_logprobs(logits, token, k));
        self.sched.append_token(seq_id, token);
        self.metrics.tokens_generated += 1;
        let piece = st.decoder.push(tokenizer, token);
        st.pending.push_str(&piece);
        let (text, stopped) = take_emittable(&mut st.pending, &st.request.stop);
        let sent = st.events.send(Event::Token {
            index: st.index,
            token,
            text,
            logprobs,
        });
        let seq = self.sched.get(seq_id).expect("live");
        let st = &self.seqs[&seq_id];
        if sent.is_err() {
            let request_id = st.request_id;
            self.handle(Command::Abort(request_id));
        } else if stopped || consumed == Consumed::Done {
            self.finish(seq_id, FinishReason::Stop);
        } else if seq.generated().len() >= st.request.max_tokens
            || seq.len() >= self.config.max_seq_len
        {
            self.finish(seq_id, FinishReason::Length);
        }
        Some(token)
    }

    /// A pin request's prompt is computed: its full blocks are pinned, and it finishes.
    fn pin(&mut self, seq_id: u64) {
        // At most half the pool may be pinned, so requests always have room.
        let limit = self.sched.blocks.num_blocks() / 2;
        match self.sched.pin(seq_id, limit) {
            Ok(_) => self.finish(seq_id, FinishReason::Stop),
            Err(e) => self.fail(seq_id, e),
        }
    }

    /// Where the cached prompt blocks of `seq_id` came from: (disk, pinned) tokens.
    fn cache_sources(&self, seq_id: u64, num_cached: usize) -> (usize, usize) {
        let (Some(seq), Some(st)) = (self.sched.get(seq_id), self.seqs.get(&seq_id)) else {
            return (0, 0);
        };
        let bs = self.sched.blocks.block_size;
        let (mut disk, mut pinned) = (0, 0);
        for &id in seq.block_table.iter().take(num_cached / bs) {
            if self.sched.is_pinned(id) {
                pinned += bs;
            } else if self
                .sched
                .blocks
                .registered(id)
                .is_some_and(|(h, _)| st.from_disk.contains(&h))
            {
                disk += bs;
            }
        }
        (disk, pinned)
    }

    /// Ends a sequence: the client hears why, its blocks go back at once.
    fn finish(&mut self, seq_id: u64, reason: FinishReason) {
        self.speculator.forget(seq_id);
        self.write_behind(seq_id);
        let cached = self.seqs.get(&seq_id).map_or(0, |st| st.num_cached);
        let (cached_disk_tokens, cached_pinned_tokens) = self.cache_sources(seq_id, cached);
        let Some(seq) = self.sched.finish(seq_id) else {
            return;
        };
        let Some(mut st) = self.seqs.remove(&seq_id) else {
            return;
        };
        let mut text = std::mem::take(&mut st.pending);
        if reason != FinishReason::Stop
            || !st
                .request
                .stop
                .iter()
                .any(|s| !s.is_empty() && text.contains(s.as_str()))
        {
            if reason == FinishReason::Length {
                // Cut by max_tokens or the context inside a multi-byte char: that char was
                // never completed, so it is left out rather than shown as U+FFFD.
                st.decoder.drop_incomplete();
            }
            text.push_str(&st.decoder.finish());
        }
        let usage = Usage {
            prompt_tokens: seq.prompt_len,
            completion_tokens: seq.generated().len(),
            cached_tokens: st.num_cached,
            cached_disk_tokens,
            cached_pinned_tokens,
            ttft_ms: st.ttft_ms.unwrap_or(0),
        };
        // Counted out of the queue before the client hears, so it may submit again at once; and
        // published, so metrics read as soon as it hears show its blocks freed (the step's own
        // publish comes only after the whole step).
        self.close_seq(st.request_id, seq_id, reason == FinishReason::Abort);
        self.publish();
        let _ = st.events.send(Event::Finished {
            index: st.index,
            reason,
            text,
            usage,
        });
    }

    fn fail(&mut self, seq_id: u64, message: String) {
        self.speculator.forget(seq_id);
        self.sched.finish(seq_id);
        if let Some(st) = self.seqs.remove(&seq_id) {
            self.metrics.requests_failed += 1;
            // The other completions of the request go too: the client stops listening.
            for other in self
                .requests
                .get(&st.request_id)
                .cloned()
                .unwrap_or_default()
            {
                if other != seq_id {
                    self.speculator.forget(other);
                    self.sched.finish(other);
                    self.seqs.remove(&other);
                }
            }
            if self.requests.remove(&st.request_id).is_some() {
                self.in_flight.fetch_sub(1, Ordering::SeqCst);
            }
            self.publish(); // as in finish: what the client reads next includes this
            let _ = st.events.send(Event::Error(message));
        }
    }

    fn close_seq(&mut self, request_id: u64, seq_id: u64, aborted: bool) {
        let Some(seqs) = self.requests.get_mut(&request_id) else {
            return;
        };
        seqs.retain(|&s| s != seq_id);
        if seqs.is_empty() {
            self.requests.remove(&request_id);
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            if aborted {
                self.metrics.requests_aborted += 1;
            } else {
                self.metrics.requests_finished += 1;
            }
        }
    }
}

/// Log-probability of `token` and the `k` most likely tokens (fewer where a constraint allows
/// fewer).
fn token_logprobs(logits: &[f32], token: u32, k: usize) -> TokenLogprobs {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let log_sum = logits
        .iter()
        .map(|&l| (l as f64 - max).exp())
        .sum::<f64>()
        .ln()
        + max;
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(k);
    if k > 0 {
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        let k = k.min(idx.len());
        idx.select_nth_unstable_by(k - 1, |&a, &b| {
            logits[b as usize].total_cmp(&logits[a as usize])
        });
        idx.truncate(k);
        idx.sort_by(|&a, &b| {
            logits[b as usize]
                .total_cmp(&logits[a as usize])
                .then(a.cmp(&b))
        });
        // Tokens a constraint disallows (minus infinity) are no alternatives.
        top = idx
            .into_iter()
            .filter(|&t| logits[t as usize] > f32::NEG_INFINITY)
            .map(|t| (t, (logits[t as usize] as f64 - log_sum) as f32))
            .collect();
    }
    TokenLogprobs {
        logprob: (logits[token as usize] as f64 - log_sum) as f32,
        top,
    }
}

/// Splits off the text of `pending` that can be shown now: everything before a stop string
/// (then `true`), or everything but a tail that could still grow into one.
fn take_emittable(pending: &mut String, stop: &[String]) -> (String, bool) {
    let stops = stop.iter().filter(|s| !s.is_empty());
    if let Some(pos) = stops.clone().filter_map(|s| pending.find(s.as_str())).min() {
        let text = pending[..pos].to_string();
        pending.clear();
        return (text, true);
    }
    // The longest suffix of pending that is a proper prefix of a stop string.
    let mut hold = 0;
    for s in stops {
        for (i, _) in pending.char_indices() {
            let tail = &pending[i..];
            if s.starts_with(tail) && tail.len() > hold {
                hold = tail.len();
                break;
            }
        }
    }
    let cut = pending.len() - hold;
    let text = pending[..cut].to_string();
    pending.replace_range(..cut, "");
    (text, false)
}

#[cfg(test)]
mod tests {
    use super::take_emittable;

    #[test]
    fn stop_strings_are_held_back_and_cut() {
        let stop = vec!["</s>".to_string(), "\n\n".to_string()];
        let mut p = "Hello <".to_string();
        assert_eq!(take_emittable(&mut p, &stop), ("Hello ".to_string(), false));
        assert_eq!(p, "<");
        p.push_str("/s> more");
        assert_eq!(take_emittable(&mut p, &stop), ("".to_string(), true));
        let mut p = "line\n".to_string();
        assert_eq!(take_emittable(&mut p, &stop), ("line".to_string(), false));
        p.push('x');
        assert_eq!(take_emittable(&mut p, &stop), ("\nx".to_string(), false));
        let mut p = "no stops".to_string();
        assert_eq!(take_emittable(&mut p, &[]), ("no stops".to_string(), false));
    }
}

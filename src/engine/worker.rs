//! The engine thread: takes commands from clients, runs one step at a time while there is
//! work (schedule, copy-on-write copies, one batched forward, sample), and sleeps on its
//! command channel when idle. Owns the model's KV pool (through its executor), the scheduler,
//! the client side of every request (`output`), the disk tier's parking and the speculator.
//!
//! A row of logits goes to `Outputs::sample`, which answers with an `Outcome`; the worker
//! applies it to the scheduler (append, fork, pin, finish, fail, abort).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use super::batch_builder::build_batch;
use super::block_manager::BlockManager;
use super::disk_cache::{self, DiskCacheConfig, Parking};
use super::embeddings::Embeddings;
use super::handle::Command;
use super::kv_events::{coalesce, KvCacheEvent, KvEventSink};
use super::masks;
use super::output::{Notice, Outputs};
use super::prompt_scores::{PromptScores, SCORE_LOGITS_BYTES};
use super::scheduler::{Scheduler, SchedulerConfig};
use super::sequence::SeqId;
use super::speculative::Speculator;
use super::state_slots::StateSlots;
use super::step_time::StepShape;
use super::{EngineConfig, FinishReason, Metrics};
use crate::device::Executor;
use crate::model::Model;

pub(super) struct Worker {
    pub(super) model: Arc<Model>,
    pub(super) config: EngineConfig,
    /// The KV pool and the device the forward pass runs on.
    exec: Executor,
    pub(super) sched: Scheduler,
    /// The client side of every live request and sequence.
    pub(super) out: Outputs,
    next_seq_id: u64,
    in_flight: Arc<AtomicU64>,
    /// The most tokens a sequence can hold now (see `EngineHandle::max_seq_len`).
    max_seq_len: Arc<AtomicUsize>,
    pub(super) metrics: Metrics,
    /// Where clients read the counters: refreshed after every step and command.
    published: Arc<Mutex<Metrics>>,
    /// Where the prefix cache's changes go after every step (`--kv-events`).
    kv_events: Option<KvEventSink>,
    /// Proposals and their adaptive lengths (speculative decoding; off by default).
    pub(super) speculator: Speculator,
    /// The prefix cache's disk tier and the sequences waiting for its loads.
    parking: Parking,
    /// Prompt scores in progress and kept per block (`Request::prompt_logprobs`).
    pub(super) scores: PromptScores,
    /// Embedding rows kept so far (`Request::embed`).
    pub(super) embeddings: Embeddings,
}

/// What the worker shares with its `EngineHandle`.
pub(super) struct SharedWithHandle {
    /// Requests queued or running (the handle's `--max-queue` check).
    pub in_flight: Arc<AtomicU64>,
    /// The most tokens a sequence can hold now, for the handle's admission check.
    pub max_seq_len: Arc<AtomicUsize>,
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
        speculator: Speculator,
        disk: Option<DiskCacheConfig>,
    ) -> Self {
        let (parking, salt) = Parking::open(disk, &model, config.block_size, &exec);
        let mut blocks = BlockManager::new(config.num_blocks, config.block_size, salt);
        if parking.is_on() {
            blocks.enable_eviction_log();
        }
        if model.config.is_recurrent() {
            blocks.announce_at_snapshots();
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
        if model.config.is_recurrent() {
            sched.states = StateSlots::new(config.num_state_slots);
        }
        sched.max_score_rows = (SCORE_LOGITS_BYTES / (4 * model.config.vocab_size)).max(16);
        Worker {
            model,
            config,
            exec,
            sched,
            out: Outputs::default(),
            scores: PromptScores::default(),
            embeddings: Embeddings::default(),
            next_seq_id: 0,
            in_flight: shared.in_flight,
            max_seq_len: shared.max_seq_len,
            metrics: Metrics::default(),
            published: shared.metrics,
            kv_events,
            speculator,
            parking,
        }
    }

    /// The disk tier's live counters, when it is on.
    pub(super) fn disk_stats(&self) -> Option<disk_cache::DiskStatsHandle> {
        self.parking.stats_handle()
    }

    pub(super) fn run(mut self, rx: mpsc::Receiver<Command>) {
        self.publish();
        loop {
            let mut took = false; // commands taken in since the last step
            let parked = self.parking.num_parked() > 0;
            if !self.sched.has_work() && !parked {
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
                        for seq_id in self.parking.unpark_all() {
                            self.enqueue(seq_id);
                        }
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
                        if !self.sched.has_work() && self.parking.num_parked() == 0 {
                            return;
                        }
                        break;
                    }
                }
            }
            let (blocks, states) = (&mut self.sched.blocks, &mut self.sched.states);
            for ready in self.parking.poll(blocks, states, &mut self.exec) {
                self.out.set_disk_blocks(ready.seq_id, ready.from_disk);
                self.enqueue(ready.seq_id);
                took = true;
            }
            // Published before the step too: a client that hears its first token must not read
            // a snapshot from before its request was counted in.
            if took {
                self.publish();
            }
            if self.sched.has_work() {
                self.step();
                self.publish();
                if let Some(sink) = &self.kv_events {
                    sink.send(coalesce(self.sched.blocks.take_events()));
                }
            }
        }
    }

    pub(super) fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Submit {
                id,
                request,
                events,
            } => {
                self.metrics.submitted(request.cache_key);
                if request.sampling.constraint.is_some() {
                    self.metrics.requests_constrained += 1;
                }
                let seq_id = self.new_seq_id();
                let (prompt, key) = (request.prompt.clone(), request.cache_key);
                // A pin that cannot fit is refused before its prefill.
                let room = request
                    .pin
                    .then(|| self.sched.pin_room(&prompt, self.pin_limit()));
                self.out.add(id, seq_id, request, events);
                if let Some(Err(e)) = room {
                    return self.fail(seq_id, e);
                }
                let cache_prompt = self.out.request(seq_id).is_none_or(|r| r.cache_prompt);
                let (blocks, states) = (&self.sched.blocks, &self.sched.states);
                if !cache_prompt || !self.parking.park(seq_id, &prompt, key, blocks, states) {
                    self.enqueue(seq_id);
                }
            }
            Command::Unpin { pin, done } => {
                let found = self.sched.unpin(pin);
                self.publish();
                let _ = done.send(found);
            }
            Command::Abort(id) => {
                let seqs = self.out.seqs_of(id);
                for &seq_id in &seqs {
                    if self.parking.unpark(seq_id) {
                        self.enqueue(seq_id);
                    }
                }
                for seq_id in seqs {
                    self.finish(seq_id, FinishReason::Abort);
                }
            }
        }
    }

    /// Hands a new sequence to the scheduler, with its request's cache key.
    fn enqueue(&mut self, seq_id: SeqId) {
        let Some(request) = self.out.request(seq_id) else {
            return;
        };
        let (prompt, key, scoring) = (
            request.prompt.clone(),
            request.cache_key,
            request.prompt_logprobs,
        );
        let (cache_prompt, embed) = (request.cache_prompt, request.embed);
        self.sched.add(seq_id, prompt);
        if let Some(seq) = self.sched.get_mut(seq_id) {
            seq.cache_key = key;
            seq.cache_prompt = cache_prompt;
            seq.prompt_logprobs = scoring;
            seq.embed = embed;
        }
    }

    pub(super) fn new_seq_id(&mut self) -> SeqId {
        self.next_seq_id += 1;
        SeqId(self.next_seq_id)
    }

    /// The most tokens a sequence can hold now: the context, or the pool less its pinned
    /// blocks when that is less (a pin never leaves a request admitted that cannot finish).
    pub(super) fn max_seq_len(&self) -> usize {
        self.config.max_seq_len.min(self.sched.unpinned_tokens())
    }

    fn publish(&self) {
        self.max_seq_len.store(self.max_seq_len(), Ordering::SeqCst);
        let b = &self.sched.blocks;
        let (kv_tokens_stored, kv_slots_used) = self.sched.kv_fill();
        let snapshot = Metrics {
            kv_tokens_stored,
            kv_slots_used,
            sequences: self.out.sequences(&self.sched),
            prefix_cache: b.stats,
            blocks_total: b.num_blocks(),
            blocks_used: b.num_used(),
            blocks_cached: b.num_cached_free(),
            blocks_free: b.num_free(),
            state_slots_total: self.sched.states.num_total(),
            state_slots_free: self.sched.states.num_free(),
            state_snapshots: self.sched.states.num_snapshots(),
            state_snapshot_bytes: (self.sched.states.num_snapshots() as u64)
                * self.state_slot_bytes(),
            state_slot_bytes: self.state_slot_bytes(),
            num_running: self.sched.num_running(),
            num_waiting: self.sched.num_waiting() + self.parking.num_parked(),
            blocks_pinned: self.sched.num_pinned(),
            blocks_scored: self.scores.num_kept(),
            disk_cache: self.parking.stats(),
            preemptions: self.sched.num_preemptions,
            draft_blocks: self.speculator.draft_blocks(),
            ..self.metrics.clone()
        };
        if let Ok(mut m) = self.published.lock() {
            *m = snapshot;
        }
    }

    /// One step: schedule, copy shared blocks about to be written, run the batch, sample.
    fn step(&mut self) {
        let step_started = Instant::now();
        self.propose();
        let out = self.sched.schedule();
        let used = self.sched.blocks.num_used();
        self.metrics.blocks_used_peak = self.metrics.blocks_used_peak.max(used);
        for &id in &out.preempted {
            self.speculator.release(id); // its draft blocks too
        }
        // Before any slot is written: the cached blocks this schedule evicted go to disk, and
        // their state snapshots are dropped (no prompt resumes from one without its blocks).
        self.parking
            .save_evicted(&mut self.sched.blocks, &self.exec);
        let blocks = &self.sched.blocks;
        self.sched.states.retain_snapshots(|h| blocks.is_cached(h));
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
            .try_for_each(|c| self.exec.copy_block(c.src, c.dst))
            .and_then(|()| {
                (out.state_copies.iter()).try_for_each(|c| self.exec.copy_state(c.src, c.dst))
            });
        self.start_prompt_scores(&out.scheduled);
        let (batch, scores, embd_rows) = build_batch(&self.sched, &out);
        let started = Instant::now();
        // The constrained rows that sample this step have their masks computed on rayon's pool
        // while the forward pass runs.
        let jobs = self.out.take_mask_jobs(&self.sched, &out.scheduled);
        let pending = masks::start(jobs);
        let forward = copied.and_then(|()| self.exec.forward_rows(&self.model, &batch));
        let mut masks = HashMap::new();
        if let Some(done) = pending.map(|p| p.wait(self.config.mask_budget_ms)) {
            self.metrics.mask_time_us += done.micros;
            self.metrics.masks_computed += done.states.len() as u64;
            for (id, state) in done.states {
                self.out.restore_constraint(id, state);
            }
            masks = done.masks;
        }
        let step = match forward {
            Ok(s) => s,
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
                self.metrics.prefilled(seq.cache_key, prefill);
            }
        }
        let scoring = !scores.is_empty();
        self.keep_embeddings(&embd_rows, &step.embd);
        self.deliver(&out, scores, &step.logits, masks);
        self.make_state_copies();
        // Only steps whose every row wants logits (decoding and verifying, no prompt chunk)
        // teach the cost of a proposed row: a prompt row skips the output matrix.
        self.speculator.record_step(
            batch.n_tokens(),
            started.elapsed().as_secs_f64(),
            batch.logits_rows.len() == batch.n_tokens() && !scoring,
        );
        // The whole step, as a streaming client sees it between two tokens, teaches the cap.
        let shape = StepShape::of(&batch);
        self.sched
            .step_time
            .record(shape, step_started.elapsed().as_secs_f64());
    }

    /// Bytes of one recurrent state slot (0: no recurrent layers).
    fn state_slot_bytes(&self) -> u64 {
        match self.sched.states.is_on() {
            true => crate::model::state_pool::StatePool::slot_bytes(&self.model.config) as u64,
            false => 0,
        }
    }

    /// Makes the state copies this step's snapshots and forks queued (the states they copy
    /// stay as they are until the next step, so now is the same as before it), then writes
    /// the snapshots just taken to the disk tier.
    fn make_state_copies(&mut self) {
        for c in self.sched.states.take_copies() {
            if let Err(e) = self.exec.copy_state(c.src, c.dst) {
                eprintln!("warning: state copy {} -> {}: {e:#}", c.src, c.dst);
            }
        }
        let taken = self.sched.states.take_taken();
        (self.parking).save_snapshots(taken, &self.sched.blocks, &self.exec);
    }

    /// Most blocks pinned in all: half the pool, so requests always have room.
    pub(super) fn pin_limit(&self) -> usize {
        self.sched.blocks.num_blocks() / 2
    }

    /// Ends a sequence: its blocks go back at once (full ones written behind to the disk
    /// tier), and the client hears why.
    pub(super) fn finish(&mut self, seq_id: SeqId, reason: FinishReason) {
        self.speculator.forget(seq_id);
        self.scores.forget(seq_id);
        self.embeddings.forget(seq_id);
        if let Some(seq) = self.sched.get(seq_id) {
            self.parking
                .write_behind(&seq.block_table, &self.sched.blocks, &self.exec);
        }
        let sources = self.out.cache_sources(seq_id, &self.sched);
        let cached = self.out.num_cached(seq_id);
        let Some(seq) = self.sched.finish(seq_id) else {
            return;
        };
        let Some((notice, last)) = self.out.finish(&seq, reason, sources) else {
            return;
        };
        let last_aborted = last.then_some(reason == FinishReason::Abort);
        self.metrics.finished(seq.cache_key, cached, last_aborted);
        self.notify(notice, last);
    }

    /// Ends the whole request of `seq_id` with an error; the client stops listening.
    pub(super) fn fail(&mut self, seq_id: SeqId, message: String) {
        let key = self.out.request(seq_id).and_then(|r| r.cache_key);
        self.embeddings.forget(seq_id);
        let Some((seqs, notice)) = self.out.fail(seq_id, message) else {
            self.speculator.forget(seq_id);
            self.sched.finish(seq_id);
            return;
        };
        for id in seqs {
            self.speculator.forget(id);
            self.sched.finish(id);
        }
        self.metrics.failed(key);
        self.notify(notice, true);
    }

    /// Tells a client its completion or request ended: counted out of the queue first, so it
    /// may submit again at once, and published, so metrics read as soon as it hears show its
    /// blocks freed (the step's own publish comes only after the whole step).
    fn notify(&mut self, notice: Notice, request_done: bool) {
        if request_done {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
        self.publish();
        notice.send();
    }
}

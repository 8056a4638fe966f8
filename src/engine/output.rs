//! The client side of every live request, kept by the engine thread: per request its events
//! channel and its sequences; per sequence its sampler, constraint state, detokenizer and the
//! text held back for stop strings. The worker hands each row of logits here and gets an
//! [`Outcome`] back (a token to append, a fork, a finish, a failure, an abort), which it
//! applies to the scheduler; nothing here calls back into the worker or touches the KV cache.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use tokio::sync::mpsc as events;

use super::block_manager::BlockHash;
use super::masks::{self, MaskResult};
use super::sampler::Sampler;
use super::scheduler::Scheduler;
use super::sequence::{SeqId, SeqStatus, Sequence};
use super::{Event, FinishReason, Metrics, Request, SequenceInfo, TokenLogprobs, Usage};
use crate::constraint::{ConstraintState, Consumed};
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// A request as the client side knows it.
struct RequestOutput {
    request: Request,
    events: events::UnboundedSender<Event>,
    submitted: Instant,
    /// Its live sequences (completions 0..n once forked).
    seqs: Vec<SeqId>,
}

/// One completion's client-side state.
struct SeqOutput {
    request_id: u64,
    /// The completion's index (0..n).
    index: usize,
    sampler: Sampler,
    decoder: StreamDecoder,
    /// Decoded text held back because it may be the start of a stop string.
    pending: String,
    /// Completions still to fork from this one at its first token (n - 1 for the first).
    forks_pending: usize,
    ttft_ms: Option<u64>,
    /// The index of the stop string that ended the completion, once one has.
    stopped_by: Option<usize>,
    num_cached: usize,
    /// Hashes of the blocks loaded from disk for this sequence (cache explain).
    from_disk: HashSet<BlockHash>,
    /// Where the sequence is in its grammar, for constrained requests.
    constraint: Option<ConstraintState>,
}

impl SeqOutput {
    /// Completion `index` of `request`: its sampler seeded with the request's seed plus the
    /// index, its own constraint state.
    fn new(request_id: u64, index: usize, request: &Request, forks_pending: usize) -> Self {
        let mut params = request.sampling.clone();
        params.seed = params.seed.wrapping_add(index as u64);
        SeqOutput {
            request_id,
            index,
            sampler: Sampler::new(params),
            decoder: StreamDecoder::new(),
            pending: String::new(),
            forks_pending,
            ttft_ms: None,
            stopped_by: None,
            num_cached: 0,
            from_disk: HashSet::new(),
            constraint: request.sampling.constraint.as_ref().map(|c| c.new_state()),
        }
    }
}

/// What the worker does after a row was sampled.
#[derive(Debug, PartialEq)]
pub(super) enum Outcome {
    /// Append `token`; then, when `then` says so, finish (or abort the request: the client left).
    Token { token: u32, then: After },
    /// Before sampling its first token, fork this many completions off the sequence (n > 1);
    /// each child then samples the same row, and the parent is asked again.
    Fork(usize),
    /// Compute-only request: pin the prompt's blocks, then finish.
    Pin,
    /// End the sequence without a token (an end-of-generation token).
    Finish(FinishReason),
    /// End the whole request with an error.
    Fail(String),
}

#[derive(Debug, PartialEq, Eq)]
pub(super) enum After {
    Continue,
    Finish(FinishReason),
    /// The client dropped its stream: abort its request.
    Abort,
}

/// An event to send once the worker has updated its counters (so a client that hears its
/// request end can read metrics that already count it out).
pub(super) struct Notice {
    events: events::UnboundedSender<Event>,
    event: Event,
}

impl Notice {
    pub(super) fn send(self) {
        let _ = self.events.send(self.event);
    }
}

/// Every live request's client side.
#[derive(Default)]
pub(super) struct Outputs {
    requests: HashMap<u64, RequestOutput>,
    seqs: HashMap<SeqId, SeqOutput>,
}

impl Outputs {
    /// Sends the prompt's scores to the request of `seq_id`.
    pub(super) fn send_prompt_scores(
        &self,
        seq_id: SeqId,
        tokens: Vec<u32>,
        logprobs: Vec<Option<TokenLogprobs>>,
    ) {
        if let Some(r) = self.request_of(seq_id) {
            let _ = r.events.send(Event::Prompt { tokens, logprobs });
        }
    }

    /// Sends `event` to the request of `seq_id` (an embedding).
    pub(super) fn send(&self, seq_id: SeqId, event: Event) {
        if let Some(r) = self.request_of(seq_id) {
            let _ = r.events.send(event);
        }
    }

    /// Takes in a new request as its first sequence, `seq_id`.
    pub(super) fn add(
        &mut self,
        request_id: u64,
        seq_id: SeqId,
        request: Request,
        events: events::UnboundedSender<Event>,
    ) {
        let first = SeqOutput::new(request_id, 0, &request, request.n - 1);
        self.seqs.insert(seq_id, first);
        self.requests.insert(
            request_id,
            RequestOutput {
                request,
                events,
                submitted: Instant::now(),
                seqs: vec![seq_id],
            },
        );
    }

    fn request_of(&self, seq_id: SeqId) -> Option<&RequestOutput> {
        self.requests.get(&self.seqs.get(&seq_id)?.request_id)
    }

    /// The request a live sequence belongs to.
    pub(super) fn request(&self, seq_id: SeqId) -> Option<&Request> {
        self.request_of(seq_id).map(|r| &r.request)
    }

    /// The live sequences of a request.
    pub(super) fn seqs_of(&self, request_id: u64) -> Vec<SeqId> {
        self.requests
            .get(&request_id)
            .map(|r| r.seqs.clone())
            .unwrap_or_default()
    }

    pub(super) fn request_id(&self, seq_id: SeqId) -> Option<u64> {
        self.seqs.get(&seq_id).map(|s| s.request_id)
    }

    pub(super) fn is_constrained(&self, seq_id: SeqId) -> bool {
        self.seqs
            .get(&seq_id)
            .is_some_and(|s| s.constraint.is_some())
    }

    /// Whether the sequence's constraint state is out (lost in a panicking mask job).
    pub(super) fn constraint_lost(&self, seq_id: SeqId) -> bool {
        self.request(seq_id)
            .is_some_and(|r| r.sampling.constraint.is_some())
            && self
                .seqs
                .get(&seq_id)
                .is_some_and(|s| s.constraint.is_none())
    }

    pub(super) fn set_disk_blocks(&mut self, seq_id: SeqId, hashes: HashSet<BlockHash>) {
        if let Some(st) = self.seqs.get_mut(&seq_id) {
            st.from_disk = hashes;
        }
    }

    pub(super) fn disk_blocks(&self, seq_id: SeqId) -> Option<&HashSet<BlockHash>> {
        self.seqs.get(&seq_id).map(|s| &s.from_disk)
    }

    /// Takes out the active constraint state of `seq_id` (for a mask job beside the forward
    /// pass); `restore_constraint` puts it back.
    fn take_constraint(&mut self, seq_id: SeqId) -> Option<ConstraintState> {
        let st = self.seqs.get_mut(&seq_id)?;
        if st.constraint.as_ref().is_some_and(|c| c.is_active()) {
            st.constraint.take()
        } else {
            None
        }
    }

    /// Takes out the active constraint states of the scheduled sequences that will sample after
    /// this step (every token computed), to compute their masks beside the forward pass.
    pub(super) fn take_mask_jobs(
        &mut self,
        sched: &Scheduler,
        scheduled: &[(SeqId, usize)],
    ) -> Vec<(SeqId, ConstraintState)> {
        let mut jobs = Vec::new();
        for &(id, n) in scheduled {
            let samples = sched
                .get(id)
                .is_some_and(|seq| seq.num_computed + n == seq.len());
            if let Some(state) = samples.then(|| self.take_constraint(id)).flatten() {
                jobs.push((id, state));
            }
        }
        jobs
    }

    pub(super) fn restore_constraint(&mut self, seq_id: SeqId, state: ConstraintState) {
        if let Some(st) = self.seqs.get_mut(&seq_id) {
            st.constraint = Some(state);
        }
    }

    /// A child of `parent` for completion `index` (n > 1), sharing its request.
    pub(super) fn fork(&mut self, parent: SeqId, child: SeqId, index: usize) {
        let Some(p) = self.seqs.get(&parent) else {
            return;
        };
        let Some(r) = self.requests.get_mut(&p.request_id) else {
            return;
        };
        let state = SeqOutput {
            num_cached: p.num_cached,
            from_disk: p.from_disk.clone(),
            ..SeqOutput::new(p.request_id, index, &r.request, 0)
        };
        r.seqs.push(child);
        self.seqs.insert(child, state);
    }

    /// Samples the next token of `seq` from its row of `logits` (under `mask`, the constraint's
    /// mask computed beside the forward pass, if any; taken unless the outcome is a fork or a
    /// pin) and tells the client.
    pub(super) fn sample(
        &mut self,
        seq: &Sequence,
        logits: &[f32],
        mask: &mut Option<MaskResult>,
        tokenizer: &Tokenizer,
        max_seq_len: usize,
        metrics: &mut Metrics,
    ) -> Outcome {
        let Some(st) = self.seqs.get_mut(&seq.seq_id) else {
            return Outcome::Fail("the sequence is gone".into());
        };
        let Some(r) = self.requests.get(&st.request_id) else {
            return Outcome::Fail("the request is gone".into());
        };
        let request = &r.request;
        let first = seq.generated().is_empty();
        if first && request.pin {
            return Outcome::Pin;
        }
        if first {
            st.num_cached = seq.num_cached;
            if st.forks_pending > 0 {
                return Outcome::Fork(std::mem::take(&mut st.forks_pending));
            }
            if request.max_tokens == 0 {
                // The prompt evaluated (and scored, or cached for llama-server's
                // `n_predict: 0`): nothing is generated.
                return Outcome::Finish(FinishReason::Length);
            }
        }
        let mask = match constrained_mask(st, mask.take(), tokenizer, metrics) {
            Ok(m) => m,
            Err(e) => return Outcome::Fail(e),
        };
        let (prompt, generated) = (&seq.tokens[..seq.prompt_len], seq.generated());
        if st.sampler.needs_breakers() {
            st.sampler.bind_breakers(tokenizer);
        }
        // A constrained row samples under its mask (masked logits only where needed).
        let (token, masked) = match &mask {
            Some(m) => {
                let want = request.logprobs.is_some();
                masks::sample(&mut st.sampler, logits, m, prompt, generated, want)
            }
            None => (st.sampler.sample(logits, prompt, generated), None),
        };
        let logits = masked.as_deref().unwrap_or(logits);
        if st.ttft_ms.is_none() {
            let ms = r.submitted.elapsed().as_millis() as u64;
            st.ttft_ms = Some(ms);
            metrics.record_ttft(ms);
        }
        // An end token ends a constrained sequence even with ignore_eos: the constraint allowed
        // it only because its grammar is complete.
        let constrained_end = st.constraint.as_ref().is_some_and(|c| c.is_active());
        if (!request.ignore_eos || constrained_end) && tokenizer.is_eog(token) {
            return Outcome::Finish(FinishReason::Stop);
        }
        let consumed = match st.constraint.as_mut().map(|c| c.consume(token)) {
            Some(Err(e)) => return Outcome::Fail(e),
            Some(Ok(c)) => c,
            None => Consumed::Continue,
        };
        let logprobs = request.logprobs.map(|k| token_logprobs(logits, token, k));
        metrics.tokens_generated += 1;
        if let Some(t) = metrics.tenant(request.cache_key) {
            t.tokens_generated += 1;
        }
        let piece = st.decoder.push(tokenizer, token);
        st.pending.push_str(&piece);
        let (text, stopped) = take_emittable(&mut st.pending, &request.stop);
        st.stopped_by = st.stopped_by.or(stopped);
        let stopped = stopped.is_some();
        let sent = r.events.send(Event::Token {
            index: st.index,
            token,
            text,
            logprobs,
        });
        // The token is appended by the worker: the sequence is one longer then.
        let then = if sent.is_err() {
            After::Abort
        } else if stopped || consumed == Consumed::Done {
            After::Finish(FinishReason::Stop)
        } else if generated.len() + 1 >= request.max_tokens || seq.len() + 1 >= max_seq_len {
            After::Finish(FinishReason::Length)
        } else {
            After::Continue
        };
        Outcome::Token { token, then }
    }

    /// Ends a completion whose sequence `seq` the scheduler has released: its last text is
    /// flushed into the `Finished` event (sent by the caller, after its counters). Also returns
    /// whether this was the request's last completion.
    pub(super) fn finish(
        &mut self,
        seq: &Sequence,
        reason: FinishReason,
        (cached_disk_tokens, cached_pinned_tokens): (usize, usize),
    ) -> Option<(Notice, bool)> {
        let mut st = self.seqs.remove(&seq.seq_id)?;
        let r = self.requests.get_mut(&st.request_id)?;
        let mut text = std::mem::take(&mut st.pending);
        let stop = &r.request.stop;
        if reason != FinishReason::Stop
            || !stop
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
            stop_sequence: st.stopped_by,
        };
        let notice = Notice {
            events: r.events.clone(),
            event: Event::Finished {
                index: st.index,
                reason,
                text,
                usage,
            },
        };
        r.seqs.retain(|&s| s != seq.seq_id);
        let last = r.seqs.is_empty();
        if last {
            self.requests.remove(&st.request_id);
        }
        Some((notice, last))
    }

    /// Ends the whole request of `seq_id` with an error: every one of its sequences is forgotten
    /// here and returned, for the scheduler to release, with the error event to send.
    pub(super) fn fail(&mut self, seq_id: SeqId, message: String) -> Option<(Vec<SeqId>, Notice)> {
        let request_id = self.seqs.get(&seq_id)?.request_id;
        let r = self.requests.remove(&request_id)?;
        for s in &r.seqs {
            self.seqs.remove(s);
        }
        Some((
            r.seqs,
            Notice {
                events: r.events,
                event: Event::Error(message),
            },
        ))
    }

    /// Where the cached prompt blocks of `seq_id` came from: (disk, pinned) tokens.
    pub(super) fn cache_sources(&self, seq_id: SeqId, sched: &Scheduler) -> (usize, usize) {
        let (Some(seq), Some(from_disk)) = (sched.get(seq_id), self.disk_blocks(seq_id)) else {
            return (0, 0);
        };
        let bs = sched.blocks.block_size;
        let (mut disk, mut pinned) = (0, 0);
        for &id in seq.block_table.iter().take(self.num_cached(seq_id) / bs) {
            if sched.is_pinned(id) {
                pinned += bs;
            } else if sched
                .blocks
                .registered(id)
                .is_some_and(|(h, _)| from_disk.contains(&h))
            {
                disk += bs;
            }
        }
        (disk, pinned)
    }

    /// The completions' cached prompt tokens recorded at their first token.
    /// Every live sequence's counts, in id order (`/slots`).
    pub(super) fn sequences(&self, sched: &Scheduler) -> Vec<SequenceInfo> {
        let mut out: Vec<SequenceInfo> = sched
            .seq_ids()
            .filter_map(|&id| {
                let seq = sched.get(id)?;
                Some(SequenceInfo {
                    seq_id: id.0,
                    running: seq.status == SeqStatus::Running,
                    prompt_tokens: seq.prompt_len,
                    cached_tokens: seq.num_cached,
                    computed_tokens: seq.num_computed,
                    generated_tokens: seq.generated().len(),
                    max_tokens: self.request(id).map_or(0, |r| r.max_tokens),
                    tenant: seq.cache_key,
                })
            })
            .collect();
        out.sort_by_key(|s| s.seq_id);
        out
    }

    pub(super) fn num_cached(&self, seq_id: SeqId) -> usize {
        self.seqs.get(&seq_id).map_or(0, |s| s.num_cached)
    }
}

/// The row's mask under its constraint, end-of-generation tokens included: the one computed
/// beside the forward pass, or one computed now (forks, lazily triggered rows). None for an
/// unconstrained row; Err ends the request.
fn constrained_mask(
    st: &mut SeqOutput,
    mask: Option<MaskResult>,
    tokenizer: &Tokenizer,
    metrics: &mut Metrics,
) -> Result<Option<toktrie::SimpleVob>, String> {
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
            metrics.mask_time_us += t.elapsed().as_micros() as u64;
            metrics.masks_computed += 1;
            m?
        }
    };
    masks::allow_eog(&mut mask, tokenizer.eos_id(), tokenizer.eog_ids());
    Ok(Some(mask))
}

/// Log-probability of `token` and the `k` most likely tokens (fewer where a constraint allows
/// fewer).
pub(super) fn token_logprobs(logits: &[f32], token: u32, k: usize) -> TokenLogprobs {
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
        // Ties go to the lower id, so the top k is the top k' (k' > k) cut short.
        idx.select_nth_unstable_by(k - 1, |&a, &b| {
            logits[b as usize]
                .total_cmp(&logits[a as usize])
                .then(a.cmp(&b))
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
fn take_emittable(pending: &mut String, stop: &[String]) -> (String, Option<usize>) {
    let stops = stop.iter().filter(|s| !s.is_empty());
    let found = stop
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.is_empty())
        .filter_map(|(k, s)| pending.find(s.as_str()).map(|pos| (pos, k)))
        .min();
    if let Some((pos, k)) = found {
        let text = pending[..pos].to_string();
        pending.clear();
        return (text, Some(k));
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
    (text, None)
}

#[cfg(test)]
mod tests {
    use super::take_emittable;

    #[test]
    fn stop_strings_are_held_back_and_cut() {
        let stop = vec!["</s>".to_string(), "\n\n".to_string()];
        let mut p = "Hello <".to_string();
        assert_eq!(take_emittable(&mut p, &stop), ("Hello ".to_string(), None));
        assert_eq!(p, "<");
        p.push_str("/s> more");
        assert_eq!(take_emittable(&mut p, &stop), ("".to_string(), Some(0)));
        let mut p = "line\n".to_string();
        assert_eq!(take_emittable(&mut p, &stop), ("line".to_string(), None));
        p.push('x');
        assert_eq!(take_emittable(&mut p, &stop), ("\nx".to_string(), None));
        let mut p = "no stops".to_string();
        assert_eq!(take_emittable(&mut p, &[]), ("no stops".to_string(), None));
    }
}

//! Smooth decoding while a prompt prefills (`--max-step-ms`): the scheduler cuts a step's
//! prefill by its predicted time while sequences decode, and not when none does, with
//! synthetic step times (no clock); and on the real default model, four decoding chats and a
//! long prompt give the same tokens with the cap off, at its default and tiny (the minimum
//! chunk every step), and every KV block comes back.

mod support;

use edge_llm::engine::block_manager::BlockManager;
use edge_llm::engine::sampler::SamplingParams;
use edge_llm::engine::scheduler::{Scheduler, SchedulerConfig};
use edge_llm::engine::sequence::SeqId;
use edge_llm::engine::step_time::{StepShape, MIN_PREFILL_CHUNK};
use edge_llm::engine::{EngineConfig, EngineHandle, EngineParts, Event, Request};

fn scheduler() -> Scheduler {
    Scheduler::new(
        SchedulerConfig {
            max_batched_tokens: 512,
            max_seqs: 16,
        },
        BlockManager::new(1024, 16, 0),
    )
}

/// Teaches `sched` a machine where a step costs 5 ms, a logit row 1 ms, a prompt row 0.5 ms
/// and a thousand attended keys 0.2 ms.
fn teach(sched: &mut Scheduler) {
    let cost = |s: &StepShape| {
        0.005
            + 0.001 * s.logit_rows as f64
            + 0.0005 * s.prompt_rows as f64
            + 0.0002 * s.keys as f64 / 1000.0
    };
    for i in 0..50 {
        let mut s = StepShape::default();
        for r in 0..1 + i % 4 {
            s.add_rows(40 + r, 1, true);
        }
        s.add_rows(20 * i, i % 7 * 10, false);
        sched.step_time.record(s, cost(&s));
    }
}

/// Runs one step of `sched`, completing every scheduled sequence's tokens; sequences that
/// finished their prompt get a token appended (they decode from then on).
fn step(sched: &mut Scheduler) -> Vec<(SeqId, usize)> {
    let out = sched.schedule();
    for id in sched.step_done(&out) {
        sched.append_token(id, 7);
    }
    sched.check_invariants().unwrap();
    out.scheduled
}

#[test]
fn a_lone_prefill_runs_uncapped_and_decoding_caps_the_next_one() {
    let mut sched = scheduler();
    sched.set_max_step_ms(Some(50));
    teach(&mut sched);
    // Nothing decodes: a long prompt takes the whole token budget.
    sched.add(SeqId(1), vec![1; 2000]);
    assert_eq!(step(&mut sched), vec![(SeqId(1), 512)]);
    sched.finish(SeqId(1));
    // Four short chats start together (nothing decodes yet: uncapped) and then decode.
    for id in 2..6 {
        sched.add(SeqId(id), vec![id as u32; 20]);
    }
    assert_eq!(step(&mut sched).len(), 4);
    // A long prompt now gets what fits 50 ms beside the four decoding rows.
    sched.add(SeqId(10), vec![10; 2000]);
    let s = step(&mut sched);
    assert!(
        s.iter().filter(|s| s.0 != SeqId(10)).all(|s| s.1 == 1),
        "every chat decodes one token: {s:?}"
    );
    let first = s
        .iter()
        .find(|s| s.0 == SeqId(10))
        .expect("the long prompt runs")
        .1;
    assert!(
        first > MIN_PREFILL_CHUNK && first < 100,
        "capped chunk {first}"
    );
    // Deeper into the prompt a token attends to more keys: chunks get smaller.
    let mut last = first;
    let mut num_chunks = 1;
    while let Some(&(_, n)) = step(&mut sched)
        .iter()
        .find(|s| s.0 == SeqId(10) && s.1 > 1)
    {
        assert!(n <= last, "chunk {n} after {last}");
        last = n;
        num_chunks += 1;
    }
    assert!(num_chunks > 2000 / first, "{num_chunks} chunks");
    // With the cap off, the same state takes the full budget again.
    sched.set_max_step_ms(None);
    sched.add(SeqId(9), vec![3; 1000]);
    let s = step(&mut sched);
    assert_eq!(s.iter().find(|s| s.0 == SeqId(9)).unwrap().1, 512 - 5);
    for id in [2, 3, 4, 5, 9, 10] {
        sched.finish(SeqId(id));
    }
    sched.check_invariants().unwrap();
    assert_eq!(sched.blocks.num_used(), 0);
}

#[test]
fn a_step_always_gets_the_minimum_chunk_and_unknown_costs_give_only_that() {
    let mut sched = scheduler();
    sched.set_max_step_ms(Some(1));
    sched.add(SeqId(1), vec![2; 20]);
    step(&mut sched);
    // Nothing learnt yet, one sequence decoding: the minimum chunk.
    sched.add(SeqId(2), vec![1; 300]);
    let s = step(&mut sched);
    assert_eq!(s, vec![(SeqId(1), 1), (SeqId(2), MIN_PREFILL_CHUNK)]);
    // Learnt costs that make even one prompt row too slow for 1 ms: still the minimum, shared
    // by every prompt of the step in order.
    teach(&mut sched);
    sched.add(SeqId(3), vec![4; 300]);
    let s = step(&mut sched);
    assert_eq!(s, vec![(SeqId(1), 1), (SeqId(2), MIN_PREFILL_CHUNK)]);
    let mut prefilled = 2 * MIN_PREFILL_CHUNK;
    while sched.get(SeqId(2)).unwrap().num_uncomputed() > 1 {
        prefilled += step(&mut sched)
            .iter()
            .find(|s| s.0 == SeqId(2))
            .map_or(0, |s| s.1);
    }
    assert_eq!(prefilled, 300, "the long prompt progressed to its end");
}

/// Four chats (greedy, 40 tokens each) and a 1,500-token prompt (its first 24 tokens) through
/// an engine with `max_step_ms`; returns every output and the count of capped steps.
fn run(max_step_ms: Option<u64>) -> (Vec<Vec<u32>>, u64) {
    let model = support::shared_model();
    let config = EngineConfig {
        block_size: 16,
        num_blocks: 256,
        max_seq_len: 2048,
        max_batched_tokens: 512,
        max_seqs: 8,
        max_queue: 8,
        max_step_ms,
        mask_budget_ms: EngineConfig::DEFAULT_MASK_BUDGET_MS,
        kv_types: edge_llm::kernels::KvTypes::F16,
        num_state_slots: 0,
    };
    let engine = EngineHandle::start(model.clone(), config, EngineParts::default()).unwrap();
    let text = std::fs::read_to_string("/usr/share/common-licenses/GPL-3")
        .expect("the GPL-3 text of Debian's base-files");
    let tok = &model.tokenizer;
    let mut long = tok.encode(&text, false, false).unwrap();
    long.truncate(1500);
    let mut streams = Vec::new();
    for i in 0..4 {
        let prompt = tok
            .encode(
                &format!("Question {i}: what is free software?"),
                false,
                false,
            )
            .unwrap();
        let mut r = Request::new(prompt, SamplingParams::greedy(), 40);
        r.ignore_eos = true;
        streams.push(engine.submit(r).unwrap());
    }
    // Submitted right after the chats: they decode while most of it prefills.
    streams.push(
        engine
            .submit(Request::new(long, SamplingParams::greedy(), 24))
            .unwrap(),
    );
    let outputs = streams
        .iter_mut()
        .map(|s| {
            let mut tokens = Vec::new();
            while let Some(e) = s.next_blocking() {
                match e {
                    Event::Token { token, .. } => tokens.push(token),
                    Event::Finished { .. } => {}
                    Event::Error(e) => panic!("engine error: {e}"),
                    Event::Prompt { .. } | Event::Embedding { .. } => {}
                }
            }
            tokens
        })
        .collect();
    for _ in 0..1000 {
        let m = engine.metrics().unwrap();
        if m.requests_finished == 5 && m.num_running == 0 {
            assert_eq!(m.blocks_used, 0, "every KV block came back");
            return (outputs, m.steps_prefill_capped);
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    panic!("the engine did not go idle");
}

#[test]
fn the_cap_never_changes_the_tokens_and_blocks_come_back() {
    let (off, capped_off) = run(None);
    assert_eq!(capped_off, 0, "no cap, no capped steps");
    assert!(off[..4].iter().all(|t| t.len() == 40) && !off[4].is_empty());
    // 1 ms: every step with a chat decoding gets the minimum chunk only.
    let (tiny, capped_tiny) = run(Some(1));
    assert!(
        capped_tiny >= 10,
        "the 1,500-token prompt was cut into small chunks beside the decoding chats ({capped_tiny} capped steps)"
    );
    assert_eq!(tiny, off, "a tiny cap changed the output");
    let (default, _) = run(Some(edge_llm::engine::step_time::DEFAULT_MAX_STEP_MS));
    assert_eq!(default, off, "the default cap changed the output");
}

//! The engine on the real default model: 8 sequences sharing a 400-token prompt compute it once
//! and produce, token for token, the greedy outputs of 8 one-at-a-time runs; a pool too small for
//! all of them preempts and still gives the same outputs; every block comes back; n > 1 forks
//! share the prompt; abort frees at once.

mod support;

use edge_llm::engine::sampler::SamplingParams;
use edge_llm::engine::{EngineConfig, EngineHandle, EngineParts, Event, FinishReason, Request};
use support::shared_model;

const GEN: usize = 12;

fn engine(num_blocks: usize) -> EngineHandle {
    let config = EngineConfig {
        block_size: 16,
        num_blocks,
        max_seq_len: 1024.min(num_blocks * 16),
        max_batched_tokens: 512,
        max_seqs: 64,
        max_queue: 64,
        max_step_ms: None,
        mask_budget_ms: EngineConfig::DEFAULT_MASK_BUDGET_MS,
        kv_types: edge_llm::kernels::KvTypes::F16,
        num_state_slots: 0,
    };
    EngineHandle::start(shared_model(), config, EngineParts::default()).unwrap()
}

/// Eight prompts: the same 400-token system text, then a different question each.
fn prompts() -> Vec<Vec<u32>> {
    let model = shared_model();
    let text = std::fs::read_to_string("/usr/share/common-licenses/GPL-3").unwrap();
    let mut system = model.tokenizer.encode(&text, false, false).unwrap();
    system.truncate(400);
    (0..8)
        .map(|i| {
            let mut p = system.clone();
            p.extend(
                model
                    .tokenizer
                    .encode(
                        &format!("\nQuestion {i}: what does section {} say?\nAnswer:", i + 2),
                        false,
                        false,
                    )
                    .unwrap(),
            );
            p
        })
        .collect()
}

fn collect(stream: &mut edge_llm::engine::RequestStream) -> (Vec<u32>, FinishReason, usize) {
    let mut tokens = Vec::new();
    while let Some(e) = stream.next_blocking() {
        match e {
            Event::Token { token, .. } => tokens.push(token),
            Event::Finished { reason, usage, .. } => return (tokens, reason, usage.cached_tokens),
            Event::Error(e) => panic!("engine error: {e}"),
            Event::Prompt { .. } | Event::Embedding { .. } => {}
        }
    }
    panic!("stream ended without finishing")
}

fn greedy(prompt: &[u32]) -> Request {
    Request::new(prompt.to_vec(), SamplingParams::greedy(), GEN)
}

fn wait_idle(e: &EngineHandle) -> edge_llm::engine::Metrics {
    for _ in 0..100 {
        let m = e.metrics().unwrap();
        // Every submitted request accounted for: a snapshot taken before the last step is stale.
        let ended = m.requests_finished + m.requests_aborted + m.requests_failed;
        if m.num_running == 0
            && m.num_waiting == 0
            && ended == m.requests_submitted
            && m.requests_submitted > 0
        {
            return m;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("engine did not go idle")
}

#[test]
fn batched_equals_one_at_a_time_and_the_prompt_is_computed_once() {
    let prompts = prompts();
    let alone = engine(512);
    let expected: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            // A fresh engine per prompt: no cache, no batch.
            let e = engine(64);
            let r = collect(&mut e.submit(greedy(p)).unwrap()).0;
            drop(e);
            r
        })
        .collect();
    drop(alone);

    let e = engine(512);
    let mut streams: Vec<_> = prompts
        .iter()
        .map(|p| e.submit(greedy(p)).unwrap())
        .collect();
    let results: Vec<_> = streams.iter_mut().map(collect).collect();
    for (i, ((tokens, reason, _), want)) in results.iter().zip(&expected).enumerate() {
        assert_eq!(reason, &FinishReason::Length);
        assert_eq!(
            tokens, want,
            "sequence {i}: batched output differs from one-at-a-time"
        );
    }
    let m = wait_idle(&e);
    // The 400-token prefix (25 blocks) was computed once and hit 7 times.
    assert_eq!(m.prefix_cache.hit_blocks, 7 * 25, "{m:?}");
    let suffixes: u64 = prompts.iter().map(|p| (p.len() - 400) as u64).sum();
    assert_eq!(m.tokens_prefilled, 400 + suffixes, "prompt tokens computed");
    assert!(
        results[1..].iter().all(|r| r.2 == 400),
        "cached_tokens reported"
    );
    assert_eq!(m.blocks_used, 0, "every block comes back");
    assert_eq!(m.blocks_free, 512);
}

#[test]
fn a_pool_too_small_preempts_and_gives_the_same_outputs() {
    // Four different 100-token prompts (nothing to share), 100 tokens generated each: all four
    // are admitted at once (7 blocks each) whenever they arrive, then grow to 13 blocks each,
    // 52 in all, in a pool of 36.
    let model = shared_model();
    let text = std::fs::read_to_string("/usr/share/common-licenses/GPL-3").unwrap();
    let tokens = model.tokenizer.encode(&text, false, false).unwrap();
    let prompts: Vec<Vec<u32>> = (0..4)
        .map(|i| tokens[i * 300..i * 300 + 100].to_vec())
        .collect();
    let long = |p: &Vec<u32>| {
        let mut r = Request::new(p.clone(), SamplingParams::greedy(), 100);
        r.ignore_eos = true;
        r
    };
    let expected: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| collect(&mut engine(64).submit(long(p)).unwrap()).0)
        .collect();
    let e = engine(36);
    let mut streams: Vec<_> = prompts.iter().map(|p| e.submit(long(p)).unwrap()).collect();
    let results: Vec<_> = streams.iter_mut().map(collect).collect();
    for (i, ((tokens, _, _), want)) in results.iter().zip(&expected).enumerate() {
        assert_eq!(tokens, want, "sequence {i} after preemption");
    }
    let m = wait_idle(&e);
    assert!(m.preemptions > 0, "the pool was too small: {m:?}");
    assert_eq!(m.blocks_used, 0);
}

#[test]
fn n_completions_fork_and_abort_frees_blocks() {
    let e = engine(128);
    let prompt = shared_model()
        .tokenizer
        .encode("Once upon a time, there was a little", false, true)
        .unwrap();
    let mut req = Request::new(
        prompt.clone(),
        SamplingParams {
            temperature: 1.0,
            seed: 5,
            ..Default::default()
        },
        8,
    );
    req.n = 3;
    let mut stream = e.submit(req).unwrap();
    let mut per_index = vec![Vec::new(); 3];
    let mut finished = 0;
    while let Some(ev) = stream.next_blocking() {
        match ev {
            Event::Token { index, token, .. } => per_index[index].push(token),
            Event::Finished { usage, .. } => {
                finished += 1;
                assert_eq!(usage.prompt_tokens, prompt.len());
            }
            Event::Error(e) => panic!("{e}"),
            Event::Prompt { .. } | Event::Embedding { .. } => {}
        }
    }
    assert_eq!(finished, 3);
    assert!(per_index.iter().all(|t| t.len() == 8));
    let m = wait_idle(&e);
    assert_eq!(
        m.tokens_prefilled as usize,
        prompt.len(),
        "the prompt is computed once for n = 3"
    );
    assert_eq!(m.blocks_used, 0);

    // Abort mid-generation: blocks come back at once.
    let mut long_req = Request::new(prompt, SamplingParams::greedy(), 1000);
    long_req.ignore_eos = true; // it must still be running when the abort arrives
    let mut long = e.submit(long_req).unwrap();
    assert!(matches!(long.next_blocking(), Some(Event::Token { .. })));
    drop(long);
    let m = wait_idle(&e);
    assert_eq!(m.blocks_used, 0);
    assert_eq!(m.requests_aborted, 1);
}

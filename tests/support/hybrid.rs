//! The engine-side checks the hybrid families' tests share (tests/hybrid_models.rs for LFM2,
//! tests/synth_granite.rs, tests/synth_qwen35.rs): a sequence's logits run in chunks, an engine
//! with a given pool, step budget and state slots, prompts sharing a prefix, greedy completions
//! one at a time, and the check that every KV block and state slot came back.

use std::sync::Arc;

use edge_llm::engine::sampler::SamplingParams;
use edge_llm::engine::{EngineConfig, EngineHandle, EngineParts, Event};
use edge_llm::model::Model;
use edge_llm::scoring::runner::SequenceRunner;

use super::top_logits::ids;
use super::{collect, request, wait_idle};

/// Every position's logits, the sequence run `chunk` tokens per step.
pub fn logits(model: &Model, tokens: &[u32], chunk: usize) -> Vec<f32> {
    let mut runner = SequenceRunner::new(model, tokens.len(), 16);
    runner.batch_tokens = chunk;
    runner.eval(tokens, true).unwrap()
}

pub fn engine(
    model: &Arc<Model>,
    num_blocks: usize,
    max_batched_tokens: usize,
    slots: usize,
) -> EngineHandle {
    let config = EngineConfig {
        block_size: 16,
        num_blocks,
        max_seq_len: 256.min(num_blocks * 16),
        max_batched_tokens,
        max_seqs: 64,
        max_queue: 64,
        max_step_ms: None,
        mask_budget_ms: EngineConfig::DEFAULT_MASK_BUDGET_MS,
        kv_types: edge_llm::kernels::KvTypes::F16,
        num_state_slots: slots,
    };
    EngineHandle::start(Arc::clone(model), config, EngineParts::default()).unwrap()
}

/// Four prompts of the reference's tokens sharing a 40-token prefix, each then its own.
pub fn prompts(r: &serde_json::Value) -> Vec<(Vec<u32>, usize)> {
    let t = ids(&r["tokens"]);
    (0..4)
        .map(|i| {
            let mut p = t[..40].to_vec();
            p.extend(&t[100 + 20 * i..110 + 25 * i]);
            (p, 12)
        })
        .collect()
}

pub fn alone(e: &EngineHandle, prompts: &[(Vec<u32>, usize)]) -> Vec<Vec<u32>> {
    prompts
        .iter()
        .map(|(p, n)| collect(&mut e.submit(request(p, *n, SamplingParams::greedy())).unwrap()).0)
        .collect()
}

/// Every slot and block back.
pub fn assert_all_back(e: &EngineHandle, slots: usize) {
    let m = wait_idle(e);
    assert_eq!(m.blocks_used, 0, "every KV block back");
    assert_eq!(
        (m.state_slots_total, m.state_slots_free),
        (slots, slots),
        "every state slot back"
    );
}

/// A greedy completion of `prompt` and its `cached_tokens`.
pub fn run(e: &EngineHandle, prompt: &[u32], n: usize, cache_prompt: bool) -> (Vec<u32>, usize) {
    let mut req = request(prompt, n, SamplingParams::greedy());
    req.cache_prompt = cache_prompt;
    let mut stream = e.submit(req).unwrap();
    let mut out = Vec::new();
    while let Some(ev) = stream.next_blocking() {
        match ev {
            Event::Token { token, .. } => out.push(token),
            Event::Finished { usage, .. } => return (out, usage.cached_tokens),
            Event::Error(err) => panic!("{err}"),
            _ => {}
        }
    }
    panic!("no Finished event")
}

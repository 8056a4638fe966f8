//! Shared by the integration tests that run the real default model: where the model and the
//! llama.cpp reference outputs are, and loading them once per test binary.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use edge_llm::engine::sampler::SamplingParams;
use edge_llm::engine::{
    EngineConfig, EngineHandle, EngineParts, Event, FinishReason, Metrics, Request, RequestStream,
};
use edge_llm::model::Model;

pub fn model_path() -> PathBuf {
    let p =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.is_file(),
        "{} is missing: run scripts/fetch-model.sh",
        p.display()
    );
    p
}

/// The default model, loaded once and shared by the tests of one binary.
pub fn model() -> &'static Model {
    shared()
}

/// The same model, as the engine takes it.
pub fn shared_model() -> Arc<Model> {
    shared().clone()
}

fn shared() -> &'static Arc<Model> {
    static MODEL: OnceLock<Arc<Model>> = OnceLock::new();
    MODEL.get_or_init(|| Arc::new(Model::load(&model_path()).expect("the default model loads")))
}

/// The greedy continuation of `prompt` (at most `n` tokens) through an engine of its own with
/// blocks of `block_size` tokens, a context of `n_ctx` and at most `max_batched_tokens` per step
/// (chunked prefill below the prompt's length); checks that every block came back after.
pub fn engine_greedy(
    prompt: &[u32],
    n: usize,
    ignore_eos: bool,
    block_size: usize,
    max_batched_tokens: usize,
) -> (Vec<u32>, FinishReason) {
    let n_ctx: usize = 256;
    let config = EngineConfig {
        block_size,
        num_blocks: n_ctx.div_ceil(block_size),
        max_seq_len: n_ctx,
        max_batched_tokens,
        max_seqs: 1,
        max_queue: 1,
        max_step_ms: None,
    };
    let engine = EngineHandle::start(shared_model(), config, EngineParts::default())
        .expect("the engine starts");
    let mut request = Request::new(prompt.to_vec(), SamplingParams::greedy(), n);
    request.ignore_eos = ignore_eos;
    let mut stream = engine.submit(request).expect("the request is accepted");
    let mut tokens = Vec::new();
    let reason = loop {
        match stream.next_blocking().expect("the stream finishes") {
            Event::Token { token, .. } => tokens.push(token),
            Event::Finished { reason, .. } => break reason,
            Event::Error(e) => panic!("engine error: {e}"),
        }
    };
    // The engine counts the request as finished after its last event: wait for it.
    for _ in 0..1000 {
        let m = engine.metrics().expect("the engine answers");
        if m.num_running == 0 && m.blocks_used == 0 {
            return (tokens, reason);
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    panic!("KV blocks still in use after the request finished");
}

/// llama.cpp's outputs on the default model (tests/reference/llamacpp-smollm2.json, copied from ../shared/reference).
pub fn reference() -> serde_json::Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/reference/llamacpp-smollm2.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).expect("reference JSON parses")
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("an array of ids")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

/// Every token of a request's stream, and how it finished; an engine error fails the test.
pub fn collect(stream: &mut RequestStream) -> (Vec<u32>, FinishReason) {
    let mut tokens = Vec::new();
    while let Some(e) = stream.next_blocking() {
        match e {
            Event::Token { token, .. } => tokens.push(token),
            Event::Finished { reason, .. } => return (tokens, reason),
            Event::Error(e) => panic!("engine error: {e}"),
        }
    }
    panic!("stream ended without finishing")
}

/// A request that runs to `max_tokens` (end-of-generation ignored).
pub fn request(prompt: &[u32], max_tokens: usize, sampling: SamplingParams) -> Request {
    let mut r = Request::new(prompt.to_vec(), sampling, max_tokens);
    r.ignore_eos = true;
    r
}

/// Submits `num_sessions` greedy requests at once, prompt `i % prompts.len()` each (a prompt
/// and its `max_tokens`), and checks that each generates what it generated alone
/// (`expected[i]`); `what` names the feature that must not change the output.
pub fn assert_greedy_among_sessions(
    e: &EngineHandle,
    prompts: &[(Vec<u32>, usize)],
    expected: &[Vec<u32>],
    num_sessions: usize,
    what: &str,
) {
    let order: Vec<usize> = (0..num_sessions).map(|i| i % prompts.len()).collect();
    let mut streams: Vec<_> = order
        .iter()
        .map(|&i| {
            e.submit(request(
                &prompts[i].0,
                prompts[i].1,
                SamplingParams::greedy(),
            ))
            .unwrap()
        })
        .collect();
    for (s, &i) in streams.iter_mut().zip(&order) {
        assert_eq!(
            collect(s).0,
            expected[i],
            "prompt {i} among {num_sessions} sessions: {what} changed the greedy output"
        );
    }
}

/// The engine's metrics once nothing runs or waits and every request has ended (at most 10 s).
pub fn wait_idle(e: &EngineHandle) -> Metrics {
    for _ in 0..500 {
        let m = e.metrics().unwrap();
        let ended = m.requests_finished + m.requests_aborted + m.requests_failed;
        if m.num_running == 0 && m.num_waiting == 0 && ended == m.requests_submitted {
            return m;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("engine did not go idle")
}

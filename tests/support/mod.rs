//! The one support module of the integration tests, included by every test file the same way:
//! `mod support;`. Cargo makes a test binary of each `tests/*.rs` but not of the files in
//! folders, so every helper lives here, and each binary compiles all of it (hence the
//! `dead_code` allowances).
//!
//! - here: where the models and the llama.cpp reference outputs are, loading the default model
//!   once per binary, the engine helpers, and the one rule for a missing prerequisite
//!   ([`skip_or_fail`]);
//! - [`splitmix`]: the one random generator of the tests;
//! - [`isa_lock`]: switching the kernels' instruction set, one test at a time;
//! - [`gguf_writer`]: small valid and malformed GGUF files;
//! - [`harness`]: the real `edge-llm serve` and a hand-written HTTP/1.1 client;
//! - [`cluster`]: workers behind a real router (tests/routers.rs);
//! - [`webdriver`]: a headless Chromium through chromedriver (tests/webui.rs).

#![allow(dead_code)]

pub mod cluster;
pub mod gguf_writer;
pub mod harness;
pub mod hybrid;
pub mod isa_lock;
pub mod splitmix;
pub mod synth;
pub mod top_logits;
pub mod webdriver;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use edge_llm::engine::sampler::SamplingParams;
use edge_llm::engine::{
    EngineConfig, EngineHandle, EngineParts, Event, FinishReason, Metrics, Request, RequestStream,
};
use edge_llm::model::Model;

// ---- a missing prerequisite ----

/// Whether the tests run under CI (`CI=true`, or `CI=1`), where a missing prerequisite fails.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The one rule for a missing prerequisite (a model, tmux, a Python package, chromium, a
/// router...): under `CI=true` the test fails with `reason`; elsewhere it prints
/// `skipping: <reason>` to stderr and the caller returns (the test passes without checking).
#[track_caller]
pub fn skip_or_fail(reason: &str) {
    skip_or_fail_if(in_ci().then_some("CI=true"), reason)
}

/// The same rule where something other than `CI=true` makes the prerequisite required:
/// `required_by` names it (e.g. `EDGE_LLM_REQUIRE_QEMU is set`) and the test fails with
/// `reason`; with None it prints `skipping: <reason>` to stderr.
#[track_caller]
pub fn skip_or_fail_if(required_by: Option<&str>, reason: &str) {
    if let Some(by) = required_by {
        panic!("prerequisite missing ({by}): {reason}");
    }
    eprintln!("skipping: {reason}");
}

/// `path` when the file is there; otherwise [`skip_or_fail`] with
/// `"<path> is missing (<how>)"` (how to get it: `run scripts/fetch-model.sh`), and None.
#[track_caller]
pub fn fetched(path: PathBuf, how: &str) -> Option<PathBuf> {
    if path.is_file() {
        return Some(path);
    }
    skip_or_fail(&format!("{} is missing ({how})", path.display()));
    None
}

// ---- the models ----

/// The source tree (`CARGO_MANIFEST_DIR`).
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The model file `name` in models/ (whether or not it has been fetched).
pub fn model_file(name: &str) -> PathBuf {
    root().join("models").join(name)
}

/// How the default model is fetched (for [`fetched`]).
pub const FETCH_MODEL: &str = "run scripts/fetch-model.sh";
/// How Qwen2.5 Coder 0.5B and Gemma 3 270M are fetched.
pub const FETCH_EXTRA_MODELS: &str = "run scripts/fetch-extra-models.sh";
/// How Qwen2.5 Coder 1.5B is fetched.
pub const FETCH_SPEC_MODELS: &str = "run scripts/fetch-spec-models.sh";

/// The default model (SmolLM2 135M Instruct, Q4_1): its path, whether or not it has been
/// fetched ([`FETCH_MODEL`]). A test that cannot run without it fails on its absence; one that
/// skips instead asks `fetched(model_path(), FETCH_MODEL)`.
pub fn model_path() -> PathBuf {
    model_file("SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// Qwen2.5 Coder 0.5B Instruct, Q4_K_M ([`FETCH_EXTRA_MODELS`]): the tool, reasoning and
/// other-vocabulary tests' model, and the draft of the speculative tests.
pub fn qwen_path() -> PathBuf {
    model_file("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
}

/// Gemma 3 270M, Q4_K_M ([`FETCH_EXTRA_MODELS`]).
pub fn gemma3_path() -> PathBuf {
    model_file("gemma-3-270m-q4_k_m.gguf")
}

/// Qwen2.5 Coder 1.5B Instruct, Q4_K_M ([`FETCH_SPEC_MODELS`]): the target of the
/// speculative tests with a draft model.
pub fn qwen_1_5b_path() -> PathBuf {
    model_file("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
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
    MODEL.get_or_init(|| {
        let path = model_path();
        assert!(
            path.is_file(),
            "{} is missing: {FETCH_MODEL}",
            path.display()
        );
        Arc::new(Model::load(&path).expect("the default model loads"))
    })
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
        mask_budget_ms: EngineConfig::DEFAULT_MASK_BUDGET_MS,
        kv_types: edge_llm::kernels::KvTypes::F16,
        num_state_slots: 0,
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
            Event::Prompt { .. } | Event::Embedding { .. } => {}
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
    let p = root().join("tests/reference/llamacpp-smollm2.json");
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
            Event::Prompt { .. } | Event::Embedding { .. } => {}
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

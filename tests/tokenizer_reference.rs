//! The tokenizer against llama.cpp: every `tokenize` entry and every greedy prompt of
//! `../shared/reference/llamacpp-<model>.json` must encode to exactly llama.cpp's ids; decode
//! and `StreamDecoder` must give the text back. `EXTRA_CASES` adds edge cases with ids from the
//! same llama.cpp build, and the end-of-generation sets are compared too.
//!
//! The default model (SmolLM2, `scripts/fetch-model.sh`) is required. Qwen2 and Gemma 3
//! (`scripts/fetch-extra-models.sh`) are checked when their files are in `models/`, and
//! skipped with a message otherwise (a failure under CI=true).

mod support;

use std::path::{Path, PathBuf};

use edge_llm::gguf::GgufFile;
use edge_llm::tokenizer::{StreamDecoder, Tokenizer};
use serde_json::Value;
use support::{gemma3_path, model_path, qwen_path, root, skip_or_fail};

fn reference(name: &str) -> Value {
    let path = root().join("tests/reference").join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

fn load(path: &Path) -> Option<Tokenizer> {
    if !path.exists() {
        return None;
    }
    let gguf = GgufFile::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Some(Tokenizer::from_gguf(&gguf).unwrap_or_else(|e| panic!("{}: {e:#}", path.display())))
}

fn smollm2() -> Tokenizer {
    load(&model_path())
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

/// Edge cases the shared reference does not cover: CRLF, whitespace runs, contractions in
/// mixed case, special tokens of all three vocabularies side by side, combining marks, emoji
/// sequences, control chars, code. Ids from llama.cpp 0c1e57098 (the copy vendored in
/// llama-cpp-python 0.3.36, vocab-only load, `llama_tokenize(add_special = true)`, so with
/// BOS for Gemma 3), per model: [smollm2, qwen2, gemma3].
const EXTRA_CASES: &[(&str, bool, [&[u32]; 3])] = &[
    (
        "a\r\nb\r\n\r\n  c",
        true,
        [
            &[81, 201, 198, 82, 18682, 216, 265],
            &[64, 319, 65, 871, 220, 272],
            &[2, 236746, 251, 107, 236763, 251, 107, 251, 107, 138, 236755],
        ],
    ),
    (
        "  \n\n  x  \t\t y   ",
        true,
        [
            &[256, 8866, 1792, 256, 1656, 329, 333],
            &[18611, 220, 856, 35329, 379, 262],
            &[2, 138, 108, 138, 236781, 138, 255969, 570, 139],
        ],
    ),
    (
        "I'm can't WE'LL they'RE you'd",
        true,
        [
            &[
                57, 5248, 416, 982, 26587, 23, 16421, 502, 23, 3256, 346, 6737,
            ],
            &[40, 2776, 646, 944, 19677, 6, 4086, 807, 94153, 498, 4172],
            &[
                2, 236777, 236789, 236757, 740, 236789, 236745, 19716, 236789, 2182, 901, 236789,
                1357, 611, 236789, 236753,
            ],
        ],
    ),
    (
        "x<|im_start|><|im_end|>y <|im_end|> ",
        true,
        [
            &[104, 1, 2, 105, 216, 2, 216],
            &[87, 151644, 151645, 88, 220, 151645, 220],
            &[
                2, 236781, 236820, 236909, 548, 236779, 3041, 236909, 1798, 236909, 548, 236779,
                643, 111038, 236762, 655, 236909, 548, 236779, 643, 111038, 236743,
            ],
        ],
    ),
    (
        "<|im_start|>system\n<tool_call>{}</tool_call><|im_end|>",
        true,
        [
            &[
                1, 9690, 198, 44, 19324, 79, 4350, 46, 6150, 9617, 19324, 79, 4350, 46, 2,
            ],
            &[151644, 8948, 198, 151657, 6257, 151658, 151645],
            &[
                2, 236820, 236909, 548, 236779, 3041, 111038, 9731, 107, 236820, 13205, 236779,
                6639, 236813, 16454, 954, 13205, 236779, 6639, 1798, 236909, 548, 236779, 643,
                111038,
            ],
        ],
    ),
    (
        "<|im_start|>system\n<tool_call>{}</tool_call><|im_end|>",
        false,
        [
            &[
                44, 108, 306, 79, 3738, 108, 46, 9690, 198, 44, 19324, 79, 4350, 46, 6150, 9617,
                19324, 79, 4350, 21198, 108, 306, 79, 486, 108, 46,
            ],
            &[
                27, 91, 318, 4906, 91, 29, 8948, 198, 151657, 6257, 151658, 27, 91, 318, 6213, 91,
                29,
            ],
            &[
                2, 236820, 236909, 548, 236779, 3041, 111038, 9731, 107, 236820, 13205, 236779,
                6639, 236813, 16454, 954, 13205, 236779, 6639, 1798, 236909, 548, 236779, 643,
                111038,
            ],
        ],
    ),
    (
        "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
        true,
        [
            &[
                44, 3738, 79, 1714, 79, 20589, 46, 4093, 198, 6004, 44, 486, 79, 1714, 79, 20589,
                46, 198, 44, 3738, 79, 1714, 79, 20589, 46, 3980, 198,
            ],
            &[
                27, 2468, 3575, 37274, 29, 872, 198, 6023, 27, 408, 3575, 37274, 397, 27, 2468,
                3575, 37274, 29, 2528, 198,
            ],
            &[2, 105, 2364, 107, 2202, 106, 107, 105, 4368, 107],
        ],
    ),
    (
        "<start_of_turn>user\nhi<end_of_turn>\n",
        false,
        [
            &[
                44, 3738, 79, 1714, 79, 20589, 46, 4093, 198, 6004, 44, 486, 79, 1714, 79, 20589,
                46, 198,
            ],
            &[
                27, 2468, 3575, 37274, 29, 872, 198, 6023, 27, 408, 3575, 37274, 397,
            ],
            &[
                2, 236820, 3041, 236779, 1340, 236779, 887, 236813, 2364, 107, 2202, 236820, 643,
                236779, 1340, 236779, 887, 236813, 107,
            ],
        ],
    ),
    (
        "<bos><eos><unk><pad><mask>[multimodal]",
        true,
        [
            &[
                44, 34761, 21198, 85, 395, 21198, 5131, 21198, 16384, 21198, 8836, 46, 75, 10593,
                306, 32058, 77,
            ],
            &[
                33177, 436, 1784, 84399, 1784, 3122, 1784, 13242, 1784, 11258, 30768, 25875, 318,
                57597, 60,
            ],
            &[2, 2, 1, 3, 0, 4, 5],
        ],
    ),
    (
        "<bos><eos><unk><pad><mask>[multimodal]",
        false,
        [
            &[
                44, 34761, 21198, 85, 395, 21198, 5131, 21198, 16384, 21198, 8836, 46, 75, 10593,
                306, 32058, 77,
            ],
            &[
                33177, 436, 1784, 84399, 1784, 3122, 1784, 13242, 1784, 11258, 30768, 25875, 318,
                57597, 60,
            ],
            &[
                2, 236820, 46757, 1798, 211827, 1798, 4984, 1798, 13039, 1798, 1080, 236813, 5,
            ],
        ],
    ),
    (
        "▁▁ <0x41>\u{a0}\u{3000}\u{2009}x",
        true,
        [
            &[
                11007, 219, 11007, 219, 2067, 32, 104, 36, 33, 46, 15442, 12109, 218, 321, 227, 104,
            ],
            &[
                10417, 223, 10417, 223, 366, 15, 87, 19, 16, 29, 4102, 22441, 378, 231, 87,
            ],
            &[
                2, 236743, 236743, 655, 236771, 236781, 236812, 236770, 236813, 432, 398, 465, 366,
                366, 464, 366, 375, 236781,
            ],
        ],
    ),
    (
        "e\u{301} a\u{308} क\u{94d}ष ก\u{e31} ﬁ İ ς",
        true,
        [
            &[
                85, 151, 219, 253, 151, 226, 42034, 16525, 4300, 132, 216, 10283, 219, 10283, 126,
                40367, 24488, 125, 11446, 220,
            ],
            &[
                68, 53839, 264, 136, 230, 47809, 30484, 115, 126675, 23271, 32495, 70731, 38421,
                17383, 224,
            ],
            &[
                2, 236744, 238288, 496, 241151, 9251, 5363, 237083, 97940, 11732, 236743, 237220,
            ],
        ],
    ),
    (
        "👍🏽 ❤\u{fe0f} 🇯🇵 👨\u{200d}👩\u{200d}👧 \u{200b}\u{feff}",
        true,
        [
            &[
                10813, 235, 231, 10813, 233, 138, 4636, 247, 114, 31752, 15107, 225, 124, 10813,
                225, 130, 15107, 235, 118, 321, 231, 10813, 235, 119, 321, 231, 10813, 235, 117,
                459, 229, 186, 136, 140,
            ],
            &[
                144349, 145375, 70470, 30543, 11162, 229, 107, 145516, 61804, 101, 378, 235,
                145233, 378, 235, 145665, 29748, 3225,
            ],
            &[
                2, 240493, 242713, 64813, 236743, 247994, 245707, 236743, 243874, 237243, 243767,
                237243, 244814, 36504, 237922,
            ],
        ],
    ),
    (
        "٣ ² ½ Ⅻ 12345678901 0.5e-3 1,000,000",
        true,
        [
            &[
                164, 113, 216, 19133, 216, 16738, 216, 173, 223, 121, 216, 33, 34, 35, 36, 37, 38,
                39, 40, 41, 32, 33, 216, 32, 30, 37, 85, 29, 35, 216, 33, 28, 32, 32, 32, 28, 32,
                32, 32,
            ],
            &[
                149, 96, 220, 29456, 220, 26062, 220, 70467, 104, 220, 16, 17, 18, 19, 20, 21, 22,
                23, 24, 15, 16, 220, 15, 13, 20, 68, 12, 18, 220, 16, 11, 15, 15, 15, 11, 15, 15,
                15,
            ],
            &[
                2, 242044, 145191, 47041, 236743, 464, 371, 409, 236743, 236770, 236778, 236800,
                236812, 236810, 236825, 236832, 236828, 236819, 236771, 236770, 236743, 236771,
                236761, 236810, 236744, 236772, 236800, 236743, 236770, 236764, 236771, 236771,
                236771, 236764, 236771, 236771, 236771,
            ],
        ],
    ),
    (
        "\u{0}\u{7f}\u{b}\u{c} end",
        true,
        [
            &[190, 217, 199, 200, 1112],
            &[188, 221, 199, 200, 835],
            &[2, 238, 251541, 249, 250, 1345],
        ],
    ),
    (
        "fn main() {\n    let x = vec![1, 2, 3];\n    println!(\"{x:?}\");\n}\n",
        true,
        [
            &[
                7853, 1085, 1000, 1662, 472, 1303, 1792, 446, 37024, 21653, 33, 28, 216, 34, 28,
                216, 35, 26695, 472, 1628, 34115, 17, 45257, 104, 42, 47, 15201, 43, 198, 109, 198,
            ],
            &[
                8822, 1887, 368, 341, 262, 1077, 856, 284, 7486, 20703, 16, 11, 220, 17, 11, 220,
                18, 935, 262, 13751, 88928, 87, 76475, 20305, 532,
            ],
            &[
                2, 15059, 1689, 825, 642, 107, 140, 1184, 1123, 578, 23454, 24960, 236770, 236764,
                236743, 236778, 236764, 236743, 236800, 2312, 107, 140, 4629, 196439, 236781,
                236787, 236881, 51324, 107, 236783, 107,
            ],
        ],
    ),
    (
        "                                        ",
        true,
        [&[12427, 353], &[12841], &[2, 167, 145]],
    ),
    (
        "\n\n\n\n\n\n\n\n\n\n\n\n",
        true,
        [&[22342, 22342, 22342], &[45128], &[2, 118]],
    ),
    (
        "\t\t\t\tindent",
        true,
        [
            &[27655, 197, 32166],
            &[571, 197, 32840],
            &[2, 255971, 32699],
        ],
    ),
    (
        "THE END OF TERMS AND CONDITIONS",
        true,
        [
            &[15964, 36588, 6016, 312, 1754, 5247, 7485, 26819],
            &[17229, 11176, 3008, 98928, 3567, 11342],
            &[2, 10557, 21734, 3639, 158238, 4715, 48081],
        ],
    ),
];

/// Checks `EXTRA_CASES` for model column `column`; returns (checked, mismatches).
fn check_extra_cases(tok: &Tokenizer, column: usize) -> (usize, Vec<String>) {
    let mut failures = Vec::new();
    for (text, parse_special, ids) in EXTRA_CASES {
        let got = tok
            .encode(text, tok.add_bos_default(), *parse_special)
            .unwrap();
        if got != ids[column] {
            failures.push(format!(
                "{text:?} (parse_special={parse_special}):\n  got  {got:?}\n  want {:?}",
                ids[column]
            ));
        }
    }
    (EXTRA_CASES.len(), failures)
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
fn smollm2_matches_llama_cpp_on_edge_cases() {
    let (checked, failures) = check_extra_cases(&smollm2(), 0);
    report("smollm2 edge cases", checked, &failures);
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
    // llama.cpp's set: <|endoftext|>, <|im_end|>, and <reponame> (a fill-in-the-middle
    // repo-name token by its text).
    assert_eq!(tok.eog_ids(), &[0, 2, 4]);
    assert_eq!(tok.token_bytes(1), b"<|im_start|>");
    assert_eq!(tok.token_bytes(198), b"\n");
    assert_eq!(tok.decode(&[1, 4093, 198]), "<|im_start|>user\n");
    // Ids outside the vocabulary decode to nothing rather than panicking.
    assert_eq!(tok.token_bytes(u32::MAX), b"");
    assert_eq!(tok.token_text(u32::MAX), "");
}

/// Runs the reference for an extra model when its file was fetched.
/// `eog` is llama.cpp's end-of-generation set for the model (`llama_vocab_is_eog` over the
/// whole vocabulary, same build as `EXTRA_CASES`).
fn extra_model(model: &str, path: PathBuf, reference_file: &str, column: usize, eog: &[u32]) {
    let Some(tok) = load(&path) else {
        // Under CI=true a missing prerequisite is a failure, never a silent pass.
        skip_or_fail(&format!(
            "model not fetched ({}; run scripts/fetch-extra-models.sh {model})",
            path.display()
        ));
        return;
    };
    let reference = reference(reference_file);
    let (checked, failures) = check_reference(&tok, &reference);
    check_round_trips(&tok, &reference);
    for text in ["日本語のテキスト", "emoji 🎉🚀 test"] {
        check_stream(&tok, text);
    }
    report(model, checked, &failures);
    assert_eq!(tok.eog_ids(), eog, "{model}: end-of-generation ids");
    let (checked, failures) = check_extra_cases(&tok, column);
    report(&format!("{model} edge cases"), checked, &failures);
}

#[test]
fn qwen2_matches_llama_cpp_ids() {
    extra_model(
        "qwen2",
        qwen_path(),
        "llamacpp-qwen2.json",
        1,
        // </s> (a normal token here, EOG by its text), <|endoftext|>, <|im_end|>, and the
        // fill-in-the-middle pad, repo-name and file-separator tokens.
        &[128247, 151643, 151645, 151662, 151663, 151664],
    );
}

#[test]
fn gemma3_matches_llama_cpp_ids() {
    extra_model(
        "gemma3",
        gemma3_path(),
        "llamacpp-gemma3.json",
        2,
        // <eos>, <end_of_turn>, and </s> (EOG by its text).
        &[1, 106, 212],
    );
}

/// A long real text (the GPL-3 shipped with Debian, 35 KB) decodes back to itself on every
/// model that is there, and encodes in well under a second.
#[test]
fn gpl3_round_trips_on_every_fetched_model() {
    let Ok(text) = std::fs::read_to_string("/usr/share/common-licenses/GPL-3") else {
        skip_or_fail("/usr/share/common-licenses/GPL-3 not found (Debian's base-files)");
        return;
    };
    for path in [model_path(), qwen_path(), gemma3_path()] {
        let Some(tok) = load(&path) else { continue };
        let file = path.file_name().unwrap().to_string_lossy();
        let started = std::time::Instant::now();
        let ids = tok.encode(&text, false, true).unwrap();
        let elapsed = started.elapsed();
        println!(
            "{file}: {} bytes -> {} tokens in {elapsed:?}",
            text.len(),
            ids.len()
        );
        assert_eq!(tok.decode(&ids), text);
    }
}

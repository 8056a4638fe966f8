//! Byte-level BPE (`tokenizer.ggml.model = gpt2`) built on the `tokenizers` crate: the
//! pre-tokenizer regexes llama.cpp picks for each `tokenizer.ggml.pre`, the GPT-2 byte-to-char
//! alphabet, and the BPE model from the GGUF's tokens and ranked merges.
//!
//! `Tokenizer` (mod.rs) builds a `BpeEncoder` once and calls `encode` on each stretch of plain
//! text between special tokens; `vocab.rs` asks `pre_add_bos_default`; the decoders call
//! `byte_level_decode`.
//!
//! Known divergence: the regexes classify chars with the `regex` crate's Unicode 16 tables,
//! llama.cpp with its own older ones. Chars unassigned in llama.cpp's tables (new in Unicode
//! 16, e.g. Egyptian Hieroglyphs Extended-A, or unassigned anywhere) can split differently;
//! assigned text, private-use chars and Unicode 15/16 emoji were checked to agree.

use std::sync::OnceLock;

use anyhow::{anyhow, bail, Context, Result};
use tokenizers::models::bpe::{Vocab as BpeVocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{
    Model, OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer, SplitDelimiterBehavior,
};

use super::vocab::Vocab;

/// GPT-2's pattern as llama.cpp writes it. llama.cpp runs it through a hand-written matcher
/// that also takes a whitespace run not followed by a letter as one piece, which the
/// trailing `|\s+` spells out for a regex engine.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama 3's pattern with the case-insensitive contractions spelled out (llama.cpp's form).
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's pattern: Llama 3's with single digits.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GPT-4o's (o200k: gpt-oss, Llama 4) pattern as llama.cpp writes it: a letter run is an
/// optional lead char, then letters other than a-z, then letters other than A-Z (or the
/// reverse), then an optional contraction; digits in runs of up to three; punctuation runs
/// keep trailing newlines and slashes. llama.cpp runs it over text whose non-ASCII chars are
/// collapsed to one char per category, so a non-ASCII letter counts as neither a-z nor A-Z and
/// a combining mark (`\p{M}`) is no letter: the same as this regex over the real chars.
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5's pattern: Qwen2's with combining marks (`\p{M}`) kept with the letters.
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How one family of `tokenizer.ggml.pre` names pre-tokenizes, from llama-vocab.cpp.
struct PreTokenizerSpec {
    /// Applied in order, each splitting the pieces the previous one left (matches and the
    /// text between them both become pieces).
    regexes: &'static [&'static str],
    /// Look a whole piece up in the vocabulary before merging (Llama 3 family).
    ignore_merges: bool,
    /// llama.cpp's `add_bos` default for this family when `tokenizer.ggml.add_bos_token` is
    /// absent.
    add_bos: bool,
}

/// The pre-tokenizer for a `tokenizer.ggml.pre` name. A missing name is llama.cpp's
/// `default` (which warns that quality will suffer); a name llama.cpp does not know, or one
/// whose pattern edge-llm does not carry yet, is an error naming the key.
fn pre_tokenizer_spec(pre: Option<&str>) -> Result<PreTokenizerSpec> {
    let spec = |regexes, ignore_merges, add_bos| PreTokenizerSpec {
        regexes,
        ignore_merges,
        add_bos,
    };
    Ok(match pre.unwrap_or("default") {
        "default" => spec(
            &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
            false,
            false,
        ),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" => spec(&[LLAMA3], true, true),
        "dbrx" | "smaug-bpe" => spec(&[LLAMA3], false, false),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "modern-bert" | "mpt" | "olmo" | "jais" | "trillion"
        | "granite-docling" | "exaone4" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" => {
            spec(&[GPT2], false, false)
        }
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b"
        | "mellum2" => spec(&[r"\p{N}", GPT2], false, false),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" | "stablelm2" | "hunyuan" => {
            spec(&[QWEN2], false, false)
        }
        "gpt-4o" | "llama4" | "kanana2" | "talkie" => spec(&[GPT4O], false, false),
        "qwen35" => spec(&[QWEN35], false, false),
        "falcon" => spec(
            &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"],
            false,
            false,
        ),
        other => bail!(
            "unsupported tokenizer.ggml.pre '{other}' for a gpt2 vocabulary: edge-llm knows \
             default, llama3 (llama-bpe), gpt-2, smollm (starcoder, refact, command-r), \
             qwen2, qwen35, gpt-4o (llama4) and falcon"
        ),
    })
}

/// llama.cpp's `add_bos` default for a byte-level BPE vocabulary with this pre-tokenizer.
pub(crate) fn pre_add_bos_default(pre: Option<&str>) -> bool {
    pre_tokenizer_spec(pre).is_ok_and(|s| s.add_bos)
}

/// Plain text to token ids for a `gpt2` vocabulary.
pub(crate) struct BpeEncoder {
    pre_tokenizer: PreTokenizerWrapper,
    model: BPE,
}

impl BpeEncoder {
    pub fn new(vocab: &Vocab, pre: Option<&str>, merges: &[String]) -> Result<BpeEncoder> {
        let spec = pre_tokenizer_spec(pre)?;
        let mut steps = Vec::with_capacity(spec.regexes.len() + 1);
        for regex in spec.regexes {
            let split = Split::new(
                SplitPattern::Regex(regex.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| anyhow!("pre-tokenizer regex {regex:?}: {e}"))?;
            steps.push(PreTokenizerWrapper::Split(split));
        }
        // Bytes to the GPT-2 alphabet, no prefix space, no regex of its own.
        steps.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(
            false, false, false,
        )));
        let pre_tokenizer = PreTokenizerWrapper::Sequence(Sequence::new(steps));

        let bpe_vocab: BpeVocab = vocab
            .texts
            .iter()
            .enumerate()
            .map(|(id, text)| (text.clone(), id as u32))
            .collect();
        // Merges are "left right", split at the first space after the first byte (as
        // llama.cpp does). The first occurrence of a pair keeps its rank; pairs whose parts
        // or result are not tokens cannot produce a token and are dropped (the `tokenizers`
        // BPE refuses them).
        let mut seen = std::collections::HashSet::with_capacity(merges.len());
        let mut pairs = Vec::with_capacity(merges.len());
        for merge in merges {
            let Some(pos) = merge.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1) else {
                continue;
            };
            let (left, right) = (&merge[..pos], &merge[pos + 1..]);
            let merged = format!("{left}{right}");
            if vocab.id_of(left).is_none()
                || vocab.id_of(right).is_none()
                || vocab.id_of(&merged).is_none()
            {
                continue;
            }
            if seen.insert((left, right)) {
                pairs.push((left.to_string(), right.to_string()));
            }
        }
        let model = BPE::builder()
            .vocab_and_merges(bpe_vocab, pairs)
            .ignore_merges(spec.ignore_merges)
            .build()
            .map_err(|e| anyhow!("building the BPE model from tokenizer.ggml.merges: {e}"))?;
        Ok(BpeEncoder {
            pre_tokenizer,
            model,
        })
    }

    /// Appends the ids of `text` (plain text, no special tokens in it) to `out`.
    pub fn encode(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        if text.is_empty() {
            return Ok(());
        }
        let mut pieces = PreTokenizedString::from(text);
        self.pre_tokenizer
            .pre_tokenize(&mut pieces)
            .map_err(|e| anyhow!("pre-tokenizing {} bytes of text: {e}", text.len()))?;
        for (piece, _, _) in pieces.get_splits(OffsetReferential::Original, OffsetType::None) {
            let tokens = self
                .model
                .tokenize(piece)
                .map_err(|e| anyhow!("BPE on piece {piece:?}: {e}"))
                .context("encoding text")?;
            out.extend(tokens.iter().map(|t| t.id));
        }
        Ok(())
    }
}

/// GPT-2's byte-to-char table: printable bytes stand for themselves, the other 68 take the
/// chars from U+0100 on, in byte order. Index: char code; value: the byte, or -1.
fn char_to_byte_table() -> &'static [i16; 324] {
    static TABLE: OnceLock<[i16; 324]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = [-1i16; 324];
        let mut next = 256usize;
        for b in 0..=255u8 {
            let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
            let c = if printable {
                b as usize
            } else {
                next += 1;
                next - 1
            };
            table[c] = b as i16;
        }
        table
    })
}

/// The char that stands for `byte` in GPT-2's byte-level alphabet.
pub(crate) fn byte_to_char(byte: u8) -> char {
    let table = char_to_byte_table();
    let code = table
        .iter()
        .position(|&b| b == byte as i16)
        .expect("every byte has a char");
    char::from_u32(code as u32).expect("codes below 324 are chars")
}

/// A token in the byte-level alphabet back to the bytes it stands for. A char outside the
/// alphabet (not seen in real vocabularies) is kept as its UTF-8 bytes.
pub(crate) fn byte_level_decode(text: &str, out: &mut Vec<u8>) {
    let table = char_to_byte_table();
    for c in text.chars() {
        match table.get(c as usize) {
            Some(&b) if b >= 0 => out.push(b as u8),
            _ => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_alphabet_round_trips() {
        let mut out = Vec::new();
        byte_level_decode("ĠhelloĊ", &mut out);
        assert_eq!(out, b" hello\n");
        out.clear();
        // U+0100 is byte 0, U+0143 the last of the 68 shifted bytes (0xAD).
        byte_level_decode("\u{100}\u{143}", &mut out);
        assert_eq!(out, [0x00, 0xAD]);
    }

    #[test]
    fn unknown_pre_is_an_error_naming_the_key() {
        let err = pre_tokenizer_spec(Some("no-such-pre")).err().unwrap();
        assert!(err.to_string().contains("tokenizer.ggml.pre"));
        assert!(pre_tokenizer_spec(None).is_ok());
        assert!(pre_add_bos_default(Some("llama-bpe")));
        assert!(!pre_add_bos_default(Some("smollm")));
    }
}

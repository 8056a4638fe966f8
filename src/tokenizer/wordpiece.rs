//! WordPiece (`tokenizer.ggml.model` = `bert`), as llama.cpp's `llm_tokenizer_wpm` does it.
//!
//! The text is split into words: each code point is decomposed to its first code point (llama.cpp's
//! one-code-point NFD) and its accent marks dropped when accents are stripped, lowercased when
//! the vocabulary asks; whitespace ends a word, NUL, U+FFFD and control characters vanish, and
//! each punctuation mark, ASCII symbol and CJK ideograph is a word of its own. Each word, with
//! the phantom space `▁` before it, is then covered greedily by the longest vocabulary entry
//! (byte-wise, as llama.cpp compares): the converter stores a word start as `▁word` and a
//! continuation `##ing` as `ing`. A word that cannot be covered entirely becomes the unknown
//! token. The code point tables are llama.cpp's (`wpm_unicode.rs`, generated).
//!
//! Called by `Tokenizer::encode` (mod.rs) for each stretch of text between special tokens.

use super::vocab::Vocab;
use super::wpm_unicode as uni;

/// The normalizer options of a vocabulary (`tokenizer.ggml.normalizer.*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Normalizer {
    pub lowercase: bool,
    pub strip_accents: bool,
}

/// Appends the ids of `text` to `out`.
pub(crate) fn encode(
    vocab: &Vocab,
    norm: Normalizer,
    max_token_len: usize,
    text: &str,
    out: &mut Vec<u32>,
) {
    let mut word1 = String::new();
    for word in words(text, norm) {
        word1.clear();
        word1.push('▁');
        word1.push_str(&word);
        let bytes = word1.as_bytes();
        let n = bytes.len();
        let start = out.len();
        let mut i = 0;
        while i < n {
            let longest = (i + 1..=n.min(i + max_token_len))
                .rev()
                .find_map(|j| Some((j, vocab.id_of(std::str::from_utf8(&bytes[i..j]).ok()?)?)));
            match longest {
                Some((j, id)) => {
                    out.push(id);
                    i = j;
                }
                None => {
                    out.truncate(start);
                    break;
                }
            }
        }
        if out.len() == start {
            out.extend(vocab.unk_id);
        }
    }
}

/// The words of `text` after normalization (llama.cpp's `preprocess`), none empty.
fn words(text: &str, norm: Normalizer) -> Vec<String> {
    let mut words = vec![String::new()];
    for c in text.chars() {
        let cpt = if norm.strip_accents {
            nfd_first(c as u32)
        } else {
            c as u32
        };
        let class = class_of(cpt);
        if class & uni::WHITESPACE != 0 {
            if !words.last().is_some_and(String::is_empty) {
                words.push(String::new());
            }
            continue;
        }
        if cpt == 0 || cpt == 0xFFFD || class & uni::CONTROL != 0 {
            continue;
        }
        if norm.strip_accents && class & uni::ACCENT_MARK != 0 {
            continue;
        }
        let shown = if norm.lowercase { lowercase(cpt) } else { cpt };
        let Some(s) = char::from_u32(shown) else {
            continue;
        };
        let alone = class & uni::PUNCTUATION != 0
            || (cpt < 0x7F && class & uni::SYMBOL != 0)
            || is_chinese_char(cpt);
        let last = words.last_mut().expect("never empty");
        if alone {
            if !last.is_empty() {
                words.push(String::new());
            }
            let last = words.last_mut().expect("never empty");
            last.clear();
            last.push(s);
            words.push(String::new());
        } else {
            last.push(s);
        }
    }
    words.retain(|w| !w.is_empty());
    words
}

/// The class bits of `cpt` (`uni::WHITESPACE`, ...).
fn class_of(cpt: u32) -> u8 {
    let i = uni::CLASS_RUNS.partition_point(|&(start, _)| start <= cpt);
    uni::CLASS_RUNS[i.saturating_sub(1)].1
}

/// llama.cpp's `unicode_tolower`: the mapped code point, else `cpt`.
fn lowercase(cpt: u32) -> u32 {
    match uni::LOWERCASE.binary_search_by_key(&cpt, |&(from, _)| from) {
        Ok(i) => uni::LOWERCASE[i].1,
        Err(_) => cpt,
    }
}

/// llama.cpp's `unicode_cpts_normalize_nfd` for one code point: the first code point of its
/// decomposition, else itself.
fn nfd_first(cpt: u32) -> u32 {
    let i = uni::NFD.partition_point(|&(first, _, _)| first <= cpt);
    match uni::NFD.get(i.wrapping_sub(1)) {
        Some(&(first, last, to)) if first <= cpt && cpt <= last => to,
        _ => cpt,
    }
}

/// The CJK ranges llama.cpp (after Hugging Face's BertPreTokenizer) makes single-character words.
fn is_chinese_char(cpt: u32) -> bool {
    matches!(cpt,
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        | 0x2B920..=0x2CEAF
        | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNCASED: Normalizer = Normalizer {
        lowercase: true,
        strip_accents: true,
    };

    #[test]
    fn words_split_on_space_punctuation_and_cjk_and_strip_accents() {
        assert_eq!(
            words("  Héllo,\tWORLD 你好 a+b\u{7}!  ", UNCASED),
            ["hello", ",", "world", "你", "好", "a", "+", "b", "!"]
        );
        let cased = Normalizer {
            lowercase: false,
            strip_accents: false,
        };
        assert_eq!(words("Héllo 🎉x", cased), ["Héllo", "🎉x"]);
        assert!(words("", UNCASED).is_empty());
    }

    #[test]
    fn longest_pieces_first_and_unknown_words_whole() {
        use super::super::vocab::VocabMeta;
        let tokens = [
            "[PAD]", "[UNK]", "[CLS]", "[SEP]", "▁un", "aff", "able", "▁una", "▁hello",
        ];
        let vocab = Vocab::new(&VocabMeta {
            model: "bert".into(),
            tokens: tokens.iter().map(|t| t.to_string()).collect(),
            token_types: Some(vec![3, 3, 3, 3, 1, 1, 1, 1, 1]),
            unk_id: Some(1),
            bos_id: Some(2),
            sep_id: Some(3),
            ..Default::default()
        })
        .unwrap();
        let mut out = Vec::new();
        // "▁una" is longer than "▁un" but leaves "ffable", which has no piece: the longest match
        // is taken without looking back, so the word becomes [UNK]; "xyz" has no piece at all.
        encode(
            &vocab,
            UNCASED,
            vocab.max_token_len,
            "Unaffable HELLO xyz",
            &mut out,
        );
        assert_eq!(out, [1, 8, 1]);
        out.clear();
        encode(&vocab, UNCASED, vocab.max_token_len, "un aff", &mut out);
        assert_eq!(out, [4, 1]);
    }

    #[test]
    fn tables_agree_with_known_code_points() {
        assert_eq!(nfd_first('é' as u32), 'e' as u32);
        assert_eq!(nfd_first('x' as u32), 'x' as u32);
        assert_eq!(lowercase('Ä' as u32), 'ä' as u32);
        assert_ne!(class_of(0x301) & uni::ACCENT_MARK, 0);
        assert_ne!(class_of(0x3000) & uni::WHITESPACE, 0);
        assert_eq!(class_of('a' as u32), 0);
    }
}

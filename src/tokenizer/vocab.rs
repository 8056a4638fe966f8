//! The token table of a GGUF vocabulary: texts, attributes, scores, special token ids and the
//! end-of-generation set, settled the way llama.cpp's `llama_vocab::impl::load` settles them.
//!
//! `Tokenizer::from_gguf` (mod.rs) fills a `VocabMeta` from the file's `tokenizer.ggml.*` keys
//! and calls `Vocab::new`; the encoders (`bpe.rs`, `spm.rs`, `special.rs`) and the decoders
//! read the result. Nothing here touches the GGUF reader, so it is testable on its own.

use std::collections::HashMap;

use anyhow::{bail, Result};

use super::wordpiece::Normalizer;

/// Token attributes, a bit set as in llama.cpp's `llama_token_attr` (a token can be both
/// CONTROL and UNUSED, e.g. Gemma's `<unused0>`).
pub(crate) mod attr {
    pub const UNDEFINED: u8 = 0;
    pub const NORMAL: u8 = 1 << 0;
    pub const UNKNOWN: u8 = 1 << 1;
    pub const CONTROL: u8 = 1 << 2;
    pub const USER_DEFINED: u8 = 1 << 3;
    pub const UNUSED: u8 = 1 << 4;
    pub const BYTE: u8 = 1 << 5;

    /// `tokenizer.ggml.token_type` value (1 normal, 2 unknown, 3 control, 4 user-defined,
    /// 5 unused, 6 byte) to attribute bits; anything else is UNDEFINED, as in llama.cpp.
    pub fn from_token_type(token_type: i32) -> u8 {
        match token_type {
            1 => NORMAL,
            2 => UNKNOWN,
            3 => CONTROL,
            4 => USER_DEFINED,
            5 => UNUSED,
            6 => BYTE,
            _ => UNDEFINED,
        }
    }
}

/// Which tokenizer algorithm the vocabulary is for (`tokenizer.ggml.model`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum VocabKind {
    /// `gpt2`: byte-level BPE with ranked merges and a regex pre-tokenizer.
    Bpe,
    /// `llama`: SentencePiece-style BPE driven by token scores, `▁` for spaces, byte fallback.
    Spm,
    /// `bert`: WordPiece, greedy longest match over `▁`-prefixed words (`wordpiece.rs`).
    Wpm,
}

/// The tokenizer metadata of a GGUF file, as read; `None` where the key is absent.
#[derive(Clone, Debug, Default)]
pub(crate) struct VocabMeta {
    pub model: String,
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    pub token_types: Option<Vec<i32>>,
    pub scores: Option<Vec<f32>>,
    pub merges: Option<Vec<String>>,
    pub bos_id: Option<u64>,
    pub eos_id: Option<u64>,
    pub eot_id: Option<u64>,
    pub eom_id: Option<u64>,
    pub unk_id: Option<u64>,
    pub fim_pre_id: Option<u64>,
    pub fim_suf_id: Option<u64>,
    pub fim_mid_id: Option<u64>,
    pub fim_pad_id: Option<u64>,
    pub fim_rep_id: Option<u64>,
    pub fim_sep_id: Option<u64>,
    pub add_bos: Option<bool>,
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.ggml.seperator_token_id` (llama.cpp's spelling): WordPiece's `[SEP]`.
    pub sep_id: Option<u64>,
    /// `tokenizer.ggml.normalizer.lowercase` and `.strip_accents` (WordPiece).
    pub lowercase: Option<bool>,
    pub strip_accents: Option<bool>,
}

// The text lists below are llama-vocab.cpp's at the reference commit (0c1e57098).

/// Token texts llama.cpp takes as end-of-turn when `tokenizer.ggml.eot_token_id` is absent.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
/// Texts of the fill-in-the-middle prefix, suffix and middle tokens llama.cpp looks for when
/// the file names none.
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
/// Texts of fill-in-the-middle tokens that llama.cpp also counts as end-of-generation.
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
/// Token texts llama.cpp puts in the end-of-generation set whatever their ids.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];
/// gpt-oss channel markers: llama.cpp makes them user-defined so that they always render.
const ALWAYS_RENDERED_TEXTS: &[&str] =
    &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

/// The fill-in-the-middle tokens of a vocabulary (`/infill` builds its prompt from them): from
/// `tokenizer.ggml.fim_*_token_id`, else found by their text as llama.cpp finds them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FimTokens {
    pub pre: Option<u32>,
    pub suf: Option<u32>,
    pub mid: Option<u32>,
    pub pad: Option<u32>,
    pub rep: Option<u32>,
    pub sep: Option<u32>,
}

/// A loaded vocabulary. Ids are `u32` indices into `texts`.
pub(crate) struct Vocab {
    pub kind: VocabKind,
    /// Token strings as stored (byte-level alphabet for BPE, `▁` for spaces for SPM).
    pub texts: Vec<String>,
    /// `attr::*` bits per token.
    pub attrs: Vec<u8>,
    /// SPM merge priorities (higher merges first); all 0.0 when the file has none.
    pub scores: Vec<f32>,
    pub text_to_id: HashMap<String, u32>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    /// End of turn, from the file or found by its text (`<|im_end|>`, `<|eot_id|>`, ...).
    pub eot_id: Option<u32>,
    pub unk_id: Option<u32>,
    /// WordPiece's `[SEP]`, put after the text wherever `[CLS]` (BOS) is put before it.
    pub sep_id: Option<u32>,
    pub add_bos: bool,
    pub add_space_prefix: bool,
    /// WordPiece's lowercasing and accent stripping.
    pub normalizer: Normalizer,
    /// The longest token text, in bytes (WordPiece's longest match looks no further).
    pub max_token_len: usize,
    /// Sorted, deduplicated.
    pub eog_ids: Vec<u32>,
    pub fim: FimTokens,
    /// Control, user-defined and unknown tokens, longest text first (ties by id): the order
    /// in which `special::partition` cuts them out of the text, as llama.cpp does.
    pub special_ids: Vec<u32>,
}

impl Vocab {
    pub fn new(meta: &VocabMeta) -> Result<Vocab> {
        let kind = match meta.model.as_str() {
            "gpt2" => VocabKind::Bpe,
            "llama" => VocabKind::Spm,
            "bert" => VocabKind::Wpm,
            other => bail!(
                "unsupported tokenizer.ggml.model '{other}': edge-llm supports 'gpt2' (byte-level BPE), 'llama' (SentencePiece) and 'bert' (WordPiece)"
            ),
        };
        let n_tokens = meta.tokens.len();
        if n_tokens == 0 {
            bail!("tokenizer.ggml.tokens is empty");
        }
        if n_tokens > u32::MAX as usize {
            bail!("tokenizer.ggml.tokens has {n_tokens} entries, more than u32 ids can address");
        }
        if let Some(types) = &meta.token_types {
            if types.len() < n_tokens {
                bail!(
                    "tokenizer.ggml.token_type has {} entries for {n_tokens} tokens",
                    types.len()
                );
            }
        }
        if let Some(scores) = &meta.scores {
            if scores.len() < n_tokens {
                bail!(
                    "tokenizer.ggml.scores has {} entries for {n_tokens} tokens",
                    scores.len()
                );
            }
        }

        let mut texts = Vec::with_capacity(n_tokens);
        let mut text_to_id = HashMap::with_capacity(n_tokens);
        for (i, token) in meta.tokens.iter().enumerate() {
            // llama.cpp renames empty tokens so that every text is unique and non-empty.
            let text = if token.is_empty() {
                format!("[EMPTY_{i}]")
            } else {
                token.clone()
            };
            if let Some(prev) = text_to_id.insert(text.clone(), i as u32) {
                bail!("duplicate token in tokenizer.ggml.tokens: {text:?} has ids {prev} and {i}");
            }
            texts.push(text);
        }
        let mut attrs: Vec<u8> = match &meta.token_types {
            Some(types) => types[..n_tokens]
                .iter()
                .map(|&t| attr::from_token_type(t))
                .collect(),
            None => vec![attr::NORMAL; n_tokens],
        };
        let scores = match &meta.scores {
            Some(s) => s[..n_tokens].to_vec(),
            None => vec![0.0; n_tokens],
        };

        // Defaults per model type, then the file's keys (llama.cpp keeps the default when a
        // key names an id outside the vocabulary, and drops a default outside it).
        let in_range = |id: u64| (id < n_tokens as u64).then_some(id as u32);
        let (default_bos, default_eos, default_unk) = match kind {
            VocabKind::Spm => (in_range(1), in_range(2), in_range(0)),
            VocabKind::Bpe => (in_range(11), in_range(11), None),
            VocabKind::Wpm => (in_range(101), None, in_range(100)),
        };
        // BOS and EOS outside the vocabulary are refused, not replaced: a wrong EOS would end
        // every reply at once (or never), silently.
        for (key, id) in [
            ("tokenizer.ggml.bos_token_id", meta.bos_id),
            ("tokenizer.ggml.eos_token_id", meta.eos_id),
        ] {
            if let Some(id) = id.filter(|&id| id >= n_tokens as u64) {
                bail!("{key} is {id}, outside the vocabulary of {n_tokens} tokens");
            }
        }
        let pick = |key: Option<u64>, default: Option<u32>| key.and_then(in_range).or(default);
        let bos_id = pick(meta.bos_id, default_bos);
        let eos_id = pick(meta.eos_id, default_eos);
        let unk_id = pick(meta.unk_id, default_unk);
        let sep_id = match kind {
            VocabKind::Wpm => pick(meta.sep_id, in_range(102)),
            _ => pick(meta.sep_id, None),
        };
        let mut eot_id = pick(meta.eot_id, None);
        let mut eom_id = pick(meta.eom_id, None);
        let mut fim_pre_id = pick(meta.fim_pre_id, None);
        let mut fim_suf_id = pick(meta.fim_suf_id, None);
        let mut fim_mid_id = pick(meta.fim_mid_id, None);
        let mut fim_pad_id = pick(meta.fim_pad_id, None);
        let mut fim_rep_id = pick(meta.fim_rep_id, None);
        let mut fim_sep_id = pick(meta.fim_sep_id, None);

        let default_add_bos = match kind {
            VocabKind::Spm | VocabKind::Wpm => true,
            VocabKind::Bpe => super::bpe::pre_add_bos_default(meta.pre.as_deref()),
        };
        let add_bos = meta.add_bos.unwrap_or(default_add_bos);
        if add_bos && bos_id.is_none() {
            bail!(
                "tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id is not set"
            );
        }
        if kind == VocabKind::Wpm && add_bos && sep_id.is_none() {
            bail!(
                "a bert vocabulary that adds [CLS] needs tokenizer.ggml.seperator_token_id ([SEP])"
            );
        }
        let add_space_prefix = meta.add_space_prefix.unwrap_or(kind == VocabKind::Spm);
        // llama.cpp: lowercase unless the file says not, and strip accents where it lowercases
        // unless the file says otherwise.
        let lowercase = meta.lowercase.unwrap_or(true);
        let normalizer = Normalizer {
            lowercase,
            strip_accents: meta.strip_accents.unwrap_or(lowercase),
        };
        let max_token_len = texts.iter().map(String::len).max().unwrap_or(0);

        // Special tokens found by their text when the file does not name them; llama.cpp makes
        // each one found this way a control token. llama.cpp takes the first match of a
        // hash-map walk; we take the lowest id, which agrees whenever a vocabulary holds only
        // one of the candidate texts.
        let mut found_by_text = Vec::new();
        let mut detect = |slot: &mut Option<u32>, candidates: &[&str]| {
            if slot.is_none() {
                *slot = candidates
                    .iter()
                    .filter_map(|t| text_to_id.get(*t).copied())
                    .min();
                found_by_text.extend(*slot);
            }
        };
        detect(&mut eot_id, EOT_TEXTS);
        detect(&mut eom_id, &["<|eom_id|>"]);
        detect(&mut fim_pre_id, FIM_PRE_TEXTS);
        detect(&mut fim_suf_id, FIM_SUF_TEXTS);
        detect(&mut fim_mid_id, FIM_MID_TEXTS);
        detect(&mut fim_pad_id, FIM_PAD_TEXTS);
        detect(&mut fim_rep_id, FIM_REP_TEXTS);
        detect(&mut fim_sep_id, FIM_SEP_TEXTS);
        for id in found_by_text {
            attrs[id as usize] |= attr::CONTROL;
        }

        let mut eog_ids: Vec<u32> = [fim_pad_id, fim_rep_id, fim_sep_id]
            .into_iter()
            .flatten()
            .collect();
        for text in EOG_TEXTS {
            if let Some(&id) = text_to_id.get(*text) {
                attrs[id as usize] |= attr::CONTROL;
                eog_ids.push(id);
            }
        }
        for text in ALWAYS_RENDERED_TEXTS {
            if let Some(&id) = text_to_id.get(*text) {
                attrs[id as usize] = attr::USER_DEFINED;
            }
        }
        eog_ids.extend([eos_id, eot_id, eom_id].into_iter().flatten());
        eog_ids.sort_unstable();
        eog_ids.dedup();

        // llama.cpp's two corrections. Harmony-style vocabularies (gpt-oss: `<|return|>` and
        // `<|call|>`; solar-open: `<|calls|>` and `<|flush|>`) end turns with those, so
        // `<|end|>` is an ordinary user-defined token there. Where `<|tool_response>` or
        // `<|plamo:eos|>` ends generation, `</s>` is a normal token (Gemma 4, PLaMo).
        let eog_has =
            |eog_ids: &[u32], text: &str| eog_ids.iter().any(|&id| texts[id as usize] == text);
        let mut drop_from_eog = |eog_ids: &mut Vec<u32>, text: &str, new_attr: u8| {
            if let Some(pos) = eog_ids.iter().position(|&id| texts[id as usize] == text) {
                attrs[eog_ids[pos] as usize] = new_attr;
                eog_ids.remove(pos);
            }
        };
        let has_call = eog_has(&eog_ids, "<|call|>") || eog_has(&eog_ids, "<|calls|>");
        let has_return_or_flush = eog_has(&eog_ids, "<|return|>") || eog_has(&eog_ids, "<|flush|>");
        if has_call && has_return_or_flush && eog_has(&eog_ids, "<|end|>") {
            drop_from_eog(&mut eog_ids, "<|end|>", attr::USER_DEFINED);
        }
        if eog_has(&eog_ids, "<|tool_response>") || eog_has(&eog_ids, "<|plamo:eos|>") {
            drop_from_eog(&mut eog_ids, "</s>", attr::NORMAL);
        }

        let mut special_ids: Vec<u32> = (0..n_tokens as u32)
            .filter(|&id| {
                attrs[id as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
            })
            .collect();
        special_ids.sort_by_key(|&id| std::cmp::Reverse(texts[id as usize].len()));

        Ok(Vocab {
            kind,
            texts,
            attrs,
            scores,
            text_to_id,
            bos_id,
            eos_id,
            eot_id,
            unk_id,
            sep_id,
            add_bos,
            add_space_prefix,
            normalizer,
            max_token_len,
            eog_ids,
            fim: FimTokens {
                pre: fim_pre_id,
                suf: fim_suf_id,
                mid: fim_mid_id,
                pad: fim_pad_id,
                rep: fim_rep_id,
                sep: fim_sep_id,
            },
            special_ids,
        })
    }

    pub fn n_tokens(&self) -> usize {
        self.texts.len()
    }

    pub fn attr(&self, id: u32) -> u8 {
        self.attrs
            .get(id as usize)
            .copied()
            .unwrap_or(attr::UNDEFINED)
    }

    pub fn id_of(&self, text: &str) -> Option<u32> {
        self.text_to_id.get(text).copied()
    }

    /// The byte-fallback token of an SPM vocabulary for `byte`: `<0xXX>`, else the byte as a
    /// one-character token (llama.cpp's `byte_to_token`).
    pub fn byte_to_token(&self, byte: u8) -> Option<u32> {
        self.id_of(&format!("<0x{byte:02X}>")).or_else(|| {
            if byte.is_ascii() {
                self.id_of(std::str::from_utf8(&[byte]).ok()?)
            } else {
                None
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(tokens: &[&str], types: &[i32]) -> VocabMeta {
        VocabMeta {
            model: "llama".into(),
            tokens: tokens.iter().map(|s| s.to_string()).collect(),
            token_types: Some(types.to_vec()),
            ..Default::default()
        }
    }

    #[test]
    fn eog_includes_eos_and_text_matches_and_marks_control() {
        let m = meta(
            &["<unk>", "<s>", "</s>", "<|im_end|>", "a"],
            &[2, 3, 3, 1, 1],
        );
        let v = Vocab::new(&m).unwrap();
        assert_eq!(v.eog_ids, vec![2, 3]);
        assert_ne!(v.attr(3) & attr::CONTROL, 0);
        assert_eq!(v.bos_id, Some(1));
        assert!(v.add_bos);
        assert!(v.add_space_prefix);
    }

    #[test]
    fn harmony_end_is_not_eog_and_gemma4_s_is_normal() {
        let m = meta(
            &[
                "<|return|>",
                "<|call|>",
                "<|end|>",
                "</s>",
                "<|tool_response>",
            ],
            &[3, 3, 3, 3, 3],
        );
        let v = Vocab::new(&m).unwrap();
        // `<|end|>` is also the default EOS (id 2); llama.cpp drops it all the same.
        assert_eq!(v.eog_ids, vec![0, 1, 4]);
        assert_eq!(v.attr(2), attr::USER_DEFINED);
        assert_eq!(v.attr(3), attr::NORMAL);
    }

    #[test]
    fn special_ids_longest_first() {
        let m = meta(&["<a>", "<abc>", "x", "<ab>"], &[3, 4, 1, 3]);
        let v = Vocab::new(&m).unwrap();
        assert_eq!(v.special_ids, vec![1, 3, 0]);
    }

    #[test]
    fn unknown_model_and_duplicates_are_errors() {
        let mut m = meta(&["a", "b"], &[1, 1]);
        m.model = "t5".into();
        let err = Vocab::new(&m).err().unwrap().to_string();
        assert!(err.contains("tokenizer.ggml.model"), "{err}");
        let m = meta(&["a", "a"], &[1, 1]);
        let err = Vocab::new(&m).err().unwrap().to_string();
        assert!(err.contains("duplicate"), "{err}");
    }
}

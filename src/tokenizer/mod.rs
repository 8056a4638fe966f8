//! Text to token ids and back, built from a GGUF file's `tokenizer.ggml.*` metadata and
//! reproducing llama.cpp's tokenizer (llama-vocab.cpp) id for id.
//!
//! Three vocabulary kinds: `gpt2` (byte-level BPE, `bpe.rs`, pre-tokenizer chosen by
//! `tokenizer.ggml.pre`), `llama` (SentencePiece-style BPE, `spm.rs`) and `bert` (WordPiece,
//! `wordpiece.rs`, with its code point tables in `wpm_unicode.rs`). Special tokens are
//! cut out of the text first (`special.rs`); the table of tokens, special ids and the
//! end-of-generation set live in `vocab.rs`; streaming decode in `stream.rs`.
//!
//! Callers: the CLI faces and the server (encode prompts, decode output), the generation
//! loop (`is_eog` to stop, `StreamDecoder` to stream text).

mod bpe;
mod special;
mod spm;
mod stream;
mod vocab;
mod wordpiece;
mod wpm_unicode;

use anyhow::{Context, Result};

use crate::gguf::GgufFile;
use special::{Fragment, SpecialTrie};
use vocab::{attr, Vocab, VocabKind, VocabMeta};

pub use stream::StreamDecoder;
pub use vocab::FimTokens;

/// A GGUF vocabulary ready to encode and decode. Immutable after loading, `Send + Sync`.
pub struct Tokenizer {
    vocab: Vocab,
    special_trie: SpecialTrie,
    /// Present for `gpt2` vocabularies only.
    bpe: Option<bpe::BpeEncoder>,
    /// The lower bound of [`Tokenizer::min_tokens`].
    byte_bound: ByteBound,
}

/// Reads an optional key: `Ok(None)` when absent, an error when present with the wrong type.
fn optional<'a, T>(
    g: &'a GgufFile,
    key: &str,
    get: impl FnOnce(&'a GgufFile, &str) -> std::result::Result<T, crate::gguf::GgufError>,
) -> Result<Option<T>> {
    if g.get(key).is_none() {
        return Ok(None);
    }
    get(g, key)
        .map(Some)
        .with_context(|| format!("reading {key}"))
}

impl Tokenizer {
    /// Builds the tokenizer from the file's metadata. Errors name the missing or bad key.
    pub fn from_gguf(g: &GgufFile) -> Result<Tokenizer> {
        let key_u64 = |key| optional(g, key, GgufFile::get_u64);
        let key_bool = |key| optional(g, key, GgufFile::get_bool);
        let scores = match optional(g, "tokenizer.ggml.scores", GgufFile::get_f32_array) {
            Ok(s) => s.map(<[f32]>::to_vec),
            // Some converters store integer scores; llama.cpp accepts those too.
            Err(_) => optional(g, "tokenizer.ggml.scores", GgufFile::get_i32_array)?
                .map(|s| s.iter().map(|&v| v as f32).collect()),
        };
        let meta = VocabMeta {
            model: g
                .get_str("tokenizer.ggml.model")
                .context("reading tokenizer.ggml.model")?
                .to_string(),
            pre: optional(g, "tokenizer.ggml.pre", GgufFile::get_str)?.map(str::to_string),
            tokens: g
                .get_str_array("tokenizer.ggml.tokens")
                .context("reading tokenizer.ggml.tokens")?
                .to_vec(),
            token_types: optional(g, "tokenizer.ggml.token_type", GgufFile::get_i32_array)?
                .map(<[i32]>::to_vec),
            scores,
            merges: optional(g, "tokenizer.ggml.merges", GgufFile::get_str_array)?
                .map(<[String]>::to_vec),
            bos_id: key_u64("tokenizer.ggml.bos_token_id")?,
            eos_id: key_u64("tokenizer.ggml.eos_token_id")?,
            eot_id: key_u64("tokenizer.ggml.eot_token_id")?,
            eom_id: key_u64("tokenizer.ggml.eom_token_id")?,
            unk_id: key_u64("tokenizer.ggml.unknown_token_id")?,
            // llama.cpp also reads the older `prefix_token_id` names.
            fim_pre_id: key_u64("tokenizer.ggml.fim_pre_token_id")?
                .or(key_u64("tokenizer.ggml.prefix_token_id")?),
            fim_suf_id: key_u64("tokenizer.ggml.fim_suf_token_id")?
                .or(key_u64("tokenizer.ggml.suffix_token_id")?),
            fim_mid_id: key_u64("tokenizer.ggml.fim_mid_token_id")?
                .or(key_u64("tokenizer.ggml.middle_token_id")?),
            fim_pad_id: key_u64("tokenizer.ggml.fim_pad_token_id")?,
            fim_rep_id: key_u64("tokenizer.ggml.fim_rep_token_id")?,
            fim_sep_id: key_u64("tokenizer.ggml.fim_sep_token_id")?,
            add_bos: key_bool("tokenizer.ggml.add_bos_token")?,
            add_space_prefix: key_bool("tokenizer.ggml.add_space_prefix")?,
            sep_id: key_u64("tokenizer.ggml.seperator_token_id")?,
            lowercase: key_bool("tokenizer.ggml.normalizer.lowercase")?,
            strip_accents: key_bool("tokenizer.ggml.normalizer.strip_accents")?,
        };
        Tokenizer::from_meta(&meta)
    }

    /// Builds the tokenizer from metadata already read (the GGUF-free half of `from_gguf`).
    fn from_meta(meta: &VocabMeta) -> Result<Tokenizer> {
        let vocab = Vocab::new(meta)?;
        let bpe = match vocab.kind {
            VocabKind::Bpe => {
                let merges = meta.merges.as_deref().context(
                    "tokenizer.ggml.merges is missing: a gpt2 vocabulary needs its merges",
                )?;
                Some(bpe::BpeEncoder::new(&vocab, meta.pre.as_deref(), merges)?)
            }
            VocabKind::Spm | VocabKind::Wpm => None,
        };
        let special_trie = SpecialTrie::new(&vocab);
        let byte_bound = ByteBound::new(&vocab);
        Ok(Tokenizer {
            vocab,
            special_trie,
            bpe,
            byte_bound,
        })
    }

    /// The fewest tokens `text` can encode to (without BOS), found without tokenizing it: its
    /// bytes over the most bytes one token covers. A true lower bound, so a prompt whose bound
    /// already exceeds the context can be refused at once (tokenizing megabytes takes seconds).
    pub fn min_tokens(&self, text: &str) -> usize {
        self.byte_bound.min_tokens(text)
    }

    /// Token ids of `text`, as llama.cpp's `llama_tokenize` gives them. `add_bos` puts the
    /// BOS token first when the vocabulary has one (pass `add_bos_default()` for what the
    /// model wants). With `parse_special`, control tokens written in the text (e.g.
    /// `<|im_start|>`) become their ids; without, they are encoded as plain text.
    /// User-defined tokens are always matched, as llama.cpp does. The model's
    /// `tokenizer.ggml.add_eos_token` is not applied: prompts never end in EOS here. A WordPiece
    /// vocabulary puts `[SEP]` last wherever `add_bos` puts `[CLS]` first (llama.cpp's
    /// `add_special`).
    pub fn encode(&self, text: &str, add_bos: bool, parse_special: bool) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_bos {
            out.extend(self.vocab.bos_id);
        }
        let fragments = special::partition(&self.vocab, &self.special_trie, text, parse_special);
        if self.vocab.kind == VocabKind::Wpm {
            let v = &self.vocab;
            for fragment in fragments {
                match fragment {
                    Fragment::Text(piece) => {
                        wordpiece::encode(v, v.normalizer, v.max_token_len, piece, &mut out)
                    }
                    Fragment::Token(id) => out.push(id),
                }
            }
            if add_bos {
                out.extend(v.sep_id);
            }
            return Ok(out);
        }
        match &self.bpe {
            Some(bpe) => {
                for fragment in fragments {
                    match fragment {
                        Fragment::Text(piece) => bpe.encode(piece, &mut out)?,
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
            None => {
                // A space goes before the first stretch of text and after each special
                // token when the vocabulary asks for it (llama.cpp's `is_prev_special`).
                let mut after_special = true;
                let mut escaped = String::new();
                for fragment in fragments {
                    match fragment {
                        Fragment::Text(piece) => {
                            escaped.clear();
                            if self.vocab.add_space_prefix && after_special {
                                escaped.push('▁');
                            }
                            escaped.extend(piece.chars().map(|c| if c == ' ' { '▁' } else { c }));
                            spm::encode(&self.vocab, &escaped, &mut out);
                            after_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            after_special = true;
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Whether prompts should start with BOS: `tokenizer.ggml.add_bos_token`, or llama.cpp's
    /// default for the vocabulary (SentencePiece: yes; byte-level BPE: only the Llama 3
    /// family of pre-tokenizers).
    pub fn add_bos_default(&self) -> bool {
        self.vocab.add_bos && self.vocab.bos_id.is_some()
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.vocab.bos_id
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.vocab.eos_id
    }

    /// End of turn (llama.cpp's `token_eot`), if the vocabulary has one.
    pub fn eot_id(&self) -> Option<u32> {
        self.vocab.eot_id
    }

    /// Whether generating `id` ends the turn: EOS, EOT, EOM, and the tokens llama.cpp
    /// recognises by their text (`<|im_end|>`, `<|endoftext|>`, `<end_of_turn>`,
    /// `<|eot_id|>`, ...; fill-in-the-middle pad/repo/file-separator tokens too).
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.eog_ids.binary_search(&id).is_ok()
    }

    /// The fill-in-the-middle tokens (prefix, suffix, middle, pad, repository, file separator).
    pub fn fim_tokens(&self) -> FimTokens {
        self.vocab.fim
    }

    /// The end-of-generation ids, sorted.
    pub fn eog_ids(&self) -> &[u32] {
        &self.vocab.eog_ids
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab.n_tokens()
    }

    /// The bytes token `id` stands for, as llama.cpp's `token_to_piece` with special tokens
    /// rendered: byte-level decoded (BPE) or `▁` as space (SPM) for normal tokens, the byte
    /// of a `<0xXX>` token, the text itself for control, user-defined and unknown tokens.
    /// Unused tokens and ids outside the vocabulary give nothing.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let mut out = Vec::new();
        self.append_token_bytes(id, &mut out);
        out
    }

    fn append_token_bytes(&self, id: u32, out: &mut Vec<u8>) {
        let a = self.vocab.attr(id);
        let Some(text) = self.vocab.texts.get(id as usize) else {
            return;
        };
        if a & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0 {
            out.extend_from_slice(text.as_bytes());
        } else if a & attr::NORMAL != 0 {
            match self.vocab.kind {
                VocabKind::Bpe => bpe::byte_level_decode(text, out),
                VocabKind::Spm | VocabKind::Wpm => {
                    out.extend_from_slice(text.replace('▁', " ").as_bytes())
                }
            }
        } else if a & attr::BYTE != 0 {
            // `<0xXX>`
            if let Some(b) = text
                .get(3..5)
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
            {
                out.push(b);
            }
        }
    }

    /// The text of `ids`: their bytes concatenated, invalid UTF-8 replaced by U+FFFD.
    /// Special tokens appear as their text; no space is stripped.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            self.append_token_bytes(id, &mut bytes);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Whether `id` is a control token (`<|im_end|>`, `<|im_start|>`, ...): text the model
    /// writes only as that one token, never spelled out.
    pub fn is_control(&self, id: u32) -> bool {
        self.vocab.attr(id) & attr::CONTROL != 0
    }

    /// The id of the token whose text is exactly `text`, if the vocabulary has one.
    pub fn find_token(&self, text: &str) -> Option<u32> {
        (0..self.vocab_size() as u32).find(|&id| self.token_text(id) == text)
    }

    /// The vocabulary string of `id` (`""` outside the vocabulary).
    pub fn token_text(&self, id: u32) -> &str {
        self.vocab
            .texts
            .get(id as usize)
            .map(String::as_str)
            .unwrap_or("")
    }
}

/// What bounds the token count of a text from below, found once from the vocabulary.
///
/// Byte-level BPE: a normal token covers the bytes its byte-level string decodes to. Every other
/// token covers at most its vocabulary string: SentencePiece spells a space `▁` (three bytes for
/// one) and a fallback byte `<0xXX>`; control and user-defined tokens are cut out of the text as
/// written. A byte may also come out as no token at all: byte-level BPE drops one whose char is
/// missing from the vocabulary (SmolLM2's has no char for 0x04, for one), SentencePiece one that
/// has neither a byte token nor an unknown token. Those bytes are not counted.
struct ByteBound {
    /// The most bytes of text one token covers.
    longest_token_bytes: usize,
    /// The bytes that may encode to no token.
    dropped: [bool; 256],
}

impl ByteBound {
    fn new(vocab: &Vocab) -> ByteBound {
        let mut dropped = [false; 256];
        for b in 0..=255u8 {
            dropped[b as usize] = match vocab.kind {
                VocabKind::Bpe => vocab
                    .id_of(bpe::byte_to_char(b).encode_utf8(&mut [0; 4]))
                    .is_none(),
                VocabKind::Spm => vocab.unk_id.is_none() && vocab.byte_to_token(b).is_none(),
                // One unknown token stands for a whole word, however long.
                VocabKind::Wpm => true,
            };
        }
        let mut decoded = Vec::new();
        let covered = |(id, text): (usize, &String)| match vocab.kind {
            VocabKind::Bpe if vocab.attr(id as u32) & attr::NORMAL != 0 => {
                decoded.clear();
                bpe::byte_level_decode(text, &mut decoded);
                decoded.len()
            }
            _ => text.len(),
        };
        let longest = vocab.texts.iter().enumerate().map(covered).max();
        ByteBound {
            longest_token_bytes: longest.unwrap_or(1).max(1),
            dropped,
        }
    }

    fn min_tokens(&self, text: &str) -> usize {
        let counted = if self.dropped.iter().any(|&d| d) {
            text.bytes().filter(|&b| !self.dropped[b as usize]).count()
        } else {
            text.len()
        };
        counted.div_ceil(self.longest_token_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn tokenizer_is_send_and_sync() {
        assert_send_sync::<Tokenizer>();
    }

    /// A tiny byte-level vocabulary: the 256 byte chars, `Ġa`, `ab`, and two control tokens.
    fn tiny_bpe() -> Tokenizer {
        let mut tokens: Vec<String> = vec!["<|endoftext|>".into(), "<|im_end|>".into()];
        let mut types = vec![3, 3];
        tokens.extend((0..=255u8).map(|b| bpe::byte_to_char(b).to_string()));
        types.extend([1; 256]);
        tokens.extend(["Ġa".to_string(), "ab".to_string()]);
        types.extend([1, 1]);
        Tokenizer::from_meta(&VocabMeta {
            model: "gpt2".into(),
            pre: Some("gpt-2".into()),
            tokens,
            token_types: Some(types),
            merges: Some(vec!["Ġ a".into(), "a b".into()]),
            eos_id: Some(0),
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn bpe_encode_decode_and_specials() {
        let t = tiny_bpe();
        let ids = t.encode("ab a<|im_end|>", false, true).unwrap();
        let id = |s: &str| t.vocab.id_of(s).unwrap();
        assert_eq!(ids, vec![id("ab"), id("Ġa"), 1]);
        assert_eq!(t.decode(&ids), "ab a<|im_end|>");
        let plain = t.encode("<|im_end|>", false, false).unwrap();
        assert!(plain.len() > 1 && !plain.contains(&1));
        assert_eq!(t.eog_ids(), &[0, 1]);
        assert!(!t.add_bos_default());
    }

    #[test]
    fn stream_decoder_holds_partial_chars() {
        let t = tiny_bpe();
        let ids = t.encode("é🎉", false, false).unwrap();
        assert_eq!(ids.len(), 6);
        let mut d = StreamDecoder::new();
        let parts: Vec<String> = ids.iter().map(|&i| d.push(&t, i)).collect();
        assert_eq!(parts.concat() + &d.finish(), "é🎉");
        assert_eq!(parts[0], "");
        assert_eq!(parts[1], "é");
    }
}

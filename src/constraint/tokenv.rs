//! llguidance's view of our vocabulary: a token trie built from the bytes each token decodes to
//! (`toktrie::TokTrie::from`), with control tokens marked special so a grammar never spells
//! them out, and the end-of-sequence token the grammar ends with. Called once per model by
//! `Grammars`.

use std::sync::Arc;

use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::tokenizer::Tokenizer;

/// The bytes of every id up to `vocab_size` (the logits' width, which may exceed the
/// tokenizer's): control tokens as llguidance's special-token marker followed by their text,
/// ids the tokenizer lacks as nothing (never allowed).
pub fn token_words(tok: &Tokenizer, vocab_size: usize) -> Vec<Vec<u8>> {
    (0..vocab_size as u32)
        .map(|id| {
            if id as usize >= tok.vocab_size() {
                return Vec::new();
            }
            let bytes = tok.token_bytes(id);
            if tok.is_control(id) && !bytes.is_empty() {
                let mut marked = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                marked.extend_from_slice(&bytes);
                marked
            } else {
                bytes
            }
        })
        .collect()
}

/// The token environment llguidance compiles grammars against.
pub fn tok_env(tok: &Tokenizer, vocab_size: usize) -> TokEnv {
    let eos = tok
        .eos_id()
        .or_else(|| tok.eog_ids().first().copied())
        .unwrap_or(0);
    let info = TokRxInfo {
        vocab_size: vocab_size as u32,
        tok_eos: eos,
        tok_bos: tok.bos_id(),
        tok_pad: None,
        tok_unk: None,
        tok_end_of_turn: None,
    };
    let trie = TokTrie::from(&info, &token_words(tok, vocab_size));
    Arc::new(OurTokEnv { trie })
}

struct OurTokEnv {
    trie: TokTrie,
}

impl TokenizerEnv for OurTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Greedy longest-match over the trie: not the model's own tokenization (llguidance uses
    /// it only to propose forced tokens, and we declare it non-canonical).
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

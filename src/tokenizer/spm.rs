//! SentencePiece-style BPE (`tokenizer.ggml.model = llama`, e.g. Gemma 3's 262144-token
//! vocabulary), a port of llama.cpp's `llm_tokenizer_spm_session`.
//!
//! The text (spaces already `▁`) starts as one symbol per char; the adjacent pair whose
//! concatenation is a token with the highest score merges first (ties: leftmost), until no
//! pair is a token. Each final symbol is its token, or its bytes as `<0xXX>` tokens.
//! Called by `Tokenizer::encode` (mod.rs) on each stretch of plain text.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::vocab::Vocab;

/// A run of the text, linked to its neighbours; `len == 0` once merged into its left one.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge of symbol `left` with its right neighbour `right`.
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    /// Bytes of the merged text; a mismatch when popped means the pair went stale.
    len: usize,
}

impl Ord for Bigram {
    /// Max-heap order: higher score first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}

/// Appends the ids of `text` (already whitespace-escaped, no special tokens) to `out`.
pub(crate) fn encode(vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
    let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
    for (start, c) in text.char_indices() {
        let index = symbols.len();
        symbols.push(Symbol {
            start,
            len: c.len_utf8(),
            prev: index.checked_sub(1),
            next: (start + c.len_utf8() < text.len()).then_some(index + 1),
        });
    }
    if symbols.is_empty() {
        return;
    }

    let mut queue = BinaryHeap::new();
    let try_add = |queue: &mut BinaryHeap<Bigram>,
                   symbols: &[Symbol],
                   left: Option<usize>,
                   right: Option<usize>| {
        let (Some(left), Some(right)) = (left, right) else {
            return;
        };
        let start = symbols[left].start;
        let len = symbols[left].len + symbols[right].len;
        if let Some(id) = vocab.id_of(&text[start..start + len]) {
            queue.push(Bigram {
                score: vocab.scores[id as usize],
                left,
                right,
                len,
            });
        }
    };
    for i in 1..symbols.len() {
        try_add(&mut queue, &symbols, Some(i - 1), Some(i));
    }

    while let Some(bigram) = queue.pop() {
        let (left, right) = (symbols[bigram.left], symbols[bigram.right]);
        if left.len == 0 || right.len == 0 || left.len + right.len != bigram.len {
            continue;
        }
        // Merge the right symbol into the left one and unlink it.
        symbols[bigram.left].len += right.len;
        symbols[bigram.left].next = right.next;
        symbols[bigram.right].len = 0;
        if let Some(next) = right.next {
            symbols[next].prev = Some(bigram.left);
        }
        try_add(&mut queue, &symbols, left.prev, Some(bigram.left));
        try_add(&mut queue, &symbols, Some(bigram.left), right.next);
    }

    let mut i = Some(0);
    while let Some(index) = i {
        let symbol = symbols[index];
        let piece = &text[symbol.start..symbol.start + symbol.len];
        match vocab.id_of(piece) {
            Some(id) => out.push(id),
            // Byte fallback. llama.cpp aborts when a byte has no token; we fall back to the
            // unknown token, or drop the byte when there is none.
            None => out.extend(
                piece
                    .bytes()
                    .filter_map(|b| vocab.byte_to_token(b).or(vocab.unk_id)),
            ),
        }
        i = symbol.next;
    }
}

#[cfg(test)]
mod tests {
    use super::super::vocab::{Vocab, VocabMeta};
    use super::*;

    fn vocab(tokens: &[(&str, f32)]) -> Vocab {
        let mut names: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
        let mut types = vec![2, 3, 3];
        let mut scores = vec![0.0, 0.0, 0.0];
        for b in 0..=255u8 {
            names.push(format!("<0x{b:02X}>"));
            types.push(6);
            scores.push(0.0);
        }
        for (t, s) in tokens {
            names.push(t.to_string());
            types.push(1);
            scores.push(*s);
        }
        Vocab::new(&VocabMeta {
            model: "llama".into(),
            tokens: names,
            token_types: Some(types),
            scores: Some(scores),
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn highest_score_merges_first_and_bytes_fall_back() {
        let v = vocab(&[
            ("a", -1.0),
            ("b", -1.0),
            ("c", -1.0),
            ("ab", -5.0),
            ("bc", -2.0),
        ]);
        let id = |t: &str| v.id_of(t).unwrap();
        let mut out = Vec::new();
        encode(&v, "abc", &mut out);
        // "bc" scores higher than "ab", so it wins the shared "b".
        assert_eq!(out, vec![id("a"), id("bc")]);
        out.clear();
        encode(&v, "é", &mut out);
        assert_eq!(out, vec![id("<0xC3>"), id("<0xA9>")]);
    }
}

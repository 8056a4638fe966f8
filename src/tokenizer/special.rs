//! Cutting special tokens out of the text before the plain stretches are encoded, as
//! llama.cpp's `tokenizer_st_partition` does.
//!
//! Control, user-defined and unknown tokens are taken longest first; every occurrence of one
//! in the remaining text becomes that token, and the stretches between are left for the
//! next. User-defined tokens are always cut out; control and unknown ones only when the
//! caller parses special tokens. Called by `Tokenizer::encode` (mod.rs).
//!
//! A vocabulary can hold thousands of special tokens (Gemma 3: about 6,400), so a byte trie
//! over their texts first finds which of them occur in the text at all, in one pass.

use super::vocab::{attr, Vocab};

/// A piece of the text to encode: plain text, or a special token already decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

/// A byte trie over special token texts: `nodes[0]` is the root.
pub(crate) struct SpecialTrie {
    nodes: Vec<TrieNode>,
    /// Each special token's rank in `Vocab::special_ids` (the cutting order), by node.
    rank_at: Vec<Option<usize>>,
}

#[derive(Default)]
struct TrieNode {
    /// (byte, child node), sorted by byte.
    children: Vec<(u8, u32)>,
}

impl SpecialTrie {
    pub fn new(vocab: &Vocab) -> SpecialTrie {
        let mut trie = SpecialTrie {
            nodes: vec![TrieNode::default()],
            rank_at: vec![None],
        };
        for (rank, &id) in vocab.special_ids.iter().enumerate() {
            let mut node = 0usize;
            for &b in vocab.texts[id as usize].as_bytes() {
                let children = &trie.nodes[node].children;
                node = match children.binary_search_by_key(&b, |&(c, _)| c) {
                    Ok(i) => children[i].1 as usize,
                    Err(i) => {
                        let child = trie.nodes.len();
                        trie.nodes[node].children.insert(i, (b, child as u32));
                        trie.nodes.push(TrieNode::default());
                        trie.rank_at.push(None);
                        child
                    }
                };
            }
            trie.rank_at[node] = Some(rank);
        }
        trie
    }

    /// Ranks (positions in `Vocab::special_ids`) of the special tokens occurring in `text`,
    /// ascending.
    fn ranks_in(&self, text: &str) -> Vec<usize> {
        let bytes = text.as_bytes();
        let mut ranks = Vec::new();
        for start in 0..bytes.len() {
            let mut node = 0usize;
            for &b in &bytes[start..] {
                let children = &self.nodes[node].children;
                match children.binary_search_by_key(&b, |&(c, _)| c) {
                    Ok(i) => node = children[i].1 as usize,
                    Err(_) => break,
                }
                ranks.extend(self.rank_at[node]);
            }
        }
        ranks.sort_unstable();
        ranks.dedup();
        ranks
    }
}

/// Splits `text` into plain stretches and special tokens.
pub(crate) fn partition<'a>(
    vocab: &Vocab,
    trie: &SpecialTrie,
    text: &'a str,
    parse_special: bool,
) -> Vec<Fragment<'a>> {
    if text.is_empty() {
        return Vec::new();
    }
    let mut fragments = vec![Fragment::Text(text)];
    for rank in trie.ranks_in(text) {
        let id = vocab.special_ids[rank];
        if !parse_special && vocab.attr(id) & (attr::CONTROL | attr::UNKNOWN) != 0 {
            continue;
        }
        let special = vocab.texts[id as usize].as_str();
        let mut next = Vec::with_capacity(fragments.len() + 2);
        for fragment in fragments {
            let Fragment::Text(piece) = fragment else {
                next.push(fragment);
                continue;
            };
            let mut rest = 0;
            for (at, _) in piece.match_indices(special) {
                if at > rest {
                    next.push(Fragment::Text(&piece[rest..at]));
                }
                next.push(Fragment::Token(id));
                rest = at + special.len();
            }
            if rest < piece.len() {
                next.push(Fragment::Text(&piece[rest..]));
            }
        }
        fragments = next;
    }
    fragments
}

#[cfg(test)]
mod tests {
    use super::super::vocab::{Vocab, VocabMeta};
    use super::*;

    fn vocab() -> Vocab {
        let tokens = ["a", "<s>", "<|im_end|>", "<tool>", "<|im_end|>x"];
        Vocab::new(&VocabMeta {
            model: "gpt2".into(),
            pre: Some("gpt-2".into()),
            tokens: tokens.iter().map(|s| s.to_string()).collect(),
            token_types: Some(vec![1, 3, 3, 4, 1]),
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn control_tokens_only_when_parsing_special_user_defined_always() {
        let v = vocab();
        let trie = SpecialTrie::new(&v);
        let text = "hi<|im_end|><tool>x<s>";
        use Fragment::*;
        assert_eq!(
            partition(&v, &trie, text, true),
            vec![Text("hi"), Token(2), Token(3), Text("x"), Token(1)]
        );
        assert_eq!(
            partition(&v, &trie, text, false),
            vec![Text("hi<|im_end|>"), Token(3), Text("x<s>")]
        );
        assert!(partition(&v, &trie, "", true).is_empty());
    }
}

//! The fill-in-the-middle sampler, a port of llama.cpp's `llama_sampler_infill` (what
//! llama.vscode lists last in its `samplers`): when end-of-generation tokens hold enough of the
//! mass (3 * p_eog * n > p_text) only they stay; otherwise a token whose text is a prefix of
//! another's absorbs it (the likelier of the two keeps both masses, the other leaves), tokens
//! under 0.2 are cut unless they end generation (when no text token is left the choice is the
//! end-of-turn token), then, renormalized, those under 1 / (text tokens + 1). The final softmax then reads the logits, as llama.cpp's `dist` does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use super::chain::{Candidate, Candidates};
use crate::tokenizer::Tokenizer;

/// What the stage reads of the vocabulary: each token's text as llama.cpp's `token_to_piece`
/// without special tokens (control tokens empty), which tokens end generation, and the
/// end-of-turn token (else end-of-sequence).
pub struct InfillVocab {
    pieces: Vec<Vec<u8>>,
    eog: Vec<bool>,
    eot: Option<u32>,
}

impl std::fmt::Debug for InfillVocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "InfillVocab({} tokens, eot {:?})",
            self.pieces.len(),
            self.eot
        )
    }
}

impl InfillVocab {
    /// Built once per vocabulary (cached).
    pub fn of(tok: &Tokenizer) -> Arc<InfillVocab> {
        static CACHE: OnceLock<Mutex<HashMap<(usize, Vec<u32>), Arc<InfillVocab>>>> =
            OnceLock::new();
        let key = (tok.vocab_size(), tok.eog_ids().to_vec());
        let cache = CACHE.get_or_init(Default::default);
        let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .entry(key)
            .or_insert_with(|| {
                let n = tok.vocab_size() as u32;
                let piece = |id| {
                    if tok.is_control(id) {
                        Vec::new()
                    } else {
                        tok.token_bytes(id)
                    }
                };
                Arc::new(InfillVocab {
                    pieces: (0..n).map(piece).collect(),
                    eog: (0..n).map(|id| tok.is_eog(id)).collect(),
                    eot: tok.eot_id().or(tok.eos_id()),
                })
            })
            .clone()
    }

    fn is_eog(&self, id: u32) -> bool {
        self.eog.get(id as usize).copied().unwrap_or(false)
    }
}

impl Candidates {
    /// `llama_sampler_infill_apply`.
    pub fn infill(&mut self, v: &InfillVocab) {
        self.softmax(true);
        let (mut p_txt, mut p_eog) = (0.0f32, 0.0f32);
        for c in &self.data {
            if v.is_eog(c.id) {
                p_eog += c.p;
            } else {
                p_txt += c.p;
            }
        }
        if 3.0 * p_eog * self.data.len() as f32 > p_txt {
            self.data.retain(|c| v.is_eog(c.id));
            let sum: f32 = self.data.iter().map(|c| c.p).sum();
            for c in &mut self.data {
                c.p /= sum;
            }
            return;
        }
        // Combine tokens with a common prefix.
        let empty = Vec::new();
        let piece = |id: u32| v.pieces.get(id as usize).unwrap_or(&empty);
        let n = self.data.len();
        for i0 in 0..n {
            for i1 in 0..n {
                if self.data[i0].logit == f32::NEG_INFINITY {
                    break;
                }
                if i0 == i1 || self.data[i1].logit == f32::NEG_INFINITY {
                    continue;
                }
                let (a, b) = (piece(self.data[i0].id), piece(self.data[i1].id));
                if !a.is_empty() && b.starts_with(a) {
                    let (mut dst, mut src) = (i0, i1);
                    if self.data[i1].p > self.data[i0].p {
                        std::mem::swap(&mut dst, &mut src);
                    }
                    self.data[dst].p += self.data[src].p;
                    self.data[src].logit = f32::NEG_INFINITY;
                    self.data[src].p = 0.0;
                    self.sorted = false;
                }
            }
        }
        let thold = 0.2f32;
        let mut n_non_eog = 0;
        let mut p_sum = 0.0f32;
        self.data.retain(|c| {
            let eog = v.is_eog(c.id);
            if c.p < thold && !eog {
                return false;
            }
            n_non_eog += usize::from(!eog);
            p_sum += c.p;
            true
        });
        if n_non_eog == 0 {
            // Only the end of turn is left.
            let Some(eot) = v.eot else {
                return;
            };
            self.data = vec![Candidate {
                id: eot,
                logit: 1.0,
                p: 1.0,
            }];
            self.sorted = true;
            return;
        }
        for c in &mut self.data {
            c.p /= p_sum;
        }
        // Then a second cut, at 1 / (text tokens + 1) of the renormalized mass.
        let thold = 1.0 / (n_non_eog as f32 + 1.0);
        let mut p_sum = 0.0f32;
        self.data.retain(|c| {
            let keep = c.p >= thold || v.is_eog(c.id);
            if keep {
                p_sum += c.p;
            }
            keep
        });
        for c in &mut self.data {
            c.p /= p_sum;
        }
    }
}

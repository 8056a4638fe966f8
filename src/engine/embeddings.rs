//! Embedding requests (`Request::embed`) on the engine thread: the hidden states of the rows a
//! sequence's pooling reads are kept by position as the forward pass returns them
//! (`Batch::embd_rows`), and once its whole prompt is computed they are pooled
//! (`crate::model::pooling`), sent in one `Event::Embedding`, and the sequence ends (its blocks
//! go back). Kept by position, so a preempted sequence that computes its prompt again simply
//! writes the same rows again.

use std::collections::HashMap;

use super::batch_builder::EmbdRows;
use super::sequence::SeqId;
use super::worker::Worker;
use super::{Event, FinishReason};
use crate::model::pooling::{pool, Pooling};

/// The rows kept so far of each embedding sequence: [rows its pooling reads][n_embd].
#[derive(Default)]
pub(super) struct Embeddings {
    rows: HashMap<SeqId, Vec<f32>>,
}

impl Embeddings {
    /// Forgets a sequence's rows (it finished, failed or was aborted).
    pub(super) fn forget(&mut self, seq_id: SeqId) {
        self.rows.remove(&seq_id);
    }
}

impl Worker {
    /// Keeps this step's embedding rows (`embd`, [rows.len()][n_embd], in `rows`' order).
    pub(super) fn keep_embeddings(&mut self, rows: &EmbdRows, embd: &[f32]) {
        let n_embd = self.model.config.n_embd;
        for (&(seq_id, pos), row) in rows.iter().zip(embd.chunks_exact(n_embd)) {
            let Some(seq) = self.sched.get(seq_id) else {
                continue;
            };
            let Some(pooling) = seq.embed else {
                continue;
            };
            let (n_rows, at) = match pooling {
                Pooling::None | Pooling::Mean => (seq.prompt_len, pos),
                Pooling::Cls | Pooling::Last => (1, 0),
            };
            let kept = self
                .embeddings
                .rows
                .entry(seq_id)
                .or_insert_with(|| vec![0.0; n_rows * n_embd]);
            kept[at * n_embd..(at + 1) * n_embd].copy_from_slice(row);
        }
    }

    /// Whether `seq_id` is an embedding sequence: then, its prompt computed, it pools, sends
    /// its embedding and finishes here (true), and samples nothing.
    pub(super) fn finish_embedding(&mut self, seq_id: SeqId) -> bool {
        let Some(pooling) = self.sched.get(seq_id).and_then(|s| s.embed) else {
            return false;
        };
        let n_embd = self.model.config.n_embd;
        let rows = self.embeddings.rows.remove(&seq_id).unwrap_or_default();
        let pooled = pool(pooling, &rows, n_embd);
        let vectors = pooled.chunks_exact(n_embd).map(<[f32]>::to_vec).collect();
        self.out.send(seq_id, Event::Embedding { vectors });
        self.finish(seq_id, FinishReason::Stop);
        true
    }
}

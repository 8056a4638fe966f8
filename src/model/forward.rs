//! The forward pass over a batch, reading like the paper: embedding, then per layer RMSNorm,
//! attention (through the paged KV cache), residual, RMSNorm, gated feed-forward, residual;
//! then the final norm and the logits of the rows that asked for them.
//!
//! Each row's arithmetic is the same whatever else is in the batch: matrix products compute
//! every output element as one dot product, norms and attention are per row. So a sequence's
//! output does not depend on batching, chunking or caching.

use anyhow::{bail, Result};

use super::weights::Matrix;
use super::{Batch, Model};
use crate::gguf::GgufFile;
use crate::kernels::{self, AttentionBatch};
use crate::kv_cache::KvCache;
use crate::tensor_type::TensorType;

/// Activations of one step quantized once per vec_dot type and reused by every matrix that
/// reads them (q, k and v read the same normed input).
struct Quantized<'a> {
    x: &'a [f32],
    n_in: usize,
    cache: Vec<(TensorType, Vec<u8>)>,
}

impl<'a> Quantized<'a> {
    fn new(x: &'a [f32], n_in: usize) -> Self {
        Quantized { x, n_in, cache: Vec::new() }
    }

    /// `out = x @ m^T`: [n_rows][m.n_out].
    fn matmul(&mut self, g: &GgufFile, m: &Matrix, out: &mut Vec<f32>) {
        let t = m.ttype.vec_dot_type();
        let idx = match self.cache.iter().position(|(ct, _)| *ct == t) {
            Some(i) => i,
            None => {
                self.cache.push((t, kernels::quantize_rows(t, self.x, self.n_in)));
                self.cache.len() - 1
            }
        };
        let n_rows = self.x.len() / self.n_in;
        out.resize(n_rows * m.n_out, 0.0);
        kernels::matmul(m.ttype, m.bytes(g), m.n_in, m.n_out, &self.cache[idx].1, n_rows, out);
    }
}

fn add_inplace(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

impl Model {
    /// Runs one step. Writes the batch's keys and values into `kv` at its slot mapping and
    /// returns the logits of `batch.logits_rows`, [logits_rows.len()][vocab_size].
    pub fn forward(&self, batch: &Batch, kv: &mut KvCache) -> Result<Vec<f32>> {
        let c = &self.config;
        let g: &GgufFile = &self.file;
        let w = &self.weights;
        let n = batch.n_tokens();
        if n == 0 {
            return Ok(Vec::new());
        }
        if let Some(&bad) = batch.tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            bail!("token id {bad} is outside the vocabulary of {} tokens", c.vocab_size);
        }
        let (n_embd, q_dim, kv_dim) = (c.n_embd, c.q_dim(), c.kv_dim());
        let context_lens = batch.context_lens();
        let attn_batch = AttentionBatch {
            block_tables: &batch.block_tables,
            max_blocks_per_seq: batch.max_blocks_per_seq,
            token_seq: &batch.token_seq,
            context_lens: &context_lens,
        };

        // x: [n][n_embd], the residual stream.
        let mut x = vec![0.0f32; n * n_embd];
        for (t, &tok) in batch.tokens.iter().enumerate() {
            w.token_embd.dequantize_row(g, tok as usize, &mut x[t * n_embd..(t + 1) * n_embd]);
        }

        let mut h = vec![0.0f32; n * n_embd]; // normed input, [n][n_embd]
        let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new()); // [n][q_dim], [n][kv_dim] x2
        let mut attn = vec![0.0f32; n * q_dim]; // [n][q_dim]
        let (mut proj, mut gate, mut up) = (Vec::new(), Vec::new(), Vec::new()); // [n][n_embd], [n][n_ff] x2

        for (l, lw) in w.layers.iter().enumerate() {
            // Attention block.
            kernels::rms_norm(&x, &lw.attn_norm, &mut h, c.rms_eps);
            let mut hq = Quantized::new(&h, n_embd);
            hq.matmul(g, &lw.wq, &mut q);
            hq.matmul(g, &lw.wk, &mut k);
            hq.matmul(g, &lw.wv, &mut v);
            kernels::rope(&mut q, &batch.positions, c.n_heads, &c.rope);
            kernels::rope(&mut k, &batch.positions, c.n_kv_heads, &c.rope);
            let (k_cache, v_cache) = kv.layer_mut(l);
            kernels::kv_write(&k, &v, k_cache, v_cache, &batch.slot_mapping, kv_dim);
            let (k_cache, v_cache) = kv.layer(l);
            kernels::paged_attention(&mut attn, &q, k_cache, v_cache, &kv.shape(c), &attn_batch, c.attn_scale, None);
            Quantized::new(&attn, q_dim).matmul(g, &lw.wo, &mut proj);
            add_inplace(&mut x, &proj);

            // Feed-forward block.
            kernels::rms_norm(&x, &lw.ffn_norm, &mut h, c.rms_eps);
            let mut hq = Quantized::new(&h, n_embd);
            hq.matmul(g, &lw.w_gate, &mut gate);
            hq.matmul(g, &lw.w_up, &mut up);
            kernels::glu_inplace(&mut gate, &up, c.activation);
            Quantized::new(&gate, c.n_ff).matmul(g, &lw.w_down, &mut proj);
            add_inplace(&mut x, &proj);
        }

        // Final norm and logits, only for the rows that want them.
        let mut last: Vec<f32> = Vec::with_capacity(batch.logits_rows.len() * n_embd);
        for &r in &batch.logits_rows {
            last.extend_from_slice(&x[r * n_embd..(r + 1) * n_embd]);
        }
        if last.is_empty() {
            return Ok(Vec::new());
        }
        kernels::rms_norm_inplace(&mut last, &w.output_norm, c.rms_eps);
        let mut logits = Vec::new();
        Quantized::new(&last, n_embd).matmul(g, &w.output, &mut logits);
        Ok(logits)
    }
}

//! The forward pass over a batch, reading like the paper: embedding, then per layer RMSNorm,
//! attention (through the paged KV cache), residual, RMSNorm, gated feed-forward, residual;
//! then the final norm and the logits of the rows that asked for them.
//!
//! One function runs every family: what differs (Q/K/V biases, QK-norm, post-norms, embedding,
//! residual and logit multipliers, activation, each layer's rope (or none) and sliding window,
//! logit soft-capping) is data in
//! [`ModelConfig`](super::ModelConfig) and [`Weights`](super::Weights), read from the GGUF.
//!
//! Each row's arithmetic is the same whatever else is in the batch: matrix products compute
//! every output element as one dot product, norms and attention are per row. So a sequence's
//! output does not depend on batching, chunking or caching.

use anyhow::{bail, Result};

use super::weights::{Linear, Matrix};
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
        Quantized {
            x,
            n_in,
            cache: Vec::new(),
        }
    }

    /// `out = x @ m^T`: [n_rows][m.n_out].
    fn matmul(&mut self, g: &GgufFile, m: &Matrix, out: &mut Vec<f32>) {
        let t = m.ttype.vec_dot_type();
        let idx = match self.cache.iter().position(|(ct, _)| *ct == t) {
            Some(i) => i,
            None => {
                self.cache
                    .push((t, kernels::quantize_rows(t, self.x, self.n_in)));
                self.cache.len() - 1
            }
        };
        let n_rows = self.x.len() / self.n_in;
        out.resize(n_rows * m.n_out, 0.0);
        // Q4_1 and Q8_0 matrices are read from their interleaved copies: the same results, bit for bit.
        match m.interleaved(g) {
            Some(w8) => kernels::matmul_x8(
                m.ttype,
                w8,
                m.n_in,
                m.n_out,
                &self.cache[idx].1,
                n_rows,
                out,
            ),
            None => kernels::matmul(
                m.ttype,
                m.bytes(g),
                m.n_in,
                m.n_out,
                &self.cache[idx].1,
                n_rows,
                out,
            ),
        }
    }

    /// `out = x @ l.weight^T + l.bias`: [n_rows][n_out].
    fn linear(&mut self, g: &GgufFile, l: &Linear, out: &mut Vec<f32>) {
        self.matmul(g, &l.weight, out);
        if let Some(bias) = &l.bias {
            out.chunks_exact_mut(bias.len())
                .for_each(|row| add_inplace(row, bias));
        }
    }
}

fn add_inplace(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

/// `x *= s` unless s is 1 (granite's residual and logit multipliers).
fn scale_if(x: &mut [f32], s: f32) {
    if s != 1.0 {
        x.iter_mut().for_each(|v| *v *= s);
    }
}

/// RMSNorm in place over rows of `w.len()` when the model has this norm.
fn rms_norm_if(x: &mut [f32], w: &Option<Vec<f32>>, eps: f32) {
    if let Some(w) = w {
        kernels::rms_norm_inplace(x, w, eps);
    }
}

impl Model {
    /// Runs one step. Writes the batch's keys and values into `kv` at its slot mapping and
    /// returns the logits of `batch.logits_rows`, [logits_rows.len()][vocab_size].
    pub fn forward(&self, batch: &Batch, kv: &mut KvCache) -> Result<Vec<f32>> {
        // On a pool thread, so each kernel's parallel split costs no thread hand-off.
        kernels::in_pool(|| self.forward_step(batch, kv))
    }

    fn forward_step(&self, batch: &Batch, kv: &mut KvCache) -> Result<Vec<f32>> {
        let c = &self.config;
        let g: &GgufFile = &self.file;
        let w = &self.weights;
        let n = batch.n_tokens();
        if n == 0 {
            return Ok(Vec::new());
        }
        if let Some(&bad) = batch.tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            bail!(
                "token id {bad} is outside the vocabulary of {} tokens",
                c.vocab_size
            );
        }
        let (n_embd, q_dim, kv_dim, eps) = (c.n_embd, c.q_dim(), c.kv_dim(), c.rms_eps);
        let context_lens = batch.context_lens();
        let attn_batch = AttentionBatch {
            block_tables: &batch.block_tables,
            max_blocks_per_seq: batch.max_blocks_per_seq,
            token_seq: &batch.token_seq,
            context_lens: &context_lens,
        };

        // x: [n][n_embd], the residual stream, starting from the (scaled) token embeddings.
        let mut x = vec![0.0f32; n * n_embd];
        for (t, &tok) in batch.tokens.iter().enumerate() {
            w.token_embd
                .dequantize_row(g, tok as usize, &mut x[t * n_embd..(t + 1) * n_embd]);
        }
        if c.embd_scale != 1.0 {
            x.iter_mut().for_each(|v| *v *= c.embd_scale);
        }

        let mut h = vec![0.0f32; n * n_embd]; // normed input, [n][n_embd]
        let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new()); // [n][q_dim], [n][kv_dim] x2
        let mut attn = vec![0.0f32; n * q_dim]; // [n][q_dim]
        let (mut proj, mut gate, mut up) = (Vec::new(), Vec::new(), Vec::new()); // [n][n_embd], [n][n_ff] x2

        for (l, (lw, lo)) in w.layers.iter().zip(&c.layers).enumerate() {
            // Attention block: q, k, v (each head's q and k normed where the model does so),
            // rotated, k and v cached, attention over the layer's window, output projection.
            kernels::rms_norm(&x, &lw.attn_norm, &mut h, eps);
            let mut hq = Quantized::new(&h, n_embd);
            hq.linear(g, &lw.wq, &mut q);
            hq.linear(g, &lw.wk, &mut k);
            hq.linear(g, &lw.wv, &mut v);
            rms_norm_if(&mut q, &lw.attn_q_norm, eps);
            rms_norm_if(&mut k, &lw.attn_k_norm, eps);
            if let Some(rope) = &lo.rope {
                kernels::rope(&mut q, &batch.positions, c.n_heads, rope);
                kernels::rope(&mut k, &batch.positions, c.n_kv_heads, rope);
            }
            let (k_cache, v_cache) = kv.layer_mut(l);
            kernels::kv_write(&k, &v, k_cache, v_cache, &batch.slot_mapping, kv_dim);
            let (k_cache, v_cache) = kv.layer(l);
            kernels::paged_attention(
                &mut attn,
                &q,
                k_cache,
                v_cache,
                &kv.shape(c),
                &attn_batch,
                c.attn_scale,
                lo.window,
            );
            Quantized::new(&attn, q_dim).linear(g, &lw.wo, &mut proj);
            rms_norm_if(&mut proj, &lw.attn_post_norm, eps);
            scale_if(&mut proj, c.residual_scale);
            add_inplace(&mut x, &proj);

            // Feed-forward block.
            kernels::rms_norm(&x, &lw.ffn_norm, &mut h, eps);
            let mut hq = Quantized::new(&h, n_embd);
            hq.matmul(g, &lw.w_gate, &mut gate);
            hq.matmul(g, &lw.w_up, &mut up);
            kernels::glu_inplace(&mut gate, &up, c.activation);
            Quantized::new(&gate, c.n_ff).matmul(g, &lw.w_down, &mut proj);
            rms_norm_if(&mut proj, &lw.ffn_post_norm, eps);
            scale_if(&mut proj, c.residual_scale);
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
        kernels::rms_norm_inplace(&mut last, &w.output_norm, eps);
        let mut logits = Vec::new();
        Quantized::new(&last, n_embd).linear(g, &w.output, &mut logits);
        scale_if(&mut logits, 1.0 / c.logit_scale);
        if let Some(cap) = c.final_logit_softcap {
            logits.iter_mut().for_each(|z| *z = cap * (*z / cap).tanh());
        }
        Ok(logits)
    }
}

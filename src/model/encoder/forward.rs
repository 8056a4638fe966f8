//! The encoder's forward pass over one whole sequence, as llama.cpp's `bert` graph
//! (src/models/bert.cpp) computes it for `bert` and `nomic-bert`:
//!
//! embeddings (token + type 0 + position, or rotary positions later) -> LayerNorm, then per
//! layer: Q, K, V (+ biases) -> rope (nomic-bert) -> attention over the whole sequence ->
//! output projection -> residual -> LayerNorm -> feed-forward (GELU, or SwiGLU) -> residual ->
//! LayerNorm. No KV cache: every token attends to every other at once.
//!
//! Matrix products run on `crate::kernels` (activations quantized to the weight's vec-dot type,
//! as the CPU backend and ggml do); the LayerNorm, GELU and attention are here, scalar, in the
//! order of ggml's CPU operations.

use anyhow::{bail, Result};
use half::f16;
use rayon::prelude::*;

use super::config::EncoderConfig;
use super::weights::{Dense, EncoderWeights, Norm};
use crate::gguf::GgufFile;
use crate::kernels::{self, rows, Activation};

/// Every token's final hidden state, `[tokens.len()][n_embd]`.
pub fn encode(
    g: &GgufFile,
    c: &EncoderConfig,
    w: &EncoderWeights,
    tokens: &[u32],
) -> Result<Vec<f32>> {
    let (n_tokens, n) = (tokens.len(), c.n_embd);
    if n_tokens == 0 {
        bail!("nothing to encode: no tokens");
    }
    if n_tokens > c.n_ctx_train {
        bail!(
            "{n_tokens} tokens are more than the {} positions this encoder takes",
            c.n_ctx_train
        );
    }
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
        bail!(
            "token id {bad} is outside the vocabulary of {}",
            c.vocab_size
        );
    }

    // x: [n_tokens][n_embd]
    let mut x = vec![0.0f32; n_tokens * n];
    let mut pos_row = vec![0.0f32; n];
    for (t, (&tok, row)) in tokens.iter().zip(x.chunks_exact_mut(n)).enumerate() {
        lookup(g, &w.token_embd, tok as usize, row);
        if let Some(type0) = &w.token_type0 {
            rows::add_inplace(row, type0);
        }
        if let Some(pos) = &w.position_embd {
            lookup(g, pos, t, &mut pos_row);
            rows::add_inplace(row, &pos_row);
        }
    }
    layer_norm(&mut x, &w.embd_norm, c.norm_eps);

    let positions: Vec<i32> = (0..n_tokens as i32).collect();
    for layer in &w.layers {
        // q: [n_tokens][n_heads][head_dim], k and v: [n_tokens][n_kv_heads][head_dim]
        let mut q = linear(g, &layer.q, &x);
        let mut k = linear(g, &layer.k, &x);
        let v = linear(g, &layer.v, &x);
        if let Some(rope) = &c.rope {
            kernels::rope(&mut q, &positions, c.n_heads, rope);
            kernels::rope(&mut k, &positions, c.n_kv_heads, rope);
        }
        let attn = attention(c, &q, &k, &v, n_tokens);
        let mut cur = linear(g, &layer.output, &attn);
        rows::add_inplace(&mut cur, &x);
        layer_norm(&mut cur, &layer.attn_norm, c.norm_eps);

        // h: [n_tokens][n_ff]
        let h = match &layer.gate {
            Some(gate) => {
                let mut h = linear(g, gate, &cur);
                let up = linear(g, &layer.up, &cur);
                kernels::glu_inplace(&mut h, &up, Activation::SwiGlu);
                h
            }
            None => {
                let mut h = linear(g, &layer.up, &cur);
                h.iter_mut().for_each(|v| *v = gelu(*v));
                h
            }
        };
        let mut out = linear(g, &layer.down, &h);
        rows::add_inplace(&mut out, &cur);
        layer_norm(&mut out, &layer.out_norm, c.norm_eps);
        x = out;
    }
    Ok(x)
}

/// Row `r` of a lookup table (`token_embd`, `position_embd`) as f32.
fn lookup(g: &GgufFile, m: &crate::model::weights::MatrixInfo, r: usize, out: &mut [f32]) {
    let rb = m.row_bytes();
    kernels::dequantize_row(m.ttype, &m.bytes(g)[r * rb..(r + 1) * rb], out);
}

/// `x @ weight^T + bias`: [n_rows][n_out] from x of [n_rows][n_in].
pub(super) fn linear(g: &GgufFile, d: &Dense, x: &[f32]) -> Vec<f32> {
    let m = &d.weight;
    let n_rows = x.len() / m.n_in;
    let a = kernels::quantize_rows(m.ttype.vec_dot_type(), x, m.n_in);
    let mut out = vec![0.0f32; n_rows * m.n_out];
    kernels::matmul(m.ttype, m.bytes(g), m.n_in, m.n_out, &a, n_rows, &mut out);
    if let Some(b) = &d.bias {
        rows::add_bias(&mut out, b);
    }
    out
}

/// LayerNorm of each row in place: `(x - mean) / sqrt(var + eps) * weight + bias` (ggml_norm,
/// then ggml_mul and ggml_add).
fn layer_norm(x: &mut [f32], norm: &Norm, eps: f32) {
    let n = norm.weight.len();
    for row in x.chunks_exact_mut(n) {
        let mean = (row.iter().map(|&v| v as f64).sum::<f64>() / n as f64) as f32;
        let mut var = 0.0f64;
        for v in row.iter_mut() {
            *v -= mean;
            var += (*v as f64) * (*v as f64);
        }
        let scale = 1.0 / ((var / n as f64) as f32 + eps).sqrt();
        for ((v, &wt), &b) in row.iter_mut().zip(&norm.weight).zip(&norm.bias) {
            *v = *v * scale * wt + b;
        }
    }
}

/// ggml's CPU GELU: the tanh approximation, read from a table of F16 inputs and outputs
/// (GGML_GELU_FP16), 0 below -10 and the identity above 10.
fn gelu(x: f32) -> f32 {
    const GELU_COEF_A: f32 = 0.044715;
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    if x <= -10.0 {
        return 0.0;
    }
    if x >= 10.0 {
        return x;
    }
    let x = f16::from_f32(x).to_f32();
    let y = 0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)).tanh());
    f16::from_f32(y).to_f32()
}

/// Softmax attention of every query over every key of the sequence (only those at or before it
/// when the encoder is causal), scaled by 1/sqrt(head_dim): `[n_tokens][n_heads * head_dim]`.
fn attention(c: &EncoderConfig, q: &[f32], k: &[f32], v: &[f32], n_tokens: usize) -> Vec<f32> {
    let (hd, n_heads, kv_dim) = (c.head_dim, c.n_heads, c.kv_dim());
    let group = c.n_heads / c.n_kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let mut out = vec![0.0f32; n_tokens * n_heads * hd];
    out.par_chunks_mut(n_heads * hd)
        .enumerate()
        .for_each(|(i, out_row)| {
            let n_keys = if c.causal { i + 1 } else { n_tokens };
            let mut scores = vec![0.0f32; n_keys];
            for h in 0..n_heads {
                let qh = &q[(i * n_heads + h) * hd..][..hd];
                let kv_off = (h / group) * hd;
                for (j, s) in scores.iter_mut().enumerate() {
                    let kh = &k[j * kv_dim + kv_off..][..hd];
                    *s = qh.iter().zip(kh).map(|(a, b)| a * b).sum::<f32>() * scale;
                }
                let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
                let mut sum = 0.0f64;
                for s in scores.iter_mut() {
                    *s = (*s - max).exp();
                    sum += *s as f64;
                }
                let inv = (1.0 / sum) as f32;
                let oh = &mut out_row[h * hd..(h + 1) * hd];
                oh.fill(0.0);
                for (j, &p) in scores.iter().enumerate() {
                    let vh = &v[j * kv_dim + kv_off..][..hd];
                    for (o, &vv) in oh.iter_mut().zip(vh) {
                        *o += p * inv * vv;
                    }
                }
            }
        });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_matches_the_tanh_form_within_f16() {
        for &x in &[-3.0f32, -0.5, 0.0, 0.3, 1.0, 2.5] {
            let exact = 0.5 * x * (1.0 + (0.797_884_6 * x * (1.0 + 0.044715 * x * x)).tanh());
            assert!(
                (gelu(x) - exact).abs() <= 2e-3 * exact.abs().max(1.0),
                "{x}"
            );
        }
        assert_eq!(gelu(-11.0), 0.0);
        assert_eq!(gelu(12.0), 12.0);
    }

    #[test]
    fn layer_norm_centres_and_scales() {
        let norm = Norm {
            weight: vec![2.0; 4],
            bias: vec![1.0; 4],
        };
        let mut x = vec![1.0, 2.0, 3.0, 4.0];
        layer_norm(&mut x, &norm, 0.0);
        let mean: f32 = x.iter().map(|v| (v - 1.0) / 2.0).sum::<f32>() / 4.0;
        let var: f32 = x.iter().map(|v| ((v - 1.0) / 2.0).powi(2)).sum::<f32>() / 4.0;
        assert!(mean.abs() < 1e-6 && (var - 1.0).abs() < 1e-5, "{x:?}");
    }
}

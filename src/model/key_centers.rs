//! Key centers: what a quantized KV cache subtracts from every key before storing it.
//!
//! Attention's softmax does not change when the same vector `c` is subtracted from every key a
//! query reads: each score moves by `q . c`, the same for all of them. A quantized cache can use
//! that to store keys with a smaller range. Qwen2's key biases are the case in point: on Qwen2.5
//! Coder 0.5B the first layer's bias reaches 145 on the slowest rotary pairs (against single
//! digits elsewhere), so a q8_0 block holding it quantizes the other channels in steps of about 1.
//! The rotary embedding turns the bias with the position, but its slow pairs barely move over a
//! context, so the center is the bias's mean over a context's positions after the rotary
//! embedding: close to the bias on those pairs, close to zero on the fast ones.
//!
//! The center depends only on the model, so a key is stored the same whatever the batch, chunk
//! or cache path. Layers with a key norm (the norm follows the bias) or no key bias have none, and
//! an f16 cache stores keys as they are.

use crate::kernels::{self, Rope};

use super::ModelConfig;

/// Positions sampled over the context for the mean.
const SAMPLES: usize = 1024;
/// The context the mean is taken over (or the model's training context if shorter): a typical
/// session's. On Qwen2.5 Coder 0.5B with q8_0 keys, perplexity at 512 tokens of context is
/// +0.31% of f16's with it, +0.84% over the training context's 32,768, +3.4% with no center.
const HORIZON: usize = 4096;

/// Each layer's key center, [kv_dim] or none, for a model whose layers have key biases
/// `k_biases` (and key norms where `k_normed`).
pub fn key_centers(
    c: &ModelConfig,
    k_biases: &[Option<&[f32]>],
    k_normed: &[bool],
) -> Vec<Option<Vec<f32>>> {
    let kv_dim = c.kv_dim();
    let n_ctx = c.n_ctx_train.clamp(1, HORIZON);
    let positions: Vec<i32> = (0..SAMPLES.min(n_ctx))
        .map(|i| (i * n_ctx / SAMPLES.min(n_ctx)) as i32)
        .collect();
    (0..c.layers.len())
        .map(|l| {
            let bias = k_biases.get(l).copied().flatten()?;
            if k_normed.get(l).copied().unwrap_or(true) || bias.len() != kv_dim {
                return None;
            }
            Some(match &c.layers[l].rope {
                Some(rope) => mean_after_rope(bias, &positions, c.n_kv_heads, rope),
                None => bias.to_vec(),
            })
        })
        .collect()
}

/// The mean over `positions` of `bias` after the rotary embedding at each of them.
fn mean_after_rope(bias: &[f32], positions: &[i32], n_heads: usize, rope: &Rope) -> Vec<f32> {
    let mut rows: Vec<f32> = positions
        .iter()
        .flat_map(|_| bias.iter().copied())
        .collect();
    kernels::rope(&mut rows, positions, n_heads, rope);
    let mut sum = vec![0.0f64; bias.len()];
    for row in rows.chunks_exact(bias.len()) {
        for (s, &x) in sum.iter_mut().zip(row) {
            *s += x as f64;
        }
    }
    sum.iter()
        .map(|s| (s / positions.len() as f64) as f32)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::RopeStyle;

    #[test]
    fn slow_pairs_keep_the_bias_and_fast_ones_average_out() {
        let rope = Rope {
            head_dim: 64,
            rope_dim: 64,
            freq_base: 1e6,
            freq_scale: 1.0,
            style: RopeStyle::Neox,
            freq_factors: None,
            yarn: None,
        };
        let bias = vec![100.0f32; 64];
        let positions: Vec<i32> = (0..1024).map(|i| i * 32).collect();
        let c = mean_after_rope(&bias, &positions, 1, &rope);
        // Pair 31 (dims 31 and 63) turns by about 1.5e-6 per position: nearly the bias.
        assert!(
            (c[31] - 100.0).abs() < 15.0 && (c[63] - 100.0).abs() < 15.0,
            "{c:?}"
        );
        // Pair 0 turns by one radian per position: its mean is small.
        assert!(c[0].abs() < 5.0 && c[32].abs() < 5.0, "{c:?}");
    }
}

//! The forward pass over a batch, written once for every backend and reading like the paper:
//! embedding, then per layer RMSNorm, attention (through the paged KV cache) or, in a hybrid
//! model's recurrent layers, LFM2's short convolution, Mamba-2 or Qwen3.5's gated delta-net
//! (through each sequence's state slot),
//! residual, RMSNorm, gated feed-forward, residual; then the final norm and the logits of the
//! rows that asked for them, and the normed hidden states (embeddings) of the rows that asked
//! for those.
//!
//! One function runs every family: what differs (Q/K/V biases, fused QKV and gate/up tensors,
//! QK-norm, post-norms, attention sinks, a mixture of experts in place of the dense feed-forward block
//! (`super::moe`), embedding, residual and logit multipliers, activation, each layer's rope
//! (or none: NoPE) and sliding window, logit soft-capping) is data in
//! [`ModelConfig`] and [`Weights`], read from the GGUF. What differs between devices is the
//! [`Backend`] (`super::cpu`, `crate::cuda::backend`).
//!
//! Each row's arithmetic is the same whatever else is in the batch: matrix products compute
//! every output element as one dot product, norms and attention are per row. So a sequence's
//! output does not depend on batching, chunking or caching.

use std::sync::Arc;

use anyhow::{bail, Context, Result};

use super::backend::Backend;
use super::moe::experts_ffn;
use super::moe_gemma4;
use super::per_layer;
use super::weights::{FeedForward, Linear, Mixer, Weights};
use super::{Batch, ModelConfig};

/// A backend with the model's weights loaded on it: what runs steps.
pub struct Loaded<B: Backend> {
    pub backend: B,
    pub weights: Arc<Weights<B>>,
}

impl<B: Backend> Loaded<B> {
    /// Runs one step of the model of `c`; see [`forward`].
    pub fn forward(&mut self, c: &ModelConfig, batch: &Batch) -> Result<Vec<f32>> {
        forward(&mut self.backend, &self.weights, c, batch)
    }

    /// Runs one step of the model of `c`, logits and embeddings; see [`forward_rows`].
    pub fn forward_rows(&mut self, c: &ModelConfig, batch: &Batch) -> Result<StepOutput> {
        forward_rows(&mut self.backend, &self.weights, c, batch)
    }
}

/// What one step returns: the logits of `batch.logits_rows`, [logits_rows.len()][vocab_size],
/// and the embeddings of `batch.embd_rows` (the last hidden state after the output norm, what
/// llama.cpp pools), [embd_rows.len()][n_embd].
#[derive(Clone, Debug, Default)]
pub struct StepOutput {
    pub logits: Vec<f32>,
    pub embd: Vec<f32>,
}

/// `out = x @ l.weight^T + l.bias`: [n_rows][n_out].
fn linear<B: Backend>(
    b: &mut B,
    x: &mut B::Input<'_>,
    l: &Linear<B>,
    out: &mut B::Acts,
) -> Result<()> {
    b.matmul(x, &l.weight, out)?;
    add_bias_of(b, l, out)
}

/// `out[r] += l`'s bias, if it has one.
fn add_bias_of<B: Backend>(b: &mut B, l: &Linear<B>, out: &mut B::Acts) -> Result<()> {
    match &l.bias {
        Some(bias) => b.add_bias(out, bias),
        None => Ok(()),
    }
}

/// `out = x @ m^T` for an input no other matrix reads.
fn matmul_of<B: Backend>(b: &mut B, x: &B::Acts, m: &B::Matrix, out: &mut B::Acts) -> Result<()> {
    let mut xq = b.input(x);
    b.matmul(&mut xq, m, out)
}

/// `out = x @ l.weight^T + l.bias` for an input no other matrix reads.
fn linear_of<B: Backend>(b: &mut B, x: &B::Acts, l: &Linear<B>, out: &mut B::Acts) -> Result<()> {
    let mut xq = b.input(x);
    linear(b, &mut xq, l, out)
}

/// `x *= s` unless `s` is 1 (granite's residual and logit multipliers).
fn scale_if<B: Backend>(b: &mut B, x: &mut B::Acts, s: f32) -> Result<()> {
    if s != 1.0 {
        b.scale(x, s)?;
    }
    Ok(())
}

/// Runs one step: checks the batch against the model and the KV pool, writes the batch's keys
/// and values into the pool at its slot mapping, and returns the logits of
/// `batch.logits_rows`, [logits_rows.len()][vocab_size].
pub fn forward<B: Backend>(
    b: &mut B,
    w: &Weights<B>,
    c: &ModelConfig,
    batch: &Batch,
) -> Result<Vec<f32>> {
    Ok(forward_rows(b, w, c, batch)?.logits)
}

/// [`forward`], also returning the embeddings of `batch.embd_rows` ([`StepOutput`]).
pub fn forward_rows<B: Backend>(
    b: &mut B,
    w: &Weights<B>,
    c: &ModelConfig,
    batch: &Batch,
) -> Result<StepOutput> {
    let n = batch.n_tokens();
    if n == 0 {
        return Ok(StepOutput::default());
    }
    let (block_size, num_blocks) = b.kv_pool();
    batch.validate(c.vocab_size, block_size, num_blocks)?;
    if c.is_recurrent() && batch.state_slots.len() != batch.n_seqs() {
        bail!("a model with recurrent layers needs a state slot for each sequence of the batch");
    }
    if !batch.state_slots.is_empty() && b.state_pool() == 0 {
        bail!("the batch names state slots, but the backend has no state pool");
    }
    b.begin_step(batch)?;
    let (n_embd, eps) = (c.n_embd, c.rms_eps);
    // The attention buffers' widths, remade where a layer's geometry differs (gemma4).
    let (mut q_dim, mut kv_dim) = (c.layer_q_dim(0), c.layer_kv_dim(0));
    // The dense block's width (none when every layer is a mixture of experts alone).
    let dense = |l: &super::weights::LayerWeights<B>| matches!(l.ffn, FeedForward::Dense(_));
    let n_ff = if w.layers.iter().any(dense) {
        c.n_ff
    } else {
        0
    };

    // x: [n][n_embd], the residual stream, starting from the (scaled) token embeddings.
    let mut x = b.acts(n, n_embd)?;
    b.embed(&w.token_embd, c.embd_scale, &mut x)?;
    // gemma4 E2B/E4B: every layer's per-layer input, [n][n_layer * n_pl].
    let mut ple = match &w.per_layer {
        Some(p) => Some(per_layer::inputs(b, p, c, &x, n)?),
        None => None,
    };

    let mut h = b.acts(n, n_embd)?; // normed input
    let (mut q, mut k, mut v) = (b.acts(n, q_dim)?, b.acts(n, kv_dim)?, b.acts(n, kv_dim)?);
    let mut attn = b.acts(n, q_dim)?;
    let mut proj = b.acts(n, n_embd)?; // a block's output before its residual add
    let (mut gate, mut up) = (b.acts(n, n_ff)?, b.acts(n, n_ff)?);
    // A short convolution's in_proj output (b, c, x) and its gated output, where the model
    // has such layers.
    let conv_width = if c.conv_l_cache > 0 { n_embd } else { 0 };
    let (mut bcx, mut conv) = (b.acts(n, 3 * conv_width)?, b.acts(n, conv_width)?);
    // A Mamba-2 layer's in_proj output (z, xBC, dt) and its gated scan, where it has such layers.
    let (zx_width, ssm_width) = c.ssm.map_or((0, 0), |s| (s.d_in_proj(), s.d_inner()));
    let (mut zxbcdt, mut ssm_y) = (b.acts(n, zx_width)?, b.acts(n, ssm_width)?);
    let mut r = 0; // recurrent layers so far: the index of a layer's state in a slot
                   // Qwen3.5's gated q projection, [n][n_heads][2][head_dim]: queries and gates.
    let gated = |l: &super::weights::LayerWeights<B>| l.attention().is_some_and(|a| a.q_gate);
    let mut qg = b.acts(
        n,
        if w.layers.iter().any(gated) {
            2 * q_dim
        } else {
            0
        },
    )?;

    // Each block's input norm runs with the residual add before it (`add_rms_norm`), the
    // first layer's alone.
    if let Some(first) = w.layers.first() {
        b.rms_norm(&x, &first.attn_norm, eps, &mut h)?;
    }
    for (l, (lw, lo)) in w.layers.iter().zip(&c.layers).enumerate() {
        if (c.layer_q_dim(l), c.layer_kv_dim(l)) != (q_dim, kv_dim) {
            (q_dim, kv_dim) = (c.layer_q_dim(l), c.layer_kv_dim(l));
            for (buf, width) in [
                (&mut q, q_dim),
                (&mut k, kv_dim),
                (&mut v, kv_dim),
                (&mut attn, q_dim),
            ] {
                let old = std::mem::replace(buf, b.acts(n, width)?);
                b.recycle(old);
            }
        }
        match &lw.mixer {
            // Attention block (on `h`, the normed input): q, k, v (each head's q and k normed
            // where the model does so), rotated, k and v cached, attention over the layer's
            // window, output projection.
            // A layer sharing an earlier layer's KV (gemma4) computes only its queries.
            Mixer::Attention(a) => {
                let own_kv = lo.kv_layer == l;
                let mut hq = b.input(&h); // quantized once for q, k and v, multiplied in one call
                let q_out = if a.q_gate { &mut qg } else { &mut q };
                if own_kv {
                    let qkv = [(&a.wq, q_out), (&a.wk, &mut k), (&a.wv, &mut v)];
                    let mut products = qkv.map(|(l, out)| (&l.weight, out));
                    b.matmul_many(&mut hq, &mut products)?;
                } else {
                    b.matmul(&mut hq, &a.wq.weight, q_out)?;
                }
                drop(hq);
                add_bias_of(b, &a.wq, if a.q_gate { &mut qg } else { &mut q })?;
                if a.q_gate {
                    b.split_q_gate(&qg, lo.head_dim, &mut q)?;
                }
                if own_kv {
                    add_bias_of(b, &a.wk, &mut k)?;
                    add_bias_of(b, &a.wv, &mut v)?;
                }
                if let Some(norm) = &a.attn_q_norm {
                    b.rms_norm_inplace(&mut q, norm, eps)?;
                }
                if let Some(rope) = &lo.rope {
                    b.rope(&mut q, c.n_heads, rope)?;
                }
                if own_kv {
                    if let Some(norm) = &a.attn_k_norm {
                        b.rms_norm_inplace(&mut k, norm, eps)?;
                    }
                    if let Some(norm) = &a.attn_v_norm {
                        b.rms_norm_inplace(&mut v, norm, eps)?;
                    }
                    if let Some(rope) = &lo.rope {
                        b.rope(&mut k, lo.n_kv_heads, rope)?;
                    }
                    b.kv_write(l, &k, &v)?;
                }
                b.attention(lo.kv_layer, &q, lo.window, a.attn_sinks.as_ref(), &mut attn)?;
                if a.q_gate {
                    b.sigmoid_gate(&mut attn, &qg, lo.head_dim)?;
                }
                linear_of(b, &attn, &a.wo, &mut proj)?;
                if let Some(norm) = &a.attn_post_norm {
                    b.rms_norm_inplace(&mut proj, norm, eps)?;
                }
            }
            // Short convolution block (LFM2): b, c, x from one product; y = c * conv(b * x)
            // over each sequence's state and tokens; output projection.
            Mixer::ShortConv(sc) => {
                matmul_of(b, &h, &sc.in_proj, &mut bcx)?;
                b.short_conv(r, &bcx, &sc.conv, &mut conv)?;
                matmul_of(b, &conv, &sc.out_proj, &mut proj)?;
                r += 1;
            }
            // Mamba-2 block (granitehybrid): z, xBC and dt from one product; the convolution and
            // the selective scan over each sequence's state and tokens, gated and normed;
            // output projection.
            Mixer::Mamba2(m) => {
                let shape = c.ssm.context("Mamba-2 weights without their shape")?;
                matmul_of(b, &h, &m.in_proj, &mut zxbcdt)?;
                b.mamba2(r, &zxbcdt, m, shape, eps, &mut ssm_y)?;
                matmul_of(b, &ssm_y, &m.out_proj, &mut proj)?;
                r += 1;
            }
            // Gated delta-net block (Qwen3.5, `super::delta_net`) over each sequence's state.
            Mixer::DeltaNet(dn) => {
                super::delta_net::block(b, dn, c, r, &h, n, &mut proj)?;
                r += 1;
            }
        }
        scale_if(b, &mut proj, c.residual_scale)?;
        b.add_rms_norm(&mut x, &proj, &lw.ffn_norm, eps, &mut h)?;

        // Feed-forward block: gate and up from the same normed input, the gated activation,
        // down projection; or the same in each of the experts a row's router chooses.
        match &lw.ffn {
            FeedForward::Dense(mlp) => {
                let mut hq = b.input(&h); // quantized once for gate and up, multiplied in one call
                b.matmul_many(&mut hq, &mut [(&mlp.gate, &mut gate), (&mlp.up, &mut up)])?;
                drop(hq);
                b.glu(&mut gate, &up, c.activation)?;
                matmul_of(b, &gate, &mlp.down, &mut proj)?;
            }
            FeedForward::Experts {
                router,
                experts,
                shared,
            } => {
                experts_ffn(b, router, experts, c, &h, n, &mut proj)?;
                if let Some(mlp) = shared {
                    super::moe::add_shared_expert(b, mlp, c, &h, n, &mut proj)?;
                }
            }
            FeedForward::SharedExperts(m) => moe_gemma4::ffn(b, m, c, &x, &h, n, &mut proj)?,
            FeedForward::SharedGated(m) => super::moe_qwen35::ffn(b, m, c, &h, n, &mut proj)?,
        }
        if let Some(norm) = &lw.ffn_post_norm {
            b.rms_norm_inplace(&mut proj, norm, eps)?;
        }
        scale_if(b, &mut proj, c.residual_scale)?;
        match (w.layers.get(l + 1), lw.out_scale, &lw.per_layer) {
            (Some(next), None, None) => {
                b.add_rms_norm(&mut x, &proj, &next.attn_norm, eps, &mut h)?
            }
            (None, None, None) => b.add(&mut x, &proj)?,
            // gemma4: the per-layer input's block, then the whole residual stream scaled.
            (next, scale, per_layer) => {
                b.add(&mut x, &proj)?;
                if let (Some(blk), Some(all)) = (per_layer, ple.take()) {
                    ple = Some(per_layer::block(b, blk, c, l, all, &mut x, n)?);
                }
                scale_if(b, &mut x, scale.unwrap_or(1.0))?;
                if let Some(next) = next {
                    b.rms_norm(&x, &next.attn_norm, eps, &mut h)?;
                }
            }
        }
    }

    for buffer in [
        h, q, k, v, qg, attn, proj, gate, up, bcx, conv, zxbcdt, ssm_y,
    ]
    .into_iter()
    .chain(ple)
    {
        b.recycle(buffer);
    }

    // Embeddings: the final norm of the rows that want them, read back as they are.
    let embd = match batch.embd_rows.len() {
        0 => Vec::new(),
        n_embd_rows => {
            let rows: Vec<u32> = batch.embd_rows.iter().map(|&r| r as u32).collect();
            let mut e = b.acts(n_embd_rows, n_embd)?;
            b.gather_rows(&x, &rows, &mut e)?;
            b.rms_norm_inplace(&mut e, &w.output_norm, eps)?;
            let host = b.read(&e)?;
            b.recycle(e);
            host
        }
    };

    // Final norm and logits, only for the rows that want them.
    let n_out = batch.logits_rows.len();
    if n_out == 0 {
        b.recycle(x);
        b.end_step()?;
        return Ok(StepOutput {
            logits: Vec::new(),
            embd,
        });
    }
    let mut last = b.acts(n_out, n_embd)?;
    b.gather_logits_rows(&x, &mut last)?;
    b.recycle(x);
    b.rms_norm_inplace(&mut last, &w.output_norm, eps)?;
    let mut logits = b.acts(n_out, c.vocab_size)?;
    match &w.output {
        Some(output) => linear_of(b, &last, output, &mut logits)?,
        None => matmul_of(b, &last, &w.token_embd, &mut logits)?, // tied to the embedding
    }
    b.recycle(last);
    scale_if(b, &mut logits, 1.0 / c.logit_scale)?;
    if let Some(cap) = c.final_logit_softcap {
        b.softcap(&mut logits, cap)?;
    }
    Ok(StepOutput {
        logits: b.logits(logits)?,
        embd,
    })
}

//! What a device must offer to run the forward pass: the [`Backend`] trait. The layer loop
//! (`super::forward`) is written once against it; the CPU backend (`super::cpu`) wraps
//! `crate::kernels` and the paged KV pool, the CUDA backend (`crate::cuda::backend`) launches the
//! same operations on a GPU or on its CPU emulator.
//!
//! A backend keeps its own weights ([`WeightStore`]: matrices as it multiplies them, f32
//! vectors for norms and biases), its activations ([`Backend::Acts`], rows of f32) and its KV
//! pool. One step goes: [`Backend::begin_step`] with the batch (validated before by the caller),
//! then the operations in the order the layer loop calls them, then [`Backend::logits`].
//! Every operation works on whole rows, so a row's result never depends on what else is in the
//! batch.

use anyhow::Result;

use super::delta_net::DeltaNet;
use super::kv_cache::BlockId;
use super::state_pool::StateSlot;
use super::Batch;
use crate::kernels::{Activation, DeltaNetShape, Rope};

/// How a backend keeps the model's weights (`super::Weights<S>` is generic over it).
pub trait WeightStore {
    /// A weight matrix of `n_out` rows of `n_in` elements, in whatever layout the backend's
    /// products read.
    type Matrix;
    /// An f32 vector: a norm's weights or a bias.
    type Vector;
}

/// The operations of the forward pass. Shapes are in rows: `Acts` of `[n_rows][width]`.
pub trait Backend: WeightStore {
    /// Activations, `[n_rows][width]` f32, in the backend's memory.
    type Acts;
    /// Activations as a product reads them: quantized on first use for each weight type and
    /// reused by every matrix that reads the same input (q, k and v; gate and up).
    type Input<'a>
    where
        Self: 'a;

    /// The KV pool's geometry: (block_size, num_blocks), to validate a batch against.
    fn kv_pool(&self) -> (usize, usize);
    /// Starts a step over `batch` (already validated): the backend keeps what the addressing
    /// operations need (tokens, positions, slots, block tables, logits rows).
    fn begin_step(&mut self, batch: &Batch) -> Result<()>;
    /// Activations of `[n_rows][width]`, possibly a buffer given back by [`Backend::recycle`]
    /// with its old contents: every operation writes the whole of its output.
    fn acts(&mut self, n_rows: usize, width: usize) -> Result<Self::Acts>;
    /// Gives back activations the step no longer reads, for a later [`Backend::acts`] to reuse
    /// (by default they are dropped).
    fn recycle(&mut self, x: Self::Acts) {
        drop(x);
    }

    /// `x[t]` = row `tokens[t]` of the embedding matrix `m`, times `scale`.
    fn embed(&mut self, m: &Self::Matrix, scale: f32, x: &mut Self::Acts) -> Result<()>;
    /// `y = x / rms(x) * w` over rows of `w`'s length.
    fn rms_norm(
        &mut self,
        x: &Self::Acts,
        w: &Self::Vector,
        eps: f32,
        y: &mut Self::Acts,
    ) -> Result<()>;
    /// RMSNorm in place over rows of `w`'s length (`[n][n_heads * head_dim]` with a
    /// `[head_dim]` weight normalizes each head).
    fn rms_norm_inplace(&mut self, x: &mut Self::Acts, w: &Self::Vector, eps: f32) -> Result<()>;
    /// `x` ready for products (nothing quantized yet).
    fn input<'a>(&self, x: &'a Self::Acts) -> Self::Input<'a>;
    /// `out = x @ m^T`: `[n_rows][m.n_out]`.
    fn matmul(
        &mut self,
        x: &mut Self::Input<'_>,
        m: &Self::Matrix,
        out: &mut Self::Acts,
    ) -> Result<()>;
    /// `out = x @ m^T` for each `(m, out)` of `products`, matrices that read the same input
    /// (q, k and v; gate and up). A backend may run them as one parallel call; each output is
    /// exactly what [`Backend::matmul`] gives.
    fn matmul_many(
        &mut self,
        x: &mut Self::Input<'_>,
        products: &mut [(&Self::Matrix, &mut Self::Acts)],
    ) -> Result<()> {
        for (m, out) in products.iter_mut() {
            self.matmul(x, m, out)?;
        }
        Ok(())
    }
    /// `x[r] += bias` for every row.
    fn add_bias(&mut self, x: &mut Self::Acts, bias: &Self::Vector) -> Result<()>;
    /// Rotates `x` (`[n_tokens][n_heads][head_dim]`), token t at its position in the batch.
    fn rope(&mut self, x: &mut Self::Acts, n_heads: usize, rope: &Rope) -> Result<()>;
    /// Writes keys and values (`[n_tokens][kv_dim]`) into layer `layer`'s pool at the batch's
    /// slot mapping.
    fn kv_write(&mut self, layer: usize, k: &Self::Acts, v: &Self::Acts) -> Result<()>;
    /// Paged attention of the queries `q` (`[n_tokens][n_heads][head_dim]`) over layer
    /// `layer`'s pool, each token seeing its context (the last `window` positions of it when
    /// set), into `out`; with `sinks` (`[n_heads]`, gpt-oss), head h's softmax has one more
    /// logit, `sinks[h]`, with a zero value row.
    fn attention(
        &mut self,
        layer: usize,
        q: &Self::Acts,
        window: Option<usize>,
        sinks: Option<&Self::Vector>,
        out: &mut Self::Acts,
    ) -> Result<()>;
    /// `gate = act(gate) * up`.
    fn glu(&mut self, gate: &mut Self::Acts, up: &Self::Acts, act: Activation) -> Result<()>;
    /// `x += y`.
    fn add(&mut self, x: &mut Self::Acts, y: &Self::Acts) -> Result<()>;
    /// `x += y`, then `out = x / rms(x) * w` over rows of `w`'s length: [`Backend::add`] then
    /// [`Backend::rms_norm`], which a backend may run as one pass.
    fn add_rms_norm(
        &mut self,
        x: &mut Self::Acts,
        y: &Self::Acts,
        w: &Self::Vector,
        eps: f32,
        out: &mut Self::Acts,
    ) -> Result<()> {
        self.add(x, y)?;
        self.rms_norm(x, w, eps, out)
    }
    /// The values of `x` on the host, `[n_rows][width]` (the router's logits, which choose each
    /// row's experts).
    fn read(&mut self, x: &Self::Acts) -> Result<Vec<f32>>;
    /// `out[i] = x[rows[i]]`: the rows one expert reads.
    fn gather_rows(&mut self, x: &Self::Acts, rows: &[u32], out: &mut Self::Acts) -> Result<()>;
    /// `out[rows[i]] = x[i]`: one expert's outputs into their rows; the other rows of `out`
    /// are left as they are.
    fn scatter_rows(&mut self, x: &Self::Acts, rows: &[u32], out: &mut Self::Acts) -> Result<()>;
    /// `out[r] = weights[r*k] * x[r*k] + weights[r*k + 1] * x[r*k + 1] + ...`, added in that
    /// order: `[n][width]` from `x` of `[n * k][width]` (each row's experts, combined).
    fn weighted_sum(
        &mut self,
        x: &Self::Acts,
        weights: &[f32],
        k: usize,
        out: &mut Self::Acts,
    ) -> Result<()>;
    /// `out` = the rows of `x` the batch wants logits for, in its order.
    fn gather_logits_rows(&mut self, x: &Self::Acts, out: &mut Self::Acts) -> Result<()>;
    /// `x *= s`.
    fn scale(&mut self, x: &mut Self::Acts, s: f32) -> Result<()>;
    /// `x = cap * tanh(x / cap)`.
    fn softcap(&mut self, x: &mut Self::Acts, cap: f32) -> Result<()>;
    /// Ends the step: `x`'s values on the host (and no work of this step still running).
    fn logits(&mut self, x: Self::Acts) -> Result<Vec<f32>>;
    /// Ends a step that wants no logits.
    fn end_step(&mut self) -> Result<()>;
    /// The same values seen as `[n_rows][width]` (as many elements as `x` holds).
    fn reshape(&mut self, x: Self::Acts, n_rows: usize, width: usize) -> Result<Self::Acts>;

    /// Copies KV block `src` onto `dst` in every layer (copy-on-write of a shared block).
    fn copy_block(&mut self, src: BlockId, dst: BlockId) -> Result<()>;

    /// Slots of the recurrent state pool (`super::state_pool`; 0: none), to check a batch of a
    /// model with recurrent layers against.
    fn state_pool(&self) -> usize {
        0
    }
    /// LFM2's short convolution in recurrent layer `r` (counting recurrent layers only): `bcx`
    /// `[n_tokens][3][n_embd]` (b, c, x) -> `out` `[n_tokens][n_embd]`, each sequence row
    /// continuing its slot's state and leaving it at its last token (`kernels::short_conv`).
    fn short_conv(
        &mut self,
        r: usize,
        bcx: &Self::Acts,
        conv: &Self::Vector,
        out: &mut Self::Acts,
    ) -> Result<()> {
        let _ = (r, bcx, conv, out);
        anyhow::bail!("this backend has no recurrent layers")
    }
    /// Mamba-2 in recurrent layer `r` (counting recurrent layers only): `zxbcdt`
    /// `[n_tokens][d_in_proj]` (in_proj's output) -> `out` `[n_tokens][d_inner]` (the gated, normed
    /// scan, before out_proj), each sequence row continuing its slot's state (`super::mamba2_cpu`).
    fn mamba2(
        &mut self,
        r: usize,
        zxbcdt: &Self::Acts,
        m: &super::mamba2::Mamba2<Self>,
        shape: super::mamba2::SsmShape,
        eps: f32,
        out: &mut Self::Acts,
    ) -> Result<()>
    where
        Self: Sized,
    {
        let _ = (r, zxbcdt, m, shape, eps, out);
        anyhow::bail!("this backend has no Mamba-2 layers")
    }
    /// Qwen3.5's gated delta-net core in recurrent layer `r`: `qkv` [n_tokens][conv_dim], `alpha`
    /// and `beta` [n_tokens][n_v_heads] -> `out` [n_tokens][value_dim], each sequence row
    /// continuing its slot's state and leaving it at its last token (`kernels::gated_delta_net`).
    #[allow(clippy::too_many_arguments)]
    fn gated_delta_net(
        &mut self,
        r: usize,
        shape: &DeltaNetShape,
        qkv: &Self::Acts,
        alpha: &Self::Acts,
        beta: &Self::Acts,
        w: &DeltaNet<Self>,
        out: &mut Self::Acts,
    ) -> Result<()>
    where
        Self: Sized,
    {
        let _ = (r, shape, qkv, alpha, beta, w, out);
        anyhow::bail!("this backend has no gated delta-net layers")
    }
    /// `q[t][h] = qg[t][h][0..head_dim]` from a gated q projection, `qg` `[n][n_heads][2][head_dim]`
    /// (each head's queries, then its gate).
    fn split_q_gate(&mut self, qg: &Self::Acts, head_dim: usize, q: &mut Self::Acts) -> Result<()> {
        let _ = (qg, head_dim, q);
        anyhow::bail!("this backend has no gated attention")
    }
    /// `x[t][h][d] *= sigmoid(qg[t][h][1][d])`: the attention output times its heads' gates.
    fn sigmoid_gate(&mut self, x: &mut Self::Acts, qg: &Self::Acts, head_dim: usize) -> Result<()> {
        let _ = (x, qg, head_dim);
        anyhow::bail!("this backend has no gated attention")
    }
    /// Copies state slot `src` onto `dst` (a forked sequence).
    fn copy_state(&mut self, src: StateSlot, dst: StateSlot) -> Result<()> {
        let _ = (src, dst);
        anyhow::bail!("this backend has no recurrent state")
    }
}

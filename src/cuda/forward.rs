//! The forward pass on a CUDA device (the GPU, or `super::emu::Emu` in the tests), step for step
//! the one in `crate::model::forward` (embedding, then per layer RMSNorm, attention through the paged KV pool, residual, RMSNorm, gated
//! feed-forward, residual; then the final norm and the logits of the rows that asked for them),
//! with the same per-layer options (biases, QK-norm, post-norms, embedding scale, activation,
//! each layer's rope and window, logit soft-cap). It takes the same [`Batch`]; the batch's
//! integers go up, the layer loop runs on the GPU, and only the logits rows come back.
//!
//! [`CudaModel`] owns what lives on the GPU: the weights, uploaded once from the mmap as stored
//! (quantized), the KV pool (per layer, keys and values [num_blocks][block_size][kv_dim] f16,
//! the CPU `KvCache`'s layout) and scratch buffers that grow to the largest batch seen.

use super::device::Gpu;
use super::kernels::{self as k, DevAttentionBatch, MatmulKernel};
use super::launch::{CudaDevice, DevPtr};
use crate::gguf::GgufFile;
use crate::kernels::AttentionShape;
use crate::model::weights::{Linear, Matrix};
use crate::model::{Batch, Model};
use crate::tensor_type::TensorType;
use anyhow::{bail, Context, Result};

/// A weight matrix on the GPU, bytes as in the file.
struct DevMatrix<D: CudaDevice> {
    ttype: TensorType,
    n_in: usize,
    n_out: usize,
    data: D::Buf,
}

struct DevLinear<D: CudaDevice> {
    weight: DevMatrix<D>,
    bias: Option<D::Buf>,
}

struct DevLayer<D: CudaDevice> {
    attn_norm: D::Buf,
    wq: DevLinear<D>,
    wk: DevLinear<D>,
    wv: DevLinear<D>,
    attn_q_norm: Option<D::Buf>,
    attn_k_norm: Option<D::Buf>,
    wo: DevLinear<D>,
    attn_post_norm: Option<D::Buf>,
    ffn_norm: D::Buf,
    w_gate: DevMatrix<D>,
    w_up: DevMatrix<D>,
    w_down: DevMatrix<D>,
    ffn_post_norm: Option<D::Buf>,
}

/// Activation buffers that grow with the batch: f32 [cap][width] each, plus one buffer of
/// quantized rows per activation type met.
struct Scratch<D: CudaDevice> {
    cap: usize,
    x: D::Buf,
    h: D::Buf,
    q: D::Buf,
    k: D::Buf,
    v: D::Buf,
    attn: D::Buf,
    proj: D::Buf,
    gate: D::Buf,
    up: D::Buf,
    last: D::Buf,
    logits: D::Buf,
    acts: Vec<(TensorType, D::Buf)>,
}

/// The model's weights and KV pool on one GPU.
pub struct CudaModel<D: CudaDevice = Gpu> {
    gpu: D,
    token_embd: DevMatrix<D>,
    layers: Vec<DevLayer<D>>,
    output_norm: D::Buf,
    /// None when the file ties the output projection to the token embedding.
    output: Option<DevLinear<D>>,
    k_cache: Vec<D::Buf>,
    v_cache: Vec<D::Buf>,
    block_size: usize,
    num_blocks: usize,
    scratch: Option<Scratch<D>>,
}

fn upload_matrix<D: CudaDevice>(gpu: &D, g: &GgufFile, m: &Matrix) -> Result<DevMatrix<D>> {
    k::check_weight_type(m.ttype).with_context(|| format!("tensor '{}'", m.info.name))?;
    let data = gpu
        .upload(m.bytes(g))
        .with_context(|| format!("uploading tensor '{}'", m.info.name))?;
    Ok(DevMatrix {
        ttype: m.ttype,
        n_in: m.n_in,
        n_out: m.n_out,
        data,
    })
}

fn upload_linear<D: CudaDevice>(gpu: &D, g: &GgufFile, l: &Linear) -> Result<DevLinear<D>> {
    Ok(DevLinear {
        weight: upload_matrix(gpu, g, &l.weight)?,
        bias: l.bias.as_ref().map(|b| gpu.upload(b)).transpose()?,
    })
}

fn upload_opt<D: CudaDevice>(gpu: &D, v: &Option<Vec<f32>>) -> Result<Option<D::Buf>> {
    v.as_ref().map(|v| gpu.upload(v)).transpose()
}

impl<D: CudaDevice> CudaModel<D> {
    /// Uploads `model`'s weights to `gpu` and allocates a KV pool of `num_blocks` blocks of
    /// `block_size` tokens (the sizes the CPU `KvCache` would take).
    pub fn new(
        gpu: D,
        model: &Model,
        block_size: usize,
        num_blocks: usize,
    ) -> Result<CudaModel<D>> {
        let c = &model.config;
        let g: &GgufFile = &model.file;
        let w = &model.weights;
        if block_size == 0 || num_blocks == 0 {
            bail!("an empty KV pool");
        }
        if c.residual_scale != 1.0 || c.logit_scale != 1.0 {
            bail!("{}'s residual and logit multipliers are not implemented on the CUDA backend yet (it runs on the CPU backend)", c.architecture);
        }
        if let Some(r) = c
            .layers
            .iter()
            .filter_map(|l| l.rope)
            .find(|r| r.freq_factors.is_some() || r.yarn.is_some())
        {
            bail!("rope_freqs and YaRN scaling have no CUDA kernel yet (rope of {} dims; it runs on the CPU backend)", r.rope_dim);
        }
        let kv_bytes = 2 * c.num_layers * num_blocks * block_size * c.kv_dim() * 2;
        let weight_bytes: usize = g.file_bytes() as usize;
        let (free, total) = gpu.mem_info()?;
        if kv_bytes + weight_bytes > free {
            bail!(
                "the weights ({:.0} MiB) and a KV pool of {num_blocks} blocks ({:.0} MiB) do not fit the {:.0} MiB free of {:.0} MiB on {}; lower --kv-mem or --ctx-size",
                weight_bytes as f64 / 1048576.0,
                kv_bytes as f64 / 1048576.0,
                free as f64 / 1048576.0,
                total as f64 / 1048576.0,
                gpu.device_name()
            );
        }
        let token_embd = upload_matrix(&gpu, g, &w.token_embd)?;
        let layers = w
            .layers
            .iter()
            .map(|lw| {
                Ok(DevLayer {
                    attn_norm: gpu.upload(&lw.attn_norm)?,
                    wq: upload_linear(&gpu, g, &lw.wq)?,
                    wk: upload_linear(&gpu, g, &lw.wk)?,
                    wv: upload_linear(&gpu, g, &lw.wv)?,
                    attn_q_norm: upload_opt(&gpu, &lw.attn_q_norm)?,
                    attn_k_norm: upload_opt(&gpu, &lw.attn_k_norm)?,
                    wo: upload_linear(&gpu, g, &lw.wo)?,
                    attn_post_norm: upload_opt(&gpu, &lw.attn_post_norm)?,
                    ffn_norm: gpu.upload(&lw.ffn_norm)?,
                    w_gate: upload_matrix(&gpu, g, &lw.w_gate)?,
                    w_up: upload_matrix(&gpu, g, &lw.w_up)?,
                    w_down: upload_matrix(&gpu, g, &lw.w_down)?,
                    ffn_post_norm: upload_opt(&gpu, &lw.ffn_post_norm)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let tied = w.output.weight.info.name == w.token_embd.info.name;
        // Tied (the CPU path's `Linear { weight: token_embd, bias: None }`): no second copy.
        let output = if tied {
            None
        } else {
            Some(upload_linear(&gpu, g, &w.output)?)
        };
        let output_norm = gpu.upload(&w.output_norm)?;
        let cache_len = num_blocks * block_size * c.kv_dim();
        let k_cache = (0..c.num_layers)
            .map(|_| gpu.zeros::<u16>(cache_len))
            .collect::<Result<Vec<_>>>()?;
        let v_cache = (0..c.num_layers)
            .map(|_| gpu.zeros::<u16>(cache_len))
            .collect::<Result<Vec<_>>>()?;
        Ok(CudaModel {
            gpu,
            token_embd,
            layers,
            output_norm,
            output,
            k_cache,
            v_cache,
            block_size,
            num_blocks,
            scratch: None,
        })
    }

    pub fn gpu(&self) -> &D {
        &self.gpu
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Copies KV block `src` onto `dst` in every layer, on the device (copy-on-write).
    pub fn copy_block(&mut self, src: u32, dst: u32) -> Result<()> {
        self.gpu.bind()?;
        let kv_dim = self.gpu.ptr(&self.k_cache[0]).bytes / 2 / (self.num_blocks * self.block_size);
        for cache in self.k_cache.iter().chain(self.v_cache.iter()) {
            k::copy_block(
                &self.gpu,
                self.gpu.ptr(cache),
                self.num_blocks,
                self.block_size * kv_dim,
                src as usize,
                dst as usize,
            )?;
        }
        Ok(())
    }

    /// Scratch for at least `n` tokens.
    fn ensure_scratch(&mut self, model: &Model, n: usize) -> Result<()> {
        if self.scratch.as_ref().is_some_and(|s| s.cap >= n) {
            return Ok(());
        }
        let c = &model.config;
        let cap = n.next_power_of_two().max(16);
        let z = |len: usize| self.gpu.zeros::<f32>(cap * len);
        self.scratch = None; // free the old buffers first
        self.scratch = Some(Scratch {
            cap,
            x: z(c.n_embd)?,
            h: z(c.n_embd)?,
            q: z(c.q_dim())?,
            k: z(c.kv_dim())?,
            v: z(c.kv_dim())?,
            attn: z(c.q_dim())?,
            proj: z(c.n_embd)?,
            gate: z(c.n_ff)?,
            up: z(c.n_ff)?,
            last: z(c.n_embd)?,
            logits: z(c.vocab_size)?,
            acts: Vec::new(),
        });
        Ok(())
    }

    /// Checks the batch's addressing on the host, as `crate::kernels` does before the C kernels
    /// run: a bad slot or block id would make a kernel write outside the pool.
    fn check_batch(&self, model: &Model, batch: &Batch) -> Result<usize> {
        let c = &model.config;
        if let Some(&bad) = batch.tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            bail!(
                "token id {bad} is outside the vocabulary of {} tokens",
                c.vocab_size
            );
        }
        let n = batch.n_tokens();
        let num_slots = (self.num_blocks * self.block_size) as i64;
        if batch.positions.len() != n || batch.slot_mapping.len() != n || batch.token_seq.len() != n
        {
            bail!("batch vectors of different lengths");
        }
        if let Some(&s) = batch.slot_mapping.iter().find(|&&s| s >= num_slots) {
            bail!("KV slot {s} is outside the pool of {num_slots}");
        }
        let mb = batch.max_blocks_per_seq;
        let n_seqs = batch.block_tables.len() / mb.max(1);
        if batch.block_tables.len() != n_seqs * mb {
            bail!(
                "block tables of {} entries for {mb} per sequence",
                batch.block_tables.len()
            );
        }
        for t in 0..n {
            let (seq, len) = (batch.token_seq[t], batch.positions[t] as i64 + 1);
            if seq < 0 || seq as usize >= n_seqs || len < 1 || len as usize > mb * self.block_size {
                bail!("token {t}: sequence row {seq} or context length {len} out of range");
            }
            let table = &batch.block_tables[seq as usize * mb..][..mb];
            if !table[..(len as usize).div_ceil(self.block_size)]
                .iter()
                .all(|&b| b >= 0 && (b as usize) < self.num_blocks)
            {
                bail!("token {t}: block id out of range");
            }
        }
        if let Some(&r) = batch.logits_rows.iter().find(|&&r| r >= n) {
            bail!("logits row {r} of a batch of {n} tokens");
        }
        Ok(n_seqs)
    }

    /// Runs one step: writes the batch's keys and values into the pool at its slot mapping and
    /// returns the logits of `batch.logits_rows`, [logits_rows.len()][vocab_size].
    pub fn forward(&mut self, model: &Model, batch: &Batch) -> Result<Vec<f32>> {
        let n = batch.n_tokens();
        if n == 0 {
            return Ok(Vec::new());
        }
        let n_seqs = self.check_batch(model, batch)?;
        self.gpu.bind()?;
        self.ensure_scratch(model, n)?;
        let c = &model.config;
        let (n_embd, q_dim, kv_dim, n_ff, eps) =
            (c.n_embd, c.q_dim(), c.kv_dim(), c.n_ff, c.rms_eps);
        let gpu = &self.gpu;
        let s = self.scratch.as_mut().expect("ensured above");

        // The batch's integers, int32 (slots int64) as the kernels take them.
        let tokens: Vec<i32> = batch.tokens.iter().map(|&t| t as i32).collect();
        let context_lens = batch.context_lens();
        let rows: Vec<i32> = batch.logits_rows.iter().map(|&r| r as i32).collect();
        let tables = if batch.block_tables.is_empty() {
            vec![0]
        } else {
            batch.block_tables.clone()
        };
        let d_tokens = gpu.upload(&tokens)?;
        let d_pos = gpu.upload(&batch.positions)?;
        let d_slots = gpu.upload(&batch.slot_mapping)?;
        let d_seq = gpu.upload(&batch.token_seq)?;
        let d_tables = gpu.upload(&tables)?;
        let d_lens = gpu.upload(&context_lens)?;
        let attn_batch = DevAttentionBatch {
            block_tables: gpu.ptr(&d_tables),
            max_blocks_per_seq: batch.max_blocks_per_seq,
            n_seqs,
            token_seq: gpu.ptr(&d_seq),
            context_lens: gpu.ptr(&d_lens),
        };
        let shape = AttentionShape {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            block_size: self.block_size,
            num_blocks: self.num_blocks,
        };
        let (x, h, q, kk, v, attn, proj, gate, up) = (
            gpu.ptr(&s.x),
            gpu.ptr(&s.h),
            gpu.ptr(&s.q),
            gpu.ptr(&s.k),
            gpu.ptr(&s.v),
            gpu.ptr(&s.attn),
            gpu.ptr(&s.proj),
            gpu.ptr(&s.gate),
            gpu.ptr(&s.up),
        );
        let mut acts = Acts {
            bufs: &mut s.acts,
            cap: s.cap,
            widths: [n_embd, q_dim, n_ff],
            valid: Vec::new(),
        };

        // x: [n][n_embd], the residual stream, from the (scaled) token embeddings.
        let te = &self.token_embd;
        k::get_rows(
            gpu,
            te.ttype,
            gpu.ptr(&te.data),
            te.n_out,
            te.n_in,
            gpu.ptr(&d_tokens),
            n,
            x,
            c.embd_scale,
        )?;

        for (l, (lw, lo)) in self.layers.iter().zip(&c.layers).enumerate() {
            // Attention block.
            k::rms_norm(gpu, x, gpu.ptr(&lw.attn_norm), h, n, n_embd, eps)?;
            acts.invalidate();
            linear(gpu, &mut acts, h, n, &lw.wq, q)?;
            linear(gpu, &mut acts, h, n, &lw.wk, kk)?;
            linear(gpu, &mut acts, h, n, &lw.wv, v)?;
            if let Some(wn) = &lw.attn_q_norm {
                k::rms_norm(gpu, q, gpu.ptr(wn), q, n * c.n_heads, c.head_dim, eps)?;
            }
            if let Some(wn) = &lw.attn_k_norm {
                k::rms_norm(gpu, kk, gpu.ptr(wn), kk, n * c.n_kv_heads, c.head_dim, eps)?;
            }
            if let Some(rope) = &lo.rope {
                k::rope(gpu, q, gpu.ptr(&d_pos), n, c.n_heads, rope)?;
                k::rope(gpu, kk, gpu.ptr(&d_pos), n, c.n_kv_heads, rope)?;
            }
            let (kc, vc) = (gpu.ptr(&self.k_cache[l]), gpu.ptr(&self.v_cache[l]));
            k::kv_write(
                gpu,
                kk,
                v,
                kc,
                vc,
                gpu.ptr(&d_slots),
                n,
                kv_dim,
                self.num_blocks * self.block_size,
            )?;
            k::paged_attention(
                gpu,
                attn,
                q,
                kc,
                vc,
                &shape,
                &attn_batch,
                n,
                c.attn_scale,
                lo.window,
            )?;
            acts.invalidate();
            linear(gpu, &mut acts, attn, n, &lw.wo, proj)?;
            if let Some(wn) = &lw.attn_post_norm {
                k::rms_norm(gpu, proj, gpu.ptr(wn), proj, n, n_embd, eps)?;
            }
            k::add(gpu, x, proj, n * n_embd)?;

            // Feed-forward block.
            k::rms_norm(gpu, x, gpu.ptr(&lw.ffn_norm), h, n, n_embd, eps)?;
            acts.invalidate();
            matmul(gpu, &mut acts, h, n, &lw.w_gate, gate)?;
            matmul(gpu, &mut acts, h, n, &lw.w_up, up)?;
            k::glu(gpu, gate, up, n * n_ff, c.activation)?;
            acts.invalidate();
            matmul(gpu, &mut acts, gate, n, &lw.w_down, proj)?;
            if let Some(wn) = &lw.ffn_post_norm {
                k::rms_norm(gpu, proj, gpu.ptr(wn), proj, n, n_embd, eps)?;
            }
            k::add(gpu, x, proj, n * n_embd)?;
        }

        // Final norm and logits, only for the rows that want them.
        let n_out = rows.len();
        if n_out == 0 {
            gpu.synchronize()?;
            return Ok(Vec::new());
        }
        let d_rows = gpu.upload(&rows)?;
        let last = gpu.ptr(&s.last);
        k::gather_rows(gpu, x, n, gpu.ptr(&d_rows), n_out, last, n_embd)?;
        k::rms_norm(
            gpu,
            last,
            gpu.ptr(&self.output_norm),
            last,
            n_out,
            n_embd,
            eps,
        )?;
        let logits = gpu.ptr(&s.logits);
        acts.invalidate();
        match &self.output {
            Some(out) => linear(gpu, &mut acts, last, n_out, out, logits)?,
            None => matmul(gpu, &mut acts, last, n_out, &self.token_embd, logits)?,
        }
        if let Some(cap) = c.final_logit_softcap {
            k::softcap(gpu, logits, n_out * c.vocab_size, cap)?;
        }
        gpu.download(&s.logits, n_out * c.vocab_size)
    }
}

/// Activations quantized once per vec_dot type and reused by every matrix that reads the same
/// input (q, k and v; gate and up), as the CPU forward's `Quantized` does.
struct Acts<'a, D: CudaDevice> {
    bufs: &'a mut Vec<(TensorType, D::Buf)>,
    cap: usize,
    /// The input widths a row can have (n_embd, q_dim, n_ff), for sizing.
    widths: [usize; 3],
    valid: Vec<TensorType>,
}

impl<D: CudaDevice> Acts<'_, D> {
    fn invalidate(&mut self) {
        self.valid.clear();
    }

    /// `x` ([n_rows][n_in] f32) in type `vdt`, quantizing it unless that was done since the
    /// last `invalidate`. F32 weights read `x` itself.
    fn get(
        &mut self,
        gpu: &D,
        vdt: TensorType,
        x: DevPtr,
        n_rows: usize,
        n_in: usize,
    ) -> Result<DevPtr> {
        if vdt == TensorType::F32 {
            return Ok(x);
        }
        let i = match self.bufs.iter().position(|(t, _)| *t == vdt) {
            Some(i) => i,
            None => {
                let width = self
                    .widths
                    .iter()
                    .filter_map(|&w| vdt.row_bytes(w))
                    .max()
                    .unwrap_or(0)
                    .max(vdt.row_bytes(n_in).unwrap_or(0));
                self.bufs.push((vdt, gpu.zeros::<u8>(self.cap * width)?));
                self.bufs.len() - 1
            }
        };
        let y = gpu.ptr(&self.bufs[i].1);
        if !self.valid.contains(&vdt) {
            k::quantize(gpu, vdt, x, n_rows, n_in, y)?;
            self.valid.push(vdt);
        }
        Ok(y)
    }
}

/// `out = x @ m^T`: [n_rows][m.n_out].
fn matmul<D: CudaDevice>(
    gpu: &D,
    acts: &mut Acts<D>,
    x: DevPtr,
    n_rows: usize,
    m: &DevMatrix<D>,
    out: DevPtr,
) -> Result<()> {
    let a = acts.get(gpu, m.ttype.vec_dot_type(), x, n_rows, m.n_in)?;
    k::matmul(
        gpu,
        m.ttype,
        gpu.ptr(&m.data),
        a,
        m.n_in,
        m.n_out,
        n_rows,
        out,
        MatmulKernel::Auto,
    )
}

/// `out = x @ l.weight^T + l.bias`: [n_rows][n_out].
fn linear<D: CudaDevice>(
    gpu: &D,
    acts: &mut Acts<D>,
    x: DevPtr,
    n_rows: usize,
    l: &DevLinear<D>,
    out: DevPtr,
) -> Result<()> {
    matmul(gpu, acts, x, n_rows, &l.weight, out)?;
    if let Some(b) = &l.bias {
        k::add_bias(gpu, out, gpu.ptr(b), n_rows, l.weight.n_out)?;
    }
    Ok(())
}

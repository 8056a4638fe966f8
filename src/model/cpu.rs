//! The CPU backend: the forward pass's operations on `crate::kernels` (the C kernels, scalar
//! or SIMD), activations in `Vec<f32>`, the paged [`KvCache`] in host memory.
//!
//! Matrices stay quantized in the mmap ([`CpuMatrix`] holds the mapped file), except Q4_1, Q8_0,
//! Q4_K, Q5_K and Q6_K matrices of whole groups of eight rows (`kernels::has_x8`), which the
//! products read from a copy with their rows interleaved in eights (`kernels::repack_x8`): that
//! copy is made when the weights are loaded, a slice at a time, each slice's mapped pages
//! released once copied, so the copy replaces the map in memory instead of sitting beside it.

use std::sync::{Arc, Mutex};

use anyhow::{bail, Result};

use super::arena::Arena;
use super::backend::{Backend, WeightStore};
use super::delta_net::DeltaNet;
use super::weights::{InFile, MatrixInfo, Weights};
use super::{Batch, ModelConfig};
use crate::gguf::{GgufFile, TensorInfo};
use crate::kernels::tensor_type::TensorType;
use crate::kernels::{self, rows, Activation, AttentionBatch, DeltaNetShape, KvTypes, Rope};
use crate::model::kv_cache::{BlockId, KvCache};
use crate::model::state_pool::{StatePool, StateRun, StateSlot};

/// A weight matrix on the CPU: its bytes in the mapped file, and the interleaved copy its
/// products read when it has one.
pub struct CpuMatrix {
    pub ttype: TensorType,
    pub n_in: usize,
    pub n_out: usize,
    file: Arc<GgufFile>,
    info: TensorInfo,
    /// The rows interleaved in eights, for the matrices of a type with `kernels::has_x8` that are
    /// multiplied by.
    interleaved: Option<Vec<u8>>,
}

impl CpuMatrix {
    /// `m` of `file`, with its interleaved copy made now if its products read one.
    pub fn new(file: &Arc<GgufFile>, m: &MatrixInfo) -> CpuMatrix {
        let mut matrix = CpuMatrix {
            ttype: m.ttype,
            n_in: m.n_in,
            n_out: m.n_out,
            file: Arc::clone(file),
            info: m.info.clone(),
            interleaved: None,
        };
        if m.product && kernels::has_x8(m.ttype) && m.n_out.is_multiple_of(8) {
            matrix.interleaved = Some(matrix.interleave());
        }
        matrix
    }

    /// The rows interleaved in eights (`kernels::repack_x8`), a slice of rows at a time, each
    /// slice's mapped pages released once it is copied.
    fn interleave(&self) -> Vec<u8> {
        const CHUNK_BYTES: usize = 1 << 20;
        let (w, rb) = (self.bytes(), self.row_bytes());
        let chunk_rows = (CHUNK_BYTES / rb).next_multiple_of(8);
        let mut w8 = vec![0u8; w.len()];
        for r0 in (0..self.n_out).step_by(chunk_rows) {
            let r1 = (r0 + chunk_rows).min(self.n_out);
            let rows = r0 * rb..r1 * rb;
            kernels::repack_x8_into(
                self.ttype,
                &w[rows.clone()],
                self.n_in,
                r1 - r0,
                &mut w8[rows.clone()],
            );
            self.file.release_pages(&w[rows]);
        }
        w8
    }

    /// The bytes as stored: [n_out] rows of `row_bytes()`.
    fn bytes(&self) -> &[u8] {
        self.file.tensor_data(&self.info)
    }

    fn row_bytes(&self) -> usize {
        self.ttype.row_bytes(self.n_in).expect("checked at load")
    }

    /// Whether the products read an interleaved copy.
    pub fn is_interleaved(&self) -> bool {
        self.interleaved.is_some()
    }

    /// `out = x @ self^T` for `x` quantized to `ttype.vec_dot_type()`, [n_rows][n_out].
    fn matmul(&self, xq: &[u8], n_rows: usize, out: &mut Vec<f32>) {
        kernels::matmuls(&mut [self.product(xq, n_rows, out)]);
    }

    /// The product `out = x @ self^T` (`out` sized to [n_rows][n_out]), for `kernels::matmuls`.
    /// The interleaved products give the same results, bit for bit.
    fn product<'a>(
        &'a self,
        xq: &'a [u8],
        n_rows: usize,
        out: &'a mut Vec<f32>,
    ) -> kernels::Product<'a> {
        out.resize(n_rows * self.n_out, 0.0);
        kernels::Product {
            t: self.ttype,
            w: self.interleaved.as_deref().unwrap_or_else(|| self.bytes()),
            interleaved: self.interleaved.is_some(),
            n_in: self.n_in,
            n_out: self.n_out,
            a: xq,
            n_rows,
            out,
        }
    }
}

/// The model's weights as the CPU keeps them, made once per model (see `Model::cpu_weights`).
pub fn load_weights(file: &Arc<GgufFile>, w: &Weights<InFile>) -> Weights<Cpu> {
    let loaded = w
        .load::<Cpu, std::convert::Infallible>(&mut |m| Ok(CpuMatrix::new(file, m)), &mut |v| {
            Ok(v.to_vec())
        });
    match loaded {
        Ok(w) => w,
        Err(never) => match never {},
    }
}

#[path = "cpu_delta_net.rs"]
mod delta_net_ops;

/// The step's batch, as the addressing operations read it.
#[derive(Default)]
struct Step {
    batch: Batch,
    /// Keys each token attends to, [n_tokens].
    context_lens: Vec<i32>,
    /// Each sequence row's tokens and state slot, for the recurrent layers.
    state_runs: Vec<StateRun>,
}

/// The CPU backend: the KV pool and the current step's batch.
pub struct Cpu {
    kv: KvCache,
    attn_scale: f32,
    step: Step,
    /// The steps' activation buffers, reused from layer to layer and step to step.
    arena: Arena,
    /// The buffers of quantized inputs ([`CpuInput`]), reused likewise.
    spare_inputs: Arc<Mutex<Vec<Vec<u8>>>>,
    /// Rows turned for a quantized KV cache (`KvTypes::k_rotation`), reused likewise.
    turned: Vec<f32>,
    /// What a quantized cache subtracts from each layer's keys (`super::key_centers`).
    key_centers: Vec<Option<Vec<f32>>>,
    /// The recurrent layers' states, one slot per sequence (none until `set_state_slots`).
    states: StatePool,
}

impl Cpu {
    /// The KV pool (the disk tier reads and fills whole blocks of it).
    pub fn kv(&self) -> &KvCache {
        &self.kv
    }

    pub fn kv_mut(&mut self) -> &mut KvCache {
        &mut self.kv
    }

    /// The recurrent state pool (the disk tier reads and fills snapshot slots of it).
    pub fn states(&self) -> &StatePool {
        &self.states
    }

    pub fn states_mut(&mut self) -> &mut StatePool {
        &mut self.states
    }

    /// A KV pool of `num_blocks` blocks of `block_size` tokens of `kv_types` for a model of `c`.
    pub fn new(c: &ModelConfig, kv_types: KvTypes, block_size: usize, num_blocks: usize) -> Cpu {
        let kv = KvCache::new_as(kv_types, c, block_size, num_blocks);
        Cpu {
            kv,
            attn_scale: c.attn_scale,
            step: Step::default(),
            arena: Arena::default(),
            spare_inputs: Arc::default(),
            turned: Vec::new(),
            key_centers: Vec::new(),
            states: StatePool::default(),
        }
    }

    /// A recurrent state pool of `num_slots` slots for a model of `c` (none if it has no
    /// recurrent layers), replacing the one before.
    pub fn set_state_slots(&mut self, c: &ModelConfig, num_slots: usize) {
        self.states = StatePool::new(c, num_slots);
    }

    /// Sets what each layer's keys lose before a quantized cache stores them: softmax gives the
    /// same weights, the keys a narrower range (`super::key_centers`).
    pub fn set_key_centers(&mut self, centers: Vec<Option<Vec<f32>>>) {
        self.key_centers = centers;
    }

    pub fn block_size(&self) -> usize {
        self.kv.block_size
    }
}

/// Activations read by products: quantized once per vec_dot type, into buffers taken from
/// (and given back to when dropped) the backend's spare ones.
pub struct CpuInput<'a> {
    x: &'a [f32],
    quantized: Vec<(TensorType, Vec<u8>)>,
    spare: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl CpuInput<'_> {
    /// The index in `quantized` of the rows `m`'s products read, quantized now if first asked.
    fn quantized_for(&mut self, m: &CpuMatrix) -> usize {
        let t = m.ttype.vec_dot_type();
        match self.quantized.iter().position(|(qt, _)| *qt == t) {
            Some(i) => i,
            None => {
                let mut rows = lock(&self.spare).pop().unwrap_or_default();
                kernels::quantize_rows_into(t, self.x, m.n_in, &mut rows);
                self.quantized.push((t, rows));
                self.quantized.len() - 1
            }
        }
    }
}

impl Drop for CpuInput<'_> {
    fn drop(&mut self) {
        let mut spare = lock(&self.spare);
        spare.extend(self.quantized.drain(..).map(|(_, rows)| rows));
        spare.truncate(MAX_SPARE_INPUTS);
    }
}

/// Quantized input buffers kept for reuse (a step has at most a few alive at once).
const MAX_SPARE_INPUTS: usize = 4;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl WeightStore for Cpu {
    type Matrix = CpuMatrix;
    type Vector = Vec<f32>;
}

impl Backend for Cpu {
    type Acts = Vec<f32>;
    type Input<'a> = CpuInput<'a>;

    fn kv_pool(&self) -> (usize, usize) {
        (self.kv.block_size, self.kv.num_blocks)
    }

    fn begin_step(&mut self, batch: &Batch) -> Result<()> {
        let state_runs = self.states.begin_step(batch)?;
        self.step = Step {
            batch: batch.clone(),
            context_lens: batch.context_lens(),
            state_runs,
        };
        Ok(())
    }

    fn acts(&mut self, n_rows: usize, width: usize) -> Result<Vec<f32>> {
        Ok(self.arena.take(n_rows * width))
    }

    fn recycle(&mut self, x: Vec<f32>) {
        self.arena.give(x);
    }

    fn embed(&mut self, m: &CpuMatrix, scale: f32, x: &mut Vec<f32>) -> Result<()> {
        let (n, rb) = (m.n_in, m.row_bytes());
        let w = m.bytes();
        for (&tok, row) in self.step.batch.tokens.iter().zip(x.chunks_exact_mut(n)) {
            let r = tok as usize;
            kernels::dequantize_row(m.ttype, &w[r * rb..(r + 1) * rb], row);
        }
        if scale != 1.0 {
            x.iter_mut().for_each(|v| *v *= scale);
        }
        Ok(())
    }

    fn rms_norm(&mut self, x: &Vec<f32>, w: &Vec<f32>, eps: f32, y: &mut Vec<f32>) -> Result<()> {
        kernels::rms_norm(x, w, y, eps);
        Ok(())
    }

    fn rms_norm_inplace(&mut self, x: &mut Vec<f32>, w: &Vec<f32>, eps: f32) -> Result<()> {
        kernels::rms_norm_inplace(x, w, eps);
        Ok(())
    }

    fn input<'a>(&self, x: &'a Vec<f32>) -> CpuInput<'a> {
        CpuInput {
            x,
            quantized: Vec::new(),
            spare: Arc::clone(&self.spare_inputs),
        }
    }

    fn matmul(&mut self, x: &mut CpuInput<'_>, m: &CpuMatrix, out: &mut Vec<f32>) -> Result<()> {
        let i = x.quantized_for(m);
        m.matmul(&x.quantized[i].1, x.x.len() / m.n_in, out);
        Ok(())
    }

    /// One parallel call for all of `products` (`kernels::matmuls`).
    fn matmul_many(
        &mut self,
        x: &mut CpuInput<'_>,
        products: &mut [(&CpuMatrix, &mut Vec<f32>)],
    ) -> Result<()> {
        let which: Vec<usize> = products.iter().map(|(m, _)| x.quantized_for(m)).collect();
        let mut list = Vec::with_capacity(products.len());
        for ((m, out), i) in products.iter_mut().zip(which) {
            let n_rows = x.x.len() / m.n_in;
            list.push(m.product(&x.quantized[i].1, n_rows, out));
        }
        kernels::matmuls(&mut list);
        Ok(())
    }

    fn add_bias(&mut self, x: &mut Vec<f32>, bias: &Vec<f32>) -> Result<()> {
        rows::add_bias(x, bias);
        Ok(())
    }

    fn rope(&mut self, x: &mut Vec<f32>, n_heads: usize, rope: &Rope) -> Result<()> {
        kernels::rope(x, &self.step.batch.positions, n_heads, rope);
        Ok(())
    }

    fn kv_write(&mut self, layer: usize, k: &Vec<f32>, v: &Vec<f32>) -> Result<()> {
        let types = self.kv.types;
        let shape = *self.kv.layer_shape(layer);
        let hd = shape.head_dim;
        // A quantized cache stores the rows turned (kernels::hadamard_rows), each once.
        let mut turned = std::mem::take(&mut self.turned);
        let center = self.key_centers.get(layer).and_then(Option::as_deref);
        let (k, v) = match (types.k_rotation(hd), types.v_rotation(hd), center) {
            (None, None, None) => (k.as_slice(), v.as_slice()),
            (rot_k, rot_v, center) => {
                turned.clear();
                turned.extend_from_slice(k);
                turned.extend_from_slice(v);
                let (tk, tv) = turned.split_at_mut(k.len());
                if let Some(c) = center {
                    for row in tk.chunks_exact_mut(c.len()) {
                        row.iter_mut().zip(c).for_each(|(x, c)| *x -= c);
                    }
                }
                if let Some(n) = rot_k {
                    kernels::hadamard_rows(tk, n);
                }
                if let Some(n) = rot_v {
                    kernels::hadamard_rows(tv, n);
                }
                (&*tk, &*tv)
            }
        };
        let (k_cache, v_cache) = self.kv.layer_mut(layer);
        let kv_dim = shape.n_kv_heads * hd;
        kernels::kv_write_as(
            types,
            k,
            v,
            k_cache,
            v_cache,
            &self.step.batch.slot_mapping,
            kv_dim,
        );
        self.turned = turned;
        Ok(())
    }

    fn attention(
        &mut self,
        layer: usize,
        q: &Vec<f32>,
        window: Option<usize>,
        sinks: Option<&Vec<f32>>,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let n_heads = self.kv.layer_shape(layer).n_heads;
        if sinks.is_some_and(|s| s.len() != n_heads) {
            bail!("attention sinks of {n_heads} heads");
        }
        let b = &self.step.batch;
        let addressing = AttentionBatch {
            block_tables: &b.block_tables,
            max_blocks_per_seq: b.max_blocks_per_seq,
            token_seq: &b.token_seq,
            context_lens: &self.step.context_lens,
        };
        let types = self.kv.types;
        let shape = *self.kv.layer_shape(layer);
        let hd = shape.head_dim;
        // Queries turned as the keys were (q . k unchanged), the output turned back.
        let mut turned = std::mem::take(&mut self.turned);
        let q = match types.k_rotation(hd) {
            None => q.as_slice(),
            Some(n) => {
                turned.clear();
                turned.extend_from_slice(q);
                kernels::hadamard_rows(&mut turned, n);
                &turned
            }
        };
        let (k_cache, v_cache) = self.kv.layer(layer);
        kernels::paged_attention_sinks(
            types,
            out,
            q,
            k_cache,
            v_cache,
            &shape,
            &addressing,
            self.attn_scale,
            window,
            sinks.map(Vec::as_slice),
        );
        if let Some(n) = types.v_rotation(hd) {
            kernels::hadamard_rows(out, n);
        }
        self.turned = turned;
        Ok(())
    }

    fn glu(&mut self, gate: &mut Vec<f32>, up: &Vec<f32>, act: Activation) -> Result<()> {
        kernels::glu_inplace(gate, up, act);
        Ok(())
    }

    fn add(&mut self, x: &mut Vec<f32>, y: &Vec<f32>) -> Result<()> {
        rows::add_inplace(x, y);
        Ok(())
    }

    fn add_rms_norm(
        &mut self,
        x: &mut Vec<f32>,
        y: &Vec<f32>,
        w: &Vec<f32>,
        eps: f32,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        kernels::add_rms_norm(x, y, w, eps, out);
        Ok(())
    }

    fn read(&mut self, x: &Vec<f32>) -> Result<Vec<f32>> {
        Ok(x.clone())
    }

    fn gather_rows(&mut self, x: &Vec<f32>, rows: &[u32], out: &mut Vec<f32>) -> Result<()> {
        let n = out.len() / rows.len().max(1);
        for (&r, row) in rows.iter().zip(out.chunks_exact_mut(n)) {
            let r = r as usize;
            row.copy_from_slice(&x[r * n..(r + 1) * n]);
        }
        Ok(())
    }

    fn scatter_rows(&mut self, x: &Vec<f32>, rows: &[u32], out: &mut Vec<f32>) -> Result<()> {
        let n = x.len() / rows.len().max(1);
        for (&r, row) in rows.iter().zip(x.chunks_exact(n)) {
            let r = r as usize;
            out[r * n..(r + 1) * n].copy_from_slice(row);
        }
        Ok(())
    }

    fn weighted_sum(
        &mut self,
        x: &Vec<f32>,
        weights: &[f32],
        k: usize,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        rows::weighted_sum(x, weights, k, out);
        Ok(())
    }

    fn gather_logits_rows(&mut self, x: &Vec<f32>, out: &mut Vec<f32>) -> Result<()> {
        let rows = &self.step.batch.logits_rows;
        let n = out.len() / rows.len().max(1);
        for (&r, row) in rows.iter().zip(out.chunks_exact_mut(n)) {
            row.copy_from_slice(&x[r * n..(r + 1) * n]);
        }
        Ok(())
    }

    fn scale(&mut self, x: &mut Vec<f32>, s: f32) -> Result<()> {
        rows::scale(x, s);
        Ok(())
    }

    fn softcap(&mut self, x: &mut Vec<f32>, cap: f32) -> Result<()> {
        x.iter_mut().for_each(|z| *z = cap * (*z / cap).tanh());
        Ok(())
    }

    fn reshape(&mut self, x: Vec<f32>, n_rows: usize, width: usize) -> Result<Vec<f32>> {
        anyhow::ensure!(
            x.len() == n_rows * width,
            "reshape of {} into [{n_rows}][{width}]",
            x.len()
        );
        Ok(x)
    }

    fn logits(&mut self, x: Vec<f32>) -> Result<Vec<f32>> {
        Ok(x)
    }

    fn end_step(&mut self) -> Result<()> {
        Ok(())
    }

    fn copy_block(&mut self, src: BlockId, dst: BlockId) -> Result<()> {
        self.kv.copy_block(src, dst);
        Ok(())
    }

    fn state_pool(&self) -> usize {
        self.states.num_slots()
    }

    fn short_conv(
        &mut self,
        r: usize,
        bcx: &Vec<f32>,
        conv: &Vec<f32>,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let d = out.len() / self.step.batch.n_tokens().max(1);
        for run in &self.step.state_runs {
            let rows = run.first..run.first + run.len;
            kernels::short_conv(
                &bcx[rows.start * 3 * d..rows.end * 3 * d],
                conv,
                self.states.layer_mut(run.slot, r),
                run.reset,
                d,
                &mut out[rows.start * d..rows.end * d],
            );
        }
        Ok(())
    }

    fn mamba2(
        &mut self,
        r: usize,
        zxbcdt: &Vec<f32>,
        m: &super::mamba2::Mamba2<Self>,
        shape: super::mamba2::SsmShape,
        eps: f32,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let runs = &self.step.state_runs;
        super::mamba2_cpu::run(&mut self.states, runs, r, zxbcdt, m, shape, eps, out)
    }

    fn gated_delta_net(
        &mut self,
        r: usize,
        s: &DeltaNetShape,
        qkv: &Vec<f32>,
        alpha: &Vec<f32>,
        beta: &Vec<f32>,
        w: &DeltaNet<Self>,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        self.delta_net_runs(r, s, qkv, alpha, beta, w, out)
    }

    fn split_q_gate(&mut self, qg: &Vec<f32>, head_dim: usize, q: &mut Vec<f32>) -> Result<()> {
        delta_net_ops::split_q_gate(qg, head_dim, q)
    }

    fn sigmoid_gate(&mut self, x: &mut Vec<f32>, qg: &Vec<f32>, head_dim: usize) -> Result<()> {
        delta_net_ops::sigmoid_gate(x, qg, head_dim)
    }

    fn copy_state(&mut self, src: StateSlot, dst: StateSlot) -> Result<()> {
        self.states.copy(src, dst)
    }
}

//! The CUDA backend: the operations of `crate::model::Backend` as launches on a CUDA device
//! (the GPU, or `super::emu::Emu` in the tests), so the model's one layer loop
//! (`crate::model::forward`) runs on it unchanged.
//!
//! [`CudaBackend`] owns what lives on the device: the weights, uploaded once from the mmap as
//! stored (quantized), the KV pool (`super::kv_pool`: f16, q8_0 or q4_0, the CPU `KvCache`'s
//! layout), each step's batch integers, and an arena of activation
//! buffers: the forward pass asks for the same buffers in the same order every step, so the
//! n-th request reuses the n-th buffer, reallocated only when a larger batch needs more.

use anyhow::{bail, Context, Result};

use super::kernels::{self as k, DevAttentionBatch, MatmulKernel};
use super::kv_pool::KvPool;
use super::launch::{CudaDevice, DevPtr};
use crate::kernels::tensor_type::TensorType;
use crate::kernels::{Activation, KvTypes, Rope};
use crate::model::kv_cache::BlockId;
use crate::model::{Backend, Batch, Loaded, Model, WeightStore};
use std::sync::Arc;

const F32: usize = 4;

mod checks;
use checks::{as_i32, check_rows, same_shape};

/// A weight matrix on the device, bytes as in the file.
pub struct DevMatrix<D: CudaDevice> {
    ttype: TensorType,
    n_in: usize,
    n_out: usize,
    data: D::Buf,
}

/// An f32 vector on the device.
pub struct DevVector<D: CudaDevice> {
    len: usize,
    data: D::Buf,
}

/// Activations [n_rows][width] f32 in buffer `slot` of the arena.
#[derive(Clone, Copy, Debug)]
pub struct DevActs {
    slot: usize,
    ptr: DevPtr,
    n_rows: usize,
    width: usize,
}

/// Activations a product reads, with their quantized copies made so far this step.
pub struct DevInput {
    x: DevActs,
    quantized: Vec<(TensorType, DevPtr)>,
}

/// One step's batch integers on the device, int32 (slots int64) as the kernels take them.
struct Step<D: CudaDevice> {
    n_tokens: usize,
    n_seqs: usize,
    max_blocks_per_seq: usize,
    tokens: D::Buf,
    positions: D::Buf,
    slots: D::Buf,
    token_seq: D::Buf,
    block_tables: D::Buf,
    context_lens: D::Buf,
    /// None when no row wants logits.
    logits_rows: Option<D::Buf>,
}

/// The model's KV pool and scratch on one CUDA device.
pub struct CudaBackend<D: CudaDevice> {
    dev: D,
    kv: KvPool<D>,
    attn_scale: f32,
    /// The frequency factors of each distinct rope with factors or YaRN (all 1 for YaRN alone),
    /// uploaded at load: [rope_dim / 2] f32 each.
    rope_factors: Vec<(Vec<f32>, D::Buf)>,
    /// Activation buffers, reused in request order; `next` is this step's next request.
    arena: Vec<D::Buf>,
    next: usize,
    step: Option<Step<D>>,
    /// What this step uploaded for the experts (rows, weights), freed when the next begins.
    uploads: Vec<D::Buf>,
}

impl<D: CudaDevice> WeightStore for CudaBackend<D> {
    type Matrix = DevMatrix<D>;
    type Vector = DevVector<D>;
}

/// `model` on `dev`: a KV pool of `num_blocks` blocks of `block_size` tokens of `kv_types` (the
/// sizes the CPU `KvCache` would take; f16, q8_0 or q4_0) and the weights uploaded.
pub fn load<D: CudaDevice>(
    dev: D,
    model: &Model,
    kv_types: KvTypes,
    block_size: usize,
    num_blocks: usize,
) -> Result<Loaded<CudaBackend<D>>> {
    let c = &model.config;
    if block_size == 0 || num_blocks == 0 {
        bail!("an empty KV pool");
    }
    if c.is_recurrent() {
        bail!(
            "'{}' has recurrent layers ({}), which the CUDA backend does not run yet; use --device cpu",
            c.architecture,
            if c.ssm.is_some() {
                "Mamba-2"
            } else if c.layers.iter().any(|l| l.kind == crate::model::config::LayerKind::DeltaNet) {
                "gated delta-nets"
            } else {
                "short convolutions"
            }
        );
    }
    if !c.uniform_layers() {
        bail!(
            "{}: layers of different head sizes or KV head counts are not supported on --device cuda (its KV pool has one row width for every layer); run it with --device cpu",
            c.architecture
        );
    }
    let kv_bytes = KvPool::<D>::bytes(c, kv_types, block_size, num_blocks);
    let weight_bytes = model.file.file_bytes() as usize;
    let (free, total) = dev.mem_info()?;
    if kv_bytes + weight_bytes > free {
        bail!(
            "the weights ({:.0} MiB) and a KV pool of {num_blocks} blocks ({:.0} MiB) do not fit the {:.0} MiB free of {:.0} MiB on {}; lower --kv-mem or --ctx-size",
            weight_bytes as f64 / 1048576.0,
            kv_bytes as f64 / 1048576.0,
            free as f64 / 1048576.0,
            total as f64 / 1048576.0,
            dev.device_name()
        );
    }
    let weights = model.weights.load::<CudaBackend<D>, anyhow::Error>(
        &mut |m| {
            k::check_weight_type(m.ttype).with_context(|| format!("tensor '{}'", m.info.name))?;
            Ok(DevMatrix {
                ttype: m.ttype,
                n_in: m.n_in,
                n_out: m.n_out,
                data: dev
                    .upload(m.bytes(&model.file))
                    .with_context(|| format!("uploading tensor '{}'", m.info.name))?,
            })
        },
        &mut |v| {
            Ok(DevVector {
                len: v.len(),
                data: dev.upload(v)?,
            })
        },
    )?;
    let kv = KvPool::new(&dev, model, kv_types, block_size, num_blocks)?;
    let mut rope_factors: Vec<(Vec<f32>, D::Buf)> = Vec::new();
    for rope in c.layers.iter().filter_map(|l| l.rope.as_ref()) {
        if !is_extended(rope) {
            continue;
        }
        let f = k::rope_factors(rope)?;
        if !rope_factors.iter().any(|(have, _)| same_bits(have, &f)) {
            let buf = dev
                .upload(&f)
                .context("uploading the rope frequency factors")?;
            rope_factors.push((f, buf));
        }
    }
    Ok(Loaded {
        backend: CudaBackend {
            kv,
            attn_scale: c.attn_scale,
            rope_factors,
            arena: Vec::new(),
            next: 0,
            step: None,
            uploads: Vec::new(),
            dev,
        },
        weights: Arc::new(weights),
    })
}

/// Whether `r` runs el_cuda_rope_ext (llama3's frequency factors, YaRN) rather than el_cuda_rope.
fn is_extended(r: &Rope) -> bool {
    r.freq_factors.is_some() || r.yarn.is_some()
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

impl<D: CudaDevice> CudaBackend<D> {
    pub fn device(&self) -> &D {
        &self.dev
    }

    pub fn block_size(&self) -> usize {
        self.kv.shape.block_size
    }

    /// What the KV pool holds keys and values in.
    pub fn kv_types(&self) -> KvTypes {
        self.kv.types
    }

    fn kv_dim(&self) -> usize {
        self.kv.kv_dim()
    }

    /// The next buffer of the arena, at least `bytes` long.
    fn alloc(&mut self, bytes: usize) -> Result<(usize, DevPtr)> {
        let slot = self.next;
        self.next += 1;
        let fits = self
            .arena
            .get(slot)
            .is_some_and(|b| self.dev.ptr(b).bytes >= bytes);
        if !fits {
            // Room for twice as many rows, so a growing batch reallocates rarely; nothing of
            // this step uses this slot yet, and the last step ended synchronized.
            let buf = self.dev.zeros::<u8>(bytes.next_power_of_two())?;
            match self.arena.get_mut(slot) {
                Some(b) => *b = buf,
                None => self.arena.push(buf),
            }
        }
        let p = self.dev.ptr(&self.arena[slot]);
        Ok((
            slot,
            DevPtr {
                addr: p.addr,
                bytes,
            },
        ))
    }

    /// `buf`'s address, `buf` kept until the next step (the launches reading it may run later).
    fn keep(&mut self, buf: D::Buf) -> DevPtr {
        let p = self.dev.ptr(&buf);
        self.uploads.push(buf);
        p
    }

    fn step(&self) -> Result<&Step<D>> {
        self.step
            .as_ref()
            .context("a CUDA operation outside a step")
    }
}

impl<D: CudaDevice> Backend for CudaBackend<D> {
    type Acts = DevActs;
    type Input<'a>
        = DevInput
    where
        D: 'a;

    fn kv_pool(&self) -> (usize, usize) {
        (self.kv.shape.block_size, self.kv.shape.num_blocks)
    }

    fn begin_step(&mut self, batch: &Batch) -> Result<()> {
        self.dev.bind()?;
        self.next = 0;
        self.uploads.clear();
        let dev = &self.dev;
        let tokens: Vec<i32> = batch.tokens.iter().map(|&t| t as i32).collect();
        let rows: Vec<i32> = batch.logits_rows.iter().map(|&r| r as i32).collect();
        let tables = if batch.block_tables.is_empty() {
            vec![0]
        } else {
            batch.block_tables.clone()
        };
        self.step = Some(Step {
            n_tokens: batch.n_tokens(),
            n_seqs: batch.n_seqs(),
            max_blocks_per_seq: batch.max_blocks_per_seq,
            tokens: dev.upload(&tokens)?,
            positions: dev.upload(&batch.positions)?,
            slots: dev.upload(&batch.slot_mapping)?,
            token_seq: dev.upload(&batch.token_seq)?,
            block_tables: dev.upload(&tables)?,
            context_lens: dev.upload(&batch.context_lens())?,
            logits_rows: (!rows.is_empty()).then(|| dev.upload(&rows)).transpose()?,
        });
        Ok(())
    }

    fn acts(&mut self, n_rows: usize, width: usize) -> Result<DevActs> {
        let (slot, ptr) = self.alloc(n_rows * width * F32)?;
        Ok(DevActs {
            slot,
            ptr,
            n_rows,
            width,
        })
    }

    fn embed(&mut self, m: &DevMatrix<D>, scale: f32, x: &mut DevActs) -> Result<()> {
        let s = self.step()?;
        if x.width != m.n_in || x.n_rows != s.n_tokens {
            bail!(
                "embedding rows of {} into [{}][{}]",
                m.n_in,
                x.n_rows,
                x.width
            );
        }
        let tokens = self.dev.ptr(&s.tokens);
        k::get_rows(
            &self.dev,
            m.ttype,
            self.dev.ptr(&m.data),
            m.n_out,
            m.n_in,
            tokens,
            x.n_rows,
            x.ptr,
            scale,
        )
    }

    fn rms_norm(&mut self, x: &DevActs, w: &DevVector<D>, eps: f32, y: &mut DevActs) -> Result<()> {
        same_shape(x, y, "rms_norm")?;
        let n_rows = x.n_rows * x.width / w.len;
        k::rms_norm(
            &self.dev,
            x.ptr,
            self.dev.ptr(&w.data),
            y.ptr,
            n_rows,
            w.len,
            eps,
        )
    }

    fn rms_norm_inplace(&mut self, x: &mut DevActs, w: &DevVector<D>, eps: f32) -> Result<()> {
        if !(x.n_rows * x.width).is_multiple_of(w.len) {
            bail!("rms_norm: rows of {} in [{}][{}]", w.len, x.n_rows, x.width);
        }
        let n_rows = x.n_rows * x.width / w.len;
        k::rms_norm(
            &self.dev,
            x.ptr,
            self.dev.ptr(&w.data),
            x.ptr,
            n_rows,
            w.len,
            eps,
        )
    }

    fn input(&self, x: &DevActs) -> DevInput {
        DevInput {
            x: *x,
            quantized: Vec::new(),
        }
    }

    fn matmul(&mut self, x: &mut DevInput, m: &DevMatrix<D>, out: &mut DevActs) -> Result<()> {
        let xa = x.x;
        if xa.width != m.n_in || out.width != m.n_out || out.n_rows != xa.n_rows {
            bail!(
                "matmul of [{}][{}] by [{}][{}] into [{}][{}]",
                xa.n_rows,
                xa.width,
                m.n_out,
                m.n_in,
                out.n_rows,
                out.width
            );
        }
        let vdt = m.ttype.vec_dot_type();
        let a = if vdt == TensorType::F32 {
            xa.ptr
        } else if let Some(&(_, p)) = x.quantized.iter().find(|(t, _)| *t == vdt) {
            p
        } else {
            let Some(row_bytes) = vdt.row_bytes(m.n_in) else {
                bail!("rows of {} elements are not whole {vdt} blocks", m.n_in);
            };
            let (_, p) = self.alloc(xa.n_rows * row_bytes)?;
            k::quantize(&self.dev, vdt, xa.ptr, xa.n_rows, m.n_in, p)?;
            x.quantized.push((vdt, p));
            p
        };
        k::matmul(
            &self.dev,
            m.ttype,
            self.dev.ptr(&m.data),
            a,
            m.n_in,
            m.n_out,
            xa.n_rows,
            out.ptr,
            MatmulKernel::Auto,
        )
    }

    fn add_bias(&mut self, x: &mut DevActs, bias: &DevVector<D>) -> Result<()> {
        if bias.len != x.width {
            bail!("a bias of {} on rows of {}", bias.len, x.width);
        }
        k::add_bias(
            &self.dev,
            x.ptr,
            self.dev.ptr(&bias.data),
            x.n_rows,
            x.width,
        )
    }

    fn rope(&mut self, x: &mut DevActs, n_heads: usize, rope: &Rope) -> Result<()> {
        let positions = self.dev.ptr(&self.step()?.positions);
        if x.width != n_heads * rope.head_dim {
            bail!(
                "rope of {n_heads} heads of {} on rows of {}",
                rope.head_dim,
                x.width
            );
        }
        let factors = if is_extended(rope) {
            let want = k::rope_factors(rope)?;
            let Some((_, buf)) = self.rope_factors.iter().find(|(f, _)| same_bits(f, &want)) else {
                bail!("a rope whose frequency factors were not uploaded at load");
            };
            Some(self.dev.ptr(buf))
        } else {
            None
        };
        k::rope(
            &self.dev, x.ptr, positions, x.n_rows, n_heads, rope, factors,
        )
    }

    fn kv_write(&mut self, layer: usize, kk: &DevActs, v: &DevActs) -> Result<()> {
        same_shape(kk, v, "kv_write")?;
        if kk.width != self.kv_dim() {
            bail!("kv_write: rows of {}, kv_dim {}", kk.width, self.kv_dim());
        }
        let slots = self.dev.ptr(&self.step()?.slots);
        let scratch = match self.kv.turns_writes(layer) {
            true => {
                let bytes = kk.n_rows * kk.width * F32;
                Some((self.alloc(bytes)?.1, self.alloc(bytes)?.1))
            }
            false => None,
        };
        self.kv
            .write(&self.dev, layer, kk.ptr, v.ptr, slots, kk.n_rows, scratch)
    }

    fn attention(
        &mut self,
        layer: usize,
        q: &DevActs,
        window: Option<usize>,
        sinks: Option<&DevVector<D>>,
        out: &mut DevActs,
    ) -> Result<()> {
        same_shape(q, out, "attention")?;
        let sinks = sinks.map(|w| self.dev.ptr(&w.data));
        let s = self.step()?;
        let addressing = DevAttentionBatch {
            block_tables: self.dev.ptr(&s.block_tables),
            max_blocks_per_seq: s.max_blocks_per_seq,
            n_seqs: s.n_seqs,
            token_seq: self.dev.ptr(&s.token_seq),
            context_lens: self.dev.ptr(&s.context_lens),
        };
        let turned_q = match self.kv.types.k_rotation(self.kv.shape.head_dim) {
            Some(_) => Some(self.alloc(q.n_rows * q.width * F32)?.1),
            None => None,
        };
        self.kv.attend(
            &self.dev,
            layer,
            q.ptr,
            turned_q,
            out.ptr,
            &addressing,
            q.n_rows,
            self.attn_scale,
            window,
            sinks,
        )
    }

    fn glu(&mut self, gate: &mut DevActs, up: &DevActs, act: Activation) -> Result<()> {
        same_shape(gate, up, "glu")?;
        k::glu(&self.dev, gate.ptr, up.ptr, gate.n_rows * gate.width, act)
    }

    fn add(&mut self, x: &mut DevActs, y: &DevActs) -> Result<()> {
        same_shape(x, y, "add")?;
        k::add(&self.dev, x.ptr, y.ptr, x.n_rows * x.width)
    }

    fn read(&mut self, x: &DevActs) -> Result<Vec<f32>> {
        self.dev.download(&self.arena[x.slot], x.n_rows * x.width)
    }

    fn reshape(&mut self, x: DevActs, n_rows: usize, width: usize) -> Result<DevActs> {
        if x.n_rows * x.width != n_rows * width {
            bail!(
                "reshape of [{}][{}] into [{n_rows}][{width}]",
                x.n_rows,
                x.width
            );
        }
        Ok(DevActs { n_rows, width, ..x })
    }

    fn gather_rows(&mut self, x: &DevActs, rows: &[u32], out: &mut DevActs) -> Result<()> {
        check_rows("gather", x, rows, out, out.n_rows, x.n_rows)?;
        let rows = self.keep(self.dev.upload(&as_i32(rows))?);
        let (n_in, n) = (x.n_rows, x.width);
        k::gather_rows(&self.dev, x.ptr, n_in, rows, out.n_rows, out.ptr, n)
    }

    fn scatter_rows(&mut self, x: &DevActs, rows: &[u32], out: &mut DevActs) -> Result<()> {
        check_rows("scatter", x, rows, out, x.n_rows, out.n_rows)?;
        let rows = self.keep(self.dev.upload(&as_i32(rows))?);
        let (n_out, n) = (out.n_rows, x.width);
        k::scatter_rows(&self.dev, x.ptr, rows, x.n_rows, out.ptr, n_out, n)
    }

    fn weighted_sum(&mut self, x: &DevActs, w: &[f32], k: usize, out: &mut DevActs) -> Result<()> {
        if x.width != out.width || x.n_rows != out.n_rows * k || w.len() != x.n_rows {
            bail!(
                "weighted sum of [{}][{}] into {} rows",
                x.n_rows,
                x.width,
                out.n_rows
            );
        }
        let w = self.keep(self.dev.upload(w)?);
        k::weighted_sum(&self.dev, x.ptr, w, out.n_rows, k, out.ptr, x.width)
    }

    fn gather_logits_rows(&mut self, x: &DevActs, out: &mut DevActs) -> Result<()> {
        let Some(rows) = &self.step()?.logits_rows else {
            bail!("gathering the logits rows of a batch that wants none");
        };
        if out.width != x.width {
            bail!("gather of rows of {} into rows of {}", x.width, out.width);
        }
        let rows = self.dev.ptr(rows);
        k::gather_rows(
            &self.dev, x.ptr, x.n_rows, rows, out.n_rows, out.ptr, x.width,
        )
    }

    fn scale(&mut self, x: &mut DevActs, s: f32) -> Result<()> {
        k::scale(&self.dev, x.ptr, x.n_rows * x.width, s)
    }

    fn softcap(&mut self, x: &mut DevActs, cap: f32) -> Result<()> {
        k::softcap(&self.dev, x.ptr, x.n_rows * x.width, cap)
    }

    fn logits(&mut self, x: DevActs) -> Result<Vec<f32>> {
        let logits = self.dev.download(&self.arena[x.slot], x.n_rows * x.width);
        self.step = None;
        logits
    }

    fn end_step(&mut self) -> Result<()> {
        self.dev.synchronize()?;
        self.step = None;
        Ok(())
    }

    fn copy_block(&mut self, src: BlockId, dst: BlockId) -> Result<()> {
        self.dev.bind()?;
        self.kv.copy_block(&self.dev, src, dst)
    }
}

//! The CUDA backend's paged KV pool: per layer, keys and values [num_blocks][block_size] rows of
//! kv_dim in their cache type (f16, q8_0 or q4_0: the CPU `KvCache`'s layout), and for a
//! quantized K each layer's key center (`crate::model::key_centers`). A quantized cache is
//! written and read as the CPU backend's (`crate::model::Cpu`): keys less their center, keys and
//! queries turned by `KvTypes::k_rotation`, values by `KvTypes::v_rotation` and attention's output
//! turned back, all by el_cuda_hadamard, bit for bit as `kernels::hadamard_rows`. Owned by
//! `super::backend::CudaBackend`, which lends it scratch rows from its arena.

use anyhow::{Context, Result};

use super::kernels::{self as k, DevAttentionBatch};
use super::launch::{CudaDevice, DevPtr};
use crate::kernels::tensor_type::TensorType;
use crate::kernels::{kv_row_words, AttentionShape, KvTypes};
use crate::model::kv_cache::BlockId;
use crate::model::{Model, ModelConfig};

pub struct KvPool<D: CudaDevice> {
    k_cache: Vec<D::Buf>,
    v_cache: Vec<D::Buf>,
    pub types: KvTypes,
    /// Each layer's key center [kv_dim], with a quantized K only.
    key_centers: Vec<Option<D::Buf>>,
    pub shape: AttentionShape,
}

impl<D: CudaDevice> KvPool<D> {
    /// Bytes of a pool of `num_blocks` blocks of `block_size` tokens of `types` for a model of `c`.
    pub fn bytes(c: &ModelConfig, types: KvTypes, block_size: usize, num_blocks: usize) -> usize {
        c.num_layers * num_blocks * block_size * types.token_bytes(c.kv_dim())
    }

    /// A zeroed pool on `dev` for `model` (types the kernels keep and the head size holds).
    pub fn new(
        dev: &D,
        model: &Model,
        types: KvTypes,
        block_size: usize,
        num_blocks: usize,
    ) -> Result<KvPool<D>> {
        let c = &model.config;
        k::check_kv_types(types)?;
        types.check(c.head_dim).map_err(anyhow::Error::msg)?;
        let caches = |t: TensorType| {
            let words = num_blocks * block_size * kv_row_words(t, c.kv_dim());
            (0..c.num_layers)
                .map(|_| dev.zeros::<u16>(words))
                .collect::<Result<Vec<_>>>()
        };
        // As `Model::on_cpu`: a quantized K stores keys less their layer's center.
        let key_centers = match types.k.block_size() > 1 {
            true => model
                .key_centers()
                .into_iter()
                .map(|c| c.map(|c| dev.upload(&c)).transpose())
                .collect::<Result<Vec<_>>>()
                .context("uploading the key centers")?,
            false => Vec::new(),
        };
        Ok(KvPool {
            k_cache: caches(types.k)?,
            v_cache: caches(types.v)?,
            types,
            key_centers,
            shape: AttentionShape {
                n_heads: c.n_heads,
                n_kv_heads: c.n_kv_heads,
                head_dim: c.head_dim,
                block_size,
                num_blocks,
            },
        })
    }

    pub fn kv_dim(&self) -> usize {
        self.shape.n_kv_heads * self.shape.head_dim
    }

    fn center(&self, dev: &D, layer: usize) -> Option<DevPtr> {
        let center = self.key_centers.get(layer)?.as_ref()?;
        Some(dev.ptr(center))
    }

    /// Whether layer `layer`'s rows are turned (or centered) before they are stored: then
    /// [`KvPool::write`] needs scratch for them.
    pub fn turns_writes(&self, layer: usize) -> bool {
        let hd = self.shape.head_dim;
        self.types.k_rotation(hd).is_some()
            || self.types.v_rotation(hd).is_some()
            || self.key_centers.get(layer).is_some_and(Option::is_some)
    }

    /// Keys and values [n_rows][kv_dim] into layer `layer` at `slots` (int64 [n_rows], checked);
    /// `scratch` holds the turned copies ([n_rows][kv_dim] f32 each) when `turns_writes`.
    #[allow(clippy::too_many_arguments)]
    pub fn write(
        &self,
        dev: &D,
        layer: usize,
        keys: DevPtr,
        values: DevPtr,
        slots: DevPtr,
        n_rows: usize,
        scratch: Option<(DevPtr, DevPtr)>,
    ) -> Result<()> {
        let (hd, kv_dim) = (self.shape.head_dim, self.kv_dim());
        let (keys, values) = match scratch {
            None => (keys, values),
            Some((tk, tv)) => {
                let rot_k = self.types.k_rotation(hd).unwrap_or(1);
                let rot_v = self.types.v_rotation(hd).unwrap_or(1);
                let center = self.center(dev, layer);
                k::hadamard(dev, keys, tk, center, n_rows, kv_dim, rot_k)?;
                k::hadamard(dev, values, tv, None, n_rows, kv_dim, rot_v)?;
                (tk, tv)
            }
        };
        k::kv_write(
            dev,
            self.types,
            keys,
            values,
            dev.ptr(&self.k_cache[layer]),
            dev.ptr(&self.v_cache[layer]),
            slots,
            n_rows,
            kv_dim,
            self.shape.num_blocks * self.shape.block_size,
        )
    }

    /// Paged attention of queries `q` ([n_rows][n_heads][head_dim]) over layer `layer` into
    /// `out`; `turned_q` (as large as `q`) holds the turned queries when K is turned.
    #[allow(clippy::too_many_arguments)]
    pub fn attend(
        &self,
        dev: &D,
        layer: usize,
        q: DevPtr,
        turned_q: Option<DevPtr>,
        out: DevPtr,
        b: &DevAttentionBatch,
        n_rows: usize,
        scale: f32,
        window: Option<usize>,
        sinks: Option<DevPtr>,
    ) -> Result<()> {
        let s = &self.shape;
        let (hd, width) = (s.head_dim, s.n_heads * s.head_dim);
        // Queries turned as the keys were (q . k unchanged), the output turned back.
        let q = match (self.types.k_rotation(hd), turned_q) {
            (Some(n), Some(tq)) => {
                k::hadamard(dev, q, tq, None, n_rows, width, n)?;
                tq
            }
            (Some(_), None) => anyhow::bail!("attention: no scratch for the turned queries"),
            (None, _) => q,
        };
        let (k_cache, v_cache) = (dev.ptr(&self.k_cache[layer]), dev.ptr(&self.v_cache[layer]));
        k::paged_attention(
            dev, self.types, out, q, k_cache, v_cache, s, b, n_rows, scale, window, sinks,
        )?;
        match self.types.v_rotation(hd) {
            Some(n) => k::hadamard(dev, out, out, None, n_rows, width, n),
            None => Ok(()),
        }
    }

    /// Block `src` onto block `dst` in every layer's keys and values.
    pub fn copy_block(&self, dev: &D, src: BlockId, dst: BlockId) -> Result<()> {
        let words = |t| self.shape.block_size * kv_row_words(t, self.kv_dim());
        let (k_words, v_words) = (words(self.types.k), words(self.types.v));
        let keys = self.k_cache.iter().map(|c| (c, k_words));
        for (cache, block_words) in keys.chain(self.v_cache.iter().map(|c| (c, v_words))) {
            let n = self.shape.num_blocks;
            k::copy_block(
                dev,
                dev.ptr(cache),
                n,
                block_words,
                src.index(),
                dst.index(),
            )?;
        }
        Ok(())
    }
}

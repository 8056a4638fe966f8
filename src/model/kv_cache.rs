//! The paged KV cache: one pool of fixed-size blocks per layer, holding keys and values in f16 or
//! in the cache types chosen (`--cache-type-k`, `--cache-type-v`: `kernels::KvTypes`), one row of
//! `kv_dim` elements per token, quantized once when it is written.
//! A sequence owns a block table (block ids in order); token `j` of a sequence lives in slot
//! `block_table[j / block_size] * block_size + j % block_size`. This module owns the memory only;
//! which blocks belong to whom is integer bookkeeping kept by the caller (the engine's block
//! manager; `scoring::runner::SequenceRunner`, alone in its pool, takes blocks in order).

use crate::kernels::{kv_row_words, AttentionShape, KvTypes};
use crate::model::ModelConfig;

/// A block of the KV pool: `block_size` tokens' keys and values in every layer. The engine's
/// block manager hands blocks out and block tables list them; the kernels see plain integers
/// (`Batch::block_tables`, the slot mapping).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

impl BlockId {
    /// Where the block starts in a pool's per-layer arrays, in blocks.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl std::fmt::Display for BlockId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

pub struct KvCache {
    pub block_size: usize,
    pub num_blocks: usize,
    pub types: KvTypes,
    /// 16-bit words of one token's key row and value row.
    k_row: usize,
    v_row: usize,
    /// Per layer: keys and values, each [num_blocks][block_size] rows of [n_kv_heads][head_dim]
    /// elements of their type (f16 words, or ggml blocks along head_dim), `k_row` and `v_row`
    /// words each.
    k: Vec<Vec<u16>>,
    v: Vec<Vec<u16>>,
}

impl KvCache {
    /// Bytes one block takes over all layers, keys and values, in f16.
    pub fn bytes_per_block(c: &ModelConfig, block_size: usize) -> usize {
        Self::bytes_per_block_as(KvTypes::F16, c, block_size)
    }

    /// Bytes one block takes over all layers, keys and values, in `types`.
    pub fn bytes_per_block_as(types: KvTypes, c: &ModelConfig, block_size: usize) -> usize {
        c.num_kv_layers() * block_size * types.token_bytes(c.kv_dim())
    }

    /// An f16 pool.
    pub fn new(c: &ModelConfig, block_size: usize, num_blocks: usize) -> KvCache {
        Self::new_as(KvTypes::F16, c, block_size, num_blocks)
    }

    /// A pool of `types` (checked against the head size first: `KvTypes::check`).
    pub fn new_as(
        types: KvTypes,
        c: &ModelConfig,
        block_size: usize,
        num_blocks: usize,
    ) -> KvCache {
        assert!(block_size > 0 && num_blocks > 0);
        let (k_row, v_row) = (
            kv_row_words(types.k, c.kv_dim()),
            kv_row_words(types.v, c.kv_dim()),
        );
        let slots = num_blocks * block_size;
        let attends = |l: usize| c.layers[l].kind == crate::model::config::LayerKind::Attention;
        KvCache {
            block_size,
            num_blocks,
            types,
            k_row,
            v_row,
            // Recurrent layers keep no keys or values (their state lives in `state_pool`).
            k: (0..c.num_layers)
                .map(|l| vec![0u16; if attends(l) { slots * k_row } else { 0 }])
                .collect(),
            v: (0..c.num_layers)
                .map(|l| vec![0u16; if attends(l) { slots * v_row } else { 0 }])
                .collect(),
        }
    }

    pub fn layer(&self, l: usize) -> (&[u16], &[u16]) {
        (&self.k[l], &self.v[l])
    }

    pub fn layer_mut(&mut self, l: usize) -> (&mut [u16], &mut [u16]) {
        (&mut self.k[l], &mut self.v[l])
    }

    pub fn shape(&self, c: &ModelConfig) -> AttentionShape {
        AttentionShape {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            block_size: self.block_size,
            num_blocks: self.num_blocks,
        }
    }

    /// Layers with keys and values (not the recurrent ones).
    fn num_kv_layers(&self) -> usize {
        self.k.iter().filter(|k| !k.is_empty()).count()
    }

    /// Bytes of one block over all layers (`bytes_per_block_as`), as `read_block` returns them.
    pub fn block_bytes(&self) -> usize {
        2 * self.num_kv_layers() * self.block_size * (self.k_row + self.v_row)
    }

    /// Block `id`'s keys and values as bytes: per layer its keys, then its values
    /// ([block_size] rows of their type each, f16 little-endian or ggml blocks). The disk tier's
    /// format (which records the types beside it).
    pub fn read_block(&self, id: BlockId) -> Vec<u8> {
        let (nk, nv) = (self.block_size * self.k_row, self.block_size * self.v_row);
        let (ak, av) = (id.index() * nk, id.index() * nv);
        let mut out = Vec::with_capacity(self.block_bytes());
        for l in (0..self.k.len()).filter(|&l| !self.k[l].is_empty()) {
            for cache in [&self.k[l][ak..ak + nk], &self.v[l][av..av + nv]] {
                out.extend(cache.iter().flat_map(|x| x.to_le_bytes()));
            }
        }
        out
    }

    /// Fills block `id` from bytes laid out as `read_block` returns them.
    pub fn write_block(&mut self, id: BlockId, bytes: &[u8]) -> anyhow::Result<()> {
        if bytes.len() != self.block_bytes() || id.index() >= self.num_blocks {
            anyhow::bail!(
                "writing KV block {id} of {} from {} bytes (a block has {})",
                self.num_blocks,
                bytes.len(),
                self.block_bytes()
            );
        }
        let (nk, nv) = (self.block_size * self.k_row, self.block_size * self.v_row);
        let (ak, av) = (id.index() * nk, id.index() * nv);
        let mut src = bytes
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]));
        let layers: Vec<usize> = (0..self.k.len())
            .filter(|&l| !self.k[l].is_empty())
            .collect();
        for l in layers {
            for dst in [&mut self.k[l][ak..ak + nk], &mut self.v[l][av..av + nv]] {
                for (d, s) in dst.iter_mut().zip(&mut src) {
                    *d = s;
                }
            }
        }
        Ok(())
    }

    /// Copies block `src` onto block `dst` in every layer (copy-on-write of a shared block).
    pub fn copy_block(&mut self, src: BlockId, dst: BlockId) {
        for (caches, row) in [(&mut self.k, self.k_row), (&mut self.v, self.v_row)] {
            let n = self.block_size * row;
            let (s, d) = (src.index() * n, dst.index() * n);
            for cache in caches.iter_mut().filter(|c| !c.is_empty()) {
                cache.copy_within(s..s + n, d);
            }
        }
    }
}

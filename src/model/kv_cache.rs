//! The paged KV cache: one pool of fixed-size blocks per layer, holding keys and values in f16.
//! A sequence owns a block table (block ids in order); token `j` of a sequence lives in slot
//! `block_table[j / block_size] * block_size + j % block_size`. This module owns the memory only;
//! which blocks belong to whom is integer bookkeeping kept by the caller (the engine's block
//! manager; `scoring::runner::SequenceRunner`, alone in its pool, takes blocks in order).

use crate::kernels::AttentionShape;
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
    kv_dim: usize,
    /// Per layer: keys and values, each [num_blocks][block_size][n_kv_heads][head_dim] f16.
    k: Vec<Vec<u16>>,
    v: Vec<Vec<u16>>,
}

impl KvCache {
    /// Bytes one block takes over all layers, keys and values.
    pub fn bytes_per_block(c: &ModelConfig, block_size: usize) -> usize {
        2 * c.num_layers * block_size * c.kv_dim() * std::mem::size_of::<u16>()
    }

    pub fn new(c: &ModelConfig, block_size: usize, num_blocks: usize) -> KvCache {
        assert!(block_size > 0 && num_blocks > 0);
        let len = num_blocks * block_size * c.kv_dim();
        KvCache {
            block_size,
            num_blocks,
            kv_dim: c.kv_dim(),
            k: (0..c.num_layers).map(|_| vec![0u16; len]).collect(),
            v: (0..c.num_layers).map(|_| vec![0u16; len]).collect(),
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

    /// Bytes of one block over all layers (`bytes_per_block`), as `read_block` returns them.
    pub fn block_bytes(&self) -> usize {
        2 * self.k.len() * self.block_size * self.kv_dim * std::mem::size_of::<u16>()
    }

    /// Block `id`'s keys and values as bytes: per layer its keys, then its values
    /// ([block_size][n_kv_heads][head_dim] f16 each, little-endian). The disk tier's format.
    pub fn read_block(&self, id: BlockId) -> Vec<u8> {
        let n = self.block_size * self.kv_dim;
        let at = id.index() * n;
        let mut out = Vec::with_capacity(self.block_bytes());
        for l in 0..self.k.len() {
            for cache in [&self.k[l], &self.v[l]] {
                out.extend(cache[at..at + n].iter().flat_map(|x| x.to_le_bytes()));
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
        let n = self.block_size * self.kv_dim;
        let at = id.index() * n;
        let mut src = bytes
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]));
        for l in 0..self.k.len() {
            for dst in [&mut self.k[l][at..at + n], &mut self.v[l][at..at + n]] {
                for (d, s) in dst.iter_mut().zip(&mut src) {
                    *d = s;
                }
            }
        }
        Ok(())
    }

    /// Copies block `src` onto block `dst` in every layer (copy-on-write of a shared block).
    pub fn copy_block(&mut self, src: BlockId, dst: BlockId) {
        let n = self.block_size * self.kv_dim;
        let (s, d) = (src.index() * n, dst.index() * n);
        for cache in self.k.iter_mut().chain(self.v.iter_mut()) {
            cache.copy_within(s..s + n, d);
        }
    }
}

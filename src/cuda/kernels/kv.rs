//! The KV cache's kernels: the write into f16, q8_0 or q4_0 rows, the quantized cache's
//! Walsh-Hadamard rotation, paged attention over any of those caches, and the block copy of
//! copy-on-write. Safe wrappers as in `super` (every size checked before the launch); called by
//! `crate::cuda::kv_pool`.

use anyhow::{bail, Result};

use super::{blocks, F32};
use crate::cuda::launch::{Arg, DevPtr, Launch};
use crate::kernels::tensor_type::{TensorType, QK};
use crate::kernels::{kv_type_name, AttentionShape, KvTypes};

/// Fails unless both cache types are ones these kernels hold (`crate::kernels::CUDA_KV_TYPES`).
pub fn check_kv_types(types: KvTypes) -> Result<()> {
    for t in [types.k, types.v] {
        if !crate::kernels::CUDA_KV_TYPES.contains(&t) {
            bail!("the CUDA kernels keep no {} KV cache", kv_type_name(t));
        }
    }
    Ok(())
}

/// Bytes of one cache row of `kv_dim` elements of `t`.
pub fn kv_row_bytes(t: TensorType, kv_dim: usize) -> usize {
    2 * crate::kernels::kv_row_words(t, kv_dim)
}

/// Keys and values ([n_tokens][kv_dim] f32) into the caches of `types` ([num_slots] rows of
/// kv_dim) at `slots` (int64 [n_tokens]; the caller checked each is < num_slots): f16 caches by
/// el_cuda_kv_write, others block by block through the reference's quantizer (el_cuda_kv_write_q).
#[allow(clippy::too_many_arguments)]
pub fn kv_write(
    gpu: &dyn Launch,
    types: KvTypes,
    k: DevPtr,
    v: DevPtr,
    k_cache: DevPtr,
    v_cache: DevPtr,
    slots: DevPtr,
    n_tokens: usize,
    kv_dim: usize,
    num_slots: usize,
) -> Result<()> {
    check_kv_types(types)?;
    let (k_row, v_row) = (kv_row_bytes(types.k, kv_dim), kv_row_bytes(types.v, kv_dim));
    let rows = [
        Arg::Ptr(k.need(n_tokens * kv_dim * F32, "kv_write k")?),
        Arg::Ptr(v.need(n_tokens * kv_dim * F32, "kv_write v")?),
        Arg::Ptr(k_cache.need(num_slots * k_row, "kv_write k cache")?),
        Arg::Ptr(v_cache.need(num_slots * v_row, "kv_write v cache")?),
    ];
    let tail = [
        Arg::Ptr(slots.need(n_tokens * 8, "kv_write slots")?),
        Arg::I64(n_tokens as i64),
        Arg::I64(kv_dim as i64),
    ];
    if types == KvTypes::F16 {
        let args: Vec<Arg> = rows.into_iter().chain(tail).collect();
        return gpu.launch("el_cuda_kv_write", (n_tokens as u32, 1, 1), 256, &args);
    }
    if !kv_dim.is_multiple_of(QK) {
        bail!("kv_write: kv_dim {kv_dim} is not whole blocks of {QK}");
    }
    let types_and_rows = [
        Arg::I32(types.k.ggml_id() as i32),
        Arg::I32(types.v.ggml_id() as i32),
        Arg::I64(k_row as i64),
        Arg::I64(v_row as i64),
    ];
    let args: Vec<Arg> = rows.into_iter().chain(types_and_rows).chain(tail).collect();
    // One warp per block of 32, four warps per thread block.
    let grid = (blocks(kv_dim / QK, 4), n_tokens as u32, 1);
    gpu.launch("el_cuda_kv_write_q", grid, 128, &args)
}

/// `y[r] = turned(x[r] - center)` over `n_rows` rows of `row` f32, each run of `n` (a power of two
/// dividing `row`) times the orthonormal Walsh-Hadamard matrix, bit for bit as
/// `crate::kernels::hadamard_rows`; `n` = 1 turns nothing. `x` and `y` may be the same rows.
#[allow(clippy::too_many_arguments)]
pub fn hadamard(
    gpu: &dyn Launch,
    x: DevPtr,
    y: DevPtr,
    center: Option<DevPtr>,
    n_rows: usize,
    row: usize,
    n: usize,
) -> Result<()> {
    if !n.is_power_of_two() || !row.is_multiple_of(n) {
        bail!("hadamard: runs of {n} in rows of {row}");
    }
    let bytes = n_rows * row * F32;
    let center = match center {
        Some(c) => Some(c.need(row * F32, "hadamard center")?),
        None => None,
    };
    let args = [
        Arg::Ptr(x.need(bytes, "hadamard x")?),
        Arg::Ptr(y.need(bytes, "hadamard y")?),
        // No center: x stands in, never read.
        Arg::Ptr(center.unwrap_or(x.need(bytes, "hadamard x")?)),
        Arg::I32(center.is_some() as i32),
        Arg::I64(n_rows as i64),
        Arg::I64(row as i64),
        Arg::I64(n as i64),
        Arg::F32(1.0 / (n as f32).sqrt()),
    ];
    gpu.launch("el_cuda_hadamard", (n_rows as u32, 1, 1), 256, &args)
}

/// The device side of `crate::kernels::AttentionBatch`: int32 arrays, checked by the caller on
/// the host (block ids, sequence rows and context lengths in range).
pub struct DevAttentionBatch {
    pub block_tables: DevPtr,
    pub max_blocks_per_seq: usize,
    pub n_seqs: usize,
    pub token_seq: DevPtr,
    pub context_lens: DevPtr,
}

/// Paged attention of every (token, head); `q` and `out` [n_tokens][n_heads][head_dim]; `sinks`
/// [n_heads] (gpt-oss) adds each head's sink logit to its softmax.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    gpu: &dyn Launch,
    types: KvTypes,
    out: DevPtr,
    q: DevPtr,
    k_cache: DevPtr,
    v_cache: DevPtr,
    s: &AttentionShape,
    b: &DevAttentionBatch,
    n_tokens: usize,
    scale: f32,
    window: Option<usize>,
    sinks: Option<DevPtr>,
) -> Result<()> {
    if s.head_dim > 512 || s.n_kv_heads == 0 || !s.n_heads.is_multiple_of(s.n_kv_heads) {
        bail!("attention shape {s:?}");
    }
    let qo = n_tokens * s.n_heads * s.head_dim * F32;
    check_kv_types(types)?;
    let kv_dim = s.n_kv_heads * s.head_dim;
    if types != KvTypes::F16 && !s.head_dim.is_multiple_of(QK) {
        bail!(
            "attention: head_dim {} is not whole blocks of {QK}",
            s.head_dim
        );
    }
    let num_slots = s.num_blocks * s.block_size;
    let n_items = n_tokens * s.n_heads;
    let window = window.map(|w| w.min(i32::MAX as usize) as i32).unwrap_or(0);
    let args = [
        Arg::Ptr(out.need(qo, "attention out")?),
        Arg::Ptr(q.need(qo, "attention q")?),
        Arg::Ptr(k_cache.need(
            num_slots * kv_row_bytes(types.k, kv_dim),
            "attention k cache",
        )?),
        Arg::Ptr(v_cache.need(
            num_slots * kv_row_bytes(types.v, kv_dim),
            "attention v cache",
        )?),
        Arg::I32(types.k.ggml_id() as i32),
        Arg::I32(types.v.ggml_id() as i32),
        Arg::Ptr(b.block_tables.need(
            b.n_seqs * b.max_blocks_per_seq * 4,
            "attention block tables",
        )?),
        Arg::Ptr(b.token_seq.need(n_tokens * 4, "attention token_seq")?),
        Arg::Ptr(
            b.context_lens
                .need(n_tokens * 4, "attention context_lens")?,
        ),
        Arg::I64(s.n_heads as i64),
        Arg::I64(s.n_kv_heads as i64),
        Arg::I64(s.head_dim as i64),
        Arg::I64(s.block_size as i64),
        Arg::I64(b.max_blocks_per_seq as i64),
        Arg::F32(scale),
        Arg::I32(window),
        // gpt-oss's sink logit per head; without sinks q stands in, never read.
        Arg::Ptr(match sinks {
            Some(p) => p.need(s.n_heads * F32, "attention sinks")?,
            None => q.need(qo, "attention q")?,
        }),
        Arg::I32(sinks.is_some() as i32),
        Arg::I64(0),
        Arg::I64(n_items as i64),
    ];
    // One block per item, its eight warps splitting the keys (el_ops.cu's EL_ATTN_PARTS).
    gpu.launch(
        "el_cuda_paged_attention",
        (blocks(n_items, 1), 1, 1),
        256,
        &args,
    )
}

/// Block `src` onto block `dst` of one layer's keys or values ([num_blocks][block_words] 16-bit
/// words: every cache type's blocks are whole words).
pub fn copy_block(
    gpu: &dyn Launch,
    cache: DevPtr,
    num_blocks: usize,
    block_words: usize,
    src: usize,
    dst: usize,
) -> Result<()> {
    if src >= num_blocks || dst >= num_blocks || src == dst {
        bail!("copy of KV block {src} onto {dst} in a pool of {num_blocks}");
    }
    let args = [
        Arg::Ptr(cache.need(num_blocks * block_words * 2, "copy_block")?),
        Arg::I64(src as i64),
        Arg::I64(dst as i64),
        Arg::I64(block_words as i64),
    ];
    gpu.launch(
        "el_cuda_copy_block",
        (blocks(block_words, 256), 1, 1),
        256,
        &args,
    )
}

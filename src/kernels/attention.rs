//! Safe wrapper over paged attention in `csrc/ops.c` (`el_paged_attention`, with gpt-oss's
//! attention sinks), split across the kernels' pool in tasks that hold whole GQA groups. Called
//! by the CPU backend (`crate::model::cpu`) and the kernel tests.

use super::bindings as ffi;
use super::kv_type::{kv_row_words, kv_type_ok, KvTypes};
use super::pool::SharedMut;

/// Geometry of one layer's paged KV cache.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub num_blocks: usize,
}

/// The per-token addressing of a batch: which sequence a token belongs to and how many keys it
/// sees, plus every sequence's block table padded to `max_blocks_per_seq`.
pub struct AttentionBatch<'a> {
    pub block_tables: &'a [i32],
    pub max_blocks_per_seq: usize,
    pub token_seq: &'a [i32],
    pub context_lens: &'a [i32],
}

/// Paged attention of every (token, head) in the batch, split across threads.
/// `q` and `out` are [n_tokens][n_heads][head_dim]; caches [num_blocks][block_size][n_kv_heads][head_dim].
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    out: &mut [f32],
    q: &[f32],
    k_cache: &[u16],
    v_cache: &[u16],
    shape: &AttentionShape,
    batch: &AttentionBatch<'_>,
    scale: f32,
    window: Option<usize>,
) {
    paged_attention_as(
        KvTypes::F16,
        out,
        q,
        k_cache,
        v_cache,
        shape,
        batch,
        scale,
        window,
    )
}

/// [`paged_attention`] over caches of `types` (as [`kv_write_as`] wrote them).
#[allow(clippy::too_many_arguments)]
pub fn paged_attention_as(
    types: KvTypes,
    out: &mut [f32],
    q: &[f32],
    k_cache: &[u16],
    v_cache: &[u16],
    shape: &AttentionShape,
    batch: &AttentionBatch<'_>,
    scale: f32,
    window: Option<usize>,
) {
    paged_attention_sinks(
        types, out, q, k_cache, v_cache, shape, batch, scale, window, None,
    )
}

/// [`paged_attention_as`] with attention sinks (gpt-oss): `sinks[h]` is one more logit in head
/// h's softmax, with a zero value row.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention_sinks(
    types: KvTypes,
    out: &mut [f32],
    q: &[f32],
    k_cache: &[u16],
    v_cache: &[u16],
    shape: &AttentionShape,
    batch: &AttentionBatch<'_>,
    scale: f32,
    window: Option<usize>,
    sinks: Option<&[f32]>,
) {
    let s = shape;
    if let Some(sinks) = sinks {
        assert_eq!(sinks.len(), s.n_heads, "one attention sink per head");
    }

    let n_tokens = batch.token_seq.len();
    assert!(
        s.head_dim <= EL_MAX_HEAD_DIM && s.n_kv_heads > 0 && s.n_heads.is_multiple_of(s.n_kv_heads)
    );
    assert!(
        q.len() == n_tokens * s.n_heads * s.head_dim && out.len() == q.len(),
        "attention q/out shapes"
    );
    assert!(kv_type_ok(types.k) && kv_type_ok(types.v), "KV cache types");
    types
        .check(s.head_dim)
        .expect("KV cache types for the head size");
    let kv_dim = s.n_kv_heads * s.head_dim;
    let num_slots = s.num_blocks * s.block_size;
    assert!(
        k_cache.len() == num_slots * kv_row_words(types.k, kv_dim)
            && v_cache.len() == num_slots * kv_row_words(types.v, kv_dim),
        "attention cache shapes"
    );
    assert_eq!(batch.context_lens.len(), n_tokens);
    let n_seqs = batch.block_tables.len() / batch.max_blocks_per_seq.max(1);
    assert_eq!(batch.block_tables.len(), n_seqs * batch.max_blocks_per_seq);
    for t in 0..n_tokens {
        let seq = batch.token_seq[t];
        let len = batch.context_lens[t];
        assert!(
            seq >= 0 && (seq as usize) < n_seqs && len >= 1,
            "attention token {t} addressing"
        );
        assert!(
            len as usize <= batch.max_blocks_per_seq * s.block_size,
            "context past block table"
        );
        let table = &batch.block_tables[seq as usize * batch.max_blocks_per_seq..]
            [..batch.max_blocks_per_seq];
        let used = (len as usize).div_ceil(s.block_size);
        assert!(
            table[..used]
                .iter()
                .all(|&b| b >= 0 && (b as usize) < s.num_blocks),
            "block id out of range"
        );
    }
    let window = window.map(|w| w.min(i32::MAX as usize) as i32).unwrap_or(0);
    let n_items = n_tokens * s.n_heads;
    let max_keys = batch
        .context_lens
        .iter()
        .map(|&l| l as usize)
        .max()
        .unwrap_or(0);
    let chunk_items = attention_task_items(
        n_items,
        s.n_heads,
        s.n_heads / s.n_kv_heads,
        super::pool::num_threads(),
        max_keys,
    );
    let out_ptr = SharedMut(out.as_mut_ptr());
    super::pool::for_each_task(n_items.div_ceil(chunk_items), &|c| {
        let begin = c * chunk_items;
        let end = (begin + chunk_items).min(n_items);
        // SAFETY: all shapes and block ids were checked above; each task writes only the
        // disjoint items [begin, end) of `out`.
        unsafe {
            ffi::el_paged_attention(
                out_ptr.ptr(),
                q.as_ptr(),
                k_cache.as_ptr().cast(),
                v_cache.as_ptr().cast(),
                types.k.ggml_id() as i32,
                types.v.ggml_id() as i32,
                batch.block_tables.as_ptr(),
                batch.token_seq.as_ptr(),
                batch.context_lens.as_ptr(),
                s.n_heads as i64,
                s.n_kv_heads as i64,
                s.head_dim as i64,
                s.block_size as i64,
                batch.max_blocks_per_seq as i64,
                scale,
                window,
                sinks.map_or(std::ptr::null(), |v| v.as_ptr()),
                begin as i64,
                end as i64,
            )
        }
    });
}

/// Items (token, head) per attention task. The kernel reads a KV head's keys and values once
/// for every query of its GQA group within a task, so tasks hold whole groups where they can:
/// whole tokens for large batches (up to 128 items); for a few tokens (decode), whole groups, or parts of one
/// when there are fewer groups than threads or (one token) the groups do not share out evenly. One head per task would read each key and value
/// `group` times over (decode at long contexts is bound by that traffic). Tasks only change
/// which queries share a pass, never a query's arithmetic.
///
/// A batch of a few tokens per thread (sequences decoding side by side) goes in one task per
/// thread of whole tokens, so that the kernel can share one pass over a cached prefix's keys
/// between all the sequences whose block tables point at those blocks.
fn attention_task_items(
    n_items: usize,
    n_heads: usize,
    group: usize,
    threads: usize,
    max_keys: usize,
) -> usize {
    let per_thread = n_items.div_ceil(threads).next_multiple_of(n_heads);
    if n_items >= threads * n_heads && per_thread <= 128 {
        return per_thread;
    }
    // Up to 128 items: 14 tokens of 9 heads, so the kernel's passes over the keys (up to 64
    // queries) serve many queries in long prompts.
    let chunk = (n_items / (4 * threads)).clamp(1, 128);
    if chunk >= n_heads {
        return chunk - chunk % n_heads;
    }
    // One token whose GQA groups do not share out evenly (SmolLM2's 3 groups on 2 threads): one
    // task per thread of the items split evenly, a group's heads on both sides where it falls
    // across (3 tasks would leave a thread idle for a group's time). Each side converts that
    // group's keys and values: a third more read, which pays only while they are few (SmolLM2,
    // the busier thread's attention time: 1.28x less at 16 keys, 1.05x at 512, 1.03x at 4,000
    // with the keys in cache; a loss where they come from memory).
    let n_groups = n_heads / group;
    if n_items == n_heads
        && n_groups > 1
        && !n_groups.is_multiple_of(threads)
        && max_keys <= SPLIT_GROUP_MAX_KEYS
    {
        return n_items.div_ceil(threads);
    }
    let chunk = chunk.max(n_items.div_ceil(threads).min(group));
    if chunk >= group {
        chunk - chunk % group
    } else {
        chunk
    }
}

/// The longest context at which one token's attention splits a GQA group between two tasks.
const SPLIT_GROUP_MAX_KEYS: usize = 1024;

use super::EL_MAX_HEAD_DIM as EL_MAX_HEAD_DIM_U32;
const EL_MAX_HEAD_DIM: usize = EL_MAX_HEAD_DIM_U32 as usize;

#[cfg(test)]
mod tests {
    use super::attention_task_items;

    #[test]
    fn attention_tasks_hold_whole_gqa_groups() {
        // SmolLM2-135M: 9 heads in 3 groups. Decode, 2 threads: half the heads per thread, the
        // middle group's split between them (whole groups made 3 tasks for 2 threads).
        assert_eq!(attention_task_items(9, 9, 3, 2, 100), 5);
        // ... and on 3 threads one group each; at long contexts whole groups (the split group's
        // keys would be read twice).
        assert_eq!(attention_task_items(9, 9, 3, 3, 100), 3);
        assert_eq!(attention_task_items(9, 9, 3, 2, 1024), 5);
        assert_eq!(attention_task_items(9, 9, 3, 2, 1025), 3);
        // Two sequences decoding: one token per thread.
        assert_eq!(attention_task_items(18, 9, 3, 2, 100), 9);
        // Qwen2.5 0.5B: 14 heads in 2 groups of 7: one group per thread.
        assert_eq!(attention_task_items(14, 14, 7, 2, 100), 7);
        // Gemma 3 270M: 4 heads in 1 group, 2 threads: half a group each (both threads busy).
        assert_eq!(attention_task_items(4, 4, 4, 2, 100), 2);
        // Large batches: whole tokens, at most 128 items.
        assert_eq!(attention_task_items(512 * 9, 9, 3, 2, 100), 126);
        // 16 sequences decoding: 8 tokens per thread (their shared prefix read once per task).
        assert_eq!(attention_task_items(16 * 9, 9, 3, 2, 100), 72);
        assert_eq!(attention_task_items(16 * 14, 14, 7, 2, 100), 112);
        // Too many for one task per thread: tasks of whole tokens as before.
        assert_eq!(attention_task_items(64 * 9, 9, 3, 2, 100), 72);
    }
}

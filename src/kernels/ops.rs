//! Safe wrappers over the row operations, the paged KV write and paged attention in
//! `csrc/ops.c`. Called by the forward pass (`crate::model::forward`).

use super::bindings as ffi;
use super::kv_type::{kv_row_words, kv_type_ok, KvTypes};
use super::pool::SharedMut;
use super::rows::{for_row_runs, for_row_runs_mut, PAR_MIN_ELEMENTS};

/// `y[r] = x[r] / rms(x[r]) * w` for each row of `w.len()` elements. `y` may be `x` itself via
/// [`rms_norm_inplace`]. Large batches run in runs of rows over the pool ([`for_row_runs`]).
pub fn rms_norm(x: &[f32], w: &[f32], y: &mut [f32], eps: f32) {
    let n = w.len();
    assert!(
        n > 0 && x.len().is_multiple_of(n) && y.len() == x.len(),
        "rms_norm shapes"
    );
    for_row_runs_mut(y, n, RMS_ROWS, PAR_MIN_ELEMENTS, &|r0, yr| {
        let xr = &x[r0 * n..r0 * n + yr.len()];
        // SAFETY: xr and yr hold the same whole rows of n floats and w holds n.
        unsafe {
            ffi::el_rms_norm(
                xr.as_ptr(),
                w.as_ptr(),
                yr.as_mut_ptr(),
                (yr.len() / n) as i64,
                n as i64,
                eps,
            )
        }
    });
}

/// In-place RMSNorm over rows of `w.len()` elements.
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let n = w.len();
    assert!(n > 0 && x.len().is_multiple_of(n), "rms_norm shapes");
    for_row_runs_mut(x, n, RMS_ROWS, PAR_MIN_ELEMENTS, &|_, xr| {
        let p = xr.as_mut_ptr();
        // SAFETY: the kernel allows x and y to alias; xr holds whole rows of n floats.
        unsafe { ffi::el_rms_norm(p, w.as_ptr(), p, (xr.len() / n) as i64, n as i64, eps) }
    });
}

/// `x += y`, then `out[r] = x[r] / rms(x[r]) * w` (a residual add and the next block's norm) in
/// one pass over each run of rows: the same arithmetic as [`super::rows::add_inplace`] then
/// [`rms_norm`], each row's values still in cache for the norm.
pub fn add_rms_norm(x: &mut [f32], y: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    assert!(
        n > 0 && x.len().is_multiple_of(n) && y.len() == x.len() && out.len() == x.len(),
        "add_rms_norm shapes"
    );
    let out_ptr = SharedMut(out.as_mut_ptr());
    for_row_runs_mut(x, n, RMS_ROWS, PAR_MIN_ELEMENTS, &|r0, xr| {
        let begin = r0 * n;
        let yr = &y[begin..begin + xr.len()];
        xr.iter_mut().zip(yr).for_each(|(a, b)| *a += b);
        // SAFETY: out holds as many floats as x; this run's rows [begin, begin + xr.len()) of
        // it are touched by no other run, and `out` stays borrowed mutably until the runs end.
        unsafe {
            ffi::el_rms_norm(
                xr.as_ptr(),
                w.as_ptr(),
                out_ptr.ptr().add(begin),
                (xr.len() / n) as i64,
                n as i64,
                eps,
            )
        }
    });
}

/// Rows the AVX2 RMSNorm normalises together: runs of whole groups of them.
const RMS_ROWS: usize = 16;

/// How a rotary embedding pairs dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (x[2i], x[2i+1]): llama-architecture GGUF files.
    Normal,
    /// Halves (x[i], x[i + d/2]): qwen2, gemma and other NeoX-style models.
    Neox,
}

/// Shape and frequencies of a rotary embedding.
#[derive(Clone, Copy, Debug)]
pub struct Rope {
    pub head_dim: usize,
    pub rope_dim: usize,
    pub freq_base: f32,
    pub freq_scale: f32,
    pub style: RopeStyle,
    /// Per-pair divisors of the frequencies (llama3's `rope_freqs.weight`).
    pub freq_factors: Option<FreqFactors>,
    /// YaRN scaling (`rope.scaling.type = yarn`).
    pub yarn: Option<Yarn>,
}

/// Per-pair frequency divisors, `rope_dim / 2` of them, kept inline so a [`Rope`] stays `Copy`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FreqFactors {
    n: usize,
    values: [f32; EL_MAX_HEAD_DIM / 2],
}

impl FreqFactors {
    /// `None` when there are more factors than a head can have pairs.
    pub fn new(v: &[f32]) -> Option<FreqFactors> {
        let mut values = [0.0; EL_MAX_HEAD_DIM / 2];
        values.get_mut(..v.len())?.copy_from_slice(v);
        Some(FreqFactors { n: v.len(), values })
    }

    pub fn as_slice(&self) -> &[f32] {
        &self.values[..self.n]
    }
}

/// YaRN's parameters as llama.cpp derives them from the scaling factor: extrapolated
/// frequencies mixed into the interpolated ones over the pairs [corr_low, corr_high], and a
/// magnitude factor on cos and sin.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    pub ext_factor: f32,
    pub attn_factor: f32,
    pub corr_low: f32,
    pub corr_high: f32,
}

impl Yarn {
    /// llama.cpp's defaults (ext_factor 1, beta_fast 32, beta_slow 1; llama-context.cpp and
    /// ggml_rope_yarn_corr_dims) for a model trained on `n_ctx_orig` positions, scaled by
    /// `1 / freq_scale`.
    pub fn new(rope_dim: usize, n_ctx_orig: usize, freq_base: f32, freq_scale: f32) -> Yarn {
        let (beta_fast, beta_slow) = (32.0f32, 1.0f32);
        let n_dims = rope_dim as f32;
        let corr_dim = |n_rot: f32| {
            n_dims * (n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * freq_base.ln())
        };
        let factor = 1.0 / freq_scale;
        let mscale = if factor <= 1.0 {
            1.0
        } else {
            0.1 * factor.ln() + 1.0
        };
        // ggml multiplies its own 1 + 0.1 ln(factor) back in: llama.cpp cancels it here.
        let attn_factor = mscale * (1.0 / (1.0 + 0.1 * factor.ln()));
        Yarn {
            ext_factor: 1.0,
            attn_factor,
            corr_low: corr_dim(beta_fast).floor().max(0.0),
            corr_high: corr_dim(beta_slow).ceil().min(n_dims - 1.0),
        }
    }
}

/// Rotates `x` ([n_tokens][n_heads][head_dim]) in place, token t at position `pos[t]`. Large
/// batches run in runs of tokens over the pool (each token's cos and sin are its own).
pub fn rope(x: &mut [f32], pos: &[i32], n_heads: usize, r: &Rope) {
    let n_tokens = pos.len();
    assert_eq!(x.len(), n_tokens * n_heads * r.head_dim, "rope shapes");
    assert!(
        r.rope_dim <= r.head_dim && r.rope_dim.is_multiple_of(2),
        "rope dims"
    );
    let row_len = n_heads * r.head_dim;
    if row_len == 0 {
        return;
    }
    // A token's cos and sin cost about as much as rotating 16 floats per rotated dimension.
    let cost = row_len + 16 * r.rope_dim;
    let min_tokens = PAR_MIN_ELEMENTS.div_ceil(cost);
    let ext = r.freq_factors.is_some() || r.yarn.is_some();
    for_row_runs_mut(x, row_len, 1, min_tokens * row_len, &|t0, xr| {
        let pos = &pos[t0..t0 + xr.len() / row_len];
        if ext {
            rope_ext(xr, pos, n_heads, r)
        } else {
            rope_plain(xr, pos, n_heads, r)
        }
    });
}

/// `rope` for a plain rope (el_rope) over the tokens of `pos`.
fn rope_plain(x: &mut [f32], pos: &[i32], n_heads: usize, r: &Rope) {
    let n_tokens = pos.len();
    // SAFETY: x holds n_tokens * n_heads * head_dim floats, pos n_tokens ints.
    unsafe {
        ffi::el_rope(
            x.as_mut_ptr(),
            pos.as_ptr(),
            n_tokens as i64,
            n_heads as i64,
            r.head_dim as i64,
            r.rope_dim as i64,
            r.freq_base,
            r.freq_scale,
            (r.style == RopeStyle::Neox) as i32,
        )
    }
}

/// `rope` for a rope with frequency factors or YaRN (el_rope_ext, the scalar reference).
fn rope_ext(x: &mut [f32], pos: &[i32], n_heads: usize, r: &Rope) {
    let n_tokens = pos.len();
    let factors = r.freq_factors.as_ref().map(FreqFactors::as_slice);
    if let Some(f) = factors {
        assert_eq!(
            f.len(),
            r.rope_dim / 2,
            "one frequency factor per rotated pair"
        );
    }
    let yarn = r.yarn.unwrap_or(Yarn {
        ext_factor: 0.0,
        attn_factor: 1.0,
        corr_low: 0.0,
        corr_high: 0.0,
    });
    // SAFETY: x holds n_tokens * n_heads * head_dim floats, pos n_tokens ints, factors (when
    // given) rope_dim / 2 floats; rope_dim <= head_dim <= EL_MAX_HEAD_DIM (checked at load).
    unsafe {
        ffi::el_rope_ext(
            x.as_mut_ptr(),
            pos.as_ptr(),
            n_tokens as i64,
            n_heads as i64,
            r.head_dim as i64,
            r.rope_dim as i64,
            r.freq_base,
            r.freq_scale,
            (r.style == RopeStyle::Neox) as i32,
            factors.map_or(std::ptr::null(), |f| f.as_ptr()),
            yarn.ext_factor,
            yarn.attn_factor,
            yarn.corr_low,
            yarn.corr_high,
        )
    }
}

/// The gated activation of a feed-forward block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// silu(gate) * up (llama, qwen2).
    SwiGlu,
    /// gelu_tanh(gate) * up (gemma).
    GeGlu,
    /// gpt-oss's clamped SwiGLU (ggml's `swiglu_oai`, alpha 1.702, limit 7):
    /// min(gate, 7) * sigmoid(1.702 min(gate, 7)) * (clamp(up, -7, 7) + 1).
    SwiGluOai,
}

/// gpt-oss's SwiGLU constants (llama.cpp's `LLM_FFN_SWIGLU_OAI_MOE`).
pub const SWIGLU_OAI_ALPHA: f32 = 1.702;
pub const SWIGLU_OAI_LIMIT: f32 = 7.0;

/// `gate[i] = act(gate[i]) * up[i]`, in place in `gate`. Large batches run in runs of whole
/// vectors (8 floats; the tail in the last run) over the pool.
pub fn glu_inplace(gate: &mut [f32], up: &[f32], act: Activation) {
    assert_eq!(gate.len(), up.len(), "glu shapes");
    let n = gate.len();
    let n_vectors = n.div_ceil(GLU_VECTOR);
    let gate_ptr = SharedMut(gate.as_mut_ptr());
    // An activation (an exponential or a tanh) costs about as much as four float operations.
    let min_vectors = PAR_MIN_ELEMENTS.div_ceil(4 * GLU_VECTOR);
    for_row_runs(n_vectors, 1, 1, min_vectors, &|vectors| {
        let begin = vectors.start * GLU_VECTOR;
        let len = (vectors.end * GLU_VECTOR).min(n) - begin;
        // SAFETY: [begin, begin + len) is inside both buffers and no other run touches it (the
        // runs are disjoint); the kernel allows y to alias gate; `gate` stays borrowed mutably
        // until for_row_runs returns.
        unsafe {
            let p = gate_ptr.ptr().add(begin);
            let u = up.as_ptr().add(begin);
            match act {
                Activation::SwiGlu => ffi::el_swiglu(p, u, p, len as i64),
                Activation::GeGlu => ffi::el_geglu(p, u, p, len as i64),
                Activation::SwiGluOai => ffi::el_swiglu_oai(
                    p,
                    u,
                    p,
                    len as i64,
                    SWIGLU_OAI_ALPHA,
                    SWIGLU_OAI_LIMIT,
                ),
            }
        }
    });
}

/// The gated activations' vector width: runs start on whole vectors, so every element goes
/// through the same code (vector or tail) as in one call over all of them.
const GLU_VECTOR: usize = 8;

/// `y[i] = expf(x[i])` with glibc's results bit for bit (the exp of SwiGLU's SIMD variant; see
/// csrc/expf_glibc.h), under the current ISA.
pub fn expf(x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "expf shapes");
    // SAFETY: both hold x.len() floats.
    unsafe { ffi::el_expf(x.as_ptr(), y.as_mut_ptr(), x.len() as i64) }
}

/// Writes the rows of `k` and `v` ([n_tokens][kv_dim]) into the f16 caches at the slots of
/// `slot_mapping` (negative slots are skipped).
pub fn kv_write(
    k: &[f32],
    v: &[f32],
    k_cache: &mut [u16],
    v_cache: &mut [u16],
    slot_mapping: &[i64],
    kv_dim: usize,
) {
    kv_write_as(KvTypes::F16, k, v, k_cache, v_cache, slot_mapping, kv_dim)
}

/// [`kv_write`] into caches of `types` (rows of [`kv_row_words`] each): each row converted once,
/// at the write, so what a later step reads never depends on the batch that wrote it.
pub fn kv_write_as(
    types: KvTypes,
    k: &[f32],
    v: &[f32],
    k_cache: &mut [u16],
    v_cache: &mut [u16],
    slot_mapping: &[i64],
    kv_dim: usize,
) {
    let n_tokens = slot_mapping.len();
    assert!(
        k.len() == n_tokens * kv_dim && v.len() == k.len(),
        "kv_write shapes"
    );
    assert!(kv_type_ok(types.k) && kv_type_ok(types.v), "KV cache types");
    let (k_row, v_row) = (kv_row_words(types.k, kv_dim), kv_row_words(types.v, kv_dim));
    let num_slots = (k_cache.len() / k_row) as i64;
    assert_eq!(
        v_cache.len() / v_row,
        num_slots as usize,
        "kv_write cache shapes"
    );
    assert!(
        slot_mapping.iter().all(|&s| s < num_slots),
        "slot out of range"
    );
    // SAFETY: every slot used is < num_slots, so each row written stays in its cache; the types
    // are ones the kernel takes and kv_dim is a whole number of their blocks (kv_row_words).
    unsafe {
        ffi::el_kv_write(
            k.as_ptr(),
            v.as_ptr(),
            k_cache.as_mut_ptr().cast(),
            v_cache.as_mut_ptr().cast(),
            types.k.ggml_id() as i32,
            types.v.ggml_id() as i32,
            slot_mapping.as_ptr(),
            n_tokens as i64,
            kv_dim as i64,
        )
    }
}

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

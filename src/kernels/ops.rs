//! Safe wrappers over the row operations and the paged KV write in `csrc/ops.c` (paged
//! attention: `super::attention`). Called by the forward pass (`crate::model::forward`).

use super::bindings as ffi;
use super::kv_type::{kv_row_words, kv_type_ok, KvTypes};
use super::pool::SharedMut;
use super::rows::{for_row_runs, for_row_runs_mut, PAR_MIN_ELEMENTS};
use super::EL_MAX_HEAD_DIM as EL_MAX_HEAD_DIM_U32;

const EL_MAX_HEAD_DIM: usize = EL_MAX_HEAD_DIM_U32 as usize;

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
                Activation::SwiGluOai => {
                    ffi::el_swiglu_oai(p, u, p, len as i64, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT)
                }
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

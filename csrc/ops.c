/*
 * ops.c: scalar reference row operations (RMSNorm, RoPE, SwiGLU/GeGLU), the paged KV write and
 * paged attention, and their public entry points, which run the current ISA's variant where it
 * has one (ops_avx2.c) and the reference otherwise. Called only through src/kernels/mod.rs; see
 * edge_kernels.h for shapes.
 */
#include <math.h>

#include "edge_kernels.h"
#include "el_internal.h"
#include "simd_internal.h"

static void rms_norm_ref(const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps) {
    for (int64_t r = 0; r < n_rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        /* Sum in double, as ggml does, so the norm does not depend on summation order. */
        double sum = 0.0;
        for (int64_t i = 0; i < n; i++) sum += (double)xr[i] * (double)xr[i];
        const float scale = 1.0f / sqrtf((float)(sum / (double)n) + eps);
        for (int64_t i = 0; i < n; i++) yr[i] = xr[i] * scale * w[i];
    }
}

void el_rope_ref(float *x, const int32_t *pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
             int64_t rope_dim, float freq_base, float freq_scale, int32_t neox) {
    const float theta_scale = powf(freq_base, -2.0f / (float)rope_dim);
    for (int64_t t = 0; t < n_tokens; t++) {
        for (int64_t h = 0; h < n_heads; h++) {
            float *xh = x + (t * n_heads + h) * head_dim;
            /* theta advances by multiplication, as ggml computes its cache. */
            float theta = (float)pos[t] * freq_scale;
            for (int64_t i = 0; i < rope_dim / 2; i++) {
                const float c = cosf(theta), s = sinf(theta);
                const int64_t a = neox ? i : 2 * i;
                const int64_t b = neox ? i + rope_dim / 2 : 2 * i + 1;
                const float x0 = xh[a], x1 = xh[b];
                xh[a] = x0 * c - x1 * s;
                xh[b] = x0 * s + x1 * c;
                theta *= theta_scale;
            }
        }
    }
}

static void swiglu_ref(const float *gate, const float *up, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float g = gate[i];
        y[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void el_geglu(const float *gate, const float *up, float *y, int64_t n) {
    const float sqrt_2_over_pi = 0.79788456080286535587989211986876f;
    for (int64_t i = 0; i < n; i++) {
        const float g = gate[i];
        const float gelu = 0.5f * g * (1.0f + tanhf(sqrt_2_over_pi * g * (1.0f + 0.044715f * g * g)));
        y[i] = gelu * up[i];
    }
}

void el_swiglu_oai(const float *gate, const float *up, float *y, int64_t n, float alpha, float limit) {
    for (int64_t i = 0; i < n; i++) {
        const float g = limit < gate[i] ? limit : gate[i]; /* std::min, as ggml */
        const float u = up[i] < -limit ? -limit : up[i] > limit ? limit : up[i];
        y[i] = g / (1.0f + expf(alpha * -g)) * (u + 1.0f);
    }
}

static void kv_write_f16_ref(const float *k, const float *v, uint16_t *k_cache, uint16_t *v_cache,
                             const int64_t *slot_mapping, int64_t n_tokens, int64_t kv_dim) {
    for (int64_t t = 0; t < n_tokens; t++) {
        const int64_t slot = slot_mapping[t];
        if (slot < 0) continue;
        uint16_t *kd = k_cache + slot * kv_dim;
        uint16_t *vd = v_cache + slot * kv_dim;
        for (int64_t i = 0; i < kv_dim; i++) {
            kd[i] = el_fp32_to_fp16(k[t * kv_dim + i]);
            vd[i] = el_fp32_to_fp16(v[t * kv_dim + i]);
        }
    }
}

int32_t el_kv_type_ok(int32_t type) {
    switch (type) {
    case EL_TYPE_F16: case EL_TYPE_BF16: case EL_TYPE_Q8_0: case EL_TYPE_Q4_0: case EL_TYPE_Q4_1:
    case EL_TYPE_Q5_0: case EL_TYPE_Q5_1: case EL_TYPE_IQ4_NL:
        return 1;
    default:
        return 0;
    }
}

static el_kv_rows kv_rows(const void *cache, int32_t type) {
    return (el_kv_rows){cache, type, el_type_block_size(type) == 1 ? 0 : 5, el_type_block_bytes(type)};
}

/* Bytes of one row of kv_dim elements of `type`. */
static int64_t kv_row_bytes(int32_t type, int64_t kv_dim) {
    return kv_dim / el_type_block_size(type) * el_type_block_bytes(type);
}

void el_kv_rows_to_f32(const el_kv_rows *rows, int64_t e, float *dst, int64_t n) {
    const uint8_t *p = rows->base + (e >> rows->elems_log2) * rows->block_bytes;
    if (rows->type == EL_TYPE_F16) { /* inline: the default cache, and the reference's hot loop */
        const uint16_t *h = (const uint16_t *)p;
        for (int64_t i = 0; i < n; i++) dst[i] = el_fp16_to_fp32(h[i]);
        return;
    }
    el_dequantize_row(rows->type, p, dst, n);
}

/* Paged attention, one (token, head) item at a time, keys in chunks of EL_ATTN_CHUNK from the
 * first key in the window:
 * - each score is q.k in eight partial sums (partial d % 8, fmaf in order of d) added by
 *   el_tree8, times scale;
 * - one online-softmax step per chunk: if the chunk's largest score m_c exceeds the running max m,
 *   what was accumulated is rescaled by exp(m - m_c) and m = m_c; then each key's weight is
 *   p = exp(s - m), added to lane k (its place in the chunk) of the normaliser and, by fmaf, p v
 *   to the output, key after key;
 * - the normaliser's eight lanes are added by el_tree8 at the end, and the output scaled by
 *   el_attn_out_scale (with the head's sink, if any).
 * Each key's and value's head row is first converted to f32 (el_kv_rows_to_f32). */
static void paged_attention_ref(float *out, const float *q, const el_kv_rows *k_cache, const el_kv_rows *v_cache,
                        const int32_t *block_tables, const int32_t *token_seq, const int32_t *context_lens,
                        int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t block_size,
                        int64_t max_blocks_per_seq, float scale, int32_t window, const float *sinks,
                        int64_t item_begin, int64_t item_end) {
    const int64_t group = n_heads / n_kv_heads;
    const int64_t kv_dim = n_kv_heads * head_dim;
    float acc[EL_MAX_HEAD_DIM], kf[EL_MAX_HEAD_DIM], vf[EL_ATTN_CHUNK][EL_MAX_HEAD_DIM];
    for (int64_t item = item_begin; item < item_end; item++) {
        const int64_t t = item / n_heads, h = item % n_heads;
        const int64_t kvh = h / group;
        const float *qh = q + item * head_dim;
        const int32_t *table = block_tables + (int64_t)token_seq[t] * max_blocks_per_seq;
        const int64_t len = context_lens[t];
        const int64_t first = (window > 0 && len > window) ? len - window : 0;
        float m = -INFINITY, lanes[EL_ATTN_CHUNK] = {0};
        for (int64_t d = 0; d < head_dim; d++) acc[d] = 0.0f;
        for (int64_t j0 = first; j0 < len; j0 += EL_ATTN_CHUNK) {
            const int n = (int)(len - j0 < EL_ATTN_CHUNK ? len - j0 : EL_ATTN_CHUNK);
            float s[EL_ATTN_CHUNK], m_c = -INFINITY;
            for (int k = 0; k < n; k++) {
                const int64_t j = j0 + k;
                const int64_t slot = (int64_t)table[j / block_size] * block_size + j % block_size;
                el_kv_rows_to_f32(k_cache, slot * kv_dim + kvh * head_dim, kf, head_dim);
                el_kv_rows_to_f32(v_cache, slot * kv_dim + kvh * head_dim, vf[k], head_dim);
                float part[8] = {0};
                for (int64_t d = 0; d < head_dim; d++) part[d % 8] = fmaf(qh[d], kf[d], part[d % 8]);
                s[k] = el_tree8(part) * scale;
                if (s[k] > m_c) m_c = s[k];
            }
            if (m_c > m) {
                const float c = el_exp_nonpos(m - m_c);
                for (int k = 0; k < EL_ATTN_CHUNK; k++) lanes[k] *= c;
                for (int64_t d = 0; d < head_dim; d++) acc[d] *= c;
                m = m_c;
            }
            for (int k = 0; k < n; k++) {
                const float p = el_exp_nonpos(s[k] - m);
                lanes[k] += p;
                for (int64_t d = 0; d < head_dim; d++) acc[d] = fmaf(p, vf[k][d], acc[d]);
            }
        }
        const float l = el_tree8(lanes);
        float *oh = out + item * head_dim;
        const float inv = el_attn_out_scale(m, l, sinks != NULL ? sinks + h : NULL);
        for (int64_t d = 0; d < head_dim; d++) oh[d] = acc[d] * inv;
    }
}

/* ---- Entry points ------------------------------------------------------------------------------ */

#if defined(__x86_64__)
#define EL_DISPATCH_AVX2(call)                                                                      \
    if (el_use_avx2()) {                                                                           \
        call;                                                                                      \
        return;                                                                                    \
    }
#else
#define EL_DISPATCH_AVX2(call)
#endif

void el_rms_norm(const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps) {
    EL_DISPATCH_AVX2(el_rms_norm_avx2(x, w, y, n_rows, n, eps))
    rms_norm_ref(x, w, y, n_rows, n, eps);
}

void el_rope(float *x, const int32_t *pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
             int64_t rope_dim, float freq_base, float freq_scale, int32_t neox) {
    EL_DISPATCH_AVX2(el_rope_avx2(x, pos, n_tokens, n_heads, head_dim, rope_dim, freq_base, freq_scale, neox))
    el_rope_ref(x, pos, n_tokens, n_heads, head_dim, rope_dim, freq_base, freq_scale, neox);
}

void el_swiglu(const float *gate, const float *up, float *y, int64_t n) {
    EL_DISPATCH_AVX2(el_swiglu_avx2(gate, up, y, n))
    swiglu_ref(gate, up, y, n);
}

void el_kv_write(const float *k, const float *v, void *k_cache, void *v_cache, int32_t k_type, int32_t v_type,
                 const int64_t *slot_mapping, int64_t n_tokens, int64_t kv_dim) {
    if (k_type == EL_TYPE_F16 && v_type == EL_TYPE_F16) {
        EL_DISPATCH_AVX2(el_kv_write_f16_avx2(k, v, k_cache, v_cache, slot_mapping, n_tokens, kv_dim))
        kv_write_f16_ref(k, v, k_cache, v_cache, slot_mapping, n_tokens, kv_dim);
        return;
    }
    /* Row by row through the type's quantizer (its SIMD variant, bit-identical, where it has one). */
    const int64_t k_row = kv_row_bytes(k_type, kv_dim), v_row = kv_row_bytes(v_type, kv_dim);
    for (int64_t t = 0; t < n_tokens; t++) {
        const int64_t slot = slot_mapping[t];
        if (slot < 0) continue;
        el_quantize_row(k_type, k + t * kv_dim, (uint8_t *)k_cache + slot * k_row, kv_dim);
        el_quantize_row(v_type, v + t * kv_dim, (uint8_t *)v_cache + slot * v_row, kv_dim);
    }
}

void el_paged_attention(float *out, const float *q, const void *k_cache, const void *v_cache, int32_t k_type,
                        int32_t v_type, const int32_t *block_tables, const int32_t *token_seq,
                        const int32_t *context_lens, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                        int64_t block_size, int64_t max_blocks_per_seq, float scale, int32_t window,
                        const float *sinks, int64_t item_begin, int64_t item_end) {
    const el_kv_rows kr = kv_rows(k_cache, k_type), vr = kv_rows(v_cache, v_type);
    if (head_dim % 8 == 0) { /* the SIMD version holds head_dim in whole vectors */
        EL_DISPATCH_AVX2(el_paged_attention_avx2(out, q, &kr, &vr, block_tables, token_seq, context_lens, n_heads,
                                                 n_kv_heads, head_dim, block_size, max_blocks_per_seq, scale, window,
                                                 sinks, item_begin, item_end))
    }
    paged_attention_ref(out, q, &kr, &vr, block_tables, token_seq, context_lens, n_heads, n_kv_heads, head_dim,
                        block_size, max_blocks_per_seq, scale, window, sinks, item_begin, item_end);
}

/*
 * ops_avx2.c: AVX2 (+ FMA, F16C) variants of the row operations in ops.c. ops.c's entry points
 * call these once AVX2 is chosen; the file is compiled for AVX2 with a target pragma, so nothing
 * in it may run before that choice. Same arguments and contracts as edge_kernels.h; no
 * allocation, no state (buffers are on the stack, bounded by EL_MAX_HEAD_DIM).
 *
 * Every variant is bit-identical to its reference (tests/kernels_simd.rs). That matters beyond
 * the kernels: the next matmul quantizes these outputs to int8, and a last-bit difference that
 * crosses a rounding boundary moves an activation by a whole quantization step, which shows in
 * the logits (about 0.3 on the default model) and flips near-tied greedy tokens. So:
 * - float sums keep the reference's order: RMSNorm's double sum runs four rows in four lanes;
 *   attention's q.k runs eight keys in eight lanes (K transposed in 8x8 tiles), each lane adding
 *   its products in the reference's order over head_dim;
 * - exp is the reference's expf (libm), called per element; attention's online softmax is the
 *   reference's, key by key;
 * - no FMA where the reference multiplies then adds;
 * - kv_write converts with F16C (round to nearest even, as el_fp32_to_fp16; NaNs mapped to its
 *   quiet NaN); RoPE computes each token's cos/sin once instead of once per head, with the same
 *   calls, and rotates eight lanes at a time.
 * Each (token, head) of attention is computed alone, in key order (heads that share a KV head
 * share the loads and conversions of K and V, not arithmetic), so results never depend on what
 * else is in the batch.
 */
#if defined(__x86_64__)

#include <immintrin.h>
#include <math.h>
#include <string.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

#include "el_internal.h"
#include "simd_avx2.h"
#include "simd_internal.h"

/* ---- RMSNorm ---------------------------------------------------------------------------------- */

/* Rows r0 .. r0 + R - 1 (R <= 4): each row's sum of squares in its own double lane, added in
 * element order as the reference adds them (squares of floats are exact in double, so the fused
 * multiply-add rounds once, like the reference's add). */
static void rms_rows(const float *x, const float *w, float *y, int64_t R, int64_t n, float eps) {
    const float *row[4];
    for (int64_t r = 0; r < 4; r++) row[r] = x + (r < R ? r : 0) * n;
    __m256d sum = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) { /* a 4x4 transpose: v[k] lane r = row r, element i + k */
        __m128 v0 = _mm_loadu_ps(row[0] + i), v1 = _mm_loadu_ps(row[1] + i);
        __m128 v2 = _mm_loadu_ps(row[2] + i), v3 = _mm_loadu_ps(row[3] + i);
        _MM_TRANSPOSE4_PS(v0, v1, v2, v3);
        const __m256d d0 = _mm256_cvtps_pd(v0), d1 = _mm256_cvtps_pd(v1);
        const __m256d d2 = _mm256_cvtps_pd(v2), d3 = _mm256_cvtps_pd(v3);
        sum = _mm256_fmadd_pd(d0, d0, sum);
        sum = _mm256_fmadd_pd(d1, d1, sum);
        sum = _mm256_fmadd_pd(d2, d2, sum);
        sum = _mm256_fmadd_pd(d3, d3, sum);
    }
    for (; i < n; i++) {
        const __m256d d = _mm256_cvtps_pd(_mm_setr_ps(row[0][i], row[1][i], row[2][i], row[3][i]));
        sum = _mm256_fmadd_pd(d, d, sum);
    }
    double sums[4];
    _mm256_storeu_pd(sums, sum);
    for (int64_t r = 0; r < R; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        const float scale = 1.0f / sqrtf((float)(sums[r] / (double)n) + eps);
        const __m256 sv = _mm256_set1_ps(scale);
        int64_t k = 0;
        for (; k + 8 <= n; k += 8) {
            _mm256_storeu_ps(yr + k, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + k), sv), _mm256_loadu_ps(w + k)));
        }
        for (; k < n; k++) yr[k] = xr[k] * scale * w[k];
    }
}

void el_rms_norm_avx2(const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps) {
    for (int64_t r = 0; r < n_rows; r += 4) {
        rms_rows(x + r * n, w, y + r * n, n_rows - r < 4 ? n_rows - r : 4, n, eps);
    }
}

/* ---- RoPE ----------------------------------------------------------------------------------- */

/* (x0, x1) -> (x0 c - x1 s, x0 s + x1 c), eight pairs: halves layout (neox). */
EL_AI void rotate_halves(float *x0p, float *x1p, const float *cs, const float *sn) {
    const __m256 x0 = _mm256_loadu_ps(x0p), x1 = _mm256_loadu_ps(x1p);
    const __m256 c = _mm256_loadu_ps(cs), s = _mm256_loadu_ps(sn);
    _mm256_storeu_ps(x0p, _mm256_sub_ps(_mm256_mul_ps(x0, c), _mm256_mul_ps(x1, s)));
    _mm256_storeu_ps(x1p, _mm256_add_ps(_mm256_mul_ps(x0, s), _mm256_mul_ps(x1, c)));
}

/* The same for four adjacent pairs (x[2i], x[2i + 1]), cos and sin given twice per pair:
 * x * c -+ swap(x) * s, even lanes subtracting, odd lanes adding. */
EL_AI void rotate_pairs(float *x, const float *cs, const float *sn) {
    const __m256 v = _mm256_loadu_ps(x);
    const __m256 a = _mm256_mul_ps(v, _mm256_loadu_ps(cs));
    const __m256 b = _mm256_mul_ps(_mm256_permute_ps(v, 0xB1), _mm256_loadu_ps(sn));
    _mm256_storeu_ps(x, _mm256_addsub_ps(a, b));
}

void el_rope_avx2(float *x, const int32_t *pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                  int64_t rope_dim, float freq_base, float freq_scale, int32_t neox) {
    if (rope_dim > EL_MAX_HEAD_DIM) { /* beyond the stack tables: the reference */
        el_rope_ref(x, pos, n_tokens, n_heads, head_dim, rope_dim, freq_base, freq_scale, neox);
        return;
    }
    const int64_t half = rope_dim / 2;
    const float theta_scale = powf(freq_base, -2.0f / (float)rope_dim);
    /* neox: cos[i], sin[i]; adjacent pairs: cos and sin each twice (lanes 2i and 2i + 1). Zero
     * padded to a multiple of 8 so the tails run the same vector code on a copy. */
    float cs[EL_MAX_HEAD_DIM + 8] __attribute__((aligned(32)));
    float sn[EL_MAX_HEAD_DIM + 8] __attribute__((aligned(32)));
    const int64_t n = neox ? half : rope_dim; /* rotated lanes per head */
    for (int64_t t = 0; t < n_tokens; t++) {
        memset(cs + n, 0, 8 * sizeof(float));
        memset(sn + n, 0, 8 * sizeof(float));
        float theta = (float)pos[t] * freq_scale; /* advanced by multiplication, as the reference */
        for (int64_t i = 0; i < half; i++) {
            const float c = cosf(theta), s = sinf(theta);
            if (neox) {
                cs[i] = c;
                sn[i] = s;
            } else {
                cs[2 * i] = cs[2 * i + 1] = c;
                sn[2 * i] = sn[2 * i + 1] = s;
            }
            theta *= theta_scale;
        }
        for (int64_t h = 0; h < n_heads; h++) {
            float *xh = x + (t * n_heads + h) * head_dim;
            int64_t i = 0;
            for (; i + 8 <= n; i += 8) {
                if (neox) rotate_halves(xh + i, xh + i + half, cs + i, sn + i);
                else rotate_pairs(xh + i, cs + i, sn + i);
            }
            if (i < n) { /* the tail, on zero-padded copies */
                float t0[8] = {0}, t1[8] = {0};
                const size_t bytes = (size_t)(n - i) * sizeof(float);
                memcpy(t0, xh + i, bytes);
                if (neox) {
                    memcpy(t1, xh + i + half, bytes);
                    rotate_halves(t0, t1, cs + i, sn + i);
                    memcpy(xh + i + half, t1, bytes);
                } else {
                    rotate_pairs(t0, cs + i, sn + i);
                }
                memcpy(xh + i, t0, bytes);
            }
        }
    }
}

/* ---- SwiGLU ----------------------------------------------------------------------------------- */

void el_swiglu_avx2(const float *gate, const float *up, float *y, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float e[8] __attribute__((aligned(32)));
        for (int k = 0; k < 8; k++) e[k] = expf(-gate[i + k]); /* the reference's expf */
        const __m256 g = _mm256_loadu_ps(gate + i);
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, _mm256_load_ps(e))), _mm256_loadu_ps(up + i)));
    }
    for (; i < n; i++) {
        const float g = gate[i];
        y[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

/* ---- KV write --------------------------------------------------------------------------------- */

void el_kv_write_avx2(const float *k, const float *v, uint16_t *k_cache, uint16_t *v_cache,
                      const int64_t *slot_mapping, int64_t n_tokens, int64_t kv_dim) {
    for (int64_t t = 0; t < n_tokens; t++) {
        const int64_t slot = slot_mapping[t];
        if (slot < 0) continue;
        uint16_t *kd = k_cache + slot * kv_dim, *vd = v_cache + slot * kv_dim;
        const float *ks = k + t * kv_dim, *vs = v + t * kv_dim;
        int64_t i = 0;
        for (; i + 8 <= kv_dim; i += 8) {
            _mm_storeu_si128((__m128i *)(kd + i), el_f32_to_f16_8(_mm256_loadu_ps(ks + i)));
            _mm_storeu_si128((__m128i *)(vd + i), el_f32_to_f16_8(_mm256_loadu_ps(vs + i)));
        }
        for (; i < kv_dim; i++) {
            kd[i] = el_fp32_to_fp16(ks[i]);
            vd[i] = el_fp32_to_fp16(vs[i]);
        }
    }
}

/* ---- Paged attention --------------------------------------------------------------------------- */

#define KEYS 8      /* keys scored together, one per lane */
#define MAX_HEADS 4 /* query heads of one KV head run together */

/* rows[k] lane j = element k of rows[j] (an 8x8 transpose). */
EL_AI void transpose8(__m256 rows[8]) {
    const __m256 t0 = _mm256_unpacklo_ps(rows[0], rows[1]), t1 = _mm256_unpackhi_ps(rows[0], rows[1]);
    const __m256 t2 = _mm256_unpacklo_ps(rows[2], rows[3]), t3 = _mm256_unpackhi_ps(rows[2], rows[3]);
    const __m256 t4 = _mm256_unpacklo_ps(rows[4], rows[5]), t5 = _mm256_unpackhi_ps(rows[4], rows[5]);
    const __m256 t6 = _mm256_unpacklo_ps(rows[6], rows[7]), t7 = _mm256_unpackhi_ps(rows[6], rows[7]);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    rows[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    rows[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    rows[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    rows[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    rows[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    rows[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    rows[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    rows[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* Scores of KEYS keys k[j] against NH query rows q[h]: s[h][j] = (sum_d q[h][d] k[j][d]) * scale,
 * each sum in the reference's order (from 0, adding the products d = 0, 1, ...). NH is a constant
 * at each call, so the sums stay in registers. */
EL_AI void score_keys(const int NH, const float *const *q, const uint16_t *const *k, int64_t head_dim, float scale,
                      float s[MAX_HEADS][KEYS]) {
    __m256 acc[MAX_HEADS];
    for (int h = 0; h < NH; h++) acc[h] = _mm256_setzero_ps();
    int64_t d0 = 0;
    for (; d0 + 8 <= head_dim; d0 += 8) {
        __m256 kt[8];
        for (int j = 0; j < KEYS; j++) kt[j] = _mm256_cvtph_ps(el_loadu_128(k[j] + d0));
        transpose8(kt); /* kt[d] lane j = k[j][d0 + d] */
        for (int d = 0; d < 8; d++) {
            for (int h = 0; h < NH; h++) {
                acc[h] = _mm256_add_ps(acc[h], _mm256_mul_ps(_mm256_broadcast_ss(q[h] + d0 + d), kt[d]));
            }
        }
    }
    for (; d0 < head_dim; d0++) { /* head_dim not a multiple of 8 */
        float kd[KEYS];
        for (int j = 0; j < KEYS; j++) kd[j] = el_fp16_to_fp32(k[j][d0]);
        const __m256 kv = _mm256_loadu_ps(kd);
        for (int h = 0; h < NH; h++) acc[h] = _mm256_add_ps(acc[h], _mm256_mul_ps(_mm256_set1_ps(q[h][d0]), kv));
    }
    for (int h = 0; h < NH; h++) _mm256_storeu_ps(s[h], _mm256_mul_ps(acc[h], _mm256_set1_ps(scale)));
}

/* acc[h] = acc[h] * c[h][j] + p[h][j] * v[j], key after key (j < n), over head_dim: the reference's
 * rescale-then-add per key, with c = 1 (exactly the identity) where the max did not grow. The
 * sums stay in registers across the keys of one chunk of head_dim. */
EL_AI void accumulate_values(const int NH, float (*acc)[EL_MAX_HEAD_DIM], const uint16_t *const *v, int n,
                             int64_t head_dim, const float c[MAX_HEADS][KEYS], const float p[MAX_HEADS][KEYS],
                             const int rescaled) {
    int64_t d = 0;
    for (; d + 8 <= head_dim; d += 8) {
        __m256 a[MAX_HEADS];
        for (int h = 0; h < NH; h++) a[h] = _mm256_load_ps(acc[h] + d);
        for (int j = 0; j < n; j++) {
            const __m256 vv = _mm256_cvtph_ps(el_loadu_128(v[j] + d));
            for (int h = 0; h < NH; h++) {
                if (rescaled) a[h] = _mm256_mul_ps(a[h], _mm256_broadcast_ss(&c[h][j]));
                a[h] = _mm256_add_ps(a[h], _mm256_mul_ps(_mm256_broadcast_ss(&p[h][j]), vv));
            }
        }
        for (int h = 0; h < NH; h++) _mm256_store_ps(acc[h] + d, a[h]);
    }
    for (; d < head_dim; d++) {
        for (int j = 0; j < n; j++) {
            const float vv = el_fp16_to_fp32(v[j][d]);
            for (int h = 0; h < NH; h++) acc[h][d] = acc[h][d] * c[h][j] + p[h][j] * vv;
        }
    }
}

void el_paged_attention_avx2(float *out, const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                             const int32_t *block_tables, const int32_t *token_seq,
                             const int32_t *context_lens, int64_t n_heads, int64_t n_kv_heads,
                             int64_t head_dim, int64_t block_size, int64_t max_blocks_per_seq, float scale,
                             int32_t window, int64_t item_begin, int64_t item_end) {
    const int64_t group = n_heads / n_kv_heads;
    const int64_t kv_dim = n_kv_heads * head_dim;
    const int64_t hd8 = head_dim & ~(int64_t)7;
    float acc[MAX_HEADS][EL_MAX_HEAD_DIM] __attribute__((aligned(32)));
    for (int64_t item = item_begin; item < item_end;) {
        /* The query heads of this token that read the same KV head, at most MAX_HEADS. */
        const int64_t t = item / n_heads, h0 = item % n_heads, kvh = h0 / group;
        int64_t nh64 = (kvh + 1) * group - h0;
        if (nh64 > item_end - item) nh64 = item_end - item;
        const int nh = (int)(nh64 < MAX_HEADS ? nh64 : MAX_HEADS);
        const float *qh[MAX_HEADS];
        float m[MAX_HEADS], l[MAX_HEADS];
        for (int h = 0; h < nh; h++) {
            qh[h] = q + (item + h) * head_dim;
            m[h] = -INFINITY;
            l[h] = 0.0f;
            memset(acc[h], 0, (size_t)head_dim * sizeof(float));
        }
        const int32_t *table = block_tables + (int64_t)token_seq[t] * max_blocks_per_seq;
        const int64_t len = context_lens[t];
        const int64_t first = (window > 0 && len > window) ? len - window : 0;
        int64_t blk = first / block_size, off = first % block_size; /* of key j0, walked without division */
        for (int64_t j0 = first; j0 < len; j0 += KEYS) {
            const int n = (int)(len - j0 < KEYS ? len - j0 : KEYS);
            const uint16_t *kj[KEYS], *vj[KEYS];
            for (int j = 0; j < n; j++) {
                const int64_t at = ((int64_t)table[blk] * block_size + off) * kv_dim + kvh * head_dim;
                kj[j] = k_cache + at;
                vj[j] = v_cache + at;
                if (++off == block_size) {
                    off = 0;
                    blk++;
                }
            }
            for (int j = n; j < KEYS; j++) { /* keys past the end repeat the first (scored, unused) */
                kj[j] = kj[0];
                vj[j] = vj[0];
            }
            float s[MAX_HEADS][KEYS], c[MAX_HEADS][KEYS], p[MAX_HEADS][KEYS];
            switch (nh) {
            case 1: score_keys(1, qh, kj, head_dim, scale, s); break;
            case 2: score_keys(2, qh, kj, head_dim, scale, s); break;
            case 3: score_keys(3, qh, kj, head_dim, scale, s); break;
            default: score_keys(4, qh, kj, head_dim, scale, s); break;
            }
            /* The reference's online softmax, key by key: when the running max grows, what was
             * accumulated is rescaled by c = expf(m_old - m_new) (c = 1 otherwise), then p added. */
            int rescaled = 0;
            for (int h = 0; h < nh; h++) {
                for (int j = 0; j < n; j++) {
                    c[h][j] = 1.0f;
                    if (s[h][j] > m[h]) {
                        rescaled = 1;
                        c[h][j] = expf(m[h] - s[h][j]);
                        l[h] *= c[h][j];
                        m[h] = s[h][j];
                    }
                    p[h][j] = expf(s[h][j] - m[h]);
                    l[h] += p[h][j];
                }
            }
            /* Most chunks raise no head's max: then c = 1 and the multiply is skipped. */
            switch (nh * 2 + rescaled) {
            case 2: accumulate_values(1, acc, vj, n, head_dim, c, p, 0); break;
            case 3: accumulate_values(1, acc, vj, n, head_dim, c, p, 1); break;
            case 4: accumulate_values(2, acc, vj, n, head_dim, c, p, 0); break;
            case 5: accumulate_values(2, acc, vj, n, head_dim, c, p, 1); break;
            case 6: accumulate_values(3, acc, vj, n, head_dim, c, p, 0); break;
            case 7: accumulate_values(3, acc, vj, n, head_dim, c, p, 1); break;
            case 8: accumulate_values(4, acc, vj, n, head_dim, c, p, 0); break;
            default: accumulate_values(4, acc, vj, n, head_dim, c, p, 1); break;
            }
        }
        for (int h = 0; h < nh; h++) {
            float *oh = out + (item + h) * head_dim;
            const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
            const __m256 iv = _mm256_set1_ps(inv);
            int64_t d = 0;
            for (; d < hd8; d += 8) _mm256_storeu_ps(oh + d, _mm256_mul_ps(_mm256_load_ps(acc[h] + d), iv));
            for (; d < head_dim; d++) oh[d] = acc[h][d] * inv;
        }
        item += nh;
    }
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif /* __x86_64__ */

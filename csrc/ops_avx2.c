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
 * - float sums keep the reference's order: RMSNorm's double sum runs a row per lane, up to 16 rows;
 *   attention's reference is itself written for eight lanes (el_internal.h: q.k in eight partial
 *   sums added by a fixed tree, one softmax step per chunk of eight keys, its own exp, fmaf where
 *   it multiplies and adds), so its vector form here has the same bits;
 * - SwiGLU's exp is glibc's expf computed eight lanes at a time with the same double operations
 *   (expf_avx2.h), so it equals the reference's libm expf bit for bit;
 * - no FMA where the reference multiplies then adds (attention's reference uses fmaf throughout);
 * - kv_write converts with F16C (round to nearest even, as el_fp32_to_fp16; NaNs mapped to its
 *   quiet NaN); RoPE computes each token's cos/sin once instead of once per head, with the same
 *   calls, and rotates eight lanes at a time.
 * Each (token, head) of attention is computed alone, in key order, so results never depend on
 * what else is in the batch (queries that share keys share only the keys' conversion from f16).
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
#include "expf_avx2.h"
#include "simd_internal.h"

/* ---- RMSNorm ---------------------------------------------------------------------------------- */

/* sums[r] = the sum of squares of row[r], r < 4 G, each in its own double lane, added in
 * element order as the reference adds them (squares of floats are exact in double, so the fused
 * multiply-add rounds once, like the reference's add). Four rows share a vector; the G vectors'
 * chains of dependent adds are independent, so they run at once (a chain alone waits an add's
 * latency per element). */
EL_AI void rms_sums(const float *const *row, const int64_t G, int64_t n, double *sums) {
    __m256d sum[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        for (int64_t g = 0; g < G; g++) { /* a 4x4 transpose: v[k] lane r = row 4g + r, element i + k */
            const float *const *rg = row + 4 * g;
            __m128 v0 = _mm_loadu_ps(rg[0] + i), v1 = _mm_loadu_ps(rg[1] + i);
            __m128 v2 = _mm_loadu_ps(rg[2] + i), v3 = _mm_loadu_ps(rg[3] + i);
            _MM_TRANSPOSE4_PS(v0, v1, v2, v3);
            const __m256d d0 = _mm256_cvtps_pd(v0), d1 = _mm256_cvtps_pd(v1);
            const __m256d d2 = _mm256_cvtps_pd(v2), d3 = _mm256_cvtps_pd(v3);
            sum[g] = _mm256_fmadd_pd(d0, d0, sum[g]);
            sum[g] = _mm256_fmadd_pd(d1, d1, sum[g]);
            sum[g] = _mm256_fmadd_pd(d2, d2, sum[g]);
            sum[g] = _mm256_fmadd_pd(d3, d3, sum[g]);
        }
    }
    for (; i < n; i++) {
        for (int64_t g = 0; g < G; g++) {
            const float *const *rg = row + 4 * g;
            const __m256d d = _mm256_cvtps_pd(_mm_setr_ps(rg[0][i], rg[1][i], rg[2][i], rg[3][i]));
            sum[g] = _mm256_fmadd_pd(d, d, sum[g]);
        }
    }
    for (int64_t g = 0; g < G; g++) _mm256_storeu_pd(sums + 4 * g, sum[g]);
}

/* Rows 0 .. R - 1 (R <= 16) of x normalised into y. */
static void rms_rows(const float *x, const float *w, float *y, int64_t R, int64_t n, float eps) {
    const float *row[16];
    for (int64_t r = 0; r < 16; r++) row[r] = x + (r < R ? r : 0) * n;
    double sums[16];
    switch ((R + 3) / 4) { /* vectors of four rows, a constant in each inlined copy */
    case 1: rms_sums(row, 1, n, sums); break;
    case 2: rms_sums(row, 2, n, sums); break;
    case 3: rms_sums(row, 3, n, sums); break;
    default: rms_sums(row, 4, n, sums); break;
    }
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
    for (int64_t r = 0; r < n_rows; r += 16) {
        rms_rows(x + r * n, w, y + r * n, n_rows - r < 16 ? n_rows - r : 16, n, eps);
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
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 e = el_expf8_avx2(_mm256_xor_ps(g, _mm256_set1_ps(-0.0f))); /* expf(-g) */
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
    }
    for (; i < n; i++) {
        const float g = gate[i];
        y[i] = g / (1.0f + el_expf_glibc(-g)) * up[i];
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

#define CHUNK EL_ATTN_CHUNK /* keys scored together, one per lane */

/* exp(x) for x <= 0, lane by lane exactly ops.c's exp_nonpos (el_internal.h). */
EL_AI __m256 exp_nonpos8(const __m256 x) {
    const __m256 valid = _mm256_cmp_ps(x, _mm256_set1_ps(EL_EXP_MIN), _CMP_GE_OQ);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EL_EXP_LOG2E)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-EL_EXP_C1), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-EL_EXP_C2), r);
    __m256 y = _mm256_set1_ps(EL_EXP_P0);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(EL_EXP_P1));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(EL_EXP_P2));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(EL_EXP_P3));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(EL_EXP_P4));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(EL_EXP_P5));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(valid, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

/* Lane k = el_tree8 of the lanes of p[k]: two hadds, then the halves added. */
EL_AI __m256 tree8_lanes(const __m256 p[8]) {
    const __m256 ab = _mm256_hadd_ps(p[0], p[1]), cd = _mm256_hadd_ps(p[2], p[3]);
    const __m256 ef = _mm256_hadd_ps(p[4], p[5]), gh = _mm256_hadd_ps(p[6], p[7]);
    const __m256 abcd = _mm256_hadd_ps(ab, cd), efgh = _mm256_hadd_ps(ef, gh);
    return _mm256_add_ps(_mm256_permute2f128_ps(abcd, efgh, 0x20), _mm256_permute2f128_ps(abcd, efgh, 0x31));
}

EL_AI float hmax8(const __m256 x) {
    __m256 m = _mm256_max_ps(x, _mm256_permute2f128_ps(x, x, 1));
    m = _mm256_max_ps(m, _mm256_permute_ps(m, 0x4E));
    m = _mm256_max_ps(m, _mm256_permute_ps(m, 0xB1));
    return _mm256_cvtss_f32(m);
}

/* Queries that share one pass over their keys: the heads of one GQA group, over consecutive
 * tokens of one sequence, at most ATTN_MAX_Q and at most ATTN_ACC_FLOATS / head_dim (their
 * outputs are accumulated on the stack). In a long context the keys' conversion from f16 (a
 * strided read of a KV head's rows, mostly from L3 or memory) costs as much as several queries'
 * arithmetic, so the more queries share it the better: 64 of them at head size 64 spend about
 * 25% less time than 16 did (4,000 keys). */
#define ATTN_MAX_Q 64
#define ATTN_ACC_FLOATS (16 * EL_MAX_HEAD_DIM)

typedef struct {
    const float *q;
    float *out;
    int64_t len; /* keys this query sees: [first, len) */
} attn_query;

/* Keys converted and scored per pass: 2048 floats of keys (and as many of values) per span. */
#define ATTN_SPAN_FLOATS (2048 > CHUNK * EL_MAX_HEAD_DIM ? 2048 : CHUNK * EL_MAX_HEAD_DIM)
#define ATTN_MAX_CHUNKS 8 /* at most 64 keys per span: the per-chunk state stays small */

/* Up to ATTN_MAX_Q queries of one sequence and KV head that start at the same key, each computed
 * exactly as ops.c's paged_attention_ref computes its (token, head) item: a chunk's eight keys in
 * eight lanes, the scores' partial sums (lane d % 8 of each key's vector) by FMA in order of d,
 * the chunk's max, one vector exp, the values added key after key by FMA.
 * The keys go a span of chunks at a time (2048 / HD keys, at least one chunk), converted from f16
 * once for all the queries, then three passes over the queries and the span's chunks: every score
 * (no chunk's scores depend on another's), then each query's softmax steps in order (the running
 * max, the rescale factor where it rose, the weights), then the values, each chunk's rescale of
 * the output applied just before its values, as the reference does. One query's chunk is a chain
 * of dependent steps; the passes give the core many independent ones at a time. HD: head_dim, a
 * multiple of 8 (a constant for the common sizes). */
EL_AI void attend_group(const int64_t HD, const attn_query *qs, const int nq, const uint16_t *k_cache,
                        const uint16_t *v_cache, const int32_t *table, const int64_t block_size, const int64_t kv_off,
                        const int64_t kv_dim, const int64_t first, const float scale) {
    float acc_all[ATTN_ACC_FLOATS] __attribute__((aligned(32))); /* query i's output: acc_all + i * HD */
    float kf[ATTN_SPAN_FLOATS] __attribute__((aligned(32)));
    float vf[ATTN_SPAN_FLOATS] __attribute__((aligned(32)));
    __m256 sc[ATTN_MAX_Q][ATTN_MAX_CHUNKS];    /* scores, then weights */
    __m256 resc[ATTN_MAX_Q][ATTN_MAX_CHUNKS];  /* the output's rescale before each chunk */
    uint8_t rescale[ATTN_MAX_Q][ATTN_MAX_CHUNKS];
    float m[ATTN_MAX_Q];
    __m256 lanes[ATTN_MAX_Q];
    const int64_t span_chunks = ATTN_SPAN_FLOATS / (CHUNK * HD) < ATTN_MAX_CHUNKS ? ATTN_SPAN_FLOATS / (CHUNK * HD)
                                                                                 : ATTN_MAX_CHUNKS;
    int64_t max_len = 0;
    for (int i = 0; i < nq; i++) {
        for (int64_t d = 0; d < HD; d += 8) _mm256_store_ps(acc_all + i * HD + d, _mm256_setzero_ps());
        m[i] = -INFINITY;
        lanes[i] = _mm256_setzero_ps();
        if (qs[i].len > max_len) max_len = qs[i].len;
    }
    const __m256 vscale = _mm256_set1_ps(scale);
    int64_t blk = first / block_size, off = first % block_size; /* of key j0, walked without division */
    for (int64_t j0 = first; j0 < max_len; j0 += span_chunks * CHUNK) {
        const int64_t n_all = max_len - j0 < span_chunks * CHUNK ? max_len - j0 : span_chunks * CHUNK;
        for (int64_t k = 0; k < n_all; k++) {
            const int64_t at = ((int64_t)table[blk] * block_size + off) * kv_dim + kv_off;
            for (int64_t d = 0; d < HD; d += 8) {
                _mm256_store_ps(kf + k * HD + d, _mm256_cvtph_ps(el_loadu_128(k_cache + at + d)));
                _mm256_store_ps(vf + k * HD + d, _mm256_cvtph_ps(el_loadu_128(v_cache + at + d)));
            }
            if (++off == block_size) {
                off = 0;
                blk++;
            }
        }
        for (int64_t k = n_all; k % CHUNK != 0; k++) { /* scored, then masked out */
            for (int64_t d = 0; d < HD; d += 8) _mm256_store_ps(kf + k * HD + d, _mm256_load_ps(kf + d));
        }
        /* Keys of query i in this span: [j0, j0 + n_i); its chunks: ceil(n_i / CHUNK). */
#define SPAN_KEYS(i) (qs[i].len - j0 < n_all ? qs[i].len - j0 : n_all)
        for (int i = 0; i < nq; i++) {
            const int64_t n_i = SPAN_KEYS(i);
            for (int64_t c = 0; c * CHUNK < n_i; c++) {
                const float *kc = kf + c * CHUNK * HD;
                __m256 part[CHUNK];
                for (int k = 0; k < CHUNK; k++) part[k] = _mm256_setzero_ps();
                for (int64_t d = 0; d < HD; d += 8) {
                    const __m256 qv = _mm256_loadu_ps(qs[i].q + d);
                    for (int k = 0; k < CHUNK; k++) part[k] = _mm256_fmadd_ps(qv, _mm256_load_ps(kc + k * HD + d), part[k]);
                }
                __m256 s = _mm256_mul_ps(tree8_lanes(part), vscale);
                const int64_t n = n_i - c * CHUNK;
                if (n < CHUNK) {
                    const __m256 on = _mm256_castsi256_ps(
                        _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
                    s = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), s, on);
                }
                sc[i][c] = s;
            }
        }
        for (int i = 0; i < nq; i++) {
            const int64_t n_i = SPAN_KEYS(i);
            for (int64_t c = 0; c * CHUNK < n_i; c++) {
                const float m_c = hmax8(sc[i][c]);
                rescale[i][c] = m_c > m[i];
                if (m_c > m[i]) {
                    resc[i][c] = _mm256_permute_ps(exp_nonpos8(_mm256_set1_ps(m[i] - m_c)), 0); /* lane 0 everywhere */
                    lanes[i] = _mm256_mul_ps(lanes[i], resc[i][c]);
                    m[i] = m_c;
                }
                sc[i][c] = exp_nonpos8(_mm256_sub_ps(sc[i][c], _mm256_set1_ps(m[i]))); /* 0 in masked lanes */
                lanes[i] = _mm256_add_ps(lanes[i], sc[i][c]);
            }
        }
        for (int i = 0; i < nq; i++) {
            const int64_t n_i = SPAN_KEYS(i);
            float *a_i = acc_all + i * HD;
            for (int64_t c = 0; c * CHUNK < n_i; c++) {
                const float *vc = vf + c * CHUNK * HD;
                const int64_t n = n_i - c * CHUNK;
                float pk[CHUNK] __attribute__((aligned(32)));
                _mm256_store_ps(pk, sc[i][c]);
                if (rescale[i][c]) {
                    for (int64_t d = 0; d < HD; d += 8) _mm256_store_ps(a_i + d, _mm256_mul_ps(_mm256_load_ps(a_i + d), resc[i][c]));
                }
                if (n >= CHUNK) { /* a whole chunk: the key loop unrolled */
                    __m256 pb[CHUNK];
                    for (int k = 0; k < CHUNK; k++) pb[k] = _mm256_set1_ps(pk[k]);
                    for (int64_t d = 0; d < HD; d += 8) {
                        __m256 a = _mm256_load_ps(a_i + d);
                        for (int k = 0; k < CHUNK; k++) a = _mm256_fmadd_ps(pb[k], _mm256_load_ps(vc + k * HD + d), a);
                        _mm256_store_ps(a_i + d, a);
                    }
                } else {
                    for (int64_t d = 0; d < HD; d += 8) {
                        __m256 a = _mm256_load_ps(a_i + d);
                        for (int k = 0; k < n; k++) a = _mm256_fmadd_ps(_mm256_set1_ps(pk[k]), _mm256_load_ps(vc + k * HD + d), a);
                        _mm256_store_ps(a_i + d, a);
                    }
                }
            }
        }
#undef SPAN_KEYS
    }
    for (int i = 0; i < nq; i++) {
        float lane[CHUNK];
        _mm256_storeu_ps(lane, lanes[i]);
        const float l = el_tree8(lane);
        const __m256 inv = _mm256_set1_ps(l > 0.0f ? 1.0f / l : 0.0f);
        for (int64_t d = 0; d < HD; d += 8) _mm256_storeu_ps(qs[i].out + d, _mm256_mul_ps(_mm256_load_ps(acc_all + i * HD + d), inv));
    }
}

/* Items [item_begin, item_end) (token-major, then head), in groups for attend_group: for a run of
 * consecutive tokens of one sequence whose windows start at the same key (at most
 * max_q / group tokens), each KV head's query heads in the range. */
void el_paged_attention_avx2(float *out, const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                             const int32_t *block_tables, const int32_t *token_seq,
                             const int32_t *context_lens, int64_t n_heads, int64_t n_kv_heads,
                             int64_t head_dim, int64_t block_size, int64_t max_blocks_per_seq, float scale,
                             int32_t window, int64_t item_begin, int64_t item_end) {
    if (item_end <= item_begin) return;
    const int64_t group = n_heads / n_kv_heads;
    const int64_t kv_dim = n_kv_heads * head_dim;
    const int64_t max_q = ATTN_ACC_FLOATS / head_dim < ATTN_MAX_Q ? ATTN_ACC_FLOATS / head_dim : ATTN_MAX_Q;
    const int64_t max_tokens = group >= max_q ? 1 : max_q / group;
    const int64_t t_end = (item_end - 1) / n_heads + 1;
#define FIRST(t) ((window > 0 && context_lens[t] > window) ? context_lens[t] - window : 0)
    for (int64_t t0 = item_begin / n_heads, t1; t0 < t_end; t0 = t1) {
        const int64_t first = FIRST(t0);
        for (t1 = t0 + 1; t1 < t_end && t1 - t0 < max_tokens && token_seq[t1] == token_seq[t0] && FIRST(t1) == first; t1++) {
        }
        const int32_t *table = block_tables + (int64_t)token_seq[t0] * max_blocks_per_seq;
        for (int64_t kvh = 0; kvh < n_kv_heads; kvh++) {
            attn_query qs[ATTN_MAX_Q];
            int nq = 0;
            for (int64_t h = kvh * group; h < (kvh + 1) * group; h++) {
                for (int64_t t = t0; t < t1; t++) {
                    const int64_t item = t * n_heads + h;
                    if (item < item_begin || item >= item_end) continue;
                    if (nq == max_q) { /* a group wider than max_q heads: in parts */
                        attend_group(head_dim, qs, nq, k_cache, v_cache, table, block_size, kvh * head_dim, kv_dim, first,
                                     scale);
                        nq = 0;
                    }
                    qs[nq++] = (attn_query){q + item * head_dim, out + item * head_dim, context_lens[t]};
                }
            }
            if (nq == 0) continue;
            const int64_t kv_off = kvh * head_dim;
            switch (head_dim) {
            case 64: attend_group(64, qs, nq, k_cache, v_cache, table, block_size, kv_off, kv_dim, first, scale); break;
            case 128: attend_group(128, qs, nq, k_cache, v_cache, table, block_size, kv_off, kv_dim, first, scale); break;
            case 256: attend_group(256, qs, nq, k_cache, v_cache, table, block_size, kv_off, kv_dim, first, scale); break;
            default: attend_group(head_dim, qs, nq, k_cache, v_cache, table, block_size, kv_off, kv_dim, first, scale); break;
            }
        }
    }
#undef FIRST
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif /* __x86_64__ */

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
 * - kv_write to an f16 cache converts with F16C (round to nearest even, as el_fp32_to_fp16; NaNs
 *   mapped to its quiet NaN; the other KV types go through their quantizers in ops.c); attention
 *   converts each key and value to f32 exactly as the reference does (head_to_f32); RoPE computes each token's cos/sin once instead of once per head, with the same
 *   calls, and rotates eight lanes at a time.
 * Each (token, head) of attention is computed alone, in key order, so results never depend on
 * what else is in the batch (queries that share keys share only the keys' conversion to f32).
 */
#if defined(__x86_64__)

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "avx2_target_begin.h"

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

void el_kv_write_f16_avx2(const float *k, const float *v, uint16_t *k_cache, uint16_t *v_cache,
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
 * tokens of one sequence or over tokens of several sequences whose block tables point at the same
 * physical blocks (a shared prefix), at most ATTN_MAX_Q and at most ATTN_ACC_FLOATS / head_dim
 * (their outputs are accumulated on the stack). In a long context the keys' conversion from f16
 * (a strided read of a KV head's rows, mostly from L3 or memory) costs as much as several
 * queries' arithmetic, so the more queries share it the better: 64 of them at head size 64 spend
 * about 25% less time than 16 did (4,000 keys). */
#define ATTN_MAX_Q 64
#define ATTN_ACC_FLOATS (16 * EL_MAX_HEAD_DIM)

typedef struct {
    const float *q;
    float *out;
    int64_t len; /* keys this query sees: [first, len) */
    const float *sink; /* its head's sink logit, or NULL */
} attn_query;

/* Each query's online softmax between passes: its output accumulator, running max and the
 * normaliser's eight lanes. A query's keys may be split into several passes (a shared prefix,
 * then its own tail) at a chunk boundary; the state carries its arithmetic on unchanged. */
typedef struct {
    float acc[ATTN_ACC_FLOATS] __attribute__((aligned(32))); /* query i's output: acc + i * HD */
    float m[ATTN_MAX_Q];
    __m256 lanes[ATTN_MAX_Q];
} attn_state;

EL_AI void attn_begin(const int64_t HD, attn_state *st, const int nq) {
    for (int i = 0; i < nq; i++) {
        for (int64_t d = 0; d < HD; d += 8) _mm256_store_ps(st->acc + i * HD + d, _mm256_setzero_ps());
        st->m[i] = -INFINITY;
        st->lanes[i] = _mm256_setzero_ps();
    }
}

EL_AI void attn_finish(const int64_t HD, const attn_state *st, const attn_query *qs, const int nq) {
    for (int i = 0; i < nq; i++) {
        float lane[CHUNK];
        _mm256_storeu_ps(lane, st->lanes[i]);
        const float l = el_tree8(lane);
        const __m256 inv = _mm256_set1_ps(el_attn_out_scale(st->m[i], l, qs[i].sink));
        for (int64_t d = 0; d < HD; d += 8) _mm256_storeu_ps(qs[i].out + d, _mm256_mul_ps(_mm256_load_ps(st->acc + i * HD + d), inv));
    }
}

/* Keys converted and scored per pass: 2048 floats of keys (and as many of values) per span. */
#define ATTN_SPAN_FLOATS (2048 > CHUNK * EL_MAX_HEAD_DIM ? 2048 : CHUNK * EL_MAX_HEAD_DIM)
#define ATTN_MAX_CHUNKS 8 /* at most 64 keys per span: the per-chunk state stays small (a byte of flags) */

/* One query's scores of a chunk of eight keys (kc: CHUNK keys of HD floats): lane k is q.k's
 * eight partial sums (lane d % 8 of the vectors, FMA in order of d) added by el_tree8, times
 * scale. */
EL_AI __m256 score_chunk(const int64_t HD, const float *q, const float *kc, const __m256 vscale) {
    __m256 part[CHUNK];
    for (int k = 0; k < CHUNK; k++) part[k] = _mm256_setzero_ps();
    for (int64_t d = 0; d < HD; d += 8) {
        const __m256 qv = _mm256_loadu_ps(q + d);
        for (int k = 0; k < CHUNK; k++) part[k] = _mm256_fmadd_ps(qv, _mm256_load_ps(kc + k * HD + d), part[k]);
    }
    return _mm256_mul_ps(tree8_lanes(part), vscale);
}

/* The scores of a chunk that holds only n < CHUNK of the query's keys: -inf past them. */
EL_AI __m256 mask_keys(const __m256 s, const int64_t n) {
    if (n >= CHUNK) return s;
    const __m256 on =
        _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
    return _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), s, on);
}

/* Keys [k0, k1) of a span (weights w, values v: HD floats a key) added to nv vectors of one
 * query's output (a: at the same place in the head as v), key after key by FMA; at each chunk's
 * first key, if bit c of `resc` is set, the output times f[c] first (the reference's rescale; 1.0
 * where that query's max did not rise, which leaves it unchanged). */
EL_AI void values1(const int64_t HD, const int nv, float *a, const float *w, const float *f, const unsigned resc,
                   const float *v, const int64_t k0, const int64_t k1) {
    __m256 x[4];
    for (int j = 0; j < nv; j++) x[j] = _mm256_load_ps(a + 8 * j);
    for (int64_t k = k0; k < k1; k++) {
        if (k % CHUNK == 0 && (resc >> (k / CHUNK) & 1)) {
            const __m256 fx = _mm256_set1_ps(f[k / CHUNK]);
            for (int j = 0; j < nv; j++) x[j] = _mm256_mul_ps(x[j], fx);
        }
        const __m256 bx = _mm256_set1_ps(w[k]);
        for (int j = 0; j < nv; j++) x[j] = _mm256_fmadd_ps(bx, _mm256_load_ps(v + k * HD + 8 * j), x[j]);
    }
    for (int j = 0; j < nv; j++) _mm256_store_ps(a + 8 * j, x[j]);
}

/* values1 for three queries over keys [0, n) of all three: each value vector loaded feeds the
 * three queries' FMAs, and the twelve accumulators (more chains than the FMA's latency times its
 * throughput: eight would just cover it) stay in registers over the span. */
EL_AI void values3(const int64_t HD, const int nv, float *a0, float *a1, float *a2, const float *w0, const float *w1,
                   const float *w2, const float *f0, const float *f1, const float *f2, const unsigned resc,
                   const float *v, const int64_t n) {
    __m256 x[4], y[4], z[4];
    for (int j = 0; j < nv; j++) {
        x[j] = _mm256_load_ps(a0 + 8 * j);
        y[j] = _mm256_load_ps(a1 + 8 * j);
        z[j] = _mm256_load_ps(a2 + 8 * j);
    }
    for (int64_t c = 0; c * CHUNK < n; c++) {
        if (resc >> c & 1) {
            const __m256 fx = _mm256_set1_ps(f0[c]), fy = _mm256_set1_ps(f1[c]), fz = _mm256_set1_ps(f2[c]);
            for (int j = 0; j < nv; j++) {
                x[j] = _mm256_mul_ps(x[j], fx);
                y[j] = _mm256_mul_ps(y[j], fy);
                z[j] = _mm256_mul_ps(z[j], fz);
            }
        }
        const int64_t k1 = n < (c + 1) * CHUNK ? n : (c + 1) * CHUNK;
        for (int64_t k = c * CHUNK; k < k1; k++) {
            const __m256 bx = _mm256_set1_ps(w0[k]), by = _mm256_set1_ps(w1[k]), bz = _mm256_set1_ps(w2[k]);
            for (int j = 0; j < nv; j++) {
                __m256 vv = _mm256_load_ps(v + k * HD + 8 * j);
                __asm__("" : "+x"(vv)); /* in a register for the three FMAs, not loaded again by each */
                x[j] = _mm256_fmadd_ps(bx, vv, x[j]);
                y[j] = _mm256_fmadd_ps(by, vv, y[j]);
                z[j] = _mm256_fmadd_ps(bz, vv, z[j]);
            }
        }
    }
    for (int j = 0; j < nv; j++) {
        _mm256_store_ps(a0 + 8 * j, x[j]);
        _mm256_store_ps(a1 + 8 * j, y[j]);
        _mm256_store_ps(a2 + 8 * j, z[j]);
    }
}

/* One head row (HD elements from element e) of a KV cache as f32, exactly as el_kv_rows_to_f32
 * converts it: F16 by F16C, Q8_0 and Q4_0 as their exact products d * q eight lanes at a time,
 * the other types by the reference itself. */
EL_AI void head_to_f32(const int64_t HD, const el_kv_rows *r, const int64_t e, float *dst) {
    const uint8_t *p = r->base + (e >> r->elems_log2) * r->block_bytes;
    if (r->type == EL_TYPE_F16) {
        for (int64_t d = 0; d < HD; d += 8) _mm256_store_ps(dst + d, _mm256_cvtph_ps(el_loadu_128(p + 2 * d)));
    } else if (r->type == EL_TYPE_Q8_0) {
        for (int64_t b = 0; b < HD / EL_QK; b++, p += EL_Q8_0_BYTES, dst += EL_QK) {
            uint16_t dh;
            memcpy(&dh, p, 2);
            const __m256 d = _mm256_set1_ps(el_fp16_to_fp32(dh));
            for (int i = 0; i < 4; i++) {
                const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 2 + 8 * i)));
                _mm256_store_ps(dst + 8 * i, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
            }
        }
    } else if (r->type == EL_TYPE_Q4_0) {
        const __m128i low4 = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
        for (int64_t b = 0; b < HD / EL_QK; b++, p += EL_Q4_0_BYTES, dst += EL_QK) {
            uint16_t dh;
            memcpy(&dh, p, 2);
            const __m256 d = _mm256_set1_ps(el_fp16_to_fp32(dh));
            const __m128i qs = _mm_loadu_si128((const __m128i *)(p + 2));
            /* elements 0..15 in the low nibbles, 16..31 in the high ones, each minus 8 */
            const __m128i lo = _mm_sub_epi8(_mm_and_si128(qs, low4), eight);
            const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(qs, 4), low4), eight);
            const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
            for (int i = 0; i < 4; i++) {
                _mm256_store_ps(dst + 8 * i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[i])), d));
            }
        }
    } else {
        el_kv_rows_to_f32(r, e, dst, HD);
    }
}

/* The cache lines of one head row (HD elements from element e), into L1 ahead of its use. */
EL_AI void prefetch_head(const el_kv_rows *r, const int64_t e, const int64_t HD) {
    const uint8_t *p = r->base + (e >> r->elems_log2) * r->block_bytes;
    const int64_t bytes = (HD >> r->elems_log2) * r->block_bytes;
    for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch((const char *)(p + b), _MM_HINT_T0);
}

/* Keys [begin, min(end, len_i)) of up to ATTN_MAX_Q queries of one KV head that read them
 * through `table`, with state slots st0 .. st0 + nq - 1; begin lies on a chunk boundary of every
 * query's window (its first key plus a multiple of CHUNK). Each query is computed exactly as
 * ops.c's paged_attention_ref computes its (token, head) item: a chunk's eight keys in eight
 * lanes, the scores' partial sums (lane d % 8 of each key's vector) by FMA in order of d, the
 * chunk's max, one vector exp, the values added key after key by FMA.
 * The keys go a span of chunks at a time (2048 / HD keys, at least one chunk), converted from f16
 * once for all the queries (as each key is converted, its lines in the next block are prefetched:
 * a sequence's blocks lie anywhere in the pool, so the prefetchers cannot follow them alone), then
 * three passes over the queries and the span's chunks: every score
 * (no chunk's scores depend on another's); then each query's softmax steps
 * in order (the running max chunk after chunk, the rescale factors of the chunks where it rose,
 * all in one vector exp, the weights); then the values, three queries at a time, a quarter of the
 * head (four vectors each) held in registers over the whole span, each chunk's rescale of the
 * output applied just before its values, as the reference does. One query's chunk is a chain of
 * dependent steps; the passes give the core many independent ones at a time. HD: head_dim, a
 * multiple of 8 (a constant for the common sizes). */
EL_AI void attend_keys(const int64_t HD, const attn_query *qs, const int nq, attn_state *st, const int st0,
                       const el_kv_rows *k_cache, const el_kv_rows *v_cache, const int32_t *table, const int64_t block_size,
                       const int64_t kv_off, const int64_t kv_dim, const int64_t begin, const int64_t end,
                       const float scale) {
    float kf[ATTN_SPAN_FLOATS] __attribute__((aligned(32)));
    float vf[ATTN_SPAN_FLOATS] __attribute__((aligned(32)));
    __m256 sc[ATTN_MAX_Q][ATTN_MAX_CHUNKS];                       /* scores, then weights */
    float fac[ATTN_MAX_Q][ATTN_MAX_CHUNKS] __attribute__((aligned(32))); /* the output's rescale before each chunk */
    unsigned resc[ATTN_MAX_Q];                                      /* bit c: chunk c rescales */
    float *const m = st->m + st0;
    __m256 *const lanes = st->lanes + st0;
    const int64_t span_chunks = ATTN_SPAN_FLOATS / (CHUNK * HD) < ATTN_MAX_CHUNKS ? ATTN_SPAN_FLOATS / (CHUNK * HD)
                                                                                 : ATTN_MAX_CHUNKS;
    int64_t max_len = 0;
    for (int i = 0; i < nq; i++) {
        if (qs[i].len > max_len) max_len = qs[i].len;
    }
    if (max_len > end) max_len = end;
    const __m256 vscale = _mm256_set1_ps(scale);
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    int64_t blk = begin / block_size, off = begin % block_size; /* of key j0, walked without division */
    for (int64_t j0 = begin; j0 < max_len; j0 += span_chunks * CHUNK) {
        const int64_t n_all = max_len - j0 < span_chunks * CHUNK ? max_len - j0 : span_chunks * CHUNK;
        for (int64_t k = 0; k < n_all; k++) {
            const int64_t at = ((int64_t)table[blk] * block_size + off) * kv_dim + kv_off;
            if (j0 + k + block_size < max_len) { /* the same key of the next block, ahead of time */
                const int64_t ahead = ((int64_t)table[blk + 1] * block_size + off) * kv_dim + kv_off;
                prefetch_head(k_cache, ahead, HD);
                prefetch_head(v_cache, ahead, HD);
            }
            head_to_f32(HD, k_cache, at, kf + k * HD);
            head_to_f32(HD, v_cache, at, vf + k * HD);
            if (++off == block_size) {
                off = 0;
                blk++;
            }
        }
        for (int64_t k = n_all; k % CHUNK != 0; k++) { /* scored, then masked out */
            for (int64_t d = 0; d < HD; d += 8) _mm256_store_ps(kf + k * HD + d, _mm256_load_ps(kf + d));
        }
        /* Keys of query i in this span: [j0, j0 + n_i), none where n_i <= 0. */
#define SPAN_KEYS(i) ((i) >= nq || qs[i].len <= j0 ? 0 : qs[i].len - j0 < n_all ? qs[i].len - j0 : n_all)
        for (int i = 0; i < nq; i++) {
            const int64_t n_i = SPAN_KEYS(i);
            for (int64_t c = 0; c * CHUNK < n_i; c++) {
                sc[i][c] = mask_keys(score_chunk(HD, qs[i].q, kf + c * CHUNK * HD, vscale), n_i - c * CHUNK);
            }
        }
        for (int i = 0; i < nq; i++) {
            const int64_t n_i = SPAN_KEYS(i);
            float before[CHUNK] __attribute__((aligned(32))) = {0}, after[CHUNK] __attribute__((aligned(32))) = {0};
            unsigned rose = 0;
            float mi = m[i];
            for (int64_t c = 0; c * CHUNK < n_i; c++) {
                const float m_c = hmax8(sc[i][c]);
                before[c] = mi;
                if (m_c > mi) {
                    mi = m_c;
                    rose |= 1u << c;
                }
                after[c] = mi;
            }
            m[i] = mi;
            __m256 f = _mm256_set1_ps(1.0f);
            if (rose) { /* exp(m - m_c) in each chunk where the max rose, 1 elsewhere */
                const __m256 on = _mm256_castsi256_ps(
                    _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)rose), bit), bit));
                f = _mm256_blendv_ps(f, exp_nonpos8(_mm256_sub_ps(_mm256_load_ps(before), _mm256_load_ps(after))), on);
            }
            _mm256_store_ps(fac[i], f);
            resc[i] = rose;
            __m256 l = lanes[i];
            for (int64_t c = 0; c * CHUNK < n_i; c++) {
                if (rose >> c & 1) l = _mm256_mul_ps(l, _mm256_set1_ps(fac[i][c]));
                sc[i][c] = exp_nonpos8(_mm256_sub_ps(sc[i][c], _mm256_set1_ps(after[c]))); /* 0 in masked lanes */
                l = _mm256_add_ps(l, sc[i][c]);
            }
            lanes[i] = l;
        }
        for (int i = 0; i < nq; i += 3) {
            const int64_t n0 = SPAN_KEYS(i), n1 = SPAN_KEYS(i + 1), n2 = SPAN_KEYS(i + 2);
            const int64_t all = n0 < n1 ? (n0 < n2 ? n0 : n2) : (n1 < n2 ? n1 : n2);
            float *a0 = st->acc + (st0 + i) * HD, *a1 = a0 + HD, *a2 = a1 + HD;
            const int i1 = i + 1 < nq ? i + 1 : i, i2 = i + 2 < nq ? i + 2 : i;
            const float *w0 = (const float *)sc[i], *w1 = (const float *)sc[i1], *w2 = (const float *)sc[i2];
            const unsigned r1 = i + 1 < nq ? resc[i + 1] : 0, r2 = i + 2 < nq ? resc[i + 2] : 0;
            for (int64_t d = 0; d < HD; d += 32) {
                const int nv = HD - d >= 32 ? 4 : (int)(HD - d) / 8;
                if (all > 0) {
                    values3(HD, nv, a0 + d, a1 + d, a2 + d, w0, w1, w2, fac[i], fac[i1], fac[i2], resc[i] | r1 | r2,
                            vf + d, all);
                }
                const int64_t k0 = all > 0 ? all : 0;
                if (n0 > k0) values1(HD, nv, a0 + d, w0, fac[i], resc[i], vf + d, k0, n0);
                if (n1 > k0) values1(HD, nv, a1 + d, w1, fac[i1], r1, vf + d, k0, n1);
                if (n2 > k0) values1(HD, nv, a2 + d, w2, fac[i2], r2, vf + d, k0, n2);
            }
        }
#undef SPAN_KEYS
    }
}

/* attend_keys for the common head sizes as constants, each its own function (a frame of its
 * own: inlined at every call site, the span buffers made the frame 270 KiB). */
#define ATTEND_KEYS_FOR(NAME, HD_EXPR)                                                                                  \
    static __attribute__((noinline)) void NAME(const int64_t head_dim, const attn_query *qs, const int nq,              \
                                               attn_state *st, const int st0, const el_kv_rows *k_cache,               \
                                               const el_kv_rows *v_cache, const int32_t *table, const int64_t block_size, \
                                               const int64_t kv_off, const int64_t kv_dim, const int64_t begin,         \
                                               const int64_t end, const float scale) {                                  \
        (void)head_dim;                                                                                                 \
        attend_keys(HD_EXPR, qs, nq, st, st0, k_cache, v_cache, table, block_size, kv_off, kv_dim, begin, end, scale);  \
    }
ATTEND_KEYS_FOR(attend_keys_64, 64)
ATTEND_KEYS_FOR(attend_keys_128, 128)
ATTEND_KEYS_FOR(attend_keys_256, 256)
ATTEND_KEYS_FOR(attend_keys_any, head_dim)
#undef ATTEND_KEYS_FOR

static void attend_keys_hd(const int64_t head_dim, const attn_query *qs, const int nq, attn_state *st, const int st0,
                           const el_kv_rows *k_cache, const el_kv_rows *v_cache, const int32_t *table,
                           const int64_t block_size, const int64_t kv_off, const int64_t kv_dim, const int64_t begin,
                           const int64_t end, const float scale) {
    void (*f)(int64_t, const attn_query *, int, attn_state *, int, const el_kv_rows *, const el_kv_rows *,
              const int32_t *, int64_t, int64_t, int64_t, int64_t, int64_t, float) =
        head_dim == 64 ? attend_keys_64 : head_dim == 128 ? attend_keys_128 : head_dim == 256 ? attend_keys_256
                                                                                             : attend_keys_any;
    f(head_dim, qs, nq, st, st0, k_cache, v_cache, table, block_size, kv_off, kv_dim, begin, end, scale);
}

/* A run of consecutive tokens of one sequence whose windows start at the same key. */
typedef struct {
    int64_t t0, t1;       /* tokens [t0, t1) */
    int64_t first;        /* the window's first key */
    int64_t len;          /* the most keys any of them sees */
    const int32_t *table; /* the sequence's block table */
} attn_run;

/* Runs sharing a pass share at least this many keys: below it the pass saves little. */
#define ATTN_SHARE_MIN_KEYS 32
#define ATTN_MAX_RUNS 64

/* Keys [a.first, S) that run b reads through the same physical blocks as run a (same window
 * start): S is at most a's len, and covers b's keys below S; first if they share none. */
static int64_t shared_keys(const attn_run *a, const attn_run *b, const int64_t block_size) {
    if (a->first != b->first) return a->first;
    const int64_t lim = a->len < b->len ? a->len : b->len;
    int64_t blk = a->first / block_size;
    while (blk * block_size < lim && a->table[blk] == b->table[blk]) blk++;
    if (blk * block_size >= lim) return a->len; /* every key both see is in a shared block */
    return blk * block_size > a->first ? blk * block_size : a->first;
}

/* One cluster of runs (runs[0] leads) for KV head kvh, over the items of the task in
 * [item_begin, item_end): every query of every run shares the pass over keys [first, shared)
 * through runs[0]'s table (the same physical blocks for all), then each run's queries go on
 * through their own table over their own keys. `shared` is a chunk boundary of the window. */
static void attend_cluster(const int64_t HD, const attn_run *runs, const int n_runs, const int64_t shared,
                          const float *q, float *out, const el_kv_rows *k_cache, const el_kv_rows *v_cache,
                          const int32_t *context_lens, const int64_t n_heads, const int64_t group, const int64_t kvh,
                          const int64_t kv_dim, const int64_t block_size, const int64_t max_q, const float scale,
                          const float *sinks, const int64_t item_begin, const int64_t item_end) {
    attn_state st;
    attn_query qs[ATTN_MAX_Q];
    int run_start[ATTN_MAX_RUNS + 1];
    int nq = 0;
    const int64_t kv_off = kvh * HD;
    for (int r = 0; r < n_runs; r++) {
        run_start[r] = nq;
        for (int64_t h = kvh * group; h < (kvh + 1) * group; h++) {
            for (int64_t t = runs[r].t0; t < runs[r].t1; t++) {
                const int64_t item = t * n_heads + h;
                if (item < item_begin || item >= item_end) continue;
                if (nq == max_q) { /* one run of a GQA group wider than max_q heads: in parts */
                    attn_begin(HD, &st, nq);
                    attend_keys_hd(HD, qs, nq, &st, 0, k_cache, v_cache, runs[r].table, block_size, kv_off, kv_dim,
                                runs[r].first, INT64_MAX, scale);
                    attn_finish(HD, &st, qs, nq);
                    nq = 0;
                }
                qs[nq++] = (attn_query){q + item * HD, out + item * HD, context_lens[t], sinks != NULL ? sinks + h : NULL};
            }
        }
    }
    run_start[n_runs] = nq;
    if (nq == 0) return;
    attn_begin(HD, &st, nq);
    if (n_runs == 1) {
        attend_keys_hd(HD, qs, nq, &st, 0, k_cache, v_cache, runs[0].table, block_size, kv_off, kv_dim, runs[0].first,
                    INT64_MAX, scale);
    } else {
        attend_keys_hd(HD, qs, nq, &st, 0, k_cache, v_cache, runs[0].table, block_size, kv_off, kv_dim, runs[0].first,
                    shared, scale);
        for (int r = 0; r < n_runs; r++) {
            const int n = run_start[r + 1] - run_start[r];
            if (n > 0 && runs[r].len > shared) {
                attend_keys_hd(HD, qs + run_start[r], n, &st, run_start[r], k_cache, v_cache, runs[r].table, block_size,
                            kv_off, kv_dim, shared, INT64_MAX, scale);
            }
        }
    }
    attn_finish(HD, &st, qs, nq);
}

/* Items [item_begin, item_end) (token-major, then head). Tokens are taken in runs (consecutive
 * tokens of one sequence whose windows start at the same key, at most max_q / group tokens), and
 * runs in clusters: a leading run with the later runs that read at least ATTN_SHARE_MIN_KEYS of
 * the same keys through the same physical blocks (sequences sharing a cached prefix), up to
 * max_q queries per KV head. Each KV head's queries of a cluster then share the conversion of the
 * shared keys; each query's arithmetic is the same whatever shares its pass. */
void el_paged_attention_avx2(float *out, const float *q, const el_kv_rows *k_cache, const el_kv_rows *v_cache,
                             const int32_t *block_tables, const int32_t *token_seq,
                             const int32_t *context_lens, int64_t n_heads, int64_t n_kv_heads,
                             int64_t head_dim, int64_t block_size, int64_t max_blocks_per_seq, float scale,
                             int32_t window, const float *sinks, int64_t item_begin, int64_t item_end) {
    if (item_end <= item_begin) return;
    const int64_t group = n_heads / n_kv_heads;
    const int64_t kv_dim = n_kv_heads * head_dim;
    const int64_t max_q = ATTN_ACC_FLOATS / head_dim < ATTN_MAX_Q ? ATTN_ACC_FLOATS / head_dim : ATTN_MAX_Q;
    const int64_t max_tokens = group >= max_q ? 1 : max_q / group;
    const int64_t t_end = (item_end - 1) / n_heads + 1;
#define FIRST(t) ((window > 0 && context_lens[t] > window) ? context_lens[t] - window : 0)
    attn_run runs[ATTN_MAX_RUNS];
    uint8_t taken[ATTN_MAX_RUNS];
    for (int64_t t = item_begin / n_heads; t < t_end;) {
        int n_runs = 0; /* the next ATTN_MAX_RUNS runs of the task */
        for (; t < t_end && n_runs < ATTN_MAX_RUNS; n_runs++) {
            attn_run *r = &runs[n_runs];
            r->t0 = t;
            r->first = FIRST(t);
            r->len = context_lens[t];
            r->table = block_tables + (int64_t)token_seq[t] * max_blocks_per_seq;
            for (t++; t < t_end && t - r->t0 < max_tokens && token_seq[t] == token_seq[r->t0] && FIRST(t) == r->first;
                 t++) {
                if (context_lens[t] > r->len) r->len = context_lens[t];
            }
            r->t1 = t;
            taken[n_runs] = 0;
        }
        for (int lead = 0; lead < n_runs; lead++) {
            if (taken[lead]) continue;
            attn_run cl[ATTN_MAX_RUNS];
            int n_cl = 0;
            cl[n_cl++] = runs[lead];
            int64_t tokens = runs[lead].t1 - runs[lead].t0;
            int64_t shared = runs[lead].len;
            for (int r = lead + 1; r < n_runs && group * (tokens + runs[r].t1 - runs[r].t0) <= max_q; r++) {
                if (taken[r]) continue;
                const int64_t s = shared_keys(&runs[lead], &runs[r], block_size);
                const int64_t s_all = s < shared ? s : shared;
                const int64_t aligned = runs[lead].first + (s_all - runs[lead].first) / CHUNK * CHUNK;
                if (aligned - runs[lead].first < ATTN_SHARE_MIN_KEYS) continue;
                shared = s_all;
                taken[r] = 1;
                cl[n_cl++] = runs[r];
                tokens += runs[r].t1 - runs[r].t0;
            }
            shared = runs[lead].first + (shared - runs[lead].first) / CHUNK * CHUNK;
            for (int64_t kvh = 0; kvh < n_kv_heads; kvh++) {
                attend_cluster(head_dim, cl, n_cl, shared, q, out, k_cache, v_cache, context_lens, n_heads, group, kvh,
                               kv_dim, block_size, max_q, scale, sinks, item_begin, item_end);
            }
        }
    }
#undef FIRST
}

#include "avx2_target_end.h"

#endif /* __x86_64__ */

/*
 * quants_k_avx2.c: AVX2 variants of the K-quant dot products and matrix products (Q2_K, Q3_K,
 * Q4_K, Q5_K, Q6_K against Q8_K), bit-identical to the references in quants_k.c. Q8_K weights
 * (not a GGUF weight type) keep the reference. Picked by simd_dispatch.c; compiled for AVX2 with a
 * target pragma, so nothing here may run before that choice.
 *
 * The reference reads every K type through one decoded form (quants_k.c): unsigned quants u, an
 * integer scale and min per sub-block, an offset, and per super-block
 *     isum = sum_j scale[j] (u . a)_j - offset sum_g scale[g] bsums[g],
 *     msum = sum_g min[g] bsums[g],
 *     sum += (d * a.d) * (float)isum - (dmin * a.d) * (float)msum.
 * Here the same integers come from maddubs (u x a, 16-bit pairs) and madd against the run's
 * scales (32-bit), per run of 32 elements; a tile keeps one 32-bit lane per output (lane
 * p = r * C + c, as quants_avx2.c) and does the float line above lane-wise, so each output is the
 * reference's to the bit, and matmul equals vec_dot whatever the batch.
 */
#if defined(__x86_64__)

#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#include "avx2_target_begin.h"

#include "el_blocks.h"
#include "el_internal.h"
#include "simd_avx2.h"
#include "simd_internal.h"

/* ---- One column's super-block, decoded for the runs -------------------------------------------- */

typedef struct {
    __m256i scales; /* sub 32: lane b = scale b in both 16-bit halves; sub 16: 16-bit lane j = scale j */
    __m256i mins16; /* 16-bit lane g = the min of bsums group g (zero for the types without mins) */
    __m256i scale16; /* 16-bit lane g = the scale of group g (only for the types with an offset) */
} k_col;

EL_AI int k_block_bytes(const int type) {
    switch (type) {
    case EL_TYPE_Q2_K: return sizeof(el_block_q2_K);
    case EL_TYPE_Q3_K: return sizeof(el_block_q3_K);
    case EL_TYPE_Q4_K: return sizeof(el_block_q4_K);
    case EL_TYPE_Q5_K: return sizeof(el_block_q5_K);
    default: return sizeof(el_block_q6_K);
    }
}

EL_AI int k_has_min(const int type) {
    return type == EL_TYPE_Q2_K || type == EL_TYPE_Q4_K || type == EL_TYPE_Q5_K;
}
EL_AI int k_offset(const int type) { return type == EL_TYPE_Q3_K ? 4 : type == EL_TYPE_Q6_K ? 32 : 0; }
EL_AI int k_sub32(const int type) { return type == EL_TYPE_Q4_K || type == EL_TYPE_Q5_K; }

/* Q4_K/Q5_K's twelve bytes of 6-bit scales and mins (scale_min_k4 in quants_k.c), four at a time:
 * j < 4 in the low 6 bits of bytes j (scale) and j + 4 (min); j >= 4 a low nibble in byte j + 4
 * and two top bits in bits 6-7 of bytes j - 4 (scale) and j (min). */
EL_AI void k4_scales(const uint8_t *packed, __m128i *scales8, __m128i *mins8) {
    uint32_t w[3];
    memcpy(w, packed, 12);
    const uint32_t sc03 = w[0] & 0x3F3F3F3Fu, m03 = w[1] & 0x3F3F3F3Fu;
    const uint32_t sc47 = (w[2] & 0x0F0F0F0Fu) | (((w[0] >> 6) & 0x03030303u) << 4);
    const uint32_t m47 = ((w[2] >> 4) & 0x0F0F0F0Fu) | (((w[1] >> 6) & 0x03030303u) << 4);
    *scales8 = _mm_setr_epi32((int)sc03, (int)sc47, 0, 0);
    *mins8 = _mm_setr_epi32((int)m03, (int)m47, 0, 0);
}

EL_AI k_col k_decode(const int type, const uint8_t *b) {
    k_col k;
    k.scale16 = _mm256_setzero_si256();
    k.mins16 = _mm256_setzero_si256();
    switch (type) {
    case EL_TYPE_Q4_K:
    case EL_TYPE_Q5_K: {
        __m128i sc8, m8;
        k4_scales(type == EL_TYPE_Q4_K ? ((const el_block_q4_K *)b)->scales : ((const el_block_q5_K *)b)->scales,
                  &sc8, &m8);
        const __m256i sc32 = _mm256_cvtepu8_epi32(sc8);
        k.scales = _mm256_or_si256(sc32, _mm256_slli_epi32(sc32, 16));
        const __m128i m16 = _mm_cvtepu8_epi16(m8); /* min j as 16 bits; group g has min g / 2 */
        k.mins16 = _mm256_set_m128i(_mm_unpackhi_epi16(m16, m16), _mm_unpacklo_epi16(m16, m16));
        break;
    }
    case EL_TYPE_Q2_K: {
        const __m128i s = el_loadu_128(((const el_block_q2_K *)b)->scales);
        const __m128i low4 = _mm_set1_epi8(0x0F);
        k.scales = _mm256_cvtepu8_epi16(_mm_and_si128(s, low4));
        k.mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), low4));
        break;
    }
    case EL_TYPE_Q3_K: { /* 6 bits: low nibbles in bytes 0-7 (j < 8 low, j >= 8 high), top bits in 8-11 */
        const uint8_t *s = ((const el_block_q3_K *)b)->scales;
        uint64_t lo;
        uint32_t hi;
        memcpy(&lo, s, 8);
        memcpy(&hi, s + 8, 4);
        const __m128i low = _mm_and_si128(_mm_set_epi64x((long long)(lo >> 4), (long long)lo), _mm_set1_epi8(0x0F));
        const __m128i top = _mm_and_si128(_mm_setr_epi32((int)hi, (int)(hi >> 2), (int)(hi >> 4), (int)(hi >> 6)),
                                          _mm_set1_epi8(0x03));
        const __m128i l = _mm_sub_epi8(_mm_or_si128(low, _mm_slli_epi16(top, 4)), _mm_set1_epi8(32));
        k.scales = _mm256_cvtepi8_epi16(l);
        k.scale16 = k.scales;
        break;
    }
    default: /* EL_TYPE_Q6_K: int8 scales */
        k.scales = _mm256_cvtepi8_epi16(el_loadu_128(((const el_block_q6_K *)b)->scales));
        k.scale16 = k.scales;
        break;
    }
    return k;
}

/* The 16-bit multipliers of run b (elements 32 b .. 32 b + 31) for madd against its maddubs pairs:
 * 16-bit lanes 0-7 cover elements 32 b .. + 15, lanes 8-15 the next 16. */
EL_AI __m256i k_run_scales(const int type, const k_col *k, const int b) {
    const __m256i lane = _mm256_permutevar8x32_epi32(k->scales, _mm256_set1_epi32(b));
    if (k_sub32(type)) return lane; /* scale b in every 16-bit lane */
    /* scales 2b and 2b + 1 in every 32-bit lane: the first to the low half, the second to the high */
    const __m256i split = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2,
                                           3, 2, 3, 2, 3, 2, 3);
    return _mm256_shuffle_epi8(lane, split);
}

/* The unsigned quants of run b as 32 bytes (the layouts of quants_k.c's el_run helpers). */
EL_AI __m256i k_run_quants(const int type, const uint8_t *blk, const int b) {
    switch (type) {
    case EL_TYPE_Q2_K: {
        const __m256i q = el_loadu_256(((const el_block_q2_K *)blk)->qs + 32 * (b / 4));
        return _mm256_and_si256(el_shift_bytes(q, -2 * (b % 4)), _mm256_set1_epi8(3));
    }
    case EL_TYPE_Q3_K: {
        const el_block_q3_K *x = (const el_block_q3_K *)blk;
        const __m256i q = el_loadu_256(x->qs + 32 * (b / 4));
        const __m256i lo = _mm256_and_si256(el_shift_bytes(q, -2 * (b % 4)), _mm256_set1_epi8(3));
        const __m256i hi = _mm256_and_si256(el_shift_bytes(el_loadu_256(x->hmask), 2 - b), _mm256_set1_epi8(4));
        return _mm256_or_si256(lo, hi);
    }
    case EL_TYPE_Q4_K: {
        const __m256i q = el_loadu_256(((const el_block_q4_K *)blk)->qs + 32 * (b / 2));
        return _mm256_and_si256(el_shift_bytes(q, -4 * (b % 2)), _mm256_set1_epi8(0x0F));
    }
    case EL_TYPE_Q5_K: {
        const el_block_q5_K *x = (const el_block_q5_K *)blk;
        const __m256i q = el_loadu_256(x->qs + 32 * (b / 2));
        const __m256i lo = _mm256_and_si256(el_shift_bytes(q, -4 * (b % 2)), _mm256_set1_epi8(0x0F));
        const __m256i hi = _mm256_and_si256(el_shift_bytes(el_loadu_256(x->qh), 4 - b), _mm256_set1_epi8(0x10));
        return _mm256_or_si256(lo, hi);
    }
    default: { /* EL_TYPE_Q6_K: run 4h + k: nibble k / 2 of ql[64h + 32 (k % 2)], bits 2k of qh[32h] */
        const el_block_q6_K *x = (const el_block_q6_K *)blk;
        const int h = b / 4, k = b % 4;
        const __m256i ql = el_loadu_256(x->ql + 64 * h + 32 * (k % 2));
        const __m256i lo = _mm256_and_si256(el_shift_bytes(ql, -4 * (k / 2)), _mm256_set1_epi8(0x0F));
        const __m256i hi = _mm256_and_si256(el_shift_bytes(el_loadu_256(x->qh + 32 * h), 4 - 2 * k), _mm256_set1_epi8(0x30));
        return _mm256_or_si256(lo, hi);
    }
    }
}

/* ---- The tile ------------------------------------------------------------------------------- */

EL_AI void tile_k(const int type, const int R, const int C, const uint8_t *const *wp, const uint8_t *const *ap,
                  const int64_t nb, float *sums /* [8] */, const el_prefetch pf) {
    const int wb = k_block_bytes(type), ab = (int)sizeof(el_block_q8_K);
    const int qs_off = 4, bsums_off = 4 + QK_K; /* in el_block_q8_K */
    __m256 sum = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        el_prefetch_step(pf, i);
        __m256i acc[8], macc[8];
        for (int p = 0; p < 8; p++) acc[p] = macc[p] = _mm256_setzero_si256();
        for (int c = 0; c < C; c++) {
            const uint8_t *blk = wp[c] + i * wb;
            const k_col k = k_decode(type, blk);
            for (int b = 0; b < QK_K / 32; b++) {
                const __m256i u = k_run_quants(type, blk, b);
                const __m256i sc = k_run_scales(type, &k, b);
                for (int r = 0; r < R; r++) {
                    const __m256i a = el_loadu_256(ap[r] + i * ab + qs_off + 32 * b);
                    acc[r * C + c] = _mm256_add_epi32(acc[r * C + c], _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), sc));
                }
            }
            for (int r = 0; r < R; r++) {
                const __m256i bsums = el_loadu_256(ap[r] + i * ab + bsums_off);
                if (k_has_min(type)) macc[r * C + c] = _mm256_madd_epi16(bsums, k.mins16);
                if (k_offset(type)) {
                    const __m256i osum = _mm256_madd_epi16(bsums, k.scale16);
                    const int shift = k_offset(type) == 32 ? 5 : 2;
                    acc[r * C + c] = _mm256_sub_epi32(acc[r * C + c], _mm256_slli_epi32(osum, shift));
                }
            }
        }
        const __m256 isum = _mm256_cvtepi32_ps(el_reduce8_epi32(acc));
        const __m256 msum = k_has_min(type) ? _mm256_cvtepi32_ps(el_reduce8_epi32(macc)) : _mm256_setzero_ps();
        __m256 d, dmin;
        switch (type) {
        case EL_TYPE_Q2_K: el_col_halves(R, C, wp, i * wb + 80, &d, &dmin); break;
        case EL_TYPE_Q4_K:
        case EL_TYPE_Q5_K: el_col_halves(R, C, wp, i * wb, &d, &dmin); break;
        case EL_TYPE_Q3_K:
            d = el_col_half16(R, C, wp, i * wb + 108);
            dmin = _mm256_setzero_ps();
            break;
        default: /* Q6_K */
            d = el_col_half16(R, C, wp, i * wb + 208);
            dmin = _mm256_setzero_ps();
            break;
        }
        const __m256 da = el_row_f32(R, C, ap, i * ab);
        const __m256 t = _mm256_sub_ps(_mm256_mul_ps(_mm256_mul_ps(d, da), isum),
                                       _mm256_mul_ps(_mm256_mul_ps(dmin, da), msum));
        sum = _mm256_add_ps(sum, t);
    }
    _mm256_storeu_ps(sums, sum);
}

_Static_assert(offsetof(el_block_q2_K, d) == 80 && offsetof(el_block_q2_K, dmin) == 82, "q2_K d, dmin");
_Static_assert(offsetof(el_block_q3_K, d) == 108, "q3_K d");
_Static_assert(offsetof(el_block_q6_K, d) == 208, "q6_K d");
_Static_assert(offsetof(el_block_q8_K, qs) == 4 && offsetof(el_block_q8_K, bsums) == 4 + QK_K, "q8_K");

/* out[r][o], tile by tile: 4x2 for batches, 2x4 for two rows, 1x8 for one (prefetching the weights
 * of the tile after next, as quants_avx2.c); partial tiles repeat their last row or column
 * (computed, never stored). */
typedef void (*tile_fn)(const uint8_t *const *wp, const uint8_t *const *ap, int64_t nb, float *sums,
                        el_prefetch pf);

static void matmul_tiles_k(tile_fn tile_4x2, tile_fn tile_2x4, tile_fn tile_1x8, const void *w, int64_t w_row_bytes,
                           const void *a, int64_t a_row_bytes, float *out, int64_t out_stride, int64_t nb,
                           int64_t n_rows, int64_t o_begin, int64_t o_end) {
    const uint8_t *w8 = w, *a8 = a;
    for (int64_t r0 = 0; r0 < n_rows;) {
        const int64_t left = n_rows - r0;
        const int R = left >= 3 ? 4 : (int)left;
        const int C = 8 / R;
        const tile_fn tile = R == 4 ? tile_4x2 : R == 2 ? tile_2x4 : tile_1x8;
        const uint8_t *ap[4];
        for (int r = 0; r < R; r++) ap[r] = a8 + (r0 + (r < left ? r : left - 1)) * a_row_bytes;
        for (int64_t o0 = o_begin; o0 < o_end; o0 += C) {
            const uint8_t *wp[8];
            for (int c = 0; c < C; c++) wp[c] = w8 + (o0 + c < o_end ? o0 + c : o_end - 1) * w_row_bytes;
            float sums[8];
            tile(wp, ap, nb, sums, el_prefetch_ahead(R, C, w8, w_row_bytes, o0, out_stride /* n_out */, nb));
            for (int r = 0; r < R && r < left; r++) {
                for (int c = 0; c < C && o0 + c < o_end; c++) out[(r0 + r) * out_stride + o0 + c] = sums[r * C + c];
            }
        }
        r0 += R;
    }
}

#define KERNELS_K(name, TYPE)                                                                        \
    static void tile_##name##_4x2(const uint8_t *const *wp, const uint8_t *const *ap, int64_t nb,    \
                                  float *sums, el_prefetch pf) {                                     \
        tile_k(TYPE, 4, 2, wp, ap, nb, sums, pf);                                                    \
    }                                                                                                \
    static void tile_##name##_2x4(const uint8_t *const *wp, const uint8_t *const *ap, int64_t nb,    \
                                  float *sums, el_prefetch pf) {                                     \
        tile_k(TYPE, 2, 4, wp, ap, nb, sums, pf);                                                    \
    }                                                                                                \
    static void tile_##name##_1x8(const uint8_t *const *wp, const uint8_t *const *ap, int64_t nb,    \
                                  float *sums, el_prefetch pf) {                                     \
        tile_k(TYPE, 1, 8, wp, ap, nb, sums, pf);                                                    \
    }                                                                                                \
    static float dot_##name(const void *w, const void *a, int64_t nb) {                              \
        const uint8_t *wp[1] = {w}, *ap[1] = {a};                                                    \
        float sums[8];                                                                               \
        tile_k(TYPE, 1, 1, wp, ap, nb, sums, el_no_prefetch());                                      \
        return sums[0];                                                                              \
    }                                                                                                \
    static void matmul_##name(const void *w, int64_t w_row_bytes, const void *a, int64_t a_row_bytes, \
                              float *out, int64_t out_stride, int64_t nb, int64_t n_rows,            \
                              int64_t o_begin, int64_t o_end) {                                      \
        matmul_tiles_k(tile_##name##_4x2, tile_##name##_2x4, tile_##name##_1x8, w, w_row_bytes, a,   \
                       a_row_bytes, out, out_stride, nb, n_rows, o_begin, o_end);                    \
    }

KERNELS_K(q2_K, EL_TYPE_Q2_K)
KERNELS_K(q3_K, EL_TYPE_Q3_K)
KERNELS_K(q4_K, EL_TYPE_Q4_K)
KERNELS_K(q5_K, EL_TYPE_Q5_K)
KERNELS_K(q6_K, EL_TYPE_Q6_K)

static const struct {
    int32_t type;
    el_simd_quant_kernels k;
} KERNELS[] = {
    {EL_TYPE_Q2_K, {NULL, dot_q2_K, matmul_q2_K}},
    {EL_TYPE_Q3_K, {NULL, dot_q3_K, matmul_q3_K}},
    {EL_TYPE_Q4_K, {NULL, dot_q4_K, matmul_q4_K}},
    {EL_TYPE_Q5_K, {NULL, dot_q5_K, matmul_q5_K}},
    {EL_TYPE_Q6_K, {NULL, dot_q6_K, matmul_q6_K}},
};

const el_simd_quant_kernels *el_avx2_quant_k(int32_t type) {
    for (size_t i = 0; i < sizeof(KERNELS) / sizeof(KERNELS[0]); i++) {
        if (KERNELS[i].type == type) return &KERNELS[i].k;
    }
    return NULL;
}

#include "avx2_target_end.h"

#endif /* __x86_64__ */

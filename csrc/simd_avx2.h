/*
 * simd_avx2.h: small AVX2 helpers shared by the AVX2 kernel files (quants_avx2.c,
 * quants_k_avx2.c, quants_k_x8_avx2.c, ops_avx2.c). Include it only after the AVX2 target pragma
 * (EL_AVX2_BEGIN): everything here compiles to AVX2 + FMA + F16C instructions.
 *
 * The tile helpers describe one convention: a matrix-product tile of R activation rows by C
 * weight rows ("columns" of the output) keeps one 32-bit lane per output element, lane
 * p = r * C + c, R * C <= 8. Integer block sums of the R * C pairs are reduced into one vector
 * (reduce8_epi32) so that the float work on them -- scales, products, the running sum -- is done
 * lane by lane with the same operations, in the same order, as the scalar reference does for one
 * element. That is what makes every tile shape, and so every batch size, give bit-identical results.
 */
#ifndef EL_SIMD_AVX2_H
#define EL_SIMD_AVX2_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define EL_AI static inline __attribute__((always_inline))

/* ---- Loads ------------------------------------------------------------------------------------ */

EL_AI uint32_t el_load_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

EL_AI uint16_t el_load_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

EL_AI __m256i el_loadu_256(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
EL_AI __m128i el_loadu_128(const void *p) { return _mm_loadu_si128((const __m128i *)p); }

/* Shift each byte's bits left by s (s < 0: right), within 16-bit lanes; callers mask the bits
 * they keep, which the shift across the byte boundary never reaches. */
EL_AI __m256i el_shift_bytes(__m256i v, const int s) {
    return s > 0 ? _mm256_slli_epi16(v, s) : s < 0 ? _mm256_srli_epi16(v, -s) : v;
}

/* Lanes 0..n-1 = the u32 at p[i] + off (n <= 4; the rest 0). */
EL_AI __m128i el_gather_u32(const uint8_t *const *p, const int n, const int64_t off) {
    __m128i v = _mm_cvtsi32_si128((int)el_load_u32(p[0] + off));
    if (n > 1) v = _mm_insert_epi32(v, (int)el_load_u32(p[1] + off), 1);
    if (n > 2) v = _mm_insert_epi32(v, (int)el_load_u32(p[2] + off), 2);
    if (n > 3) v = _mm_insert_epi32(v, (int)el_load_u32(p[3] + off), 3);
    return v;
}

/* 16-bit lanes 2i = the u16 at p[i] + off (n <= 4; odd lanes 0): for fields a u32 load would read
 * past the end of the last block. */
EL_AI __m128i el_gather_u16(const uint8_t *const *p, const int n, const int64_t off) {
    __m128i v = _mm_cvtsi32_si128((int)el_load_u16(p[0] + off));
    if (n > 1) v = _mm_insert_epi16(v, el_load_u16(p[1] + off), 2);
    if (n > 2) v = _mm_insert_epi16(v, el_load_u16(p[2] + off), 4);
    if (n > 3) v = _mm_insert_epi16(v, el_load_u16(p[3] + off), 6);
    return v;
}

/* ---- Tile lanes ------------------------------------------------------------------------------- */

/* Lane p's column c(p) = p % C and row r(p) = p / C, for p < R * C; lanes past R * C read
 * column and row 0 (their results are never stored). k picks element k of a pair (for two f16
 * fields read as one u32). */
#define EL_LANE_C(p) ((p) < R * C ? (p) % C : 0)
#define EL_LANE_R(p) ((p) < R * C ? (p) / C : 0)
EL_AI __m256i el_lane_cols(const int R, const int C, const int mul, const int k) {
    return _mm256_setr_epi32(mul * EL_LANE_C(0) + k, mul * EL_LANE_C(1) + k, mul * EL_LANE_C(2) + k,
                             mul * EL_LANE_C(3) + k, mul * EL_LANE_C(4) + k, mul * EL_LANE_C(5) + k,
                             mul * EL_LANE_C(6) + k, mul * EL_LANE_C(7) + k);
}
EL_AI __m256i el_lane_rows(const int R, const int C, const int mul, const int k) {
    return _mm256_setr_epi32(mul * EL_LANE_R(0) + k, mul * EL_LANE_R(1) + k, mul * EL_LANE_R(2) + k,
                             mul * EL_LANE_R(3) + k, mul * EL_LANE_R(4) + k, mul * EL_LANE_R(5) + k,
                             mul * EL_LANE_R(6) + k, mul * EL_LANE_R(7) + k);
}

/* Per lane, the two f16 halves (*lo, *hi) of the u32 at byte `off` of block p[sel(lane)], as
 * floats. n <= 4 blocks, with idx = 2 sel(lane) (idx + 1 is used for *hi); or n == 8 with
 * sel(lane) = lane (idx unused). */
EL_AI void el_lane_halves(const int n, const uint8_t *const *p, const int64_t off, const __m256i idx, __m256 *lo,
                          __m256 *hi) {
    const __m256 f = _mm256_cvtph_ps(el_gather_u32(p, n < 4 ? n : 4, off)); /* [lo0 hi0 lo1 hi1 ..] */
    if (n <= 4) {
        *lo = _mm256_permutevar8x32_ps(f, idx);
        *hi = _mm256_permutevar8x32_ps(f, _mm256_add_epi32(idx, _mm256_set1_epi32(1)));
    } else { /* blocks 4..7 come from a second gather */
        const __m256 g = _mm256_cvtph_ps(el_gather_u32(p + 4, 4, off));
        const __m256i even = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
        const __m256i odd = _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7);
        *lo = _mm256_blend_ps(_mm256_permutevar8x32_ps(f, even), _mm256_permutevar8x32_ps(g, even), 0xF0);
        *hi = _mm256_blend_ps(_mm256_permutevar8x32_ps(f, odd), _mm256_permutevar8x32_ps(g, odd), 0xF0);
    }
}

/* Per lane, the two f16 halves of the u32 at byte `off` of the lane's column block wp[c(p)]
 * (lane p = r * C + c). C <= 4, or C == 8 with R == 1. */
EL_AI void el_col_halves(const int R, const int C, const uint8_t *const *wp, const int64_t off, __m256 *lo,
                         __m256 *hi) {
    el_lane_halves(C, wp, off, el_lane_cols(R, C, 2, 0), lo, hi);
}

/* Per lane, the f16 at byte `off` of the lane's column block, read 16 bits wide. */
EL_AI __m256 el_col_half16(const int R, const int C, const uint8_t *const *wp, const int64_t off) {
    const __m256 f = _mm256_cvtph_ps(el_gather_u16(wp, C < 4 ? C : 4, off)); /* [v0 0 v1 0 ..] */
    if (C <= 4) return _mm256_permutevar8x32_ps(f, el_lane_cols(R, C, 2, 0));
    const __m256 g = _mm256_cvtph_ps(el_gather_u16(wp + 4, 4, off));
    const __m256i even = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
    return _mm256_blend_ps(_mm256_permutevar8x32_ps(f, even), _mm256_permutevar8x32_ps(g, even), 0xF0);
}

/* Per lane, the two f16 halves of the u32 at byte `off` of the lane's row block ap[r(p)] (R <= 4). */
EL_AI void el_row_halves(const int R, const int C, const uint8_t *const *ap, const int64_t off, __m256 *lo,
                         __m256 *hi) {
    el_lane_halves(R, ap, off, el_lane_rows(R, C, 2, 0), lo, hi);
}

/* Per lane, the f32 at byte `off` of the lane's row block (R <= 4). */
EL_AI __m256 el_row_f32(const int R, const int C, const uint8_t *const *ap, const int64_t off) {
    const __m128 f = _mm_castsi128_ps(el_gather_u32(ap, R, off));
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(f), el_lane_rows(R, C, 1, 0));
}

/* Lane p = the sum of the eight 32-bit lanes of v[p] (wrapping integer adds: exact). */
EL_AI __m256i el_reduce8_epi32(const __m256i v[8]) {
    const __m256i h0 = _mm256_hadd_epi32(v[0], v[1]); /* [v0 01, v0 23, v1 01, v1 23 | v0 45, ..] */
    const __m256i h1 = _mm256_hadd_epi32(v[2], v[3]);
    const __m256i h2 = _mm256_hadd_epi32(v[4], v[5]);
    const __m256i h3 = _mm256_hadd_epi32(v[6], v[7]);
    const __m256i g0 = _mm256_hadd_epi32(h0, h1); /* [v0 0-3, v1 0-3, v2 0-3, v3 0-3 | v0 4-7, ..] */
    const __m256i g1 = _mm256_hadd_epi32(h2, h3);
    return _mm256_add_epi32(_mm256_permute2x128_si256(g0, g1, 0x20), _mm256_permute2x128_si256(g0, g1, 0x31));
}

/* Lane h * 4 + k = the sum of the four 32-bit lanes of half h (0: low, 1: high) of v[k]. */
EL_AI __m256i el_reduce4x2_epi32(const __m256i v[4]) {
    return _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
}

/* Sum of the eight 32-bit lanes of v. */
EL_AI int32_t el_hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

/* Sum of the eight floats of v (a fixed order: halves, then pairs, then the last two). */
EL_AI float el_hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ---- Prefetch ---------------------------------------------------------------------------------
 * A one-row product (decode) streams its weights from memory once. Its tiles prefetch the weight
 * rows of the tile after next, a few cache lines per block iteration (a burst of them at once
 * stalls on the full miss buffers). */

typedef struct {
    const uint8_t *at; /* the first line to fetch; NULL: none */
    int64_t lines;     /* lines per block iteration */
    int64_t total;     /* lines in all */
} el_prefetch;

EL_AI el_prefetch el_no_prefetch(void) {
    el_prefetch pf = {NULL, 0, 0};
    return pf;
}

/* For the tile of columns [o0, o0 + C) of a one-row product: the rows of [o0 + 2C, o0 + 3C),
 * bounded by the matrix's n_out columns, not by the task's o_end: a thread's tasks are mostly
 * consecutive column ranges, so its last tiles of one task fetch the first of the next (bounded by
 * o_end, half the tiles of a 32-column task fetched nothing and every task began on cold misses:
 * tg128 140 -> 189 tokens/s, A/B interleaved). */
EL_AI el_prefetch el_prefetch_ahead(const int R, const int C, const uint8_t *w, int64_t w_row_bytes, int64_t o0,
                                    int64_t n_out, int64_t nb) {
    el_prefetch pf = {NULL, 0, 0};
    if (R != 1 || o0 + 3 * C > n_out || nb <= 0) return pf;
    pf.at = w + (o0 + 2 * C) * w_row_bytes;
    pf.total = (C * w_row_bytes + 63) / 64;
    pf.lines = (pf.total + nb - 1) / nb;
    return pf;
}

EL_AI void el_prefetch_step(const el_prefetch pf, int64_t i) {
    if (pf.at == NULL) return;
    for (int64_t k = i * pf.lines; k < (i + 1) * pf.lines && k < pf.total; k++) {
        _mm_prefetch((const char *)pf.at + 64 * k, _MM_HINT_T0);
    }
}

/* ---- Conversions ------------------------------------------------------------------------------ */

/* roundf of each lane: nearest, halves away from zero (the activation quantizers' rounding;
 * _mm256_round_ps has only ties-to-even). Exact for every finite x: x - trunc(x) is exact. */
EL_AI __m256 el_round_half_away(__m256 x) {
    const __m256 t = _mm256_round_ps(x, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 sign = _mm256_and_ps(x, _mm256_set1_ps(-0.0f));
    const __m256 frac = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_sub_ps(x, t)); /* |x - t| */
    const __m256 up = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    return _mm256_add_ps(t, _mm256_and_ps(up, _mm256_or_ps(sign, _mm256_set1_ps(1.0f))));
}

/* Eight floats -> f16, bit for bit el_fp32_to_fp16: F16C's round-to-nearest-even, with NaNs
 * mapped to the reference's quiet NaN (sign | 0x7E00) rather than keeping their payload. */
EL_AI __m128i el_f32_to_f16_8(__m256 x) {
    const __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    if (_mm256_movemask_ps(nan) == 0) return h;
    const __m128i sign = _mm_and_si128(h, _mm_set1_epi16((short)0x8000));
    const __m128i qnan = _mm_or_si128(sign, _mm_set1_epi16(0x7E00));
    const __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(_mm256_castps_si256(nan)),
                                          _mm256_extracti128_si256(_mm256_castps_si256(nan), 1));
    return _mm_blendv_epi8(h, qnan, nan16);
}

/* Packs 32 int32 lanes (4 vectors, in element order, each in [-128, 127]) to 32 int8s in order. */
EL_AI __m256i el_pack_i32_to_i8(__m256i i0, __m256i i1, __m256i i2, __m256i i3) {
    const __m256i a = _mm256_packs_epi32(i0, i1); /* 0-3 8-11 | 4-7 12-15 */
    const __m256i b = _mm256_packs_epi32(i2, i3);
    const __m256i c = _mm256_packs_epi16(a, b); /* 0-3 8-11 16-19 24-27 | 4-7 12-15 20-23 28-31 */
    return _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

#endif /* EL_SIMD_AVX2_H */

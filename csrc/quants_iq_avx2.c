/*
 * quants_iq_avx2.c: AVX2 variants of the IQ types' dot products and matrix products (IQ4_NL
 * and MXFP4 (quants_mxfp4.c) against Q8_0; IQ4_XS, IQ3_S, IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M against Q8_K),
 * bit-identical to the references in quants_iq.c. Picked by simd_dispatch.c; compiled for AVX2
 * with a target pragma, so nothing here may run before that choice.
 *
 * The reference sums a super-block in integers, isum = sum_g ls[g] * (q . a)_g, and does one float
 * step per super-block, sum += (d * a.d) * (float)isum, then scales the result by the type's
 * power of two (IQ4_NL: one float step per 32-element block, no factor). Here a run of 32 elements
 * is decoded into 32 signed int8 quants -- as magnitudes |q| and a sign source s (sign(s) =
 * sign(q)) -- straight from the codebooks (8-byte grid points gathered by index; sign bytes
 * from a table of the 128 sign indices, or explicit sign bits expanded to bytes); maddubs(|q|, sign(a, s)) gives 16-bit pair sums, madd against the run's
 * 16-bit ls (one per 16 elements) gives 32-bit lanes, exact. A tile keeps one 32-bit lane per
 * output (lane p = r * C + c, simd_avx2.h) and does the float step lane-wise, so each output is
 * the reference's to the bit and matmul equals vec_dot whatever the batch.
 *
 * The signed products rely on the activation quants lying in [-127, 127], as el_quantize_row
 * makes them (see quants_avx2.c).
 */
#if defined(__x86_64__)

#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#include "avx2_target_begin.h"

#include "el_blocks.h"
#include "el_internal.h"
#include "el_iq_tables.h"
#include "simd_avx2.h"
#include "simd_internal.h"

/* ---- A run of 32 elements, decoded ---------------------------------------------------------- */

typedef struct {
    __m256i u;  /* |q|, unsigned bytes */
    __m256i s;  /* a byte with q's sign (nonzero where q is) */
    __m256i sc; /* the 16-bit ls of each maddubs pair: lanes 0-7 elements 0-15, 8-15 elements 16-31 */
} iq_run;

/* 0xFF in byte e where bit e % 8 of byte e / 8 of the little-endian u32 `bits` is set, else 0. */
EL_AI __m256i bit_mask(const uint32_t bits) {
    const __m256i x = _mm256_set1_epi32((int)bits);
    const __m256i spread = _mm256_shuffle_epi8(
        x, _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
}

/* Unsigned grid bytes with sign bits: u = grid, s = -1 where the sign bit is set, else 1. */
EL_AI iq_run grid_run(const __m256i grid, const uint32_t signs, const __m256i sc) {
    iq_run r;
    r.u = grid;
    r.s = _mm256_or_si256(bit_mask(signs), _mm256_set1_epi8(1));
    r.sc = sc;
    return r;
}

/* Signed quants q (no zero-magnitude concerns: sign(a, 0) = 0 and |0| = 0 agree). */
EL_AI iq_run signed_run(const __m256i q, const __m256i sc) {
    iq_run r;
    r.u = _mm256_sign_epi8(q, q);
    r.s = q;
    r.sc = sc;
    return r;
}

EL_AI __m256i ls32(const int ls) { return _mm256_set1_epi16((short)ls); }
EL_AI __m256i ls16(const int ls0, const int ls1) {
    return _mm256_set_m128i(_mm_set1_epi16((short)ls1), _mm_set1_epi16((short)ls0));
}

/* Four 8-element grid points in element order. */
EL_AI __m256i grid4(const uint64_t *grid, const int i0, const int i1, const int i2, const int i3) {
    return _mm256_setr_epi64x((long long)grid[i0], (long long)grid[i1], (long long)grid[i2], (long long)grid[i3]);
}

/* The eight sign bytes (+1, or -1 = 0xFF) of each 7-bit sign index: ksigns_iq2xs[i] = i with a
 * parity bit 7, bit j the sign of element j. */
#define KS_BITS(i) ((i) | (((i) ^ (i) >> 1 ^ (i) >> 2 ^ (i) >> 3 ^ (i) >> 4 ^ (i) >> 5 ^ (i) >> 6) & 1) << 7)
#define KS_BYTE(i, j) ((uint64_t)((KS_BITS(i) >> (j)) & 1 ? 0xFF : 0x01) << 8 * (j))
#define KS(i)                                                                                                    \
    (KS_BYTE(i, 0) | KS_BYTE(i, 1) | KS_BYTE(i, 2) | KS_BYTE(i, 3) | KS_BYTE(i, 4) | KS_BYTE(i, 5) |            \
     KS_BYTE(i, 6) | KS_BYTE(i, 7))
#define KS4(i) KS(i), KS((i) + 1), KS((i) + 2), KS((i) + 3)
#define KS16(i) KS4(i), KS4((i) + 4), KS4((i) + 8), KS4((i) + 12)
static const uint64_t ksign_bytes[128] = {KS16(0),  KS16(16), KS16(32), KS16(48),
                                          KS16(64), KS16(80), KS16(96), KS16(112)};
#undef KS16
#undef KS4
#undef KS
#undef KS_BYTE
#undef KS_BITS

/* Unsigned grid bytes with four 7-bit sign indices (bits 0, 7, 14, 21 of v), one per 8 elements. */
EL_AI iq_run ksign_run(const __m256i grid, const uint32_t v, const __m256i sc) {
    iq_run r;
    r.u = grid;
    r.s = _mm256_setr_epi64x((long long)ksign_bytes[v & 127], (long long)ksign_bytes[(v >> 7) & 127],
                             (long long)ksign_bytes[(v >> 14) & 127], (long long)ksign_bytes[(v >> 21) & 127]);
    r.sc = sc;
    return r;
}

/* The 32 nibbles of 16 bytes (element j low nibble, j + 16 high) through kvalues_iq4nl. */
EL_AI __m256i iq4_values(const uint8_t *qs) {
    const __m128i t = el_loadu_128(qs);
    const __m256i idx = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0F));
    const __m256i kv = _mm256_broadcastsi128_si256(el_loadu_128(el_kvalues_iq4nl));
    return _mm256_shuffle_epi8(kv, idx);
}

/* IQ1's 8 * grid + shift (grid bytes -1, 0, 1; shift bytes -1 or +1): odd, so never zero. */
EL_AI __m256i iq1_values(const __m256i grid, const __m256i shift) {
    return _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), grid), shift);
}

EL_AI uint64_t shift8(const int negative) { return negative ? 0xFFFFFFFFFFFFFFFFULL : 0x0101010101010101ULL; }

/* Run b (elements 32 b .. 32 b + 31) of a super-block of `type` (decode_* in quants_iq.c). */
EL_AI iq_run iq_decode_run(const int type, const uint8_t *blk, const int b) {
    switch (type) {
    case EL_TYPE_IQ4_XS: {
        const el_block_iq4_xs *x = (const el_block_iq4_xs *)blk;
        const int ls = ((x->scales_l[b / 2] >> 4 * (b % 2)) & 0xf) | (((x->scales_h >> 2 * b) & 3) << 4);
        return signed_run(iq4_values(x->qs + 16 * b), ls32(ls - 32));
    }
    case EL_TYPE_IQ2_XXS: {
        const uint8_t *q = blk + 2 + 8 * b;
        const uint32_t aux1 = el_load_u32(q + 4);
        return ksign_run(grid4(el_iq2xxs_grid, q[0], q[1], q[2], q[3]), aux1, ls32(2 * (int)(aux1 >> 28) + 1));
    }
    case EL_TYPE_IQ2_XS: {
        const el_block_iq2_xs *x = (const el_block_iq2_xs *)blk;
        uint16_t v[4];
        memcpy(v, x->qs + 4 * b, sizeof(v));
        const uint32_t signs = (uint32_t)v[0] >> 9 | ((uint32_t)v[1] >> 9) << 7 | ((uint32_t)v[2] >> 9) << 14 |
                               ((uint32_t)v[3] >> 9) << 21;
        const int sc = x->scales[b];
        return ksign_run(grid4(el_iq2xs_grid, v[0] & 511, v[1] & 511, v[2] & 511, v[3] & 511), signs,
                        ls16(2 * (sc & 0xf) + 1, 2 * (sc >> 4) + 1));
    }
    case EL_TYPE_IQ2_S: {
        const el_block_iq2_s *x = (const el_block_iq2_s *)blk;
        const uint8_t *qs = x->qs + 4 * b;
        const int qh = x->qh[b], sc = x->scales[b];
        const __m256i grid = grid4(el_iq2s_grid, qs[0] | ((qh << 8) & 0x300), qs[1] | ((qh << 6) & 0x300),
                                   qs[2] | ((qh << 4) & 0x300), qs[3] | ((qh << 2) & 0x300));
        return grid_run(grid, el_load_u32(x->qs + QK_K / 8 + 4 * b), ls16(2 * (sc & 0xf) + 1, 2 * (sc >> 4) + 1));
    }
    case EL_TYPE_IQ3_XXS: {
        const el_block_iq3_xxs *x = (const el_block_iq3_xxs *)blk;
        const uint8_t *q = x->qs + 8 * b;
        const __m256i grid = _mm256_setr_epi32((int)el_iq3xxs_grid[q[0]], (int)el_iq3xxs_grid[q[1]],
                                               (int)el_iq3xxs_grid[q[2]], (int)el_iq3xxs_grid[q[3]],
                                               (int)el_iq3xxs_grid[q[4]], (int)el_iq3xxs_grid[q[5]],
                                               (int)el_iq3xxs_grid[q[6]], (int)el_iq3xxs_grid[q[7]]);
        const uint32_t aux = el_load_u32(x->qs + QK_K / 4 + 4 * b);
        return ksign_run(grid, aux, ls32(2 * (int)(aux >> 28) + 1));
    }
    case EL_TYPE_IQ3_S: {
        const el_block_iq3_s *x = (const el_block_iq3_s *)blk;
        const uint8_t *q = x->qs + 8 * b;
        const int qh = x->qh[b];
#define IQ3S(k) (int)el_iq3s_grid[q[k] | (((qh >> (k)) & 1) << 8)]
        const __m256i grid = _mm256_setr_epi32(IQ3S(0), IQ3S(1), IQ3S(2), IQ3S(3), IQ3S(4), IQ3S(5), IQ3S(6), IQ3S(7));
#undef IQ3S
        const int sc = x->scales[b / 2];
        return grid_run(grid, el_load_u32(x->signs + 4 * b), ls32(1 + 2 * (b % 2 == 0 ? sc & 0xf : sc >> 4)));
    }
    case EL_TYPE_IQ1_S: {
        const el_block_iq1_s *x = (const el_block_iq1_s *)blk;
        const uint8_t *qs = x->qs + 4 * b;
        const int qh = x->qh[b];
        const __m256i grid = grid4(el_iq1s_grid, qs[0] | ((qh << 8) & 0x700), qs[1] | ((qh << 5) & 0x700),
                                   qs[2] | ((qh << 2) & 0x700), qs[3] | ((qh >> 1) & 0x700));
        const __m256i shift = _mm256_set1_epi8(qh & 0x8000 ? -1 : 1);
        return signed_run(iq1_values(grid, shift), ls32(2 * ((qh >> 12) & 7) + 1));
    }
    default: { /* EL_TYPE_IQ1_M */
        const el_block_iq1_m *x = (const el_block_iq1_m *)blk;
        const uint8_t *qs = x->qs + 4 * b;
        const int qh0 = x->qh[2 * b], qh1 = x->qh[2 * b + 1];
        const __m256i grid = grid4(el_iq1s_grid, qs[0] | ((qh0 << 8) & 0x700), qs[1] | ((qh0 << 4) & 0x700),
                                   qs[2] | ((qh1 << 8) & 0x700), qs[3] | ((qh1 << 4) & 0x700));
        const __m256i shift = _mm256_setr_epi64x((long long)shift8(qh0 & 0x08), (long long)shift8(qh0 & 0x80),
                                                 (long long)shift8(qh1 & 0x08), (long long)shift8(qh1 & 0x80));
        const int sc = el_load_u16(x->scales + 2 * (b / 2)) >> 6 * (b % 2);
        return signed_run(iq1_values(grid, shift), ls16(2 * (sc & 7) + 1, 2 * ((sc >> 3) & 7) + 1));
    }
    }
}

EL_AI int iq_block_bytes(const int type) {
    switch (type) {
    case EL_TYPE_IQ4_XS: return sizeof(el_block_iq4_xs);
    case EL_TYPE_IQ2_XXS: return sizeof(el_block_iq2_xxs);
    case EL_TYPE_IQ2_XS: return sizeof(el_block_iq2_xs);
    case EL_TYPE_IQ2_S: return sizeof(el_block_iq2_s);
    case EL_TYPE_IQ3_XXS: return sizeof(el_block_iq3_xxs);
    case EL_TYPE_IQ3_S: return sizeof(el_block_iq3_s);
    case EL_TYPE_IQ1_S: return sizeof(el_block_iq1_s);
    default: return sizeof(el_block_iq1_m);
    }
}

/* The power-of-two factor of the type's scales (IQ_DOT_* in quants_iq.c). */
EL_AI float iq_factor(const int type) {
    switch (type) {
    case EL_TYPE_IQ4_XS:
    case EL_TYPE_IQ3_S: return 1.0f;
    case EL_TYPE_IQ3_XXS: return 0.25f;
    default: return 0.125f;
    }
}

/* IQ1_M's f16 super-scale, spread over the top nibbles of its four scale words. */
EL_AI float iq1_m_d(const uint8_t *blk) {
    uint16_t sc[4];
    memcpy(sc, ((const el_block_iq1_m *)blk)->scales, sizeof(sc));
    return el_fp16_to_fp32(
        (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000)));
}

/* Per lane, the super-scale d of the lane's column block at byte `off` of each row. */
EL_AI __m256 col_d(const int type, const int R, const int C, const uint8_t *const *wp, const int64_t off) {
    if (type != EL_TYPE_IQ1_M) return el_col_half16(R, C, wp, off); /* d is the block's first field */
    float d[8] = {0};
    for (int c = 0; c < C; c++) d[c] = iq1_m_d(wp[c] + off);
    return _mm256_permutevar8x32_ps(_mm256_loadu_ps(d), el_lane_cols(R, C, 1, 0));
}

/* ---- The tiles ------------------------------------------------------------------------------ */

/* sums[p] = dot(weight row wp[c(p)], activation row ap[r(p)]) over nb super-blocks, per lane
 * exactly the reference's float steps. */
EL_AI void tile_iq(const int type, const int R, const int C, const uint8_t *const *wp, const uint8_t *const *ap,
                   const int64_t nb, float *sums /* [8] */, const el_prefetch pf) {
    const int wb = iq_block_bytes(type), ab = (int)sizeof(el_block_q8_K);
    const int qs_off = offsetof(el_block_q8_K, qs);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        el_prefetch_step(pf, i);
        __m256i acc[8];
        for (int p = 0; p < 8; p++) acc[p] = _mm256_setzero_si256();
        for (int c = 0; c < C; c++) {
            const uint8_t *blk = wp[c] + i * wb;
            for (int b = 0; b < QK_K / 32; b++) {
                const iq_run run = iq_decode_run(type, blk, b);
                for (int r = 0; r < R; r++) {
                    const __m256i a = el_loadu_256(ap[r] + i * ab + qs_off + 32 * b);
                    const __m256i p16 = _mm256_maddubs_epi16(run.u, _mm256_sign_epi8(a, run.s));
                    acc[r * C + c] = _mm256_add_epi32(acc[r * C + c], _mm256_madd_epi16(p16, run.sc));
                }
            }
        }
        const __m256 isum = _mm256_cvtepi32_ps(el_reduce8_epi32(acc));
        const __m256 d = col_d(type, R, C, wp, i * wb);
        const __m256 da = el_row_f32(R, C, ap, i * ab + offsetof(el_block_q8_K, d));
        sum = _mm256_add_ps(sum, _mm256_mul_ps(_mm256_mul_ps(d, da), isum));
    }
    _mm256_storeu_ps(sums, _mm256_mul_ps(sum, _mm256_set1_ps(iq_factor(type))));
}

/* IQ4_NL against Q8_0: per 32-element block sum += (d_w * d_a) * (float)isum, as the reference. */
EL_AI void tile_iq4_nl(const int R, const int C, const uint8_t *const *wp, const uint8_t *const *ap,
                       const int64_t nb, float *sums /* [8] */, const el_prefetch pf) {
    const int wb = (int)sizeof(el_block_iq4_nl), ab = (int)sizeof(el_block_q8_0);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        el_prefetch_step(pf, i);
        __m256i acc[8];
        for (int p = R * C; p < 8; p++) acc[p] = _mm256_setzero_si256();
        for (int c = 0; c < C; c++) {
            const __m256i q = iq4_values(wp[c] + i * wb + offsetof(el_block_iq4_nl, qs));
            const __m256i u = _mm256_sign_epi8(q, q);
            for (int r = 0; r < R; r++) {
                const __m256i a = el_loadu_256(ap[r] + i * ab + offsetof(el_block_q8_0, qs));
                acc[r * C + c] = _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_sign_epi8(a, q)), ones);
            }
        }
        const __m256 isum = _mm256_cvtepi32_ps(el_reduce8_epi32(acc));
        const __m256 dw = el_col_half16(R, C, wp, i * wb);
        __m256 da, unused;
        el_row_halves(R, C, ap, i * ab, &da, &unused);
        sum = _mm256_add_ps(sum, _mm256_mul_ps(_mm256_mul_ps(dw, da), isum));
    }
    _mm256_storeu_ps(sums, sum);
}

_Static_assert(offsetof(el_block_iq4_nl, d) == 0 && offsetof(el_block_q8_0, d) == 0, "iq4_nl, q8_0 d");

/* The 32 nibbles of 16 bytes (element j low nibble, j + 16 high) through kvalues_mxfp4. */
EL_AI __m256i mxfp4_values(const uint8_t *qs) {
    const __m128i t = el_loadu_128(qs);
    const __m256i idx = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0F));
    const __m256i kv = _mm256_broadcastsi128_si256(el_loadu_128(el_kvalues_mxfp4));
    return _mm256_shuffle_epi8(kv, idx);
}

/* MXFP4 against Q8_0 (quants_mxfp4.c): per 32-element block sum += (d_a * 2^(e - 128)) * (float)isum,
 * as the reference; the weight scales are converted one column at a time and spread over the lanes. */
EL_AI void tile_mxfp4(const int R, const int C, const uint8_t *const *wp, const uint8_t *const *ap,
                      const int64_t nb, float *sums /* [8] */, const el_prefetch pf) {
    const int wb = (int)sizeof(el_block_mxfp4), ab = (int)sizeof(el_block_q8_0);
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i cols = el_lane_cols(R, C, 1, 0);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        el_prefetch_step(pf, i);
        __m256i acc[8];
        float dwc[8] = {0};
        for (int p = R * C; p < 8; p++) acc[p] = _mm256_setzero_si256();
        for (int c = 0; c < C; c++) {
            const uint8_t *blk = wp[c] + i * wb;
            dwc[c] = el_e8m0_to_fp32_half(blk[offsetof(el_block_mxfp4, e)]);
            const __m256i q = mxfp4_values(blk + offsetof(el_block_mxfp4, qs));
            const __m256i u = _mm256_sign_epi8(q, q);
            for (int r = 0; r < R; r++) {
                const __m256i a = el_loadu_256(ap[r] + i * ab + offsetof(el_block_q8_0, qs));
                acc[r * C + c] = _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_sign_epi8(a, q)), ones);
            }
        }
        const __m256 isum = _mm256_cvtepi32_ps(el_reduce8_epi32(acc));
        const __m256 dw = _mm256_permutevar8x32_ps(_mm256_loadu_ps(dwc), cols);
        __m256 da, unused;
        el_row_halves(R, C, ap, i * ab, &da, &unused);
        sum = _mm256_add_ps(sum, _mm256_mul_ps(_mm256_mul_ps(da, dw), isum));
    }
    _mm256_storeu_ps(sums, sum);
}
_Static_assert(offsetof(el_block_iq4_xs, d) == 0 && offsetof(el_block_iq2_xxs, d) == 0 &&
                   offsetof(el_block_iq2_xs, d) == 0 && offsetof(el_block_iq2_s, d) == 0 &&
                   offsetof(el_block_iq3_xxs, d) == 0 && offsetof(el_block_iq3_s, d) == 0 &&
                   offsetof(el_block_iq1_s, d) == 0,
               "the IQ super-scales lead their blocks");

/* out[r][o], tile by tile: 4x2 for batches, 2x4 for two rows, 1x8 for one (prefetching the weights
 * of the tile after next); partial tiles repeat their last row or column (computed, never stored). */
typedef void (*tile_fn)(const uint8_t *const *wp, const uint8_t *const *ap, int64_t nb, float *sums,
                        el_prefetch pf);

static void matmul_tiles_iq(tile_fn tile_4x2, tile_fn tile_2x4, tile_fn tile_1x8, const void *w,
                            int64_t w_row_bytes, const void *a, int64_t a_row_bytes, float *out, int64_t out_stride,
                            int64_t nb, int64_t n_rows, int64_t o_begin, int64_t o_end) {
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

/* A type's three tiles, vec_dot (a 1x1 tile) and matmul; TILE(R, C, wp, ap, nb, sums, pf). */
#define KERNELS_IQ(name, TILE)                                                                       \
    static void tile_##name##_4x2(const uint8_t *const *wp, const uint8_t *const *ap, int64_t nb,    \
                                  float *sums, el_prefetch pf) {                                     \
        TILE(4, 2, wp, ap, nb, sums, pf);                                                            \
    }                                                                                                \
    static void tile_##name##_2x4(const uint8_t *const *wp, const uint8_t *const *ap, int64_t nb,    \
                                  float *sums, el_prefetch pf) {                                     \
        TILE(2, 4, wp, ap, nb, sums, pf);                                                            \
    }                                                                                                \
    static void tile_##name##_1x8(const uint8_t *const *wp, const uint8_t *const *ap, int64_t nb,    \
                                  float *sums, el_prefetch pf) {                                     \
        TILE(1, 8, wp, ap, nb, sums, pf);                                                            \
    }                                                                                                \
    static float dot_##name(const void *w, const void *a, int64_t nb) {                              \
        const uint8_t *wp[1] = {w}, *ap[1] = {a};                                                    \
        float sums[8];                                                                               \
        TILE(1, 1, wp, ap, nb, sums, el_no_prefetch());                                              \
        return sums[0];                                                                              \
    }                                                                                                \
    static void matmul_##name(const void *w, int64_t w_row_bytes, const void *a, int64_t a_row_bytes, \
                              float *out, int64_t out_stride, int64_t nb, int64_t n_rows,            \
                              int64_t o_begin, int64_t o_end) {                                      \
        matmul_tiles_iq(tile_##name##_4x2, tile_##name##_2x4, tile_##name##_1x8, w, w_row_bytes, a,  \
                        a_row_bytes, out, out_stride, nb, n_rows, o_begin, o_end);                   \
    }

#define TILE_IQ4_XS(...) tile_iq(EL_TYPE_IQ4_XS, __VA_ARGS__)
#define TILE_IQ3_S(...) tile_iq(EL_TYPE_IQ3_S, __VA_ARGS__)
#define TILE_IQ3_XXS(...) tile_iq(EL_TYPE_IQ3_XXS, __VA_ARGS__)
#define TILE_IQ2_XXS(...) tile_iq(EL_TYPE_IQ2_XXS, __VA_ARGS__)
#define TILE_IQ2_XS(...) tile_iq(EL_TYPE_IQ2_XS, __VA_ARGS__)
#define TILE_IQ2_S(...) tile_iq(EL_TYPE_IQ2_S, __VA_ARGS__)
#define TILE_IQ1_S(...) tile_iq(EL_TYPE_IQ1_S, __VA_ARGS__)
#define TILE_IQ1_M(...) tile_iq(EL_TYPE_IQ1_M, __VA_ARGS__)

KERNELS_IQ(iq4_nl, tile_iq4_nl)
KERNELS_IQ(mxfp4, tile_mxfp4)
KERNELS_IQ(iq4_xs, TILE_IQ4_XS)
KERNELS_IQ(iq3_s, TILE_IQ3_S)
KERNELS_IQ(iq3_xxs, TILE_IQ3_XXS)
KERNELS_IQ(iq2_xxs, TILE_IQ2_XXS)
KERNELS_IQ(iq2_xs, TILE_IQ2_XS)
KERNELS_IQ(iq2_s, TILE_IQ2_S)
KERNELS_IQ(iq1_s, TILE_IQ1_S)
KERNELS_IQ(iq1_m, TILE_IQ1_M)

static const struct {
    int32_t type;
    el_simd_quant_kernels k;
} KERNELS[] = {
    {EL_TYPE_IQ4_NL, {NULL, dot_iq4_nl, matmul_iq4_nl}},   {EL_TYPE_IQ4_XS, {NULL, dot_iq4_xs, matmul_iq4_xs}},
    {EL_TYPE_IQ3_S, {NULL, dot_iq3_s, matmul_iq3_s}},      {EL_TYPE_IQ3_XXS, {NULL, dot_iq3_xxs, matmul_iq3_xxs}},
    {EL_TYPE_IQ2_XXS, {NULL, dot_iq2_xxs, matmul_iq2_xxs}}, {EL_TYPE_IQ2_XS, {NULL, dot_iq2_xs, matmul_iq2_xs}},
    {EL_TYPE_IQ2_S, {NULL, dot_iq2_s, matmul_iq2_s}},      {EL_TYPE_IQ1_S, {NULL, dot_iq1_s, matmul_iq1_s}},
    {EL_TYPE_IQ1_M, {NULL, dot_iq1_m, matmul_iq1_m}},      {EL_TYPE_MXFP4, {NULL, dot_mxfp4, matmul_mxfp4}},
};

const el_simd_quant_kernels *el_avx2_quant_iq(int32_t type) {
    for (size_t i = 0; i < sizeof(KERNELS) / sizeof(KERNELS[0]); i++) {
        if (KERNELS[i].type == type) return &KERNELS[i].k;
    }
    return NULL;
}

#include "avx2_target_end.h"

#endif /* __x86_64__ */

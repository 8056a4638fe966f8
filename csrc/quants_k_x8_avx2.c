/*
 * quants_k_x8_avx2.c: el_matmul_x8 for the K-quants Q4_K, Q5_K and Q6_K on AVX2, reading the
 * groups of eight rows el_repack_x8 interleaves (el_blocks.h). Bit-identical to their vec_dot.
 * Called by quants.c once AVX2 is chosen; compiled for AVX2 with a target pragma.
 *
 * A 32-bit lane per row, as quants_avx2.c's Q4_1 and Q8_0 products: one 32-byte load holds four
 * quant bytes of each of the group's rows; maddubs against four activation bytes broadcast gives
 * each row's partial sums in its lane's two 16-bit halves, added up in 16 bits while they cannot
 * overflow, and madd against the sub-block's scale (in both halves of the row's lane) turns them
 * into the row's scale * (u . a) term in 32 bits. The integers the reference forms per super-block
 * (quants_k.c's dot_sub: isum, the offset's sum and the mins' msum, through Q8_K's bsums) are exact
 * however they are added up, and the float line
 *     sum += (d * a.d) * (float)isum - (dmin * a.d) * (float)msum
 * is done lane by lane in the reference's order, so each output is el_vec_dot's, bit for bit.
 *
 * A tile is R activation rows (4, 2 or 1; rows past n_rows repeat the last, computed, never
 * stored) by one group: each weight load and its unpacking serves the R rows. One row (decode)
 * streams the matrix once, prefetching two super-blocks ahead.
 */
#if defined(__x86_64__)

#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#include "avx2_target_begin.h"

#include "el_blocks.h"
#include "simd_avx2.h"
#include "simd_internal.h"

_Static_assert(offsetof(el_block_q8_K, qs) == 4 && offsetof(el_block_q8_K, bsums) == 4 + QK_K, "q8_K");

/* Bytes j0 and j1 (0..3) of each row's 32-bit lane as the lane's two 16-bit halves, zero-extended
 * (sign-extended with is_signed). */
EL_AI __m256i row_bytes16(const __m256i v, const int j0, const int j1, const int is_signed) {
    const __m256i lane_base = _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0C0C0C0C, 0, 0x04040404, 0x08080808,
                                                0x0C0C0C0C); /* 4c' in every byte of lane c' of a 128-bit half */
    /* the byte to take into the low or high byte of each half; 0x80: a zero */
    const int pick = is_signed ? 0x80 | j0 << 8 | 0x80 << 16 | j1 << 24 : j0 | 0x80 << 8 | j1 << 16 | 0x80 << 24;
    const __m256i v16 = _mm256_shuffle_epi8(v, _mm256_or_si256(lane_base, _mm256_set1_epi32(pick)));
    return is_signed ? _mm256_srai_epi16(v16, 8) : v16;
}

/* The four activation bytes at p in every 32-bit lane. */
EL_AI __m256i broadcast4(const uint8_t *p) { return _mm256_set1_epi32((int)el_load_u32(p)); }

/* The float line of every row r < R: sum[r] += (d * a.d) * isum - (dmin * a.d) * msum, lane by lane. */
EL_AI void add_block(const int R, const __m256 d, const __m256 dmin, const uint8_t *const *act, const __m256i *isum,
                     const __m256i *msum, __m256 *sum) {
    for (int r = 0; r < R; r++) {
        const __m256 da = _mm256_broadcast_ss((const float *)act[r]);
        const __m256 t = _mm256_sub_ps(_mm256_mul_ps(_mm256_mul_ps(d, da), _mm256_cvtepi32_ps(isum[r])),
                                       _mm256_mul_ps(_mm256_mul_ps(dmin, da), _mm256_cvtepi32_ps(msum[r])));
        sum[r] = _mm256_add_ps(sum[r], t);
    }
}

/* Keeps a tile's R running sums in registers: left alone, the compiler reassociates the integer
 * adds into one tree per row, computes every product first and spills them (as quants_avx2.c's
 * Q4_1 tiles); with this, Q4_K's 4-row tile runs about 1.3x faster (Q6_K's, slower: not used). */
EL_AI void keep_in_registers(const int R, __m256i *v) {
    if (R >= 2) __asm__("" : "+x"(v[0]), "+x"(v[1]));
    if (R == 4) __asm__("" : "+x"(v[2]), "+x"(v[3]));
}

EL_AI void prefetch_block(const uint8_t *b, const int64_t bytes) {
    for (int64_t l = 0; l < bytes; l += 64) _mm_prefetch((const char *)b + l, _MM_HINT_T0);
}

/* ---- Q4_K and Q5_K -------------------------------------------------------------------------------
 * Pair p of sub-blocks (2p in the low nibbles, 2p + 1 in the high ones) is eight loads; the 16-bit
 * halves add up to 8 * 2 * 15 * 127 = 30480 for Q4_K, 4 * 2 * 31 * 127 = 31496 for Q5_K's four
 * loads between madds. The mins' msum is sum_j min[j] (bsums[2j] + bsums[2j + 1]). */

/* The eight rows' 6-bit scales and mins (quants_k_avx2.c's k4_scales, a row per lane): sc[0] bytes
 * 0..3 are a row's scales 0..3, sc[1] its scales 4..7; mn likewise. */
EL_AI void k4x8_scales(const uint8_t (*packed)[8][4], __m256i sc[2], __m256i mn[2]) {
    const __m256i w0 = el_loadu_256(packed[0]), w1 = el_loadu_256(packed[1]), w2 = el_loadu_256(packed[2]);
    const __m256i m6 = _mm256_set1_epi8(0x3F), m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03);
    sc[0] = _mm256_and_si256(w0, m6);
    mn[0] = _mm256_and_si256(w1, m6);
    sc[1] = _mm256_or_si256(_mm256_and_si256(w2, m4),
                            _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w0, 6), m2), 4));
    mn[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w2, 4), m4),
                            _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w1, 6), m2), 4));
}

EL_AI void tile_k4x8(const int type, const int R, const uint8_t *grp, const uint8_t *const *rows, const int64_t nb,
                     __m256 *sum) {
    const int q5 = type == EL_TYPE_Q5_K;
    const int64_t gb = q5 ? sizeof(el_block_q5_Kx8) : sizeof(el_block_q4_Kx8);
    const int steps = q5 ? 4 : 8; /* loads added in 16 bits before a madd */
    const __m256i low4 = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *b = grp + i * gb;
        if (R == 1) prefetch_block(b + 2 * gb, gb);
        const uint8_t(*scales)[8][4] = q5 ? ((const el_block_q5_Kx8 *)b)->scales : ((const el_block_q4_Kx8 *)b)->scales;
        const uint8_t(*qs)[8][4] = q5 ? ((const el_block_q5_Kx8 *)b)->qs : ((const el_block_q4_Kx8 *)b)->qs;
        const uint8_t *act[4];
        for (int r = 0; r < R; r++) act[r] = rows[r] + i * sizeof(el_block_q8_K);
        __m256i sc[2], mn[2], isum[4], msum[4];
        k4x8_scales(scales, sc, mn);
        for (int r = 0; r < R; r++) isum[r] = _mm256_setzero_si256();
        for (int p = 0; p < 4; p++) {
            const int j = 2 * p; /* sub-blocks j (low nibbles) and j + 1 (high) */
            const __m256i sc_lo = row_bytes16(sc[j / 4], j % 4, j % 4, 0);
            const __m256i sc_hi = row_bytes16(sc[j / 4], j % 4 + 1, j % 4 + 1, 0);
            for (int k0 = 0; k0 < 8; k0 += steps) {
                __m256i lo16[4], hi16[4];
                for (int r = 0; r < R; r++) lo16[r] = hi16[r] = _mm256_setzero_si256();
                for (int k = k0; k < k0 + steps; k++) {
                    const __m256i w = el_loadu_256(qs[8 * p + k]);
                    __m256i lo = _mm256_and_si256(w, low4), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low4);
                    if (q5) { /* fifth bits: bit j of qh for sub-block j */
                        const __m256i h = el_loadu_256(((const el_block_q5_Kx8 *)b)->qh[k]);
                        lo = _mm256_or_si256(lo, _mm256_and_si256(el_shift_bytes(h, 4 - j), bit4));
                        hi = _mm256_or_si256(hi, _mm256_and_si256(el_shift_bytes(h, 3 - j), bit4));
                    }
                    for (int r = 0; r < R; r++) {
                        const uint8_t *aq = act[r] + offsetof(el_block_q8_K, qs) + 64 * p + 4 * k;
                        lo16[r] = _mm256_add_epi16(lo16[r], _mm256_maddubs_epi16(lo, broadcast4(aq)));
                        hi16[r] = _mm256_add_epi16(hi16[r], _mm256_maddubs_epi16(hi, broadcast4(aq + 32)));
                    }
                    keep_in_registers(R, lo16);
                    keep_in_registers(R, hi16);
                }
                for (int r = 0; r < R; r++) {
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(_mm256_madd_epi16(lo16[r], sc_lo),
                                                                         _mm256_madd_epi16(hi16[r], sc_hi)));
                }
            }
        }
        /* min pairs (j, j + 1) of each row against (bsums[2j] + bsums[2j + 1], the same of j + 1) */
        const __m256i mins[4] = {row_bytes16(mn[0], 0, 1, 0), row_bytes16(mn[0], 2, 3, 0), row_bytes16(mn[1], 0, 1, 0),
                                 row_bytes16(mn[1], 2, 3, 0)};
        for (int r = 0; r < R; r++) {
            const uint8_t *bsums = act[r] + offsetof(el_block_q8_K, bsums);
            const __m128i pairs = _mm_hadd_epi16(el_loadu_128(bsums), el_loadu_128(bsums + 16));
            const __m256i bp = _mm256_broadcastsi128_si256(pairs);
            const __m256i m01 = _mm256_madd_epi16(mins[0], _mm256_shuffle_epi32(bp, 0x00));
            const __m256i m23 = _mm256_madd_epi16(mins[1], _mm256_shuffle_epi32(bp, 0x55));
            const __m256i m45 = _mm256_madd_epi16(mins[2], _mm256_shuffle_epi32(bp, 0xAA));
            const __m256i m67 = _mm256_madd_epi16(mins[3], _mm256_shuffle_epi32(bp, 0xFF));
            msum[r] = _mm256_add_epi32(_mm256_add_epi32(m01, m23), _mm256_add_epi32(m45, m67));
        }
        const uint16_t *d = ((const el_block_q4_Kx8 *)b)->d, *dmin = ((const el_block_q4_Kx8 *)b)->dmin;
        add_block(R, _mm256_cvtph_ps(el_loadu_128(d)), _mm256_cvtph_ps(el_loadu_128(dmin)), act, isum, msum, sum);
    }
}

_Static_assert(offsetof(el_block_q5_Kx8, d) == offsetof(el_block_q4_Kx8, d) &&
                   offsetof(el_block_q5_Kx8, dmin) == offsetof(el_block_q4_Kx8, dmin),
               "Q5_K's group starts as Q4_K's");

/* ---- Q6_K -----------------------------------------------------------------------------------------
 * Run 4h + k (32 elements; sub-blocks 2(4h + k) and + 1) takes its low nibbles from ql unit
 * 16h + 8 (k % 2) + m (nibble k / 2) and its top bits from qh unit 8h + m (bits 2k), m = 0..7 four
 * elements each. A madd after every two loads: 2 * 2 * 63 * 127 = 32004. The offset's sum
 * sum_g scale[g] bsums[g] (times 32) comes off isum as in the reference. */

/* The quants of run 4h + k, elements 4m..4m+3, of the eight rows. */
EL_AI __m256i q6x8_quants(const el_block_q6_Kx8 *b, const int h, const int k, const int m) {
    const __m256i ql = el_loadu_256(b->ql[16 * h + 8 * (k % 2) + m]), qh = el_loadu_256(b->qh[8 * h + m]);
    const __m256i lo = _mm256_and_si256(el_shift_bytes(ql, -4 * (k / 2)), _mm256_set1_epi8(0x0F));
    return _mm256_or_si256(lo, _mm256_and_si256(el_shift_bytes(qh, 4 - 2 * k), _mm256_set1_epi8(0x30)));
}

/* isum += sum_j sc[j] (u . a)_j over the super-block, for the R rows. A tile goes run by run (one
 * 16-bit sum per row live); one row goes four elements at a time through the four runs that
 * share their ql and qh loads (four sums live), 1.3x faster alone and slower in a tile's
 * registers. */
EL_AI void q6x8_isums(const int R, const el_block_q6_Kx8 *b, const uint8_t *const *act, const __m256i *sc,
                      __m256i *isum) {
    const int qs = offsetof(el_block_q8_K, qs);
    for (int h = 0; h < 2; h++) {
        if (R == 1) {
            for (int m = 0; m < 8; m += 2) { /* sub-blocks 2 (4h + k) + m / 4 */
                __m256i acc[4];
                for (int k = 0; k < 4; k++) {
                    const uint8_t *aq = act[0] + qs + 32 * (4 * h + k) + 4 * m;
                    acc[k] = _mm256_add_epi16(_mm256_maddubs_epi16(q6x8_quants(b, h, k, m), broadcast4(aq)),
                                              _mm256_maddubs_epi16(q6x8_quants(b, h, k, m + 1), broadcast4(aq + 4)));
                }
                for (int k = 0; k < 4; k++) {
                    isum[0] = _mm256_add_epi32(isum[0], _mm256_madd_epi16(acc[k], sc[2 * (4 * h + k) + m / 4]));
                }
            }
            continue;
        }
        for (int k = 0; k < 4; k++) {
            for (int m = 0; m < 8; m += 2) {
                const __m256i u0 = q6x8_quants(b, h, k, m), u1 = q6x8_quants(b, h, k, m + 1);
                for (int r = 0; r < R; r++) {
                    const uint8_t *aq = act[r] + qs + 32 * (4 * h + k) + 4 * m;
                    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(u0, broadcast4(aq)),
                                                       _mm256_maddubs_epi16(u1, broadcast4(aq + 4)));
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p, sc[2 * (4 * h + k) + m / 4]));
                }
            }
        }
    }
}

EL_AI void tile_q6x8(const int R, const uint8_t *grp, const uint8_t *const *rows, const int64_t nb, __m256 *sum) {
    for (int64_t i = 0; i < nb; i++) {
        const el_block_q6_Kx8 *b = (const el_block_q6_Kx8 *)grp + i;
        if (R == 1) prefetch_block((const uint8_t *)(b + 2), sizeof(*b));
        const uint8_t *act[4];
        for (int r = 0; r < R; r++) act[r] = rows[r] + i * sizeof(el_block_q8_K);
        __m256i sc[QK_K / 16]; /* sub-block j's scale in both halves of each row's lane */
        for (int j = 0; j < QK_K / 16; j++) sc[j] = row_bytes16(el_loadu_256(b->scales[j / 4]), j % 4, j % 4, 1);
        __m256i isum[4], msum[4];
        for (int r = 0; r < R; r++) isum[r] = msum[r] = _mm256_setzero_si256();
        q6x8_isums(R, b, act, sc, isum);
        /* scale pairs (2q, 2q + 1) of each row against (bsums[2q], bsums[2q + 1]) */
        __m256i osum[4];
        for (int r = 0; r < R; r++) osum[r] = _mm256_setzero_si256();
        for (int q = 0; q < 8; q++) {
            const __m256i pair = row_bytes16(el_loadu_256(b->scales[q / 2]), 2 * (q % 2), 2 * (q % 2) + 1, 1);
            for (int r = 0; r < R; r++) {
                const uint8_t *bsums = act[r] + offsetof(el_block_q8_K, bsums);
                osum[r] = _mm256_add_epi32(osum[r], _mm256_madd_epi16(pair, broadcast4(bsums + 4 * q)));
            }
        }
        for (int r = 0; r < R; r++) isum[r] = _mm256_sub_epi32(isum[r], _mm256_slli_epi32(osum[r], 5));
        add_block(R, _mm256_cvtph_ps(el_loadu_128(b->d)), _mm256_setzero_ps(), act, isum, msum, sum);
    }
}

/* ---- The product --------------------------------------------------------------------------------- */

EL_AI void tile(const int type, const int R, const uint8_t *grp, const uint8_t *const *rows, const int64_t nb,
                __m256 *sum) {
    if (type == EL_TYPE_Q6_K) tile_q6x8(R, grp, rows, nb, sum);
    else tile_k4x8(type, R, grp, rows, nb, sum);
}

/* Rows [r0, r0 + R) by groups [g_begin, g_end). */
EL_AI void rows_x8(const int type, const int R, const uint8_t *w8, const uint8_t *a8, const int64_t a_row_bytes,
                   const int64_t r0, const int64_t n_rows, float *out, const int64_t out_stride, const int64_t nb,
                   const int64_t g_begin, const int64_t g_end) {
    const int64_t left = n_rows - r0, group_bytes = nb * 8 * el_type_block_bytes(type);
    const uint8_t *rows[4];
    for (int r = 0; r < R; r++) rows[r] = a8 + (r0 + (r < left ? r : left - 1)) * a_row_bytes;
    for (int64_t g = g_begin; g < g_end; g++) {
        __m256 sum[4];
        for (int r = 0; r < R; r++) sum[r] = _mm256_setzero_ps();
        tile(type, R, w8 + g * group_bytes, rows, nb, sum);
        for (int r = 0; r < R && r < left; r++) _mm256_storeu_ps(out + (r0 + r) * out_stride + 8 * g, sum[r]);
    }
}

/* 4-row tiles while three or more rows are left, then a 2-row or a 1-row one. */
EL_AI void matmul_x8_k(const int type, const uint8_t *w8, const uint8_t *a8, const int64_t a_row_bytes, float *out,
                       const int64_t out_stride, const int64_t nb, const int64_t n_rows, const int64_t g_begin,
                       const int64_t g_end) {
    for (int64_t r0 = 0; r0 < n_rows;) {
        const int64_t left = n_rows - r0;
        if (left >= 3) {
            rows_x8(type, 4, w8, a8, a_row_bytes, r0, n_rows, out, out_stride, nb, g_begin, g_end);
            r0 += 4;
        } else if (left == 2) {
            rows_x8(type, 2, w8, a8, a_row_bytes, r0, n_rows, out, out_stride, nb, g_begin, g_end);
            r0 += 2;
        } else {
            rows_x8(type, 1, w8, a8, a_row_bytes, r0, n_rows, out, out_stride, nb, g_begin, g_end);
            r0 += 1;
        }
    }
}

void el_matmul_x8_k_avx2(int32_t type, const void *w8, const void *a, int64_t a_row_bytes, float *out,
                         int64_t out_stride, int64_t nb, int64_t n_rows, int64_t g_begin, int64_t g_end) {
    switch (type) {
    case EL_TYPE_Q4_K:
        matmul_x8_k(EL_TYPE_Q4_K, w8, a, a_row_bytes, out, out_stride, nb, n_rows, g_begin, g_end);
        break;
    case EL_TYPE_Q5_K:
        matmul_x8_k(EL_TYPE_Q5_K, w8, a, a_row_bytes, out, out_stride, nb, n_rows, g_begin, g_end);
        break;
    default: /* EL_TYPE_Q6_K */
        matmul_x8_k(EL_TYPE_Q6_K, w8, a, a_row_bytes, out, out_stride, nb, n_rows, g_begin, g_end);
        break;
    }
}

#include "avx2_target_end.h"

#endif /* __x86_64__ */

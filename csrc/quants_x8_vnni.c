/*
 * quants_x8_vnni.c: el_matmul_x8 for every interleaved type (Q4_1, Q8_0, Q4_K, Q5_K, Q6_K) with
 * AVX-512 VNNI, reading the groups of eight rows el_repack_x8 interleaves (el_blocks.h). Called by
 * quants.c once EL_ISA_AVX512VNNI is chosen; compiled for AVX2 + AVX-512 F/BW/VL/VNNI with a
 * target pragma (avx512_target_begin.h), so the library still runs on CPUs without them.
 * Bit-identical to the references (quants.c's matvec_x8_ref and matvec_k_x8_ref), as the AVX2
 * tiles in quants_avx2.c and quants_k_x8_avx2.c are.
 *
 * The layout puts a row per 32-bit lane: one 32-byte load holds four quant bytes of each of a
 * group's eight rows, and vpdpbusd (256-bit, the AVX-512 VL form) against four activation bytes
 * broadcast from memory adds each row's four products into its lane's 32-bit sum in one
 * instruction, where AVX2 needs maddubs, an add in 16 bits and madd. The weights are the unsigned
 * side (the K-quants' and Q4_1's quants are unsigned; Q8_0's are flipped to w + 128 and the
 * activation block's 128 * sum(a), computed once per row and block, taken off again). Every
 * integer sum the reference forms per block is exact however it is added up (at most
 * 32 * 255 * 127 per sub-block lane, far inside 32 bits), so only the float line must follow the
 * reference: it is the AVX2 tiles' line, lane by lane, in the reference's order:
 *   Q4_1: sum += (d * a.d) * (float)isum + m * a.s        Q8_0: sum += (d * a.d) * (float)isum
 *   K:    sum += (d * a.d) * (float)isum - (dmin * a.d) * (float)msum
 * The K-quants' sub-block scales multiply their sub-block's 32-bit sum (vpmulld) where AVX2 used
 * madd on 16-bit sums.
 *
 * A tile is R activation rows (8, 4, 2 or 1: as many as are left, largest first) by one group of
 * eight weight rows; each weight load and its unpacking serves the R rows. Each row keeps two
 * independent sums so that vpdpbusd's latency does not bound a small tile. One row (decode)
 * streams the matrix once with prefetches ahead. The 32-element types read their activation
 * rows' scales (and Q8_0's offsets) from a per-chunk table made once per R rows for every group
 * of the task: chunks of X8V_CHUNK blocks, the running float sums carried across chunks through
 * the output (the same adds in the same order).
 */
#if defined(__x86_64__)

#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#include "avx512_target_begin.h"

#include "el_blocks.h"
#include "simd_avx2.h"
#include "simd_internal.h"

/* acc += the products of each lane's four unsigned bytes of u with the four signed activation
 * bytes at a (broadcast from memory: vpdpbusd's embedded broadcast). */
#ifndef X8V_NO_ASM_BCST
EL_AI __m256i dp4(__m256i acc, const __m256i u, const uint8_t *a) {
    __asm__("vpdpbusd %2%{1to8%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const uint32_t *)a));
    return acc;
}
/* acc += each lane's two signed 16-bit halves of v times the two int16 at a (vpdpwssd, the pair
 * broadcast from memory). */
EL_AI __m256i dp2x16(__m256i acc, const __m256i v, const uint8_t *a) {
    __asm__("vpdpwssd %2%{1to8%}, %1, %0" : "+v"(acc) : "v"(v), "m"(*(const uint32_t *)a));
    return acc;
}
#else
EL_AI __m256i dp4(const __m256i acc, const __m256i u, const uint8_t *a) {
    return _mm256_dpbusd_epi32(acc, u, _mm256_set1_epi32((int)el_load_u32(a)));
}
EL_AI __m256i dp2x16(const __m256i acc, const __m256i v, const uint8_t *a) {
    return _mm256_dpwssd_epi32(acc, v, _mm256_set1_epi32((int)el_load_u32(a)));
}
#endif

EL_AI void prefetch_bytes(const uint8_t *p, const int64_t bytes) {
    for (int64_t l = 0; l < bytes; l += 64) _mm_prefetch((const char *)p + l, _MM_HINT_T0);
}

/* The tile heights: 8 rows while eight are left (Q8_0: 4; 8 measured 5-10% slower there), then 4,
 * 2, 1, so no row is computed twice. */
#define X8V_RMAX 8

/* Unrolls the loop that follows (its indices pick shifts and offsets that must be constants). */
#if defined(__clang__)
#define UNROLL(n) _Pragma("clang loop unroll(full)")
#else
#define UNROLL_(n) _Pragma(#n)
#define UNROLL(n) UNROLL_(GCC unroll n)
#endif
EL_AI int tile_rows(const int64_t left, const int most) { return left >= 8 && most >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1; }

/* ==== Q4_1 and Q8_0 ================================================================================ */

/* Blocks per chunk of the activation table. */
#define X8V_CHUNK 128

/* A chunk's activation table for R rows: per block i and row r, at i * R + r, the row's d as a
 * float and, for Q4_1, s as a float (aux) or, for Q8_0, 128 * the sum of its quants (corr). */
typedef struct {
    float d[X8V_CHUNK * X8V_RMAX];
    float s[X8V_CHUNK * X8V_RMAX];
    int32_t corr[X8V_CHUNK * X8V_RMAX];
} act_table;

EL_AI void fill_table(const int q4_1, const int R, const uint8_t *const *rows, const int64_t i0, const int64_t n,
                      act_table *t) {
    for (int64_t i = 0; i < n; i++) {
        for (int r = 0; r < R; r++) {
            if (q4_1) {
                const uint8_t *blk = rows[r] + (i0 + i) * (int64_t)sizeof(el_block_q8_1);
                const __m128 ds = _mm_cvtph_ps(_mm_cvtsi32_si128((int)el_load_u32(blk))); /* d, s */
                t->d[i * R + r] = _mm_cvtss_f32(ds);
                t->s[i * R + r] = _mm_cvtss_f32(_mm_movehdup_ps(ds));
            } else {
                const uint8_t *blk = rows[r] + (i0 + i) * (int64_t)sizeof(el_block_q8_0);
                t->d[i * R + r] = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128((int)el_load_u16(blk))));
                /* sum(a) = sum(a + 128 as bytes) - 32 * 128 */
                const __m256i q = _mm256_xor_si256(el_loadu_256(blk + offsetof(el_block_q8_0, qs)), _mm256_set1_epi8((char)0x80));
                const __m256i s4 = _mm256_sad_epu8(q, _mm256_setzero_si256());
                const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
                const int64_t sum = _mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1) - 32 * 128;
                t->corr[i * R + r] = (int32_t)(128 * sum);
            }
        }
    }
}

/* R rows by one group over blocks [i0, i0 + n) (b: the group's block i0), adding to sum[R]. */
EL_AI void tile_q4_1(const int R, const el_block_q4_1x8 *b, const uint8_t *const *rows, const int64_t i0,
                     const int64_t n, const act_table *t, __m256 *sum) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (int64_t i = 0; i < n; i++) {
        if (R == 1) prefetch_bytes((const uint8_t *)(b + i + 16), sizeof(*b));
        __m256i lo[X8V_RMAX], hi[X8V_RMAX];
        for (int r = 0; r < R; r++) lo[r] = hi[r] = _mm256_setzero_si256();
        const int64_t at = (i0 + i) * (int64_t)sizeof(el_block_q8_1) + offsetof(el_block_q8_1, qs);
        UNROLL(4) for (int k = 0; k < 4; k++) {
            const __m256i w = el_loadu_256(b[i].qs[k]);
            const __m256i wl = _mm256_and_si256(w, low4), wh = _mm256_and_si256(_mm256_srli_epi16(w, 4), low4);
            for (int r = 0; r < R; r++) {
                lo[r] = dp4(lo[r], wl, rows[r] + at + 4 * k);
                hi[r] = dp4(hi[r], wh, rows[r] + at + 16 + 4 * k);
            }
        }
        const __m256 dw = _mm256_cvtph_ps(el_loadu_128(b[i].d)), mw = _mm256_cvtph_ps(el_loadu_128(b[i].m));
        for (int r = 0; r < R; r++) {
            const __m256 isum = _mm256_cvtepi32_ps(_mm256_add_epi32(lo[r], hi[r]));
            __m256 v = _mm256_mul_ps(_mm256_mul_ps(dw, _mm256_set1_ps(t->d[i * R + r])), isum);
            v = _mm256_add_ps(v, _mm256_mul_ps(mw, _mm256_set1_ps(t->s[i * R + r])));
            sum[r] = _mm256_add_ps(sum[r], v);
        }
    }
}

EL_AI void tile_q8_0(const int R, const el_block_q8_0x8 *b, const uint8_t *const *rows, const int64_t i0,
                     const int64_t n, const act_table *t, __m256 *sum) {
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    for (int64_t i = 0; i < n; i++) {
        if (R == 1) prefetch_bytes((const uint8_t *)(b + i + 16), sizeof(*b));
        __m256i ev[X8V_RMAX], od[X8V_RMAX];
        for (int r = 0; r < R; r++) ev[r] = od[r] = _mm256_setzero_si256();
        const int64_t at = (i0 + i) * (int64_t)sizeof(el_block_q8_0) + offsetof(el_block_q8_0, qs);
        UNROLL(4) for (int k = 0; k < 8; k += 2) {
            const __m256i w0 = _mm256_xor_si256(el_loadu_256(b[i].qs[k]), flip);
            const __m256i w1 = _mm256_xor_si256(el_loadu_256(b[i].qs[k + 1]), flip);
            for (int r = 0; r < R; r++) {
                ev[r] = dp4(ev[r], w0, rows[r] + at + 4 * k);
                od[r] = dp4(od[r], w1, rows[r] + at + 4 * k + 4);
            }
        }
        const __m256 dw = _mm256_cvtph_ps(el_loadu_128(b[i].d));
        for (int r = 0; r < R; r++) {
            const __m256i isum =
                _mm256_sub_epi32(_mm256_add_epi32(ev[r], od[r]), _mm256_set1_epi32(t->corr[i * R + r]));
            sum[r] = _mm256_add_ps(sum[r], _mm256_mul_ps(_mm256_mul_ps(dw, _mm256_set1_ps(t->d[i * R + r])),
                                                         _mm256_cvtepi32_ps(isum)));
        }
    }
}

/* Rows [r0, r0 + R) by groups [g_begin, g_end), chunk by chunk of the activation table. */
EL_AI void rows_32(const int q4_1, const int R, const uint8_t *w8, const uint8_t *a8, const int64_t a_row_bytes,
                   const int64_t r0, float *out, const int64_t out_stride, const int64_t nb, const int64_t g_begin,
                   const int64_t g_end, act_table *t) {
    const uint8_t *rows[X8V_RMAX];
    for (int r = 0; r < R; r++) rows[r] = a8 + (r0 + r) * a_row_bytes;
    for (int64_t i0 = 0; i0 < nb; i0 += X8V_CHUNK) {
        const int64_t n = nb - i0 < X8V_CHUNK ? nb - i0 : X8V_CHUNK;
        fill_table(q4_1, R, rows, i0, n, t);
        for (int64_t g = g_begin; g < g_end; g++) {
            float *o = out + r0 * out_stride + 8 * g;
            __m256 sum[X8V_RMAX];
            for (int r = 0; r < R; r++) sum[r] = i0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(o + r * out_stride);
            if (q4_1) tile_q4_1(R, (const el_block_q4_1x8 *)w8 + g * nb + i0, rows, i0, n, t, sum);
            else tile_q8_0(R, (const el_block_q8_0x8 *)w8 + g * nb + i0, rows, i0, n, t, sum);
            for (int r = 0; r < R; r++) _mm256_storeu_ps(o + r * out_stride, sum[r]);
        }
    }
}

static void matmul_32(const int q4_1, const uint8_t *w8, const uint8_t *a8, const int64_t a_row_bytes, float *out,
                      const int64_t out_stride, const int64_t nb, const int64_t n_rows, const int64_t g_begin,
                      const int64_t g_end) {
    act_table t;
    for (int64_t r0 = 0; r0 < n_rows;) {
        const int R = tile_rows(n_rows - r0, q4_1 ? 8 : 4);
#define ROWS_32(Q, RR) rows_32(Q, RR, w8, a8, a_row_bytes, r0, out, out_stride, nb, g_begin, g_end, &t)
        if (q4_1) {
            if (R == 8) ROWS_32(1, 8);
            else if (R == 4) ROWS_32(1, 4);
            else if (R == 2) ROWS_32(1, 2);
            else ROWS_32(1, 1);
        } else {
            if (R == 8) ROWS_32(0, 8);
            else if (R == 4) ROWS_32(0, 4);
            else if (R == 2) ROWS_32(0, 2);
            else ROWS_32(0, 1);
        }
#undef ROWS_32
        r0 += R;
    }
}

/* ==== The K-quants ================================================================================= */

_Static_assert(offsetof(el_block_q8_K, qs) == 4 && offsetof(el_block_q8_K, bsums) == 4 + QK_K, "q8_K");
_Static_assert(offsetof(el_block_q5_Kx8, d) == offsetof(el_block_q4_Kx8, d) &&
                   offsetof(el_block_q5_Kx8, dmin) == offsetof(el_block_q4_Kx8, dmin),
               "Q5_K's group starts as Q4_K's");

/* Bytes j0 and j1 (0..3) of each row's 32-bit lane as the lane's two 16-bit halves, zero-extended
 * (sign-extended with is_signed); as quants_k_x8_avx2.c's. */
EL_AI __m256i row_bytes16(const __m256i v, const int j0, const int j1, const int is_signed) {
    const __m256i lane_base = _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0C0C0C0C, 0, 0x04040404, 0x08080808,
                                                0x0C0C0C0C);
    const int pick = is_signed ? 0x80 | j0 << 8 | 0x80 << 16 | j1 << 24 : j0 | 0x80 << 8 | j1 << 16 | 0x80 << 24;
    const __m256i v16 = _mm256_shuffle_epi8(v, _mm256_or_si256(lane_base, _mm256_set1_epi32(pick)));
    return is_signed ? _mm256_srai_epi16(v16, 8) : v16;
}

/* Byte j (0..3) of each row's lane as the lane's 32-bit value, zero-extended (sign-extended with
 * is_signed). */
EL_AI __m256i row_byte32(const __m256i v, const int j, const int is_signed) {
    return is_signed ? _mm256_srai_epi32(_mm256_slli_epi32(v, 24 - 8 * j), 24)
                     : _mm256_and_si256(_mm256_srli_epi32(v, 8 * j), _mm256_set1_epi32(0xFF));
}

/* The float line of every row r < R: sum[r] += (d * a.d) * isum - (dmin * a.d) * msum, lane by
 * lane (quants_k_x8_avx2.c's add_block). */
EL_AI void add_block(const int R, const __m256 d, const __m256 dmin, const uint8_t *const *act, const __m256i *isum,
                     const __m256i *msum, __m256 *sum) {
    for (int r = 0; r < R; r++) {
        const __m256 da = _mm256_broadcast_ss((const float *)act[r]);
        const __m256 t = _mm256_sub_ps(_mm256_mul_ps(_mm256_mul_ps(d, da), _mm256_cvtepi32_ps(isum[r])),
                                       _mm256_mul_ps(_mm256_mul_ps(dmin, da), _mm256_cvtepi32_ps(msum[r])));
        sum[r] = _mm256_add_ps(sum[r], t);
    }
}

/* The eight rows' 6-bit scales and mins (quants_k_x8_avx2.c's k4x8_scales): sc[0] bytes 0..3 are
 * a row's scales 0..3, sc[1] its scales 4..7; mn likewise. */
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

/* Q4_K and Q5_K: pair p of sub-blocks (2p in the low nibbles, 2p + 1 in the high ones) is eight
 * loads, each with a vpdpbusd per row into the low and the high sub-block's sums; each sum times
 * its sub-block's scale goes into isum. The mins' msum is sum_j min[j] (bsums[2j] + bsums[2j + 1]),
 * as the AVX2 tile makes it. */
EL_AI void tile_k4(const int q5, const int R, const uint8_t *grp, const uint8_t *const *rows, const int64_t nb,
                   __m256 *sum) {
    const int64_t gb = q5 ? sizeof(el_block_q5_Kx8) : sizeof(el_block_q4_Kx8);
    const __m256i low4 = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *b = grp + i * gb;
        if (R == 1) prefetch_bytes(b + 2 * gb, gb);
        const uint8_t(*scales)[8][4] = q5 ? ((const el_block_q5_Kx8 *)b)->scales : ((const el_block_q4_Kx8 *)b)->scales;
        const uint8_t(*qs)[8][4] = q5 ? ((const el_block_q5_Kx8 *)b)->qs : ((const el_block_q4_Kx8 *)b)->qs;
        const uint8_t *act[X8V_RMAX];
        for (int r = 0; r < R; r++) act[r] = rows[r] + i * (int64_t)sizeof(el_block_q8_K);
        __m256i sc[2], mn[2], isum[X8V_RMAX], msum[X8V_RMAX];
        k4x8_scales(scales, sc, mn);
        for (int r = 0; r < R; r++) isum[r] = _mm256_setzero_si256();
        UNROLL(4) for (int p = 0; p < 4; p++) {
            const int j = 2 * p; /* sub-blocks j (low nibbles) and j + 1 (high) */
            __m256i lo[X8V_RMAX], hi[X8V_RMAX];
            for (int r = 0; r < R; r++) lo[r] = hi[r] = _mm256_setzero_si256();
            UNROLL(8) for (int k = 0; k < 8; k++) {
                const __m256i w = el_loadu_256(qs[8 * p + k]);
                __m256i wl = _mm256_and_si256(w, low4), wh = _mm256_and_si256(_mm256_srli_epi16(w, 4), low4);
                if (q5) { /* fifth bits: bit j of qh for sub-block j */
                    const __m256i h = el_loadu_256(((const el_block_q5_Kx8 *)b)->qh[k]);
                    wl = _mm256_or_si256(wl, _mm256_and_si256(el_shift_bytes(h, 4 - j), bit4));
                    wh = _mm256_or_si256(wh, _mm256_and_si256(el_shift_bytes(h, 3 - j), bit4));
                }
                for (int r = 0; r < R; r++) {
                    const uint8_t *aq = act[r] + offsetof(el_block_q8_K, qs) + 64 * p + 4 * k;
                    lo[r] = dp4(lo[r], wl, aq);
                    hi[r] = dp4(hi[r], wh, aq + 32);
                }
            }
            const __m256i sc_lo = row_byte32(sc[j / 4], j % 4, 0), sc_hi = row_byte32(sc[j / 4], j % 4 + 1, 0);
            for (int r = 0; r < R; r++) {
                isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(_mm256_mullo_epi32(lo[r], sc_lo),
                                                                     _mm256_mullo_epi32(hi[r], sc_hi)));
            }
        }
        /* min j of each row (in both halves of its lane) against (bsums[2j], bsums[2j + 1]) */
        __m256i mins[8];
        UNROLL(8) for (int j = 0; j < 8; j++) mins[j] = row_bytes16(mn[j / 4], j % 4, j % 4, 0);
        for (int r = 0; r < R; r++) {
            const uint8_t *bsums = act[r] + offsetof(el_block_q8_K, bsums);
            __m256i m0 = _mm256_setzero_si256(), m1 = _mm256_setzero_si256();
            UNROLL(4) for (int j = 0; j < 8; j += 2) {
                m0 = dp2x16(m0, mins[j], bsums + 4 * j);
                m1 = dp2x16(m1, mins[j + 1], bsums + 4 * j + 4);
            }
            msum[r] = _mm256_add_epi32(m0, m1);
        }
        const uint16_t *d = ((const el_block_q4_Kx8 *)b)->d, *dmin = ((const el_block_q4_Kx8 *)b)->dmin;
        add_block(R, _mm256_cvtph_ps(el_loadu_128(d)), _mm256_cvtph_ps(el_loadu_128(dmin)), act, isum, msum, sum);
    }
}

/* Q6_K: the quants of run 4h + k, elements 4m..4m+3, of the eight rows (quants_k_x8_avx2.c's). */
EL_AI __m256i q6x8_quants(const el_block_q6_Kx8 *b, const int h, const int k, const int m) {
    const __m256i ql = el_loadu_256(b->ql[16 * h + 8 * (k % 2) + m]), qh = el_loadu_256(b->qh[8 * h + m]);
    const __m256i lo = _mm256_and_si256(el_shift_bytes(ql, -4 * (k / 2)), _mm256_set1_epi8(0x0F));
    return _mm256_or_si256(lo, _mm256_and_si256(el_shift_bytes(qh, 4 - 2 * k), _mm256_set1_epi8(0x30)));
}

/* Run 4h + k holds sub-blocks 2 (4h + k) (elements 4m.., m < 4) and + 1 (m >= 4): two sums per
 * row, each times its signed scale into isum; the offset's sum sum_g scale[g] bsums[g] (times 32)
 * comes off isum as in the reference. */
EL_AI void tile_q6(const int R, const uint8_t *grp, const uint8_t *const *rows, const int64_t nb, __m256 *sum) {
    for (int64_t i = 0; i < nb; i++) {
        const el_block_q6_Kx8 *b = (const el_block_q6_Kx8 *)grp + i;
        if (R == 1) prefetch_bytes((const uint8_t *)(b + 2), sizeof(*b));
        const uint8_t *act[X8V_RMAX];
        for (int r = 0; r < R; r++) act[r] = rows[r] + i * (int64_t)sizeof(el_block_q8_K);
        __m256i isum[X8V_RMAX], msum[X8V_RMAX];
        for (int r = 0; r < R; r++) isum[r] = msum[r] = _mm256_setzero_si256();
        UNROLL(2) for (int h = 0; h < 2; h++) {
            if (R == 1) { /* the four runs of h at once: eight sums in flight (two would wait on vpdpbusd) */
                __m256i s0[4], s1[4]; /* run 4h + k's two sub-blocks */
                for (int k = 0; k < 4; k++) s0[k] = s1[k] = _mm256_setzero_si256();
                UNROLL(4) for (int m = 0; m < 4; m++) {
                    UNROLL(4) for (int k = 0; k < 4; k++) {
                        const uint8_t *aq = act[0] + offsetof(el_block_q8_K, qs) + 32 * (4 * h + k) + 4 * m;
                        s0[k] = dp4(s0[k], q6x8_quants(b, h, k, m), aq);
                        s1[k] = dp4(s1[k], q6x8_quants(b, h, k, m + 4), aq + 16);
                    }
                }
                UNROLL(4) for (int k = 0; k < 4; k++) {
                    const int j = 2 * (4 * h + k);
                    const __m256i sj = el_loadu_256(b->scales[j / 4]);
                    isum[0] = _mm256_add_epi32(isum[0],
                                               _mm256_add_epi32(_mm256_mullo_epi32(s0[k], row_byte32(sj, j % 4, 1)),
                                                                _mm256_mullo_epi32(s1[k], row_byte32(sj, j % 4 + 1, 1))));
                }
                continue;
            }
            UNROLL(4) for (int k = 0; k < 4; k++) {
                __m256i s0[X8V_RMAX], s1[X8V_RMAX];
                for (int r = 0; r < R; r++) s0[r] = s1[r] = _mm256_setzero_si256();
                UNROLL(4) for (int m = 0; m < 4; m++) {
                    const __m256i u0 = q6x8_quants(b, h, k, m), u1 = q6x8_quants(b, h, k, m + 4);
                    for (int r = 0; r < R; r++) {
                        const uint8_t *aq = act[r] + offsetof(el_block_q8_K, qs) + 32 * (4 * h + k) + 4 * m;
                        s0[r] = dp4(s0[r], u0, aq);
                        s1[r] = dp4(s1[r], u1, aq + 16);
                    }
                }
                const int j = 2 * (4 * h + k);
                const __m256i sj = el_loadu_256(b->scales[j / 4]);
                const __m256i sc0 = row_byte32(sj, j % 4, 1), sc1 = row_byte32(sj, j % 4 + 1, 1);
                for (int r = 0; r < R; r++) {
                    isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(_mm256_mullo_epi32(s0[r], sc0),
                                                                         _mm256_mullo_epi32(s1[r], sc1)));
                }
            }
        }
        /* scale pairs (2q, 2q + 1) of each row against (bsums[2q], bsums[2q + 1]) */
        __m256i osum[X8V_RMAX];
        for (int r = 0; r < R; r++) osum[r] = _mm256_setzero_si256();
        UNROLL(8) for (int q = 0; q < 8; q++) {
            const __m256i pair = row_bytes16(el_loadu_256(b->scales[q / 2]), 2 * (q % 2), 2 * (q % 2) + 1, 1);
            for (int r = 0; r < R; r++) osum[r] = dp2x16(osum[r], pair, act[r] + offsetof(el_block_q8_K, bsums) + 4 * q);
        }
        for (int r = 0; r < R; r++) isum[r] = _mm256_sub_epi32(isum[r], _mm256_slli_epi32(osum[r], 5));
        add_block(R, _mm256_cvtph_ps(el_loadu_128(b->d)), _mm256_setzero_ps(), act, isum, msum, sum);
    }
}

/* Rows [r0, r0 + R) by groups [g_begin, g_end). */
EL_AI void rows_k(const int type, const int R, const uint8_t *w8, const uint8_t *a8, const int64_t a_row_bytes,
                  const int64_t r0, float *out, const int64_t out_stride, const int64_t nb, const int64_t g_begin,
                  const int64_t g_end) {
    const int64_t group_bytes = nb * 8 * el_type_block_bytes(type);
    const uint8_t *rows[X8V_RMAX];
    for (int r = 0; r < R; r++) rows[r] = a8 + (r0 + r) * a_row_bytes;
    for (int64_t g = g_begin; g < g_end; g++) {
        __m256 sum[X8V_RMAX];
        for (int r = 0; r < R; r++) sum[r] = _mm256_setzero_ps();
        if (type == EL_TYPE_Q6_K) tile_q6(R, w8 + g * group_bytes, rows, nb, sum);
        else tile_k4(type == EL_TYPE_Q5_K, R, w8 + g * group_bytes, rows, nb, sum);
        for (int r = 0; r < R; r++) _mm256_storeu_ps(out + (r0 + r) * out_stride + 8 * g, sum[r]);
    }
}

/* Instantiates the K product for one type: a tile height per call. */
#define MATMUL_K(NAME, TYPE)                                                                                     \
    static void NAME(const uint8_t *w8, const uint8_t *a8, const int64_t a_row_bytes, float *out,                \
                     const int64_t out_stride, const int64_t nb, const int64_t n_rows, const int64_t g_begin,    \
                     const int64_t g_end) {                                                                      \
        for (int64_t r0 = 0; r0 < n_rows;) {                                                                     \
            const int R = tile_rows(n_rows - r0, 8);                                                             \
            if (R == 8) rows_k(TYPE, 8, w8, a8, a_row_bytes, r0, out, out_stride, nb, g_begin, g_end);           \
            else if (R == 4) rows_k(TYPE, 4, w8, a8, a_row_bytes, r0, out, out_stride, nb, g_begin, g_end);      \
            else if (R == 2) rows_k(TYPE, 2, w8, a8, a_row_bytes, r0, out, out_stride, nb, g_begin, g_end);      \
            else rows_k(TYPE, 1, w8, a8, a_row_bytes, r0, out, out_stride, nb, g_begin, g_end);                  \
            r0 += R;                                                                                             \
        }                                                                                                        \
    }
MATMUL_K(matmul_q4_k, EL_TYPE_Q4_K)
MATMUL_K(matmul_q5_k, EL_TYPE_Q5_K)
MATMUL_K(matmul_q6_k, EL_TYPE_Q6_K)
#undef MATMUL_K

/* ==== The product ================================================================================== */

void el_matmul_x8_vnni(int32_t type, const void *w8, const void *a, int64_t a_row_bytes, float *out,
                       int64_t out_stride, int64_t nb, int64_t n_rows, int64_t g_begin, int64_t g_end) {
    switch (type) {
    case EL_TYPE_Q4_1:
        matmul_32(1, w8, a, a_row_bytes, out, out_stride, nb, n_rows, g_begin, g_end);
        break;
    case EL_TYPE_Q8_0:
        matmul_32(0, w8, a, a_row_bytes, out, out_stride, nb, n_rows, g_begin, g_end);
        break;
    case EL_TYPE_Q4_K:
        matmul_q4_k(w8, a, a_row_bytes, out, out_stride, nb, n_rows, g_begin, g_end);
        break;
    case EL_TYPE_Q5_K:
        matmul_q5_k(w8, a, a_row_bytes, out, out_stride, nb, n_rows, g_begin, g_end);
        break;
    default: /* EL_TYPE_Q6_K: one row streams through AVX2's kernel (17-18 GB/s here against its 24-26) */
        if (n_rows == 1) el_matmul_x8_k_avx2(type, w8, a, a_row_bytes, out, out_stride, nb, n_rows, g_begin, g_end);
        else matmul_q6_k(w8, a, a_row_bytes, out, out_stride, nb, n_rows, g_begin, g_end);
        break;
    }
}

#include "avx512_target_end.h"

#endif /* __x86_64__ */

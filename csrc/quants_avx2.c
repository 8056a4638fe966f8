/*
 * quants_avx2.c: AVX2 (+ FMA, F16C) variants of the tensor-type kernels for the 32-element block
 * types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1), the float types (F32, F16, BF16) and the activation
 * quantizers (Q8_0, Q8_1, Q8_K, F16, BF16); the K-quants are in quants_k_avx2.c. simd_dispatch.c
 * hands these out once AVX2 is chosen; the whole file is compiled for AVX2 (a target pragma), so
 * nothing in it may run before that choice.
 *
 * Every kernel here is bit-identical to its scalar reference in quants.c:
 * - a block's integer dot product is exact however it is summed (maddubs/madd, then a reduction);
 * - the float work per block is the reference's own expression, evaluated lane-wise in its order
 *   (products of the f16 scales, times the block sum, plus the min term, added to a running sum
 *   block after block), with one lane per output element;
 * - the float types replicate the reference's eight double lanes and their final order;
 * - the quantizers compute the same amax, d, id and per-element products, and round the way the
 *   reference rounds (roundf: half away from zero; Q8_K: half to even).
 *
 * Matrix products run tiles of R activation rows by C weight rows (4x2 for batches, 2x4 for two
 * rows, 1x8 for one): each weight block is loaded and unpacked once per tile and used by all R
 * rows, with int8 products (_mm256_maddubs_epi16). A tile's element is computed by exactly the
 * same lane operations as a 1x1 tile (which is vec_dot), so matmul equals vec_dot bit for bit,
 * whatever n_rows is and whichever tile an element falls in. Partial tiles repeat their last row
 * or column (computed, never stored), so every tile is one of the three shapes.
 *
 * The signed products rely on the activation quants lying in [-127, 127], as el_quantize_row
 * makes them: |w| * sign(a, w) then never overflows (_mm256_sign_epi8 of -128 would).
 */
#if defined(__x86_64__)

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "avx2_target_begin.h"

#include "el_blocks.h"
#include "el_internal.h"
#include "simd_avx2.h"
#include "simd_internal.h"

/* ---- Weight blocks as 32 int8 lanes --------------------------------------------------------- */

/* The 32 nibbles of a 4-bit block in element order, each 0..15. */
EL_AI __m256i nibbles(const uint8_t *qs /* [16] */) {
    const __m128i t = el_loadu_128(qs);
    const __m256i b = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x0F));
}

/* 0xFF in byte i where bit i of the little-endian u32 at qh is set, else 0. */
EL_AI __m256i bit_bytes(const uint8_t *qh /* [4] */) {
    const __m256i x = _mm256_set1_epi32((int)el_load_u32(qh));
    const __m256i spread = _mm256_shuffle_epi8(
        x, _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
}

/* Weight quants as the dot products see them: unsigned for the types with a min (Q4_1: 0..15,
 * Q5_1: 0..31), signed otherwise (Q4_0: q - 8, Q5_0: q - 16, Q8_0/Q8_1: as stored). */
EL_AI __m256i weight_quants(const int type, const uint8_t *b) {
    switch (type) {
    case EL_TYPE_Q4_0:
        return _mm256_sub_epi8(nibbles(((const el_block_q4_0 *)b)->qs), _mm256_set1_epi8(8));
    case EL_TYPE_Q4_1:
        return nibbles(((const el_block_q4_1 *)b)->qs);
    case EL_TYPE_Q5_0: { /* q - 16 = nibble | 0xF0 where the fifth bit is clear (two's complement) */
        const el_block_q5_0 *x = (const el_block_q5_0 *)b;
        return _mm256_or_si256(nibbles(x->qs), _mm256_andnot_si256(bit_bytes(x->qh), _mm256_set1_epi8((char)0xF0)));
    }
    case EL_TYPE_Q5_1: {
        const el_block_q5_1 *x = (const el_block_q5_1 *)b;
        return _mm256_or_si256(nibbles(x->qs), _mm256_and_si256(bit_bytes(x->qh), _mm256_set1_epi8(0x10)));
    }
    case EL_TYPE_Q8_0:
        return el_loadu_256(((const el_block_q8_0 *)b)->qs);
    default: /* EL_TYPE_Q8_1 */
        return el_loadu_256(((const el_block_q8_1 *)b)->qs);
    }
}

EL_AI int block_bytes32(const int type) {
    switch (type) {
    case EL_TYPE_Q4_0: return sizeof(el_block_q4_0);
    case EL_TYPE_Q4_1: return sizeof(el_block_q4_1);
    case EL_TYPE_Q5_0: return sizeof(el_block_q5_0);
    case EL_TYPE_Q5_1: return sizeof(el_block_q5_1);
    case EL_TYPE_Q8_0: return sizeof(el_block_q8_0);
    default: return sizeof(el_block_q8_1);
    }
}

/* Q4_1 and Q5_1 carry a min (dot against Q8_1, using its s); the rest are symmetric. */
EL_AI int has_min(const int type) { return type == EL_TYPE_Q4_1 || type == EL_TYPE_Q5_1; }
/* The activation blocks: Q8_1 for Q4_1, Q5_1 and Q8_1 weights, Q8_0 otherwise. */
EL_AI int act_is_q8_1(const int type) { return has_min(type) || type == EL_TYPE_Q8_1; }

/* ---- The tile ------------------------------------------------------------------------------- */

/* sums[p] = dot(weight row wp[c(p)], activation row ap[r(p)]) over nb blocks, for the R x C
 * lanes of the tile; per lane exactly the reference's
 *     sum += (d_w * d_a) * (float)isum [+ m_w * s_a]
 * block after block, with isum the block's exact integer dot product. */
EL_AI void tile32(const int type, const int R, const int C, const uint8_t *const *wp,
                  const uint8_t *const *ap, const int64_t nb, float *sums /* [8] */, const el_prefetch pf,
                  const __m256 *rowsc /* unused */) {
    (void)rowsc;
    const int wb = block_bytes32(type);
    const int ab = act_is_q8_1(type) ? (int)sizeof(el_block_q8_1) : (int)sizeof(el_block_q8_0);
    const int aq = act_is_q8_1(type) ? 4 : 2; /* offset of the activation quants */
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        el_prefetch_step(pf, i);
        __m256i acc[8];
        for (int p = R * C; p < 8; p++) acc[p] = _mm256_setzero_si256();
        for (int c = 0; c < C; c++) {
            const __m256i q = weight_quants(type, wp[c] + i * wb);
            if (has_min(type)) { /* unsigned weights: u8 x i8 directly */
                for (int r = 0; r < R; r++) {
                    const __m256i a = el_loadu_256(ap[r] + i * ab + aq);
                    acc[r * C + c] = _mm256_madd_epi16(_mm256_maddubs_epi16(q, a), ones);
                }
            } else { /* signed weights: |q| x (a with q's sign) */
                const __m256i aq_abs = _mm256_sign_epi8(q, q);
                for (int r = 0; r < R; r++) {
                    const __m256i a = el_loadu_256(ap[r] + i * ab + aq);
                    acc[r * C + c] = _mm256_madd_epi16(_mm256_maddubs_epi16(aq_abs, _mm256_sign_epi8(a, q)), ones);
                }
            }
        }
        const __m256 isum = _mm256_cvtepi32_ps(el_reduce8_epi32(acc));
        __m256 dw, mw, da, sa;
        el_col_halves(R, C, wp, i * wb, &dw, &mw); /* (d, m), or (d, unused) */
        el_row_halves(R, C, ap, i * ab, &da, &sa); /* (d, s), or (d, unused) */
        __m256 t = _mm256_mul_ps(_mm256_mul_ps(dw, da), isum);
        if (has_min(type)) t = _mm256_add_ps(t, _mm256_mul_ps(mw, sa));
        sum = _mm256_add_ps(sum, t);
    }
    _mm256_storeu_ps(sums, sum);
}

/* ---- Q4_0 and Q4_1: two weight rows per register ----------------------------------------------
 * A 4-bit block's 16 bytes hold element j in the low nibble and j + 16 in the high nibble. With
 * two weight rows' blocks in the two halves of one register, the low nibbles are both rows'
 * elements 0..15 and the high nibbles their elements 16..31; against an activation block whose
 * halves are broadcast to both register halves, one pair of maddubs serves two outputs, and four
 * such registers reduce to one vector of eight lanes with three hadds. Register k = r * NCP + cp
 * (activation row r, column pair cp; NCP = C / 2 pairs, columns cp and cp + NCP) lands in vector
 * k / 4, lane h * 4 + k % 4 for its half h: column cp + h * NCP (for C == 1 both halves hold column
 * 0). A 4x4 tile has eight registers, so two vectors. Q4_0's q - 8 comes in as 8 * (the
 * activation's pair sums), subtracted in 16 bits (|sum| <= 11684). The last step moves the lanes
 * to output order p = r * C + c. */
#define NIB_NCP (C == 1 ? 1 : C / 2)
#define NIB_K (R * NIB_NCP)
#define NIB_KL(v, L) (4 * (v) + (L) % 4) /* register of lane L of vector v */
#define NIB_R(v, L) (NIB_KL(v, L) < NIB_K ? NIB_KL(v, L) / NIB_NCP : 0)
#define NIB_C(v, L) (NIB_KL(v, L) < NIB_K && C > 1 ? NIB_KL(v, L) % NIB_NCP + ((L) / 4) * NIB_NCP : 0)
/* the lane (within its vector: output p is in vector p / 8) of output p = r * C + c */
#define NIB_SRC(p)                                                                                           \
    ((p) < R * C ? (C == 1 ? (p) % 8 : (((p) % C) / NIB_NCP) * 4 + (((p) / C) * NIB_NCP + ((p) % C) % NIB_NCP) % 4) \
                 : 0)

EL_AI __m256i nib_cols2(const int R, const int C, const int v) {
    return _mm256_setr_epi32(2 * NIB_C(v, 0), 2 * NIB_C(v, 1), 2 * NIB_C(v, 2), 2 * NIB_C(v, 3), 2 * NIB_C(v, 4),
                             2 * NIB_C(v, 5), 2 * NIB_C(v, 6), 2 * NIB_C(v, 7));
}
EL_AI __m256i nib_rows2(const int R, const int C, const int v) {
    return _mm256_setr_epi32(2 * NIB_R(v, 0), 2 * NIB_R(v, 1), 2 * NIB_R(v, 2), 2 * NIB_R(v, 3), 2 * NIB_R(v, 4),
                             2 * NIB_R(v, 5), 2 * NIB_R(v, 6), 2 * NIB_R(v, 7));
}
EL_AI __m256i nib_src(const int R, const int C, const int v) {
    return _mm256_setr_epi32(NIB_SRC(8 * v + 0), NIB_SRC(8 * v + 1), NIB_SRC(8 * v + 2), NIB_SRC(8 * v + 3),
                             NIB_SRC(8 * v + 4), NIB_SRC(8 * v + 5), NIB_SRC(8 * v + 6), NIB_SRC(8 * v + 7));
}

/* The activation scales of a tile's rows as its lanes see them, block by block: for block i and
 * vector v, rowsc[4 i + 2 v] = (d) and rowsc[4 i + 2 v + 1] = (s, for Q8_1). matmul_tiles computes
 * them once per group of rows and hands them to every column tile of those rows. */
EL_AI void nib_row_scales(const int type, const int R, const int C, const uint8_t *const *ap, const int64_t nb,
                          __m256 *rowsc) {
    const int NV = NIB_K > 4 ? 2 : 1;
    const int ab = type == EL_TYPE_Q4_1 ? (int)sizeof(el_block_q8_1) : (int)sizeof(el_block_q8_0);
    for (int64_t i = 0; i < nb; i++) {
        for (int v = 0; v < NV; v++) el_lane_halves(R, ap, i * ab, nib_rows2(R, C, v), &rowsc[4 * i + 2 * v], &rowsc[4 * i + 2 * v + 1]);
    }
}

/* sums[p] for the R x C outputs of the tile (p = r * C + c, R * C <= 16, R * NCP <= 8); rowsc from
 * nib_row_scales, or NULL to gather the activation scales here. */
EL_AI void tile_nib(const int type, const int R, const int C, const uint8_t *const *wp,
                    const uint8_t *const *ap, const int64_t nb, float *sums /* [16] */, const el_prefetch pf,
                    const __m256 *rowsc) {
    const int NCP = NIB_NCP, K = NIB_K, NV = K > 4 ? 2 : 1;
    /* Q4_0 and Q5_0 are symmetric (q - 8, q - 16: the offset comes in through the activation's
     * pair sums and the reduction is 32-bit); Q4_1 has a min. */
    const int sym = type != EL_TYPE_Q4_1, q5 = type == EL_TYPE_Q5_0;
    const int wb = type == EL_TYPE_Q4_0 ? (int)sizeof(el_block_q4_0)
                 : q5                   ? (int)sizeof(el_block_q5_0)
                                        : (int)sizeof(el_block_q4_1);
    const int wq = type == EL_TYPE_Q4_0 ? 2 : q5 ? 6 : 4; /* offset of the weight nibbles */
    const int ab = sym ? (int)sizeof(el_block_q8_0) : (int)sizeof(el_block_q8_1);
    const int aq = sym ? 2 : 4; /* offset of the activation quants */
    const __m256i ones16 = _mm256_set1_epi16(1), ones8 = _mm256_set1_epi8(1), low4 = _mm256_set1_epi8(0x0F);
    /* Q5_0's fifth bits: byte j of a half takes bit j (low nibbles) or 16 + j (high) of its row's qh. */
    const __m256i qh_lo = _mm256_setr_epi64x(0, 0x0101010101010101, 0, 0x0101010101010101);
    const __m256i qh_hi = _mm256_setr_epi64x(0x0202020202020202, 0x0303030303030303, 0x0202020202020202, 0x0303030303030303);
    const __m256i qh_bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL), b4 = _mm256_set1_epi8(0x10);
    __m256 sum[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t i = 0; i < nb; i++) {
        el_prefetch_step(pf, i);
        __m256i a8[4];
        if (sym) {
            for (int r = 0; r < R; r++) {
                const uint8_t *a = ap[r] + i * ab + aq;
                const __m256i alo = _mm256_broadcastsi128_si256(el_loadu_128(a));
                const __m256i ahi = _mm256_broadcastsi128_si256(el_loadu_128(a + 16));
                a8[r] = _mm256_slli_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(ones8, alo), _mm256_maddubs_epi16(ones8, ahi)), q5 ? 4 : 3);
            }
        }
        __m256i acc[8];
        for (int k = K; k < 4 * NV; k++) acc[k] = _mm256_setzero_si256();
        for (int cp = 0; cp < NCP; cp++) {
            const uint8_t *b0 = wp[cp] + i * wb, *b1 = wp[C == 1 ? 0 : cp + NCP] + i * wb;
            const __m256i w = _mm256_inserti128_si256(_mm256_castsi128_si256(el_loadu_128(b0 + wq)), el_loadu_128(b1 + wq), 1);
            __m256i lo = _mm256_and_si256(w, low4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low4);
            if (q5) { /* q = nibble + 16 * bit, 0..31 */
                const __m256i h = _mm256_setr_epi32((int)el_load_u32(b0 + 2), 0, 0, 0, (int)el_load_u32(b1 + 2), 0, 0, 0);
                const __m256i blo = _mm256_and_si256(_mm256_shuffle_epi8(h, qh_lo), qh_bit);
                const __m256i bhi = _mm256_and_si256(_mm256_shuffle_epi8(h, qh_hi), qh_bit);
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(blo, qh_bit), b4));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(bhi, qh_bit), b4));
            }
            for (int r = 0; r < R; r++) {
                const uint8_t *a = ap[r] + i * ab + aq;
                const __m256i alo = _mm256_broadcastsi128_si256(el_loadu_128(a));
                const __m256i ahi = _mm256_broadcastsi128_si256(el_loadu_128(a + 16));
                __m256i prod = _mm256_add_epi16(_mm256_maddubs_epi16(lo, alo), _mm256_maddubs_epi16(hi, ahi));
                if (sym) prod = _mm256_madd_epi16(_mm256_sub_epi16(prod, a8[r]), ones16);
                acc[r * NCP + cp] = prod;
            }
        }
        /* The columns' scales: (d, m), or (d, unused). With two vectors (4x4: two column pairs)
         * both see the same columns in the same lanes. */
        __m256 dw, mw;
        el_lane_halves(C, wp, i * wb, nib_cols2(R, C, 0), &dw, &mw);
        for (int v = 0; v < NV; v++) {
            /* Q4_1's 16-bit lanes are at most 4 * 15 * 127 = 7620, so four of them still fit 16
             * bits: two hadd levels there, one widening madd. Q4_0's are 32-bit already. */
            const __m256i *k4 = acc + 4 * v;
            const __m256i reduced = sym ? el_reduce4x2_epi32(k4)
                                         : _mm256_madd_epi16(_mm256_hadd_epi16(_mm256_hadd_epi16(k4[0], k4[1]),
                                                                               _mm256_hadd_epi16(k4[2], k4[3])),
                                                             ones16);
            const __m256 isum = _mm256_cvtepi32_ps(reduced);
            __m256 da, sa; /* (d, s), or (d, unused) */
            if (rowsc != NULL) {
                da = rowsc[4 * i + 2 * v];
                sa = rowsc[4 * i + 2 * v + 1];
            } else {
                el_lane_halves(R, ap, i * ab, nib_rows2(R, C, v), &da, &sa);
            }
            __m256 t = _mm256_mul_ps(_mm256_mul_ps(dw, da), isum);
            if (!sym) t = _mm256_add_ps(t, _mm256_mul_ps(mw, sa));
            sum[v] = _mm256_add_ps(sum[v], t);
        }
    }
    for (int v = 0; v < NV; v++) _mm256_storeu_ps(sums + 8 * v, _mm256_permutevar8x32_ps(sum[v], nib_src(R, C, v)));
}

/* ---- Rows interleaved in eights: Q4_1 -----------------------------------------------------------
 * el_block_q4_1x8 holds a row per 32-bit lane: one 32-byte load, its low and high nibbles, and two
 * broadcasts of four activation bytes give eight rows' partial sums in place, with no horizontal
 * reduction; the 16-bit lanes add up a block's 16 products each (at most 16 * 15 * 127 = 30480),
 * one madd finishes it. The float work is dot_q4_1_q8_1's, lane by lane, so bit-identical. */

/* Block i's sums of the eight rows against one activation block, as eight 32-bit lanes. */
EL_AI __m256i q4_1x8_isum(const el_block_q4_1x8 *b, const int8_t *aq) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    __m256i acc = _mm256_setzero_si256();
    for (int k = 0; k < 4; k++) {
        const __m256i w = el_loadu_256(b->qs[k]);
        const __m256i lo = _mm256_and_si256(w, low4), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low4);
        const __m256i alo = _mm256_set1_epi32((int)el_load_u32((const uint8_t *)aq + 4 * k));
        const __m256i ahi = _mm256_set1_epi32((int)el_load_u32((const uint8_t *)aq + 16 + 4 * k));
        acc = _mm256_add_epi16(acc, _mm256_add_epi16(_mm256_maddubs_epi16(lo, alo), _mm256_maddubs_epi16(hi, ahi)));
    }
    return _mm256_madd_epi16(acc, _mm256_set1_epi16(1));
}

/* One activation row: one stream, prefetched 16 blocks (2.5 KiB) ahead. */
static void matvec_q4_1x8(const el_block_q4_1x8 *w8, const el_block_q8_1 *act, float *out, int64_t nb,
                          int64_t g_begin, int64_t g_end) {
    for (int64_t g = g_begin; g < g_end; g++) {
        const el_block_q4_1x8 *b = w8 + g * nb;
        __m256 sum = _mm256_setzero_ps();
        for (int64_t i = 0; i < nb; i++) {
            const char *ahead = (const char *)(b + i) + 16 * sizeof(el_block_q4_1x8);
            _mm_prefetch(ahead, _MM_HINT_T0);
            _mm_prefetch(ahead + 64, _MM_HINT_T0);
            _mm_prefetch(ahead + 128, _MM_HINT_T0);
            const __m256 isum = _mm256_cvtepi32_ps(q4_1x8_isum(b + i, act[i].qs));
            const __m256 dw = _mm256_cvtph_ps(el_loadu_128(b[i].d));
            const __m256 mw = _mm256_cvtph_ps(el_loadu_128(b[i].m));
            const __m128 ds = _mm_cvtph_ps(_mm_cvtsi32_si128((int)el_load_u32((const uint8_t *)&act[i]))); /* d, s */
            const __m256 da = _mm256_broadcastss_ps(ds), sa = _mm256_broadcastss_ps(_mm_movehdup_ps(ds));
            __m256 t = _mm256_mul_ps(_mm256_mul_ps(dw, da), isum);
            t = _mm256_add_ps(t, _mm256_mul_ps(mw, sa));
            sum = _mm256_add_ps(sum, t);
        }
        _mm256_storeu_ps(out + 8 * g, sum);
    }
}

/* Blocks per row up to which the 4-row tiles precompute their rows' scales (16 KiB on the stack). */
#define X8_ROW_SCALES_MAX_NB 512

/* Four activation rows (the last repeated past n_rows) by one group: each weight load serves the
 * four rows. rs: per block, d and s of rows 0..3 as floats (d0 s0 d1 s1 d2 s2 d3 s3). */
static void tile_q4_1x8_4(const el_block_q4_1x8 *b, const uint8_t *const *rows, const float *rs, int64_t nb,
                          float *out, int64_t out_stride, int64_t left) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), ones16 = _mm256_set1_epi16(1);
    const el_block_q8_1 *ap[4];
    for (int r = 0; r < 4; r++) ap[r] = (const el_block_q8_1 *)rows[r];
    __m256 sum[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t i = 0; i < nb; i++) {
        __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                          _mm256_setzero_si256()};
        for (int k = 0; k < 4; k++) {
            const __m256i w = el_loadu_256(b[i].qs[k]);
            const __m256i lo = _mm256_and_si256(w, low4), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low4);
            for (int r = 0; r < 4; r++) {
                const uint8_t *aq = (const uint8_t *)ap[r][i].qs;
                const __m256i alo = _mm256_set1_epi32((int)el_load_u32(aq + 4 * k));
                const __m256i ahi = _mm256_set1_epi32((int)el_load_u32(aq + 16 + 4 * k));
                acc[r] = _mm256_add_epi16(acc[r],
                                          _mm256_add_epi16(_mm256_maddubs_epi16(lo, alo), _mm256_maddubs_epi16(hi, ahi)));
            }
            /* Keeps the sums in registers: left alone, the compiler reassociates the integer adds
             * into one tree per row, computes every product first and spills them. */
            __asm__("" : "+x"(acc[0]), "+x"(acc[1]), "+x"(acc[2]), "+x"(acc[3]));
        }
        const __m256 dw = _mm256_cvtph_ps(el_loadu_128(b[i].d));
        const __m256 mw = _mm256_cvtph_ps(el_loadu_128(b[i].m));
        for (int r = 0; r < 4; r++) {
            const __m256 isum = _mm256_cvtepi32_ps(_mm256_madd_epi16(acc[r], ones16));
            __m256 t = _mm256_mul_ps(_mm256_mul_ps(dw, _mm256_broadcast_ss(rs + 8 * i + 2 * r)), isum);
            t = _mm256_add_ps(t, _mm256_mul_ps(mw, _mm256_broadcast_ss(rs + 8 * i + 2 * r + 1)));
            sum[r] = _mm256_add_ps(sum[r], t);
        }
    }
    for (int r = 0; r < 4; r++) {
        if (r < left) _mm256_storeu_ps(out + r * out_stride, sum[r]);
    }
}

/* The 4-row tile's activation scales, per block: d and s of rows 0..3 as floats. */
static void row_scales_q4_1x8(const uint8_t *const *rows, int64_t nb, float *rs) {
    for (int64_t i = 0; i < nb; i++) {
        const size_t at = (size_t)i * sizeof(el_block_q8_1); /* block i's (d, s) pair in each row */
        const __m128i ds = _mm_setr_epi32((int)el_load_u32(rows[0] + at), (int)el_load_u32(rows[1] + at),
                                          (int)el_load_u32(rows[2] + at), (int)el_load_u32(rows[3] + at));
        _mm256_storeu_ps(rs + 8 * i, _mm256_cvtph_ps(ds)); /* d0 s0 d1 s1 d2 s2 d3 s3 */
    }
}

/* The batch tiles of Q4_1 (R = 4 or 8 activation rows by one group of 8 columns) broadcast their
 * activations' four-byte chunks straight from the rows (vpbroadcastd from memory: a load, no
 * shuffle), and read the rows' d and s *spread*: per block, as whole float vectors (vmulps' memory
 * operand), made once per R rows for all of a task's groups. A row's blocks are cut into as few
 * equal chunks as fit the spread buffer (X8_SPREAD_VECTORS vectors, 20 KiB: 40 blocks of 8 rows,
 * 80 of 4, so one chunk for 576-element rows and two for 1536); a row's running float sum is
 * carried across chunks through memory (the same adds in the same order).
 * Measured against spreading the quants too (each chunk broadcast to whole vectors, 8 blocks of 8
 * rows at a time: 16 KiB more): 576 -> 576 and 1536 -> 576 tasks (9 groups) 4-6% faster, 576 ->
 * 1536 (24 groups) 1% faster, and 4-group tasks (576 -> 192) 8% faster, so they take this path
 * too instead of the 4-row tiles. */
#define X8_SPREAD_VECTORS 640
/* Groups a task must have for the spread tiles (the K and V products' tasks have 4). */
#define X8_SPREAD_MIN_GROUPS 4

/* Blocks [i0, i0 + n) of the R rows' d and s, spread: ds[(i * R + r) * 2 + {d, s}]. */
EL_AI void spread_q4_1x8(const uint8_t *const *rows, int R, int64_t i0, int64_t n, __m256 *ds) {
    for (int64_t i = 0; i < n; i++) {
        for (int r = 0; r < R; r++) {
            const uint8_t *blk = rows[r] + (size_t)(i0 + i) * sizeof(el_block_q8_1);
            const __m128 dsv = _mm_cvtph_ps(_mm_cvtsi32_si128((int)el_load_u32(blk))); /* d, s */
            ds[(i * R + r) * 2] = _mm256_broadcastss_ps(dsv);
            ds[(i * R + r) * 2 + 1] = _mm256_broadcastss_ps(_mm_movehdup_ps(dsv));
        }
    }
}

/* tile_q4_1x8_4's arithmetic for R rows over blocks [i0, i0 + n) (b: the group's block i0), the
 * running sums in sums[R] (in memory for R = 8: the sixteen registers hold the integer sums). A
 * chunk boundary only stores and reloads them: the same float adds in the same order. */
EL_AI void tile_q4_1x8_spread(const el_block_q4_1x8 *b, int R, const uint8_t *const *rows, int64_t i0,
                              const __m256 *ds, int64_t n, __m256 *sums) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), ones16 = _mm256_set1_epi16(1);
    __m256 sum[8];
    if (R == 4) {
        for (int r = 0; r < 4; r++) sum[r] = sums[r];
    }
    for (int64_t i = 0; i < n; i++) {
        __m256i acc[8];
        for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_si256();
        const size_t at = (size_t)(i0 + i) * sizeof(el_block_q8_1) + offsetof(el_block_q8_1, qs);
        for (int k = 0; k < 4; k++) {
            const __m256i w = el_loadu_256(b[i].qs[k]);
            const __m256i lo = _mm256_and_si256(w, low4), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low4);
            for (int r = 0; r < R; r++) {
                const __m256i alo = _mm256_set1_epi32((int)el_load_u32(rows[r] + at + 4 * k));
                const __m256i ahi = _mm256_set1_epi32((int)el_load_u32(rows[r] + at + 16 + 4 * k));
                acc[r] = _mm256_add_epi16(acc[r], _mm256_add_epi16(_mm256_maddubs_epi16(lo, alo),
                                                                   _mm256_maddubs_epi16(hi, ahi)));
            }
            /* as in tile_q4_1x8_4 */
            __asm__("" : "+x"(acc[0]), "+x"(acc[1]), "+x"(acc[2]), "+x"(acc[3]));
            if (R == 8) __asm__("" : "+x"(acc[4]), "+x"(acc[5]), "+x"(acc[6]), "+x"(acc[7]));
        }
        const __m256 dw = _mm256_cvtph_ps(el_loadu_128(b[i].d));
        const __m256 mw = _mm256_cvtph_ps(el_loadu_128(b[i].m));
        const __m256 *dsi = ds + i * R * 2;
        for (int r = 0; r < R; r++) {
            const __m256 isum = _mm256_cvtepi32_ps(_mm256_madd_epi16(acc[r], ones16));
            __m256 t = _mm256_mul_ps(_mm256_mul_ps(dw, dsi[2 * r]), isum);
            t = _mm256_add_ps(t, _mm256_mul_ps(mw, dsi[2 * r + 1]));
            if (R == 4) sum[r] = _mm256_add_ps(sum[r], t);
            else sums[r] = _mm256_add_ps(sums[r], t);
        }
    }
    if (R == 4) {
        for (int r = 0; r < 4; r++) sums[r] = sum[r];
    }
}

/* Rows [r0, r0 + R) (the last repeated past n_rows, computed, never stored) by groups
 * [g_begin, g_end), chunk by chunk of spread blocks. */
EL_AI void rows_q4_1x8_spread(const el_block_q4_1x8 *w8, int R, const uint8_t *a8, int64_t a_row_bytes, int64_t r0,
                              int64_t n_rows, float *out, int64_t out_stride, int64_t nb, int64_t g_begin,
                              int64_t g_end, __m256 *ds) {
    const int64_t left = n_rows - r0, most = X8_SPREAD_VECTORS / (2 * R);
    const int64_t n_chunks = (nb + most - 1) / most, chunk = (nb + n_chunks - 1) / n_chunks;
    const uint8_t *rows[8];
    for (int r = 0; r < R; r++) rows[r] = a8 + (r0 + (r < left ? r : left - 1)) * a_row_bytes;
    for (int64_t i0 = 0; i0 < nb; i0 += chunk) {
        const int64_t n = nb - i0 < chunk ? nb - i0 : chunk;
        spread_q4_1x8(rows, R, i0, n, ds);
        for (int64_t g = g_begin; g < g_end; g++) {
            float *o = out + r0 * out_stride + 8 * g;
            __m256 sums[8];
            for (int r = 0; r < R; r++) {
                sums[r] = i0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(o + (r < left ? r : left - 1) * out_stride);
            }
            tile_q4_1x8_spread(w8 + g * nb + i0, R, rows, i0, ds, n, sums);
            for (int r = 0; r < R && r < left; r++) _mm256_storeu_ps(o + r * out_stride, sums[r]);
        }
    }
}

/* Q4_1 batches: 8-row tiles while more than four rows are left, then a 4-row one. */
static void matmul_q4_1x8_spread(const el_block_q4_1x8 *w8, const uint8_t *a8, int64_t a_row_bytes, float *out,
                                 int64_t out_stride, int64_t nb, int64_t n_rows, int64_t g_begin, int64_t g_end) {
    __m256 ds[X8_SPREAD_VECTORS]; /* 20 KiB */
    int64_t r0 = 0;
    for (; n_rows - r0 > 4; r0 += 8) {
        rows_q4_1x8_spread(w8, 8, a8, a_row_bytes, r0, n_rows, out, out_stride, nb, g_begin, g_end, ds);
    }
    if (r0 < n_rows) rows_q4_1x8_spread(w8, 4, a8, a_row_bytes, r0, n_rows, out, out_stride, nb, g_begin, g_end, ds);
}

/* ---- Rows interleaved in eights: Q8_0 -----------------------------------------------------------
 * el_block_q8_0x8 holds a row per 32-bit lane, as Q4_1's: per four elements one load, its
 * absolute values (for maddubs' unsigned side, shared by a tile's rows), and per activation row a
 * broadcast, a sign, maddubs and madd (two products per 16-bit lane, up to 2 * 127 * 127, so no
 * two may be added before the madd). The float work is dot_q8_0_q8_0's, lane by lane. */

/* One activation row: one stream, prefetched 16 blocks (4.25 KiB) ahead. */
static void matvec_q8_0x8(const el_block_q8_0x8 *w8, const el_block_q8_0 *act, float *out, int64_t nb,
                          int64_t g_begin, int64_t g_end) {
    const __m256i ones16 = _mm256_set1_epi16(1);
    for (int64_t g = g_begin; g < g_end; g++) {
        const el_block_q8_0x8 *b = w8 + g * nb;
        __m256 sum = _mm256_setzero_ps();
        for (int64_t i = 0; i < nb; i++) {
            const char *ahead = (const char *)(b + i) + 16 * sizeof(el_block_q8_0x8);
            for (int l = 0; l < 5; l++) _mm_prefetch(ahead + 64 * l, _MM_HINT_T0);
            __m256i acc = _mm256_setzero_si256();
            for (int k = 0; k < 8; k++) {
                const __m256i w = el_loadu_256(b[i].qs[k]);
                const __m256i a = _mm256_set1_epi32((int)el_load_u32((const uint8_t *)act[i].qs + 4 * k));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w)), ones16));
            }
            const __m256 isum = _mm256_cvtepi32_ps(acc);
            const __m256 dw = _mm256_cvtph_ps(el_loadu_128(b[i].d));
            const __m256 da = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128((int)el_load_u16((const uint8_t *)&act[i].d))));
            sum = _mm256_add_ps(sum, _mm256_mul_ps(_mm256_mul_ps(dw, da), isum));
        }
        _mm256_storeu_ps(out + 8 * g, sum);
    }
}

/* Four activation rows (the last repeated past n_rows) by one group. rs: per block, d of rows 0..3
 * as floats. */
static void tile_q8_0x8_4(const el_block_q8_0x8 *b, const uint8_t *const *rows, const float *rs, int64_t nb,
                          float *out, int64_t out_stride, int64_t left) {
    const __m256i ones16 = _mm256_set1_epi16(1);
    const el_block_q8_0 *ap[4];
    for (int r = 0; r < 4; r++) ap[r] = (const el_block_q8_0 *)rows[r];
    __m256 sum[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t i = 0; i < nb; i++) {
        __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                          _mm256_setzero_si256()};
        for (int k = 0; k < 8; k++) {
            const __m256i w = el_loadu_256(b[i].qs[k]);
            const __m256i aw = _mm256_sign_epi8(w, w);
            for (int r = 0; r < 4; r++) {
                const __m256i a = _mm256_set1_epi32((int)el_load_u32((const uint8_t *)ap[r][i].qs + 4 * k));
                acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(a, w)), ones16));
            }
            __asm__("" : "+x"(acc[0]), "+x"(acc[1]), "+x"(acc[2]), "+x"(acc[3])); /* as in tile_q4_1x8_4 */
        }
        const __m256 dw = _mm256_cvtph_ps(el_loadu_128(b[i].d));
        for (int r = 0; r < 4; r++) {
            const __m256 isum = _mm256_cvtepi32_ps(acc[r]);
            sum[r] = _mm256_add_ps(sum[r], _mm256_mul_ps(_mm256_mul_ps(dw, _mm256_broadcast_ss(rs + 4 * i + r)), isum));
        }
    }
    for (int r = 0; r < 4; r++) {
        if (r < left) _mm256_storeu_ps(out + r * out_stride, sum[r]);
    }
}

/* The 4-row tile's activation scales, per block: d of rows 0..3 as floats. */
static void row_scales_q8_0x8(const uint8_t *const *rows, int64_t nb, float *rs) {
    for (int64_t i = 0; i < nb; i++) {
        const size_t at = (size_t)i * sizeof(el_block_q8_0); /* block i's d in each row */
        const __m128i d = _mm_setr_epi16((short)el_load_u16(rows[0] + at), (short)el_load_u16(rows[1] + at),
                                         (short)el_load_u16(rows[2] + at), (short)el_load_u16(rows[3] + at), 0, 0, 0, 0);
        _mm_storeu_ps(rs + 4 * i, _mm_cvtph_ps(d));
    }
}

/* ---- Rows interleaved in eights: the product ----------------------------------------------------
 * One activation row streams the matrix (matvec); batches run 4-row tiles over each group, the
 * rows' scales computed once per 4-row group (rows past n_rows repeat the last, computed, never
 * stored). Rows of more than X8_ROW_SCALES_MAX_NB blocks go one at a time. Q4_1 batches over at
 * least X8_SPREAD_MIN_GROUPS groups run the 8-row tiles over spread activation scales instead. */
void el_matmul_x8_avx2(int32_t type, const void *w8, const void *a, int64_t a_row_bytes, float *out,
                       int64_t out_stride, int64_t nb, int64_t n_rows, int64_t g_begin, int64_t g_end) {
    const int q4_1 = type == EL_TYPE_Q4_1;
    const uint8_t *a8 = a;
    if (n_rows == 1 || nb > X8_ROW_SCALES_MAX_NB) {
        for (int64_t r = 0; r < n_rows; r++) {
            const uint8_t *row = a8 + r * a_row_bytes;
            float *o = out + r * out_stride;
            if (q4_1) matvec_q4_1x8(w8, (const el_block_q8_1 *)row, o, nb, g_begin, g_end);
            else matvec_q8_0x8(w8, (const el_block_q8_0 *)row, o, nb, g_begin, g_end);
        }
        return;
    }
    if (q4_1 && g_end - g_begin >= X8_SPREAD_MIN_GROUPS) {
        matmul_q4_1x8_spread(w8, a8, a_row_bytes, out, out_stride, nb, n_rows, g_begin, g_end);
        return;
    }
    float rs[8 * X8_ROW_SCALES_MAX_NB] __attribute__((aligned(32))); /* the rows' scales, per block */
    for (int64_t r0 = 0; r0 < n_rows; r0 += 4) {
        const int64_t left = n_rows - r0;
        const uint8_t *rows[4];
        for (int r = 0; r < 4; r++) rows[r] = a8 + (r0 + (r < left ? r : left - 1)) * a_row_bytes;
        if (q4_1) row_scales_q4_1x8(rows, nb, rs);
        else row_scales_q8_0x8(rows, nb, rs);
        for (int64_t g = g_begin; g < g_end; g++) {
            float *o = out + r0 * out_stride + 8 * g;
            if (q4_1) tile_q4_1x8_4((const el_block_q4_1x8 *)w8 + g * nb, rows, rs, nb, o, out_stride, left);
            else tile_q8_0x8_4((const el_block_q8_0x8 *)w8 + g * nb, rows, rs, nb, o, out_stride, left);
        }
    }
}

/* out[r][o] for rows [0, n_rows) and columns [o_begin, o_end), tile by tile: R x C tiles with
 * R = 4 (C = c4) while three or more rows are left, then R = 2 (C = c2) or R = 1 (C = c1). Rows and
 * columns past the ends repeat the last one (computed, never stored). */
typedef void (*tile_fn)(const uint8_t *const *wp, const uint8_t *const *ap, int64_t nb, float *sums,
                        el_prefetch pf, const __m256 *rowsc);
typedef void (*row_scales_fn)(const uint8_t *const *ap, int64_t nb, __m256 *rowsc);

typedef struct {
    tile_fn tile4, tile2, tile1;
    int c4, c2, c1;
    row_scales_fn row_scales4; /* the 4-row tile's precomputed activation scales, or NULL */
} tile_shapes;

/* Blocks per row up to which a 4-row tile's activation scales are precomputed (4 vectors each, on
 * the stack: 32 KiB); longer rows gather them in the tile. */
#define ROW_SCALES_MAX_NB 256

static void matmul_tiles(const tile_shapes *sh, const void *w, int64_t w_row_bytes, const void *a,
                         int64_t a_row_bytes, float *out, int64_t out_stride, int64_t nb, int64_t n_rows,
                         int64_t o_begin, int64_t o_end) {
    const uint8_t *w8 = w, *a8 = a;
    __m256 rowsc[4 * ROW_SCALES_MAX_NB];
    for (int64_t r0 = 0; r0 < n_rows;) {
        const int64_t left = n_rows - r0;
        const int R = left >= 3 ? 4 : (int)left;
        const int C = R == 4 ? sh->c4 : R == 2 ? sh->c2 : sh->c1;
        const tile_fn tile = R == 4 ? sh->tile4 : R == 2 ? sh->tile2 : sh->tile1;
        const uint8_t *ap[4];
        for (int r = 0; r < R; r++) ap[r] = a8 + (r0 + (r < left ? r : left - 1)) * a_row_bytes;
        const __m256 *rs = NULL;
        if (R == 4 && sh->row_scales4 != NULL && nb <= ROW_SCALES_MAX_NB) {
            sh->row_scales4(ap, nb, rowsc);
            rs = rowsc;
        }
        for (int64_t o0 = o_begin; o0 < o_end; o0 += C) {
            const uint8_t *wp[8];
            for (int c = 0; c < C; c++) wp[c] = w8 + (o0 + c < o_end ? o0 + c : o_end - 1) * w_row_bytes;
            float sums[16];
            tile(wp, ap, nb, sums, el_prefetch_ahead(R, C, w8, w_row_bytes, o0, out_stride /* n_out */, nb), rs);
            if (o0 + C <= o_end && C % 4 == 0) { /* a whole tile: rows of C outputs */
                for (int r = 0; r < R && r < left; r++) {
                    for (int c = 0; c < C; c += 4) _mm_storeu_ps(out + (r0 + r) * out_stride + o0 + c, _mm_loadu_ps(sums + r * C + c));
                }
            } else {
                for (int r = 0; r < R && r < left; r++) {
                    for (int c = 0; c < C && o0 + c < o_end; c++) out[(r0 + r) * out_stride + o0 + c] = sums[r * C + c];
                }
            }
        }
        r0 += R;
    }
}

/* The tiles, vec_dot (a 1x1 tile) and matmul of one type; TILE(type, R, C, ...) the tile code. */
#define KERNELS32(name, TYPE, TILE, C4, ROW_SCALES4)                                                 \
    static void tile_##name##_4(const uint8_t *const *wp, const uint8_t *const *ap, int64_t nb,      \
                                float *sums, el_prefetch pf, const __m256 *rowsc) {                  \
        TILE(TYPE, 4, C4, wp, ap, nb, sums, pf, rowsc);                                              \
    }                                                                                                \
    static void tile_##name##_2(const uint8_t *const *wp, const uint8_t *const *ap, int64_t nb,      \
                                float *sums, el_prefetch pf, const __m256 *rowsc) {                  \
        TILE(TYPE, 2, 4, wp, ap, nb, sums, pf, rowsc);                                               \
    }                                                                                                \
    static void tile_##name##_1(const uint8_t *const *wp, const uint8_t *const *ap, int64_t nb,      \
                                float *sums, el_prefetch pf, const __m256 *rowsc) {                  \
        TILE(TYPE, 1, 8, wp, ap, nb, sums, pf, rowsc);                                               \
    }                                                                                                \
    static float dot_##name(const void *w, const void *a, int64_t nb) {                              \
        const uint8_t *wp[1] = {w}, *ap[1] = {a};                                                    \
        float sums[16];                                                                              \
        TILE(TYPE, 1, 1, wp, ap, nb, sums, el_no_prefetch(), NULL);                                  \
        return sums[0];                                                                              \
    }                                                                                                \
    static void matmul_##name(const void *w, int64_t w_row_bytes, const void *a, int64_t a_row_bytes, \
                              float *out, int64_t out_stride, int64_t nb, int64_t n_rows,            \
                              int64_t o_begin, int64_t o_end) {                                      \
        static const tile_shapes shapes = {tile_##name##_4, tile_##name##_2, tile_##name##_1,        \
                                           C4, 4, 8, ROW_SCALES4};                                   \
        matmul_tiles(&shapes, w, w_row_bytes, a, a_row_bytes, out, out_stride, nb, n_rows, o_begin, o_end); \
    }

static void row_scales_q4_0(const uint8_t *const *ap, int64_t nb, __m256 *rowsc) {
    nib_row_scales(EL_TYPE_Q4_0, 4, 4, ap, nb, rowsc);
}
static void row_scales_q4_1(const uint8_t *const *ap, int64_t nb, __m256 *rowsc) {
    nib_row_scales(EL_TYPE_Q4_1, 4, 4, ap, nb, rowsc);
}
static void row_scales_q5_0(const uint8_t *const *ap, int64_t nb, __m256 *rowsc) {
    nib_row_scales(EL_TYPE_Q5_0, 4, 4, ap, nb, rowsc);
}

KERNELS32(q4_0, EL_TYPE_Q4_0, tile_nib, 4, row_scales_q4_0)
KERNELS32(q4_1, EL_TYPE_Q4_1, tile_nib, 4, row_scales_q4_1)
KERNELS32(q5_0, EL_TYPE_Q5_0, tile_nib, 4, row_scales_q5_0)
KERNELS32(q5_1, EL_TYPE_Q5_1, tile32, 2, NULL)
KERNELS32(q8_0, EL_TYPE_Q8_0, tile32, 2, NULL)
KERNELS32(q8_1, EL_TYPE_Q8_1, tile32, 2, NULL)

/* ---- Float types ------------------------------------------------------------------------------
 * The reference multiplies in f32 and accumulates in eight double lanes (element i into lane
 * i % 8), then adds the lanes in order, then the tail: the same here, two __m256d of four lanes. */

EL_AI __m256 load8_f32(const void *row, int64_t i) { return _mm256_loadu_ps((const float *)row + i); }
EL_AI __m256 load8_f16(const void *row, int64_t i) {
    return _mm256_cvtph_ps(el_loadu_128((const uint16_t *)row + i));
}
EL_AI __m256 load8_bf16(const void *row, int64_t i) {
    const __m256i h = _mm256_cvtepu16_epi32(el_loadu_128((const uint16_t *)row + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
}

EL_AI float load1(const int type, const void *row, int64_t i) {
    switch (type) {
    case EL_TYPE_F32: return ((const float *)row)[i];
    case EL_TYPE_F16: return el_fp16_to_fp32(((const uint16_t *)row)[i]);
    default: return el_bf16_to_fp32(((const uint16_t *)row)[i]);
    }
}

EL_AI __m256 load8(const int type, const void *row, int64_t i) {
    switch (type) {
    case EL_TYPE_F32: return load8_f32(row, i);
    case EL_TYPE_F16: return load8_f16(row, i);
    default: return load8_bf16(row, i);
    }
}

EL_AI float dot_float(const int type, const void *w, const void *a, int64_t n) {
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd(); /* lanes 0-3, 4-7 */
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 p = _mm256_mul_ps(load8(type, w, i), load8(type, a, i));
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(p)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(p, 1)));
    }
    double lane[8];
    _mm256_storeu_pd(lane, lo);
    _mm256_storeu_pd(lane + 4, hi);
    double sum = 0.0;
    for (int l = 0; l < 8; l++) sum += lane[l];
    for (; i < n; i++) sum += (double)(load1(type, w, i) * load1(type, a, i));
    return (float)sum;
}

static float dot_f32(const void *w, const void *a, int64_t n) { return dot_float(EL_TYPE_F32, w, a, n); }
static float dot_f16(const void *w, const void *a, int64_t n) { return dot_float(EL_TYPE_F16, w, a, n); }
static float dot_bf16(const void *w, const void *a, int64_t n) { return dot_float(EL_TYPE_BF16, w, a, n); }

/* f32 -> f16, bit for bit el_fp32_to_fp16. */
static void quantize_f16(const float *x, void *vy, int64_t n) {
    uint16_t *y = vy;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm_storeu_si128((__m128i *)(y + i), el_f32_to_f16_8(_mm256_loadu_ps(x + i)));
    for (; i < n; i++) y[i] = el_fp32_to_fp16(x[i]);
}

/* f32 -> bf16, bit for bit el_fp32_to_bf16: round to nearest even, NaN -> quiet NaN. */
static void quantize_bf16(const float *x, void *vy, int64_t n) {
    uint16_t *y = vy;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(x + i));
        const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
        const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
        const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                               _mm256_set1_epi32(0x7f800000));
        const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(64));
        const __m256i h = _mm256_blendv_epi8(rounded, quiet, nan); /* each lane <= 0xFFFF */
        const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
        _mm_storeu_si128((__m128i *)(y + i), packed);
    }
    for (; i < n; i++) y[i] = el_fp32_to_bf16(x[i]);
}

/* ---- Activation quantizers -------------------------------------------------------------------- */

/* One Q8_0/Q8_1 block: the reference's amax, d = amax / 127, id = 1 / d and roundf(x * id);
 * returns d (before f16 rounding) and the 32 quants as int32 lanes in i[4]. */
EL_AI float quantize_block_q8(const float *x, uint16_t *d_out, int8_t *qs, __m256i i[4]) {
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
        v[k] = _mm256_loadu_ps(x + 8 * k);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v[k]));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float d = _mm_cvtss_f32(m) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    *d_out = el_fp32_to_fp16(d);
    const __m256 idv = _mm256_set1_ps(id);
    for (int k = 0; k < 4; k++) i[k] = _mm256_cvttps_epi32(el_round_half_away(_mm256_mul_ps(v[k], idv)));
    _mm256_storeu_si256((__m256i *)qs, el_pack_i32_to_i8(i[0], i[1], i[2], i[3]));
    return d;
}

/* Whole groups of eight blocks in quantize_q8_avx2.c, the rest here. */
static void quantize_q8_0(const float *x, void *vy, int64_t nb) {
    el_block_q8_0 *y = vy;
    __m256i i[4];
    el_quantize_q8_0_by8_avx2(x, vy, nb);
    for (int64_t b = nb / 8 * 8; b < nb; b++) quantize_block_q8(x + b * QK, &y[b].d, y[b].qs, i);
}

static void quantize_q8_1(const float *x, void *vy, int64_t nb) {
    el_block_q8_1 *y = vy;
    __m256i i[4];
    el_quantize_q8_1_by8_avx2(x, vy, nb);
    x += nb / 8 * 8 * QK;
    for (int64_t b = nb / 8 * 8; b < nb; b++, x += QK) {
        const float d = quantize_block_q8(x, &y[b].d, y[b].qs, i);
        const int32_t sum = el_hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3])));
        y[b].s = el_fp32_to_fp16((float)sum * d);
    }
}

/* ggml's quantize_row_q8_K_ref, as quants_k.c: the first element of largest magnitude sets
 * iscale = -127 / max; q = round-half-even(iscale * x) capped at 127; bsums per 16. */
static void quantize_q8_K(const float *x, void *vy, int64_t nb) {
    el_block_q8_K *y = vy;
    for (int64_t b = 0; b < nb; b++, x += QK_K) {
        __m256 amax = _mm256_setzero_ps();
        for (int k = 0; k < QK_K; k += 8) {
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_loadu_ps(x + k)));
        }
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        const float amax_s = _mm_cvtss_f32(m);
        memset(&y[b], 0, sizeof(y[b]));
        if (!(amax_s > 0.0f)) continue; /* all zero: the reference's max == 0 */
        float max = 0.0f;
        const __m256 target = _mm256_set1_ps(amax_s);
        for (int k = 0; k < QK_K; k += 8) { /* the first element whose magnitude is amax */
            const __m256 abs = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_loadu_ps(x + k));
            const int hit = _mm256_movemask_ps(_mm256_cmp_ps(abs, target, _CMP_EQ_OQ));
            if (hit) {
                max = x[k + __builtin_ctz((unsigned)hit)];
                break;
            }
        }
        const float iscale = -127.0f / max;
        const __m256 sv = _mm256_set1_ps(iscale);
        for (int k = 0; k < QK_K; k += 32) {
            __m256i q[4];
            for (int j = 0; j < 4; j++) {
                /* cvtps rounds half to even (MXCSR default), as nearest_int does for |v| < 2^22 */
                q[j] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(sv, _mm256_loadu_ps(x + k + 8 * j))),
                                        _mm256_set1_epi32(127));
            }
            _mm256_storeu_si256((__m256i *)(y[b].qs + k), el_pack_i32_to_i8(q[0], q[1], q[2], q[3]));
            y[b].bsums[k / 16] = (int16_t)el_hsum_epi32(_mm256_add_epi32(q[0], q[1]));
            y[b].bsums[k / 16 + 1] = (int16_t)el_hsum_epi32(_mm256_add_epi32(q[2], q[3]));
        }
        y[b].d = 1.0f / iscale;
    }
}

/* ---- Table ------------------------------------------------------------------------------------ */

static const struct {
    int32_t type;
    el_simd_quant_kernels k;
} KERNELS[] = {
    {EL_TYPE_F32, {NULL, dot_f32, NULL}},
    {EL_TYPE_F16, {quantize_f16, dot_f16, NULL}},
    {EL_TYPE_BF16, {quantize_bf16, dot_bf16, NULL}},
    {EL_TYPE_Q4_0, {NULL, dot_q4_0, matmul_q4_0}},
    {EL_TYPE_Q4_1, {NULL, dot_q4_1, matmul_q4_1}},
    {EL_TYPE_Q5_0, {NULL, dot_q5_0, matmul_q5_0}},
    {EL_TYPE_Q5_1, {NULL, dot_q5_1, matmul_q5_1}},
    {EL_TYPE_Q8_0, {quantize_q8_0, dot_q8_0, matmul_q8_0}},
    {EL_TYPE_Q8_1, {quantize_q8_1, dot_q8_1, matmul_q8_1}},
    {EL_TYPE_Q8_K, {quantize_q8_K, NULL, NULL}},
};

const el_simd_quant_kernels *el_avx2_quant(int32_t type) {
    for (size_t i = 0; i < sizeof(KERNELS) / sizeof(KERNELS[0]); i++) {
        if (KERNELS[i].type == type) return &KERNELS[i].k;
    }
    return NULL;
}

#include "avx2_target_end.h"

#endif /* __x86_64__ */

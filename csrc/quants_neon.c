/*
 * quants_neon.c: AArch64 NEON variants, with the dot-product instructions (SDOT, Armv8.2's
 * FEAT_DotProd), of the quantized dot products of every block type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0;
 * the K-quants Q2_K..Q6_K and Q8_K, whose super-blocks are decoded by the reference's own
 * el_k_decode and summed by SDOT) and of the interleaved products (el_matmul_x8: Q4_1, Q8_0,
 * Q4_K, Q5_K, Q6_K).
 * simd_dispatch.c hands these out once NEON is chosen (the CPU reports the dot-product
 * instructions); the file is compiled for them with a target pragma, so nothing in it may run
 * before that choice. The float types' dot products, the quantizers and the row operations run
 * their scalar references on AArch64 (compiled with the baseline NEON the compiler vectorizes to).
 *
 * Bit-identical to the references in quants.c, as the AVX2 kernels are: a block's integer sum is
 * exact however it is formed (SDOT adds four int8 products into an int32 lane), and the float work
 * on it is the reference's own expression in its order: scalar for one row, lane by lane (one
 * output per lane, vmulq/vaddq, never a fused multiply-add) for the interleaved products.
 *
 * Tested bit for bit against the references on random data under qemu-aarch64
 * (tests/neon_qemu.rs with tests/c/neon_check.c).
 */
#if defined(__aarch64__)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("dotprod"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")
#endif

#include <arm_neon.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "el_blocks.h"
#include "el_internal.h"
#include "simd_internal.h"

#define EL_AI static inline __attribute__((always_inline))

/* A block's 32 quants from its nibbles: elements 0..15 low, 16..31 high (quants.c's unpack). */
EL_AI void nibbles(const uint8_t *qs, int8x16_t *lo, int8x16_t *hi) {
    const uint8x16_t v = vld1q_u8(qs);
    *lo = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F)));
    *hi = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
}

/* 0x10 in the bytes whose fifth bit (bit i of qh, little-endian) is set: elements 0..15, 16..31. */
EL_AI void fifth_bits(const uint8_t *qh, uint8x16_t *lo, uint8x16_t *hi) {
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t mask = vld1q_u8(bit), b4 = vdupq_n_u8(0x10);
    *lo = vandq_u8(vtstq_u8(vcombine_u8(vdup_n_u8(qh[0]), vdup_n_u8(qh[1])), mask), b4);
    *hi = vandq_u8(vtstq_u8(vcombine_u8(vdup_n_u8(qh[2]), vdup_n_u8(qh[3])), mask), b4);
}

/* The integer dot product of 32 quants (lo: elements 0..15, hi: 16..31) with an activation block. */
EL_AI int32_t isum32(const int8x16_t lo, const int8x16_t hi, const int8_t *a) {
    const int32x4_t acc = vdotq_s32(vdotq_s32(vdupq_n_s32(0), lo, vld1q_s8(a)), hi, vld1q_s8(a + 16));
    return vaddvq_s32(acc);
}

/* ---- One row against one activation row: the references' float work, per block -------------- */

/* Block i's 32 quants as the reference's dot product multiplies them (lo: elements 0..15, hi:
 * 16..31): Q4_0 q - 8, Q4_1 q, Q5_0 q - 16 (its dot - 16 * (sum - high sum) as one exact sum),
 * Q5_1 q, Q8_0 as stored. `type` is a constant where this is inlined. */
EL_AI void quants32(const int32_t type, const void *block, int8x16_t *lo, int8x16_t *hi) {
    uint8x16_t blo, bhi;
    switch (type) {
    case EL_TYPE_Q4_0:
        nibbles(((const el_block_q4_0 *)block)->qs, lo, hi);
        *lo = vsubq_s8(*lo, vdupq_n_s8(8));
        *hi = vsubq_s8(*hi, vdupq_n_s8(8));
        break;
    case EL_TYPE_Q4_1:
        nibbles(((const el_block_q4_1 *)block)->qs, lo, hi);
        break;
    case EL_TYPE_Q5_0:
        nibbles(((const el_block_q5_0 *)block)->qs, lo, hi);
        fifth_bits(((const el_block_q5_0 *)block)->qh, &blo, &bhi);
        *lo = vsubq_s8(vorrq_s8(*lo, vreinterpretq_s8_u8(blo)), vdupq_n_s8(16));
        *hi = vsubq_s8(vorrq_s8(*hi, vreinterpretq_s8_u8(bhi)), vdupq_n_s8(16));
        break;
    case EL_TYPE_Q5_1:
        nibbles(((const el_block_q5_1 *)block)->qs, lo, hi);
        fifth_bits(((const el_block_q5_1 *)block)->qh, &blo, &bhi);
        *lo = vorrq_s8(*lo, vreinterpretq_s8_u8(blo));
        *hi = vorrq_s8(*hi, vreinterpretq_s8_u8(bhi));
        break;
    default: /* Q8_0 */
        *lo = vld1q_s8(((const el_block_q8_0 *)block)->qs);
        *hi = vld1q_s8(((const el_block_q8_0 *)block)->qs + 16);
        break;
    }
}

/* The reference's loop: per block, (d_w d_a) isum, plus m_w s_a for the types with a min (against
 * Q8_1), added to the running sum. Every block type starts with its f16 d (and m). */
EL_AI float dot32(const int32_t type, const int64_t block_bytes, const void *vw, const void *va, int64_t nb) {
    const int with_min = type == EL_TYPE_Q4_1 || type == EL_TYPE_Q5_1;
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        const uint16_t *w = (const uint16_t *)((const uint8_t *)vw + i * block_bytes);
        int8x16_t lo, hi;
        quants32(type, w, &lo, &hi);
        if (with_min) {
            const el_block_q8_1 *a = (const el_block_q8_1 *)va + i;
            const int32_t isum = isum32(lo, hi, a->qs);
            sum += (el_fp16_to_fp32(w[0]) * el_fp16_to_fp32(a->d)) * (float)isum +
                   el_fp16_to_fp32(w[1]) * el_fp16_to_fp32(a->s);
        } else {
            const el_block_q8_0 *a = (const el_block_q8_0 *)va + i;
            const int32_t isum = isum32(lo, hi, a->qs);
            sum += (el_fp16_to_fp32(w[0]) * el_fp16_to_fp32(a->d)) * (float)isum;
        }
    }
    return sum;
}

#define DOT32(TYPE, name, act)                                                                     \
    static float dot_##name##_##act(const void *w, const void *a, int64_t nb) {                    \
        return dot32(TYPE, sizeof(el_block_##name), w, a, nb);                                     \
    }
DOT32(EL_TYPE_Q4_0, q4_0, q8_0)
DOT32(EL_TYPE_Q4_1, q4_1, q8_1)
DOT32(EL_TYPE_Q5_0, q5_0, q8_0)
DOT32(EL_TYPE_Q5_1, q5_1, q8_1)
DOT32(EL_TYPE_Q8_0, q8_0, q8_0)
#undef DOT32

/* ---- The K-quants: the reference's decoded form (el_k_decode), its sums by SDOT --------------
 * quants_k.c's dot_sub with the sub-block sums u . qa formed by SDOT; the scale, offset and min
 * terms and the float expression are the reference's. */

EL_AI float dot_k(const int32_t type, const int64_t block_bytes, const void *vw, const void *va, int64_t nb) {
    const el_block_q8_K *a = va;
    el_k_scales s;
    int8_t u[QK_K] __attribute__((aligned(16)));
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        el_k_decode(type, (const uint8_t *)vw + i * block_bytes, &s, u);
        int32_t isum = 0;
        if (s.sub == 32) {
            for (int j = 0; j < QK_K / 32; j++) {
                const int32x4_t p = vdotq_s32(vdotq_s32(vdupq_n_s32(0), vld1q_s8(u + 32 * j), vld1q_s8(a[i].qs + 32 * j)),
                                              vld1q_s8(u + 32 * j + 16), vld1q_s8(a[i].qs + 32 * j + 16));
                isum += (int32_t)s.scale[j] * vaddvq_s32(p);
            }
        } else {
            for (int j = 0; j < QK_K / 16; j++) {
                const int32x4_t p = vdotq_s32(vdupq_n_s32(0), vld1q_s8(u + 16 * j), vld1q_s8(a[i].qs + 16 * j));
                isum += (int32_t)s.scale[j] * vaddvq_s32(p);
            }
        }
        int32_t osum = 0, msum = 0;
        for (int g = 0; g < QK_K / 16; g++) {
            osum += (int32_t)a[i].bsums[g] * (int32_t)s.scale[g * 16 / s.sub];
            msum += (int32_t)a[i].bsums[g] * (int32_t)s.min[g * 16 / s.sub];
        }
        isum -= s.offset * osum;
        sum += (s.d * a[i].d) * (float)isum - (s.dmin * a[i].d) * (float)msum;
    }
    return sum;
}

#define K_DOT(TYPE, name)                                                                          \
    static float dot_##name(const void *w, const void *a, int64_t nb) {                            \
        return dot_k(TYPE, sizeof(el_block_##name), w, a, nb);                                     \
    }
K_DOT(EL_TYPE_Q2_K, q2_K)
K_DOT(EL_TYPE_Q3_K, q3_K)
K_DOT(EL_TYPE_Q4_K, q4_K)
K_DOT(EL_TYPE_Q5_K, q5_K)
K_DOT(EL_TYPE_Q6_K, q6_K)
K_DOT(EL_TYPE_Q8_K, q8_K)
#undef K_DOT

static const struct {
    int32_t type;
    el_simd_quant_kernels k;
} KERNELS[] = {
    {EL_TYPE_Q4_0, {NULL, dot_q4_0_q8_0, NULL}}, {EL_TYPE_Q4_1, {NULL, dot_q4_1_q8_1, NULL}},
    {EL_TYPE_Q5_0, {NULL, dot_q5_0_q8_0, NULL}}, {EL_TYPE_Q5_1, {NULL, dot_q5_1_q8_1, NULL}},
    {EL_TYPE_Q8_0, {NULL, dot_q8_0_q8_0, NULL}}, {EL_TYPE_Q2_K, {NULL, dot_q2_K, NULL}},
    {EL_TYPE_Q3_K, {NULL, dot_q3_K, NULL}},      {EL_TYPE_Q4_K, {NULL, dot_q4_K, NULL}},
    {EL_TYPE_Q5_K, {NULL, dot_q5_K, NULL}},      {EL_TYPE_Q6_K, {NULL, dot_q6_K, NULL}},
    {EL_TYPE_Q8_K, {NULL, dot_q8_K, NULL}},
};

const el_simd_quant_kernels *el_neon_quant(int32_t type) {
    for (size_t i = 0; i < sizeof(KERNELS) / sizeof(KERNELS[0]); i++) {
        if (KERNELS[i].type == type) return &KERNELS[i].k;
    }
    return NULL;
}

/* ---- Rows interleaved in eights ----------------------------------------------------------------
 * The layouts keep a row per 32-bit lane (el_blocks.h), so SDOT by lane (vdotq_laneq_s32: four
 * weight bytes of each row times one broadcast group of four activation bytes) sums rows 0..3 and
 * 4..7 in two vectors with no reduction. */

/* Block i's integer sums of the group's rows 0..3 (*s0) and 4..7 (*s1) against activation quants aq. */
EL_AI void q4_1x8_isums(const el_block_q4_1x8 *b, const int8_t *aq, int32x4_t *s0, int32x4_t *s1) {
    const int8x16_t alo = vld1q_s8(aq), ahi = vld1q_s8(aq + 16);
    const uint8x16_t low4 = vdupq_n_u8(0x0F);
    int32x4_t acc0 = vdupq_n_s32(0), acc1 = vdupq_n_s32(0);
#define EL_Q4_1X8_STEP(k)                                                                            \
    do {                                                                                             \
        const uint8x16_t w0 = vld1q_u8(b->qs[k][0]), w1 = vld1q_u8(b->qs[k][4]);                     \
        acc0 = vdotq_laneq_s32(acc0, vreinterpretq_s8_u8(vandq_u8(w0, low4)), alo, k);               \
        acc1 = vdotq_laneq_s32(acc1, vreinterpretq_s8_u8(vandq_u8(w1, low4)), alo, k);               \
        acc0 = vdotq_laneq_s32(acc0, vreinterpretq_s8_u8(vshrq_n_u8(w0, 4)), ahi, k);                \
        acc1 = vdotq_laneq_s32(acc1, vreinterpretq_s8_u8(vshrq_n_u8(w1, 4)), ahi, k);                \
    } while (0)
    EL_Q4_1X8_STEP(0);
    EL_Q4_1X8_STEP(1);
    EL_Q4_1X8_STEP(2);
    EL_Q4_1X8_STEP(3);
#undef EL_Q4_1X8_STEP
    *s0 = acc0;
    *s1 = acc1;
}

EL_AI void q8_0x8_isums(const el_block_q8_0x8 *b, const int8_t *aq, int32x4_t *s0, int32x4_t *s1) {
    const int8x16_t alo = vld1q_s8(aq), ahi = vld1q_s8(aq + 16);
    int32x4_t acc0 = vdupq_n_s32(0), acc1 = vdupq_n_s32(0);
#define EL_Q8_0X8_STEP(k, a, lane)                                                                   \
    do {                                                                                             \
        acc0 = vdotq_laneq_s32(acc0, vld1q_s8(b->qs[k][0]), a, lane);                                \
        acc1 = vdotq_laneq_s32(acc1, vld1q_s8(b->qs[k][4]), a, lane);                                \
    } while (0)
    EL_Q8_0X8_STEP(0, alo, 0);
    EL_Q8_0X8_STEP(1, alo, 1);
    EL_Q8_0X8_STEP(2, alo, 2);
    EL_Q8_0X8_STEP(3, alo, 3);
    EL_Q8_0X8_STEP(4, ahi, 0);
    EL_Q8_0X8_STEP(5, ahi, 1);
    EL_Q8_0X8_STEP(6, ahi, 2);
    EL_Q8_0X8_STEP(7, ahi, 3);
#undef EL_Q8_0X8_STEP
    *s0 = acc0;
    *s1 = acc1;
}

/* Eight f16 values as two float vectors. */
EL_AI void f16x8(const uint16_t *h, float32x4_t *lo, float32x4_t *hi) {
    const float16x8_t v = vreinterpretq_f16_u16(vld1q_u16(h));
    *lo = vcvt_f32_f16(vget_low_f16(v));
    *hi = vcvt_high_f32_f16(v);
}

/* One activation row against groups [g_begin, g_end): per block, the reference's
 * (dw * da) * isum (+ mw * sa), added to each row's running sum, lane by lane. */
static void matvec_x8(int32_t type, const void *w8, const uint8_t *act, float *out, int64_t nb, int64_t g_begin,
                      int64_t g_end) {
    for (int64_t g = g_begin; g < g_end; g++) {
        float32x4_t sum0 = vdupq_n_f32(0.0f), sum1 = vdupq_n_f32(0.0f);
        for (int64_t i = 0; i < nb; i++) {
            int32x4_t s0, s1;
            float32x4_t dw0, dw1, t0, t1;
            if (type == EL_TYPE_Q4_1) {
                const el_block_q4_1x8 *b = (const el_block_q4_1x8 *)w8 + g * nb + i;
                const el_block_q8_1 *a = (const el_block_q8_1 *)act + i;
                q4_1x8_isums(b, a->qs, &s0, &s1);
                float32x4_t mw0, mw1;
                f16x8(b->d, &dw0, &dw1);
                f16x8(b->m, &mw0, &mw1);
                const float32x4_t da = vdupq_n_f32(el_fp16_to_fp32(a->d)), sa = vdupq_n_f32(el_fp16_to_fp32(a->s));
                t0 = vaddq_f32(vmulq_f32(vmulq_f32(dw0, da), vcvtq_f32_s32(s0)), vmulq_f32(mw0, sa));
                t1 = vaddq_f32(vmulq_f32(vmulq_f32(dw1, da), vcvtq_f32_s32(s1)), vmulq_f32(mw1, sa));
            } else {
                const el_block_q8_0x8 *b = (const el_block_q8_0x8 *)w8 + g * nb + i;
                const el_block_q8_0 *a = (const el_block_q8_0 *)act + i;
                q8_0x8_isums(b, a->qs, &s0, &s1);
                f16x8(b->d, &dw0, &dw1);
                const float32x4_t da = vdupq_n_f32(el_fp16_to_fp32(a->d));
                t0 = vmulq_f32(vmulq_f32(dw0, da), vcvtq_f32_s32(s0));
                t1 = vmulq_f32(vmulq_f32(dw1, da), vcvtq_f32_s32(s1));
            }
            sum0 = vaddq_f32(sum0, t0);
            sum1 = vaddq_f32(sum1, t1);
        }
        vst1q_f32(out + 8 * g, sum0);
        vst1q_f32(out + 8 * g + 4, sum1);
    }
}

/* ---- The K-quants interleaved: Q4_K, Q5_K, Q6_K ----------------------------------------------
 * Per sub-block, SDOT of four weight bytes of each row against four activation bytes broadcast
 * sums rows 0..3 or 4..7 (half h2 of the group) a lane each; times the sub-block's scale, added
 * up: the reference's isum, and its offset and mins' sums through bsums (quants_k.c's dot_sub),
 * then its float line lane by lane. */

/* Four activation bytes in every 32-bit lane. */
EL_AI int8x16_t broadcast4(const int8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return vreinterpretq_s8_u32(vdupq_n_u32(v));
}

/* Byte j of each lane's word, zero-extended (sign-extended with is_signed). */
EL_AI int32x4_t word_byte(const uint32x4_t v, const int j, const int is_signed) {
    if (is_signed) return vshlq_s32(vshlq_s32(vreinterpretq_s32_u32(v), vdupq_n_s32(24 - 8 * j)), vdupq_n_s32(-24));
    return vreinterpretq_s32_u32(vandq_u32(vshlq_u32(v, vdupq_n_s32(-8 * j)), vdupq_n_u32(0xFF)));
}

/* Each byte shifted left by s (s < 0: right), then masked. */
EL_AI uint8x16_t shift_mask(const uint8x16_t v, const int s, const uint8_t mask) {
    return vandq_u8(vshlq_u8(v, vdupq_n_s8((int8_t)s)), vdupq_n_u8(mask));
}

/* The float line of rows 4 h2 .. 4 h2 + 3: sum += (d * da) * isum - (dmin * da) * msum. */
EL_AI float32x4_t add_k_block(const float32x4_t sum, const float32x4_t d, const float32x4_t dmin, const float da,
                              const int32x4_t isum, const int32x4_t msum) {
    const float32x4_t vda = vdupq_n_f32(da);
    return vaddq_f32(sum, vsubq_f32(vmulq_f32(vmulq_f32(d, vda), vcvtq_f32_s32(isum)),
                                    vmulq_f32(vmulq_f32(dmin, vda), vcvtq_f32_s32(msum))));
}

/* Q4_K or Q5_K super-block b's sums of rows 4 h2 .. 4 h2 + 3 against activation block a. */
EL_AI void k4x8_sums(const int32_t type, const uint8_t *b, const int h2, const el_block_q8_K *a, int32x4_t *isum,
                     int32x4_t *msum) {
    const int q5 = type == EL_TYPE_Q5_K;
    const uint8_t(*scales)[8][4] = q5 ? ((const el_block_q5_Kx8 *)b)->scales : ((const el_block_q4_Kx8 *)b)->scales;
    const uint8_t(*qs)[8][4] = q5 ? ((const el_block_q5_Kx8 *)b)->qs : ((const el_block_q4_Kx8 *)b)->qs;
    /* quants_k.c's scale_min_k4 on four rows' words */
    const uint32x4_t w0 = vld1q_u32((const uint32_t *)scales[0][4 * h2]);
    const uint32x4_t w1 = vld1q_u32((const uint32_t *)scales[1][4 * h2]);
    const uint32x4_t w2 = vld1q_u32((const uint32_t *)scales[2][4 * h2]);
    const uint32x4_t m6 = vdupq_n_u32(0x3F3F3F3Fu), m4 = vdupq_n_u32(0x0F0F0F0Fu), m2 = vdupq_n_u32(0x03030303u);
    const uint32x4_t sc[2] = {vandq_u32(w0, m6),
                              vorrq_u32(vandq_u32(w2, m4), vshlq_n_u32(vandq_u32(vshrq_n_u32(w0, 6), m2), 4))};
    const uint32x4_t mn[2] = {vandq_u32(w1, m6), vorrq_u32(vandq_u32(vshrq_n_u32(w2, 4), m4),
                                                           vshlq_n_u32(vandq_u32(vshrq_n_u32(w1, 6), m2), 4))};
    int32x4_t is = vdupq_n_s32(0), ms = vdupq_n_s32(0);
    for (int j = 0; j < 8; j += 2) { /* sub-blocks j (low nibbles) and j + 1 (high) */
        int32x4_t lo_sum = vdupq_n_s32(0), hi_sum = vdupq_n_s32(0);
        for (int k = 0; k < 8; k++) {
            const uint8x16_t w = vld1q_u8(qs[4 * j + k][4 * h2]);
            uint8x16_t lo = vandq_u8(w, vdupq_n_u8(0x0F)), hi = vshrq_n_u8(w, 4);
            if (q5) {
                const uint8x16_t h = vld1q_u8(((const el_block_q5_Kx8 *)b)->qh[k][4 * h2]);
                lo = vorrq_u8(lo, shift_mask(h, 4 - j, 0x10));
                hi = vorrq_u8(hi, shift_mask(h, 3 - j, 0x10));
            }
            lo_sum = vdotq_s32(lo_sum, vreinterpretq_s8_u8(lo), broadcast4(a->qs + 32 * j + 4 * k));
            hi_sum = vdotq_s32(hi_sum, vreinterpretq_s8_u8(hi), broadcast4(a->qs + 32 * j + 32 + 4 * k));
        }
        is = vmlaq_s32(is, lo_sum, word_byte(sc[j / 4], j % 4, 0));
        is = vmlaq_s32(is, hi_sum, word_byte(sc[j / 4], j % 4 + 1, 0));
    }
    for (int j = 0; j < 8; j++) {
        ms = vmlaq_n_s32(ms, word_byte(mn[j / 4], j % 4, 0), (int32_t)a->bsums[2 * j] + (int32_t)a->bsums[2 * j + 1]);
    }
    *isum = is;
    *msum = ms;
}

/* Q6_K super-block b's isum of rows 4 h2 .. 4 h2 + 3 against activation block a. */
EL_AI int32x4_t q6x8_isum(const el_block_q6_Kx8 *b, const int h2, const el_block_q8_K *a) {
    int32x4_t is = vdupq_n_s32(0), os = vdupq_n_s32(0);
    for (int run = 0; run < 8; run++) {
        const int h = run / 4, k = run % 4;
        int32x4_t sub_sum[2] = {vdupq_n_s32(0), vdupq_n_s32(0)}; /* sub-blocks 2 run and 2 run + 1 */
        for (int m = 0; m < 8; m++) {
            const uint8x16_t ql = vld1q_u8(b->ql[16 * h + 8 * (k % 2) + m][4 * h2]);
            const uint8x16_t qh = vld1q_u8(b->qh[8 * h + m][4 * h2]);
            const uint8x16_t u = vorrq_u8(shift_mask(ql, -4 * (k / 2), 0x0F), shift_mask(qh, 4 - 2 * k, 0x30));
            sub_sum[m / 4] = vdotq_s32(sub_sum[m / 4], vreinterpretq_s8_u8(u), broadcast4(a->qs + 32 * run + 4 * m));
        }
        for (int half = 0; half < 2; half++) {
            const int j = 2 * run + half;
            const uint32x4_t scales = vld1q_u32((const uint32_t *)b->scales[j / 4][4 * h2]);
            is = vmlaq_s32(is, sub_sum[half], word_byte(scales, j % 4, 1));
        }
    }
    for (int g = 0; g < 16; g++) {
        os = vmlaq_n_s32(os, word_byte(vld1q_u32((const uint32_t *)b->scales[g / 4][4 * h2]), g % 4, 1), a->bsums[g]);
    }
    return vsubq_s32(is, vshlq_n_s32(os, 5));
}

/* One activation row against groups [g_begin, g_end) of Q4_K, Q5_K or Q6_K. */
static void matvec_k_x8(int32_t type, const void *w8, const el_block_q8_K *act, float *out, int64_t nb, int64_t g_begin,
                        int64_t g_end) {
    const int64_t gb = 8 * el_type_block_bytes(type);
    for (int64_t g = g_begin; g < g_end; g++) {
        float32x4_t sum[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
        for (int64_t i = 0; i < nb; i++) {
            const uint8_t *b = (const uint8_t *)w8 + (g * nb + i) * gb;
            float32x4_t d[2], dmin[2];
            if (type == EL_TYPE_Q6_K) {
                f16x8(((const el_block_q6_Kx8 *)b)->d, &d[0], &d[1]);
                dmin[0] = dmin[1] = vdupq_n_f32(0.0f);
            } else {
                f16x8(((const el_block_q4_Kx8 *)b)->d, &d[0], &d[1]);
                f16x8(((const el_block_q4_Kx8 *)b)->dmin, &dmin[0], &dmin[1]);
            }
            for (int h2 = 0; h2 < 2; h2++) {
                int32x4_t isum, msum = vdupq_n_s32(0);
                if (type == EL_TYPE_Q6_K) isum = q6x8_isum((const el_block_q6_Kx8 *)b, h2, act + i);
                else k4x8_sums(type, b, h2, act + i, &isum, &msum);
                sum[h2] = add_k_block(sum[h2], d[h2], dmin[h2], act[i].d, isum, msum);
            }
        }
        vst1q_f32(out + 8 * g, sum[0]);
        vst1q_f32(out + 8 * g + 4, sum[1]);
    }
}

_Static_assert(offsetof(el_block_q5_Kx8, d) == offsetof(el_block_q4_Kx8, d) &&
                   offsetof(el_block_q5_Kx8, dmin) == offsetof(el_block_q4_Kx8, dmin),
               "Q5_K's group starts as Q4_K's");

void el_matmul_x8_neon(int32_t type, const void *w8, const void *a, int64_t a_row_bytes, float *out,
                       int64_t out_stride, int64_t nb, int64_t n_rows, int64_t g_begin, int64_t g_end) {
    const int k_quant = type == EL_TYPE_Q4_K || type == EL_TYPE_Q5_K || type == EL_TYPE_Q6_K;
    for (int64_t r = 0; r < n_rows; r++) {
        const uint8_t *row = (const uint8_t *)a + r * a_row_bytes;
        if (k_quant) matvec_k_x8(type, w8, (const el_block_q8_K *)row, out + r * out_stride, nb, g_begin, g_end);
        else matvec_x8(type, w8, row, out + r * out_stride, nb, g_begin, g_end);
    }
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif /* __aarch64__ */

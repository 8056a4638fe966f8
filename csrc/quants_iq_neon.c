/*
 * quants_iq_neon.c: AArch64 NEON variants, with the dot-product instructions (SDOT), of the IQ
 * types' dot products (IQ4_NL and MXFP4 against Q8_0; IQ4_XS, IQ3_S, IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S,
 * IQ1_S, IQ1_M against Q8_K), bit-identical to the references in quants_iq.c; their matrix
 * products are el_matmul's output-by-output loop over these. simd_dispatch.c hands them out
 * once NEON is chosen; the file is compiled for the dot product with a target pragma, so
 * nothing in it may run before that choice.
 *
 * A run of 32 elements is decoded into signed int8 quants (two vectors of 16: codebook grid
 * points gathered by index, sign bits expanded to byte masks; IQ4's nibbles through a TBL of
 * kvalues) and summed against the activations by SDOT, each 16-element half times its integer
 * sub-scale ls: the reference's exact integer isum. The float step per block is the reference's
 * expression, in its order. Tested under qemu-aarch64 (tests/neon_qemu.rs, tests/c/neon_check.c).
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
#include "el_iq_tables.h"
#include "simd_internal.h"

#define EL_AI static inline __attribute__((always_inline))

/* A run of 32 decoded elements: q = elements 0..15 (lo) and 16..31 (hi), ls their sub-scales. */
typedef struct {
    int8x16_t lo, hi;
    int32_t ls0, ls1;
} iq_run;

EL_AI uint32_t load_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Sixteen grid bytes (two 8-element points) with the sign bits of bytes s0, s1 applied. */
EL_AI int8x16_t signed16(const uint8x16_t grid, const uint8_t s0, const uint8_t s1) {
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t m = vtstq_u8(vcombine_u8(vdup_n_u8(s0), vdup_n_u8(s1)), vld1q_u8(bit));
    return vreinterpretq_s8_u8(vsubq_u8(veorq_u8(grid, m), m));
}

EL_AI uint8x16_t grid2(const uint64_t *grid, const int i0, const int i1) {
    return vcombine_u8(vcreate_u8(grid[i0]), vcreate_u8(grid[i1]));
}

EL_AI uint8x16_t grid4_32(const uint32_t *grid, const int i0, const int i1, const int i2, const int i3) {
    const uint32_t v[4] = {grid[i0], grid[i1], grid[i2], grid[i3]};
    return vreinterpretq_u8_u32(vld1q_u32(v));
}

/* Grid points (32 bytes) with four sign bytes (the u32 `signs`, element 8k + j by bit j of byte k). */
EL_AI iq_run grid_run(const uint8x16_t lo, const uint8x16_t hi, const uint32_t signs, const int ls0,
                      const int ls1) {
    iq_run r;
    r.lo = signed16(lo, (uint8_t)signs, (uint8_t)(signs >> 8));
    r.hi = signed16(hi, (uint8_t)(signs >> 16), (uint8_t)(signs >> 24));
    r.ls0 = ls0;
    r.ls1 = ls1;
    return r;
}

/* Four 7-bit sign indices (bits 0, 7, 14, 21 of v) as four sign bytes with their parity bit. */
EL_AI uint32_t ksigns4(const uint32_t v) {
    return (uint32_t)el_ksigns_iq2xs[v & 127] | (uint32_t)el_ksigns_iq2xs[(v >> 7) & 127] << 8 |
           (uint32_t)el_ksigns_iq2xs[(v >> 14) & 127] << 16 | (uint32_t)el_ksigns_iq2xs[(v >> 21) & 127] << 24;
}

/* Elements 0..15 (low nibbles) and 16..31 (high) of 16 bytes through kvalues_iq4nl. */
EL_AI void iq4_values(const uint8_t *qs, int8x16_t *lo, int8x16_t *hi) {
    const int8x16_t kv = vld1q_s8(el_kvalues_iq4nl);
    const uint8x16_t v = vld1q_u8(qs);
    *lo = vqtbl1q_s8(kv, vandq_u8(v, vdupq_n_u8(0x0F)));
    *hi = vqtbl1q_s8(kv, vshrq_n_u8(v, 4));
}

/* IQ1's 8 * grid + shift, grid bytes -1, 0, 1, shift bytes -1 or +1 per 8 elements. */
EL_AI int8x16_t iq1_values(const uint8x16_t grid, const int neg0, const int neg1) {
    const int8x16_t shift = vcombine_s8(vdup_n_s8(neg0 ? -1 : 1), vdup_n_s8(neg1 ? -1 : 1));
    return vaddq_s8(vshlq_n_s8(vreinterpretq_s8_u8(grid), 3), shift);
}

/* Run b (elements 32 b .. 32 b + 31) of a super-block of `type` (decode_* in quants_iq.c). */
EL_AI iq_run iq_decode_run(const int type, const uint8_t *blk, const int b) {
    iq_run r;
    switch (type) {
    case EL_TYPE_IQ4_XS: {
        const el_block_iq4_xs *x = (const el_block_iq4_xs *)blk;
        iq4_values(x->qs + 16 * b, &r.lo, &r.hi);
        r.ls0 = r.ls1 = (((x->scales_l[b / 2] >> 4 * (b % 2)) & 0xf) | (((x->scales_h >> 2 * b) & 3) << 4)) - 32;
        return r;
    }
    case EL_TYPE_IQ2_XXS: {
        const uint8_t *q = blk + 2 + 8 * b;
        const uint32_t aux1 = load_u32(q + 4);
        const int ls = 2 * (int)(aux1 >> 28) + 1;
        return grid_run(grid2(el_iq2xxs_grid, q[0], q[1]), grid2(el_iq2xxs_grid, q[2], q[3]), ksigns4(aux1), ls, ls);
    }
    case EL_TYPE_IQ2_XS: {
        const el_block_iq2_xs *x = (const el_block_iq2_xs *)blk;
        uint16_t v[4];
        memcpy(v, x->qs + 4 * b, sizeof(v));
        const uint32_t signs = (uint32_t)v[0] >> 9 | ((uint32_t)v[1] >> 9) << 7 | ((uint32_t)v[2] >> 9) << 14 |
                               ((uint32_t)v[3] >> 9) << 21;
        const int sc = x->scales[b];
        return grid_run(grid2(el_iq2xs_grid, v[0] & 511, v[1] & 511), grid2(el_iq2xs_grid, v[2] & 511, v[3] & 511),
                        ksigns4(signs), 2 * (sc & 0xf) + 1, 2 * (sc >> 4) + 1);
    }
    case EL_TYPE_IQ2_S: {
        const el_block_iq2_s *x = (const el_block_iq2_s *)blk;
        const uint8_t *qs = x->qs + 4 * b;
        const int qh = x->qh[b], sc = x->scales[b];
        return grid_run(grid2(el_iq2s_grid, qs[0] | ((qh << 8) & 0x300), qs[1] | ((qh << 6) & 0x300)),
                        grid2(el_iq2s_grid, qs[2] | ((qh << 4) & 0x300), qs[3] | ((qh << 2) & 0x300)),
                        load_u32(x->qs + QK_K / 8 + 4 * b), 2 * (sc & 0xf) + 1, 2 * (sc >> 4) + 1);
    }
    case EL_TYPE_IQ3_XXS: {
        const el_block_iq3_xxs *x = (const el_block_iq3_xxs *)blk;
        const uint8_t *q = x->qs + 8 * b;
        const uint32_t aux = load_u32(x->qs + QK_K / 4 + 4 * b);
        const int ls = 2 * (int)(aux >> 28) + 1;
        return grid_run(grid4_32(el_iq3xxs_grid, q[0], q[1], q[2], q[3]),
                        grid4_32(el_iq3xxs_grid, q[4], q[5], q[6], q[7]), ksigns4(aux), ls, ls);
    }
    case EL_TYPE_IQ3_S: {
        const el_block_iq3_s *x = (const el_block_iq3_s *)blk;
        const uint8_t *q = x->qs + 8 * b;
        const int qh = x->qh[b];
#define IQ3S(k) (q[k] | (((qh >> (k)) & 1) << 8))
        const int sc = x->scales[b / 2];
        const int ls = 1 + 2 * (b % 2 == 0 ? sc & 0xf : sc >> 4);
        return grid_run(grid4_32(el_iq3s_grid, IQ3S(0), IQ3S(1), IQ3S(2), IQ3S(3)),
                        grid4_32(el_iq3s_grid, IQ3S(4), IQ3S(5), IQ3S(6), IQ3S(7)), load_u32(x->signs + 4 * b), ls, ls);
#undef IQ3S
    }
    case EL_TYPE_IQ1_S: {
        const el_block_iq1_s *x = (const el_block_iq1_s *)blk;
        const uint8_t *qs = x->qs + 4 * b;
        const int qh = x->qh[b], neg = qh & 0x8000;
        r.lo = iq1_values(grid2(el_iq1s_grid, qs[0] | ((qh << 8) & 0x700), qs[1] | ((qh << 5) & 0x700)), neg, neg);
        r.hi = iq1_values(grid2(el_iq1s_grid, qs[2] | ((qh << 2) & 0x700), qs[3] | ((qh >> 1) & 0x700)), neg, neg);
        r.ls0 = r.ls1 = 2 * ((qh >> 12) & 7) + 1;
        return r;
    }
    default: { /* EL_TYPE_IQ1_M */
        const el_block_iq1_m *x = (const el_block_iq1_m *)blk;
        const uint8_t *qs = x->qs + 4 * b;
        const int qh0 = x->qh[2 * b], qh1 = x->qh[2 * b + 1];
        r.lo = iq1_values(grid2(el_iq1s_grid, qs[0] | ((qh0 << 8) & 0x700), qs[1] | ((qh0 << 4) & 0x700)),
                          qh0 & 0x08, qh0 & 0x80);
        r.hi = iq1_values(grid2(el_iq1s_grid, qs[2] | ((qh1 << 8) & 0x700), qs[3] | ((qh1 << 4) & 0x700)),
                          qh1 & 0x08, qh1 & 0x80);
        uint16_t sc;
        memcpy(&sc, x->scales + 2 * (b / 2), sizeof(sc));
        sc = (uint16_t)(sc >> 6 * (b % 2));
        r.ls0 = 2 * (sc & 7) + 1;
        r.ls1 = 2 * ((sc >> 3) & 7) + 1;
        return r;
    }
    }
}

EL_AI size_t iq_block_bytes(const int type) {
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

/* The super-scale d (IQ1_M's spread over the top nibbles of its four scale words). */
EL_AI float iq_d(const int type, const uint8_t *blk) {
    uint16_t d;
    if (type == EL_TYPE_IQ1_M) {
        uint16_t sc[4];
        memcpy(sc, ((const el_block_iq1_m *)blk)->scales, sizeof(sc));
        d = (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
    } else {
        memcpy(&d, blk, sizeof(d)); /* the block's first field */
    }
    return el_fp16_to_fp32(d);
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

EL_AI float dot_iq(const int type, const void *vw, const void *va, int64_t nb) {
    const uint8_t *w = vw;
    const el_block_q8_K *a = va;
    const size_t wb = iq_block_bytes(type);
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *blk = w + i * wb;
        int32x4_t acc = vdupq_n_s32(0);
        for (int b = 0; b < QK_K / 32; b++) {
            const iq_run r = iq_decode_run(type, blk, b);
            const int8_t *aq = a[i].qs + 32 * b;
            acc = vmlaq_n_s32(acc, vdotq_s32(vdupq_n_s32(0), r.lo, vld1q_s8(aq)), r.ls0);
            acc = vmlaq_n_s32(acc, vdotq_s32(vdupq_n_s32(0), r.hi, vld1q_s8(aq + 16)), r.ls1);
        }
        sum += (iq_d(type, blk) * a[i].d) * (float)vaddvq_s32(acc);
    }
    return sum * iq_factor(type);
}

static float dot_iq4_nl(const void *vw, const void *va, int64_t nb) {
    const el_block_iq4_nl *w = vw;
    const el_block_q8_0 *a = va;
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int8x16_t lo, hi;
        iq4_values(w[i].qs, &lo, &hi);
        const int32x4_t acc = vdotq_s32(vdotq_s32(vdupq_n_s32(0), lo, vld1q_s8(a[i].qs)), hi, vld1q_s8(a[i].qs + 16));
        sum += (el_fp16_to_fp32(w[i].d) * el_fp16_to_fp32(a[i].d)) * (float)vaddvq_s32(acc);
    }
    return sum;
}

/* MXFP4 against Q8_0 (quants_mxfp4.c): per block (d_a * 2^(e - 128)) * isum, as the reference. */
static float dot_mxfp4(const void *vw, const void *va, int64_t nb) {
    const el_block_mxfp4 *w = vw;
    const el_block_q8_0 *a = va;
    const int8x16_t kv = vld1q_s8(el_kvalues_mxfp4);
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        const uint8x16_t v = vld1q_u8(w[i].qs);
        const int8x16_t lo = vqtbl1q_s8(kv, vandq_u8(v, vdupq_n_u8(0x0F)));
        const int8x16_t hi = vqtbl1q_s8(kv, vshrq_n_u8(v, 4));
        const int32x4_t acc = vdotq_s32(vdotq_s32(vdupq_n_s32(0), lo, vld1q_s8(a[i].qs)), hi, vld1q_s8(a[i].qs + 16));
        sum += (el_fp16_to_fp32(a[i].d) * el_e8m0_to_fp32_half(w[i].e)) * (float)vaddvq_s32(acc);
    }
    return sum;
}

#define DOT_IQ(name, TYPE) \
    static float dot_##name(const void *w, const void *a, int64_t nb) { return dot_iq(TYPE, w, a, nb); }
DOT_IQ(iq4_xs, EL_TYPE_IQ4_XS)
DOT_IQ(iq3_s, EL_TYPE_IQ3_S)
DOT_IQ(iq3_xxs, EL_TYPE_IQ3_XXS)
DOT_IQ(iq2_xxs, EL_TYPE_IQ2_XXS)
DOT_IQ(iq2_xs, EL_TYPE_IQ2_XS)
DOT_IQ(iq2_s, EL_TYPE_IQ2_S)
DOT_IQ(iq1_s, EL_TYPE_IQ1_S)
DOT_IQ(iq1_m, EL_TYPE_IQ1_M)

static const struct {
    int32_t type;
    el_simd_quant_kernels k;
} KERNELS[] = {
    {EL_TYPE_IQ4_NL, {NULL, dot_iq4_nl, NULL}},   {EL_TYPE_IQ4_XS, {NULL, dot_iq4_xs, NULL}},
    {EL_TYPE_IQ3_S, {NULL, dot_iq3_s, NULL}},     {EL_TYPE_IQ3_XXS, {NULL, dot_iq3_xxs, NULL}},
    {EL_TYPE_IQ2_XXS, {NULL, dot_iq2_xxs, NULL}}, {EL_TYPE_IQ2_XS, {NULL, dot_iq2_xs, NULL}},
    {EL_TYPE_IQ2_S, {NULL, dot_iq2_s, NULL}},     {EL_TYPE_IQ1_S, {NULL, dot_iq1_s, NULL}},
    {EL_TYPE_IQ1_M, {NULL, dot_iq1_m, NULL}},     {EL_TYPE_MXFP4, {NULL, dot_mxfp4, NULL}},
};

const el_simd_quant_kernels *el_neon_quant_iq(int32_t type) {
    for (size_t i = 0; i < sizeof(KERNELS) / sizeof(KERNELS[0]); i++) {
        if (KERNELS[i].type == type) return &KERNELS[i].k;
    }
    return NULL;
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif /* __aarch64__ */

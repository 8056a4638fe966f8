/*
 * el_internal.h: helpers shared by the kernel sources (not part of the Rust boundary):
 * half and bfloat16 conversions, exact to IEEE round-to-nearest-even like ggml's.
 */
#ifndef EL_INTERNAL_H
#define EL_INTERNAL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float el_bits_to_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t el_f32_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* IEEE half -> float (all cases: zero, subnormal, inf, nan). */
static inline float el_fp16_to_fp32(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & UINT32_C(0x80000000);
    const uint32_t two_w = w + w;
    const uint32_t exp_offset = UINT32_C(0xE0) << 23;
    const float exp_scale = 0x1.0p-112f;
    const float normalized = el_bits_to_f32((two_w >> 4) + exp_offset) * exp_scale;
    const uint32_t magic_mask = UINT32_C(126) << 23;
    const float magic_bias = 0.5f;
    const float denormalized = el_bits_to_f32((two_w >> 17) | magic_mask) - magic_bias;
    const uint32_t denormalized_cutoff = UINT32_C(1) << 27;
    const uint32_t result =
        sign | (two_w < denormalized_cutoff ? el_f32_to_bits(denormalized) : el_f32_to_bits(normalized));
    return el_bits_to_f32(result);
}

/* float -> IEEE half, round to nearest even. */
static inline uint16_t el_fp32_to_fp16(float f) {
    const float scale_to_inf = 0x1.0p+112f;
    const float scale_to_zero = 0x1.0p-110f;
    float base = (f < 0 ? -f : f) * scale_to_inf * scale_to_zero;
    const uint32_t w = el_f32_to_bits(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & UINT32_C(0x80000000);
    uint32_t bias = shl1_w & UINT32_C(0xFF000000);
    if (bias < UINT32_C(0x71000000)) bias = UINT32_C(0x71000000);
    base = el_bits_to_f32((bias >> 1) + UINT32_C(0x07800000)) + base;
    const uint32_t bits = el_f32_to_bits(base);
    const uint32_t exp_bits = (bits >> 13) & UINT32_C(0x00007C00);
    const uint32_t mantissa_bits = bits & UINT32_C(0x00000FFF);
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return (uint16_t)((sign >> 16) | (shl1_w > UINT32_C(0xFF000000) ? UINT16_C(0x7E00) : nonsign));
}

static inline float el_bf16_to_fp32(uint16_t h) { return el_bits_to_f32((uint32_t)h << 16); }

/* float -> bfloat16, round to nearest even; NaN stays a quiet NaN (as ggml). */
static inline uint16_t el_fp32_to_bf16(float f) {
    uint32_t u = el_f32_to_bits(f);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 64);
    return (uint16_t)((u + (0x7fff + ((u >> 16) & 1))) >> 16);
}

/* An E8M0 scale byte halved: 2^(e - 128), as ggml's ggml_e8m0_to_fp32_half (e = 0 and 1 give the
 * subnormals 2^-128 and 2^-127; e = 255, NaN in E8M0, gives 2^127 as there). */
static inline float el_e8m0_to_fp32_half(uint8_t e) {
    return el_bits_to_f32(e < 2 ? UINT32_C(0x00200000) << e : (uint32_t)(e - 1) << 23);
}

/* ---- Attention's arithmetic, shared by ops.c's reference and its SIMD versions -------------------
 * Keys are taken EL_ATTN_CHUNK at a time, from the first key the window lets in; a SIMD version
 * holds a chunk's scores in its lanes and computes, bit for bit, what the reference does. */
#define EL_ATTN_CHUNK 8

/* ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)): how q.k's eight partial sums (partial d % 8)
 * and the softmax normaliser's eight lanes are added up (two hadds and a cross-lane add). */
static inline float el_tree8(const float p[8]) {
    return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

/* exp(x) for x <= 0, the softmax's only exp: Cephes' expf (x = n ln2 + r, |r| <= ln2 / 2, a
 * degree-7 polynomial for e^r, times 2^n through the exponent bits) with fmaf at each step, so
 * an FMA vector unit computes the same bits; 0 below EL_EXP_MIN (and for -inf and NaN).
 * Relative error about 2e-7. */
#define EL_EXP_MIN (-87.0f)
#define EL_EXP_LOG2E 1.44269504088896341f
#define EL_EXP_C1 0.693359375f
#define EL_EXP_C2 (-2.12194440e-4f)
#define EL_EXP_P0 1.9875691500e-4f
#define EL_EXP_P1 1.3981999507e-3f
#define EL_EXP_P2 8.3334519073e-3f
#define EL_EXP_P3 4.1665795894e-2f
#define EL_EXP_P4 1.6666665459e-1f
#define EL_EXP_P5 5.0000001201e-1f

/* exp(x) for x <= 0 as above, scalar (fmaf: one rounding per step on any CPU). */
static inline float el_exp_nonpos(float x) {
    if (!(x >= EL_EXP_MIN)) return 0.0f;
    const float n = rintf(x * EL_EXP_LOG2E);
    float r = fmaf(n, -EL_EXP_C1, x);
    r = fmaf(n, -EL_EXP_C2, r);
    float y = EL_EXP_P0;
    y = fmaf(y, r, EL_EXP_P1);
    y = fmaf(y, r, EL_EXP_P2);
    y = fmaf(y, r, EL_EXP_P3);
    y = fmaf(y, r, EL_EXP_P4);
    y = fmaf(y, r, EL_EXP_P5);
    y = fmaf(y, r * r, r);
    y = y + 1.0f;
    return y * el_bits_to_f32((uint32_t)((int32_t)n + 127) << 23);
}

/* The factor an online softmax's accumulated output is multiplied by at the end, from its running
 * max m and normaliser l: 1 / l, or with a sink (gpt-oss's learned per-head logit, a score whose
 * value row is zero: it only adds to the normaliser) c / (l c + 1) when the sink exceeds m, with
 * c = exp(m - sink), else 1 / (l + exp(sink - m)), as ggml's flash attention adds its sinks.
 * 0 when the normaliser is 0. */
static inline float el_attn_out_scale(float m, float l, const float *sink) {
    float c = 1.0f;
    if (sink != NULL) {
        if (*sink > m) {
            c = el_exp_nonpos(m - *sink);
            l = fmaf(l, c, 1.0f);
        } else {
            l = l + el_exp_nonpos(*sink - m);
        }
    }
    return l > 0.0f ? c / l : 0.0f;
}

#endif /* EL_INTERNAL_H */

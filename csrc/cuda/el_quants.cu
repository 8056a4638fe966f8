/*
 * el_quants.cu: the tensor types on the GPU: dequantized rows (embedding lookups), activation
 * quantizers, and matrix products for every weight type the CPU path supports. Launched only from
 * src/cuda/kernels.rs, which checks every shape first; the C references in csrc/quants.c and
 * csrc/quants_k.c are the truth these are tested against (tests/cuda_kernels.rs).
 *
 * A matrix product works like the C one: activations are quantized once per row to the weight
 * type's vec_dot type (Q8_0, Q8_1, Q8_K, or the float type itself), then every output element is
 * a dot product of a weight row with an activation row, integer sums of int8 products (__dp4a)
 * scaled in float. Rows are read in units of 32 elements: a block of the 32-element types, or one
 * of the eight runs of 32 of a K-quant super-block, decoded into one form (el_wunit) whose
 * integer quants already have the type's offset taken out:
 *     x[e] = d * sc[e / 16] * q[e] - m * mn[e / 16]   (K-quants; for Q8_K's bsums)
 *     x[e] = d * q[e]  or  d * q[e] + m               (Q4_0/Q5_0/Q8_0, Q4_1/Q5_1)
 *     x[e] = s[e / 32] * q[e]  or  s[e / 16] * q[e]   (the IQ types' codebook values, el_iq.cuh).
 *
 * Lane l of a warp sums the units l, l + 32, l + 64, ... of its output in that order, and the
 * warp then adds its 32 lanes in a fixed butterfly. Both product kernels (el_cuda_mmv_* for a few
 * rows, el_cuda_mm_* tiled through shared memory for many) follow exactly that order, so an output
 * element is the same bits whichever kernel ran and whatever else is in the batch, as on the CPU.
 */
#include "el_cuda_common.cuh"

/* ---- Decoded units ------------------------------------------------------------------------------ */

struct el_wunit {
    int32_t q[8];  /* 32 signed quants, offset removed, four per int (element 4k + i in byte i of q[k]) */
    float d;       /* scale (super-scale for K-quants) */
    float m;       /* min of Q4_1/Q5_1, dmin of the K-quants, 0 otherwise */
    int32_t sc[2]; /* integer scale of elements 0-15 and 16-31 (1 for the 32-element types) */
    int32_t mn[2]; /* integer min of elements 0-15 and 16-31 (K-quants) */
};

struct el_aunit {
    int32_t q[8]; /* 32 int8 activation quants */
    float d;      /* scale */
    float s;      /* Q8_1: d * sum(q), for the weight's min */
    int32_t bs[2]; /* Q8_K: sums of q over elements 0-15 and 16-31 */
};

/* How a weight unit and an activation unit combine. */
#define EL_KIND_SYM 0  /* Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4 against Q8_0 */
#define EL_KIND_MIN 1  /* Q4_1, Q5_1 against Q8_1 */
#define EL_KIND_K 2    /* K-quants against Q8_K */
#define EL_KIND_IQ32 3 /* IQ types with one float scale per 32 elements (w.d), against Q8_K */
#define EL_KIND_IQ16 4 /* IQ types with a float scale per 16 (w.d, then w.m), against Q8_K */

#include "el_iq.cuh"

/* Bit 4 of byte i set from bit i of the nibble `bits` (the fifth bit of four 5-bit quants). */
__device__ __forceinline__ uint32_t el_spread_bits4(uint32_t bits) {
    return ((bits & 1u) << 4) | ((bits & 2u) << 11) | ((bits & 4u) << 18) | ((bits & 8u) << 25);
}

/* The 32-element types: unit u is block u. */
template <int T>
__device__ __forceinline__ void el_load_w32(const uint8_t *row, int64_t u, el_wunit &w) {
    w.sc[0] = w.sc[1] = 1;
    w.mn[0] = w.mn[1] = 0;
    w.m = 0.0f;
    if (T == EL_TYPE_Q8_0) {
        const uint8_t *b = row + u * EL_Q8_0_BYTES;
        w.d = el_ldh(b);
#pragma unroll
        for (int k = 0; k < 8; k++) w.q[k] = el_ld32_a2(b + 2 + 4 * k);
        return;
    }
    const int bytes = T == EL_TYPE_Q4_0 ? EL_Q4_0_BYTES : T == EL_TYPE_Q4_1 ? EL_Q4_1_BYTES
                      : T == EL_TYPE_Q5_0 ? EL_Q5_0_BYTES : EL_Q5_1_BYTES;
    const uint8_t *b = row + u * bytes;
    w.d = el_ldh(b);
    const uint8_t *qs;
    uint32_t qh = 0;
    if (T == EL_TYPE_Q4_0) {
        qs = b + 2;
    } else if (T == EL_TYPE_Q4_1) {
        w.m = el_ldh(b + 2);
        qs = b + 4;
    } else if (T == EL_TYPE_Q5_0) {
        qh = (uint32_t)el_ld32_a2(b + 2);
        qs = b + 6;
    } else {
        w.m = el_ldh(b + 2);
        qh = (uint32_t)el_ld32_a2(b + 4);
        qs = b + 8;
    }
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const uint32_t v = (uint32_t)el_ld32_a2(qs + 4 * k);
        uint32_t lo = v & 0x0f0f0f0fu;        /* elements 4k .. 4k + 3 */
        uint32_t hi = (v >> 4) & 0x0f0f0f0fu; /* elements 16 + 4k .. */
        if (T == EL_TYPE_Q5_0 || T == EL_TYPE_Q5_1) {
            lo |= el_spread_bits4((qh >> (4 * k)) & 0xfu);
            hi |= el_spread_bits4((qh >> (16 + 4 * k)) & 0xfu);
        }
        if (T == EL_TYPE_Q4_0) {
            lo = __vsub4(lo, 0x08080808u);
            hi = __vsub4(hi, 0x08080808u);
        } else if (T == EL_TYPE_Q5_0) {
            lo = __vsub4(lo, 0x10101010u);
            hi = __vsub4(hi, 0x10101010u);
        }
        w.q[k] = (int32_t)lo;
        w.q[4 + k] = (int32_t)hi;
    }
}

/* The 6-bit scale and min of sub-block j of q4_K/q5_K (ggml's get_scale_min_k4). */
__device__ __forceinline__ void el_scale_min_k4(int j, const uint8_t *s, int32_t *sc, int32_t *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* The 6-bit scale of sub-block j of q3_K, minus 32. */
__device__ __forceinline__ int32_t el_q3_scale(int j, const uint8_t *s) {
    const int low = j < 8 ? s[j] & 0xF : s[j - 8] >> 4;
    const int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    return (low | (high << 4)) - 32;
}

/* The K-quants: unit u is run u % 8 (elements 32 (u % 8) .. + 32) of super-block u / 8; its
 * elements sit in bytes base + l of a field at a shift fixed for the run (csrc/quants_k.c,
 * el_run). */
template <int T>
__device__ __forceinline__ void el_load_wk(const uint8_t *row, int64_t u, el_wunit &w) {
    const int r = (int)(u % 8);
    if (T == EL_TYPE_Q2_K) {
        const uint8_t *b = row + (u / 8) * EL_Q2_K_BYTES;
        const uint8_t *qs = b + 16 + (r / 4) * 32;
        const int shift = 2 * (r % 4);
#pragma unroll
        for (int k = 0; k < 8; k++) w.q[k] = (int32_t)(((uint32_t)el_ld32_a2(qs + 4 * k) >> shift) & 0x03030303u);
        w.d = el_ldh(b + 80);
        w.m = el_ldh(b + 82);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            w.sc[h] = b[2 * r + h] & 0xF;
            w.mn[h] = b[2 * r + h] >> 4;
        }
    } else if (T == EL_TYPE_Q3_K) {
        const uint8_t *b = row + (u / 8) * EL_Q3_K_BYTES;
        const uint8_t *qs = b + 32 + (r / 4) * 32;
        const int shift = 2 * (r % 4);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const uint32_t low = ((uint32_t)el_ld32_a2(qs + 4 * k) >> shift) & 0x03030303u;
            const uint32_t high = (((uint32_t)el_ld32_a2(b + 4 * k) >> r) & 0x01010101u) << 2;
            w.q[k] = (int32_t)__vsub4(low | high, 0x04040404u);
        }
        w.d = el_ldh(b + 108);
        w.m = 0.0f;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            w.sc[h] = el_q3_scale(2 * r + h, b + 96);
            w.mn[h] = 0;
        }
    } else if (T == EL_TYPE_Q4_K || T == EL_TYPE_Q5_K) {
        const int bytes = T == EL_TYPE_Q4_K ? EL_Q4_K_BYTES : EL_Q5_K_BYTES;
        const uint8_t *b = row + (u / 8) * bytes;
        const uint8_t *qs = b + (T == EL_TYPE_Q4_K ? 16 : 48) + (r / 2) * 32;
        const int shift = 4 * (r % 2);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            uint32_t v = ((uint32_t)el_ld32_a2(qs + 4 * k) >> shift) & 0x0f0f0f0fu;
            if (T == EL_TYPE_Q5_K) v |= (((uint32_t)el_ld32_a2(b + 16 + 4 * k) >> r) & 0x01010101u) << 4;
            w.q[k] = (int32_t)v;
        }
        w.d = el_ldh(b);
        w.m = el_ldh(b + 2);
        int32_t sc, mn;
        el_scale_min_k4(r, b + 4, &sc, &mn);
        w.sc[0] = w.sc[1] = sc;
        w.mn[0] = w.mn[1] = mn;
    } else { /* Q6_K */
        const uint8_t *b = row + (u / 8) * EL_Q6_K_BYTES;
        const uint8_t *ql = b + (r / 4) * 64 + (r % 2) * 32;
        const int lshift = 4 * ((r % 4) / 2);
        const uint8_t *qh = b + 128 + (r / 4) * 32;
        const int hshift = 2 * (r % 4);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const uint32_t low = ((uint32_t)el_ld32_a2(ql + 4 * k) >> lshift) & 0x0f0f0f0fu;
            const uint32_t high = (((uint32_t)el_ld32_a2(qh + 4 * k) >> hshift) & 0x03030303u) << 4;
            w.q[k] = (int32_t)__vsub4(low | high, 0x20202020u);
        }
        w.d = el_ldh(b + 208);
        w.m = 0.0f;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            w.sc[h] = (int8_t)b[192 + 2 * r + h];
            w.mn[h] = 0;
        }
    }
}

template <int T>
struct el_traits {
    static constexpr bool iq = T == EL_TYPE_IQ2_XXS || T == EL_TYPE_IQ2_XS || T == EL_TYPE_IQ2_S ||
                               T == EL_TYPE_IQ3_XXS || T == EL_TYPE_IQ3_S || T == EL_TYPE_IQ1_S ||
                               T == EL_TYPE_IQ1_M || T == EL_TYPE_IQ4_NL || T == EL_TYPE_IQ4_XS ||
                               T == EL_TYPE_MXFP4;
    static constexpr int kind =
        (T == EL_TYPE_Q4_1 || T == EL_TYPE_Q5_1) ? EL_KIND_MIN
        : (T == EL_TYPE_Q4_0 || T == EL_TYPE_Q5_0 || T == EL_TYPE_Q8_0 || T == EL_TYPE_IQ4_NL ||
           T == EL_TYPE_MXFP4)                                                                ? EL_KIND_SYM
        : (T == EL_TYPE_IQ2_XS || T == EL_TYPE_IQ2_S || T == EL_TYPE_IQ1_M)                    ? EL_KIND_IQ16
        : iq                                                                                   ? EL_KIND_IQ32
                                                                                               : EL_KIND_K;
};

template <int T>
__device__ __forceinline__ void el_load_w(const uint8_t *row, int64_t u, el_wunit &w) {
    if (el_traits<T>::iq) {
        el_load_w_iq<T>(row, u, w);
    } else if (T == EL_TYPE_Q2_K || T == EL_TYPE_Q3_K || T == EL_TYPE_Q4_K || T == EL_TYPE_Q5_K ||
               T == EL_TYPE_Q6_K) {
        el_load_wk<T>(row, u, w);
    } else {
        el_load_w32<T>(row, u, w);
    }
}

/* Activation unit u of a row of the vec_dot type of `kind` (Q8_K for the K and IQ kinds). */
template <int KIND>
__device__ __forceinline__ void el_load_a(const uint8_t *row, int64_t u, el_aunit &a) {
    if (KIND == EL_KIND_SYM) {
        const uint8_t *b = row + u * EL_Q8_0_BYTES;
        a.d = el_ldh(b);
        a.s = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) a.q[k] = el_ld32_a2(b + 2 + 4 * k);
        a.bs[0] = a.bs[1] = 0;
    } else if (KIND == EL_KIND_MIN) {
        const uint8_t *b = row + u * EL_Q8_1_BYTES;
        a.d = el_ldh(b);
        a.s = el_ldh(b + 2);
#pragma unroll
        for (int k = 0; k < 8; k++) a.q[k] = el_ld32_a2(b + 4 + 4 * k);
        a.bs[0] = a.bs[1] = 0;
    } else {
        const int r = (int)(u % 8);
        const uint8_t *b = row + (u / 8) * EL_Q8_K_BYTES;
        a.d = __int_as_float(el_ld32_a2(b));
        a.s = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) a.q[k] = el_ld32_a2(b + 4 + 32 * r + 4 * k);
        a.bs[0] = (int16_t)el_ld16(b + 260 + 4 * r);
        a.bs[1] = (int16_t)el_ld16(b + 262 + 4 * r);
    }
}

/* One unit's share of a dot product, with the C references' float arithmetic per block:
 * (d * da) * isum [+ m * s] for the 32-element types, (d * da) * isum - (dmin * da) * msum for
 * the K-quants, (scale * da) * isum per group of 32 or 16 for the IQ types. */
template <int KIND>
__device__ __forceinline__ float el_unit_dot(const el_wunit &w, const el_aunit &a) {
    int32_t lo = 0, hi = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        lo = __dp4a(w.q[k], a.q[k], lo);
        hi = __dp4a(w.q[4 + k], a.q[4 + k], hi);
    }
    if (KIND == EL_KIND_SYM) return (w.d * a.d) * (float)(lo + hi);
    if (KIND == EL_KIND_MIN) return (w.d * a.d) * (float)(lo + hi) + w.m * a.s;
    if (KIND == EL_KIND_IQ32) return (w.d * a.d) * (float)(lo + hi);
    if (KIND == EL_KIND_IQ16) return (w.d * a.d) * (float)lo + (w.m * a.d) * (float)hi;
    const int32_t isum = w.sc[0] * lo + w.sc[1] * hi;
    const int32_t msum = w.mn[0] * a.bs[0] + w.mn[1] * a.bs[1];
    return (w.d * a.d) * (float)isum - (w.m * a.d) * (float)msum;
}

/* ---- Dequantized rows (embedding lookups) ----------------------------------------------------- */

/* out[t][0 .. n_in) = row ids[t] of w dequantized, times scale. One thread per unit of 32. */
template <int T>
__device__ void el_get_rows(const uint8_t *w /* [n_rows][w_row_bytes] */, int64_t w_row_bytes,
                                   const int32_t *ids /* [n_ids] */, float *out /* [n_ids][n_in] */,
                                   int64_t n_in, int64_t n_ids, float scale) {
    const int64_t t = blockIdx.y;
    const int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_ids || u >= n_in / 32) return;
    const uint8_t *row = w + (int64_t)ids[t] * w_row_bytes;
    float *y = out + t * n_in + u * 32;
    el_wunit q;
    el_load_w<T>(row, u, q);
    const int kind = el_traits<T>::kind;
#pragma unroll
    for (int e = 0; e < 32; e++) {
        const int v = (int8_t)(q.q[e / 4] >> (8 * (e % 4)));
        float x;
        if (kind == EL_KIND_SYM || kind == EL_KIND_IQ32) {
            x = (float)v * q.d;
        } else if (kind == EL_KIND_IQ16) {
            x = (float)v * (e < 16 ? q.d : q.m);
        } else if (kind == EL_KIND_MIN) {
            x = (float)v * q.d + q.m;
        } else {
            const float dl = q.d * (float)q.sc[e / 16];
            const float ml = q.m * (float)q.mn[e / 16];
            x = dl * (float)v - ml;
        }
        y[e] = x * scale;
    }
}

/* The float types: one thread per element, any n_in. */
template <int T>
__device__ void el_get_rows_float(const uint8_t *w, int64_t w_row_bytes, const int32_t *ids, float *out,
                                         int64_t n_in, int64_t n_ids, float scale) {
    const int64_t t = blockIdx.y;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_ids || i >= n_in) return;
    const uint8_t *row = w + (int64_t)ids[t] * w_row_bytes;
    float x;
    if (T == EL_TYPE_F32) {
        x = ((const float *)row)[i];
    } else if (T == EL_TYPE_F16) {
        x = el_h2f(((const uint16_t *)row)[i]);
    } else {
        x = el_bf2f(((const uint16_t *)row)[i]);
    }
    out[t * n_in + i] = x * scale;
}

/* ---- Activation quantizers (byte-identical to csrc/quants.c and quants_k.c) ------------------- */

/* Q8_0 / Q8_1, ggml's quantize_row_q8_{0,1}_ref: one warp per block of 32, lane = element. */
template <bool WITH_SUM>
__device__ void el_quantize_q8(const float *x, uint8_t *y, int64_t n_blocks) {
    const int64_t blk = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / EL_WARP;
    const int lane = threadIdx.x % EL_WARP;
    if (blk >= n_blocks) return;
    const float v = x[blk * EL_QK + lane];
    const float amax = el_warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const int q = (int)roundf(v * id);
    uint8_t *b = y + blk * (WITH_SUM ? EL_Q8_1_BYTES : EL_Q8_0_BYTES);
    uint8_t *qs = b + (WITH_SUM ? 4 : 2);
    qs[lane] = (uint8_t)(int8_t)q;
    const int sum = el_warp_sum_i(q);
    if (lane == 0) {
        *(uint16_t *)b = el_f2h(d);
        if (WITH_SUM) *(uint16_t *)(b + 2) = el_f2h((float)sum * d);
    }
}

extern "C" __global__ void el_cuda_quantize_q8_0(const float *x /* [n_blocks * 32] */, uint8_t *y /* [n_blocks] Q8_0 */,
                                                 int64_t n_blocks) {
    el_quantize_q8<false>(x, y, n_blocks);
}

extern "C" __global__ void el_cuda_quantize_q8_1(const float *x /* [n_blocks * 32] */, uint8_t *y /* [n_blocks] Q8_1 */,
                                                 int64_t n_blocks) {
    el_quantize_q8<true>(x, y, n_blocks);
}

/* ggml's nearest_int: round to nearest, ties to even, through the float mantissa. */
__device__ __forceinline__ int el_nearest_int(float f) {
    const float v = f + 12582912.0f;
    return (int)(__float_as_uint(v) & 0x007fffffu) - 0x00400000;
}

/* Q8_K, ggml's quantize_row_q8_K_ref: one warp per super-block of 256, lane l owns elements
 * 8 l .. 8 l + 8. The scale comes from the first element of largest magnitude. */
extern "C" __global__ void el_cuda_quantize_q8_K(const float *x /* [n_blocks * 256] */, uint8_t *y /* [n_blocks] Q8_K */,
                                                 int64_t n_blocks) {
    const int64_t blk = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / EL_WARP;
    const int lane = threadIdx.x % EL_WARP;
    if (blk >= n_blocks) return;
    const float *xb = x + blk * EL_QK_K + 8 * lane;
    float v[8];
    float amax = 0.0f;
    int idx = 8 * lane;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        v[i] = xb[i];
        if (fabsf(v[i]) > amax) {
            amax = fabsf(v[i]);
            idx = 8 * lane + i;
        }
    }
#pragma unroll
    for (int o = EL_WARP / 2; o > 0; o /= 2) {
        const float a2 = __shfl_xor_sync(0xffffffffu, amax, o);
        const int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
        if (a2 > amax || (a2 == amax && i2 < idx)) {
            amax = a2;
            idx = i2;
        }
    }
    /* Every lane takes the element at idx (one with |x| = amax, the first such). */
    const float max = amax > 0.0f ? x[blk * EL_QK_K + idx] : 0.0f;
    uint8_t *b = y + blk * EL_Q8_K_BYTES;
    int q[8];
    float d = 0.0f;
    if (max == 0.0f) {
#pragma unroll
        for (int i = 0; i < 8; i++) q[i] = 0;
    } else {
        const float iscale = -127.0f / max;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int t = el_nearest_int(iscale * v[i]);
            q[i] = t < 127 ? t : 127;
        }
        d = 1.0f / iscale;
    }
    uint32_t *qs = (uint32_t *)(b + 4 + 8 * lane);
    qs[0] = (uint32_t)el_pack4(q[0], q[1], q[2], q[3]);
    qs[1] = (uint32_t)el_pack4(q[4], q[5], q[6], q[7]);
    int part = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) part += q[i];
    const int group = part + __shfl_xor_sync(0xffffffffu, part, 1); /* 16 elements: lanes 2g, 2g + 1 */
    if (lane % 2 == 0) *(int16_t *)(b + 260 + 2 * (lane / 2)) = (int16_t)group;
    if (lane == 0) *(float *)b = d;
}

/* Q4_0, ggml's quantize_row_q4_0_ref: one warp per block of 32, lane = element. d is the element
 * of largest magnitude (the first such, as the reference's strict compare) over -8; element j's
 * nibble is min(15, (int8_t)(x * id + 8.5)), packed j | (j + 16) << 4 in byte j. */
__device__ void el_quantize_q4_0_block(const float *x /* [32] */, uint8_t *b /* Q4_0 */) {
    const int lane = threadIdx.x % EL_WARP;
    const float v = x[lane];
    float amax = fabsf(v), max = v;
    int at = lane;
#pragma unroll
    for (int o = EL_WARP / 2; o > 0; o /= 2) {
        const float a2 = __shfl_xor_sync(0xffffffffu, amax, o);
        const float m2 = __shfl_xor_sync(0xffffffffu, max, o);
        const int at2 = __shfl_xor_sync(0xffffffffu, at, o);
        if (a2 > amax || (a2 == amax && at2 < at)) {
            amax = a2;
            max = m2;
            at = at2;
        }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const int8_t l = (int8_t)(v * id + 8.5f);
    const int q = l < 15 ? l : 15;
    const int hi = __shfl_sync(0xffffffffu, q, (lane + 16) % EL_WARP);
    if (lane < 16) b[2 + lane] = (uint8_t)((q & 0x0F) | (hi << 4));
    if (lane == 0) *(uint16_t *)b = el_f2h(d);
}

/* Q8_0 of one block of 32 by one warp (el_quantize_q8's body). */
__device__ void el_quantize_q8_0_block(const float *x /* [32] */, uint8_t *b /* Q8_0 */) {
    const int lane = threadIdx.x % EL_WARP;
    const float v = x[lane];
    const float amax = el_warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[2 + lane] = (uint8_t)(int8_t)(int)roundf(v * id);
    if (lane == 0) *(uint16_t *)b = el_f2h(d);
}

/* One block of 32 of a KV row into a cache of `type` (F16, Q8_0 or Q4_0), by one warp. */
__device__ void el_kv_block(const float *x /* [32] */, uint8_t *row /* one cache row */, int64_t blk, int32_t type) {
    const int lane = threadIdx.x % EL_WARP;
    if (type == EL_TYPE_Q8_0) {
        el_quantize_q8_0_block(x, row + blk * EL_Q8_0_BYTES);
    } else if (type == EL_TYPE_Q4_0) {
        el_quantize_q4_0_block(x, row + blk * EL_Q4_0_BYTES);
    } else {
        ((uint16_t *)row)[blk * EL_QK + lane] = el_f2h(x[lane]);
    }
}

/* The quantized KV write, as el_kv_write in csrc/edge_kernels.h: each token's key and value rows
 * into the cache rows its slot_mapping entry names (slots < 0 skipped), each block of 32 through
 * its type's reference quantizer, so the cache bytes are the C kernel's. One warp per block of 32
 * (blockIdx.x * 4 + warp) of token blockIdx.y; 128 threads. */
extern "C" __global__ void el_cuda_kv_write_q(const float *k /* [n_tokens][kv_dim] */, const float *v /* [n_tokens][kv_dim] */,
                                              uint8_t *k_cache /* [num_slots] rows of k_type */,
                                              uint8_t *v_cache /* [num_slots] rows of v_type */, int32_t k_type,
                                              int32_t v_type, int64_t k_row_bytes, int64_t v_row_bytes,
                                              const int64_t *slot_mapping /* [n_tokens] */, int64_t n_tokens,
                                              int64_t kv_dim) {
    const int64_t t = blockIdx.y;
    const int64_t blk = (int64_t)blockIdx.x * (blockDim.x / EL_WARP) + threadIdx.x / EL_WARP;
    if (t >= n_tokens || blk >= kv_dim / EL_QK) return;
    const int64_t slot = slot_mapping[t];
    if (slot < 0) return;
    el_kv_block(k + t * kv_dim + blk * EL_QK, k_cache + slot * k_row_bytes, blk, k_type);
    el_kv_block(v + t * kv_dim + blk * EL_QK, v_cache + slot * v_row_bytes, blk, v_type);
}

extern "C" __global__ void el_cuda_quantize_f16(const float *x /* [n] */, uint16_t *y /* [n] */, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = el_f2h(x[i]);
}

extern "C" __global__ void el_cuda_quantize_bf16(const float *x /* [n] */, uint16_t *y /* [n] */, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = el_f2bf(x[i]);
}

/* ---- Matrix products -------------------------------------------------------------------------
 * out[r * out_stride + o] = dot(w row o, a row r) for r < n_rows, o < n_out; w: [n_out] rows of
 * w_row_bytes, a: [n_rows] rows of a_row_bytes in the vec_dot type, n_in a multiple of 32 (256
 * for the K-quants). Blocks of EL_MM_WARPS warps, one output per warp. */

#define EL_MM_WARPS 8
#define EL_MMV_ROWS 8 /* rows per block of el_cuda_mmv_* (decode: a few sequences) */
#define EL_MM_ROWS 16 /* rows per block of el_cuda_mm_* (activation units staged in shared memory) */

/* Each row's sum over the warp's lanes into out[r0 + r][o], lane 0 storing. Only the rows that
 * exist are reduced (r0 and n_rows are the same for the whole block, so every lane of a warp
 * takes the same branches and the shuffles stay whole-warp): a decode step of one row pays one
 * reduction, not R. */
template <int R>
__device__ __forceinline__ void el_store_rows(const float *acc, float *out, int64_t out_stride, int64_t o, int64_t r0,
                                              int64_t n_rows, int lane) {
#pragma unroll
    for (int r = 0; r < R; r++) {
        if (r0 + r >= n_rows) break;
        const float s = el_warp_sum(acc[r]);
        if (lane == 0) out[(r0 + r) * out_stride + o] = s;
    }
}

template <int T, int R>
__device__ void el_mmv(const uint8_t *w, int64_t w_row_bytes, const uint8_t *a, int64_t a_row_bytes, float *out,
                              int64_t out_stride, int64_t n_in, int64_t n_rows, int64_t n_out) {
    const int kind = el_traits<T>::kind;
    const int lane = threadIdx.x % EL_WARP;
    const int64_t o = (int64_t)blockIdx.x * EL_MM_WARPS + threadIdx.x / EL_WARP;
    const int64_t r0 = (int64_t)blockIdx.y * R;
    if (o >= n_out) return;
    const int64_t n_units = n_in / 32;
    const uint8_t *w_row = w + o * w_row_bytes;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    for (int64_t u = lane; u < n_units; u += EL_WARP) {
        el_wunit wu;
        el_load_w<T>(w_row, u, wu);
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (r0 + r < n_rows) {
                el_aunit au;
                el_load_a<kind>(a + (r0 + r) * a_row_bytes, u, au);
                acc[r] += el_unit_dot<kind>(wu, au);
            }
        }
    }
    el_store_rows<R>(acc, out, out_stride, o, r0, n_rows, lane);
}

/* The tiled product: a block computes EL_MM_WARPS outputs for R rows. For each chunk of 32 units,
 * the R rows' activation units are decoded once into shared memory (structure of arrays, so lane
 * l reads bank l) and every warp decodes its weight unit once for all R rows. */
template <int T, int R>
__device__ void el_mm(const uint8_t *w, int64_t w_row_bytes, const uint8_t *a, int64_t a_row_bytes, float *out,
                             int64_t out_stride, int64_t n_in, int64_t n_rows, int64_t n_out) {
    const int kind = el_traits<T>::kind;
    __shared__ int32_t sq[R][8][EL_WARP];
    __shared__ float sd[R][EL_WARP], ss[R][EL_WARP];
    __shared__ int32_t sb[R][2][EL_WARP];
    const int lane = threadIdx.x % EL_WARP;
    const int64_t o = (int64_t)blockIdx.x * EL_MM_WARPS + threadIdx.x / EL_WARP;
    const int64_t r0 = (int64_t)blockIdx.y * R;
    const int64_t n_units = n_in / 32;
    const uint8_t *w_row = w + (o < n_out ? o : 0) * w_row_bytes;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    for (int64_t c = 0; c < n_units; c += EL_WARP) {
        __syncthreads();
        for (int i = threadIdx.x; i < R * EL_WARP; i += blockDim.x) {
            const int r = i / EL_WARP, l = i % EL_WARP;
            el_aunit au;
            if (r0 + r < n_rows && c + l < n_units) {
                el_load_a<kind>(a + (r0 + r) * a_row_bytes, c + l, au);
            } else {
#pragma unroll
                for (int k = 0; k < 8; k++) au.q[k] = 0;
                au.d = au.s = 0.0f;
                au.bs[0] = au.bs[1] = 0;
            }
#pragma unroll
            for (int k = 0; k < 8; k++) sq[r][k][l] = au.q[k];
            sd[r][l] = au.d;
            ss[r][l] = au.s;
            sb[r][0][l] = au.bs[0];
            sb[r][1][l] = au.bs[1];
        }
        __syncthreads();
        const int64_t u = c + lane;
        if (o < n_out && u < n_units) {
            el_wunit wu;
            el_load_w<T>(w_row, u, wu);
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (r0 + r < n_rows) {
                    el_aunit au;
#pragma unroll
                    for (int k = 0; k < 8; k++) au.q[k] = sq[r][k][lane];
                    au.d = sd[r][lane];
                    au.s = ss[r][lane];
                    au.bs[0] = sb[r][0][lane];
                    au.bs[1] = sb[r][1][lane];
                    acc[r] += el_unit_dot<kind>(wu, au);
                }
            }
        }
    }
    if (o >= n_out) return;
    el_store_rows<R>(acc, out, out_stride, o, r0, n_rows, lane);
}

/* Float weights against activations of the same float type (F32 x F32, F16 x F16, BF16 x BF16):
 * products in f32, summed in f32 (the C reference sums in double), lane l taking elements
 * l, l + 32, ...; one kernel for every batch size, so rows never depend on the batch. */
template <int T>
__device__ __forceinline__ float el_load_float(const uint8_t *row, int64_t i) {
    if (T == EL_TYPE_F32) return ((const float *)row)[i];
    if (T == EL_TYPE_F16) return el_h2f(((const uint16_t *)row)[i]);
    return el_bf2f(((const uint16_t *)row)[i]);
}

template <int T>
__device__ void el_mm_float(const uint8_t *w, int64_t w_row_bytes, const uint8_t *a, int64_t a_row_bytes,
                                   float *out, int64_t out_stride, int64_t n_in, int64_t n_rows, int64_t n_out) {
    const int R = EL_MMV_ROWS;
    const int lane = threadIdx.x % EL_WARP;
    const int64_t o = (int64_t)blockIdx.x * EL_MM_WARPS + threadIdx.x / EL_WARP;
    const int64_t r0 = (int64_t)blockIdx.y * R;
    if (o >= n_out) return;
    const uint8_t *w_row = w + o * w_row_bytes;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    for (int64_t i = lane; i < n_in; i += EL_WARP) {
        const float wv = el_load_float<T>(w_row, i);
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (r0 + r < n_rows) acc[r] += wv * el_load_float<T>(a + (r0 + r) * a_row_bytes, i);
        }
    }
    el_store_rows<R>(acc, out, out_stride, o, r0, n_rows, lane);
}

/* ---- Entry points, one set per type ---------------------------------------------------------- */

#define EL_MM_ARGS                                                                                  \
    const uint8_t *w /* [n_out][w_row_bytes] */, int64_t w_row_bytes,                               \
        const uint8_t *a /* [n_rows][a_row_bytes], vec_dot type */, int64_t a_row_bytes,            \
        float *out /* [n_rows][out_stride] */, int64_t out_stride, int64_t n_in, int64_t n_rows, int64_t n_out
#define EL_MM_PASS w, w_row_bytes, a, a_row_bytes, out, out_stride, n_in, n_rows, n_out
#define EL_ROWS_ARGS                                                                                \
    const uint8_t *w /* [n_rows][w_row_bytes] */, int64_t w_row_bytes, const int32_t *ids /* [n_ids] */, \
        float *out /* [n_ids][n_in] */, int64_t n_in, int64_t n_ids, float scale
#define EL_ROWS_PASS w, w_row_bytes, ids, out, n_in, n_ids, scale

#define EL_QUANT_ENTRIES(name, T)                                                                   \
    extern "C" __global__ void __launch_bounds__(EL_MM_WARPS * EL_WARP) el_cuda_mmv_##name(EL_MM_ARGS) { \
        el_mmv<T, EL_MMV_ROWS>(EL_MM_PASS);                                                         \
    }                                                                                               \
    extern "C" __global__ void __launch_bounds__(EL_MM_WARPS * EL_WARP) el_cuda_mm_##name(EL_MM_ARGS) { \
        el_mm<T, EL_MM_ROWS>(EL_MM_PASS);                                                           \
    }                                                                                               \
    extern "C" __global__ void el_cuda_get_rows_##name(EL_ROWS_ARGS) { el_get_rows<T>(EL_ROWS_PASS); }

EL_QUANT_ENTRIES(q4_0, EL_TYPE_Q4_0)
EL_QUANT_ENTRIES(q4_1, EL_TYPE_Q4_1)
EL_QUANT_ENTRIES(q5_0, EL_TYPE_Q5_0)
EL_QUANT_ENTRIES(q5_1, EL_TYPE_Q5_1)
EL_QUANT_ENTRIES(q8_0, EL_TYPE_Q8_0)
EL_QUANT_ENTRIES(q2_K, EL_TYPE_Q2_K)
EL_QUANT_ENTRIES(q3_K, EL_TYPE_Q3_K)
EL_QUANT_ENTRIES(q4_K, EL_TYPE_Q4_K)
EL_QUANT_ENTRIES(q5_K, EL_TYPE_Q5_K)
EL_QUANT_ENTRIES(q6_K, EL_TYPE_Q6_K)
EL_QUANT_ENTRIES(iq4_nl, EL_TYPE_IQ4_NL)
EL_QUANT_ENTRIES(mxfp4, EL_TYPE_MXFP4)
EL_QUANT_ENTRIES(iq4_xs, EL_TYPE_IQ4_XS)
EL_QUANT_ENTRIES(iq3_xxs, EL_TYPE_IQ3_XXS)
EL_QUANT_ENTRIES(iq3_s, EL_TYPE_IQ3_S)
EL_QUANT_ENTRIES(iq2_xxs, EL_TYPE_IQ2_XXS)
EL_QUANT_ENTRIES(iq2_xs, EL_TYPE_IQ2_XS)
EL_QUANT_ENTRIES(iq2_s, EL_TYPE_IQ2_S)
EL_QUANT_ENTRIES(iq1_s, EL_TYPE_IQ1_S)
EL_QUANT_ENTRIES(iq1_m, EL_TYPE_IQ1_M)

#define EL_FLOAT_ENTRIES(name, T)                                                                   \
    extern "C" __global__ void __launch_bounds__(EL_MM_WARPS * EL_WARP) el_cuda_mm_##name(EL_MM_ARGS) { \
        el_mm_float<T>(EL_MM_PASS);                                                                 \
    }                                                                                               \
    extern "C" __global__ void el_cuda_get_rows_##name(EL_ROWS_ARGS) { el_get_rows_float<T>(EL_ROWS_PASS); }

EL_FLOAT_ENTRIES(f32, EL_TYPE_F32)
EL_FLOAT_ENTRIES(f16, EL_TYPE_F16)
EL_FLOAT_ENTRIES(bf16, EL_TYPE_BF16)

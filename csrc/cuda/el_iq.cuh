/*
 * el_iq.cuh: the IQ tensor types and MXFP4 (IQ4_NL, MXFP4, IQ4_XS, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S,
 * IQ1_M) decoded into the product kernels' unit of 32 elements (el_wunit, el_quants.cu), the GPU
 * counterparts of the decoders in csrc/quants_iq.c, which are the truth (tests/cuda_kernels.rs).
 *
 * Unit u of a row is block u for IQ4_NL (against Q8_0, like Q4_0) and sub-block u % 8 of
 * super-block u / 8 for the others (against Q8_K). A unit holds 32 signed integers q (the grid
 * value with its sign; IQ1's +-1/8 shift carried as 8 * grid +- 1) and one float scale per group
 * of 32 (w.d) or two per group of 16 (w.d for elements 0-15, w.m for 16-31), each computed as
 * quants_iq.c computes it, so x[e] = scale * q[e] is the C dequantization bit for bit, and a dot
 * product sums (scale * d_a) * isum per group as the C one does.
 *
 * The codebooks are in constant memory (el_iq_tables.cuh). Included by el_quants.cu after the
 * unit types.
 */
#ifndef EL_IQ_CUH
#define EL_IQ_CUH

#include "el_iq_tables.cuh"

/* Block sizes in bytes (EL_IQ4_NL_BYTES, ...) with their layouts' offsets: csrc/el_types.h,
 * through el_cuda_common.cuh. */

/* Four unsigned grid bytes, byte j negated where bit j of `s` is set (s & kmask_iq2xs[j], as
 * quants_iq.c tests it): (b ^ m) - m per byte, m = 0xff or 0. */
__device__ __forceinline__ int32_t el_iq_signed4(uint32_t grid4, uint32_t s) {
    uint32_t m = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) m |= (s & el_kmask_iq2xs[j] ? 0xffu : 0u) << (8 * j);
    return (int32_t)__vsub4(grid4 ^ m, m);
}

/* Eight grid bytes (a uint64 grid entry) with eight sign bits, into q[0], q[1]. */
__device__ __forceinline__ void el_iq_signed8(uint64_t grid, uint32_t s, int32_t *q) {
    q[0] = el_iq_signed4((uint32_t)grid, s & 0xfu);
    q[1] = el_iq_signed4((uint32_t)(grid >> 32), (s >> 4) & 0xfu);
}

/* The IQ1 grid entry `idx` (eight signed bytes -1, 0, 1) as 8 * g + shift, into q[0], q[1]. */
__device__ __forceinline__ void el_iq1_group(uint32_t idx, int shift, int32_t *q) {
    const uint64_t grid = el_iq1s_grid[idx];
    int v[8];
#pragma unroll
    for (int j = 0; j < 8; j++) v[j] = 8 * (int)(int8_t)(uint8_t)(grid >> (8 * j)) + shift;
    q[0] = el_pack4(v[0], v[1], v[2], v[3]);
    q[1] = el_pack4(v[4], v[5], v[6], v[7]);
}

/* 16 bytes of IQ4 nibbles (as q4_0: element j low, 16 + j high) mapped through kvalues_iq4nl. */
__device__ __forceinline__ void el_iq4_unit(const uint8_t *qs, el_wunit &w) {
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const uint8_t *b = qs + 4 * k;
        w.q[k] = el_pack4(el_kvalues_iq4nl[b[0] & 0xf], el_kvalues_iq4nl[b[1] & 0xf], el_kvalues_iq4nl[b[2] & 0xf],
                          el_kvalues_iq4nl[b[3] & 0xf]);
        w.q[4 + k] = el_pack4(el_kvalues_iq4nl[b[0] >> 4], el_kvalues_iq4nl[b[1] >> 4], el_kvalues_iq4nl[b[2] >> 4],
                              el_kvalues_iq4nl[b[3] >> 4]);
    }
}

/* 16 bytes of MXFP4 nibbles (as q4_0) mapped through kvalues_mxfp4 (E2M1 values doubled). */
__device__ __forceinline__ void el_mxfp4_unit(const uint8_t *qs, el_wunit &w) {
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const uint8_t *b = qs + 4 * k;
        w.q[k] = el_pack4(el_kvalues_mxfp4[b[0] & 0xf], el_kvalues_mxfp4[b[1] & 0xf], el_kvalues_mxfp4[b[2] & 0xf],
                          el_kvalues_mxfp4[b[3] & 0xf]);
        w.q[4 + k] = el_pack4(el_kvalues_mxfp4[b[0] >> 4], el_kvalues_mxfp4[b[1] >> 4], el_kvalues_mxfp4[b[2] >> 4],
                              el_kvalues_mxfp4[b[3] >> 4]);
    }
}

/* An E8M0 scale byte halved, 2^(e - 128), as el_e8m0_to_fp32_half (csrc/el_internal.h). */
__device__ __forceinline__ float el_e8m0_half(uint8_t e) {
    return __int_as_float((int)(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23));
}

/* Unit u of a row of IQ type T; w.d (and w.m for the types with groups of 16) its scales. */
template <int T>
__device__ __forceinline__ void el_load_w_iq(const uint8_t *row, int64_t u, el_wunit &w) {
    const int ib = (int)(u % 8); /* sub-block of a super-block */
    w.sc[0] = w.sc[1] = 1;
    w.mn[0] = w.mn[1] = 0;
    w.m = 0.0f;
    if (T == EL_TYPE_IQ4_NL) {
        const uint8_t *b = row + u * EL_IQ4_NL_BYTES;
        w.d = el_ldh(b);
        el_iq4_unit(b + 2, w);
    } else if (T == EL_TYPE_MXFP4) {
        const uint8_t *b = row + u * EL_MXFP4_BYTES;
        w.d = el_e8m0_half(b[0]);
        el_mxfp4_unit(b + 1, w);
    } else if (T == EL_TYPE_IQ4_XS) {
        const uint8_t *b = row + (u / 8) * EL_IQ4_XS_BYTES;
        const int ls = ((b[4 + ib / 2] >> 4 * (ib % 2)) & 0xf) | (((el_ld16(b + 2) >> 2 * ib) & 3) << 4);
        w.d = el_ldh(b) * (float)(ls - 32);
        el_iq4_unit(b + 8 + 16 * ib, w);
    } else if (T == EL_TYPE_IQ2_XXS) {
        const uint8_t *b = row + (u / 8) * EL_IQ2_XXS_BYTES;
        const uint32_t idx = (uint32_t)el_ld32_a2(b + 2 + 8 * ib);
        const uint32_t aux = (uint32_t)el_ld32_a2(b + 6 + 8 * ib);
        w.d = el_ldh(b) * (0.5f + (float)(aux >> 28)) * 0.25f;
#pragma unroll
        for (int l = 0; l < 4; l++) {
            el_iq_signed8(el_iq2xxs_grid[(idx >> 8 * l) & 0xff], el_ksigns_iq2xs[(aux >> 7 * l) & 127], w.q + 2 * l);
        }
    } else if (T == EL_TYPE_IQ2_XS) {
        const uint8_t *b = row + (u / 8) * EL_IQ2_XS_BYTES;
        const float d = el_ldh(b);
        const uint8_t sc = b[66 + ib];
        w.d = d * (0.5f + (float)(sc & 0xf)) * 0.25f;
        w.m = d * (0.5f + (float)(sc >> 4)) * 0.25f;
#pragma unroll
        for (int l = 0; l < 4; l++) {
            const uint16_t v = el_ld16(b + 2 + 2 * (4 * ib + l));
            el_iq_signed8(el_iq2xs_grid[v & 511], el_ksigns_iq2xs[v >> 9], w.q + 2 * l);
        }
    } else if (T == EL_TYPE_IQ2_S) {
        const uint8_t *b = row + (u / 8) * EL_IQ2_S_BYTES;
        const float d = el_ldh(b);
        const uint8_t sc = b[74 + ib], qh = b[66 + ib];
        w.d = d * (0.5f + (float)(sc & 0xf)) * 0.25f;
        w.m = d * (0.5f + (float)(sc >> 4)) * 0.25f;
        const uint8_t *qs = b + 2 + 4 * ib, *signs = b + 34 + 4 * ib;
#pragma unroll
        for (int l = 0; l < 4; l++) {
            el_iq_signed8(el_iq2s_grid[qs[l] | ((qh << (8 - 2 * l)) & 0x300)], signs[l], w.q + 2 * l);
        }
    } else if (T == EL_TYPE_IQ3_XXS) {
        const uint8_t *b = row + (u / 8) * EL_IQ3_XXS_BYTES;
        const uint32_t aux = (uint32_t)el_ld32_a2(b + 66 + 4 * ib);
        w.d = el_ldh(b) * (0.5f + (float)(aux >> 28)) * 0.5f;
        const uint8_t *qs = b + 2 + 8 * ib;
#pragma unroll
        for (int l = 0; l < 4; l++) {
            const uint32_t s = el_ksigns_iq2xs[(aux >> 7 * l) & 127];
            w.q[2 * l] = el_iq_signed4(el_iq3xxs_grid[qs[2 * l]], s & 0xfu);
            w.q[2 * l + 1] = el_iq_signed4(el_iq3xxs_grid[qs[2 * l + 1]], s >> 4);
        }
    } else if (T == EL_TYPE_IQ3_S) {
        const uint8_t *b = row + (u / 8) * EL_IQ3_S_BYTES;
        const uint8_t sc = b[106 + ib / 2], qh = b[66 + ib];
        w.d = el_ldh(b) * (float)(1 + 2 * (ib % 2 == 0 ? sc & 0xf : sc >> 4));
        const uint8_t *qs = b + 2 + 8 * ib, *signs = b + 74 + 4 * ib;
#pragma unroll
        for (int l = 0; l < 4; l++) {
            const uint32_t s = signs[l];
            w.q[2 * l] = el_iq_signed4(el_iq3s_grid[qs[2 * l] | ((qh << (8 - 2 * l)) & 256)], s & 0xfu);
            w.q[2 * l + 1] = el_iq_signed4(el_iq3s_grid[qs[2 * l + 1] | ((qh << (7 - 2 * l)) & 256)], s >> 4);
        }
    } else if (T == EL_TYPE_IQ1_S) {
        const uint8_t *b = row + (u / 8) * EL_IQ1_S_BYTES;
        const uint32_t qh = el_ld16(b + 34 + 2 * ib);
        w.d = el_ldh(b) * (float)(2 * ((qh >> 12) & 7) + 1) * 0.125f;
        const int shift = qh & 0x8000 ? -1 : 1;
        const uint8_t *qs = b + 2 + 4 * ib;
#pragma unroll
        for (int l = 0; l < 4; l++) el_iq1_group(qs[l] | (((qh >> 3 * l) & 7) << 8), shift, w.q + 2 * l);
    } else { /* IQ1_M */
        const uint8_t *b = row + (u / 8) * EL_IQ1_M_BYTES;
        uint32_t sc[4];
#pragma unroll
        for (int k = 0; k < 4; k++) sc[k] = el_ld16(b + 48 + 2 * k);
        const uint16_t d16 =
            (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
        const float d = el_h2f(d16);
        const uint32_t s = sc[ib / 2] >> (6 * (ib % 2));
        w.d = d * (float)(2 * (s & 7) + 1) * 0.125f;
        w.m = d * (float)(2 * ((s >> 3) & 7) + 1) * 0.125f;
        const uint8_t *qs = b + 4 * ib, *qh = b + 32 + 2 * ib;
        el_iq1_group(qs[0] | ((qh[0] << 8) & 0x700), qh[0] & 0x08 ? -1 : 1, w.q + 0);
        el_iq1_group(qs[1] | ((qh[0] << 4) & 0x700), qh[0] & 0x80 ? -1 : 1, w.q + 2);
        el_iq1_group(qs[2] | ((qh[1] << 8) & 0x700), qh[1] & 0x08 ? -1 : 1, w.q + 4);
        el_iq1_group(qs[3] | ((qh[1] << 4) & 0x700), qh[1] & 0x80 ? -1 : 1, w.q + 6);
    }
}

#endif /* EL_IQ_CUH */

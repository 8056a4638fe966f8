/*
 * quants_iq.c: the IQ tensor types' scalar reference kernels (IQ4_NL, IQ4_XS, IQ3_XXS, IQ3_S,
 * IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M): dequantize and the dot product against the activation
 * type (Q8_0 for IQ4_NL, Q8_K for the rest), plus quantizers for IQ4_NL and IQ4_XS. quants.c's
 * dispatch table calls these; block layouts are in el_blocks.h, the codebooks in el_iq_tables.h.
 *
 * Every type is first decoded, block by block, into small integers and one float scale per group
 * of 16 or 32 elements, x[e] = scale[e / group] * q[e], with the scale computed exactly as llama.cpp's
 * dequantize_row_iq* computes its factor (so dequantization reproduces it bit for bit: q is the
 * grid value with its sign, exact in a float; IQ1's +-1/8 shift is carried as 8 * grid +- 1 with
 * the scale divided by 8, which rounds the same product once).
 *
 * The dot product works on a second, integer form of the same scales: scale[g] = d * ls[g] * k
 * with ls[g] a small integer and k a power of two (k = 1, 1/4 or 1/8). Per super-block
 *     isum = sum_g ls[g] * sum_{e in g} q[e] * a[e]     (exact in int32),
 *     sum += (d * a.d) * (float)isum,
 * and the result is k * sum (exact: a power of two) -- as ggml's generic kernels sum the IQ2/IQ3
 * types. One float operation per super-block whatever the group size, so the SIMD variants
 * (quants_iq_avx2.c, quants_iq_neon.c) reproduce it bit for bit with integer vector sums.
 */
#include <math.h>
#include <string.h>

#include "edge_kernels.h"
#include "el_blocks.h"
#include "el_internal.h"
#include "el_iq_tables.h"

/* A decoded block: x[e] = scale[e / group] * q[e] for e in [0, n). */
typedef struct {
    int n;     /* elements: 32 (IQ4_NL) or 256 */
    int group; /* elements per scale: 16 or 32 */
    float scale[QK_K / 16];
    int8_t q[QK_K];
    /* The dot product's integer form: scale[g] = d * ls[g] * k (k the type's IQ_DOT_* factor). */
    float d;
    int16_t ls[QK_K / 16];
} iq_decoded;

/* The power-of-two factor k of each type's scales (see the top). */
#define IQ_DOT_iq4_xs 1.0f
#define IQ_DOT_iq3_s 1.0f
#define IQ_DOT_iq3_xxs 0.25f
#define IQ_DOT_iq2_xxs 0.125f
#define IQ_DOT_iq2_xs 0.125f
#define IQ_DOT_iq2_s 0.125f
#define IQ_DOT_iq1_s 0.125f
#define IQ_DOT_iq1_m 0.125f

/* Byte j of a grid entry. */
static inline uint8_t grid_byte(uint64_t entry, int j) { return (uint8_t)(entry >> (8 * j)); }

/* +v or -v as sign byte `signs` says for element j of its eight. */
static inline int8_t signed_by(uint8_t signs, int j, int v) {
    return (int8_t)(signs & el_kmask_iq2xs[j] ? -v : v);
}

static void decode_iq4_nl(const void *vx, iq_decoded *out) {
    const el_block_iq4_nl *x = vx;
    out->n = QK4_NL;
    out->group = QK4_NL;
    out->scale[0] = el_fp16_to_fp32(x->d);
    for (int j = 0; j < QK4_NL / 2; j++) {
        out->q[j] = el_kvalues_iq4nl[x->qs[j] & 0xf];
        out->q[j + QK4_NL / 2] = el_kvalues_iq4nl[x->qs[j] >> 4];
    }
}

static void decode_iq4_xs(const void *vx, iq_decoded *out) {
    const el_block_iq4_xs *x = vx;
    out->n = QK_K;
    out->group = 32;
    const float d = el_fp16_to_fp32(x->d);
    out->d = d;
    const uint8_t *qs = x->qs;
    for (int ib = 0; ib < QK_K / 32; ib++) {
        const int ls = ((x->scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) | (((x->scales_h >> 2 * ib) & 3) << 4);
        out->scale[ib] = d * (float)(ls - 32);
        out->ls[ib] = (int16_t)(ls - 32);
        int8_t *q = out->q + 32 * ib;
        for (int j = 0; j < 16; j++) {
            q[j] = el_kvalues_iq4nl[qs[j] & 0xf];
            q[j + 16] = el_kvalues_iq4nl[qs[j] >> 4];
        }
        qs += 16;
    }
}

static void decode_iq2_xxs(const void *vx, iq_decoded *out) {
    const el_block_iq2_xxs *x = vx;
    out->n = QK_K;
    out->group = 32;
    const float d = el_fp16_to_fp32(x->d);
    out->d = d;
    for (int ib = 0; ib < QK_K / 32; ib++) {
        uint32_t aux[2];
        memcpy(aux, x->qs + 4 * ib, sizeof(aux));
        const uint8_t *idx = (const uint8_t *)&aux[0];
        out->scale[ib] = d * (0.5f + (float)(aux[1] >> 28)) * 0.25f;
        out->ls[ib] = (int16_t)(2 * (aux[1] >> 28) + 1);
        for (int l = 0; l < 4; l++) {
            const uint64_t grid = el_iq2xxs_grid[idx[l]];
            const uint8_t signs = el_ksigns_iq2xs[(aux[1] >> 7 * l) & 127];
            for (int j = 0; j < 8; j++) out->q[32 * ib + 8 * l + j] = signed_by(signs, j, grid_byte(grid, j));
        }
    }
}

static void decode_iq2_xs(const void *vx, iq_decoded *out) {
    const el_block_iq2_xs *x = vx;
    out->n = QK_K;
    out->group = 16;
    const float d = el_fp16_to_fp32(x->d);
    out->d = d;
    for (int ib = 0; ib < QK_K / 32; ib++) {
        out->scale[2 * ib] = d * (0.5f + (float)(x->scales[ib] & 0xf)) * 0.25f;
        out->scale[2 * ib + 1] = d * (0.5f + (float)(x->scales[ib] >> 4)) * 0.25f;
        out->ls[2 * ib] = (int16_t)(2 * (x->scales[ib] & 0xf) + 1);
        out->ls[2 * ib + 1] = (int16_t)(2 * (x->scales[ib] >> 4) + 1);
        for (int l = 0; l < 4; l++) {
            const uint16_t v = x->qs[4 * ib + l];
            const uint64_t grid = el_iq2xs_grid[v & 511];
            const uint8_t signs = el_ksigns_iq2xs[v >> 9];
            for (int j = 0; j < 8; j++) out->q[32 * ib + 8 * l + j] = signed_by(signs, j, grid_byte(grid, j));
        }
    }
}

static void decode_iq2_s(const void *vx, iq_decoded *out) {
    const el_block_iq2_s *x = vx;
    out->n = QK_K;
    out->group = 16;
    const float d = el_fp16_to_fp32(x->d);
    out->d = d;
    const uint8_t *qs = x->qs;
    const uint8_t *signs = x->qs + QK_K / 8;
    for (int ib = 0; ib < QK_K / 32; ib++) {
        out->scale[2 * ib] = d * (0.5f + (float)(x->scales[ib] & 0xf)) * 0.25f;
        out->scale[2 * ib + 1] = d * (0.5f + (float)(x->scales[ib] >> 4)) * 0.25f;
        out->ls[2 * ib] = (int16_t)(2 * (x->scales[ib] & 0xf) + 1);
        out->ls[2 * ib + 1] = (int16_t)(2 * (x->scales[ib] >> 4) + 1);
        for (int l = 0; l < 4; l++) {
            const uint64_t grid = el_iq2s_grid[qs[l] | ((x->qh[ib] << (8 - 2 * l)) & 0x300)];
            for (int j = 0; j < 8; j++) out->q[32 * ib + 8 * l + j] = signed_by(signs[l], j, grid_byte(grid, j));
        }
        qs += 4;
        signs += 4;
    }
}

static void decode_iq3_xxs(const void *vx, iq_decoded *out) {
    const el_block_iq3_xxs *x = vx;
    out->n = QK_K;
    out->group = 32;
    const float d = el_fp16_to_fp32(x->d);
    out->d = d;
    const uint8_t *qs = x->qs;
    const uint8_t *scales_and_signs = x->qs + QK_K / 4;
    for (int ib = 0; ib < QK_K / 32; ib++) {
        uint32_t aux;
        memcpy(&aux, scales_and_signs + 4 * ib, sizeof(aux));
        out->scale[ib] = d * (0.5f + (float)(aux >> 28)) * 0.5f;
        out->ls[ib] = (int16_t)(2 * (aux >> 28) + 1);
        for (int l = 0; l < 4; l++) {
            const uint8_t signs = el_ksigns_iq2xs[(aux >> 7 * l) & 127];
            const uint32_t grid1 = el_iq3xxs_grid[qs[2 * l]];
            const uint32_t grid2 = el_iq3xxs_grid[qs[2 * l + 1]];
            int8_t *q = out->q + 32 * ib + 8 * l;
            for (int j = 0; j < 4; j++) {
                q[j] = signed_by(signs, j, grid_byte(grid1, j));
                q[j + 4] = signed_by(signs, j + 4, grid_byte(grid2, j));
            }
        }
        qs += 8;
    }
}

static void decode_iq3_s(const void *vx, iq_decoded *out) {
    const el_block_iq3_s *x = vx;
    out->n = QK_K;
    out->group = 32;
    const float d = el_fp16_to_fp32(x->d);
    out->d = d;
    const uint8_t *qs = x->qs;
    const uint8_t *signs = x->signs;
    for (int ib = 0; ib < QK_K / 32; ib++) {
        const uint8_t sc = x->scales[ib / 2];
        out->ls[ib] = (int16_t)(1 + 2 * (ib % 2 == 0 ? sc & 0xf : sc >> 4));
        out->scale[ib] = d * (float)out->ls[ib];
        const uint8_t qh = x->qh[ib];
        for (int l = 0; l < 4; l++) {
            const uint32_t grid1 = el_iq3s_grid[qs[2 * l] | ((qh << (8 - 2 * l)) & 256)];
            const uint32_t grid2 = el_iq3s_grid[qs[2 * l + 1] | ((qh << (7 - 2 * l)) & 256)];
            int8_t *q = out->q + 32 * ib + 8 * l;
            for (int j = 0; j < 4; j++) {
                q[j] = signed_by(signs[l], j, grid_byte(grid1, j));
                q[j + 4] = signed_by(signs[l], j + 4, grid_byte(grid2, j));
            }
        }
        qs += 8;
        signs += 4;
    }
}

/* 8 * (signed grid value) + shift, shift = -1 or +1 (IQ1's +-1/8 in eighths). */
static inline void iq1_group(int8_t *q, uint16_t grid_index, int shift) {
    const uint64_t grid = el_iq1s_grid[grid_index];
    for (int j = 0; j < 8; j++) q[j] = (int8_t)(8 * (int8_t)grid_byte(grid, j) + shift);
}

static void decode_iq1_s(const void *vx, iq_decoded *out) {
    const el_block_iq1_s *x = vx;
    out->n = QK_K;
    out->group = 32;
    const float d = el_fp16_to_fp32(x->d);
    out->d = d;
    const uint8_t *qs = x->qs;
    for (int ib = 0; ib < QK_K / 32; ib++) {
        const uint16_t qh = x->qh[ib];
        out->ls[ib] = (int16_t)(2 * ((qh >> 12) & 7) + 1);
        out->scale[ib] = d * (float)out->ls[ib] * 0.125f;
        const int shift = qh & 0x8000 ? -1 : 1;
        for (int l = 0; l < 4; l++) {
            iq1_group(out->q + 32 * ib + 8 * l, (uint16_t)(qs[l] | (((qh >> 3 * l) & 7) << 8)), shift);
        }
        qs += 4;
    }
}

static void decode_iq1_m(const void *vx, iq_decoded *out) {
    const el_block_iq1_m *x = vx;
    out->n = QK_K;
    out->group = 16;
    uint16_t sc[4];
    memcpy(sc, x->scales, sizeof(sc));
    const uint16_t d16 =
        (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
    const float d = el_fp16_to_fp32(d16);
    out->d = d;
    const uint8_t *qs = x->qs;
    const uint8_t *qh = x->qh;
    for (int ib = 0; ib < QK_K / 32; ib++) {
        out->ls[2 * ib] = (int16_t)(2 * ((sc[ib / 2] >> (6 * (ib % 2) + 0)) & 0x7) + 1);
        out->ls[2 * ib + 1] = (int16_t)(2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 0x7) + 1);
        out->scale[2 * ib] = d * (float)out->ls[2 * ib] * 0.125f;
        out->scale[2 * ib + 1] = d * (float)out->ls[2 * ib + 1] * 0.125f;
        const uint16_t idx[4] = {
            (uint16_t)(qs[0] | ((qh[0] << 8) & 0x700)),
            (uint16_t)(qs[1] | ((qh[0] << 4) & 0x700)),
            (uint16_t)(qs[2] | ((qh[1] << 8) & 0x700)),
            (uint16_t)(qs[3] | ((qh[1] << 4) & 0x700)),
        };
        const int shift[4] = {qh[0] & 0x08 ? -1 : 1, qh[0] & 0x80 ? -1 : 1, qh[1] & 0x08 ? -1 : 1,
                              qh[1] & 0x80 ? -1 : 1};
        for (int l = 0; l < 4; l++) iq1_group(out->q + 32 * ib + 8 * l, idx[l], shift[l]);
        qs += 4;
        qh += 2;
    }
}

/* ---- Dequantize and dot, shared by every type ------------------------------------------------- */

typedef void (*iq_decode_fn)(const void *block, iq_decoded *out);

static void dequantize_with(iq_decode_fn decode, size_t block_bytes, const void *vx, float *y, int64_t nb) {
    iq_decoded b;
    for (int64_t i = 0; i < nb; i++) {
        decode((const uint8_t *)vx + i * block_bytes, &b);
        for (int e = 0; e < b.n; e++) y[e] = b.scale[e / b.group] * (float)b.q[e];
        y += b.n;
    }
}

/* k * sum over super-blocks of (d * a.d) * (float)(sum over groups g of ls[g] * sum_{e in g} q[e] * a.qs[e]). */
static float dot_q8_K_with(iq_decode_fn decode, size_t block_bytes, float k, const void *vw, const void *va,
                           int64_t nb) {
    const el_block_q8_K *a = va;
    iq_decoded b;
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        decode((const uint8_t *)vw + i * block_bytes, &b);
        int32_t isum = 0;
        for (int g = 0; g < QK_K / b.group; g++) {
            int32_t gsum = 0;
            for (int e = g * b.group; e < (g + 1) * b.group; e++) gsum += (int32_t)b.q[e] * a[i].qs[e];
            isum += b.ls[g] * gsum;
        }
        sum += (b.d * a[i].d) * (float)isum;
    }
    return sum * k;
}

#define IQ_KERNELS(name)                                                                             \
    void el_dequantize_##name(const void *x, float *y, int64_t nb) {                                 \
        dequantize_with(decode_##name, sizeof(el_block_##name), x, y, nb);                          \
    }                                                                                                \
    float el_dot_##name##_q8_K(const void *w, const void *a, int64_t nb) {                         \
        return dot_q8_K_with(decode_##name, sizeof(el_block_##name), IQ_DOT_##name, w, a, nb);      \
    }

IQ_KERNELS(iq4_xs)
IQ_KERNELS(iq2_xxs)
IQ_KERNELS(iq2_xs)
IQ_KERNELS(iq2_s)
IQ_KERNELS(iq3_xxs)
IQ_KERNELS(iq3_s)
IQ_KERNELS(iq1_s)
IQ_KERNELS(iq1_m)

void el_dequantize_iq4_nl(const void *x, float *y, int64_t nb) {
    dequantize_with(decode_iq4_nl, sizeof(el_block_iq4_nl), x, y, nb);
}

/* IQ4_NL against Q8_0, as ggml: per block (d_w * d_a) * sum kvalue[q] * a. */
float el_dot_iq4_nl_q8_0(const void *vw, const void *va, int64_t nb) {
    const el_block_iq4_nl *w = vw;
    const el_block_q8_0 *a = va;
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t isum = 0;
        for (int j = 0; j < QK4_NL / 2; j++) {
            isum += el_kvalues_iq4nl[w[i].qs[j] & 0xf] * a[i].qs[j];
            isum += el_kvalues_iq4nl[w[i].qs[j] >> 4] * a[i].qs[j + QK4_NL / 2];
        }
        sum += (el_fp16_to_fp32(w[i].d) * el_fp16_to_fp32(a[i].d)) * (float)isum;
    }
    return sum;
}

/* ---- IQ4 quantizers: ggml's quantize_row_iq4_nl_impl without importance weights ------------- */

#define GROUP_MAX_EPS 1e-15f

static inline int nearest_int(float fval) {
    const float val = fval + 12582912.f;
    int32_t i;
    memcpy(&i, &val, sizeof(i));
    return (i & 0x007fffff) - 0x00400000;
}

/* The index of the value in the sorted kvalues_iq4nl nearest to x. */
static inline uint8_t best_index(float x) {
    const int8_t *val = el_kvalues_iq4nl;
    if (x <= val[0]) return 0;
    if (x >= val[15]) return 15;
    int ml = 0, mu = 15;
    while (mu - ml > 1) {
        const int mav = (ml + mu) / 2;
        if (x < val[mav]) mu = mav;
        else ml = mav;
    }
    return (uint8_t)(x - val[mu - 1] < val[mu] - x ? mu - 1 : mu);
}

/* One super-block of n elements in sub-blocks of 32: the best scale per sub-block (searched over
 * 2 * ntry + 1 candidates, weighted by x^2), then, with more than one sub-block, 6-bit sub-scales
 * of one f16 super-scale. Writes *dh, q4[n / 2] and, for n > 32, scales_h and scales_l. */
static void quantize_iq4_block(int n, const float *x, uint16_t *dh, uint8_t *q4, uint16_t *scales_h,
                               uint8_t *scales_l) {
    const int ntry = 7;
    const int8_t *values = el_kvalues_iq4nl;
    uint8_t L[QK_K];
    float scales[QK_K / 32];
    float weight[32];
    memset(q4, 0, (size_t)n / 2);
    memset(L, 0, sizeof(L));
    *dh = el_fp32_to_fp16(0.0f);
    float max_scale = 0, amax_scale = 0;
    for (int ib = 0; ib < n / 32; ib++) {
        const float *xb = x + ib * 32;
        uint8_t *Lb = L + ib * 32;
        for (int j = 0; j < 32; j++) weight[j] = xb[j] * xb[j];
        float amax = 0, max = 0;
        for (int j = 0; j < 32; j++) {
            const float ax = fabsf(xb[j]);
            if (ax > amax) {
                amax = ax;
                max = xb[j];
            }
        }
        if (amax < GROUP_MAX_EPS) {
            scales[ib] = 0;
            continue;
        }
        float d = -max / values[0];
        float id = 1 / d;
        float sumqx = 0, sumq2 = 0;
        for (int j = 0; j < 32; j++) {
            const float al = id * xb[j];
            const uint8_t l = best_index(al);
            Lb[j] = l;
            const float q = values[l];
            const float w = weight[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
        float best = d * sumqx;
        for (int itry = -ntry; itry <= ntry; itry++) {
            id = (itry + values[0]) / max;
            sumqx = sumq2 = 0;
            for (int j = 0; j < 32; j++) {
                const float al = id * xb[j];
                const float q = values[best_index(al)];
                const float w = weight[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        const float abs_d = fabsf(d);
        if (abs_d > amax_scale) {
            amax_scale = abs_d;
            max_scale = d;
        }
    }
    if (n / 32 > 1) {
        *scales_h = 0;
        const float d = -max_scale / 32;
        *dh = el_fp32_to_fp16(d);
        const float id = d != 0 ? 1 / d : 0.f;
        for (int ib = 0; ib < n / 32; ib++) {
            int l = nearest_int(id * scales[ib]);
            l = l < -32 ? -32 : l > 31 ? 31 : l;
            const float dl = d * l;
            const float idl = dl != 0 ? 1 / dl : 0.f;
            for (int j = 0; j < 32; j++) L[ib * 32 + j] = best_index(idl * x[ib * 32 + j]);
            l += 32;
            const uint8_t l_l = (uint8_t)(l & 0xf), l_h = (uint8_t)(l >> 4);
            if (ib % 2 == 0) scales_l[ib / 2] = l_l;
            else scales_l[ib / 2] |= (uint8_t)(l_l << 4);
            *scales_h |= (uint16_t)(l_h << 2 * ib);
        }
    } else {
        *dh = el_fp32_to_fp16(scales[0]);
        const float id = scales[0] != 0 ? 1 / scales[0] : 0;
        for (int j = 0; j < n; j++) L[j] = best_index(id * x[j]);
    }
    for (int i = 0; i < n / 32; i++) {
        for (int j = 0; j < 16; j++) q4[16 * i + j] = (uint8_t)(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
    }
}

void el_quantize_iq4_nl(const float *x, void *vy, int64_t nb) {
    el_block_iq4_nl *y = vy;
    for (int64_t i = 0; i < nb; i++) quantize_iq4_block(QK4_NL, x + i * QK4_NL, &y[i].d, y[i].qs, NULL, NULL);
}

void el_quantize_iq4_xs(const float *x, void *vy, int64_t nb) {
    el_block_iq4_xs *y = vy;
    for (int64_t i = 0; i < nb; i++) {
        quantize_iq4_block(QK_K, x + i * QK_K, &y[i].d, y[i].qs, &y[i].scales_h, y[i].scales_l);
    }
}

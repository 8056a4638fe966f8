/*
 * quants.c: the tensor types' scalar reference kernels, the truth that faster variants are tested
 * against. This file owns the public entry points (block geometry, dequantize, quantize, vec_dot,
 * matmul), the per-type dispatch table, the float types (F32, F16, BF16) and the 32-element block
 * types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1); the K-quants live in quants_k.c, the IQ types in
 * quants_iq.c.
 * Called only through src/kernels/quant.rs; see edge_kernels.h for shapes.
 *
 * Block layouts are bit-compatible with llama.cpp's ggml-common.h, and the dot products follow
 * ggml's generic kernels: the weight row against an activation row quantized to the vec_dot type,
 * integer sums within a block, float scaling per block. Blocks are read through their structs, so
 * a row must be aligned to its block's alignment (2 bytes; 4 for F32 and Q8_K); the Rust wrappers
 * check this.
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "edge_kernels.h"
#include "el_blocks.h"
#include "el_internal.h"
#include "simd_internal.h"

/* Per-type kernels over nb whole blocks. */
typedef void (*el_dequantize_fn)(const void *x, float *y /* [nb * block_size] */, int64_t nb);
typedef void (*el_quantize_fn)(const float *x /* [nb * block_size] */, void *y, int64_t nb);
typedef float (*el_dot_fn)(const void *w /* [nb] blocks */, const void *a /* [nb] vec_dot blocks */,
                           int64_t nb);

/* Defined in quants_k.c: the K-quants and Q8_K, over nb super-blocks of 256 elements, each dot
 * product against Q8_K. Their block sizes in TRAITS below are asserted against the structs there. */
void el_dequantize_q2_K(const void *x, float *y, int64_t nb);
void el_dequantize_q3_K(const void *x, float *y, int64_t nb);
void el_dequantize_q4_K(const void *x, float *y, int64_t nb);
void el_dequantize_q5_K(const void *x, float *y, int64_t nb);
void el_dequantize_q6_K(const void *x, float *y, int64_t nb);
void el_dequantize_q8_K(const void *x, float *y, int64_t nb);
void el_quantize_q2_K(const float *x, void *y, int64_t nb);
void el_quantize_q3_K(const float *x, void *y, int64_t nb);
void el_quantize_q4_K(const float *x, void *y, int64_t nb);
void el_quantize_q5_K(const float *x, void *y, int64_t nb);
void el_quantize_q6_K(const float *x, void *y, int64_t nb);
void el_quantize_q8_K(const float *x, void *y, int64_t nb);
float el_dot_q2_K_q8_K(const void *w, const void *a, int64_t nb);
float el_dot_q3_K_q8_K(const void *w, const void *a, int64_t nb);
float el_dot_q4_K_q8_K(const void *w, const void *a, int64_t nb);
float el_dot_q5_K_q8_K(const void *w, const void *a, int64_t nb);
float el_dot_q6_K_q8_K(const void *w, const void *a, int64_t nb);
float el_dot_q8_K_q8_K(const void *w, const void *a, int64_t nb);

/* Defined in quants_iq.c: the IQ types (IQ4_NL in 32-element blocks against Q8_0, the rest in
 * 256-element super-blocks against Q8_K); only IQ4_NL and IQ4_XS have quantizers. */
#define EL_IQ_DECL(name, act)                                                                        \
    void el_dequantize_##name(const void *x, float *y, int64_t nb);                                 \
    float el_dot_##name##_##act(const void *w, const void *a, int64_t nb);
EL_IQ_DECL(iq4_nl, q8_0)
EL_IQ_DECL(iq4_xs, q8_K)
EL_IQ_DECL(iq3_xxs, q8_K)
EL_IQ_DECL(iq3_s, q8_K)
EL_IQ_DECL(iq2_xxs, q8_K)
EL_IQ_DECL(iq2_xs, q8_K)
EL_IQ_DECL(iq2_s, q8_K)
EL_IQ_DECL(iq1_s, q8_K)
EL_IQ_DECL(iq1_m, q8_K)
void el_quantize_iq4_nl(const float *x, void *y, int64_t nb);
/* Defined in quants_mxfp4.c: MXFP4 in 32-element blocks against Q8_0. */
void el_dequantize_mxfp4(const void *x, float *y, int64_t nb);
float el_dot_mxfp4_q8_0(const void *w, const void *a, int64_t nb);
void el_quantize_mxfp4(const float *x, void *y, int64_t nb);
void el_quantize_iq4_xs(const float *x, void *y, int64_t nb);

/* ---- Float types ----------------------------------------------------------------------------- */

static void dequantize_f32(const void *x, float *y, int64_t n) { memcpy(y, x, (size_t)n * sizeof(float)); }
static void quantize_f32(const float *x, void *y, int64_t n) { memcpy(y, x, (size_t)n * sizeof(float)); }

/* Float dot products multiply in f32 and accumulate in double, like ggml's scalar path, in
 * DOT_LANES partial sums (element i into sum i % DOT_LANES, the tail into the total) so that the
 * additions pipeline; the order is fixed, so results depend only on the two rows. */
#define DOT_LANES 8

static inline float load_f32(const void *row, int64_t i) { return ((const float *)row)[i]; }

static inline float load_f16(const void *row, int64_t i) {
    return el_fp16_to_fp32(((const uint16_t *)row)[i]);
}

static inline float load_bf16(const void *row, int64_t i) {
    return el_bf16_to_fp32(((const uint16_t *)row)[i]);
}

static inline float dot_lanes(const void *w, const void *a, int64_t n,
                              float (*load)(const void *row, int64_t i)) {
    double lane[DOT_LANES] = {0};
    int64_t i = 0;
    for (; i + DOT_LANES <= n; i += DOT_LANES) {
        for (int l = 0; l < DOT_LANES; l++) lane[l] += (double)(load(w, i + l) * load(a, i + l));
    }
    double sum = 0.0;
    for (int l = 0; l < DOT_LANES; l++) sum += lane[l];
    for (; i < n; i++) sum += (double)(load(w, i) * load(a, i));
    return (float)sum;
}

static float dot_f32(const void *w, const void *a, int64_t n) { return dot_lanes(w, a, n, load_f32); }
static float dot_f16(const void *w, const void *a, int64_t n) { return dot_lanes(w, a, n, load_f16); }
static float dot_bf16(const void *w, const void *a, int64_t n) { return dot_lanes(w, a, n, load_bf16); }

static void dequantize_f16(const void *x, float *y, int64_t n) {
    const uint16_t *h = x;
    for (int64_t i = 0; i < n; i++) y[i] = el_fp16_to_fp32(h[i]);
}

static void quantize_f16(const float *x, void *y, int64_t n) {
    uint16_t *h = y;
    for (int64_t i = 0; i < n; i++) h[i] = el_fp32_to_fp16(x[i]);
}

static void dequantize_bf16(const void *x, float *y, int64_t n) {
    const uint16_t *h = x;
    for (int64_t i = 0; i < n; i++) y[i] = el_bf16_to_fp32(h[i]);
}

static void quantize_bf16(const float *x, void *y, int64_t n) {
    uint16_t *h = y;
    for (int64_t i = 0; i < n; i++) h[i] = el_fp32_to_bf16(x[i]);
}

/* ---- Bit packing shared by the 32-element types ------------------------------------------------ */

/* q[32] = the block's 4-bit quants in element order. */
static inline void unpack_nibbles(const uint8_t qs[QK / 2], int8_t q[QK]) {
    for (int j = 0; j < QK / 2; j++) {
        q[j] = (int8_t)(qs[j] & 0x0F);
        q[j + QK / 2] = (int8_t)(qs[j] >> 4);
    }
}

/* q[32] = the block's 5-bit quants: nibbles plus bit i of qh (read as little-endian) at bit 4.
 * Written byte by byte against constant bit masks so that the compiler vectorizes it. */
static inline void unpack_q5(const uint8_t qs[QK / 2], const uint8_t qh[4], int8_t q[QK]) {
    static const uint8_t bit[8] = {1, 2, 4, 8, 16, 32, 64, 128};
    unpack_nibbles(qs, q);
    for (int k = 0; k < 4; k++) {
        for (int t = 0; t < 8; t++) q[8 * k + t] = (int8_t)(q[8 * k + t] | ((qh[k] & bit[t]) ? 0x10 : 0));
    }
}

static inline void pack_nibbles(const uint8_t L[QK], uint8_t qs[QK / 2]) {
    for (int j = 0; j < QK / 2; j++) qs[j] = (uint8_t)((L[j] & 0x0F) | (L[j + QK / 2] << 4));
}

static inline void pack_q5(const uint8_t L[QK], uint8_t qs[QK / 2], uint8_t qh[4]) {
    uint8_t low[QK];
    memset(qh, 0, 4);
    for (int i = 0; i < QK; i++) {
        low[i] = L[i] & 0x0F;
        qh[i / 8] = (uint8_t)(qh[i / 8] | ((L[i] >> 4) & 1) << (i % 8));
    }
    pack_nibbles(low, qs);
}

/* sum of a[i] over the elements whose fifth bit (bit i of qh) is set: the dot products add
 * 16 times it rather than rebuilding the 5-bit quants. */
static inline int32_t sum_high(const uint8_t qh[4], const int8_t a[QK]) {
    static const uint8_t bit[8] = {1, 2, 4, 8, 16, 32, 64, 128};
    int32_t sum = 0;
    for (int k = 0; k < 4; k++) {
        for (int t = 0; t < 8; t++) sum += (qh[k] & bit[t]) ? a[8 * k + t] : 0;
    }
    return sum;
}

/* Integer dot product of one block's quants with an activation block's. */
static inline int32_t dot_i8(const int8_t q[QK], const int8_t a[QK]) {
    int32_t sum = 0;
    for (int i = 0; i < QK; i++) sum += (int32_t)q[i] * (int32_t)a[i];
    return sum;
}

static inline int32_t sum_i8(const int8_t a[QK]) {
    int32_t sum = 0;
    for (int i = 0; i < QK; i++) sum += a[i];
    return sum;
}

/* ---- Q4_0, Q5_0, Q8_0: symmetric, against Q8_0 ----------------------------------------------- */

/* The element with the largest magnitude, sign kept (ggml's `max`). */
static float signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; i++) {
        if (amax < fabsf(x[i])) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    }
    return max;
}

static void dequantize_q4_0(const void *vx, float *y, int64_t nb) {
    const el_block_q4_0 *x = vx;
    int8_t q[QK];
    for (int64_t i = 0; i < nb; i++, y += QK) {
        const float d = el_fp16_to_fp32(x[i].d);
        unpack_nibbles(x[i].qs, q);
        for (int j = 0; j < QK; j++) y[j] = (float)(q[j] - 8) * d;
    }
}

/* ggml's quantize_row_q4_0_ref: the largest-magnitude element maps to -8. */
static void quantize_q4_0(const float *x, void *vy, int64_t nb) {
    el_block_q4_0 *y = vy;
    uint8_t L[QK];
    for (int64_t i = 0; i < nb; i++, x += QK) {
        const float d = signed_absmax(x, QK) / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = el_fp32_to_fp16(d);
        for (int j = 0; j < QK; j++) {
            const int8_t l = (int8_t)(x[j] * id + 8.5f);
            L[j] = (uint8_t)(l < 15 ? l : 15);
        }
        pack_nibbles(L, y[i].qs);
    }
}

static float dot_q4_0_q8_0(const void *vw, const void *va, int64_t nb) {
    const el_block_q4_0 *w = vw;
    const el_block_q8_0 *a = va;
    int8_t q[QK];
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        unpack_nibbles(w[i].qs, q);
        for (int j = 0; j < QK; j++) q[j] = (int8_t)(q[j] - 8);
        const int32_t isum = dot_i8(q, a[i].qs);
        sum += (el_fp16_to_fp32(w[i].d) * el_fp16_to_fp32(a[i].d)) * (float)isum;
    }
    return sum;
}

static void dequantize_q5_0(const void *vx, float *y, int64_t nb) {
    const el_block_q5_0 *x = vx;
    int8_t q[QK];
    for (int64_t i = 0; i < nb; i++, y += QK) {
        const float d = el_fp16_to_fp32(x[i].d);
        unpack_q5(x[i].qs, x[i].qh, q);
        for (int j = 0; j < QK; j++) y[j] = (float)(q[j] - 16) * d;
    }
}

/* ggml's quantize_row_q5_0_ref: the largest-magnitude element maps to -16. */
static void quantize_q5_0(const float *x, void *vy, int64_t nb) {
    el_block_q5_0 *y = vy;
    uint8_t L[QK];
    for (int64_t i = 0; i < nb; i++, x += QK) {
        const float d = signed_absmax(x, QK) / -16.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = el_fp32_to_fp16(d);
        for (int j = 0; j < QK; j++) {
            const int8_t l = (int8_t)(x[j] * id + 16.5f);
            L[j] = (uint8_t)(l < 31 ? l : 31);
        }
        pack_q5(L, y[i].qs, y[i].qh);
    }
}

/* sum_i (q_i - 16) a_i with q_i = nibble_i + 16 h_i: sum nibble_i a_i - 16 sum_{h_i = 0} a_i. */
static float dot_q5_0_q8_0(const void *vw, const void *va, int64_t nb) {
    const el_block_q5_0 *w = vw;
    const el_block_q8_0 *a = va;
    int8_t q[QK];
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        unpack_nibbles(w[i].qs, q);
        const int32_t isum = dot_i8(q, a[i].qs) - 16 * (sum_i8(a[i].qs) - sum_high(w[i].qh, a[i].qs));
        sum += (el_fp16_to_fp32(w[i].d) * el_fp16_to_fp32(a[i].d)) * (float)isum;
    }
    return sum;
}

static void dequantize_q8_0(const void *vx, float *y, int64_t nb) {
    const el_block_q8_0 *x = vx;
    for (int64_t i = 0; i < nb; i++, y += QK) {
        const float d = el_fp16_to_fp32(x[i].d);
        for (int j = 0; j < QK; j++) y[j] = (float)x[i].qs[j] * d;
    }
}

/* ggml's quantize_row_q8_0_ref, exactly (the activation quantizer for Q4_0/Q5_0/Q8_0 weights):
 * d = amax / 127, q = roundf(x / d), rounding half away from zero. Returns d unrounded. */
static float quantize_block_q8(const float *x, uint16_t *d_out, int8_t qs[QK]) {
    float amax = 0.0f;
    for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    *d_out = el_fp32_to_fp16(d);
    for (int j = 0; j < QK; j++) qs[j] = (int8_t)roundf(x[j] * id);
    return d;
}

static void quantize_q8_0(const float *x, void *vy, int64_t nb) {
    el_block_q8_0 *y = vy;
    for (int64_t i = 0; i < nb; i++, x += QK) quantize_block_q8(x, &y[i].d, y[i].qs);
}

static float dot_q8_0_q8_0(const void *vw, const void *va, int64_t nb) {
    const el_block_q8_0 *w = vw;
    const el_block_q8_0 *a = va;
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        const int32_t isum = dot_i8(w[i].qs, a[i].qs);
        sum += (el_fp16_to_fp32(w[i].d) * el_fp16_to_fp32(a[i].d)) * (float)isum;
    }
    return sum;
}

/* ---- Q4_1, Q5_1, Q8_1: with a min, against Q8_1 ---------------------------------------------- */

static void min_max(const float *x, int n, float *min, float *max) {
    *min = INFINITY;
    *max = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (x[i] < *min) *min = x[i];
        if (x[i] > *max) *max = x[i];
    }
}

static void dequantize_q4_1(const void *vx, float *y, int64_t nb) {
    const el_block_q4_1 *x = vx;
    int8_t q[QK];
    for (int64_t i = 0; i < nb; i++, y += QK) {
        const float d = el_fp16_to_fp32(x[i].d), m = el_fp16_to_fp32(x[i].m);
        unpack_nibbles(x[i].qs, q);
        for (int j = 0; j < QK; j++) y[j] = (float)q[j] * d + m;
    }
}

/* ggml's quantize_row_q4_1_ref: 16 levels from the block's min to its max. */
static void quantize_q4_1(const float *x, void *vy, int64_t nb) {
    el_block_q4_1 *y = vy;
    uint8_t L[QK];
    for (int64_t i = 0; i < nb; i++, x += QK) {
        float min, max;
        min_max(x, QK, &min, &max);
        const float d = (max - min) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = el_fp32_to_fp16(d);
        y[i].m = el_fp32_to_fp16(min);
        for (int j = 0; j < QK; j++) {
            const int8_t l = (int8_t)((x[j] - min) * id + 0.5f);
            L[j] = (uint8_t)(l < 15 ? l : 15);
        }
        pack_nibbles(L, y[i].qs);
    }
}

/* sum_i (d q_i + m) a_i = d da sum_i q_i qa_i + m s, with s = da sum_i qa_i from the Q8_1 block. */
static float dot_q4_1_q8_1(const void *vw, const void *va, int64_t nb) {
    const el_block_q4_1 *w = vw;
    const el_block_q8_1 *a = va;
    int8_t q[QK];
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        unpack_nibbles(w[i].qs, q);
        const int32_t isum = dot_i8(q, a[i].qs);
        sum += (el_fp16_to_fp32(w[i].d) * el_fp16_to_fp32(a[i].d)) * (float)isum +
               el_fp16_to_fp32(w[i].m) * el_fp16_to_fp32(a[i].s);
    }
    return sum;
}

static void dequantize_q5_1(const void *vx, float *y, int64_t nb) {
    const el_block_q5_1 *x = vx;
    int8_t q[QK];
    for (int64_t i = 0; i < nb; i++, y += QK) {
        const float d = el_fp16_to_fp32(x[i].d), m = el_fp16_to_fp32(x[i].m);
        unpack_q5(x[i].qs, x[i].qh, q);
        for (int j = 0; j < QK; j++) y[j] = (float)q[j] * d + m;
    }
}

/* ggml's quantize_row_q5_1_ref: 32 levels from the block's min to its max. */
static void quantize_q5_1(const float *x, void *vy, int64_t nb) {
    el_block_q5_1 *y = vy;
    uint8_t L[QK];
    for (int64_t i = 0; i < nb; i++, x += QK) {
        float min, max;
        min_max(x, QK, &min, &max);
        const float d = (max - min) / 31.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = el_fp32_to_fp16(d);
        y[i].m = el_fp32_to_fp16(min);
        for (int j = 0; j < QK; j++) L[j] = (uint8_t)((x[j] - min) * id + 0.5f);
        pack_q5(L, y[i].qs, y[i].qh);
    }
}

static float dot_q5_1_q8_1(const void *vw, const void *va, int64_t nb) {
    const el_block_q5_1 *w = vw;
    const el_block_q8_1 *a = va;
    int8_t q[QK];
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        unpack_nibbles(w[i].qs, q);
        const int32_t isum = dot_i8(q, a[i].qs) + 16 * sum_high(w[i].qh, a[i].qs);
        sum += (el_fp16_to_fp32(w[i].d) * el_fp16_to_fp32(a[i].d)) * (float)isum +
               el_fp16_to_fp32(w[i].m) * el_fp16_to_fp32(a[i].s);
    }
    return sum;
}

static void dequantize_q8_1(const void *vx, float *y, int64_t nb) {
    const el_block_q8_1 *x = vx;
    for (int64_t i = 0; i < nb; i++, y += QK) {
        const float d = el_fp16_to_fp32(x[i].d);
        for (int j = 0; j < QK; j++) y[j] = (float)x[i].qs[j] * d;
    }
}

/* ggml's quantize_row_q8_1_ref, exactly: as Q8_0, plus s = sum(qs) * d with d before f16 rounding. */
static void quantize_q8_1(const float *x, void *vy, int64_t nb) {
    el_block_q8_1 *y = vy;
    for (int64_t i = 0; i < nb; i++, x += QK) {
        const float d = quantize_block_q8(x, &y[i].d, y[i].qs);
        int32_t sum = 0;
        for (int j = 0; j < QK; j++) sum += y[i].qs[j];
        y[i].s = el_fp32_to_fp16((float)sum * d);
    }
}

/* Q8_1 weights (not a GGUF weight type in practice) ignore s: both sides are symmetric. */
static float dot_q8_1_q8_1(const void *vw, const void *va, int64_t nb) {
    const el_block_q8_1 *w = vw;
    const el_block_q8_1 *a = va;
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        const int32_t isum = dot_i8(w[i].qs, a[i].qs);
        sum += (el_fp16_to_fp32(w[i].d) * el_fp16_to_fp32(a[i].d)) * (float)isum;
    }
    return sum;
}

/* ---- Dispatch table ---------------------------------------------------------------------------- */

typedef struct {
    int32_t type;
    int32_t vec_dot_type;
    int64_t block_size;  /* elements per block */
    int64_t block_bytes; /* bytes per block */
    el_dequantize_fn dequantize;
    el_quantize_fn quantize; /* NULL: no quantizer (the codebook IQ types) */
    el_dot_fn dot; /* a row of `type` against a row of `vec_dot_type` */
} el_type_traits;

static const el_type_traits TRAITS[] = {
    {EL_TYPE_F32, EL_TYPE_F32, 1, 4, dequantize_f32, quantize_f32, dot_f32},
    {EL_TYPE_F16, EL_TYPE_F16, 1, 2, dequantize_f16, quantize_f16, dot_f16},
    {EL_TYPE_BF16, EL_TYPE_BF16, 1, 2, dequantize_bf16, quantize_bf16, dot_bf16},
    {EL_TYPE_Q4_0, EL_TYPE_Q8_0, QK, sizeof(el_block_q4_0), dequantize_q4_0, quantize_q4_0, dot_q4_0_q8_0},
    {EL_TYPE_Q4_1, EL_TYPE_Q8_1, QK, sizeof(el_block_q4_1), dequantize_q4_1, quantize_q4_1, dot_q4_1_q8_1},
    {EL_TYPE_Q5_0, EL_TYPE_Q8_0, QK, sizeof(el_block_q5_0), dequantize_q5_0, quantize_q5_0, dot_q5_0_q8_0},
    {EL_TYPE_Q5_1, EL_TYPE_Q8_1, QK, sizeof(el_block_q5_1), dequantize_q5_1, quantize_q5_1, dot_q5_1_q8_1},
    {EL_TYPE_Q8_0, EL_TYPE_Q8_0, QK, sizeof(el_block_q8_0), dequantize_q8_0, quantize_q8_0, dot_q8_0_q8_0},
    {EL_TYPE_Q8_1, EL_TYPE_Q8_1, QK, sizeof(el_block_q8_1), dequantize_q8_1, quantize_q8_1, dot_q8_1_q8_1},
    {EL_TYPE_Q2_K, EL_TYPE_Q8_K, QK_K, 84, el_dequantize_q2_K, el_quantize_q2_K, el_dot_q2_K_q8_K},
    {EL_TYPE_Q3_K, EL_TYPE_Q8_K, QK_K, 110, el_dequantize_q3_K, el_quantize_q3_K, el_dot_q3_K_q8_K},
    {EL_TYPE_Q4_K, EL_TYPE_Q8_K, QK_K, 144, el_dequantize_q4_K, el_quantize_q4_K, el_dot_q4_K_q8_K},
    {EL_TYPE_Q5_K, EL_TYPE_Q8_K, QK_K, 176, el_dequantize_q5_K, el_quantize_q5_K, el_dot_q5_K_q8_K},
    {EL_TYPE_Q6_K, EL_TYPE_Q8_K, QK_K, 210, el_dequantize_q6_K, el_quantize_q6_K, el_dot_q6_K_q8_K},
    {EL_TYPE_Q8_K, EL_TYPE_Q8_K, QK_K, 292, el_dequantize_q8_K, el_quantize_q8_K, el_dot_q8_K_q8_K},
    {EL_TYPE_IQ4_NL, EL_TYPE_Q8_0, QK4_NL, sizeof(el_block_iq4_nl), el_dequantize_iq4_nl, el_quantize_iq4_nl,
     el_dot_iq4_nl_q8_0},
    {EL_TYPE_IQ4_XS, EL_TYPE_Q8_K, QK_K, sizeof(el_block_iq4_xs), el_dequantize_iq4_xs, el_quantize_iq4_xs,
     el_dot_iq4_xs_q8_K},
    {EL_TYPE_IQ3_XXS, EL_TYPE_Q8_K, QK_K, sizeof(el_block_iq3_xxs), el_dequantize_iq3_xxs, NULL, el_dot_iq3_xxs_q8_K},
    {EL_TYPE_IQ3_S, EL_TYPE_Q8_K, QK_K, sizeof(el_block_iq3_s), el_dequantize_iq3_s, NULL, el_dot_iq3_s_q8_K},
    {EL_TYPE_IQ2_XXS, EL_TYPE_Q8_K, QK_K, sizeof(el_block_iq2_xxs), el_dequantize_iq2_xxs, NULL, el_dot_iq2_xxs_q8_K},
    {EL_TYPE_IQ2_XS, EL_TYPE_Q8_K, QK_K, sizeof(el_block_iq2_xs), el_dequantize_iq2_xs, NULL, el_dot_iq2_xs_q8_K},
    {EL_TYPE_IQ2_S, EL_TYPE_Q8_K, QK_K, sizeof(el_block_iq2_s), el_dequantize_iq2_s, NULL, el_dot_iq2_s_q8_K},
    {EL_TYPE_IQ1_S, EL_TYPE_Q8_K, QK_K, sizeof(el_block_iq1_s), el_dequantize_iq1_s, NULL, el_dot_iq1_s_q8_K},
    {EL_TYPE_IQ1_M, EL_TYPE_Q8_K, QK_K, sizeof(el_block_iq1_m), el_dequantize_iq1_m, NULL, el_dot_iq1_m_q8_K},
    {EL_TYPE_MXFP4, EL_TYPE_Q8_0, QK_MXFP4, sizeof(el_block_mxfp4), el_dequantize_mxfp4, el_quantize_mxfp4,
     el_dot_mxfp4_q8_0},
};

/* The traits of `type`, or NULL for an unknown type. */
static const el_type_traits *traits_of(int32_t type) {
    for (size_t i = 0; i < sizeof(TRAITS) / sizeof(TRAITS[0]); i++) {
        if (TRAITS[i].type == type) return &TRAITS[i];
    }
    return NULL;
}

/* EL_OK when `type` is known and n a non-negative multiple of its block size; *t then set. */
static int32_t check_row(int32_t type, int64_t n, const el_type_traits **t) {
    *t = traits_of(type);
    if (*t == NULL) return EL_ERR_TYPE;
    if (n < 0 || n % (*t)->block_size != 0) return EL_ERR_SHAPE;
    return EL_OK;
}

/* ---- Public entry points ----------------------------------------------------------------------- */

int64_t el_type_block_size(int32_t type) {
    const el_type_traits *t = traits_of(type);
    return t != NULL ? t->block_size : 0;
}

int64_t el_type_block_bytes(int32_t type) {
    const el_type_traits *t = traits_of(type);
    return t != NULL ? t->block_bytes : 0;
}

int32_t el_type_vec_dot_type(int32_t type) {
    const el_type_traits *t = traits_of(type);
    return t != NULL ? t->vec_dot_type : -1;
}

int32_t el_dequantize_row(int32_t type, const void *x, float *y, int64_t n) {
    const el_type_traits *t;
    const int32_t status = check_row(type, n, &t);
    if (status != EL_OK) return status;
    t->dequantize(x, y, n / t->block_size);
    return EL_OK;
}

/* quantize, vec_dot and matmul take the current ISA's variant where it has one for the type
 * (simd_internal.h), else the reference above. */

int32_t el_quantize_row(int32_t type, const float *x, void *y, int64_t n) {
    const el_type_traits *t;
    const int32_t status = check_row(type, n, &t);
    if (status != EL_OK) return status;
    const el_simd_quant_kernels *simd = el_simd_quant(type);
    const el_quantize_fn quantize = simd != NULL && simd->quantize != NULL ? simd->quantize : t->quantize;
    if (quantize == NULL) return EL_ERR_TYPE;
    quantize(x, y, n / t->block_size);
    return EL_OK;
}

int32_t el_vec_dot(int32_t type, int64_t n, const void *w, const void *a, float *out) {
    const el_type_traits *t;
    const int32_t status = check_row(type, n, &t);
    if (status != EL_OK) return status;
    const el_simd_quant_kernels *simd = el_simd_quant(type);
    *out = (simd != NULL && simd->dot != NULL ? simd->dot : t->dot)(w, a, n / t->block_size);
    return EL_OK;
}

/* A SIMD variant's own tiled product where it has one. Otherwise output by output, so each weight
 * row is loaded once for the whole batch; every element is one call of the same dot function
 * el_vec_dot uses, so results do not depend on n_rows. */
int32_t el_matmul(int32_t type, const void *w, int64_t w_row_bytes, const void *a, int64_t a_row_bytes,
                  float *out, int64_t out_stride, int64_t n_in, int64_t n_rows, int64_t o_begin,
                  int64_t o_end) {
    const el_type_traits *t;
    const int32_t status = check_row(type, n_in, &t);
    if (status != EL_OK) return status;
    if (n_rows < 0 || o_begin < 0 || o_end < o_begin || w_row_bytes < 0 || a_row_bytes < 0) {
        return EL_ERR_SHAPE;
    }
    const int64_t nb = n_in / t->block_size;
    const el_simd_quant_kernels *simd = el_simd_quant(type);
    if (simd != NULL && simd->matmul != NULL) {
        simd->matmul(w, w_row_bytes, a, a_row_bytes, out, out_stride, nb, n_rows, o_begin, o_end);
        return EL_OK;
    }
    const el_dot_fn dot = simd != NULL && simd->dot != NULL ? simd->dot : t->dot;
    for (int64_t o = o_begin; o < o_end; o++) {
        const void *w_row = (const uint8_t *)w + o * w_row_bytes;
        for (int64_t r = 0; r < n_rows; r++) {
            const void *a_row = (const uint8_t *)a + r * a_row_bytes;
            out[r * out_stride + o] = dot(w_row, a_row, nb);
        }
    }
    return EL_OK;
}

/* ---- Rows interleaved in eights (Q4_1, Q8_0, Q4_K, Q5_K, Q6_K) --------------------------------- */

int32_t el_type_has_x8(int32_t type) {
    switch (type) {
    case EL_TYPE_Q4_1:
    case EL_TYPE_Q8_0:
    case EL_TYPE_Q4_K:
    case EL_TYPE_Q5_K:
    case EL_TYPE_Q6_K:
        return 1;
    default:
        return 0;
    }
}

static int is_k_x8(int32_t type) { return type == EL_TYPE_Q4_K || type == EL_TYPE_Q5_K || type == EL_TYPE_Q6_K; }

/* A K type's f16 scales are bytes [*h0, *h1) of its block: interleaved two bytes at a time, the
 * other fields four (el_blocks.h). */
static void k_x8_halves(int32_t type, int *h0, int *h1) {
    *h0 = type == EL_TYPE_Q6_K ? (int)offsetof(el_block_q6_K, d) : 0;
    *h1 = type == EL_TYPE_Q6_K ? (int)sizeof(el_block_q6_K) : (int)offsetof(el_block_q4_K, scales);
}

/* The u-byte units of bytes [from, to) (from a multiple of u) of eight rows' blocks, interleaved:
 * byte j of row c at 8 (j - j % u) + u c + j % u of the group's block. */
static inline void interleave_units(const uint8_t *const rows[8], int from, int to, int u, uint8_t *grp) {
    for (int j = from; j < to; j += u) {
        for (int c = 0; c < 8; c++) memcpy(grp + 8 * j + u * c, rows[c] + j, (size_t)u);
    }
}

/* interleave_units' inverse for row c alone. */
static inline void deinterleave_units(const uint8_t *grp, int c, int from, int to, int u, uint8_t *blk) {
    for (int j = from; j < to; j += u) memcpy(blk + j, grp + 8 * j + u * c, (size_t)u);
}

/* Eight rows' blocks into their group's interleaved block. */
static void repack_k_x8(int32_t type, const uint8_t *const rows[8], uint8_t *grp) {
    int h0, h1;
    k_x8_halves(type, &h0, &h1);
    interleave_units(rows, 0, h0, 4, grp);
    interleave_units(rows, h0, h1, 2, grp);
    interleave_units(rows, h1, (int)traits_of(type)->block_bytes, 4, grp);
}

/* Row c's block back out of its group's interleaved block. */
static void unpack_k_x8(int32_t type, const uint8_t *grp, int c, uint8_t *blk) {
    int h0, h1;
    k_x8_halves(type, &h0, &h1);
    deinterleave_units(grp, c, 0, h0, 4, blk);
    deinterleave_units(grp, c, h0, h1, 2, blk);
    deinterleave_units(grp, c, h1, (int)traits_of(type)->block_bytes, 4, blk);
}

int32_t el_repack_x8(int32_t type, const void *w, int64_t n_out, int64_t nb, void *dst) {
    if (!el_type_has_x8(type)) return EL_ERR_TYPE;
    if (n_out < 0 || n_out % 8 != 0 || nb <= 0) return EL_ERR_SHAPE;
    if (is_k_x8(type)) {
        const int64_t bytes = traits_of(type)->block_bytes;
        for (int64_t g = 0; g < n_out / 8; g++) {
            for (int64_t i = 0; i < nb; i++) {
                const uint8_t *rows[8]; /* block i of rows 8g .. 8g + 7 */
                for (int c = 0; c < 8; c++) rows[c] = (const uint8_t *)w + ((g * 8 + c) * nb + i) * bytes;
                repack_k_x8(type, rows, (uint8_t *)dst + (g * nb + i) * 8 * bytes);
            }
        }
        return EL_OK;
    }
    for (int64_t g = 0; g < n_out / 8; g++) {
        for (int64_t i = 0; i < nb; i++) {
            for (int c = 0; c < 8; c++) {
                const int64_t at = (g * 8 + c) * nb + i; /* row 8g + c, block i */
                if (type == EL_TYPE_Q4_1) {
                    const el_block_q4_1 *r = (const el_block_q4_1 *)w + at;
                    el_block_q4_1x8 *b = (el_block_q4_1x8 *)dst + g * nb + i;
                    b->d[c] = r->d;
                    b->m[c] = r->m;
                    for (int k = 0; k < 4; k++) memcpy(b->qs[k][c], r->qs + 4 * k, 4);
                } else {
                    const el_block_q8_0 *r = (const el_block_q8_0 *)w + at;
                    el_block_q8_0x8 *b = (el_block_q8_0x8 *)dst + g * nb + i;
                    b->d[c] = r->d;
                    for (int k = 0; k < 8; k++) memcpy(b->qs[k][c], r->qs + 4 * k, 4);
                }
            }
        }
    }
    return EL_OK;
}

/* The K types' reference: each of a group's rows read back block by block and dotted by the
 * type's reference, one block at a time. That adds the same terms in the same order as
 * el_vec_dot's one call over the row (a lone block's sum 0 + t differs from t only for t = -0,
 * and a running sum that starts at +0 is never -0, so adding either zero leaves it unchanged). */
static void matvec_k_x8_ref(int32_t type, const void *w8, const void *a, float *out, int64_t nb, int64_t g_begin,
                            int64_t g_end) {
    const el_type_traits *t = traits_of(type);
    const int64_t group_bytes = 8 * t->block_bytes;
    _Alignas(4) uint8_t blk[sizeof(el_block_q6_K)]; /* the largest of the three */
    _Static_assert(sizeof(el_block_q6_K) >= sizeof(el_block_q5_K) && sizeof(el_block_q5_K) >= sizeof(el_block_q4_K),
                   "blk holds a block of every K type with x8");
    for (int64_t g = g_begin; g < g_end; g++) {
        for (int c = 0; c < 8; c++) {
            float sum = 0.0f;
            for (int64_t i = 0; i < nb; i++) {
                unpack_k_x8(type, (const uint8_t *)w8 + (g * nb + i) * group_bytes, c, blk);
                sum += t->dot(blk, (const el_block_q8_K *)a + i, 1);
            }
            out[g * 8 + c] = sum;
        }
    }
}

/* dot_q4_1_q8_1 and dot_q8_0_q8_0 of each of a group's eight rows, reading them from the
 * interleaved blocks. */
static void matvec_x8_ref(int32_t type, const void *w8, const void *a, float *out, int64_t nb, int64_t g_begin,
                          int64_t g_end) {
    int8_t q[QK];
    for (int64_t g = g_begin; g < g_end; g++) {
        for (int c = 0; c < 8; c++) {
            float sum = 0.0f;
            for (int64_t i = 0; i < nb; i++) {
                if (type == EL_TYPE_Q4_1) {
                    const el_block_q4_1x8 *b = (const el_block_q4_1x8 *)w8 + g * nb + i;
                    const el_block_q8_1 *ab = (const el_block_q8_1 *)a + i;
                    uint8_t qs[QK / 2];
                    for (int k = 0; k < 4; k++) memcpy(qs + 4 * k, b->qs[k][c], 4);
                    unpack_nibbles(qs, q);
                    const int32_t isum = dot_i8(q, ab->qs);
                    sum += (el_fp16_to_fp32(b->d[c]) * el_fp16_to_fp32(ab->d)) * (float)isum +
                           el_fp16_to_fp32(b->m[c]) * el_fp16_to_fp32(ab->s);
                } else {
                    const el_block_q8_0x8 *b = (const el_block_q8_0x8 *)w8 + g * nb + i;
                    const el_block_q8_0 *ab = (const el_block_q8_0 *)a + i;
                    int8_t qs[QK];
                    for (int k = 0; k < 8; k++) memcpy(qs + 4 * k, b->qs[k][c], 4);
                    const int32_t isum = dot_i8(qs, ab->qs);
                    sum += (el_fp16_to_fp32(b->d[c]) * el_fp16_to_fp32(ab->d)) * (float)isum;
                }
            }
            out[g * 8 + c] = sum;
        }
    }
}

int32_t el_matmul_x8_isa(int32_t type) {
    if (!el_type_has_x8(type)) return EL_ERR_TYPE;
    const int32_t isa = el_isa_get();
#if defined(__x86_64__)
    if (isa == EL_ISA_AVX2 || isa == EL_ISA_AVX512VNNI) return isa;
#elif defined(__aarch64__)
    if (isa == EL_ISA_NEON) return isa;
#else
    (void)isa;
#endif
    return EL_ISA_SCALAR;
}

int32_t el_matmul_x8(int32_t type, const void *w8, const void *a, int64_t a_row_bytes, float *out, int64_t out_stride,
                     int64_t n_in, int64_t n_rows, int64_t o_begin, int64_t o_end) {
    const int32_t isa = el_matmul_x8_isa(type);
    if (isa < 0) return EL_ERR_TYPE;
    const int64_t bs = traits_of(type)->block_size;
    if (n_in <= 0 || n_in % bs != 0 || n_rows < 0 || a_row_bytes < 0 || o_begin < 0 || o_end < o_begin ||
        o_begin % 8 != 0 || o_end % 8 != 0) {
        return EL_ERR_SHAPE;
    }
    const int64_t nb = n_in / bs;
#if defined(__x86_64__)
    if (isa == EL_ISA_AVX512VNNI) {
        el_matmul_x8_vnni(type, w8, a, a_row_bytes, out, out_stride, nb, n_rows, o_begin / 8, o_end / 8);
        return EL_OK;
    }
    if (isa == EL_ISA_AVX2) {
        if (is_k_x8(type)) {
            el_matmul_x8_k_avx2(type, w8, a, a_row_bytes, out, out_stride, nb, n_rows, o_begin / 8, o_end / 8);
        } else {
            el_matmul_x8_avx2(type, w8, a, a_row_bytes, out, out_stride, nb, n_rows, o_begin / 8, o_end / 8);
        }
        return EL_OK;
    }
#elif defined(__aarch64__)
    if (isa == EL_ISA_NEON) {
        el_matmul_x8_neon(type, w8, a, a_row_bytes, out, out_stride, nb, n_rows, o_begin / 8, o_end / 8);
        return EL_OK;
    }
#endif
    for (int64_t r = 0; r < n_rows; r++) {
        const void *row = (const uint8_t *)a + r * a_row_bytes;
        float *o = out + r * out_stride;
        if (is_k_x8(type)) matvec_k_x8_ref(type, w8, row, o, nb, o_begin / 8, o_end / 8);
        else matvec_x8_ref(type, w8, row, o, nb, o_begin / 8, o_end / 8);
    }
    return EL_OK;
}

/*
 * quants_k.c: scalar reference kernels for the K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and their
 * activation type Q8_K, over super-blocks of 256 elements. quants.c dispatches here (the
 * prototypes are at its top); see edge_kernels.h for the public contract.
 *
 * Every K type is read through one decoded form (el_k_scales): a super-block becomes its stored
 * unsigned quants u[256], an integer scale and min per sub-block, an offset and two float
 * super-scales, so that
 *     x[e] = d * scale[e / sub] * (u[e] - offset) - dmin * min[e / sub].
 * The dequantizer, the dot product (integer sums per sub-block; mins and offsets through Q8_K's
 * bsums, as ggml's kernels do) and the quantizer (which re-derives the quants from the decoded,
 * rounded scales) all go through it, so each type's bit layout lives in one unpack/pack pair,
 * described once as runs of 32 elements (el_run). Layouts are bit-compatible with llama.cpp's
 * ggml-common.h.
 */
#include <math.h>
#include <string.h>

#include "edge_kernels.h"
#include "el_blocks.h"
#include "el_internal.h"
#include "simd_internal.h"

/* The kernels quants.c dispatches to (it declares them too), over nb super-blocks. */
void el_dequantize_q2_K(const void *x, float *y, int64_t nb);
void el_dequantize_q3_K(const void *x, float *y, int64_t nb);
void el_dequantize_q4_K(const void *x, float *y, int64_t nb);
void el_dequantize_q5_K(const void *x, float *y, int64_t nb);
void el_dequantize_q6_K(const void *x, float *y, int64_t nb);
void el_dequantize_q8_K(const void *x, float *y, int64_t nb);
float el_dot_q2_K_q8_K(const void *w, const void *a, int64_t nb);
float el_dot_q3_K_q8_K(const void *w, const void *a, int64_t nb);
float el_dot_q4_K_q8_K(const void *w, const void *a, int64_t nb);
float el_dot_q5_K_q8_K(const void *w, const void *a, int64_t nb);
float el_dot_q6_K_q8_K(const void *w, const void *a, int64_t nb);
float el_dot_q8_K_q8_K(const void *w, const void *a, int64_t nb);
void el_quantize_q2_K(const float *x, void *y, int64_t nb);
void el_quantize_q3_K(const float *x, void *y, int64_t nb);
void el_quantize_q4_K(const float *x, void *y, int64_t nb);
void el_quantize_q5_K(const float *x, void *y, int64_t nb);
void el_quantize_q6_K(const float *x, void *y, int64_t nb);
void el_quantize_q8_K(const float *x, void *y, int64_t nb);


/* ggml's nearest_int: round to nearest, ties to even, through the float mantissa (|f| < 2^22). */
static inline int nearest_int(float f) {
    const float v = f + 12582912.0f;
    int32_t i;
    memcpy(&i, &v, sizeof(i));
    return (i & 0x007fffff) - 0x00400000;
}

/* nearest_int(f) clamped to [lo, hi], safe for any f (out-of-range and NaN included). */
static inline int nearest_clamped(float f, int lo, int hi) {
    if (!(f > (float)lo)) return lo;
    if (f > (float)hi) return hi;
    const int l = nearest_int(f);
    return l < lo ? lo : l > hi ? hi : l;
}

/* ---- Per-type layouts: unpack (decode) and pack (its inverse) ----------------------------------
 * Every K type stores its quants in runs of 32 consecutive elements: element 32 b + l (run b in
 * 0..8, l in 0..32) sits in byte base + l of a field, at a shift fixed for the run. */

typedef struct {
    int base;  /* byte of the run's first element */
    int shift; /* bit of the element's value within its byte */
} el_run;

/* q2_K qs and q3_K low bits: 2 bits, runs 4 h + j at bits 2 j of qs[32 h ..]. */
static inline el_run run_2bit(int b) { return (el_run){(b / 4) * 32, 2 * (b % 4)}; }
/* q3_K hmask and q5_K qh: run b at bit b of bytes 0..32. */
static inline el_run run_1bit(int b) { return (el_run){0, b}; }
/* q4_K and q5_K qs: runs 2 c and 2 c + 1 in the low and high nibbles of qs[32 c ..]. */
static inline el_run run_nibble(int b) { return (el_run){(b / 2) * 32, 4 * (b % 2)}; }
/* q6_K ql: runs 4 h + k in nibble k / 2 of ql[64 h + 32 (k % 2) ..]. */
static inline el_run run_q6_low(int b) { return (el_run){(b / 4) * 64 + (b % 2) * 32, 4 * ((b % 4) / 2)}; }
/* q6_K qh: runs 4 h + k at bits 2 k of qh[32 h ..]. */
static inline el_run run_q6_high(int b) { return (el_run){(b / 4) * 32, 2 * (b % 4)}; }

/* q[e] |= (the field's bits for e, `mask` wide) << at, for every element. */
static inline void get_field(const uint8_t *bytes, el_run (*run)(int), int mask, int at, int8_t q[QK_K]) {
    for (int b = 0; b < QK_K / 32; b++) {
        const el_run r = run(b);
        for (int l = 0; l < 32; l++) {
            q[32 * b + l] = (int8_t)(q[32 * b + l] | ((bytes[r.base + l] >> r.shift) & mask) << at);
        }
    }
}

/* The inverse: the field's bits for e |= (q[e] >> at) & mask. The caller zeroes the field. */
static inline void put_field(uint8_t *bytes, el_run (*run)(int), int mask, int at, const int8_t q[QK_K]) {
    for (int b = 0; b < QK_K / 32; b++) {
        const el_run r = run(b);
        for (int l = 0; l < 32; l++) {
            bytes[r.base + l] |= (uint8_t)(((q[32 * b + l] >> at) & mask) << r.shift);
        }
    }
}

/* The 6-bit scale and min of sub-block j of q4_K/q5_K (ggml's get_scale_min_k4). */
static void scale_min_k4(int j, const uint8_t s[K_SCALE_SIZE], int16_t *scale, int16_t *min) {
    if (j < 4) {
        *scale = s[j] & 63;
        *min = s[j + 4] & 63;
    } else {
        *scale = (int16_t)((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
        *min = (int16_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

static void pack_scale_min_k4(const uint8_t ls[8], const uint8_t lm[8], uint8_t s[K_SCALE_SIZE]) {
    memset(s, 0, K_SCALE_SIZE);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            s[j] = ls[j];
            s[j + 4] = lm[j];
        } else {
            s[j + 4] = (uint8_t)((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
            s[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            s[j] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
}

/* The 6-bit scale of sub-block j of q3_K, still offset by 32. */
static int q3_scale(int j, const uint8_t s[K_SCALE_SIZE]) {
    const int low = j < 8 ? s[j] & 0xF : s[j - 8] >> 4;
    const int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    return low | (high << 4);
}

static void pack_q3_scales(const uint8_t l[16] /* 0..63 */, uint8_t s[K_SCALE_SIZE]) {
    memset(s, 0, K_SCALE_SIZE);
    for (int j = 0; j < 16; j++) {
        s[j % 8] |= (uint8_t)((l[j] & 0xF) << (j < 8 ? 0 : 4));
        s[8 + j % 4] |= (uint8_t)((l[j] >> 4) << (2 * (j / 4)));
    }
}

static void scales_q2_K(const el_block_q2_K *b, el_k_scales *s) {
    s->d = el_fp16_to_fp32(b->d);
    s->dmin = el_fp16_to_fp32(b->dmin);
    s->sub = 16;
    s->offset = 0;
    for (int j = 0; j < 16; j++) {
        s->scale[j] = b->scales[j] & 0xF;
        s->min[j] = b->scales[j] >> 4;
    }
}

static void quants_q2_K(const el_block_q2_K *b, int8_t u[QK_K]) {
    memset(u, 0, QK_K);
    get_field(b->qs, run_2bit, 3, 0, u);
}

static void pack_quants_q2_K(const int8_t u[QK_K] /* 0..3 */, el_block_q2_K *b) {
    memset(b->qs, 0, sizeof(b->qs));
    put_field(b->qs, run_2bit, 3, 0, u);
}

static void scales_q3_K(const el_block_q3_K *b, el_k_scales *s) {
    s->d = el_fp16_to_fp32(b->d);
    s->dmin = 0.0f;
    s->sub = 16;
    s->offset = 4;
    for (int j = 0; j < 16; j++) {
        s->scale[j] = (int16_t)(q3_scale(j, b->scales) - 32);
        s->min[j] = 0;
    }
}

/* u in [0, 8): the low two bits and the high bit (so q = u - 4 is ggml's "minus 4 where the high
 * bit is clear"). */
static void quants_q3_K(const el_block_q3_K *b, int8_t u[QK_K]) {
    memset(u, 0, QK_K);
    get_field(b->qs, run_2bit, 3, 0, u);
    get_field(b->hmask, run_1bit, 1, 2, u);
}

static void pack_quants_q3_K(const int8_t u[QK_K] /* 0..7 */, el_block_q3_K *b) {
    memset(b->qs, 0, sizeof(b->qs));
    memset(b->hmask, 0, sizeof(b->hmask));
    put_field(b->qs, run_2bit, 3, 0, u);
    put_field(b->hmask, run_1bit, 1, 2, u);
}

static void scales_k4(uint16_t d, uint16_t dmin, const uint8_t packed[K_SCALE_SIZE], el_k_scales *s) {
    s->d = el_fp16_to_fp32(d);
    s->dmin = el_fp16_to_fp32(dmin);
    s->sub = 32;
    s->offset = 0;
    for (int j = 0; j < 8; j++) scale_min_k4(j, packed, &s->scale[j], &s->min[j]);
}

static void scales_q4_K(const el_block_q4_K *b, el_k_scales *s) { scales_k4(b->d, b->dmin, b->scales, s); }
static void scales_q5_K(const el_block_q5_K *b, el_k_scales *s) { scales_k4(b->d, b->dmin, b->scales, s); }

static void quants_q4_K(const el_block_q4_K *b, int8_t u[QK_K]) {
    memset(u, 0, QK_K);
    get_field(b->qs, run_nibble, 0xF, 0, u);
}

static void pack_quants_q4_K(const int8_t u[QK_K] /* 0..15 */, el_block_q4_K *b) {
    memset(b->qs, 0, sizeof(b->qs));
    put_field(b->qs, run_nibble, 0xF, 0, u);
}

static void quants_q5_K(const el_block_q5_K *b, int8_t u[QK_K]) {
    memset(u, 0, QK_K);
    get_field(b->qs, run_nibble, 0xF, 0, u);
    get_field(b->qh, run_1bit, 1, 4, u);
}

static void pack_quants_q5_K(const int8_t u[QK_K] /* 0..31 */, el_block_q5_K *b) {
    memset(b->qs, 0, sizeof(b->qs));
    memset(b->qh, 0, sizeof(b->qh));
    put_field(b->qs, run_nibble, 0xF, 0, u);
    put_field(b->qh, run_1bit, 1, 4, u);
}

static void scales_q6_K(const el_block_q6_K *b, el_k_scales *s) {
    s->d = el_fp16_to_fp32(b->d);
    s->dmin = 0.0f;
    s->sub = 16;
    s->offset = 32;
    for (int j = 0; j < 16; j++) {
        s->scale[j] = b->scales[j];
        s->min[j] = 0;
    }
}

/* u in [0, 64): a low nibble from ql and two high bits from qh (q = u - 32). */
static void quants_q6_K(const el_block_q6_K *b, int8_t u[QK_K]) {
    memset(u, 0, QK_K);
    get_field(b->ql, run_q6_low, 0xF, 0, u);
    get_field(b->qh, run_q6_high, 3, 4, u);
}

static void pack_quants_q6_K(const int8_t u[QK_K] /* 0..63 */, el_block_q6_K *b) {
    memset(b->ql, 0, sizeof(b->ql));
    memset(b->qh, 0, sizeof(b->qh));
    put_field(b->ql, run_q6_low, 0xF, 0, u);
    put_field(b->qh, run_q6_high, 3, 4, u);
}

static void scales_q8_K(const el_block_q8_K *b, el_k_scales *s) {
    s->d = b->d;
    s->dmin = 0.0f;
    s->sub = 16;
    s->offset = 0;
    for (int j = 0; j < 16; j++) {
        s->scale[j] = 1;
        s->min[j] = 0;
    }
}

static void quants_q8_K(const el_block_q8_K *b, int8_t u[QK_K]) { memcpy(u, b->qs, QK_K); }

/* ---- Dequantize and dot product, on the decoded form -------------------------------------------
 * Each takes the sub-block size as a constant (16 or 32, from s->sub) so the loops unroll. */

static inline void dequantize_sub(const el_k_scales *s, const int8_t u[QK_K], float *y, int sub) {
    for (int j = 0; j < QK_K / sub; j++) {
        const float dl = s->d * (float)s->scale[j];
        const float ml = s->dmin * (float)s->min[j];
        for (int l = 0; l < sub; l++) y[j * sub + l] = dl * (float)(u[j * sub + l] - s->offset) - ml;
    }
}

static void dequantize_decoded(const el_k_scales *s, const int8_t u[QK_K], float *y /* [QK_K] */) {
    if (s->sub == 16) {
        dequantize_sub(s, u, y, 16);
    } else {
        dequantize_sub(s, u, y, 32);
    }
}

/* sum_e x[e] a[e] = d da (sum_j scale[j] (u . qa)_j - offset sum_g scale[g] bsums[g])
 *                  - dmin da sum_g min[g] bsums[g],
 * with g the groups of 16 whose sums Q8_K carries (and scale[g], min[g] those of g's sub-block):
 * all integer sums, exact, so the offset costs no pass over the quants. */
static inline float dot_sub(const el_k_scales *s, const int8_t u[QK_K], const el_block_q8_K *a, int sub) {
    int32_t isum = 0;
    for (int j = 0; j < QK_K / sub; j++) {
        int32_t sub_sum = 0;
        for (int l = 0; l < sub; l++) sub_sum += (int32_t)u[j * sub + l] * (int32_t)a->qs[j * sub + l];
        isum += (int32_t)s->scale[j] * sub_sum;
    }
    int32_t osum = 0, msum = 0;
    for (int g = 0; g < QK_K / 16; g++) {
        osum += (int32_t)a->bsums[g] * (int32_t)s->scale[g * 16 / sub];
        msum += (int32_t)a->bsums[g] * (int32_t)s->min[g * 16 / sub];
    }
    isum -= s->offset * osum;
    return (s->d * a->d) * (float)isum - (s->dmin * a->d) * (float)msum;
}

static float dot_decoded(const el_k_scales *s, const int8_t u[QK_K], const el_block_q8_K *a) {
    return s->sub == 16 ? dot_sub(s, u, a, 16) : dot_sub(s, u, a, 32);
}

/* One dequantize and one dot function per type, each a loop over super-blocks. */
#define K_KERNELS(name)                                                                            \
    void el_dequantize_##name(const void *x, float *y, int64_t nb) {                               \
        const el_block_##name *b = x;                                                              \
        el_k_scales s;                                                                             \
        int8_t u[QK_K];                                                                            \
        for (int64_t i = 0; i < nb; i++) {                                                         \
            scales_##name(&b[i], &s);                                                              \
            quants_##name(&b[i], u);                                                               \
            dequantize_decoded(&s, u, y + i * QK_K);                                               \
        }                                                                                          \
    }                                                                                              \
    float el_dot_##name##_q8_K(const void *w, const void *a, int64_t nb) {                         \
        const el_block_##name *b = w;                                                              \
        const el_block_q8_K *y = a;                                                                \
        el_k_scales s;                                                                             \
        int8_t u[QK_K];                                                                            \
        float sum = 0.0f;                                                                          \
        for (int64_t i = 0; i < nb; i++) {                                                         \
            scales_##name(&b[i], &s);                                                              \
            quants_##name(&b[i], u);                                                               \
            sum += dot_decoded(&s, u, &y[i]);                                                      \
        }                                                                                          \
        return sum;                                                                                \
    }

K_KERNELS(q2_K)
K_KERNELS(q3_K)
K_KERNELS(q4_K)
K_KERNELS(q5_K)
K_KERNELS(q6_K)
K_KERNELS(q8_K)

int el_k_decode(int32_t type, const void *block, el_k_scales *s, int8_t u[QK_K]) {
    switch (type) {
#define K_DECODE(TYPE, name)                                                                           case TYPE:                                                                                             scales_##name((const el_block_##name *)block, s);                                                  quants_##name((const el_block_##name *)block, u);                                                  return 1;
        K_DECODE(EL_TYPE_Q2_K, q2_K)
        K_DECODE(EL_TYPE_Q3_K, q3_K)
        K_DECODE(EL_TYPE_Q4_K, q4_K)
        K_DECODE(EL_TYPE_Q5_K, q5_K)
        K_DECODE(EL_TYPE_Q6_K, q6_K)
        K_DECODE(EL_TYPE_Q8_K, q8_K)
#undef K_DECODE
    default:
        return 0;
    }
}

/* ---- Quantizers ---------------------------------------------------------------------------------
 * Weight types (used by tests; GGUF files come already quantized): a plain fit per sub-block, then
 * the sub-block scales quantized against the super-block's largest, then every quant re-derived
 * from the decoded, rounded scales. Simpler than ggml's error-searching *_ref quantizers, with
 * somewhat larger error. Q8_K, an activation type, follows ggml's quantize_row_q8_K_ref exactly. */

/* Asymmetric fit: x ~ scale * l - min with l in [0, nmax], min >= 0 (the range always spans 0). */
static void fit_min_max(const float *x, int n, int nmax, float *scale, float *min) {
    float lo = 0.0f, hi = x[0];
    for (int i = 0; i < n; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
    }
    *scale = hi > lo ? (hi - lo) / (float)nmax : 0.0f;
    *min = -lo;
}

/* The element with the largest magnitude, sign kept (the first of equals). */
static float signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    }
    return max;
}

/* Symmetric fit: x ~ scale * l with l in [-nmax, nmax - 1]; the largest-magnitude element maps to
 * -nmax, so scale carries the opposite of its sign (as ggml's make_qx_quants). */
static float fit_signed(const float *x, int n, int nmax) { return signed_absmax(x, n) / -(float)nmax; }

/* u[e] = the stored quant in [0, levels) whose value under the decoded scales is nearest x[e]
 * (the zero level where a sub-block's scale is 0). */
static void requantize(const el_k_scales *s, const float *x, int levels, int8_t u[QK_K]) {
    for (int j = 0; j < QK_K / s->sub; j++) {
        const float dl = s->d * (float)s->scale[j];
        const float ml = s->dmin * (float)s->min[j];
        for (int l = 0; l < s->sub; l++) {
            const int e = j * s->sub + l;
            const int lo = -s->offset, hi = levels - 1 - s->offset; /* q = u - offset */
            const int q = dl != 0.0f ? nearest_clamped((x[e] + ml) / dl, lo, hi) : 0;
            u[e] = (int8_t)(q + s->offset);
        }
    }
}

/* The largest of v[0..n), or 0 when none is positive. */
static float max_of(const float *v, int n) {
    float m = 0.0f;
    for (int i = 0; i < n; i++) m = v[i] > m ? v[i] : m;
    return m;
}

void el_quantize_q2_K(const float *x, void *vy, int64_t nb) {
    el_block_q2_K *y = vy;
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float scales[16], mins[16];
        for (int j = 0; j < 16; j++) fit_min_max(x + 16 * j, 16, 3, &scales[j], &mins[j]);
        const float max_scale = max_of(scales, 16), max_min = max_of(mins, 16);
        const float iscale = max_scale > 0.0f ? 15.0f / max_scale : 0.0f;
        const float imin = max_min > 0.0f ? 15.0f / max_min : 0.0f;
        for (int j = 0; j < 16; j++) {
            const int ls = nearest_clamped(iscale * scales[j], 0, 15);
            const int lm = nearest_clamped(imin * mins[j], 0, 15);
            y[i].scales[j] = (uint8_t)(ls | (lm << 4));
        }
        y[i].d = el_fp32_to_fp16(max_scale / 15.0f);
        y[i].dmin = el_fp32_to_fp16(max_min / 15.0f);
        el_k_scales s;
        int8_t u[QK_K];
        scales_q2_K(&y[i], &s);
        requantize(&s, x, 4, u);
        pack_quants_q2_K(u, &y[i]);
    }
}

void el_quantize_q3_K(const float *x, void *vy, int64_t nb) {
    el_block_q3_K *y = vy;
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float scales[16];
        for (int j = 0; j < 16; j++) scales[j] = fit_signed(x + 16 * j, 16, 4);
        const float max_scale = signed_absmax(scales, 16);
        const float iscale = max_scale != 0.0f ? -32.0f / max_scale : 0.0f;
        uint8_t ls[16];
        for (int j = 0; j < 16; j++) ls[j] = (uint8_t)(nearest_clamped(iscale * scales[j], -32, 31) + 32);
        pack_q3_scales(ls, y[i].scales);
        y[i].d = el_fp32_to_fp16(iscale != 0.0f ? 1.0f / iscale : 0.0f);
        el_k_scales s;
        int8_t u[QK_K];
        scales_q3_K(&y[i], &s);
        requantize(&s, x, 8, u);
        pack_quants_q3_K(u, &y[i]);
    }
}

/* Q4_K and Q5_K share their scales: 6-bit scales and mins against f16 super-scales. */
static void quantize_scales_k4(const float *x, int nmax, uint16_t *d, uint16_t *dmin,
                               uint8_t packed[K_SCALE_SIZE]) {
    float scales[8], mins[8];
    for (int j = 0; j < 8; j++) fit_min_max(x + 32 * j, 32, nmax, &scales[j], &mins[j]);
    const float max_scale = max_of(scales, 8), max_min = max_of(mins, 8);
    const float iscale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
    const float imin = max_min > 0.0f ? 63.0f / max_min : 0.0f;
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        ls[j] = (uint8_t)nearest_clamped(iscale * scales[j], 0, 63);
        lm[j] = (uint8_t)nearest_clamped(imin * mins[j], 0, 63);
    }
    pack_scale_min_k4(ls, lm, packed);
    *d = el_fp32_to_fp16(max_scale / 63.0f);
    *dmin = el_fp32_to_fp16(max_min / 63.0f);
}

void el_quantize_q4_K(const float *x, void *vy, int64_t nb) {
    el_block_q4_K *y = vy;
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        quantize_scales_k4(x, 15, &y[i].d, &y[i].dmin, y[i].scales);
        el_k_scales s;
        int8_t u[QK_K];
        scales_q4_K(&y[i], &s);
        requantize(&s, x, 16, u);
        pack_quants_q4_K(u, &y[i]);
    }
}

void el_quantize_q5_K(const float *x, void *vy, int64_t nb) {
    el_block_q5_K *y = vy;
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        quantize_scales_k4(x, 31, &y[i].d, &y[i].dmin, y[i].scales);
        el_k_scales s;
        int8_t u[QK_K];
        scales_q5_K(&y[i], &s);
        requantize(&s, x, 32, u);
        pack_quants_q5_K(u, &y[i]);
    }
}

void el_quantize_q6_K(const float *x, void *vy, int64_t nb) {
    el_block_q6_K *y = vy;
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float scales[16];
        for (int j = 0; j < 16; j++) scales[j] = fit_signed(x + 16 * j, 16, 32);
        const float max_scale = signed_absmax(scales, 16);
        const float iscale = max_scale != 0.0f ? -128.0f / max_scale : 0.0f;
        for (int j = 0; j < 16; j++) y[i].scales[j] = (int8_t)nearest_clamped(iscale * scales[j], -128, 127);
        y[i].d = el_fp32_to_fp16(iscale != 0.0f ? 1.0f / iscale : 0.0f);
        el_k_scales s;
        int8_t u[QK_K];
        scales_q6_K(&y[i], &s);
        requantize(&s, x, 64, u);
        pack_quants_q6_K(u, &y[i]);
    }
}

/* ggml's quantize_row_q8_K_ref, exactly: iscale = -127 / (the signed largest-magnitude element),
 * q = nearest_int(iscale * x) capped at 127, d = 1 / iscale; bsums are the sums of 16 quants.
 * An all-zero block gets d = 0 and zero quants (and zero bsums, which ggml leaves unwritten). */
void el_quantize_q8_K(const float *x, void *vy, int64_t nb) {
    el_block_q8_K *y = vy;
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        const float max = signed_absmax(x, QK_K);
        memset(&y[i], 0, sizeof(y[i]));
        if (max == 0.0f) continue;
        const float iscale = -127.0f / max;
        for (int e = 0; e < QK_K; e++) {
            const int v = nearest_int(iscale * x[e]);
            y[i].qs[e] = (int8_t)(v < 127 ? v : 127);
        }
        for (int g = 0; g < QK_K / 16; g++) {
            int32_t sum = 0;
            for (int l = 0; l < 16; l++) sum += y[i].qs[16 * g + l];
            y[i].bsums[g] = (int16_t)sum;
        }
        y[i].d = 1.0f / iscale;
    }
}

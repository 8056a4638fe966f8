/*
 * quants_mxfp4.c: the MXFP4 tensor type's scalar reference kernels (OCP microscaling FP4, the
 * type of gpt-oss's expert weights): dequantize, the dot product against Q8_0 (the activation
 * type llama.cpp pairs it with, ggml_vec_dot_mxfp4_q8_0) and a quantizer (quantize_row_mxfp4_ref).
 * quants.c's dispatch table calls these; the block layout is in el_blocks.h, the E2M1 values
 * (doubled, so small integers) in el_iq_tables.h, the scale conversion in el_internal.h.
 *
 * A block is 32 elements x[j] = 2^(e - 128) * kvalues_mxfp4[q[j]], q as q4_0's nibbles (element j
 * the low nibble of byte j, element j + 16 the high one). The dot product sums a block in
 * integers, isum = sum kvalue[q] * a.qs (exact in int32), and does one float step per block,
 * sum += (a.d * 2^(e - 128)) * (float)isum, as ggml's generic kernel does; the AVX2 variant
 * (quants_iq_avx2.c) reproduces it bit for bit.
 */
#include <math.h>

#include "edge_kernels.h"
#include "el_blocks.h"
#include "el_internal.h"
#include "el_iq_tables.h"

void el_dequantize_mxfp4(const void *vx, float *y, int64_t nb) {
    const el_block_mxfp4 *x = vx;
    for (int64_t i = 0; i < nb; i++) {
        const float d = el_e8m0_to_fp32_half(x[i].e);
        for (int j = 0; j < QK_MXFP4 / 2; j++) {
            y[i * QK_MXFP4 + j] = (float)el_kvalues_mxfp4[x[i].qs[j] & 0xf] * d;
            y[i * QK_MXFP4 + j + QK_MXFP4 / 2] = (float)el_kvalues_mxfp4[x[i].qs[j] >> 4] * d;
        }
    }
}

/* MXFP4 against Q8_0: per block (a.d * 2^(e - 128)) * sum kvalue[q] * a, as ggml. */
float el_dot_mxfp4_q8_0(const void *vw, const void *va, int64_t nb) {
    const el_block_mxfp4 *w = vw;
    const el_block_q8_0 *a = va;
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t isum = 0;
        for (int j = 0; j < QK_MXFP4 / 2; j++) {
            isum += el_kvalues_mxfp4[w[i].qs[j] & 0xf] * a[i].qs[j];
            isum += el_kvalues_mxfp4[w[i].qs[j] >> 4] * a[i].qs[j + QK_MXFP4 / 2];
        }
        sum += (el_fp16_to_fp32(a[i].d) * el_e8m0_to_fp32_half(w[i].e)) * (float)isum;
    }
    return sum;
}

/* The code whose value times d is nearest x (the first of equals), as ggml's best_index_mxfp4. */
static int best_index(float x, float d) {
    int best = 0;
    float best_err = fabsf((float)el_kvalues_mxfp4[0] * d - x);
    for (int i = 1; i < 16; i++) {
        const float err = fabsf((float)el_kvalues_mxfp4[i] * d - x);
        if (err < best_err) {
            best = i;
            best_err = err;
        }
    }
    return best;
}

/* ggml's quantize_row_mxfp4_ref: the scale 2^(floor(log2(amax)) - 2) (so amax lands in the top
 * E2M1 binade), each element to its nearest code. The exponent is clamped to [0, 255] where ggml's
 * cast would overflow (amax below 2^-125). */
void el_quantize_mxfp4(const float *x, void *vy, int64_t nb) {
    el_block_mxfp4 *y = vy;
    for (int64_t i = 0; i < nb; i++) {
        const float *xb = x + i * QK_MXFP4;
        float amax = 0.0f;
        for (int j = 0; j < QK_MXFP4; j++) {
            if (amax < fabsf(xb[j])) amax = fabsf(xb[j]);
        }
        float e = amax > 0.0f ? floorf(log2f(amax)) - 2 + 127 : 0.0f;
        if (!(e >= 0.0f)) e = 0.0f;
        if (e > 255.0f) e = 255.0f;
        y[i].e = (uint8_t)e;
        const float d = el_e8m0_to_fp32_half(y[i].e);
        for (int j = 0; j < QK_MXFP4 / 2; j++) {
            y[i].qs[j] = (uint8_t)(best_index(xb[j], d) | best_index(xb[j + QK_MXFP4 / 2], d) << 4);
        }
    }
}

/*
 * ssm_scan.c: the scalar references of Mamba-2's kernels (Granite 4's recurrent layers), one
 * sequence's consecutive tokens at a time with its recurrent state: el_ssm_conv (the causal
 * depthwise convolution of xBC with its last d_conv - 1 inputs, bias, SiLU), el_ssm_scan (the
 * selective scan: a scalar decay per head, B and C per group, state [n_head][head_dim][d_state])
 * and el_ssm_gate_norm (the D skip, the SiLU(z) gate and the grouped RMSNorm before out_proj).
 * Called only through src/kernels/ssm.rs (the CPU backend's Mamba-2 layers, src/model/mamba2_cpu.rs);
 * see edge_kernels.h for shapes. The arithmetic is ggml-cpu's (ggml_compute_forward_ssm_conv,
 * ggml_compute_forward_ssm_scan's Mamba-2 branch, llama.cpp's build_mamba2_layer): each sum in
 * f32 from 0.0f in index order (ggml's AVX builds sum the scan's d_state products in SIMD lanes,
 * so the two differ by rounding). A token's output depends only on the state and the tokens
 * before it, so a chunk of n tokens gives bit for bit what n calls of one token give. The scan
 * takes its AVX2 form (ssm_scan_avx2.c) for each head's channels in groups of eight once AVX2
 * is chosen, its NEON form (ssm_scan_neon.c) in groups of four once NEON is; both bit-identical.
 */
#include <math.h>

#include "edge_kernels.h"
#include "simd_internal.h"

static float silu(float v) { return v / (1.0f + expf(-v)); }

void el_ssm_conv(const float *xbc, int64_t stride, const float *w, const float *bias, float *state,
                 int32_t reset, int64_t n_tokens, int64_t d, int64_t d_conv, float *y) {
    const int64_t n_state = d_conv - 1;
    if (reset) {
        for (int64_t i = 0; i < n_state * d; i++) state[i] = 0.0f;
    }
    for (int64_t t = 0; t < n_tokens; t++) {
        float *yt = y + t * d;
        for (int64_t ch = 0; ch < d; ch++) {
            float sum = 0.0f;
            /* Window row k is input j = t + k - n_state: from the state while j < 0. */
            for (int64_t k = 0; k < d_conv; k++) {
                const int64_t j = t + k - n_state;
                const float v = j < 0 ? state[(n_state + j) * d + ch] : xbc[j * stride + ch];
                sum += v * w[ch * d_conv + k];
            }
            if (bias) sum += bias[ch];
            yt[ch] = silu(sum);
        }
    }
    /* The new state: the last n_state inputs of [state; xbc], shifted in place (reading rows at
     * or after the one written). */
    for (int64_t r = 0; r < n_state; r++) {
        const int64_t j = n_tokens + r - n_state; /* input index of state row r */
        float *sr = state + r * d;
        const float *from = j < 0 ? state + (r + n_tokens) * d : xbc + j * stride;
        for (int64_t ch = 0; ch < d; ch++) sr[ch] = from[ch];
    }
}

void el_ssm_scan(float *state, int32_t reset, const float *x, int64_t x_stride, const float *dt,
                 int64_t dt_stride, const float *dt_bias, const float *a, const float *b,
                 const float *c, int64_t bc_stride, int64_t n_tokens, int64_t n_head, int64_t head_dim,
                 int64_t d_state, int64_t n_group, float *y) {
    const int64_t d_inner = n_head * head_dim;
    if (reset) {
        for (int64_t i = 0; i < d_inner * d_state; i++) state[i] = 0.0f;
    }
    const int64_t heads_per_group = n_head / n_group;
    for (int64_t t = 0; t < n_tokens; t++) {
        const float *xt = x + t * x_stride, *dtt = dt + t * dt_stride;
        const float *bt = b + t * bc_stride, *ct = c + t * bc_stride;
        float *yt = y + t * d_inner;
        for (int64_t h = 0; h < n_head; h++) {
            const float dth = dtt[h] + dt_bias[h];
            const float dt_soft_plus = dth > 20.0f ? dth : logf(1.0f + expf(dth));
            const float dA = expf(dt_soft_plus * a[h]);
            const int64_t g = h / heads_per_group;
            const float *bg = bt + g * d_state, *cg = ct + g * d_state;
            int64_t first = 0; /* channels the AVX2 form ran (ssm_scan_avx2.c, bit-identical) */
#if defined(__x86_64__)
            if (el_use_avx2() && head_dim >= 8) {
                first = head_dim & ~(int64_t)7;
                el_ssm_scan_channels_avx2(state + h * head_dim * d_state, xt + h * head_dim, bg, cg,
                                          dt_soft_plus, dA, first, d_state, yt + h * head_dim);
            }
#endif
#if defined(__aarch64__)
            if (el_isa_get() == EL_ISA_NEON && head_dim >= 4) {
                first = head_dim & ~(int64_t)3;
                el_ssm_scan_channels_neon(state + h * head_dim * d_state, xt + h * head_dim, bg, cg,
                                          dt_soft_plus, dA, first, d_state, yt + h * head_dim);
            }
#endif
            for (int64_t i1 = first; i1 < head_dim; i1++) {
                const int64_t ii = h * head_dim + i1;
                const float x_dt = xt[ii] * dt_soft_plus;
                float *s = state + ii * d_state;
                float sum = 0.0f;
                for (int64_t i0 = 0; i0 < d_state; i0++) {
                    const float v = (s[i0] * dA) + (bg[i0] * x_dt);
                    sum += v * cg[i0];
                    s[i0] = v;
                }
                yt[ii] = sum;
            }
        }
    }
}

void el_ssm_gate_norm(float *y, const float *x, int64_t x_stride, const float *z, int64_t z_stride,
                      const float *d_skip, const float *norm, int64_t n_tokens, int64_t n_head,
                      int64_t head_dim, int64_t n_group, float eps) {
    const int64_t d_inner = n_head * head_dim, group = d_inner / n_group;
    for (int64_t t = 0; t < n_tokens; t++) {
        float *yt = y + t * d_inner;
        const float *xt = x + t * x_stride, *zt = z + t * z_stride;
        for (int64_t i = 0; i < d_inner; i++) {
            const float skip = yt[i] + xt[i] * d_skip[i / head_dim];
            yt[i] = silu(zt[i]) * skip;
        }
        for (int64_t g = 0; g < n_group; g++) {
            el_rms_norm(yt + g * group, norm + g * group, yt + g * group, 1, group, eps);
        }
    }
}

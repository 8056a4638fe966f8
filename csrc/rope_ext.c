/*
 * rope_ext.c: the rotary embedding with per-dimension frequency factors (llama3's rope_freqs)
 * and YaRN scaling, as ggml's CPU rope computes them (ggml-cpu/ops.cpp: rope_yarn and
 * ggml_rope_cache_init). The model layer calls it (through src/kernels/ops.rs) for the layers
 * whose rope has factors or YaRN; plain ropes keep el_rope. cos and sin are libm's on every ISA;
 * under AVX2 the rotation of each token's heads runs rope_ext_avx2.c's, bit-identical.
 */
#include <math.h>

#include "edge_kernels.h"
#include "simd_internal.h"

/* 1 for dimension pairs below `low`, 0 above `high`, linear between (ggml's rope_yarn_ramp). */
static float yarn_ramp(float low, float high, int64_t i0) {
    const float y = ((float)(i0 / 2) - low) / fmaxf(0.001f, high - low);
    return 1.0f - fminf(1.0f, fmaxf(0.0f, y));
}

void el_rope_ext(float *x, const int32_t *pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                 int64_t rope_dim, float freq_base, float freq_scale, int32_t neox, const float *freq_factors,
                 float ext_factor, float attn_factor, float corr_low, float corr_high) {
    const float theta_scale = powf(freq_base, -2.0f / (float)rope_dim);
    float cache[EL_MAX_HEAD_DIM];
    for (int64_t t = 0; t < n_tokens; t++) {
        /* The token's cos/sin per pair, as ggml's cache: theta_extrap advances by multiplication. */
        float theta = (float)pos[t];
        for (int64_t i0 = 0; i0 < rope_dim; i0 += 2) {
            const float ff = freq_factors != NULL ? freq_factors[i0 / 2] : 1.0f;
            const float theta_extrap = theta / ff;
            const float theta_interp = freq_scale * theta_extrap;
            float th = theta_interp, mscale = attn_factor;
            if (ext_factor != 0.0f) {
                const float ramp_mix = yarn_ramp(corr_low, corr_high, i0) * ext_factor;
                th = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix;
                mscale *= 1.0f + 0.1f * logf(1.0f / freq_scale);
            }
            cache[i0] = cosf(th) * mscale;
            cache[i0 + 1] = sinf(th) * mscale;
            theta *= theta_scale;
        }
#if defined(__x86_64__)
        if (el_use_avx2()) {
            el_rope_ext_rotate_avx2(x + t * n_heads * head_dim, n_heads, head_dim, rope_dim, neox, cache);
            continue;
        }
#endif
        for (int64_t h = 0; h < n_heads; h++) {
            float *xh = x + (t * n_heads + h) * head_dim;
            for (int64_t i0 = 0; i0 < rope_dim; i0 += 2) {
                const float c = cache[i0], s = cache[i0 + 1];
                const int64_t a = neox ? i0 / 2 : i0;
                const int64_t b = neox ? i0 / 2 + rope_dim / 2 : i0 + 1;
                const float x0 = xh[a], x1 = xh[b];
                xh[a] = x0 * c - x1 * s;
                xh[b] = x0 * s + x1 * c;
            }
        }
    }
}

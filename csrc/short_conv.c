/*
 * short_conv.c: the scalar reference of LFM2's short convolution (el_short_conv): the gated,
 * causal, depthwise convolution of one sequence's tokens with the recurrent state that carries
 * its last L - 1 inputs from one step to the next. Called only through src/kernels/ops.rs (the
 * CPU backend's conv layers); see edge_kernels.h for shapes. The arithmetic is ggml's
 * (llama.cpp's src/models/lfm2.cpp with ggml_ssm_conv): bx = b * x, each output a sum over the
 * window in window order from 0.0f in f32, then y = c * conv. A token's output depends only on
 * the state and the tokens before it, so a chunk of n tokens gives bit for bit what n calls of
 * one token give.
 */
#include "edge_kernels.h"

void el_short_conv(const float *bcx, const float *w, float *state, int32_t reset, int64_t n_tokens,
                   int64_t d, int64_t l_cache, float *y) {
    const int64_t n_state = l_cache - 1;
    if (reset) {
        for (int64_t i = 0; i < n_state * d; i++) state[i] = 0.0f;
    }
    for (int64_t t = 0; t < n_tokens; t++) {
        const float *ct = bcx + t * 3 * d + d;
        float *yt = y + t * d;
        for (int64_t ch = 0; ch < d; ch++) {
            float sum = 0.0f;
            /* Window row k is input j = t + k - n_state: from the state while j < 0. */
            for (int64_t k = 0; k < l_cache; k++) {
                const int64_t j = t + k - n_state;
                float v;
                if (j < 0) {
                    v = state[(n_state + j) * d + ch];
                } else {
                    const float *bj = bcx + j * 3 * d;
                    v = bj[ch] * bj[2 * d + ch];
                }
                sum += v * w[ch * l_cache + k];
            }
            yt[ch] = ct[ch] * sum;
        }
    }
    /* The new state: the last n_state rows of [state; bx], shifted in place (reading rows at or
     * after the one written). */
    for (int64_t r = 0; r < n_state; r++) {
        const int64_t j = n_tokens + r - n_state; /* input index of state row r */
        float *sr = state + r * d;
        if (j < 0) {
            const float *from = state + (r + n_tokens) * d;
            for (int64_t ch = 0; ch < d; ch++) sr[ch] = from[ch];
        } else {
            const float *bj = bcx + j * 3 * d;
            for (int64_t ch = 0; ch < d; ch++) sr[ch] = bj[ch] * bj[2 * d + ch];
        }
    }
}

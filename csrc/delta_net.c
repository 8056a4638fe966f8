/*
 * delta_net.c: the scalar reference of Qwen3.5's gated delta-net layer core (el_delta_net_conv,
 * el_delta_net_rule): the causal depthwise convolution over the fused q/k/v projection with its
 * state (the last d_conv - 1 projections), SiLU, the L2-normalised q and k heads, and the per-head
 * gated delta rule that updates each value head's [head_dim x head_dim] state token by token. Called only
 * through src/kernels/recurrent.rs (the CPU backend's delta-net layers); see edge_kernels.h for
 * shapes. The arithmetic is llama.cpp's (src/models/qwen35.cpp, delta-net-base.cpp with the
 * fused ggml_gated_delta_net op, ggml-cpu's ssm_conv, rms_norm and gated_delta_net):
 *   conv:   sum over the window in window order from 0.0f, then x / (1 + expf(-x));
 *   l2:     ggml_rms_norm(x, eps / n) * (1 / sqrtf(n)), the sum of squares in double;
 *   gate:   g = softplus(alpha + dt_bias) * a, softplus(x) = x > 20 ? x : logf(1 + expf(x));
 *           beta = 1 / (1 + expf(-beta));
 *   rule:   M = state transposed (M[j][i] = S[i][j]); M *= expf(g);
 *           delta[j] = (v[j] - M[j] . k) * beta; M[j][i] += k[i] * delta[j];
 *           out[j] = (M[j] . q) / sqrtf(head_dim).
 * Value head h reads q/k head h % n_k_heads (ggml's broadcast). Every token is computed from the
 * state the tokens before it left, one at a time (llama.cpp's CPU path, the fused op, does the
 * same for prefill and decode; its chunked graph form is not used), so a chunk of n tokens gives
 * bit for bit what n calls of one token give. The work is two calls: the convolution of every
 * token (el_delta_net_conv), then the delta rule of each range of value heads (el_delta_net_rule,
 * the ranges independent: the CPU backend runs them on its threads).
 */
#include <math.h>

#include "edge_kernels.h"

static float dn_silu(float x) { return x / (1.0f + expf(-x)); }

static float dn_softplus(float x) { return x > 20.0f ? x : logf(1.0f + expf(x)); }

/* In place: x * (1 / sqrtf(mean(x^2) + eps / n)) * (1 / sqrtf(n)). */
static void dn_l2_norm(float *x, int64_t n, float eps) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
    const float fn = (float)n;
    const float mean = (float)(sum / (double)n);
    const float scale = 1.0f / sqrtf(mean + eps / fn);
    const float post = 1.0f / sqrtf(fn);
    for (int64_t i = 0; i < n; i++) x[i] *= scale;
    for (int64_t i = 0; i < n; i++) x[i] *= post;
}

static float dn_dot(const float *a, const float *b, int64_t n) {
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += a[i] * b[i];
    return sum;
}

void el_delta_net_conv(const float *qkv, const float *conv_w, float *conv_state, int32_t reset,
                       int64_t n_tokens, int64_t n_k_heads, int64_t n_v_heads, int64_t head_dim,
                       int64_t d_conv, float eps, float *x) {
    const int64_t S = head_dim;
    const int64_t conv_dim = (2 * n_k_heads + n_v_heads) * S;
    const int64_t n_state = d_conv - 1;
    if (reset) {
        for (int64_t i = 0; i < n_state * conv_dim; i++) conv_state[i] = 0.0f;
    }
    for (int64_t t = 0; t < n_tokens; t++) {
        float *xt = x + t * conv_dim;
        for (int64_t ch = 0; ch < conv_dim; ch++) {
            float sum = 0.0f;
            /* Window row k is input j = t + k - n_state: from the state while j < 0. */
            for (int64_t k = 0; k < d_conv; k++) {
                const int64_t j = t + k - n_state;
                const float v = j < 0 ? conv_state[(n_state + j) * conv_dim + ch] : qkv[j * conv_dim + ch];
                sum += v * conv_w[ch * d_conv + k];
            }
            xt[ch] = dn_silu(sum);
        }
        for (int64_t h = 0; h < 2 * n_k_heads; h++) dn_l2_norm(xt + h * S, S, eps);
    }
    /* The new conv state: the last n_state rows of [state; qkv], shifted in place (reading rows
     * at or after the one written). */
    for (int64_t r = 0; r < n_state; r++) {
        const int64_t j = n_tokens + r - n_state; /* input index of state row r */
        float *sr = conv_state + r * conv_dim;
        const float *from = j < 0 ? conv_state + (r + n_tokens) * conv_dim : qkv + j * conv_dim;
        for (int64_t ch = 0; ch < conv_dim; ch++) sr[ch] = from[ch];
    }
}

void el_delta_net_rule(const float *x, const float *alpha, const float *beta, const float *dt_bias,
                       const float *a, float *ssm_state, int32_t reset, int64_t n_tokens,
                       int64_t n_k_heads, int64_t n_v_heads, int64_t head_dim, int64_t h_begin,
                       int64_t h_end, float *delta, float *out) {
    const int64_t S = head_dim;
    const int64_t conv_dim = (2 * n_k_heads + n_v_heads) * S;
    const float scale = 1.0f / sqrtf((float)S);
    if (reset) {
        for (int64_t i = h_begin * S * S; i < h_end * S * S; i++) ssm_state[i] = 0.0f;
    }
    for (int64_t t = 0; t < n_tokens; t++) {
        const float *xt = x + t * conv_dim;
        for (int64_t h = h_begin; h < h_end; h++) {
            const float *q = xt + (h % n_k_heads) * S;
            const float *k = xt + (n_k_heads + h % n_k_heads) * S;
            const float *v = xt + (2 * n_k_heads + h) * S;
            const float g = dn_softplus(alpha[t * n_v_heads + h] + dt_bias[h]) * a[h];
            const float b = 1.0f / (1.0f + expf(-beta[t * n_v_heads + h]));
            float *M = ssm_state + h * S * S;
            const float decay = expf(g);
            for (int64_t i = 0; i < S * S; i++) M[i] *= decay;
            for (int64_t j = 0; j < S; j++) delta[j] = (v[j] - dn_dot(M + j * S, k, S)) * b;
            for (int64_t j = 0; j < S; j++) {
                float *row = M + j * S;
                for (int64_t i = 0; i < S; i++) row[i] += k[i] * delta[j];
            }
            float *o = out + (t * n_v_heads + h) * S;
            for (int64_t j = 0; j < S; j++) o[j] = dn_dot(M + j * S, q, S) * scale;
        }
    }
}

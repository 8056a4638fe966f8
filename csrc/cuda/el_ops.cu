/*
 * el_ops.cu: the row operations of a forward step on the GPU: RMSNorm, RoPE (plain, and with
 * llama3's frequency factors or YaRN), SwiGLU/GeGLU, the paged KV write, paged attention, and
 * the small glue (bias and residual adds, multipliers, logit soft-cap,
 * gathering the rows that want logits, copying a KV block). Same names and argument shapes as
 * csrc/edge_kernels.h where the C kernel exists, with an el_cuda_ prefix; csrc/ops.c is the
 * truth they are tested against (tests/cuda_kernels.rs). Launched only from src/cuda/kernels.rs.
 */
#include "el_cuda_common.cuh"

/* y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, one block per row; the sum of squares in double as
 * in the reference. x and y may alias. */
extern "C" __global__ void el_cuda_rms_norm(const float *x /* [n_rows][n] */, const float *w /* [n] */,
                                            float *y /* [n_rows][n] */, int64_t n_rows, int64_t n, float eps) {
    __shared__ double partial[32];
    const int64_t r = blockIdx.x;
    if (r >= n_rows) return;
    const float *xr = x + r * n;
    float *yr = y + r * n;
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += (double)xr[i] * (double)xr[i];
    sum = el_warp_sum_d(sum);
    const int warp = threadIdx.x / EL_WARP, lane = threadIdx.x % EL_WARP;
    if (lane == 0) partial[warp] = sum;
    __syncthreads();
    if (warp == 0) {
        const int n_warps = (blockDim.x + EL_WARP - 1) / EL_WARP;
        double s = lane < n_warps ? partial[lane] : 0.0;
        s = el_warp_sum_d(s);
        if (lane == 0) partial[0] = s;
    }
    __syncthreads();
    const float scale = 1.0f / sqrtf((float)(partial[0] / (double)n) + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * scale * w[i];
}

/* Rotary position embedding in place, one thread per (token, head, pair). theta_i =
 * pos * freq_scale * theta_scale^i, advanced by i multiplications as the reference does, with
 * theta_scale = freq_base^(-2 / rope_dim) computed by the caller (host libm powf, as the
 * reference). neox = 0 rotates (x[2i], x[2i+1]), neox = 1 rotates (x[i], x[i + rope_dim/2]). */
extern "C" __global__ void el_cuda_rope(float *x /* [n_tokens][n_heads][head_dim] */, const int32_t *pos /* [n_tokens] */,
                                        int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t rope_dim,
                                        float freq_scale, float theta_scale, int32_t neox) {
    const int64_t half = rope_dim / 2;
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n_tokens * n_heads * half) return;
    const int64_t i = idx % half;
    const int64_t th = idx / half; /* token * n_heads + head */
    const int64_t t = th / n_heads;
    float theta = (float)pos[t] * freq_scale;
    for (int64_t k = 0; k < i; k++) theta *= theta_scale;
    const float c = el_cosf(theta), s = el_sinf(theta);
    float *xh = x + th * head_dim;
    const int64_t a = neox ? i : 2 * i;
    const int64_t b = neox ? i + half : 2 * i + 1;
    const float x0 = xh[a], x1 = xh[b];
    xh[a] = x0 * c - x1 * s;
    xh[b] = x0 * s + x1 * c;
}

/* ggml's rope_yarn_ramp: 1 for dimension pairs below `low`, 0 above `high`, linear between. */
__device__ __forceinline__ float el_yarn_ramp(float low, float high, int64_t i0) {
    const float y = ((float)(i0 / 2) - low) / fmaxf(0.001f, high - low);
    return 1.0f - fminf(1.0f, fmaxf(0.0f, y));
}

/* RoPE with per-pair frequency divisors (llama3's rope_freqs; all 1 without them) and YaRN, as
 * el_rope_ext in csrc/rope_ext.c: theta_extrap = pos * theta_scale^i / freq_factors[i] (the power
 * advanced by i multiplications from pos, as the reference does), theta_interp = freq_scale *
 * theta_extrap; with ext_factor != 0 the two are mixed over the pairs [corr_low, corr_high] and
 * cos/sin scaled by mscale = attn_factor * (1 + 0.1 ln(1 / freq_scale)) (computed by the caller,
 * host logf as the reference; attn_factor alone without YaRN). One thread per (token, head, pair). */
extern "C" __global__ void el_cuda_rope_ext(float *x /* [n_tokens][n_heads][head_dim] */, const int32_t *pos /* [n_tokens] */,
                                            const float *freq_factors /* [rope_dim / 2] */, int64_t n_tokens,
                                            int64_t n_heads, int64_t head_dim, int64_t rope_dim, float freq_scale,
                                            float theta_scale, int32_t neox, float ext_factor, float mscale,
                                            float corr_low, float corr_high) {
    const int64_t half = rope_dim / 2;
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n_tokens * n_heads * half) return;
    const int64_t i = idx % half;
    const int64_t th = idx / half; /* token * n_heads + head */
    const int64_t t = th / n_heads;
    float theta = (float)pos[t];
    for (int64_t k = 0; k < i; k++) theta *= theta_scale;
    const float theta_extrap = theta / freq_factors[i];
    const float theta_interp = freq_scale * theta_extrap;
    float angle = theta_interp;
    if (ext_factor != 0.0f) {
        const float ramp_mix = el_yarn_ramp(corr_low, corr_high, 2 * i) * ext_factor;
        angle = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix;
    }
    const float c = el_cosf(angle) * mscale, s = el_sinf(angle) * mscale;
    float *xh = x + th * head_dim;
    const int64_t a = neox ? i : 2 * i;
    const int64_t b = neox ? i + half : 2 * i + 1;
    const float x0 = xh[a], x1 = xh[b];
    xh[a] = x0 * c - x1 * s;
    xh[b] = x0 * s + x1 * c;
}

/* y[i] = silu(gate[i]) * up[i]. y may alias gate or up. */
extern "C" __global__ void el_cuda_swiglu(const float *gate /* [n] */, const float *up /* [n] */, float *y /* [n] */,
                                          int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = gate[i];
    y[i] = g / (1.0f + el_expf(-g)) * up[i];
}

/* gpt-oss's clamped SwiGLU, as el_swiglu_oai: g = min(gate[i], limit), u = clamp(up[i], -limit,
 * limit), y[i] = g / (1 + exp(-alpha g)) * (u + 1). y may alias gate or up. */
extern "C" __global__ void el_cuda_swiglu_oai(const float *gate /* [n] */, const float *up /* [n] */,
                                              float *y /* [n] */, int64_t n, float alpha, float limit) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = limit < gate[i] ? limit : gate[i];
    const float u = up[i] < -limit ? -limit : up[i] > limit ? limit : up[i];
    y[i] = g / (1.0f + el_expf(alpha * -g)) * (u + 1.0f);
}

/* y[i] = gelu_tanh(gate[i]) * up[i]. y may alias gate or up. */
extern "C" __global__ void el_cuda_geglu(const float *gate /* [n] */, const float *up /* [n] */, float *y /* [n] */,
                                         int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float sqrt_2_over_pi = 0.79788456080286535587989211986876f;
    const float g = gate[i];
    const float gelu = 0.5f * g * (1.0f + el_tanhf(sqrt_2_over_pi * g * (1.0f + 0.044715f * g * g)));
    y[i] = gelu * up[i];
}

/* Each token's key and value rows into the f16 cache slots its slot_mapping entry names
 * (slot = block_id * block_size + offset); slots < 0 are skipped. Block t, threads over kv_dim. */
extern "C" __global__ void el_cuda_kv_write(const float *k /* [n_tokens][kv_dim] */, const float *v /* [n_tokens][kv_dim] */,
                                            uint16_t *k_cache /* [num_slots][kv_dim] */, uint16_t *v_cache /* [num_slots][kv_dim] */,
                                            const int64_t *slot_mapping /* [n_tokens] */, int64_t n_tokens, int64_t kv_dim) {
    const int64_t t = blockIdx.x;
    if (t >= n_tokens) return;
    const int64_t slot = slot_mapping[t];
    if (slot < 0) return;
    for (int64_t i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        k_cache[slot * kv_dim + i] = el_f2h(k[t * kv_dim + i]);
        v_cache[slot * kv_dim + i] = el_f2h(v[t * kv_dim + i]);
    }
}

/* Element e of a KV cache of `type` (F16, Q8_0 or Q4_0; blocks of 32 along each row) as f32,
 * exactly as the reference's el_kv_rows_to_f32: the half, or the block's d times its quant. */
__device__ __forceinline__ float el_kv_elem(const uint8_t *cache, int32_t type, int64_t e) {
    if (type == EL_TYPE_Q8_0) {
        const uint8_t *b = cache + (e / EL_QK) * EL_Q8_0_BYTES;
        return (float)(int8_t)b[2 + e % EL_QK] * el_ldh(b);
    }
    if (type == EL_TYPE_Q4_0) {
        const uint8_t *b = cache + (e / EL_QK) * EL_Q4_0_BYTES;
        const int j = (int)(e % EL_QK);
        const int nib = j < EL_QK / 2 ? (b[2 + j] & 0x0F) : (b[2 + j - EL_QK / 2] >> 4);
        return (float)(nib - 8) * el_ldh(b);
    }
    return el_h2f(((const uint16_t *)cache)[e]);
}

/* Paged attention, as el_paged_attention in csrc/edge_kernels.h: item t * n_heads + h (token t,
 * query head h reading KV head h / (n_heads / n_kv_heads)) sees the keys at positions
 * [max(0, L - window), L), L = context_lens[t] (all of [0, L) when window <= 0), key j of its
 * sequence in slot block_tables[token_seq[t]][j / block_size] * block_size + j % block_size.
 *
 * One block per item, its EL_ATTN_PARTS warps splitting the keys: part p takes the chunks of 32
 * keys starting at first + 32 * (p + EL_ATTN_PARTS * i), one key per lane: each lane scores its
 * key (a float sum over head_dim, then times scale), then the chunk joins the part's online
 * softmax (running max, rescaled sum) and the values are accumulated with lane l holding dims
 * l, l + 32, ... The parts then meet in shared memory: the largest of their maxima, each part's
 * sum and values rescaled to it and added in part order. How keys are split depends on the item's
 * own context length only, so an item's result never depends on the other items of the launch.
 * A decode step has few items (one per head) over long contexts: split eight ways they keep
 * eight times as many warps busy. The reference orders its sums and exps differently, so results
 * agree to rounding (tests/cuda_kernels.rs: ATTENTION_BUDGET), not bit for bit. Keys and values
 * are read through el_kv_elem, so a q8_0 or q4_0 cache gives the reference's f32 values. With
 * sinks (gpt-oss), head h's sink logit joins the parts' maximum and adds its exp to the sum. */
#define EL_ATTN_PARTS 8
#define EL_ATTN_DIMS_PER_LANE (EL_MAX_HEAD_DIM / EL_WARP)
extern "C" __global__ void __launch_bounds__(EL_ATTN_PARTS * EL_WARP)
    el_cuda_paged_attention(float *out /* [n_tokens][n_heads][head_dim] */, const float *q /* [n_tokens][n_heads][head_dim] */,
                            const uint8_t *k_cache /* [num_blocks][block_size] rows of kv_dim of k_type */,
                            const uint8_t *v_cache /* [num_blocks][block_size] rows of kv_dim of v_type */,
                            int32_t k_type, int32_t v_type,
                            const int32_t *block_tables /* [n_seqs][max_blocks_per_seq] */,
                            const int32_t *token_seq /* [n_tokens] */, const int32_t *context_lens /* [n_tokens] */,
                            int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t block_size,
                            int64_t max_blocks_per_seq, float scale, int32_t window,
                            const float *sinks /* [n_heads], read when has_sinks */, int32_t has_sinks,
                            int64_t item_begin, int64_t item_end) {
    __shared__ float qs[EL_MAX_HEAD_DIM];
    __shared__ float part_acc[EL_ATTN_PARTS][EL_MAX_HEAD_DIM];
    __shared__ float part_m[EL_ATTN_PARTS], part_l[EL_ATTN_PARTS];
    const int part = threadIdx.x / EL_WARP, lane = threadIdx.x % EL_WARP;
    const int64_t item = item_begin + (int64_t)blockIdx.x;
    if (item >= item_end) return; /* the whole block */
    const int64_t t = item / n_heads, h = item % n_heads;
    const int64_t kvh = h / (n_heads / n_kv_heads);
    const int64_t kv_dim = n_kv_heads * head_dim;
    for (int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) qs[d] = q[item * head_dim + d];
    __syncthreads();
    const int32_t *table = block_tables + (int64_t)token_seq[t] * max_blocks_per_seq;
    const int64_t len = context_lens[t];
    const int64_t first = (window > 0 && len > window) ? len - window : 0;
    float m = -EL_INF, l = 0.0f;
    float acc[EL_ATTN_DIMS_PER_LANE];
#pragma unroll
    for (int i = 0; i < EL_ATTN_DIMS_PER_LANE; i++) acc[i] = 0.0f;
    for (int64_t j0 = first + (int64_t)EL_WARP * part; j0 < len; j0 += (int64_t)EL_WARP * EL_ATTN_PARTS) {
        const int64_t j = j0 + lane;
        float s = -EL_INF;
        int64_t slot = 0;
        if (j < len) {
            slot = (int64_t)table[j / block_size] * block_size + j % block_size;
            const int64_t e = slot * kv_dim + kvh * head_dim;
            float dot = 0.0f;
            for (int64_t d = 0; d < head_dim; d++) dot += qs[d] * el_kv_elem(k_cache, k_type, e + d);
            s = dot * scale;
        }
        const float m_new = fmaxf(m, el_warp_max(s)); /* finite: lane 0's key is always in range */
        const float c = el_expf(m - m_new);
        const float p = j < len ? el_expf(s - m_new) : 0.0f;
        l = l * c + el_warp_sum(p);
#pragma unroll
        for (int i = 0; i < EL_ATTN_DIMS_PER_LANE; i++) acc[i] *= c;
        const int64_t n_keys = len - j0 < EL_WARP ? len - j0 : EL_WARP;
        for (int kk = 0; kk < n_keys; kk++) {
            const float pk = __shfl_sync(0xffffffffu, p, kk);
            const int64_t slot_k = __shfl_sync(0xffffffffu, slot, kk);
            const int64_t e = slot_k * kv_dim + kvh * head_dim;
#pragma unroll
            for (int i = 0; i < EL_ATTN_DIMS_PER_LANE; i++) {
                const int64_t d = lane + (int64_t)EL_WARP * i;
                if (d < head_dim) acc[i] += pk * el_kv_elem(v_cache, v_type, e + d);
            }
        }
        m = m_new;
    }
    /* A part with no keys keeps m = -inf, l = 0 and zero values: its weight below is 0. Part 0
     * always has key `first`, so the largest maximum is finite. */
#pragma unroll
    for (int i = 0; i < EL_ATTN_DIMS_PER_LANE; i++) {
        const int64_t d = lane + (int64_t)EL_WARP * i;
        if (d < head_dim) part_acc[part][d] = acc[i];
    }
    if (lane == 0) {
        part_m[part] = m;
        part_l[part] = l;
    }
    __syncthreads();
    float m_all = part_m[0];
    for (int p = 1; p < EL_ATTN_PARTS; p++) m_all = fmaxf(m_all, part_m[p]);
    /* A sink (gpt-oss) is one more logit whose value row is zero: it joins the maximum and the
     * normaliser only. */
    if (has_sinks) m_all = fmaxf(m_all, sinks[h]);
    float w[EL_ATTN_PARTS];
    float l_all = 0.0f;
    for (int p = 0; p < EL_ATTN_PARTS; p++) {
        w[p] = el_expf(part_m[p] - m_all);
        l_all += part_l[p] * w[p];
    }
    if (has_sinks) l_all += el_expf(sinks[h] - m_all);
    const float inv = l_all > 0.0f ? 1.0f / l_all : 0.0f;
    for (int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float v = 0.0f;
        for (int p = 0; p < EL_ATTN_PARTS; p++) v += part_acc[p][d] * w[p];
        out[item * head_dim + d] = v * inv;
    }
}

/* What a quantized KV cache stores and reads turned (kernels::hadamard_rows, cpu.rs kv_write):
 * y[r] = (x[r] - center) with every run of n values times the orthonormal Walsh-Hadamard matrix
 * in Sylvester's order: the difference rounded first, then the butterfly stages h = 1, 2, 4, ...
 * (y[j], y[j + h]) -> (y[j] + y[j + h], y[j] - y[j + h]) within each run, then times scale
 * (1 / sqrt(n) in f32, from the host). Each value is the same operations in the same order as
 * the reference's, so the bits are its bits. n = 1 turns nothing (scale 1): the center alone.
 * has_center = 0 reads no center. x and y may alias. One block per row, threads over pairs. */
extern "C" __global__ void el_cuda_hadamard(const float *x /* [n_rows][row] */, float *y /* [n_rows][row] */,
                                            const float *center /* [row] */, int32_t has_center, int64_t n_rows,
                                            int64_t row, int64_t n, float scale) {
    const int64_t r = blockIdx.x;
    if (r >= n_rows) return;
    const float *xr = x + r * row;
    float *yr = y + r * row;
    for (int64_t i = threadIdx.x; i < row; i += blockDim.x) yr[i] = has_center ? xr[i] - center[i] : xr[i];
    __syncthreads();
    for (int64_t h = 1; h < n; h *= 2) {
        for (int64_t p = threadIdx.x; p < row / 2; p += blockDim.x) {
            const int64_t run = p / (n / 2), q = p % (n / 2);
            const int64_t j = run * n + (q / h) * 2 * h + q % h;
            const float a = yr[j], b = yr[j + h];
            yr[j] = a + b;
            yr[j + h] = a - b;
        }
        __syncthreads();
    }
    for (int64_t i = threadIdx.x; i < row; i += blockDim.x) yr[i] *= scale;
}

/* x[i] += y[i]: the residual add. */
extern "C" __global__ void el_cuda_add(float *x /* [n] */, const float *y /* [n] */, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

/* x[r][i] += bias[i]: a linear layer's bias. */
extern "C" __global__ void el_cuda_add_bias(float *x /* [n_rows][n] */, const float *bias /* [n] */, int64_t n_rows,
                                            int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n_rows * n) x[i] += bias[i % n];
}

/* x[i] *= s: granite's residual and logit multipliers. */
extern "C" __global__ void el_cuda_scale(float *x /* [n] */, int64_t n, float s) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

/* x[i] = cap * tanh(x[i] / cap): the final logit soft-cap. */
extern "C" __global__ void el_cuda_softcap(float *x /* [n] */, int64_t n, float cap) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = cap * el_tanhf(x[i] / cap);
}

/* out[i] = x[rows[i]]: the rows of the residual stream that want logits. Block i. */
extern "C" __global__ void el_cuda_gather_rows(const float *x /* [*][n] */, const int32_t *rows /* [n_rows] */,
                                               float *out /* [n_rows][n] */, int64_t n_rows, int64_t n) {
    const int64_t r = blockIdx.x;
    if (r >= n_rows) return;
    const float *src = x + (int64_t)rows[r] * n;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[r * n + i] = src[i];
}

/* out[rows[i]] = x[i]: one expert's outputs into their slots (rows of the slots buffer). Block i. */
extern "C" __global__ void el_cuda_scatter_rows(const float *x /* [n_rows][n] */, const int32_t *rows /* [n_rows] */,
                                                float *out /* [*][n] */, int64_t n_rows, int64_t n) {
    const int64_t r = blockIdx.x;
    if (r >= n_rows) return;
    float *dst = out + (int64_t)rows[r] * n;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = x[r * n + i];
}

/* out[r] = w[r*k] * x[r*k] + w[r*k + 1] * x[r*k + 1] + ..., added in that order: each row's
 * experts' outputs combined with their weights (el_rows' weighted_sum). Block r. */
extern "C" __global__ void el_cuda_weighted_sum(const float *x /* [n_rows * k][n] */, const float *w /* [n_rows * k] */,
                                                float *out /* [n_rows][n] */, int64_t n_rows, int64_t k, int64_t n) {
    const int64_t r = blockIdx.x;
    if (r >= n_rows) return;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        float acc = x[(r * k) * n + i] * w[r * k];
        for (int64_t j = 1; j < k; j++) acc += x[(r * k + j) * n + i] * w[r * k + j];
        out[r * n + i] = acc;
    }
}

/* cache[dst * n .. + n) = cache[src * n .. + n): copy-on-write of one KV block (n = block_size *
 * kv_dim halves) in one layer's keys or values. src != dst. */
extern "C" __global__ void el_cuda_copy_block(uint16_t *cache /* [num_blocks][n] */, int64_t src, int64_t dst, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) cache[dst * n + i] = cache[src * n + i];
}

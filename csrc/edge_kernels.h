/*
 * edge_kernels.h: the one narrow boundary between edge-llm's Rust code and its C kernels.
 *
 * Every symbol carries the `el_` prefix. Arguments are flat pointers and sized integers; the
 * comment beside each pointer gives its shape, outermost dimension first. Kernels never allocate,
 * hold no state and never read past the shapes they are given. Rust validates types and sizes
 * before it calls in (src/kernels/mod.rs is the only caller); a kernel handed an unknown type
 * returns EL_ERR_TYPE and writes nothing.
 *
 * Tensor types use the ggml/GGUF numbering so a GGUF tensor's type id passes straight through
 * (enum el_type, in el_types.h with each type's block size, included below).
 * Quantized block layouts are bit-compatible with the files llama.cpp writes (ggml-common.h).
 */
#ifndef EDGE_KERNELS_H
#define EDGE_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* Tensor types (enum el_type, ggml numbering) and their block sizes (EL_QK, EL_QK_K and
 * EL_<T>_ELEMS / EL_<T>_BYTES per type): one header for C, CUDA and Rust. */
#include "el_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. */
enum el_status {
    EL_OK = 0,
    EL_ERR_TYPE = -1,  /* unknown or unsupported tensor type */
    EL_ERR_SHAPE = -2, /* a length that is not a multiple of the block size, or out of range */
};

/* ---- Instruction sets ------------------------------------------------------------------------
 * Every kernel has a scalar reference; some also have SIMD variants, chosen at run time from what
 * the CPU offers (the best one available, once, on first use). The choice is process-wide. SIMD
 * variants are tested against the references (tests/kernels_simd.rs): the quantized dot products
 * and matrix products and the activation quantizers give bit-identical results; attention,
 * RMSNorm and SwiGLU stay within named error budgets. */
enum el_isa {
    EL_ISA_SCALAR = 0, /* the references, plain C */
    EL_ISA_AVX2 = 1,   /* x86-64 AVX2 + FMA + F16C */
    EL_ISA_NEON = 2,   /* AArch64 NEON with the dot-product instructions (SDOT) */
    EL_ISA_AVX512VNNI = 3, /* x86-64 AVX2's kernels, and AVX-512 F/BW/VL + VNNI (vpdpbusd) interleaved products */
};

/* 1 when this build and CPU can run `isa`, else 0. */
int32_t el_isa_available(int32_t isa);
/* The instruction set the kernels use now. */
int32_t el_isa_get(void);
/* Makes every kernel use `isa` from now on, process-wide (for tests and benchmarks: callers must
 * not race kernels running on other threads). EL_OK, or EL_ERR_TYPE when `isa` is unknown or
 * unavailable here (the choice is then unchanged). */
int32_t el_isa_set(int32_t isa);

/* ---- Block geometry ------------------------------------------------------------------------ */

/* Elements per block of `type` (1 for float types); 0 for an unknown type. */
int64_t el_type_block_size(int32_t type);
/* Bytes per block of `type`; 0 for an unknown type. */
int64_t el_type_block_bytes(int32_t type);
/* The activation type a dot product with a `type` weight row consumes (llama.cpp's vec_dot_type):
 * F32->F32, F16->F16, BF16->BF16, Q4_0/Q5_0/Q8_0/IQ4_NL/MXFP4->Q8_0, Q4_1/Q5_1->Q8_1, K-quants and the
 * other IQ types->Q8_K.
 * -1 for an unknown type. */
int32_t el_type_vec_dot_type(int32_t type);

/* ---- Row kernels ------------------------------------------------------------------------------
 * Quantize, vec_dot and matmul run the variant el_isa_get() names; dequantize is scalar only. */

/* y[n] = dequantized x. n is a multiple of the block size. */
int32_t el_dequantize_row(int32_t type, const void *x /* [n / block_size] blocks */, float *y /* [n] */,
                          int64_t n);
/* y = x quantized to `type` (every type above, weight types included, for tests and activations,
 * except the codebook IQ types IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M: EL_ERR_TYPE,
 * as llama.cpp makes those from importance matrices). n is a multiple of the block size. */
int32_t el_quantize_row(int32_t type, const float *x /* [n] */, void *y /* [n / block_size] blocks */,
                        int64_t n);
/* *out = sum_i w[i] * a[i], where w is a row of `type` and a a row of el_type_vec_dot_type(type),
 * as el_quantize_row makes it (its int8 quants lie in [-127, 127], which the SIMD kernels rely on). */
int32_t el_vec_dot(int32_t type, int64_t n, const void *w /* [n / bs] blocks of type */,
                   const void *a /* [n / bs'] blocks of the vec_dot type */, float *out /* [1] */);

/* ---- Matrix product ------------------------------------------------------------------------ */

/* out[r * out_stride + o] = dot(w row o, a row r) for r in [0, n_rows) and o in [o_begin, o_end).
 * w: [n_out][n_in] in `type`, rows w_row_bytes apart; a: [n_rows][n_in] in the vec_dot type,
 * rows a_row_bytes apart; out: [n_rows][out_stride] f32. Each output element is one el_vec_dot,
 * so a row's result never depends on the other rows in the batch. Callers split [0, n_out)
 * between threads. */
int32_t el_matmul(int32_t type, const void *w, int64_t w_row_bytes, const void *a, int64_t a_row_bytes,
                  float *out, int64_t out_stride, int64_t n_in, int64_t n_rows, int64_t o_begin,
                  int64_t o_end);

/* ---- Rows interleaved in eights (Q4_1, Q8_0, Q4_K, Q5_K, Q6_K) --------------------------------
 * el_matmul reads a matrix eight rows at a time; stored row after row, that is eight streams and
 * eight scale loads per block. el_repack_x8 copies a Q4_1, Q8_0, Q4_K, Q5_K or Q6_K matrix into
 * groups of eight rows whose blocks are interleaved (the same bytes, el_blocks.h), and
 * el_matmul_x8 reads that copy: one stream for one activation row, whole loads and one load for
 * eight scales for batches. Each output is bit-identical to el_vec_dot, as el_matmul's. */

/* Whether el_repack_x8 and el_matmul_x8 take `type` (1) or not (0). */
int32_t el_type_has_x8(int32_t type);
/* The instruction set whose kernel el_matmul_x8 runs for `type` now (an el_isa), or EL_ERR_TYPE
 * for a type without x8. */
int32_t el_matmul_x8_isa(int32_t type);
/* dst = w (n_out rows of nb blocks of `type`, n_out a multiple of 8) interleaved: group g = rows
 * [8g, 8g + 8), block i at dst + (g * nb + i) * 8 * block_bytes. EL_ERR_TYPE for a type without an
 * interleaved layout, EL_ERR_SHAPE for a bad n_out or nb. */
int32_t el_repack_x8(int32_t type, const void *w /* [n_out][nb] blocks */, int64_t n_out, int64_t nb,
                     void *dst /* [n_out / 8][nb] interleaved blocks */);
/* el_matmul from the interleaved copy w8: out[r * out_stride + o] = el_vec_dot(type, row o of the
 * matrix, a row r), bit for bit, for r in [0, n_rows) and o in [o_begin, o_end) (both multiples of
 * 8); n_in a multiple of the block size bs. */
int32_t el_matmul_x8(int32_t type, const void *w8 /* [n_out / 8][n_in / bs] interleaved blocks */,
                     const void *a /* [n_rows][n_in / bs] vec_dot blocks, rows a_row_bytes apart */,
                     int64_t a_row_bytes, float *out /* [n_rows][out_stride] */, int64_t out_stride,
                     int64_t n_in, int64_t n_rows, int64_t o_begin, int64_t o_end);

/* ---- Elementwise and row operations (f32) ---------------------------------------------------
 * Each runs the variant el_isa_get() names (GeGLU: the reference only). */

/* y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, for each of n_rows rows of n. x and y may alias. */
void el_rms_norm(const float *x /* [n_rows][n] */, const float *w /* [n] */, float *y /* [n_rows][n] */,
                 int64_t n_rows, int64_t n, float eps);

/* Rotary position embedding in place. Rotates the first rope_dim dims of each head by
 * theta_i = pos * freq_scale * freq_base^(-2i/rope_dim). neox = 0 rotates adjacent pairs (x[2i], x[2i+1]),
 * as llama-architecture GGUF files are written; neox = 1 rotates (x[i], x[i + rope_dim/2]). */
void el_rope(float *x /* [n_tokens][n_heads][head_dim] */, const int32_t *pos /* [n_tokens] */,
             int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t rope_dim, float freq_base,
             float freq_scale, int32_t neox);

/* el_rope with llama.cpp's extensions (the reference only): theta_i is divided by
 * freq_factors[i] (llama3's rope_freqs; NULL: none), and with ext_factor != 0 (YaRN) mixed between
 * the interpolated pos * freq_scale * theta_i and the extrapolated pos * theta_i by a ramp over the
 * pairs [corr_low, corr_high], cos and sin then scaled by attn_factor * (1 + 0.1 ln(1 / freq_scale));
 * without YaRN by attn_factor alone. As ggml's rope_yarn. rope_dim <= EL_MAX_HEAD_DIM. */
void el_rope_ext(float *x /* [n_tokens][n_heads][head_dim] */, const int32_t *pos /* [n_tokens] */,
                 int64_t n_tokens, int64_t n_heads, int64_t head_dim, int64_t rope_dim, float freq_base,
                 float freq_scale, int32_t neox, const float *freq_factors /* [rope_dim / 2] or NULL */,
                 float ext_factor, float attn_factor, float corr_low, float corr_high);

/* y[i] = silu(gate[i]) * up[i]. y may alias gate or up. */
void el_swiglu(const float *gate /* [n] */, const float *up /* [n] */, float *y /* [n] */, int64_t n);
/* y[i] = gelu_tanh(gate[i]) * up[i]. y may alias gate or up. */
void el_geglu(const float *gate /* [n] */, const float *up /* [n] */, float *y /* [n] */, int64_t n);
/* gpt-oss's clamped SwiGLU (ggml's swiglu_oai, the reference only): with g = min(gate[i], limit)
 * and u = clamp(up[i], -limit, limit), y[i] = g / (1 + expf(-alpha g)) * (u + 1). y may alias gate
 * or up. */
void el_swiglu_oai(const float *gate /* [n] */, const float *up /* [n] */, float *y /* [n] */, int64_t n,
                   float alpha, float limit);
/* y[i] = expf(x[i]), bit for bit glibc's expf on a CPU with FMA (expf_glibc.h): the exp SwiGLU's
 * AVX2 variant uses, exported so tests can check it against the process's libm. y may alias x. */
void el_expf(const float *x /* [n] */, float *y /* [n] */, int64_t n);

/* ---- Paged KV cache ------------------------------------------------------------------------
 * A layer's keys (and values) are rows of kv_dim = n_kv_heads * head_dim elements, one per slot,
 * stored as a tensor type: F16 (the default), BF16, or a 32-element type Q8_0, Q4_0, Q4_1, Q5_0,
 * Q5_1 or IQ4_NL in ggml's block layouts (el_types.h), blocks along head_dim (so head_dim must be
 * a multiple of 32 for those, and no block spans two heads). A row takes
 * kv_dim / el_type_block_size(type) * el_type_block_bytes(type) bytes; K and V may differ. */

/* 1 when a KV cache may hold `type`, else 0. */
int32_t el_kv_type_ok(int32_t type);

/* Writes each token's key and value rows into the cache slot its slot_mapping entry names
 * (slot = block_id * block_size + offset in block), each row converted once to the cache's type
 * as el_quantize_row converts it (F16: round to nearest even). A slot < 0 is skipped. */
void el_kv_write(const float *k /* [n_tokens][kv_dim] */, const float *v /* [n_tokens][kv_dim] */,
                 void *k_cache /* [num_slots] rows of k_type */, void *v_cache /* [num_slots] rows of v_type */,
                 int32_t k_type, int32_t v_type, const int64_t *slot_mapping /* [n_tokens] */, int64_t n_tokens,
                 int64_t kv_dim);

/* Paged attention over a batch of tokens from many sequences.
 * Token t belongs to sequence token_seq[t] and sees keys at positions [max(0, L - window), L) with
 * L = context_lens[t] (its own position + 1, so attention is causal within a prefill chunk and
 * covers the cached prefix), or all of [0, L) when window <= 0. Key j of sequence s lives in slot
 * block_tables[s * max_blocks_per_seq + j / block_size] * block_size + j % block_size.
 * Query head h reads KV head h / (n_heads / n_kv_heads) (grouped-query attention).
 * out[t][h] = softmax(scale * q[t][h] . K) V, an online softmax over the blocks in key order, with
 * each key and value head row first converted to f32 as el_dequantize_row converts it.
 * With sinks (gpt-oss), head h's softmax has one more logit, sinks[h], whose value row is zero: it
 * only adds exp(sinks[h] - max) to the normaliser (ggml's attention sinks); NULL: none.
 * Work items are (token, head) pairs t * n_heads + h in [item_begin, item_end), for threading.
 * head_dim <= EL_MAX_HEAD_DIM. */
#define EL_MAX_HEAD_DIM 512
void el_paged_attention(float *out /* [n_tokens][n_heads][head_dim] */,
                        const float *q /* [n_tokens][n_heads][head_dim] */,
                        const void *k_cache /* [num_blocks][block_size] rows of k_type */,
                        const void *v_cache /* [num_blocks][block_size] rows of v_type */, int32_t k_type,
                        int32_t v_type, const int32_t *block_tables /* [n_seqs][max_blocks_per_seq] */,
                        const int32_t *token_seq /* [n_tokens] */, const int32_t *context_lens /* [n_tokens] */,
                        int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, int64_t block_size,
                        int64_t max_blocks_per_seq, float scale, int32_t window,
                        const float *sinks /* [n_heads] or NULL */, int64_t item_begin, int64_t item_end);

/* ---- Recurrent layers ------------------------------------------------------------------------ */

/* LFM2's short convolution of one sequence's n_tokens consecutive tokens (the reference only).
 * bcx holds each token's in_proj output: b, c and x, d floats each. With bx = b * x and the window
 * of token t the rows t .. t + l_cache - 1 of [state; bx] (state: the l_cache - 1 inputs before
 * the first token, zeros when reset != 0), y[t][ch] = c[t][ch] * sum_k window[k][ch] * w[ch][k],
 * summed in k order from 0.0f; state then holds the last l_cache - 1 rows of [state; bx]. Chunks
 * give bit for bit what single tokens give. l_cache >= 2. */
void el_short_conv(const float *bcx /* [n_tokens][3][d] */, const float *w /* [d][l_cache] */,
                   float *state /* [l_cache - 1][d] */, int32_t reset, int64_t n_tokens, int64_t d,
                   int64_t l_cache, float *y /* [n_tokens][d] */);

/* Mamba-2 (Granite 4's recurrent layers; csrc/ssm_scan.c, the reference only), one sequence's
 * n_tokens consecutive tokens. Each gives for a chunk bit for bit what its tokens one by one give.
 * el_ssm_conv: xbc's rows (stride floats apart, the first d used) through the causal depthwise
 * convolution: the window of token t is the rows t .. t + d_conv - 1 of [state; xbc] (state: the
 * d_conv - 1 inputs before the first token, zeros when reset != 0), summed in k order from 0.0f,
 * plus bias (if not NULL), then y = SiLU(sum); state then holds the last d_conv - 1 inputs. */
void el_ssm_conv(const float *xbc /* [n_tokens] rows of stride */, int64_t stride,
                 const float *w /* [d][d_conv] */, const float *bias /* [d] or NULL */,
                 float *state /* [d_conv - 1][d] */, int32_t reset, int64_t n_tokens, int64_t d,
                 int64_t d_conv, float *y /* [n_tokens][d] */);
/* el_ssm_scan: per token t and head h, dt = softplus(dt[t][h] + dt_bias[h]), dA = exp(dt * a[h]);
 * per channel i of the head and state element k (B, C of the head's group h / (n_head / n_group)):
 * s = s * dA + B[k] * (x[i] * dt); y[t][i] = sum_k s * C[k] (from 0.0f in k order). The state is
 * zeroed first when reset != 0 and left at the last token. */
void el_ssm_scan(float *state /* [n_head][head_dim][d_state] */, int32_t reset,
                 const float *x /* [n_tokens] rows of x_stride: [n_head][head_dim] */, int64_t x_stride,
                 const float *dt /* [n_tokens] rows of dt_stride: [n_head] */, int64_t dt_stride,
                 const float *dt_bias /* [n_head] */, const float *a /* [n_head] */,
                 const float *b /* [n_tokens] rows of bc_stride: [n_group][d_state] */,
                 const float *c /* as b */, int64_t bc_stride, int64_t n_tokens, int64_t n_head,
                 int64_t head_dim, int64_t d_state, int64_t n_group,
                 float *y /* [n_tokens][n_head * head_dim] */);
/* el_ssm_gate_norm, in place on y: y = SiLU(z) * (y + x * d_skip[head]), then each group of
 * n_head * head_dim / n_group channels RMS-normed (el_rms_norm) with its part of norm. */
void el_ssm_gate_norm(float *y /* [n_tokens][n_head * head_dim] */,
                      const float *x /* [n_tokens] rows of x_stride */, int64_t x_stride,
                      const float *z /* [n_tokens] rows of z_stride */, int64_t z_stride,
                      const float *d_skip /* [n_head] */, const float *norm /* [n_head * head_dim] */,
                      int64_t n_tokens, int64_t n_head, int64_t head_dim, int64_t n_group, float eps);
/* Qwen3.5's gated delta-net core over one sequence's n_tokens consecutive tokens (the reference
 * only; csrc/delta_net.c states the arithmetic, llama.cpp's), in two steps. qkv holds each
 * token's fused projection, conv_dim = (2 n_k_heads + n_v_heads) head_dim floats: q heads, k heads,
 * v heads. el_delta_net_conv: for each token, the causal depthwise convolution of the rows
 * t .. t + d_conv - 1 of [conv_state; qkv] with conv_w, SiLU, each q and k head L2-normalised (eps),
 * into x; conv_state then holds the last d_conv - 1 rows of [conv_state; qkv] (zeroed first when
 * reset != 0). el_delta_net_rule: for value heads [h_begin, h_end) (head h reading q/k head
 * h % n_k_heads of x), token by token, the gated delta rule on the head's state, decay
 * expf(softplus(alpha + dt_bias) * a) and rate sigmoid(beta), out = state^T q / sqrtf(head_dim)
 * (those heads' states zeroed first when reset != 0; delta is scratch). Ranges of heads are
 * independent. Chunks give bit for bit what single tokens give. d_conv >= 2. */
void el_delta_net_conv(const float *qkv /* [n_tokens][conv_dim] */, const float *conv_w /* [conv_dim][d_conv] */,
                       float *conv_state /* [d_conv - 1][conv_dim] */, int32_t reset, int64_t n_tokens,
                       int64_t n_k_heads, int64_t n_v_heads, int64_t head_dim, int64_t d_conv, float eps,
                       float *x /* [n_tokens][conv_dim] */);
void el_delta_net_rule(const float *x /* [n_tokens][conv_dim] */, const float *alpha /* [n_tokens][n_v_heads] */,
                       const float *beta /* [n_tokens][n_v_heads] */, const float *dt_bias /* [n_v_heads] */,
                       const float *a /* [n_v_heads] */, float *ssm_state /* [n_v_heads][head_dim][head_dim] */,
                       int32_t reset, int64_t n_tokens, int64_t n_k_heads, int64_t n_v_heads, int64_t head_dim,
                       int64_t h_begin, int64_t h_end, float *delta /* [head_dim] */,
                       float *out /* [n_tokens][n_v_heads][head_dim] */);

#ifdef __cplusplus
}
#endif

#endif /* EDGE_KERNELS_H */

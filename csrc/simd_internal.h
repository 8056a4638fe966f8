/*
 * simd_internal.h: the contract between the public entry points (quants.c, ops.c) and the SIMD
 * variants of their kernels (quants_avx2.c, quants_k_avx2.c, ops_avx2.c, quants_neon.c), which simd_dispatch.c
 * picks from at run time. Not part of the Rust boundary.
 *
 * A variant computes what its scalar reference computes. The quantized dot products, the matrix
 * products and the quantizers reproduce the reference bit for bit (integer sums are exact, and the
 * float operations on them are the reference's, in its order, one lane per output); the row
 * operations that use vector float sums or exp stay within the budgets tests/kernels_simd.rs names.
 */
#ifndef EL_SIMD_INTERNAL_H
#define EL_SIMD_INTERNAL_H

#include <stdint.h>

#include "edge_kernels.h"

/* One layer's K or V cache as attention reads it (edge_kernels.h, "Paged KV cache"): rows of a
 * type whose element e lies in block e >> elems_log2 (blocks of 1 or 32 elements), block_bytes
 * bytes each, from base. */
typedef struct {
    const uint8_t *base;
    int32_t type;
    int32_t elems_log2;
    int64_t block_bytes;
} el_kv_rows;

/* ops.c: dst[0 .. n) = elements [e, e + n) of rows, as el_dequantize_row converts them (e and n
 * multiples of the block size). */
void el_kv_rows_to_f32(const el_kv_rows *rows, int64_t e, float *dst, int64_t n);

/* Kernels of one tensor type, over nb whole blocks (elements, for the float types). */
typedef void (*el_simd_quantize_fn)(const float *x /* [nb * block_size] */, void *y /* [nb] blocks */,
                                    int64_t nb);
typedef float (*el_simd_dot_fn)(const void *w /* [nb] blocks */, const void *a /* [nb] vec_dot blocks */,
                                int64_t nb);
/* out[r * out_stride + o] = dot(w row o, a row r) for r in [0, n_rows), o in [o_begin, o_end);
 * every element bit-identical to the type's el_simd_dot_fn on the same two rows. */
typedef void (*el_simd_matmul_fn)(const void *w, int64_t w_row_bytes, const void *a, int64_t a_row_bytes,
                                  float *out, int64_t out_stride, int64_t nb, int64_t n_rows,
                                  int64_t o_begin, int64_t o_end);

/* What a variant offers for a type; a NULL member (or a NULL table) means the scalar reference. */
typedef struct {
    el_simd_quantize_fn quantize; /* the type as an activation (or weight) quantizer */
    el_simd_dot_fn dot;           /* a row of the type against a row of its vec_dot type */
    el_simd_matmul_fn matmul;
} el_simd_quant_kernels;

/* A K-quant super-block's scales, decoded (quants_k.c): with u[e] the unsigned quants as stored,
 *     x[e] = d * scale[e / sub] * (u[e] - offset) - dmin * min[e / sub]. */
typedef struct {
    float d, dmin;
    int sub;                /* elements per sub-block: 16 or 32 */
    int offset;             /* 4 for q3_K, 32 for q6_K, 0 for the types with mins */
    int16_t scale[256 / 16]; /* 256 / sub of them are used */
    int16_t min[256 / 16];   /* all 0 for the symmetric types */
} el_k_scales;

/* quants_k.c: super-block `block` of K-quant `type` decoded into *s and u[256], as the reference
 * dot product reads it; 0 for a type that is not a K-quant. */
int el_k_decode(int32_t type, const void *block, el_k_scales *s, int8_t u[256]);

/* The kernels of `type` under the current ISA, or NULL where the scalar reference runs. */
const el_simd_quant_kernels *el_simd_quant(int32_t type);

#if defined(__x86_64__)
/* quants_avx2.c: the 32-element types, the float types and the activation quantizers;
 * quants_k_avx2.c: the K-quants. NULL for a type without an AVX2 kernel. */
const el_simd_quant_kernels *el_avx2_quant(int32_t type);
const el_simd_quant_kernels *el_avx2_quant_k(int32_t type);
/* quants_iq_avx2.c: the IQ types. NULL for a type without an AVX2 kernel. */
const el_simd_quant_kernels *el_avx2_quant_iq(int32_t type);

/* quants_avx2.c: el_matmul_x8 (Q4_1 or Q8_0) over column groups [g_begin, g_end) of nb blocks. */
void el_matmul_x8_avx2(int32_t type, const void *w8, const void *a, int64_t a_row_bytes, float *out,
                       int64_t out_stride, int64_t nb, int64_t n_rows, int64_t g_begin, int64_t g_end);
/* quants_k_x8_avx2.c: el_matmul_x8 for Q4_K, Q5_K or Q6_K over column groups [g_begin, g_end) of nb
 * super-blocks. */
void el_matmul_x8_k_avx2(int32_t type, const void *w8, const void *a, int64_t a_row_bytes, float *out,
                         int64_t out_stride, int64_t nb, int64_t n_rows, int64_t g_begin, int64_t g_end);

/* quants_x8_vnni.c: el_matmul_x8 (every type with x8) with AVX-512 VNNI over column groups
 * [g_begin, g_end) of nb blocks. */
void el_matmul_x8_vnni(int32_t type, const void *w8, const void *a, int64_t a_row_bytes, float *out,
                       int64_t out_stride, int64_t nb, int64_t n_rows, int64_t g_begin, int64_t g_end);

/* ops_avx2.c: the row operations, same arguments as their public entry points. */
void el_rms_norm_avx2(const float *x, const float *w, float *y, int64_t n_rows, int64_t n, float eps);
void el_rope_avx2(float *x, const int32_t *pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                  int64_t rope_dim, float freq_base, float freq_scale, int32_t neox);
void el_swiglu_avx2(const float *gate, const float *up, float *y, int64_t n);
/* quantize_q8_avx2.c: blocks 0 .. nb / 8 * 8 - 1 of Q8_0 / Q8_1, as their quantizers. */
void el_quantize_q8_0_by8_avx2(const float *x, void *y, int64_t nb);
void el_quantize_q8_1_by8_avx2(const float *x, void *y, int64_t nb);
/* expf_avx2.c: el_expf's variant, same arguments. */
void el_expf_avx2(const float *x, float *y, int64_t n);
/* rope_ext_avx2.c: el_rope_ext's rotation of one token's n_heads heads by its cos/sin pairs
 * (cache[2i], cache[2i + 1] for pair i, computed by rope_ext.c). */
void el_rope_ext_rotate_avx2(float *x, int64_t n_heads, int64_t head_dim, int64_t rope_dim, int32_t neox,
                             const float *cache);
void el_kv_write_f16_avx2(const float *k, const float *v, uint16_t *k_cache, uint16_t *v_cache,
                          const int64_t *slot_mapping, int64_t n_tokens, int64_t kv_dim);
/* ssm_scan_avx2.c: el_ssm_scan's update of one head's first n_channels (a multiple of 8) channels
 * for one token: state [n_channels][d_state], x, y [n_channels], b and c the group's [d_state]. */
void el_ssm_scan_channels_avx2(float *state, const float *x, const float *b, const float *c, float dt_soft_plus,
                               float dA, int64_t n_channels, int64_t d_state, float *y);
void el_paged_attention_avx2(float *out, const float *q, const el_kv_rows *k_cache, const el_kv_rows *v_cache,
                             const int32_t *block_tables, const int32_t *token_seq,
                             const int32_t *context_lens, int64_t n_heads, int64_t n_kv_heads,
                             int64_t head_dim, int64_t block_size, int64_t max_blocks_per_seq, float scale,
                             int32_t window, const float *sinks, int64_t item_begin, int64_t item_end);
#endif

#if defined(__aarch64__)
/* quants_neon.c: the 32-element types' dot products (NULL for a type without a NEON kernel) and
 * el_matmul_x8 (Q4_1, Q8_0, Q4_K, Q5_K or Q6_K) over column groups [g_begin, g_end) of nb blocks. */
const el_simd_quant_kernels *el_neon_quant(int32_t type);
/* quants_iq_neon.c: the IQ types' dot products (NULL for a type without a NEON kernel). */
const el_simd_quant_kernels *el_neon_quant_iq(int32_t type);
void el_matmul_x8_neon(int32_t type, const void *w8, const void *a, int64_t a_row_bytes, float *out,
                       int64_t out_stride, int64_t nb, int64_t n_rows, int64_t g_begin, int64_t g_end);
/* ssm_scan_neon.c: el_ssm_scan_channels_avx2's NEON form (n_channels a multiple of 4). */
void el_ssm_scan_channels_neon(float *state, const float *x, const float *b, const float *c, float dt_soft_plus,
                               float dA, int64_t n_channels, int64_t d_state, float *y);
#endif

/* ops.c's RoPE reference, for a variant's out-of-range fallback. */
void el_rope_ref(float *x, const int32_t *pos, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                 int64_t rope_dim, float freq_base, float freq_scale, int32_t neox);

/* 1 when the row operations should take their AVX2 variants (EL_ISA_AVX512VNNI runs them too). */
static inline int el_use_avx2(void) {
    const int32_t isa = el_isa_get();
    return isa == EL_ISA_AVX2 || isa == EL_ISA_AVX512VNNI;
}

#endif /* EL_SIMD_INTERNAL_H */

/*
 * el_types.h: the tensor types and their block geometry, written down once for every part of
 * edge-llm:
 *   - the C kernels, through edge_kernels.h (which includes this file) and el_blocks.h (whose
 *     block structs are checked against the sizes here);
 *   - the CUDA kernels, through csrc/cuda/el_cuda_common.cuh (src/cuda/nvrtc.rs splices this file
 *     into the NVRTC programs by its include name there, "../el_types.h");
 *   - Rust, through the bindgen constants in src/kernels/bindings.rs, from which
 *     src/kernels/tensor_type.rs takes TensorType's ids and block sizes (tests/tensor_types.rs
 *     checks every type against this file's text and against the C kernels' own tables).
 *
 * Type ids are the ggml/GGUF numbering (ggml.h's enum ggml_type), so a GGUF tensor's type id
 * passes straight through. Block sizes are llama.cpp's (ggml-common.h): EL_<T>_ELEMS elements per
 * block, stored in EL_<T>_BYTES bytes (the float types: one element per "block").
 *
 * Plain C99 with no includes, so NVRTC (which has no system headers) compiles it as it is.
 */
#ifndef EL_TYPES_H
#define EL_TYPES_H

/* Tensor types (ggml numbering). */
enum el_type {
    EL_TYPE_F32 = 0,
    EL_TYPE_F16 = 1,
    EL_TYPE_Q4_0 = 2,
    EL_TYPE_Q4_1 = 3,
    EL_TYPE_Q5_0 = 6,
    EL_TYPE_Q5_1 = 7,
    EL_TYPE_Q8_0 = 8,
    EL_TYPE_Q8_1 = 9,
    EL_TYPE_Q2_K = 10,
    EL_TYPE_Q3_K = 11,
    EL_TYPE_Q4_K = 12,
    EL_TYPE_Q5_K = 13,
    EL_TYPE_Q6_K = 14,
    EL_TYPE_Q8_K = 15,
    EL_TYPE_IQ2_XXS = 16,
    EL_TYPE_IQ2_XS = 17,
    EL_TYPE_IQ3_XXS = 18,
    EL_TYPE_IQ1_S = 19,
    EL_TYPE_IQ4_NL = 20,
    EL_TYPE_IQ3_S = 21,
    EL_TYPE_IQ2_S = 22,
    EL_TYPE_IQ4_XS = 23,
    EL_TYPE_IQ1_M = 29,
    EL_TYPE_BF16 = 30,
    EL_TYPE_MXFP4 = 39,
};

#define EL_QK 32    /* elements per block of the 32-element types */
#define EL_QK_K 256 /* elements per K-quant (and 256-element IQ) super-block */

/* ---- Elements and bytes per block, type by type ------------------------------------------- */

#define EL_F32_ELEMS 1
#define EL_F32_BYTES 4
#define EL_F16_ELEMS 1
#define EL_F16_BYTES 2
#define EL_BF16_ELEMS 1
#define EL_BF16_BYTES 2

#define EL_Q4_0_ELEMS EL_QK
#define EL_Q4_0_BYTES 18 /* d f16 @0, qs[16] @2 */
#define EL_Q4_1_ELEMS EL_QK
#define EL_Q4_1_BYTES 20 /* d @0, m @2, qs[16] @4 */
#define EL_Q5_0_ELEMS EL_QK
#define EL_Q5_0_BYTES 22 /* d @0, qh[4] @2, qs[16] @6 */
#define EL_Q5_1_ELEMS EL_QK
#define EL_Q5_1_BYTES 24 /* d @0, m @2, qh[4] @4, qs[16] @8 */
#define EL_Q8_0_ELEMS EL_QK
#define EL_Q8_0_BYTES 34 /* d @0, qs[32] @2 */
#define EL_Q8_1_ELEMS EL_QK
#define EL_Q8_1_BYTES 36 /* d @0, s @2, qs[32] @4 */

#define EL_Q2_K_ELEMS EL_QK_K
#define EL_Q2_K_BYTES 84  /* scales[16] @0, qs[64] @16, d @80, dmin @82 */
#define EL_Q3_K_ELEMS EL_QK_K
#define EL_Q3_K_BYTES 110 /* hmask[32] @0, qs[64] @32, scales[12] @96, d @108 */
#define EL_Q4_K_ELEMS EL_QK_K
#define EL_Q4_K_BYTES 144 /* d @0, dmin @2, scales[12] @4, qs[128] @16 */
#define EL_Q5_K_ELEMS EL_QK_K
#define EL_Q5_K_BYTES 176 /* d @0, dmin @2, scales[12] @4, qh[32] @16, qs[128] @48 */
#define EL_Q6_K_ELEMS EL_QK_K
#define EL_Q6_K_BYTES 210 /* ql[128] @0, qh[64] @128, scales[16] int8 @192, d @208 */
#define EL_Q8_K_ELEMS EL_QK_K
#define EL_Q8_K_BYTES 292 /* d f32 @0, qs[256] @4, bsums[16] int16 @260 */

#define EL_IQ4_NL_ELEMS EL_QK
#define EL_IQ4_NL_BYTES 18  /* d @0, qs[16] @2 (as q4_0) */
#define EL_IQ4_XS_ELEMS EL_QK_K
#define EL_IQ4_XS_BYTES 136 /* d @0, scales_h u16 @2, scales_l[4] @4, qs[128] @8 */
#define EL_IQ2_XXS_ELEMS EL_QK_K
#define EL_IQ2_XXS_BYTES 66 /* d @0, per sub-block: 4 grid indices @2 + 8s, signs and scale u32 @6 + 8s */
#define EL_IQ2_XS_ELEMS EL_QK_K
#define EL_IQ2_XS_BYTES 74  /* d @0, qs u16[32] @2 (9-bit index, 7-bit signs), scales[8] @66 */
#define EL_IQ2_S_ELEMS EL_QK_K
#define EL_IQ2_S_BYTES 82   /* d @0, qs[32] @2, signs[32] @34, qh[8] @66, scales[8] @74 */
#define EL_IQ3_XXS_ELEMS EL_QK_K
#define EL_IQ3_XXS_BYTES 98 /* d @0, qs[64] @2, per sub-block signs and scale u32 @66 + 4s */
#define EL_IQ3_S_ELEMS EL_QK_K
#define EL_IQ3_S_BYTES 110  /* d @0, qs[64] @2, qh[8] @66, signs[32] @74, scales[4] @106 */
#define EL_IQ1_S_ELEMS EL_QK_K
#define EL_IQ1_S_BYTES 50   /* d @0, qs[32] @2, qh u16[8] @34 */
#define EL_IQ1_M_ELEMS EL_QK_K
#define EL_IQ1_M_BYTES 56   /* qs[32] @0, qh[16] @32, scales u16[4] @48 (the f16 d in their top nibbles) */

#define EL_MXFP4_ELEMS EL_QK
#define EL_MXFP4_BYTES 17   /* e (E8M0 scale) @0, qs[16] @1 (E2M1 codes, as q4_0's nibbles) */

#endif /* EL_TYPES_H */

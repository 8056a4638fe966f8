/*
 * el_cuda_common.cuh: what the CUDA kernels share: sized integer types, exact half/bfloat16
 * conversions, the tensor types and block sizes (csrc/el_types.h, shared with the C kernels and
 * Rust; the block layouts are csrc/el_blocks.h's, bit-compatible with llama.cpp's ggml-common.h),
 * and warp reductions.
 *
 * The kernels include no CUDA header (not even cuda_fp16.h), so NVRTC compiles them at start-up
 * on any machine that has libnvrtc, with no include path (under nvcc, only <stdint.h>). They are compiled with --fmad=false,
 * the GPU's counterpart of the C kernels' -ffp-contract=off: every a * b + c rounds twice, as the
 * scalar references in csrc/ do, which keeps the quantizers byte-identical to them.
 *
 * Included by el_quants.cu and el_ops.cu; src/cuda/nvrtc.rs inlines it for NVRTC. The IQ types'
 * layouts and codebooks are in el_iq.cuh.
 */
#ifndef EL_CUDA_COMMON_CUH
#define EL_CUDA_COMMON_CUH

#ifdef __CUDACC_RTC__
/* NVRTC: no system headers, so the sized integers are spelled out (LP64 sizes). */
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#else
/* nvcc (build.rs): the host's own. */
#include <stdint.h>
#endif

/* Tensor types (enum el_type, ggml numbering) and block sizes (EL_QK, EL_QK_K, EL_<T>_BYTES with
 * each layout's byte offsets): the C kernels' own header, which src/cuda/nvrtc.rs embeds under
 * this relative name. */
#include "../el_types.h"

#define EL_WARP 32
#define EL_MAX_HEAD_DIM 512
#define EL_INF __int_as_float(0x7f800000) /* +infinity (no math.h) */

/* ---- Half and bfloat16 ------------------------------------------------------------------------
 * cvt.rn is IEEE round-to-nearest-even, as el_fp32_to_fp16 in csrc/el_internal.h; half -> float
 * is exact. */

#ifdef EL_CUDA_EMU
/* The CPU emulator (csrc/cuda/emu/): the C conversions of csrc/el_internal.h. */
__device__ __forceinline__ float el_h2f(uint16_t h) { return el_emu_h2f(h); }
__device__ __forceinline__ uint16_t el_f2h(float f) { return el_emu_f2h(f); }
#else
__device__ __forceinline__ float el_h2f(uint16_t h) {
    float f;
    asm("{ .reg .b16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ uint16_t el_f2h(float f) {
    uint16_t h;
    asm("{ .reg .b16 t; cvt.rn.f16.f32 t, %1; mov.b16 %0, t; }" : "=h"(h) : "f"(f));
    return h;
}
#endif

__device__ __forceinline__ float el_bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

/* float -> bfloat16, round to nearest even; NaN stays a quiet NaN (el_fp32_to_bf16). */
__device__ __forceinline__ uint16_t el_f2bf(float f) {
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64);
    return (uint16_t)((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

/* Little-endian loads from byte pointers that are only 2-byte aligned (GGUF blocks are). */
__device__ __forceinline__ uint16_t el_ld16(const uint8_t *p) { return *(const uint16_t *)p; }
__device__ __forceinline__ float el_ldh(const uint8_t *p) { return el_h2f(el_ld16(p)); }
__device__ __forceinline__ int32_t el_ld32_a2(const uint8_t *p) {
    return (int32_t)((uint32_t)el_ld16(p) | ((uint32_t)el_ld16(p + 2) << 16));
}

/* Four bytes packed little-endian into one int, the operand order __dp4a reads. */
__device__ __forceinline__ int32_t el_pack4(int a, int b, int c, int d) {
    return (int32_t)((uint32_t)(a & 0xff) | ((uint32_t)(b & 0xff) << 8) | ((uint32_t)(c & 0xff) << 16) |
                     ((uint32_t)(d & 0xff) << 24));
}

/* ---- Warp and block reductions ----------------------------------------------------------------- */

__device__ __forceinline__ float el_warp_sum(float v) {
#pragma unroll
    for (int o = EL_WARP / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ double el_warp_sum_d(double v) {
#pragma unroll
    for (int o = EL_WARP / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float el_warp_max(float v) {
#pragma unroll
    for (int o = EL_WARP / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ int el_warp_sum_i(int v) {
#pragma unroll
    for (int o = EL_WARP / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* exp, tanh, sin and cos as float results of the double functions: within about half an ulp of
 * the exact value, so they agree with glibc's expf/tanhf/sinf/cosf (the C references' libm) far
 * more often than CUDA's float versions (2 ulp) would. */
__device__ __forceinline__ float el_expf(float x) { return (float)exp((double)x); }
__device__ __forceinline__ float el_tanhf(float x) { return (float)tanh((double)x); }
__device__ __forceinline__ float el_cosf(float x) { return (float)cos((double)x); }
__device__ __forceinline__ float el_sinf(float x) { return (float)sin((double)x); }

#endif /* EL_CUDA_COMMON_CUH */

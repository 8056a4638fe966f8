/*
 * el_cuda_emu.h: CUDA's device-side vocabulary for g++, so that the unchanged kernels in
 * csrc/cuda/ (*.cu) compile and run on the CPU (the emulator behind src/cuda/emu.rs, used by the
 * tests on machines without a GPU).
 *
 * - The qualifiers are macros: __global__, __device__ and __constant__ vanish, __shared__ is a function-local
 *   `static thread_local` (one block runs at a time on an OS thread, so a block's threads share it).
 * - Every CUDA thread of a block is a fiber (ucontext) with its own stack; threadIdx, blockIdx,
 *   blockDim and gridDim read the running fiber's values.
 * - __syncthreads and __syncwarp are barriers that count only threads still running (some kernels
 *   let whole warps return while others go on).
 * - __shfl_sync/__shfl_xor_sync go through a per-warp exchange array, double-buffered so one
 *   barrier per shuffle suffices; reading a lane that has returned is an error of the launch.
 * - __dp4a and __vsub4 are plain C with wrapping arithmetic; half conversions are the C ones of
 *   csrc/el_internal.h (EL_CUDA_EMU selects them in el_cuda_common.cuh instead of inline PTX).
 *
 * Compiled with -ffp-contract=off (NVRTC's --fmad=false) and -fno-strict-aliasing (the kernels
 * read block fields through casts). The runtime (el_cuda_emu.cpp) schedules the fibers.
 */
#ifndef EL_CUDA_EMU_H
#define EL_CUDA_EMU_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../../el_internal.h"

#define EL_CUDA_EMU 1

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static thread_local
#define __constant__

struct el_dim3 {
    unsigned int x, y, z;
};

/* What the running fiber sees; the scheduler sets it before every switch into a fiber. */
struct el_emu_view {
    el_dim3 thread_idx, block_idx, block_dim, grid_dim;
};
extern thread_local el_emu_view el_emu_now;

#define threadIdx (el_emu_now.thread_idx)
#define blockIdx (el_emu_now.block_idx)
#define blockDim (el_emu_now.block_dim)
#define gridDim (el_emu_now.grid_dim)

/* Barriers and the warp exchange, in el_cuda_emu.cpp. */
void el_emu_syncthreads(void);
void el_emu_syncwarp(void);
/* Publishes this lane's 8 bytes, waits for the warp, returns lane `src`'s. */
uint64_t el_emu_exchange(uint64_t mine, int src);

inline void __syncthreads(void) { el_emu_syncthreads(); }
inline void __syncwarp(unsigned int mask = 0xffffffffu) {
    (void)mask;
    el_emu_syncwarp();
}

template <typename T>
inline T el_emu_shfl(T v, int src) {
    static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof(T));
    bits = el_emu_exchange(bits, src);
    T r;
    memcpy(&r, &bits, sizeof(T));
    return r;
}

template <typename T>
inline T __shfl_sync(unsigned int mask, T v, int src) {
    (void)mask;
    return el_emu_shfl(v, src & 31);
}

template <typename T>
inline T __shfl_xor_sync(unsigned int mask, T v, int lane_mask) {
    (void)mask;
    return el_emu_shfl(v, (int)((el_emu_now.thread_idx.x % 32) ^ (unsigned)lane_mask) & 31);
}

/* Bit casts. */
inline float __int_as_float(int i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
inline float __uint_as_float(unsigned int u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline unsigned int __float_as_uint(float f) {
    unsigned int u;
    memcpy(&u, &f, 4);
    return u;
}

/* c + the sum of the four products of a's and b's signed bytes, wrapping as the GPU does. */
inline int __dp4a(int a, int b, int c) {
    uint32_t acc = (uint32_t)c;
    for (int i = 0; i < 4; i++) {
        const int32_t x = (int8_t)((uint32_t)a >> (8 * i));
        const int32_t y = (int8_t)((uint32_t)b >> (8 * i));
        acc += (uint32_t)(x * y);
    }
    return (int)acc;
}

/* Byte-wise a - b, each byte modulo 256. */
inline unsigned int __vsub4(unsigned int a, unsigned int b) {
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) {
        const uint32_t x = (a >> (8 * i)) & 0xffu, y = (b >> (8 * i)) & 0xffu;
        r |= ((x - y) & 0xffu) << (8 * i);
    }
    return r;
}

inline float el_emu_h2f(uint16_t h) { return el_fp16_to_fp32(h); }
inline uint16_t el_emu_f2h(float f) { return el_fp32_to_fp16(f); }

#endif /* EL_CUDA_EMU_H */

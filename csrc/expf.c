/*
 * expf.c: el_expf, libm's expf over an array with glibc's exact results (expf_glibc.h), through
 * the AVX2 form (expf_avx2.c) once AVX2 is chosen and the scalar form otherwise. SwiGLU's AVX2
 * variant uses the same eight-lane function; this entry point is how tests/kernels_simd.rs checks
 * it against the libm the process runs on.
 */
#include "edge_kernels.h"
#include "expf_glibc.h"
#include "simd_internal.h"

void el_expf(const float *x, float *y, int64_t n) {
#if defined(__x86_64__)
    if (el_use_avx2()) {
        el_expf_avx2(x, y, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) y[i] = el_expf_glibc(x[i]);
}

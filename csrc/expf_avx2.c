/*
 * expf_avx2.c: el_expf's AVX2 variant, eight lanes of expf_avx2.h at a time (a tail of fewer
 * than eight on a zero-padded copy). Compiled for AVX2 with a target pragma; expf.c calls it
 * only once AVX2 is chosen.
 */
#if defined(__x86_64__)

#include <immintrin.h>
#include <string.h>

#include "avx2_target_begin.h"

#include "simd_avx2.h"
#include "expf_avx2.h"
#include "simd_internal.h"

void el_expf_avx2(const float *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, el_expf8_avx2(_mm256_loadu_ps(x + i)));
    if (i < n) {
        float t[8] = {0};
        const size_t bytes = (size_t)(n - i) * sizeof(float);
        memcpy(t, x + i, bytes);
        _mm256_storeu_ps(t, el_expf8_avx2(_mm256_loadu_ps(t)));
        memcpy(y + i, t, bytes);
    }
}

#include "avx2_target_end.h"

#endif /* __x86_64__ */

/*
 * rope_ext_avx2.c: the AVX2 rotation step of el_rope_ext (rope_ext.c): one token's heads rotated
 * by the cos/sin pairs rope_ext.c computed (with libm, as the reference), eight lanes at a time.
 * Bit-identical to the reference's loop: each lane computes x0 c - x1 s and x0 s + x1 c with
 * separate multiplies and one add or subtract (addsub's odd lanes add x1 c + x0 s: the same sum).
 * Compiled for AVX2 with a target pragma; rope_ext.c calls it only once AVX2 is chosen.
 */
#if defined(__x86_64__)

#include <immintrin.h>
#include <string.h>

#include "avx2_target_begin.h"

#include "edge_kernels.h"
#include "simd_avx2.h"
#include "simd_internal.h"

/* (x0, x1) -> (x0 c - x1 s, x0 s + x1 c), eight pairs: halves layout (neox). */
EL_AI void rotate_halves(float *x0p, float *x1p, const float *cs, const float *sn) {
    const __m256 x0 = _mm256_loadu_ps(x0p), x1 = _mm256_loadu_ps(x1p);
    const __m256 c = _mm256_loadu_ps(cs), s = _mm256_loadu_ps(sn);
    _mm256_storeu_ps(x0p, _mm256_sub_ps(_mm256_mul_ps(x0, c), _mm256_mul_ps(x1, s)));
    _mm256_storeu_ps(x1p, _mm256_add_ps(_mm256_mul_ps(x0, s), _mm256_mul_ps(x1, c)));
}

/* Four adjacent pairs (x[2i], x[2i + 1]), cos and sin given twice per pair. */
EL_AI void rotate_pairs(float *x, const float *cs, const float *sn) {
    const __m256 v = _mm256_loadu_ps(x);
    const __m256 a = _mm256_mul_ps(v, _mm256_loadu_ps(cs));
    const __m256 b = _mm256_mul_ps(_mm256_permute_ps(v, 0xB1), _mm256_loadu_ps(sn));
    _mm256_storeu_ps(x, _mm256_addsub_ps(a, b));
}

void el_rope_ext_rotate_avx2(float *x, int64_t n_heads, int64_t head_dim, int64_t rope_dim, int32_t neox,
                             const float *cache) {
    const int64_t half = rope_dim / 2;
    const int64_t n = neox ? half : rope_dim; /* rotated lanes per head */
    /* neox: cos[i], sin[i]; adjacent pairs: each twice. Zero padded so tails run on copies. */
    float cs[EL_MAX_HEAD_DIM + 8], sn[EL_MAX_HEAD_DIM + 8];
    for (int64_t i = 0; i < half; i++) {
        const float c = cache[2 * i], s = cache[2 * i + 1];
        if (neox) {
            cs[i] = c;
            sn[i] = s;
        } else {
            cs[2 * i] = cs[2 * i + 1] = c;
            sn[2 * i] = sn[2 * i + 1] = s;
        }
    }
    memset(cs + n, 0, 8 * sizeof(float));
    memset(sn + n, 0, 8 * sizeof(float));
    for (int64_t h = 0; h < n_heads; h++) {
        float *xh = x + h * head_dim;
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
            if (neox) rotate_halves(xh + i, xh + i + half, cs + i, sn + i);
            else rotate_pairs(xh + i, cs + i, sn + i);
        }
        if (i < n) {
            float t0[8] = {0}, t1[8] = {0};
            const size_t bytes = (size_t)(n - i) * sizeof(float);
            memcpy(t0, xh + i, bytes);
            if (neox) {
                memcpy(t1, xh + i + half, bytes);
                rotate_halves(t0, t1, cs + i, sn + i);
                memcpy(xh + i + half, t1, bytes);
            } else {
                rotate_pairs(t0, cs + i, sn + i);
            }
            memcpy(xh + i, t0, bytes);
        }
    }
}

#include "avx2_target_end.h"

#endif /* __x86_64__ */

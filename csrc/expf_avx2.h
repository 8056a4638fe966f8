/*
 * expf_avx2.h: eight expf at once, bit for bit glibc's __expf_fma (expf_glibc.h says how and
 * why). Include only from a file compiled for AVX2 + FMA (after its target pragma), after
 * simd_avx2.h (EL_AI). Used by SwiGLU (ops_avx2.c) and el_expf (expf_avx2.c).
 *
 * Each half of eight floats runs the main path in four double lanes, the same operations in the
 * same order as the scalar form; the table is read with a gather. Lanes with |x| >= 88 or NaN
 * (rare: SwiGLU's gates are small) are then redone one by one with the scalar special cases.
 */
#ifndef EL_EXPF_AVX2_H
#define EL_EXPF_AVX2_H

#include <immintrin.h>

#include "expf_glibc.h"

/* The main path on four lanes. */
EL_AI __m128 el_expf4_main_avx2(const __m128 x) {
    const __m256d xd = _mm256_cvtps_pd(x);
    const __m256d invln2n = _mm256_set1_pd(EL_EXPF_INVLN2N), shift = _mm256_set1_pd(EL_EXPF_SHIFT);
    const __m256d kd0 = _mm256_fmadd_pd(invln2n, xd, shift);
    const __m256i ki = _mm256_castpd_si256(kd0);
    const __m256d kd = _mm256_sub_pd(kd0, shift);
    const __m256d r = _mm256_fmsub_pd(invln2n, xd, kd);
    const __m256i idx = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
    const __m256i tab = _mm256_i64gather_epi64((const long long *)el_expf_tab, idx, 8);
    const __m256d s = _mm256_castsi256_pd(_mm256_add_epi64(tab, _mm256_slli_epi64(ki, 47)));
    const __m256d z = _mm256_fmadd_pd(_mm256_set1_pd(EL_EXPF_C0), r, _mm256_set1_pd(EL_EXPF_C1));
    const __m256d r2 = _mm256_mul_pd(r, r);
    const __m256d y1 = _mm256_fmadd_pd(_mm256_set1_pd(EL_EXPF_C2), r, _mm256_set1_pd(1.0));
    const __m256d y = _mm256_fmadd_pd(z, r2, y1);
    return _mm256_cvtpd_ps(_mm256_mul_pd(y, s));
}

/* expf of each lane. */
EL_AI __m256 el_expf8_avx2(const __m256 x) {
    const __m128 lo = el_expf4_main_avx2(_mm256_castps256_ps128(x));
    const __m128 hi = el_expf4_main_avx2(_mm256_extractf128_ps(x, 1));
    __m256 y = _mm256_set_m128(hi, lo);
    const __m256i abs = _mm256_and_si256(_mm256_castps_si256(x), _mm256_set1_epi32(0x7fffffff));
    const __m256i special = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32((int)EL_EXPF_SPECIAL_ABS - 1));
    if (__builtin_expect(!_mm256_testz_si256(special, special), 0)) {
        float xs[8], ys[8];
        _mm256_storeu_ps(xs, x);
        _mm256_storeu_ps(ys, y);
        for (int k = 0; k < 8; k++) {
            if ((el_expf_bits(xs[k]) & 0x7fffffffu) >= EL_EXPF_SPECIAL_ABS) ys[k] = el_expf_glibc_special(xs[k]);
        }
        y = _mm256_loadu_ps(ys);
    }
    return y;
}

#endif

/*
 * ssm_scan_avx2.c: the AVX2 form of Mamba-2's selective scan (el_ssm_scan in ssm_scan.c calls it
 * once AVX2 is chosen, for each head's channels in groups of eight; the reference loop runs the
 * rest). Bit-identical to the reference: each lane is one channel, with the reference's
 * operations in its order (s * dA, B * x_dt, their sum; the output's sum over the state from 0.0f
 * in state order, a multiply then an add, never fused). The state's rows of eight channels are
 * read and written through 8x8 transposes (the state is [channel][d_state]); a d_state not a
 * multiple of eight finishes each lane's sum in scalar code, in the same order. The reference's
 * chain of dependent adds per channel is what bounds it; eight channels a vector run eight chains
 * at once.
 */
#if defined(__x86_64__)

#include <immintrin.h>

#include "avx2_target_begin.h"

#include "el_internal.h"
#include "simd_internal.h"

/* r[i] <- column i of the 8x8 block whose row j is r[j]. */
static inline void transpose8(__m256 r[8]) {
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

void el_ssm_scan_channels_avx2(float *state, const float *x, const float *b, const float *c, float dt_soft_plus,
                               float dA, int64_t n_channels, int64_t d_state, float *y) {
    const __m256 vdA = _mm256_set1_ps(dA), vsp = _mm256_set1_ps(dt_soft_plus);
    const int64_t k8 = d_state & ~(int64_t)7;
    for (int64_t i = 0; i + 8 <= n_channels; i += 8) {
        float *s = state + i * d_state; /* rows i .. i + 7 */
        const __m256 x_dt = _mm256_mul_ps(_mm256_loadu_ps(x + i), vsp);
        __m256 sum = _mm256_setzero_ps();
        for (int64_t k = 0; k < k8; k += 8) {
            __m256 t[8];
            for (int r = 0; r < 8; r++) t[r] = _mm256_loadu_ps(s + r * d_state + k);
            transpose8(t); /* t[j]: element k + j of the eight channels */
            for (int j = 0; j < 8; j++) {
                const __m256 v = _mm256_add_ps(_mm256_mul_ps(t[j], vdA),
                                               _mm256_mul_ps(_mm256_set1_ps(b[k + j]), x_dt));
                sum = _mm256_add_ps(sum, _mm256_mul_ps(v, _mm256_set1_ps(c[k + j])));
                t[j] = v;
            }
            transpose8(t);
            for (int r = 0; r < 8; r++) _mm256_storeu_ps(s + r * d_state + k, t[r]);
        }
        float sums[8], xdt[8];
        _mm256_storeu_ps(sums, sum);
        _mm256_storeu_ps(xdt, x_dt);
        for (int r = 0; r < 8; r++) {
            float *sr = s + r * d_state;
            float acc = sums[r];
            for (int64_t k = k8; k < d_state; k++) {
                const float v = (sr[k] * dA) + (b[k] * xdt[r]);
                acc += v * c[k];
                sr[k] = v;
            }
            y[i + r] = acc;
        }
    }
}

#include "avx2_target_end.h"

#endif

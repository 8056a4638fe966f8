/*
 * quantize_q8_avx2.c: the Q8_0 and Q8_1 activation quantizers (the vec_dot types of the Q4/Q5/Q8
 * weights) eight blocks at a time, for quants_avx2.c's quantize_q8_0 and quantize_q8_1. One
 * block alone is a chain of scalar steps (the max's horizontal reduction, d = amax / 127,
 * id = 1 / d, two f16 conversions, the sum's reduction); here each of those runs once for eight
 * blocks, a block per lane. Byte-identical to the reference (tests/kernels_simd.rs): max is exact
 * whatever its order, the divisions are the reference's IEEE operations lane by lane, the sums
 * are of integers, and the f16 conversions are el_f32_to_f16_8 (el_fp32_to_fp16's bits).
 * Compiled for AVX2 with a target pragma; called only once AVX2 is chosen.
 */
#if defined(__x86_64__)

#include <immintrin.h>
#include <stddef.h>

#include "avx2_target_begin.h"

#include "el_blocks.h"
#include "simd_avx2.h"
#include "simd_internal.h"

_Static_assert(offsetof(el_block_q8_0, d) == 0 && offsetof(el_block_q8_1, d) == 0 &&
                   offsetof(el_block_q8_1, s) == 2, "the Q8 blocks' scales");

/* The eight lanes' maxima of the four-lane halves m[0..3] (transposed): lane j of the result is
 * max over m[j]'s lanes. */
EL_AI __m128 max4_transposed(__m128 m0, __m128 m1, __m128 m2, __m128 m3) {
    _MM_TRANSPOSE4_PS(m0, m1, m2, m3);
    return _mm_max_ps(_mm_max_ps(m0, m1), _mm_max_ps(m2, m3));
}

/* Lane j: the sum of the eight lanes of s[j]. */
EL_AI __m256i hsum8_epi32(const __m256i s[8]) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7]));
    /* a = blocks 0-3 of the low halves | blocks 0-3 of the high halves; b the same for 4-7 */
    const __m256i lo = _mm256_permute2x128_si256(a, b, 0x20), hi = _mm256_permute2x128_si256(a, b, 0x31);
    return _mm256_add_epi32(lo, hi);
}

/* Blocks 0..7 of x into the blocks at y (stride `bytes`, d at offset 0, the quants at `qs_off`,
 * s at offset 2 when `with_sum`). */
EL_AI void quantize8(const float *x, uint8_t *y, size_t bytes, size_t qs_off, int with_sum) {
    const __m256 abs_mask = _mm256_set1_ps(-0.0f);
    __m128 half[8];
    for (int j = 0; j < 8; j++) {
        const float *xb = x + 32 * j;
        __m256 amax = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) amax = _mm256_max_ps(amax, _mm256_andnot_ps(abs_mask, _mm256_loadu_ps(xb + 8 * k)));
        half[j] = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    }
    const __m256 amax = _mm256_set_m128(max4_transposed(half[4], half[5], half[6], half[7]),
                                        max4_transposed(half[0], half[1], half[2], half[3]));
    const __m256 d = _mm256_div_ps(amax, _mm256_set1_ps(127.0f));
    const __m256 nonzero = _mm256_cmp_ps(d, _mm256_setzero_ps(), _CMP_NEQ_UQ);
    const __m256 id = _mm256_and_ps(nonzero, _mm256_div_ps(_mm256_set1_ps(1.0f), d));
    uint16_t dh[8];
    _mm_storeu_si128((__m128i *)dh, el_f32_to_f16_8(d));
    float ids[8];
    _mm256_storeu_ps(ids, id);
    __m256i sums[8];
    for (int j = 0; j < 8; j++) {
        const float *xb = x + 32 * j;
        uint8_t *yb = y + j * bytes;
        const __m256 idv = _mm256_set1_ps(ids[j]);
        __m256i q[4];
        for (int k = 0; k < 4; k++) {
            q[k] = _mm256_cvttps_epi32(el_round_half_away(_mm256_mul_ps(_mm256_loadu_ps(xb + 8 * k), idv)));
        }
        _mm256_storeu_si256((__m256i *)(yb + qs_off), el_pack_i32_to_i8(q[0], q[1], q[2], q[3]));
        __builtin_memcpy(yb, &dh[j], 2);
        sums[j] = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    }
    if (with_sum) {
        uint16_t sh[8];
        _mm_storeu_si128((__m128i *)sh, el_f32_to_f16_8(_mm256_mul_ps(_mm256_cvtepi32_ps(hsum8_epi32(sums)), d)));
        for (int j = 0; j < 8; j++) __builtin_memcpy(y + j * bytes + 2, &sh[j], 2);
    }
}

void el_quantize_q8_0_by8_avx2(const float *x, void *vy, int64_t nb) {
    uint8_t *y = vy;
    for (int64_t b = 0; b + 8 <= nb; b += 8) {
        quantize8(x + 32 * b, y + b * sizeof(el_block_q8_0), sizeof(el_block_q8_0),
                  offsetof(el_block_q8_0, qs), 0);
    }
}

void el_quantize_q8_1_by8_avx2(const float *x, void *vy, int64_t nb) {
    uint8_t *y = vy;
    for (int64_t b = 0; b + 8 <= nb; b += 8) {
        quantize8(x + 32 * b, y + b * sizeof(el_block_q8_1), sizeof(el_block_q8_1),
                  offsetof(el_block_q8_1, qs), 1);
    }
}

#include "avx2_target_end.h"

#endif /* __x86_64__ */

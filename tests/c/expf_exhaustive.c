/*
 * expf_exhaustive.c: the vectorised expf (csrc/expf_avx2.h) and its scalar form (csrc/expf_glibc.h)
 * against the C library's expf on all 2^32 float inputs, bit for bit (NaN bits included). Too
 * slow for the test suite (about a minute on one core); run it by hand after touching the exp:
 *     gcc -O2 -mavx2 -mfma -ffp-contract=off -fno-math-errno -Icsrc tests/c/expf_exhaustive.c \
 *         -lm -o /tmp/expf_exhaustive && /tmp/expf_exhaustive
 * Exits 0 when every input agrees. With `--hard D` it instead prints (hex bits, one a line) the
 * inputs whose unrounded double result lies within D units of 2^-29 ulp of a float rounding
 * midpoint (normal results, |x| > 2^-12): the cases a formulation that differs from glibc's in
 * the last double bit gets wrong. tests/reference/expf_hard_cases.txt is `--hard 1024`.
 */
#include <gnu/libc-version.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "simd_avx2.h"
#include "expf_avx2.h"

static int hard_cases(int64_t window) {
    for (uint64_t u = 0; u < (1ull << 32); u++) {
        const uint32_t b = (uint32_t)u;
        float x;
        memcpy(&x, &b, 4);
        if ((b & 0x7fffffffu) >= EL_EXPF_SPECIAL_ABS || !(fabsf(x) > 0x1p-12f)) continue;
        /* el_expf_glibc_main without the last rounding */
        const double xd = (double)x;
        const double kd0 = fma(EL_EXPF_INVLN2N, xd, EL_EXPF_SHIFT);
        uint64_t ki;
        memcpy(&ki, &kd0, 8);
        const double kd = kd0 - EL_EXPF_SHIFT;
        const double r = fma(EL_EXPF_INVLN2N, xd, -kd);
        const uint64_t t = el_expf_tab[ki % 32] + (ki << 47);
        double s;
        memcpy(&s, &t, 8);
        const double z = fma(EL_EXPF_C0, r, EL_EXPF_C1);
        const double y = fma(z, r * r, fma(EL_EXPF_C2, r, 1.0)) * s;
        const float f = (float)y;
        if (!(f >= 0x1p-126f) || isinf(f)) continue;
        uint64_t yb;
        memcpy(&yb, &y, 8);
        const int64_t d = llabs((int64_t)(yb & ((1u << 29) - 1)) - (1 << 28));
        if (d <= window) printf("%08x\n", b);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--hard") == 0) return hard_cases(atoll(argv[2]));
    uint64_t bad_vector = 0, bad_scalar = 0;
    for (uint64_t u = 0; u < (1ull << 32); u += 8) {
        float x[8], yv[8];
        for (int k = 0; k < 8; k++) {
            const uint32_t b = (uint32_t)(u + k);
            memcpy(&x[k], &b, 4);
        }
        _mm256_storeu_ps(yv, el_expf8_avx2(_mm256_loadu_ps(x)));
        for (int k = 0; k < 8; k++) {
            const float want = expf(x[k]), ys = el_expf_glibc(x[k]);
            uint32_t w, v, s;
            memcpy(&w, &want, 4);
            memcpy(&v, &yv[k], 4);
            memcpy(&s, &ys, 4);
            if (v != w && bad_vector++ < 10) printf("vector: expf(%a) = %a, libm %a\n", x[k], yv[k], want);
            if (s != w && bad_scalar++ < 10) printf("scalar: expf(%a) = %a, libm %a\n", x[k], ys, want);
        }
    }
    printf("glibc %s, all 2^32 inputs: %llu vector and %llu scalar results differ from libm's expf\n",
           gnu_get_libc_version(), (unsigned long long)bad_vector, (unsigned long long)bad_scalar);
    return bad_vector || bad_scalar;
}

/*
 * expf_glibc.h: expf(x) exactly as glibc computes it on a CPU with FMA, as a scalar C function
 * (el_expf_glibc) the AVX2 form (expf_avx2.h) reproduces lane by lane. Included by expf.c and
 * expf_avx2.h; nothing else.
 *
 * glibc (2.27 onwards; checked against 2.36, Debian 12) implements expf in
 * sysdeps/ieee754/flt-32/e_expf.c (Szabolcs Nagy's algorithm from ARM's optimized-routines) and,
 * on x86_64, builds it twice: __expf_sse2 and __expf_fma, which the ifunc picks when the CPU has
 * FMA and AVX2, so on every machine our AVX2 kernels run on, expf is __expf_fma. In double:
 *     kd = fma(InvLn2N, x, Shift)       k = round(x * 32 / ln2), ki its bits
 *     r  = fma(InvLn2N, x, -(kd - Shift)) the reduced argument, |r| <= 1/2
 *     s  = 2^(k / 32) from T[k % 32] with k / 32 added to its exponent bits
 *     y  = fma(fma(C0, r, C1), r * r, fma(C2, r, 1)) * s, rounded once to float
 * (what the compiler fused in __expf_fma is read from its disassembly: `objdump -d libm.so.6`
 * from the ifunc resolver of expf; the constants and table below are the bytes of
 * __exp2f_data in that libm, equal to sysdeps/ieee754/flt-32/e_exp2f_data.c). |x| >= 88 and NaN
 * take e_expf.c's special cases: -inf -> 0, NaN and +inf -> x + x, x > 0x1.62e42ep6 -> +inf,
 * x < -0x1.9fe368p6 -> 0, x < -0x1.9d1d9ep6 -> 0x1p-149 (glibc's __math_may_uflowf); the rest of
 * that range takes the main path. errno is not set (the kernels are built with -fno-math-errno).
 *
 * The scalar form needs C's fma(); where the compiler has no FMA instruction that is a libm call
 * (exact, slower): the kernels' scalar references keep calling libm's expf, and tests/
 * kernels_simd.rs checks both forms against it.
 */
#ifndef EL_EXPF_GLIBC_H
#define EL_EXPF_GLIBC_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* 2^(i / 32) as double bits, less i << 47 (so adding k << 47 puts k / 32 into the exponent). */
static const uint64_t el_expf_tab[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
    0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
    0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
};
#define EL_EXPF_INVLN2N 0x1.71547652b82fep+5 /* 32 / ln 2 */
#define EL_EXPF_SHIFT 0x1.8p+52               /* rounds to an integer, ties to even */
#define EL_EXPF_C0 0x1.c6af84b912394p-20      /* the polynomial in r, scaled for 2^(r / 32) */
#define EL_EXPF_C1 0x1.ebfce50fac4f3p-13
#define EL_EXPF_C2 0x1.62e42ff0c52d6p-6
/* |x| >= 88 or NaN: (float bits & 0x7fffffff) at or above this takes the special cases. */
#define EL_EXPF_SPECIAL_ABS 0x42b00000u
#define EL_EXPF_OFLOW 0x1.62e42ep6f   /* above: +inf */
#define EL_EXPF_UFLOW -0x1.9fe368p6f  /* below: 0 */
#define EL_EXPF_MUFLOW -0x1.9d1d9ep6f /* below: 0x1p-149 */

static inline uint32_t el_expf_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

/* The main path, for |x| < 88 and the finite rest of the special range that falls through. */
static inline float el_expf_glibc_main(float x) {
    const double xd = (double)x;
    const double kd0 = fma(EL_EXPF_INVLN2N, xd, EL_EXPF_SHIFT);
    uint64_t ki;
    memcpy(&ki, &kd0, sizeof ki);
    const double kd = kd0 - EL_EXPF_SHIFT;
    const double r = fma(EL_EXPF_INVLN2N, xd, -kd);
    const uint64_t t = el_expf_tab[ki % 32] + (ki << 47);
    double s;
    memcpy(&s, &t, sizeof s);
    const double z = fma(EL_EXPF_C0, r, EL_EXPF_C1);
    const double r2 = r * r;
    const double y = fma(z, r2, fma(EL_EXPF_C2, r, 1.0));
    return (float)(y * s);
}

/* |x| >= 88, +-inf or NaN (el_expf_bits(x) & 0x7fffffff >= EL_EXPF_SPECIAL_ABS). */
static inline float el_expf_glibc_special(float x) {
    if (el_expf_bits(x) == 0xff800000u) return 0.0f; /* -inf */
    if ((el_expf_bits(x) & 0x7fffffffu) >= 0x7f800000u) return x + x; /* +inf, NaN (quietened) */
    if (x > EL_EXPF_OFLOW) return INFINITY;
    if (x < EL_EXPF_UFLOW) return 0.0f;
    if (x < EL_EXPF_MUFLOW) return 0x1p-149f;
    return el_expf_glibc_main(x);
}

/* expf(x), bit for bit glibc's __expf_fma. */
static inline float el_expf_glibc(float x) {
    if ((el_expf_bits(x) & 0x7fffffffu) >= EL_EXPF_SPECIAL_ABS) return el_expf_glibc_special(x);
    return el_expf_glibc_main(x);
}

#endif

/*
 * avx512_target_begin.h: compiles the functions that follow for AVX2, FMA and F16C plus AVX-512 F,
 * BW, VL and VNNI (a target pragma, as avx2_target_begin.h: the rest of the library stays baseline
 * x86-64, and these functions are called only once EL_ISA_AVX512VNNI is chosen, which
 * simd_dispatch.c does only on a CPU that has all of them). Include after the system headers;
 * close with avx512_target_end.h. Deliberately without an include guard.
 */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#endif

/*
 * avx2_target_begin.h: compiles the functions that follow for AVX2, FMA and F16C (a target
 * pragma, so the rest of the library stays baseline x86-64 and each variant is called only once
 * its ISA is chosen). Include after the system headers; close with avx2_target_end.h.
 * Deliberately without an include guard: each AVX2 file opens and closes the region once.
 */
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

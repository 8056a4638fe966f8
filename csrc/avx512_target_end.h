/* avx512_target_end.h: closes the region avx512_target_begin.h opened. */
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

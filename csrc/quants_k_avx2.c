#if defined(__x86_64__)
#include <stddef.h>
#include "simd_internal.h"
const el_simd_quant_kernels *el_avx2_quant_k(int32_t type) { (void)type; return NULL; }
#endif

/*
 * simd_dispatch.c: which instruction set the kernels run (el_isa_*), and the table lookup that
 * quants.c uses to find a type's SIMD kernels. The choice is one process-wide atomic: detected
 * from the CPU (or taken from the EDGE_LLM_ISA environment variable) on first use (racing first uses all detect the same answer, and a compare-exchange
 * keeps an el_isa_set that came first), changed only by el_isa_set. This file is compiled for the
 * baseline ISA, so it runs on any CPU; it only calls into the AVX2 (NEON) files once AVX2 (NEON
 * with the dot-product instructions) is chosen. EL_ISA_AVX512VNNI is AVX2's kernels with the
 * interleaved products of quants_x8_vnni.c (quants.c's el_matmul_x8), chosen where the CPU has
 * AVX-512 F, BW, VL and VNNI besides AVX2; EDGE_LLM_ISA=avx2 keeps such a CPU on AVX2's.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20) /* the dot-product instructions (FEAT_DotProd) */
#endif
#elif defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
#endif

#include "edge_kernels.h"
#include "simd_internal.h"

static _Atomic int32_t current_isa = -1; /* -1: not detected yet */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* AVX2 with FMA and F16C (the AVX2 kernels' target). */
static int has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

/* AVX-512 F, BW, VL and VNNI as well (quants_x8_vnni.c's target; the compiler's check includes the
 * operating system saving the AVX-512 registers). */
static int has_avx512_vnni(void) {
    return has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}
#endif

/* The best instruction set this CPU runs. */
static int32_t best(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (has_avx512_vnni()) return EL_ISA_AVX512VNNI;
    if (has_avx2()) return EL_ISA_AVX2;
#elif defined(__aarch64__) && defined(__linux__)
    if (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) return EL_ISA_NEON;
#elif defined(__aarch64__) && defined(__APPLE__)
    int dotprod = 0;
    size_t size = sizeof(dotprod);
    if (sysctlbyname("hw.optional.arm.FEAT_DotProd", &dotprod, &size, NULL, 0) == 0 && dotprod) return EL_ISA_NEON;
#endif
    return EL_ISA_SCALAR;
}

int32_t el_isa_available(int32_t isa) {
    switch (isa) {
    case EL_ISA_SCALAR:
        return 1;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    case EL_ISA_AVX2:
        return has_avx2();
    case EL_ISA_AVX512VNNI:
        return has_avx512_vnni();
#endif
    case EL_ISA_NEON:
        return best() == isa;
    default:
        return 0;
    }
}

/* The first choice: EDGE_LLM_ISA (scalar, avx2, avx512vnni, neon) where set to one available here, else the best. */
static int32_t detect(void) {
    const char *want = getenv("EDGE_LLM_ISA");
    if (want != NULL) {
        if (strcmp(want, "scalar") == 0) return EL_ISA_SCALAR;
        if (strcmp(want, "avx2") == 0 && el_isa_available(EL_ISA_AVX2)) return EL_ISA_AVX2;
        if (strcmp(want, "avx512vnni") == 0 && el_isa_available(EL_ISA_AVX512VNNI)) return EL_ISA_AVX512VNNI;
        if (strcmp(want, "neon") == 0 && el_isa_available(EL_ISA_NEON)) return EL_ISA_NEON;
    }
    return best();
}

int32_t el_isa_get(void) {
    int32_t isa = atomic_load_explicit(&current_isa, memory_order_relaxed);
    if (isa < 0) {
        int32_t unset = -1;
        atomic_compare_exchange_strong(&current_isa, &unset, detect());
        isa = atomic_load(&current_isa);
    }
    return isa;
}

int32_t el_isa_set(int32_t isa) {
    if (!el_isa_available(isa)) return EL_ERR_TYPE;
    atomic_store(&current_isa, isa);
    return EL_OK;
}

const el_simd_quant_kernels *el_simd_quant(int32_t type) {
#if defined(__x86_64__)
    const int32_t isa = el_isa_get();
    if (isa == EL_ISA_AVX2 || isa == EL_ISA_AVX512VNNI) {
        const el_simd_quant_kernels *k = el_avx2_quant(type);
        if (k == NULL) k = el_avx2_quant_k(type);
        return k != NULL ? k : el_avx2_quant_iq(type);
    }
#elif defined(__aarch64__)
    if (el_isa_get() == EL_ISA_NEON) {
        const el_simd_quant_kernels *k = el_neon_quant(type);
        return k != NULL ? k : el_neon_quant_iq(type);
    }
#else
    (void)type;
#endif
    return NULL;
}

/*
 * el_emu_kernels.cpp: the CUDA kernels of csrc/cuda/ compiled for the CPU (through
 * el_cuda_emu.h) and the launch entry the Rust side calls, el_emu_launch: a table of every kernel
 * by name, each with a thunk that checks the launch's arguments against the kernel's real
 * parameter list (count, and pointer / int64 / int32 / float for each) before it unpacks them and
 * runs the grid. A mismatch, an unknown name or a failed launch returns an error message instead
 * of aborting, so src/cuda/kernels.rs's argument lists are checked by every emulated launch.
 */
#include "el_cuda_emu.h"

#include "../el_quants.cu"
#include "../el_ops.cu"

#include <stdio.h>

#include <tuple>
#include <utility>

#include "el_emu_runtime.h"

/* One launch argument, as src/cuda/emu.rs passes it: its kind and its bits (an address, an
 * int64, an int32 zero-extended, or a float's bits). */
struct el_emu_arg {
    int32_t kind;
    int32_t pad;
    uint64_t bits;
};
enum { EL_EMU_PTR = 0, EL_EMU_I64 = 1, EL_EMU_I32 = 2, EL_EMU_F32 = 3 };

static const char *el_kind_name(int k) {
    switch (k) {
    case EL_EMU_PTR: return "a pointer";
    case EL_EMU_I64: return "an int64";
    case EL_EMU_I32: return "an int32";
    case EL_EMU_F32: return "a float";
    default: return "an unknown kind";
    }
}

/* The kind of each parameter type the kernels use; any other type does not compile. */
template <typename P>
struct el_param;
template <typename T>
struct el_param<T *> {
    static constexpr int kind = EL_EMU_PTR;
    static T *get(uint64_t b) { return (T *)(uintptr_t)b; }
};
template <>
struct el_param<int64_t> {
    static constexpr int kind = EL_EMU_I64;
    static int64_t get(uint64_t b) { return (int64_t)b; }
};
template <>
struct el_param<int32_t> {
    static constexpr int kind = EL_EMU_I32;
    static int32_t get(uint64_t b) { return (int32_t)(uint32_t)b; }
};
template <>
struct el_param<float> {
    static constexpr int kind = EL_EMU_F32;
    static float get(uint64_t b) { return __uint_as_float((uint32_t)b); }
};

template <typename... P>
struct el_call {
    void (*kernel)(P...);
    std::tuple<P...> args;
};

template <typename... P>
static void el_body(void *p) {
    el_call<P...> *c = (el_call<P...> *)p;
    std::apply(c->kernel, c->args);
}

template <typename... P, size_t... I>
static std::tuple<P...> el_unpack(const el_emu_arg *a, std::index_sequence<I...>) {
    return std::tuple<P...>(el_param<P>::get(a[I].bits)...);
}

template <typename... P>
static int el_thunk(void (*kernel)(P...), const char *name, el_dim3 grid, el_dim3 block, const el_emu_arg *args,
                    int n_args, int flags, char *err, size_t err_len) {
    constexpr int n = (int)sizeof...(P);
    if (n_args != n) {
        snprintf(err, err_len, "kernel %s takes %d arguments, the launch passed %d", name, n, n_args);
        return 1;
    }
    const int kinds[] = {el_param<P>::kind...};
    for (int i = 0; i < n; i++) {
        if (args[i].kind != kinds[i]) {
            snprintf(err, err_len, "kernel %s: argument %d is %s, the kernel's parameter is %s", name, i,
                     el_kind_name(args[i].kind), el_kind_name(kinds[i]));
            return 1;
        }
    }
    el_call<P...> c{kernel, el_unpack<P...>(args, std::index_sequence_for<P...>{})};
    return el_emu_run_grid(grid, block, flags, &el_body<P...>, &c, name, err, err_len);
}

typedef int (*el_launcher)(const char *, el_dim3, el_dim3, const el_emu_arg *, int, int, char *, size_t);

template <auto K>
static int el_launch_one(const char *name, el_dim3 grid, el_dim3 block, const el_emu_arg *args, int n_args,
                         int flags, char *err, size_t err_len) {
    return el_thunk(K, name, grid, block, args, n_args, flags, err, err_len);
}

struct el_entry {
    const char *name;
    el_launcher launch;
};

#define EL_KERNEL(k) {#k, &el_launch_one<&k>}

/* Every entry point of src/cuda/nvrtc.rs (tests/cuda_kernels.rs checks the two lists agree). */
static const el_entry EL_TABLE[] = {
    EL_KERNEL(el_cuda_quantize_q8_0),
    EL_KERNEL(el_cuda_quantize_q8_1),
    EL_KERNEL(el_cuda_quantize_q8_K),
    EL_KERNEL(el_cuda_quantize_f16),
    EL_KERNEL(el_cuda_quantize_bf16),
    EL_KERNEL(el_cuda_mmv_q4_0),
    EL_KERNEL(el_cuda_mm_q4_0),
    EL_KERNEL(el_cuda_get_rows_q4_0),
    EL_KERNEL(el_cuda_mmv_q4_1),
    EL_KERNEL(el_cuda_mm_q4_1),
    EL_KERNEL(el_cuda_get_rows_q4_1),
    EL_KERNEL(el_cuda_mmv_q5_0),
    EL_KERNEL(el_cuda_mm_q5_0),
    EL_KERNEL(el_cuda_get_rows_q5_0),
    EL_KERNEL(el_cuda_mmv_q5_1),
    EL_KERNEL(el_cuda_mm_q5_1),
    EL_KERNEL(el_cuda_get_rows_q5_1),
    EL_KERNEL(el_cuda_mmv_q8_0),
    EL_KERNEL(el_cuda_mm_q8_0),
    EL_KERNEL(el_cuda_get_rows_q8_0),
    EL_KERNEL(el_cuda_mmv_q2_K),
    EL_KERNEL(el_cuda_mm_q2_K),
    EL_KERNEL(el_cuda_get_rows_q2_K),
    EL_KERNEL(el_cuda_mmv_q3_K),
    EL_KERNEL(el_cuda_mm_q3_K),
    EL_KERNEL(el_cuda_get_rows_q3_K),
    EL_KERNEL(el_cuda_mmv_q4_K),
    EL_KERNEL(el_cuda_mm_q4_K),
    EL_KERNEL(el_cuda_get_rows_q4_K),
    EL_KERNEL(el_cuda_mmv_q5_K),
    EL_KERNEL(el_cuda_mm_q5_K),
    EL_KERNEL(el_cuda_get_rows_q5_K),
    EL_KERNEL(el_cuda_mmv_q6_K),
    EL_KERNEL(el_cuda_mm_q6_K),
    EL_KERNEL(el_cuda_get_rows_q6_K),
#define EL_KERNELS_OF(t) EL_KERNEL(el_cuda_mmv_##t), EL_KERNEL(el_cuda_mm_##t), EL_KERNEL(el_cuda_get_rows_##t)
    EL_KERNELS_OF(iq4_nl),
    EL_KERNELS_OF(mxfp4),
    EL_KERNELS_OF(iq4_xs),
    EL_KERNELS_OF(iq3_xxs),
    EL_KERNELS_OF(iq3_s),
    EL_KERNELS_OF(iq2_xxs),
    EL_KERNELS_OF(iq2_xs),
    EL_KERNELS_OF(iq2_s),
    EL_KERNELS_OF(iq1_s),
    EL_KERNELS_OF(iq1_m),
    EL_KERNEL(el_cuda_mm_f32),
    EL_KERNEL(el_cuda_get_rows_f32),
    EL_KERNEL(el_cuda_mm_f16),
    EL_KERNEL(el_cuda_get_rows_f16),
    EL_KERNEL(el_cuda_mm_bf16),
    EL_KERNEL(el_cuda_get_rows_bf16),
    EL_KERNEL(el_cuda_rms_norm),
    EL_KERNEL(el_cuda_rope),
    EL_KERNEL(el_cuda_rope_ext),
    EL_KERNEL(el_cuda_swiglu),
    EL_KERNEL(el_cuda_swiglu_oai),
    EL_KERNEL(el_cuda_geglu),
    EL_KERNEL(el_cuda_kv_write),
    EL_KERNEL(el_cuda_paged_attention),
    EL_KERNEL(el_cuda_hadamard),
    EL_KERNEL(el_cuda_kv_write_q),
    EL_KERNEL(el_cuda_add),
    EL_KERNEL(el_cuda_add_bias),
    EL_KERNEL(el_cuda_scale),
    EL_KERNEL(el_cuda_softcap),
    EL_KERNEL(el_cuda_gather_rows),
    EL_KERNEL(el_cuda_scatter_rows),
    EL_KERNEL(el_cuda_weighted_sum),
    EL_KERNEL(el_cuda_copy_block),
};

#define EL_TABLE_LEN (sizeof EL_TABLE / sizeof EL_TABLE[0])

/* Launches kernel `name` on grid x block (block[0..3] threads); flags: EL_EMU_REVERSE. Returns 0,
 * or 1 with a one-line message in err. */
extern "C" int el_emu_launch(const char *name, const uint32_t grid[3], const uint32_t block[3],
                             const el_emu_arg *args, int n_args, int flags, char *err, size_t err_len) {
    for (size_t i = 0; i < EL_TABLE_LEN; i++) {
        if (strcmp(EL_TABLE[i].name, name) == 0) {
            return EL_TABLE[i].launch(name, el_dim3{grid[0], grid[1], grid[2]},
                                      el_dim3{block[0], block[1], block[2]}, args, n_args, flags, err, err_len);
        }
    }
    snprintf(err, err_len, "kernel %s does not exist", name);
    return 1;
}

extern "C" int el_emu_kernel_count(void) { return (int)EL_TABLE_LEN; }

extern "C" const char *el_emu_kernel_name(int i) {
    return i >= 0 && (size_t)i < EL_TABLE_LEN ? EL_TABLE[i].name : nullptr;
}

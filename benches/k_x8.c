/*
 * k_x8.c: a microbenchmark of el_matmul_x8 on one thread for the interleaved types (a benchmark, not
 * a test: it checks nothing and only prints). One product of TYPE (3 Q4_1, 8 Q8_0, 12 Q4_K,
 * 13 Q5_K, 14 Q6_K) weights [N_OUT][N_IN] by ROWS activation rows (of the type's vec_dot_type): with one row, over enough copies of the matrix
 * (256 MiB) that it streams from memory, best and mean of 200 calls as G MAC/s and GB/s of
 * weights; with more, best and mean of 5 calls (weights in L2/L3, as in prefill). Then the same
 * through el_matmul, reading the copies' bytes as row-major rows (the generic tiles; only the speed
 * counts there), for comparison. Times are the thread's CPU time, so that on a shared machine the
 * time spent waiting for a core is left out (caches and memory stay shared: compare interleaved runs). EDGE_LLM_ISA=avx2 (or avx512vnni, scalar) picks the variant.
 *
 * Build and run (from the repository root; the flags are build.rs's):
 *   gcc -O3 -std=gnu11 -fno-math-errno -ffp-contract=off -Icsrc benches/k_x8.c \
 *       $(find csrc -maxdepth 1 -name '*.c') -lm -o target/k_x8 && target/k_x8 12 1536 8960 64
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "edge_kernels.h"
#include "el_blocks.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts); /* the thread's CPU time: a wait for a core does not count */
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng = 88172645463325252ull;
static float uniform(void) { /* [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: k_x8 TYPE N_IN N_OUT ROWS\n");
        return 2;
    }
    const int type = atoi(argv[1]), n_rows = atoi(argv[4]);
    const int64_t n_in = atoll(argv[2]), n_out = atoll(argv[3]), bs = el_type_block_size(type);
    if (!el_type_has_x8(type) || n_in % bs || n_out % 8 || n_rows < 1) {
        fprintf(stderr, "k_x8: a type with x8, N_IN a multiple of its block size, N_OUT of 8\n");
        return 2;
    }
    const int32_t act_type = el_type_vec_dot_type(type);
    const int64_t nb = n_in / bs, a_row_bytes = n_in / el_type_block_size(act_type) * el_type_block_bytes(act_type);
    const int64_t w_bytes = n_out * nb * el_type_block_bytes(type);
    const int n_copies = n_rows == 1 ? (int)((256 << 20) / w_bytes + 1) : 1, n_calls = n_rows == 1 ? 200 : 5;
    float *x = malloc(sizeof(float) * (size_t)n_in);
    uint8_t *w = malloc((size_t)w_bytes), *a = malloc((size_t)(a_row_bytes * n_rows));
    for (int64_t o = 0; o < n_out; o++) {
        for (int64_t e = 0; e < n_in; e++) x[e] = uniform();
        el_quantize_row(type, x, w + o * nb * el_type_block_bytes(type), n_in);
    }
    for (int r = 0; r < n_rows; r++) {
        for (int64_t e = 0; e < n_in; e++) x[e] = uniform();
        el_quantize_row(act_type, x, a + r * a_row_bytes, n_in);
    }
    uint8_t **w8 = malloc(sizeof(uint8_t *) * (size_t)n_copies);
    for (int c = 0; c < n_copies; c++) {
        w8[c] = malloc((size_t)w_bytes);
        el_repack_x8(type, w, n_out, nb, w8[c]);
    }
    float *out = malloc(sizeof(float) * (size_t)(n_out * n_rows));
    const double macs = (double)n_in * (double)n_out * n_rows;
    for (int interleaved = 1; interleaved >= 0; interleaved--) {
        double best = 1e30, total = 0;
        for (int call = 0; call < n_calls; call++) {
            const double t0 = now();
            if (interleaved) {
                el_matmul_x8(type, w8[call % n_copies], a, a_row_bytes, out, n_out, n_in, n_rows, 0, n_out);
            } else { /* the rows as stored; the first copy's bytes, so they come from memory too */
                el_matmul(type, w8[call % n_copies], nb * el_type_block_bytes(type), a, a_row_bytes, out, n_out, n_in,
                          n_rows, 0, n_out);
            }
            const double t = now() - t0;
            best = t < best ? t : best;
            total += t;
        }
        const double mean = total / n_calls;
        printf("isa %d type %d [%lld][%lld] x %d rows, %s: best %.3f ms (%.1f G MAC/s, %.1f GB/s), mean %.3f ms "
               "(%.1f G MAC/s)\n",
               el_isa_get(), type, (long long)n_out, (long long)n_in, n_rows, interleaved ? "el_matmul_x8" : "el_matmul  ",
               best * 1e3, macs / best / 1e9, w_bytes / best / 1e9, mean * 1e3, macs / mean / 1e9);
    }
    return 0;
}

/*
 * x8_stream.c: a microbenchmark of el_matmul_x8_avx2 (a benchmark, not a test: it checks nothing
 * and only prints), the interleaved products of the default SmolLM2-135M Q4_1 model.
 *
 *   mv:   the one-row product decode runs. Per matrix shape (576x576, 576x192, 576x1536,
 *         1536x576, the 49152x576 Q8_0 output), GB/s of weights streamed by one thread and by
 *         two (each thread its contiguous half of the column groups, as the kernels' pool hands
 *         them out), over enough copies of the matrix (64 MiB) that it comes from memory; then
 *         the whole model's token (30 layers of q/k/v, o, gate/up, down, then the output: the
 *         engine's five parallel calls per layer) on two threads, as GB/s and products-only
 *         tokens/s, then the same bytes in the same calls only read (a plain sum: what the
 *         memory allows that pattern) (`token`: those two alone).
 *   tile: the batch tiles on one thread, G MAC/s per shape for 512 rows (weights in L2 / L3, as
 *         in prefill), with the engine's task widths (cols_per_task for 2 threads).
 *
 * Build and run (from the repository root; the flags are build.rs's):
 *   gcc -O3 -std=gnu11 -fno-math-errno -ffp-contract=off -Icsrc benches/x8_stream.c \
 *       $(ls csrc/*.c) -lm -lpthread -o target/x8_stream && target/x8_stream mv
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "edge_kernels.h"
#include "el_blocks.h"
#include "simd_internal.h"

#define T_Q4_1 3
#define T_Q8_0 8

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* n_out x n_in weights in the interleaved layout, quants random, scales about 0.01. */
static void *make_w(int type, int64_t n_in, int64_t n_out) {
    const int64_t nb = n_in / 32, ng = n_out / 8;
    const size_t blk = type == T_Q4_1 ? sizeof(el_block_q4_1x8) : sizeof(el_block_q8_0x8);
    uint8_t *w = aligned_alloc(64, (size_t)(ng * nb) * blk);
    for (size_t i = 0; i < (size_t)(ng * nb) * blk; i++) w[i] = (uint8_t)next();
    for (int64_t b = 0; b < ng * nb; b++) {
        uint16_t *h = (uint16_t *)(w + (size_t)b * blk);
        for (int c = 0; c < (type == T_Q4_1 ? 16 : 8); c++) h[c] = 0x2000 | (next() & 0x3ff);
    }
    return w;
}

static void *make_a(int type, int64_t n_in, int64_t rows) {
    const int64_t nb = n_in / 32;
    const size_t blk = type == T_Q4_1 ? sizeof(el_block_q8_1) : sizeof(el_block_q8_0);
    uint8_t *a = aligned_alloc(64, (size_t)(rows * nb) * blk + 64);
    for (size_t i = 0; i < (size_t)(rows * nb) * blk; i++) a[i] = (uint8_t)(next() % 255 + 1);
    for (int64_t b = 0; b < rows * nb; b++) {
        uint16_t *h = (uint16_t *)(a + (size_t)b * blk);
        h[0] = 0x2000 | (next() & 0x3ff);
        if (type == T_Q4_1) h[1] = 0x2000 | (next() & 0x3ff);
    }
    return a;
}

static size_t w_bytes(int type, int64_t n_in, int64_t n_out) {
    return (size_t)(n_in / 32 * n_out) * (type == T_Q4_1 ? 20 : 34);
}

/* ---- Two threads: the caller and one worker, meeting at a spinning barrier. ---- */
typedef struct {
    int type;
    const void *w;
    const void *a;
    float *out;
    int64_t n_in, n_out;
} prod;

static prod job[8];
static int job_n;
static atomic_int gen, done;
/* Set: each job reads its half's weight bytes (a plain sum) instead of multiplying them. */
static int read_only;
static volatile uint64_t read_sink;

/* The bytes [p, p + n) summed with 256-bit loads, four chains: memory speed, nothing else. */
#include "avx2_target_begin.h"
#include <immintrin.h>
static uint64_t read_bytes(const uint8_t *p, size_t n) {
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 128 <= n; i += 128) {
        s0 = _mm256_add_epi64(s0, _mm256_loadu_si256((const __m256i *)(p + i)));
        s1 = _mm256_add_epi64(s1, _mm256_loadu_si256((const __m256i *)(p + i + 32)));
        s2 = _mm256_add_epi64(s2, _mm256_loadu_si256((const __m256i *)(p + i + 64)));
        s3 = _mm256_add_epi64(s3, _mm256_loadu_si256((const __m256i *)(p + i + 96)));
    }
    s0 = _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3));
    uint64_t t[4], sum = 0;
    _mm256_storeu_si256((__m256i *)t, s0);
    for (; i < n; i++) sum += p[i];
    return sum + t[0] + t[1] + t[2] + t[3];
}
#include "avx2_target_end.h"

static void run_half(int half) {
    for (int p = 0; p < job_n; p++) {
        const prod *j = &job[p];
        const int64_t ng = j->n_out / 8, mid = ng / 2;
        const size_t arb = (size_t)(j->n_in / 32) * (j->type == T_Q4_1 ? 36 : 34);
        if (read_only) {
            const size_t group = w_bytes(j->type, j->n_in, 8);
            const int64_t g0 = half ? mid : 0, g1 = half ? ng : mid;
            read_sink += read_bytes((const uint8_t *)j->w + g0 * group, (size_t)(g1 - g0) * group);
            continue;
        }
        el_matmul_x8_avx2(j->type, j->w, j->a, (int64_t)arb, j->out, j->n_out, j->n_in / 32, 1, half ? mid : 0,
                          half ? ng : mid);
    }
}

static void *worker(void *arg) {
    (void)arg;
    int seen = 0;
    for (;;) {
        int g;
        while ((g = atomic_load_explicit(&gen, memory_order_acquire)) == seen) __builtin_ia32_pause();
        if (g < 0) return NULL;
        seen = g;
        run_half(1);
        atomic_fetch_add_explicit(&done, 1, memory_order_release);
    }
}

/* One parallel call over job[0..job_n). */
static void call2(void) {
    const int d = atomic_load(&done);
    atomic_fetch_add_explicit(&gen, 1, memory_order_release);
    run_half(0);
    while (atomic_load_explicit(&done, memory_order_acquire) == d) __builtin_ia32_pause();
}

static void call1(void) {
    for (int p = 0; p < job_n; p++) {
        const prod *j = &job[p];
        const size_t arb = (size_t)(j->n_in / 32) * (j->type == T_Q4_1 ? 36 : 34);
        el_matmul_x8_avx2(j->type, j->w, j->a, (int64_t)arb, j->out, j->n_out, j->n_in / 32, 1, 0, j->n_out / 8);
    }
}

static double median(double *v, int n) {
    for (int i = 0; i < n; i++)
        for (int k = i + 1; k < n; k++)
            if (v[k] < v[i]) {
                double t = v[i];
                v[i] = v[k];
                v[k] = t;
            }
    return v[n / 2];
}

static void bench_mv(int per_shape) {
    static const struct {
        const char *name;
        int type;
        int64_t n_in, n_out;
    } shapes[] = {
        {"q,o 576->576", T_Q4_1, 576, 576},       {"k,v 576->192", T_Q4_1, 576, 192},
        {"gate,up 576->1536", T_Q4_1, 576, 1536}, {"down 1536->576", T_Q4_1, 1536, 576},
        {"output 576->49152 Q8_0", T_Q8_0, 576, 49152},
    };
    float *out = aligned_alloc(64, 49152 * 4);
    printf("%-24s %10s %10s\n", "one row (matvec)", "1 thread", "2 threads");
    for (size_t s = 0; per_shape && s < sizeof shapes / sizeof shapes[0]; s++) {
        const size_t wb = w_bytes(shapes[s].type, shapes[s].n_in, shapes[s].n_out);
        int copies = (int)((64u << 20) / wb);
        if (copies < 2) copies = 2;
        void **w = malloc(sizeof(void *) * copies);
        for (int c = 0; c < copies; c++) w[c] = make_w(shapes[s].type, shapes[s].n_in, shapes[s].n_out);
        void *a = make_a(shapes[s].type, shapes[s].n_in, 1);
        double gbs[2];
        for (int th = 0; th < 2; th++) {
            double t[7];
            for (int rep = 0; rep < 7; rep++) {
                const double t0 = now();
                for (int c = 0; c < copies; c++) {
                    job[0] = (prod){shapes[s].type, w[c], a, out, shapes[s].n_in, shapes[s].n_out};
                    job_n = 1;
                    if (th) call2();
                    else call1();
                }
                t[rep] = now() - t0;
            }
            gbs[th] = (double)wb * copies / median(t, 7) * 1e-9;
        }
        printf("%-24s %7.1f GB/s %7.1f GB/s\n", shapes[s].name, gbs[0], gbs[1]);
        for (int c = 0; c < copies; c++) free(w[c]);
        free(w);
        free(a);
    }

    /* The whole model's token: per layer q/k/v (one call), o, gate/up (one call), down; the output. */
    enum { L = 30 };
    void *wq[L], *wk[L], *wv[L], *wo[L], *wg[L], *wu[L], *wd[L];
    size_t total = 0;
    for (int l = 0; l < L; l++) {
        wq[l] = make_w(T_Q4_1, 576, 576), wk[l] = make_w(T_Q4_1, 576, 192), wv[l] = make_w(T_Q4_1, 576, 192);
        wo[l] = make_w(T_Q4_1, 576, 576), wg[l] = make_w(T_Q4_1, 576, 1536), wu[l] = make_w(T_Q4_1, 576, 1536);
        wd[l] = make_w(T_Q4_1, 1536, 576);
        total += w_bytes(T_Q4_1, 576, 576) * 2 + w_bytes(T_Q4_1, 576, 192) * 2 + w_bytes(T_Q4_1, 576, 1536) * 3;
    }
    void *wout = make_w(T_Q8_0, 576, 49152);
    total += w_bytes(T_Q8_0, 576, 49152);
    void *a576 = make_a(T_Q4_1, 576, 1), *a1536 = make_a(T_Q4_1, 1536, 1), *a0 = make_a(T_Q8_0, 576, 1);
    float *o1 = aligned_alloc(64, 4 * 4096), *o2 = aligned_alloc(64, 4 * 4096), *o3 = aligned_alloc(64, 4 * 4096);
    double t[9];
    for (read_only = 0; read_only < 2; read_only++)
    for (int rep = 0; rep < 9; rep++) {
        const double t0 = now();
        for (int tok = 0; tok < 10; tok++) {
            for (int l = 0; l < L; l++) {
                job[0] = (prod){T_Q4_1, wq[l], a576, o1, 576, 576};
                job[1] = (prod){T_Q4_1, wk[l], a576, o2, 576, 192};
                job[2] = (prod){T_Q4_1, wv[l], a576, o3, 576, 192};
                job_n = 3, call2();
                job[0] = (prod){T_Q4_1, wo[l], a576, o1, 576, 576};
                job_n = 1, call2();
                job[0] = (prod){T_Q4_1, wg[l], a576, o1, 576, 1536};
                job[1] = (prod){T_Q4_1, wu[l], a576, o2, 576, 1536};
                job_n = 2, call2();
                job[0] = (prod){T_Q4_1, wd[l], a1536, o1, 1536, 576};
                job_n = 1, call2();
            }
            job[0] = (prod){T_Q8_0, wout, a0, out, 576, 49152};
            job_n = 1, call2();
        }
        t[rep] = (now() - t0) / 10;
        if (rep == 8) {
            const double m = median(t, 9);
            printf("whole token (%.1f MB, 2 threads): %.3f ms, %.1f GB/s, %.0f tokens/s (%s)\n", total * 1e-6, m * 1e3,
                   total / m * 1e-9, 1 / m,
                   read_only ? "the same bytes only read, in the same calls" : "products only");
        }
    }
}

static void bench_tile(int rows) {
    /* (n_in, n_out, columns per task): cols_per_task for 2 threads = ceil(n_out / 8) to 8, >= 32;
     * 32 below 4 rows. */
    static const struct {
        const char *name;
        int64_t n_in, n_out, cols;
    } shapes[] = {
        {"q,o 576->576", 576, 576, 72},         {"k,v 576->192", 576, 192, 32},
        {"gate,up 576->1536", 576, 1536, 192}, {"down 1536->576", 1536, 576, 72},
    };
    printf("%d rows, one thread, G MAC/s (best of 30)\n", rows);
    float *out = aligned_alloc(64, (size_t)rows * 1536 * 4);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        void *w = make_w(T_Q4_1, shapes[s].n_in, shapes[s].n_out);
        void *a = make_a(T_Q4_1, shapes[s].n_in, rows);
        const int64_t nb = shapes[s].n_in / 32, arb = nb * 36;
        double best = 1e9;
        for (int rep = 0; rep < 30; rep++) {
            const double t0 = now();
            const int64_t cols = rows < 4 ? 32 : shapes[s].cols; /* cols_per_task */
            const int iters = rows < 64 ? 64 / rows : 1; /* small batches: time several calls */
            for (int it = 0; it < iters; it++) {
                for (int64_t c0 = 0; c0 < shapes[s].n_out; c0 += cols) {
                    int64_t c1 = c0 + cols;
                    if (c1 > shapes[s].n_out) c1 = shapes[s].n_out;
                    el_matmul_x8_avx2(T_Q4_1, w, a, arb, out, shapes[s].n_out, nb, rows, c0 / 8, c1 / 8);
                }
            }
            const double dt = (now() - t0) / iters;
            if (dt < best) best = dt;
        }
        printf("%-20s %6.1f G MAC/s\n", shapes[s].name, (double)rows * shapes[s].n_in * shapes[s].n_out / best * 1e-9);
        free(w);
        free(a);
    }
}

int main(int argc, char **argv) {
    if (el_isa_set(EL_ISA_AVX2) != 0) {
        fprintf(stderr, "no AVX2\n");
        return 1;
    }
    pthread_t th;
    pthread_create(&th, NULL, worker, NULL);
    if (argc > 1 && strcmp(argv[1], "tile") == 0) bench_tile(argc > 2 ? atoi(argv[2]) : 512);
    else bench_mv(!(argc > 1 && strcmp(argv[1], "token") == 0));
    atomic_store(&gen, -1);
    pthread_join(th, NULL);
    return 0;
}

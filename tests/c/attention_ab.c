/*
 * attention_ab.c: the AVX2 paged attention of two builds of csrc/ops_avx2.c side by side, on one
 * thread, in thread CPU time (steadier than throughput on a shared machine), with their outputs
 * compared bit for bit. SmolLM2-135M's shapes: 9 heads, 3 KV heads, head size 64, blocks of 16.
 * Build A (e.g. main's file, `git show main:csrc/ops_avx2.c > /tmp/a.c`) and B (this tree's),
 * each with its entry point renamed and its other functions made local:
 *     for x in a b; do
 *       src=/tmp/a.c; [ $x = b ] && src=csrc/ops_avx2.c
 *       gcc -O3 -std=c11 -fno-math-errno -ffp-contract=off -Icsrc -c $src -o /tmp/$x.o
 *       objcopy --redefine-sym el_paged_attention_avx2=${x}_attn -L el_kv_write_f16_avx2 \
 *         -L el_rms_norm_avx2 -L el_rope_avx2 -L el_swiglu_avx2 /tmp/$x.o /tmp/${x}_r.o
 *     done
 *     gcc -O2 -mf16c tests/c/attention_ab.c /tmp/a_r.o /tmp/b_r.o -lm -o /tmp/attention_ab
 *     /tmp/attention_ab prefill DEPTH TOKENS REPS   # e.g. prefill 0 512 60, prefill 4000 512 8
 *     /tmp/attention_ab decode KEYS REPS            # B's task split of one token, e.g. decode 16 30
 * prefill: a prompt of TOKENS after DEPTH keys, in the engine's tasks of 126 items (14 tokens),
 * best of REPS calls of each alternately. decode: B alone, one token, the time of each task of
 * whole GQA groups ([0,3) [3,6) [6,9)) and of the split halves ([0,5) [5,9)); the busier of two
 * threads takes two groups, or the larger half.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* simd_internal.h's el_kv_rows: an f16 cache here (the quantized types go through the same code
 * after their conversion to f32). */
typedef struct {
    const uint8_t *base;
    int32_t type, elems_log2;
    int64_t block_bytes;
} kv_rows;

typedef void attn_fn(float *, const float *, const kv_rows *, const kv_rows *, const int32_t *, const int32_t *,
                     const int32_t *, int64_t, int64_t, int64_t, int64_t, int64_t, float, int32_t, int64_t, int64_t);
attn_fn a_attn, b_attn;

/* ops_avx2.c's RoPE and its conversion of the other KV types call the references; nothing here
 * runs them. */
void el_rope_ref(void) { abort(); }
void el_kv_rows_to_f32(void) { abort(); }

enum { H = 9, KVH = 3, HD = 64, BS = 16 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static float rnd(void) { return (float)rand() / RAND_MAX * 2 - 1; }

typedef struct {
    int n_tokens, n_blocks;
    uint16_t *k, *v;
    int32_t *table, *seq, *lens;
    float *q;
} attn_case;

/* One sequence: n_tokens queries at the end of depth + n_tokens keys. */
static attn_case make_case(const int depth, const int n_tokens) {
    attn_case c = {n_tokens, (depth + n_tokens + BS - 1) / BS, 0, 0, 0, 0, 0, 0};
    const int64_t n = (int64_t)c.n_blocks * BS * KVH * HD;
    c.k = malloc(2 * n);
    c.v = malloc(2 * n);
    for (int64_t i = 0; i < n; i++) {
        c.k[i] = _cvtss_sh(2 * rnd(), 0);
        c.v[i] = _cvtss_sh(rnd(), 0);
    }
    c.table = malloc(4 * c.n_blocks);
    for (int i = 0; i < c.n_blocks; i++) c.table[i] = i;
    c.seq = calloc(n_tokens, 4);
    c.lens = malloc(4 * n_tokens);
    for (int t = 0; t < n_tokens; t++) c.lens[t] = depth + t + 1;
    c.q = malloc(4 * (size_t)n_tokens * H * HD);
    for (int64_t i = 0; i < (int64_t)n_tokens * H * HD; i++) c.q[i] = rnd();
    return c;
}

static void call(attn_fn *f, const attn_case *c, float *out, const int64_t begin, const int64_t end) {
    const kv_rows k = {(const uint8_t *)c->k, 1 /* EL_TYPE_F16 */, 0, 2}, v = {(const uint8_t *)c->v, 1, 0, 2};
    f(out, c->q, &k, &v, c->table, c->seq, c->lens, H, KVH, HD, BS, c->n_blocks, 0.125f, 0, begin, end);
}

static int prefill(const int depth, const int n_tokens, const int reps) {
    const attn_case c = make_case(depth, n_tokens);
    const int64_t items = (int64_t)n_tokens * H;
    float *out[2] = {malloc(4 * items * HD), malloc(4 * items * HD)};
    double best[2] = {1e9, 1e9};
    for (int r = 0; r < reps; r++) {
        for (int w = 0; w < 2; w++) {
            const double t0 = now();
            for (int64_t b = 0; b < items; b += 126) call(w ? b_attn : a_attn, &c, out[w], b, b + 126 < items ? b + 126 : items);
            const double dt = now() - t0;
            if (dt < best[w]) best[w] = dt;
        }
    }
    const int same = memcmp(out[0], out[1], 4 * items * HD) == 0;
    printf("prefill: %d tokens after %d keys: A %.2f ms, B %.2f ms (%.3fx), outputs %s\n", n_tokens, depth,
           best[0] * 1e3, best[1] * 1e3, best[0] / best[1], same ? "identical" : "DIFFER");
    return same ? 0 : 1;
}

static double task_us(const attn_case *c, float *out, const int64_t begin, const int64_t end, const int reps) {
    double best = 1e9;
    for (int r = 0; r < reps; r++) {
        const double t0 = now();
        for (int k = 0; k < 20; k++) call(b_attn, c, out, begin, end);
        const double dt = (now() - t0) / 20;
        if (dt < best) best = dt;
    }
    return best * 1e6;
}

static int decode(const int keys, const int reps) {
    const attn_case c = make_case(keys - 1, 1);
    float *out = malloc(4 * H * HD);
    const double g0 = task_us(&c, out, 0, 3, reps), g1 = task_us(&c, out, 3, 6, reps), g2 = task_us(&c, out, 6, 9, reps);
    const double lo = task_us(&c, out, 0, 5, reps), hi = task_us(&c, out, 5, 9, reps);
    const double groups = g0 + g1 > g2 ? g0 + g1 : g2, halves = lo > hi ? lo : hi;
    printf("decode: %d keys: groups %.2f %.2f %.2f us, halves %.2f %.2f us; busier thread %.2f -> %.2f us (%.3fx)\n",
           keys, g0, g1, g2, lo, hi, groups, halves, groups / halves);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "prefill") == 0) return prefill(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
    if (argc == 4 && strcmp(argv[1], "decode") == 0) return decode(atoi(argv[2]), atoi(argv[3]));
    fprintf(stderr, "usage: %s prefill DEPTH TOKENS REPS | decode KEYS REPS\n", argv[0]);
    return 2;
}

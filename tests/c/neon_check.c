/*
 * neon_check.c: the NEON kernels (csrc/quants_neon.c) against the scalar references, bit for bit,
 * on random data. Built for AArch64 and run under qemu-aarch64 by tests/neon_qemu.rs; exits 0
 * when every comparison agrees (and NEON was detected and chosen), 1 otherwise.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edge_kernels.h"

static uint64_t rng = 0x9E3779B97F4A7C15ULL;

static double uniform(void) { /* [0, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* Normal values whose scale changes block by block (1e-3 .. 1e2), so the scales vary too. */
static void fill(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i += 32) {
        const double scale = pow(10.0, -3.0 + 5.0 * uniform());
        for (int64_t j = i; j < i + 32 && j < n; j++) {
            const double u = uniform() + 1e-12, v = uniform();
            x[j] = (float)(scale * sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
        }
    }
}

static int failures = 0, checks = 0;

static void same(const float *got, const float *want, int64_t n, const char *what, int32_t type, int64_t a, int64_t b) {
    for (int64_t i = 0; i < n; i++) {
        checks++;
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0) {
            if (failures++ < 20) {
                fprintf(stderr, "%s type %d (%lld, %lld) element %lld: neon %.9g, scalar %.9g\n", what, type,
                        (long long)a, (long long)b, (long long)i, got[i], want[i]);
            }
        }
    }
}

static void *quantized(int32_t type, const float *x, int64_t rows, int64_t n) {
    const int64_t rb = n / el_type_block_size(type) * el_type_block_bytes(type);
    uint8_t *q = aligned_alloc(64, (size_t)((rows * rb + 63) / 64 * 64));
    for (int64_t r = 0; r < rows; r++) {
        if (el_quantize_row(type, x + r * n, q + r * rb, n) != EL_OK) {
            fprintf(stderr, "quantize type %d failed\n", type);
            exit(1);
        }
    }
    return q;
}

static void on(int32_t isa) {
    if (el_isa_set(isa) != EL_OK) {
        fprintf(stderr, "el_isa_set(%d) refused\n", isa);
        exit(1);
    }
}

/* n_blocks IQ blocks of random bytes (all valid) with a random finite f16 super-scale d of either
 * sign; every eighth block all ones but d (the largest sub-scales and indices). */
static uint8_t *iq_blocks(int32_t type, int64_t n_blocks) {
    const int64_t bb = el_type_block_bytes(type);
    uint8_t *w = malloc((size_t)(n_blocks * bb));
    for (int64_t i = 0; i < n_blocks; i++) {
        uint8_t *blk = w + i * bb;
        for (int64_t j = 0; j < bb; j++) blk[j] = i % 8 == 7 ? 0xff : (uint8_t)(uniform() * 256.0);
        const uint16_t d = (uint16_t)((uniform() < 0.5 ? 0x8000 : 0) | (0x1000 + (int)(uniform() * 0x2c00)));
        if (type == EL_TYPE_IQ1_M) { /* d's nibbles in the top nibbles of the four scale words */
            for (int k = 0; k < 4; k++) {
                uint16_t word;
                memcpy(&word, blk + 48 + 2 * k, 2);
                word = (uint16_t)((word & 0x0fff) | (((d >> (4 * k)) & 0xf) << 12));
                memcpy(blk + 48 + 2 * k, &word, 2);
            }
        } else if (type == EL_TYPE_MXFP4) { /* an E8M0 scale byte: 2^-18 .. 2^11 */
            blk[0] = (uint8_t)(110 + (int)(uniform() * 30.0));
        } else {
            memcpy(blk, &d, 2);
        }
    }
    return w;
}

/* The IQ types and MXFP4 (csrc/quants_iq_neon.c): vec_dot and matmul on random blocks. */
static void check_iq(void) {
    const int32_t types[] = {EL_TYPE_IQ4_NL, EL_TYPE_IQ4_XS, EL_TYPE_IQ3_S, EL_TYPE_IQ3_XXS, EL_TYPE_IQ2_XXS,
                             EL_TYPE_IQ2_XS, EL_TYPE_IQ2_S,  EL_TYPE_IQ1_S, EL_TYPE_IQ1_M, EL_TYPE_MXFP4};
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
        const int32_t type = types[t], at = el_type_vec_dot_type(type);
        const int64_t n = 1536, n_out = 12, n_rows = 5, bs = el_type_block_size(type);
        uint8_t *w = iq_blocks(type, n_out * n / bs);
        float *xa = malloc(sizeof(float) * (size_t)(n_rows * n));
        fill(xa, n_rows * n);
        on(EL_ISA_SCALAR);
        uint8_t *a = quantized(at, xa, n_rows, n);
        const int64_t wrb = n / bs * el_type_block_bytes(type), arb = n / el_type_block_size(at) * el_type_block_bytes(at);
        float want[12 * 5], got[12 * 5];
        for (int64_t o = 0; o < n_out; o++) {
            for (int64_t r = 0; r < n_rows; r++) {
                on(EL_ISA_SCALAR);
                el_vec_dot(type, n, w + o * wrb, a + r * arb, &want[0]);
                on(EL_ISA_NEON);
                el_vec_dot(type, n, w + o * wrb, a + r * arb, &got[0]);
                same(got, want, 1, "iq vec_dot", type, o, r);
            }
        }
        on(EL_ISA_SCALAR);
        el_matmul(type, w, wrb, a, arb, want, n_out, n, n_rows, 0, n_out);
        on(EL_ISA_NEON);
        el_matmul(type, w, wrb, a, arb, got, n_out, n, n_rows, 0, n_out);
        same(got, want, n_rows * n_out, "iq matmul", type, n_rows, n);
        free(w);
        free(xa);
        free(a);
    }
}

/* Mamba-2's scan (el_ssm_scan: NEON for each head's channels in fours) against the reference:
 * outputs and states, heads of 1 to 21 channels, state sizes of 1 to 40, 1 to 5 tokens. */
static void check_ssm_scan(void) {
    for (int64_t shape = 0; shape < 24; shape++) {
        const int64_t n_group = 1 + shape % 2, n_head = n_group * (1 + shape % 3), head_dim = 1 + (shape * 5) % 21;
        const int64_t d_state = 1 + (shape * 7) % 40, n_tokens = 1 + shape % 5;
        const int64_t d_inner = n_head * head_dim, bc = n_group * d_state, stride = d_inner + 2 * bc + n_head;
        const int64_t n_state = d_inner * d_state;
        float *rows = malloc(sizeof(float) * (size_t)(n_tokens * stride));
        float *bias = malloc(sizeof(float) * (size_t)n_head), *a = malloc(sizeof(float) * (size_t)n_head);
        float *s0 = malloc(sizeof(float) * (size_t)n_state), *s1 = malloc(sizeof(float) * (size_t)n_state);
        float *y0 = malloc(sizeof(float) * (size_t)(n_tokens * d_inner));
        float *y1 = malloc(sizeof(float) * (size_t)(n_tokens * d_inner));
        fill(rows, n_tokens * stride);
        fill(bias, n_head);
        fill(a, n_head);
        for (int64_t h = 0; h < n_head; h++) a[h] = -1.0f - 4.0f * a[h] * a[h];
        fill(s0, n_state);
        memcpy(s1, s0, sizeof(float) * (size_t)n_state);
        const float *dt = rows + d_inner + 2 * bc;
        on(EL_ISA_SCALAR);
        el_ssm_scan(s0, 0, rows, stride, dt, stride, bias, a, rows + d_inner, rows + d_inner + bc, stride,
                    n_tokens, n_head, head_dim, d_state, n_group, y0);
        on(EL_ISA_NEON);
        el_ssm_scan(s1, 0, rows, stride, dt, stride, bias, a, rows + d_inner, rows + d_inner + bc, stride,
                    n_tokens, n_head, head_dim, d_state, n_group, y1);
        same(y1, y0, n_tokens * d_inner, "ssm_scan y", 0, head_dim, d_state);
        same(s1, s0, n_state, "ssm_scan state", 0, head_dim, d_state);
        free(rows);
        free(bias);
        free(a);
        free(s0);
        free(s1);
        free(y0);
        free(y1);
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "expect-scalar") == 0) { /* a CPU without the dot product */
        const int ok = !el_isa_available(EL_ISA_NEON) && el_isa_get() == EL_ISA_SCALAR &&
                       el_isa_set(EL_ISA_NEON) == EL_ERR_TYPE;
        printf("without the dot product: isa %d, NEON %s\n", el_isa_get(), ok ? "refused" : "NOT refused");
        return ok ? 0 : 1;
    }
    if (!el_isa_available(EL_ISA_NEON) || el_isa_get() != EL_ISA_NEON) {
        fprintf(stderr, "NEON with the dot-product instructions was not detected and chosen (isa %d)\n",
                el_isa_get());
        return 1;
    }
    const int32_t types[] = {EL_TYPE_Q4_0, EL_TYPE_Q4_1, EL_TYPE_Q5_0, EL_TYPE_Q5_1, EL_TYPE_Q8_0, EL_TYPE_Q2_K,
                             EL_TYPE_Q3_K, EL_TYPE_Q4_K, EL_TYPE_Q5_K, EL_TYPE_Q6_K, EL_TYPE_Q8_K};
    const int64_t nbs[] = {1, 3, 18, 48};
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
        const int32_t type = types[t], at = el_type_vec_dot_type(type);
        for (size_t k = 0; k < sizeof(nbs) / sizeof(nbs[0]); k++) {
            const int64_t bs = el_type_block_size(type), n = bs * nbs[k], n_out = 24, n_rows = 9;
            float *xw = malloc(sizeof(float) * (size_t)(n_out * n)), *xa = malloc(sizeof(float) * (size_t)(n_rows * n));
            fill(xw, n_out * n);
            fill(xa, n_rows * n);
            on(EL_ISA_SCALAR); /* the inputs from the reference quantizers */
            uint8_t *w = quantized(type, xw, n_out, n), *a = quantized(at, xa, n_rows, n);
            const int64_t wrb = n / bs * el_type_block_bytes(type), arb = n / bs * el_type_block_bytes(at);
            float want[24 * 9], got[24 * 9];
            /* vec_dot, and matmul over every row count (whole and partial column ranges) */
            for (int64_t o = 0; o < n_out; o++) {
                for (int64_t r = 0; r < n_rows; r++) {
                    on(EL_ISA_SCALAR);
                    el_vec_dot(type, n, w + o * wrb, a + r * arb, &want[0]);
                    on(EL_ISA_NEON);
                    el_vec_dot(type, n, w + o * wrb, a + r * arb, &got[0]);
                    same(got, want, 1, "vec_dot", type, o, r);
                }
            }
            for (int64_t rows = 1; rows <= n_rows; rows++) {
                on(EL_ISA_SCALAR);
                el_matmul(type, w, wrb, a, arb, want, n_out, n, rows, 0, n_out);
                on(EL_ISA_NEON);
                memset(got, 0, sizeof(got));
                el_matmul(type, w, wrb, a, arb, got, n_out, n, rows, 0, n_out);
                same(got, want, rows * n_out, "matmul", type, rows, n);
            }
            if (el_type_has_x8(type)) {
                uint8_t *w8 = aligned_alloc(64, (size_t)((n_out * wrb + 63) / 64 * 64));
                if (el_repack_x8(type, w, n_out, n / bs, w8) != EL_OK) return 1;
                for (int64_t rows = 1; rows <= n_rows; rows++) {
                    on(EL_ISA_SCALAR);
                    el_matmul(type, w, wrb, a, arb, want, n_out, n, rows, 0, n_out);
                    on(EL_ISA_NEON);
                    memset(got, 0, sizeof(got));
                    el_matmul_x8(type, w8, a, arb, got, n_out, n, rows, 8, n_out); /* groups 1..2 */
                    el_matmul_x8(type, w8, a, arb, got, n_out, n, rows, 0, 8);     /* group 0 */
                    same(got, want, rows * n_out, "matmul_x8", type, rows, n);
                }
                free(w8);
            }
            free(xw);
            free(xa);
            free(w);
            free(a);
        }
    }
    check_iq();
    check_ssm_scan();
    printf("%d of %d NEON results differ from the scalar references\n", failures, checks);
    return failures == 0 ? 0 : 1;
}

/*
 * el_blocks.h: the quantized block layouts, one struct per type, bit-compatible with llama.cpp's
 * ggml-common.h. Shared by the scalar reference kernels (quants.c, quants_k.c) and their SIMD
 * variants (quants_avx2.c, quants_k_avx2.c), so each layout is written down once. Not part of the
 * Rust boundary. The block sizes come from el_types.h, and each struct is checked against its
 * type's EL_<T>_BYTES there.
 */
#ifndef EL_BLOCKS_H
#define EL_BLOCKS_H

#include <stdint.h>

#include "el_types.h"

#define QK EL_QK        /* elements per block of the 32-element types */
#define QK_K EL_QK_K    /* elements per K-quant super-block */
#define K_SCALE_SIZE 12 /* bytes of packed 6-bit scales in a q3_K/q4_K/q5_K block */

/* ---- 32-element blocks ---------------------------------------------------------------------- */

/* x[i] = d * (q[i] - 8), q a nibble. */
typedef struct {
    uint16_t d;          /* f16 scale */
    uint8_t qs[QK / 2];  /* element j in the low nibble of qs[j], element j + 16 in the high nibble */
} el_block_q4_0;
_Static_assert(sizeof(el_block_q4_0) == EL_Q4_0_BYTES, "block_q4_0 layout");

/* x[i] = d * q[i] + m. */
typedef struct {
    uint16_t d, m;       /* f16 scale and min */
    uint8_t qs[QK / 2];  /* as q4_0 */
} el_block_q4_1;
_Static_assert(sizeof(el_block_q4_1) == EL_Q4_1_BYTES, "block_q4_1 layout");

/* Block i of eight Q4_1 rows interleaved (el_repack_x8): the rows' scales and mins side by side
 * (one load each), then their quants four bytes at a time: qs[k][c] is bytes 4k..4k+3 of row c's
 * qs, so one 32-byte load holds the same eight elements (4k..4k+3 in the low nibbles, 4k+16..4k+19
 * in the high ones) of every row, a row per 32-bit lane. */
typedef struct {
    uint16_t d[8], m[8];
    uint8_t qs[4][8][4];
} el_block_q4_1x8;
_Static_assert(sizeof(el_block_q4_1x8) == 8 * sizeof(el_block_q4_1), "block_q4_1x8 layout");

/* x[i] = d * (q[i] - 16), q 5 bits: nibble from qs as q4_0, fifth bit i of qh (little-endian). */
typedef struct {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[QK / 2];
} el_block_q5_0;
_Static_assert(sizeof(el_block_q5_0) == EL_Q5_0_BYTES, "block_q5_0 layout");

/* x[i] = d * q[i] + m, q 5 bits as q5_0. */
typedef struct {
    uint16_t d, m;
    uint8_t qh[4];
    uint8_t qs[QK / 2];
} el_block_q5_1;
_Static_assert(sizeof(el_block_q5_1) == EL_Q5_1_BYTES, "block_q5_1 layout");

/* x[i] = d * qs[i]. */
typedef struct {
    uint16_t d;
    int8_t qs[QK];
} el_block_q8_0;
_Static_assert(sizeof(el_block_q8_0) == EL_Q8_0_BYTES, "block_q8_0 layout");

/* Block i of eight Q8_0 rows interleaved (el_repack_x8): the rows' scales side by side, then
 * their quants four bytes at a time: qs[k][c] is elements 4k..4k+3 of row c, so one 32-byte load
 * holds the same four elements of every row, a row per 32-bit lane. */
typedef struct {
    uint16_t d[8];
    int8_t qs[8][8][4];
} el_block_q8_0x8;
_Static_assert(sizeof(el_block_q8_0x8) == 8 * sizeof(el_block_q8_0), "block_q8_0x8 layout");

/* x[i] = d * qs[i]; s = d * sum(qs) carries the block sum that a Q4_1/Q5_1 min multiplies. */
typedef struct {
    uint16_t d, s;
    int8_t qs[QK];
} el_block_q8_1;
_Static_assert(sizeof(el_block_q8_1) == EL_Q8_1_BYTES, "block_q8_1 layout");

/* ---- K-quant super-blocks of 256 elements --------------------------------------------------- */

/* x = d * (scales[s] & 0xF) * q - dmin * (scales[s] >> 4), q 2 bits, 16 sub-blocks of 16. */
typedef struct {
    uint8_t scales[QK_K / 16]; /* 4-bit scale (low) and min (high) per sub-block */
    uint8_t qs[QK_K / 4];      /* element h*128 + j*32 + l at bits 2j of qs[h*32 + l] */
    uint16_t d, dmin;          /* f16 super-scales */
} el_block_q2_K;
_Static_assert(sizeof(el_block_q2_K) == EL_Q2_K_BYTES, "block_q2_K layout");

/* x = d * (scale[s] - 32) * (q - 4), q 3 bits, 16 sub-blocks of 16. */
typedef struct {
    uint8_t hmask[QK_K / 8];   /* high bit of element e at bit e/32 of hmask[e % 32] */
    uint8_t qs[QK_K / 4];      /* low 2 bits, laid out as q2_K */
    uint8_t scales[K_SCALE_SIZE]; /* 16 6-bit scales: low nibbles in bytes 0-7, top bits in 8-11 */
    uint16_t d;
} el_block_q3_K;
_Static_assert(sizeof(el_block_q3_K) == EL_Q3_K_BYTES, "block_q3_K layout");

/* x = d * scale[s] * q - dmin * min[s], q 4 bits, 8 sub-blocks of 32, 6-bit scales and mins. */
typedef struct {
    uint16_t d, dmin;
    uint8_t scales[K_SCALE_SIZE]; /* packed as get_scale_min_k4 reads them */
    uint8_t qs[QK_K / 2];         /* element c*64 + l in the low nibble of qs[c*32 + l], + 32 high */
} el_block_q4_K;
_Static_assert(sizeof(el_block_q4_K) == EL_Q4_K_BYTES, "block_q4_K layout");

/* As q4_K with a fifth bit: element e's at bit e/32 of qh[e % 32]. */
typedef struct {
    uint16_t d, dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
} el_block_q5_K;
_Static_assert(sizeof(el_block_q5_K) == EL_Q5_K_BYTES, "block_q5_K layout");

/* x = d * scales[s] * (q - 32), q 6 bits, 16 sub-blocks of 16 with int8 scales. */
typedef struct {
    uint8_t ql[QK_K / 2];     /* low 4 bits */
    uint8_t qh[QK_K / 4];     /* high 2 bits */
    int8_t scales[QK_K / 16];
    uint16_t d;
} el_block_q6_K;
_Static_assert(sizeof(el_block_q6_K) == EL_Q6_K_BYTES, "block_q6_K layout");

/* Super-block i of eight K-quant rows interleaved (el_repack_x8): every field of the eight rows'
 * blocks side by side, the f16 scales two bytes at a time (d[c] is row c's d), everything else
 * four bytes at a time (field[k][c] is bytes 4k..4k+3 of row c's field), in the block's field
 * order. So one 32-byte load holds the same four bytes of every row, a row per 32-bit lane, and
 * each field of the eight rows is one stream: byte j of row c's block lies at
 * 8 (j - j % u) + u c + j % u of the group's, u the field's unit (2 or 4), the field starting at a
 * multiple of u. */

/* Q4_K: scales[k][c] holds row c's packed scale bytes 4k..4k+3; qs[8p + k][c] row c's quants
 * 32p + 4k..+3, so the low nibbles are elements 64p + 4k..+3 (sub-block 2p) and the high ones
 * 64p + 32 + 4k..+3 (sub-block 2p + 1). */
typedef struct {
    uint16_t d[8], dmin[8];
    uint8_t scales[K_SCALE_SIZE / 4][8][4];
    uint8_t qs[QK_K / 8][8][4];
} el_block_q4_Kx8;
_Static_assert(sizeof(el_block_q4_Kx8) == 8 * sizeof(el_block_q4_K), "block_q4_Kx8 layout");

/* Q5_K: as Q4_K, with qh[m][c] row c's fifth bits of elements 4m..4m+3 of each run (bit b: run b). */
typedef struct {
    uint16_t d[8], dmin[8];
    uint8_t scales[K_SCALE_SIZE / 4][8][4];
    uint8_t qh[QK_K / 32][8][4];
    uint8_t qs[QK_K / 8][8][4];
} el_block_q5_Kx8;
_Static_assert(sizeof(el_block_q5_Kx8) == 8 * sizeof(el_block_q5_K), "block_q5_Kx8 layout");

/* Q6_K: ql[16h + 8s + m][c] row c's low nibbles of elements 4m..4m+3 of runs 4h + s (low) and
 * 4h + s + 2 (high); qh[8h + m][c] the two top bits of those elements of runs 4h..4h+3 (bits 2k:
 * run 4h + k); scales[k][c] row c's scales 4k..4k+3. */
typedef struct {
    uint8_t ql[QK_K / 8][8][4];
    uint8_t qh[QK_K / 16][8][4];
    int8_t scales[QK_K / 64][8][4];
    uint16_t d[8];
} el_block_q6_Kx8;
_Static_assert(sizeof(el_block_q6_Kx8) == 8 * sizeof(el_block_q6_K), "block_q6_Kx8 layout");

/* x = d * qs; bsums[g] = sum of qs[16g .. 16g + 16), for the weight types' mins. */
typedef struct {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
} el_block_q8_K;
_Static_assert(sizeof(el_block_q8_K) == EL_Q8_K_BYTES, "block_q8_K layout");

/* ---- IQ types (codebook and non-linear quants; decoded in quants_iq.c) ----------------------- */

#define QK4_NL EL_IQ4_NL_ELEMS /* elements per IQ4_NL block */

/* x[i] = d * kvalues_iq4nl[q[i]], q a nibble laid out as q4_0. */
typedef struct {
    uint16_t d;
    uint8_t qs[QK4_NL / 2];
} el_block_iq4_nl;
_Static_assert(sizeof(el_block_iq4_nl) == EL_IQ4_NL_BYTES, "block_iq4_nl layout");

#define QK_MXFP4 EL_MXFP4_ELEMS /* elements per MXFP4 block */

/* x[i] = 2^(e - 128) * kvalues_mxfp4[q[i]] (the E2M1 values doubled, so the E8M0 scale 2^(e - 127)
 * is halved), q a nibble laid out as q4_0. OCP microscaling FP4, gpt-oss's expert weights. */
typedef struct {
    uint8_t e;
    uint8_t qs[QK_MXFP4 / 2];
} el_block_mxfp4;
_Static_assert(sizeof(el_block_mxfp4) == EL_MXFP4_BYTES, "block_mxfp4 layout");

/* x = d * (ls[s] - 32) * kvalues_iq4nl[q], 8 sub-blocks of 32 with 6-bit scales ls: low 4 bits in
 * the nibbles of scales_l, high 2 bits at bits 2s of scales_h; quants as q4_0 per sub-block. */
typedef struct {
    uint16_t d;
    uint16_t scales_h;
    uint8_t scales_l[QK_K / 64];
    uint8_t qs[QK_K / 2];
} el_block_iq4_xs;
_Static_assert(sizeof(el_block_iq4_xs) == EL_IQ4_XS_BYTES, "block_iq4_xs layout");

/* 8 sub-blocks of 32, each four 8-element grid points: qs[4s .. 4s + 2) hold four 8-bit indices into
 * iq2xxs_grid, qs[4s + 2 .. 4s + 4) four 7-bit sign indices and a 4-bit scale in the top bits. */
typedef struct {
    uint16_t d;
    uint16_t qs[QK_K / 8];
} el_block_iq2_xxs;
_Static_assert(sizeof(el_block_iq2_xxs) == EL_IQ2_XXS_BYTES, "block_iq2_xxs layout");

/* qs[k]: a 9-bit iq2xs_grid index and a 7-bit sign index; 4-bit scales, two per sub-block of 32. */
typedef struct {
    uint16_t d;
    uint16_t qs[QK_K / 8];
    uint8_t scales[QK_K / 32];
} el_block_iq2_xs;
_Static_assert(sizeof(el_block_iq2_xs) == EL_IQ2_XS_BYTES, "block_iq2_xs layout");

/* 10-bit iq2s_grid indices (low 8 bits in qs[0..32), high 2 in qh), explicit signs in qs[32..64). */
typedef struct {
    uint16_t d;
    uint8_t qs[QK_K / 4];
    uint8_t qh[QK_K / 32];
    uint8_t scales[QK_K / 32];
} el_block_iq2_s;
_Static_assert(sizeof(el_block_iq2_s) == EL_IQ2_S_BYTES, "block_iq2_s layout");

/* 64 8-bit iq3xxs_grid indices (4 elements each), then per sub-block a uint32 of four 7-bit sign
 * indices and a 4-bit scale. */
typedef struct {
    uint16_t d;
    uint8_t qs[3 * QK_K / 8];
} el_block_iq3_xxs;
_Static_assert(sizeof(el_block_iq3_xxs) == EL_IQ3_XXS_BYTES, "block_iq3_xxs layout");

/* 9-bit iq3s_grid indices (low 8 in qs, high bit in qh), explicit signs, 4-bit scales per 32. */
typedef struct {
    uint16_t d;
    uint8_t qs[QK_K / 4];
    uint8_t qh[QK_K / 32];
    uint8_t signs[QK_K / 8];
    uint8_t scales[QK_K / 64];
} el_block_iq3_s;
_Static_assert(sizeof(el_block_iq3_s) == EL_IQ3_S_BYTES, "block_iq3_s layout");

/* 11-bit iq1s_grid indices (low 8 in qs, high 3 in qh), per sub-block a 3-bit scale and the sign
 * of a +-1/8 shift in qh. */
typedef struct {
    uint16_t d;
    uint8_t qs[QK_K / 8];
    uint16_t qh[QK_K / 32];
} el_block_iq1_s;
_Static_assert(sizeof(el_block_iq1_s) == EL_IQ1_S_BYTES, "block_iq1_s layout");

/* As iq1_s with 3-bit scales per 16 elements and shift signs per 8; the f16 super-scale is spread
 * over the top nibbles of the four uint16 scale words. */
typedef struct {
    uint8_t qs[QK_K / 8];
    uint8_t qh[QK_K / 16];
    uint8_t scales[QK_K / 32];
} el_block_iq1_m;
_Static_assert(sizeof(el_block_iq1_m) == EL_IQ1_M_BYTES, "block_iq1_m layout");

#endif /* EL_BLOCKS_H */

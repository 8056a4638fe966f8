/*
 * el_iq_tables.cuh: the IQ types' codebooks (sign patterns, grids, the IQ4 non-linear values) for
 * the CUDA kernels, in constant memory (about 33 KB of the 64 KB): csrc/el_iq_tables.h itself,
 * the tables the C kernels read (generated from llama.cpp's ggml-common.h), with EL_IQ_TABLE
 * set to a constant-memory qualifier, so the GPU and the CPU read one copy of the source.
 * Included by el_iq.cuh; src/cuda/nvrtc.rs embeds both for NVRTC.
 */
#ifndef EL_IQ_TABLES_CUH
#define EL_IQ_TABLES_CUH

#define EL_IQ_TABLE static __constant__ const
#include "../el_iq_tables.h"

#endif /* EL_IQ_TABLES_CUH */

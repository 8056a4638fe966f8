/*
 * el_emu_runtime.h: the emulator's scheduler as the launch table (el_emu_kernels.cpp) sees it:
 * run a body once per CUDA thread of every block of a grid, each thread a fiber.
 */
#ifndef EL_EMU_RUNTIME_H
#define EL_EMU_RUNTIME_H

#include <stddef.h>

#include "el_cuda_emu.h"

/* Flag of el_emu_run_grid: start a block's threads, and resume them after every barrier, last
 * thread first (kernels must not depend on the order threads run between barriers). */
#define EL_EMU_REVERSE 1

/* Runs body(ctx) for every thread of grid x block, blocks one after another, threads as fibers.
 * Returns 0, or 1 with a one-line message in err (a barrier not every running thread reaches, a
 * shuffle from a lane that has returned, a block of more than 1024 threads). */
int el_emu_run_grid(el_dim3 grid, el_dim3 block, int flags, void (*body)(void *), void *ctx, const char *name,
                    char *err, size_t err_len);

#endif /* EL_EMU_RUNTIME_H */

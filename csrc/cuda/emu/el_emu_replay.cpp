/*
 * el_emu_replay.cpp: runs again, under AddressSanitizer, every launch an emulated device recorded
 * (src/cuda/emu.rs, Emu::with_trace). Each buffer a launch points into is allocated with malloc to
 * its exact size and filled with the bytes it held at launch time, so a kernel that reads or
 * writes one byte outside the buffers the Rust launch wrappers checked is reported by ASan.
 * tests/cuda_kernels.rs compiles it with the emulator (-fsanitize=address) and runs it.
 *
 * Usage: el_emu_replay TRACE. Prints "replayed N launches" and exits 0, or names the failed launch.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

struct el_emu_arg {
    int32_t kind;
    int32_t pad;
    uint64_t bits;
};
extern "C" int el_emu_launch(const char *name, const uint32_t grid[3], const uint32_t block[3],
                             const el_emu_arg *args, int n_args, int flags, char *err, size_t err_len);

static FILE *g_in;

static bool read_exact(void *p, size_t n) { return fread(p, 1, n, g_in) == n; }

static uint32_t u32() {
    uint32_t v;
    if (!read_exact(&v, 4)) { fprintf(stderr, "truncated trace\n"); exit(2); }
    return v;
}

static uint64_t u64() {
    uint64_t v;
    if (!read_exact(&v, 8)) { fprintf(stderr, "truncated trace\n"); exit(2); }
    return v;
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: el_emu_replay TRACE\n"); return 2; }
    g_in = fopen(argv[1], "rb");
    if (!g_in) { perror(argv[1]); return 2; }
    long n = 0;
    for (;;) {
        uint32_t name_len;
        if (fread(&name_len, 1, 4, g_in) != 4) break; /* end of the trace */
        std::string name(name_len, '\0');
        if (!read_exact(&name[0], name_len)) { fprintf(stderr, "truncated trace\n"); return 2; }
        uint32_t grid[3], block[3] = {0, 1, 1};
        for (uint32_t &g : grid) g = u32();
        block[0] = u32();
        const uint32_t n_args = u32();
        std::vector<el_emu_arg> args(n_args);
        std::vector<uint32_t> buf_of(n_args);
        for (uint32_t i = 0; i < n_args; i++) {
            args[i].kind = (int32_t)u32();
            args[i].pad = 0;
            buf_of[i] = u32();
            args[i].bits = u64();
        }
        const uint32_t n_bufs = u32();
        std::vector<unsigned char *> bufs(n_bufs);
        for (uint32_t b = 0; b < n_bufs; b++) {
            const uint64_t bytes = u64();
            bufs[b] = (unsigned char *)malloc(bytes);
            if (!bufs[b] || !read_exact(bufs[b], bytes)) { fprintf(stderr, "truncated trace\n"); return 2; }
        }
        for (uint32_t i = 0; i < n_args; i++) {
            if (args[i].kind == 0) args[i].bits += (uint64_t)(uintptr_t)bufs[buf_of[i]];
        }
        char err[512];
        if (el_emu_launch(name.c_str(), grid, block, args.data(), (int)n_args, 0, err, sizeof err) != 0) {
            fprintf(stderr, "launch %ld (%s): %s\n", n, name.c_str(), err);
            return 1;
        }
        for (unsigned char *p : bufs) free(p);
        n++;
    }
    printf("replayed %ld launches\n", n);
    return 0;
}

/*
 * el_cuda_emu.cpp: the emulator's scheduler. A block's threads are ucontext fibers run on the
 * calling OS thread: each runs until it reaches a barrier or returns, then the scheduler releases
 * every barrier that all of its running threads have reached (a warp's for __syncwarp and
 * shuffles, the block's for __syncthreads) and runs the released threads again. Threads that
 * have returned no longer count. If threads are left waiting and no barrier can be released, the
 * launch fails with an error instead of hanging.
 *
 * Switching: a fiber is entered the first time through swapcontext, then switched with
 * _setjmp/_longjmp, which unlike swapcontext make no system call (the signal mask is never
 * touched). A fiber outlives its block: once its thread returns it parks at the top of its loop,
 * and the next block (of this launch or a later one) resumes it there to run that block's thread
 * of the same index, so a block costs no context creation (a fiber left inside a kernel by a
 * failed launch is made afresh). Under AddressSanitizer every switch is a swapcontext with ASan's
 * fiber annotations, and every block makes its fibers afresh.
 *
 * Everything is per OS thread (thread_local), so tests may launch from several threads at once.
 */
#undef _FORTIFY_SOURCE /* its longjmp check rejects jumps between stacks */
#include "el_emu_runtime.h"

#include <setjmp.h>
#include <stdio.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <string>
#include <vector>

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/common_interface_defs.h>
#ifndef EL_EMU_ASAN_SETJMP
#define EL_EMU_UCONTEXT_ONLY 1
#endif
#endif

thread_local el_emu_view el_emu_now;

namespace {

enum class St : unsigned char { Runnable, AtBlock, AtWarp, Done };

#ifdef __SANITIZE_ADDRESS__
constexpr size_t kStack = 32u << 10;
#else
constexpr size_t kStack = 256u << 10;
#endif
constexpr unsigned kMaxThreads = 1024;

struct Fiber {
    ucontext_t uc;
    jmp_buf jb;
    bool started; /* entered once: jb holds where it waits */
    bool parked;  /* waiting at the top of fiber_main's loop for its next block */
    St st;
    unsigned seq; /* shuffles this lane has done */
    char *stack;
    void *fake_stack; /* ASan's bookkeeping across switches */
};

struct Block {
    ucontext_t sched;
    jmp_buf sched_jb;
    Fiber *f;
    unsigned n, cur;
    el_dim3 dim;
    /* Per warp, two buffers of 32 values and the shuffle number each value was written at. */
    std::vector<uint64_t> xchg;
    std::vector<unsigned> tag;
    void (*body)(void *);
    void *ctx;
    std::string error;
    const void *sched_bottom;
    size_t sched_size;
};

/* Fiber stacks, kept for the next launch on this OS thread. */
struct Stacks {
    std::vector<char *> s;
    std::vector<Fiber> fibers;
    ~Stacks() {
        for (char *p : s) munmap(p, kStack);
    }
    bool reserve(unsigned n) {
        if (n > fibers.size()) {
            /* The parked fibers' records move: make every fiber afresh on its next block. */
            for (Fiber &f : fibers) f.started = false;
            fibers.resize(n);
        }
        while (s.size() < n) {
            void *p = mmap(nullptr, kStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (p == MAP_FAILED) return false;
            s.push_back((char *)p);
        }
        return true;
    }
};

thread_local Block *g_block;
thread_local Stacks g_stacks;

inline el_dim3 thread_index(const Block &b, unsigned i) {
    return el_dim3{i % b.dim.x, (i / b.dim.x) % b.dim.y, i / (b.dim.x * b.dim.y)};
}

/* Back to the scheduler, waiting in state st. */
void yield(St st) {
    Block *b = g_block;
    Fiber &me = b->f[b->cur];
    me.st = st;
#ifdef EL_EMU_UCONTEXT_ONLY
    __sanitizer_start_switch_fiber(&me.fake_stack, b->sched_bottom, b->sched_size);
    swapcontext(&me.uc, &b->sched);
    __sanitizer_finish_switch_fiber(me.fake_stack, &b->sched_bottom, &b->sched_size);
#else
    if (!_setjmp(me.jb)) _longjmp(b->sched_jb, 1);
#endif
}

#ifdef __SANITIZE_ADDRESS__
void fiber_main() {
    Block *b = g_block;
    __sanitizer_finish_switch_fiber(nullptr, &b->sched_bottom, &b->sched_size);
    b->body(b->ctx);
    b->f[b->cur].st = St::Done;
#ifdef EL_EMU_UCONTEXT_ONLY
    __sanitizer_start_switch_fiber(nullptr, b->sched_bottom, b->sched_size);
    /* returning resumes uc_link, the scheduler */
#else
    _longjmp(b->sched_jb, 1);
#endif
}
#else
/* Thread i has returned: back to the scheduler, parked until a block resumes this fiber. */
__attribute__((noinline)) void park(unsigned i) {
    Block *b = g_block;
    b->f[i].st = St::Done;
    b->f[i].parked = true;
    if (!_setjmp(b->f[i].jb)) _longjmp(b->sched_jb, 1);
}

/* One thread of every block this fiber is resumed for (g_block and the index are read afresh
 * each time: the block and the kernel change between launches). */
void fiber_main() {
    for (;;) {
        Block *b = g_block;
        const unsigned i = b->cur;
        b->f[i].parked = false;
        b->body(b->ctx);
        park(i);
    }
}
#endif

__attribute__((noinline)) void resume(Block &b, unsigned i) {
    b.cur = i;
    el_emu_now.thread_idx = thread_index(b, i);
    Fiber &f = b.f[i];
#ifdef EL_EMU_UCONTEXT_ONLY
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f.stack, kStack);
    swapcontext(&b.sched, &f.uc);
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
    if (!_setjmp(b.sched_jb)) {
        if (!f.started) {
            f.started = true;
            swapcontext(&b.sched, &f.uc); /* does not return: the fiber comes back by _longjmp */
        } else {
            _longjmp(f.jb, 1);
        }
    }
#endif
}

/* Releases every barrier all running threads of its scope have reached. Returns false when
 * threads wait and none can go on. Sets *done when every thread has returned. */
bool release(Block &b, bool *done) {
    unsigned live = 0, at_block = 0;
    bool released = false;
    for (unsigned w = 0; w * 32 < b.n; w++) {
        unsigned wl = 0, at_warp = 0;
        for (unsigned i = w * 32; i < b.n && i < w * 32 + 32; i++) {
            const St s = b.f[i].st;
            if (s == St::Done) continue;
            wl++;
            at_warp += s == St::AtWarp;
            at_block += s == St::AtBlock;
        }
        live += wl;
        if (wl > 0 && at_warp == wl) {
            for (unsigned i = w * 32; i < b.n && i < w * 32 + 32; i++)
                if (b.f[i].st == St::AtWarp) b.f[i].st = St::Runnable;
            released = true;
        }
    }
    *done = live == 0;
    if (released || live == 0) return true;
    if (at_block == live) {
        for (unsigned i = 0; i < b.n; i++)
            if (b.f[i].st == St::AtBlock) b.f[i].st = St::Runnable;
        return true;
    }
    return false;
}

/* A fresh context for fiber f on stack `stack`, entering fiber_main. */
__attribute__((noinline)) void make_fiber(Block &b, Fiber &f, char *stack) {
    f.started = false;
    f.parked = false;
    f.stack = stack;
    getcontext(&f.uc);
    f.uc.uc_stack.ss_sp = f.stack;
    f.uc.uc_stack.ss_size = kStack;
    f.uc.uc_link = &b.sched;
    makecontext(&f.uc, fiber_main, 0);
}

int run_block(Block &b, bool reverse) {
    for (unsigned i = 0; i < b.n; i++) {
        Fiber &f = b.f[i];
        f.st = St::Runnable;
        f.seq = 0;
        f.fake_stack = nullptr;
#ifndef __SANITIZE_ADDRESS__
        if (f.started && f.parked) continue; /* resumed at the top of its loop */
#endif
        make_fiber(b, f, g_stacks.s[i]);
    }
    for (;;) {
        for (unsigned k = 0; k < b.n; k++) {
            const unsigned i = reverse ? b.n - 1 - k : k;
            if (b.f[i].st == St::Runnable) resume(b, i);
            if (!b.error.empty()) return 1;
        }
        bool done = false;
        if (!release(b, &done)) {
            unsigned at_warp = 0, at_block = 0, gone = 0;
            for (unsigned i = 0; i < b.n; i++) {
                at_warp += b.f[i].st == St::AtWarp;
                at_block += b.f[i].st == St::AtBlock;
                gone += b.f[i].st == St::Done;
            }
            char m[200];
            snprintf(m, sizeof m,
                     "barrier deadlock: %u threads at __syncthreads, %u at a warp barrier or shuffle, %u returned",
                     at_block, at_warp, gone);
            b.error = m;
            return 1;
        }
        if (done) return 0;
    }
}

} // namespace

void el_emu_syncthreads(void) { yield(St::AtBlock); }

void el_emu_syncwarp(void) { yield(St::AtWarp); }

uint64_t el_emu_exchange(uint64_t mine, int src) {
    Block *b = g_block;
    const unsigned t = b->cur;
    const unsigned w = t / 32, lane = t % 32;
    const unsigned seq = b->f[t].seq;
    const size_t base = ((size_t)w * 2 + (seq & 1)) * 32;
    b->xchg[base + lane] = mine;
    b->tag[base + lane] = seq;
    yield(St::AtWarp);
    b->f[t].seq = seq + 1;
    const unsigned s = w * 32 + (unsigned)src;
    if (s >= b->n || b->tag[base + src] != seq) {
        if (b->error.empty()) {
            char m[200];
            snprintf(m, sizeof m, "thread %u shuffled from lane %d of warp %u, which %s", t, src, w,
                     s >= b->n ? "does not exist" : "has returned or did not take part");
            b->error = m;
        }
        return 0;
    }
    return b->xchg[base + src];
}

int el_emu_run_grid(el_dim3 grid, el_dim3 block, int flags, void (*body)(void *), void *ctx, const char *name,
                    char *err, size_t err_len) {
    const unsigned long long n = (unsigned long long)block.x * block.y * block.z;
    if (n == 0 || n > kMaxThreads) {
        snprintf(err, err_len, "kernel %s: a block of %llu threads (1 to %u)", name, n, kMaxThreads);
        return 1;
    }
    if (grid.x == 0 || grid.y == 0 || grid.z == 0) return 0;
    if (g_block) {
        snprintf(err, err_len, "kernel %s: launched from inside a kernel", name);
        return 1;
    }
    if (!g_stacks.reserve((unsigned)n)) {
        snprintf(err, err_len, "kernel %s: no memory for %llu fiber stacks", name, n);
        return 1;
    }
    Block b;
    b.f = g_stacks.fibers.data();
    b.n = (unsigned)n;
    b.dim = block;
    const unsigned n_warps = (b.n + 31) / 32;
    b.xchg.assign((size_t)n_warps * 64, 0);
    b.tag.assign((size_t)n_warps * 64, ~0u);
    b.body = body;
    b.ctx = ctx;
    b.sched_bottom = nullptr;
    b.sched_size = 0;
    el_emu_now.block_dim = block;
    el_emu_now.grid_dim = grid;
    g_block = &b;
    int rc = 0;
    for (unsigned z = 0; z < grid.z && rc == 0; z++)
        for (unsigned y = 0; y < grid.y && rc == 0; y++)
            for (unsigned x = 0; x < grid.x && rc == 0; x++) {
                el_emu_now.block_idx = el_dim3{x, y, z};
                std::fill(b.tag.begin(), b.tag.end(), ~0u);
                rc = run_block(b, (flags & EL_EMU_REVERSE) != 0);
                if (rc) snprintf(err, err_len, "kernel %s, block (%u, %u, %u): %s", name, x, y, z, b.error.c_str());
            }
    g_block = nullptr;
    return rc;
}

/* emu_sched.cc — the kernel interpreter's block runner: fibers, the schedule, __syncthreads,
 * warp primitives and shared memory (see emu.h for what this catches and what it cannot).
 *
 * A block's threads are fibers on the calling OS thread. The runner works in rounds: it
 * resumes every runnable thread once, in the schedule's order; each runs until it blocks at
 * a barrier or warp operation, or exits. After the round it releases what can be released
 * (warp groups whose lanes have all arrived, then the barrier when every live thread is at
 * it) and reports as kernel errors what can never be released.
 */
#include "emu.h"
#include "mma.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define PN_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PN_EMU_ASAN 1
#endif
#endif
#ifdef PN_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if !defined(__x86_64__) && !defined(PN_EMU_UCONTEXT)
#define PN_EMU_UCONTEXT 1
#endif
#ifdef PN_EMU_UCONTEXT
#include <ucontext.h>
#endif

bool pn_emu_run_grid(const char *name, dim3 grid, dim3 block, size_t dyn_shmem, const std::function<void()> &body);

thread_local pn_emu_builtins pn_emu_bi = {{0, 0, 0}, {0, 0, 0}, {1, 1, 1}, {1, 1, 1}};

/* ---- context switch ------------------------------------------------------------------ */
#ifndef PN_EMU_UCONTEXT
/* pn_emu_ctx_swap(save, to): push the callee-saved registers and the SSE/x87 control words,
 * store rsp in *save, load rsp = to, pop the same and return on the other stack. A fresh
 * stack is prepared (fiber_start) to "return" into pn_emu_ctx_entry, which calls r12. */
extern "C" void pn_emu_ctx_swap(void **save, void *to);
extern "C" void pn_emu_ctx_entry(void);
asm(R"(
    .text
    .globl pn_emu_ctx_swap
    .hidden pn_emu_ctx_swap
    .type pn_emu_ctx_swap,@function
pn_emu_ctx_swap:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size pn_emu_ctx_swap, .-pn_emu_ctx_swap
    .globl pn_emu_ctx_entry
    .hidden pn_emu_ctx_entry
    .type pn_emu_ctx_entry,@function
pn_emu_ctx_entry:
    callq *%r12
    ud2
    .size pn_emu_ctx_entry, .-pn_emu_ctx_entry
)");
#endif

namespace {

struct Fiber {
    char *lo = nullptr; /* usable stack [lo, lo+size); the guard page lies below lo */
    size_t size = 0;
    void *sp = nullptr;
    void *fake = nullptr; /* ASan fake stack while switched away */
#ifdef PN_EMU_UCONTEXT
    ucontext_t uc;
#endif
};

enum State { RUNNABLE, AT_BARRIER, AT_WARP, EXITED, ABORTED };

/* a cp.async copy issued and not landed yet: its destination and the 16 bytes read at the issue */
struct AsyncCopy {
    char *dst;
    int n; /* 8 or 16 bytes */
    unsigned char bytes[16];
};

struct Thr {
    Fiber *f;
    State st;
    uint3 tid;
    int lin;
    const char *file; /* where it waits */
    int line;
    int op;        /* barrier kind or warp op */
    unsigned mask; /* warp op */
    int arg, width;
    uint64_t val, res;
    std::vector<AsyncCopy> cp_open;                /* cp.async copies since the last commit */
    std::vector<std::vector<AsyncCopy>> cp_groups; /* committed and not waited for, oldest first */
};

struct SharedArr {
    const char *name, *file;
    int line;
    size_t bytes;
    char *p;
};

struct Block {
    const char *kname;
    uint3 bid, bdim;
    std::vector<Thr> th;
    Thr *cur = nullptr;
    const std::function<void()> *body;
    std::vector<SharedArr> shared;
    size_t static_bytes = 0;
    SharedArr dyn{};
    bool failed = false;
    uint64_t cp_rng = 0; /* rand:SEED: which cp.async copies land at their issue */
};

const size_t GUARD = 64;         /* canary bytes after each shared array */
const unsigned char CANARY = 0xA5;

thread_local Block *g_blk;
thread_local Fiber g_sched;      /* the OS thread's own stack */
/* stacks for reuse (runs hold the runtime lock); a never-freed global so leak checkers see it */
std::vector<Fiber *> &g_pool = *new std::vector<Fiber *>;
#ifdef PN_EMU_ASAN
thread_local const void *g_main_lo;
thread_local size_t g_main_size;
#endif

/* ---- schedule ---------------------------------------------------------------------- */
enum SchedKind { FWD, REV, RAND };
SchedKind g_kind = FWD;
uint64_t g_seed = 0;
std::string g_spec = "fwd";
bool g_sched_init = false;
/* grids run since the schedule was set (so a rand: run repeats after setting it again) and in
 * all: what the wmma fragment maps of a launch derive from */
long long g_grids_since_set = 0, g_grid_serial = 0;

bool parse_schedule(const char *spec, SchedKind *k, uint64_t *seed) {
    if (!spec || !*spec || !strcmp(spec, "fwd")) return *k = FWD, *seed = 0, true;
    if (!strcmp(spec, "rev")) return *k = REV, *seed = 0, true;
    if (!strncmp(spec, "rand:", 5) && spec[5]) {
        char *end;
        unsigned long long v = strtoull(spec + 5, &end, 10);
        if (*end || spec[5] == '-') return false;
        return *k = RAND, *seed = v, true;
    }
    return false;
}

void sched_init() {
    if (g_sched_init) return;
    g_sched_init = true;
    const char *env = getenv("PN_CUDA_EMU_SCHED");
    if (env && *env && pn_emu_set_schedule(env) != 0)
        fprintf(stderr, "penumbra: PN_CUDA_EMU_SCHED='%s' is not fwd, rev or rand:SEED; using fwd\n", env);
}

using pn_emu_wmma::splitmix;

/* ---- fibers ------------------------------------------------------------------------ */
size_t stack_bytes() {
    static size_t bytes = 0;
    if (!bytes) {
        const char *env = getenv("PN_CUDA_EMU_STACK");
        long kib = env ? atol(env) : 0;
        if (kib < 16) kib = 64;
#ifdef PN_EMU_ASAN
        kib *= 4; /* ASan's redzones make frames much larger */
#endif
        bytes = (size_t)kib * 1024;
    }
    return bytes;
}

Fiber *fiber_get() {
    if (!g_pool.empty()) {
        Fiber *f = g_pool.back();
        g_pool.pop_back();
        return f;
    }
    size_t page = (size_t)sysconf(_SC_PAGESIZE), size = (stack_bytes() + page - 1) / page * page;
    void *m = mmap(nullptr, size + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return nullptr;
    mprotect(m, page, PROT_NONE); /* guard page: an overflowing stack faults instead of corrupting */
    Fiber *f = new Fiber;
    f->lo = (char *)m + page;
    f->size = size;
    return f;
}

void asan_start(void **fake, const void *lo, size_t size) {
#ifdef PN_EMU_ASAN
    __sanitizer_start_switch_fiber(fake, lo, size);
#else
    (void)fake, (void)lo, (void)size;
#endif
}
void asan_finish(void *fake, const void **lo, size_t *size) {
#ifdef PN_EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, lo, size);
#else
    (void)fake, (void)lo, (void)size;
#endif
}

[[noreturn]] void fiber_main();
#ifdef PN_EMU_UCONTEXT
void fiber_main_uc() { fiber_main(); }
#endif

/* Make f start fiber_main (for the thread g_blk->cur at that time) when next switched to. */
void fiber_start(Fiber *f) {
#ifdef PN_EMU_ASAN
    ASAN_UNPOISON_MEMORY_REGION(f->lo, f->size); /* frames of abandoned threads */
#endif
#ifdef PN_EMU_UCONTEXT
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = f->lo;
    f->uc.uc_stack.ss_size = f->size;
    f->uc.uc_link = nullptr;
    makecontext(&f->uc, (void (*)())fiber_main_uc, 0);
#else
    uint64_t *sp = (uint64_t *)(((uintptr_t)f->lo + f->size) & ~(uintptr_t)15);
    *--sp = (uint64_t)(uintptr_t)pn_emu_ctx_entry; /* return address of the first swap */
    *--sp = 0;                                     /* rbp */
    *--sp = 0;                                     /* rbx */
    *--sp = (uint64_t)(uintptr_t)fiber_main;       /* r12: called by pn_emu_ctx_entry */
    *--sp = 0;                                     /* r13 */
    *--sp = 0;                                     /* r14 */
    *--sp = 0;                                     /* r15 */
    uint32_t mxcsr;
    uint16_t fpucw;
    asm volatile("stmxcsr %0; fnstcw %1" : "=m"(mxcsr), "=m"(fpucw));
    *--sp = mxcsr | (uint64_t)fpucw << 32;
    f->sp = sp;
#endif
}

void ctx_switch(Fiber *from, Fiber *to) {
#ifdef PN_EMU_UCONTEXT
    swapcontext(&from->uc, &to->uc);
#else
    pn_emu_ctx_swap(&from->sp, to->sp);
#endif
}

/* scheduler → thread t, until t blocks or exits */
void resume(Block *b, Thr *t) {
    b->cur = t;
    pn_emu_bi.tid = t->tid;
    asan_start(&g_sched.fake, t->f->lo, t->f->size);
    ctx_switch(&g_sched, t->f);
    asan_finish(g_sched.fake, nullptr, nullptr);
}

/* current thread → scheduler; returns when resumed (never if gone) */
void yield_to_sched(bool gone) {
    Thr *t = g_blk->cur;
#ifdef PN_EMU_ASAN
    asan_start(gone ? nullptr : &t->f->fake, g_main_lo, g_main_size);
#else
    (void)gone;
#endif
    ctx_switch(t->f, &g_sched);
    asan_finish(t->f->fake, nullptr, nullptr);
}

[[noreturn]] void fiber_main() {
#ifdef PN_EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &g_main_lo, &g_main_size);
#endif
    (*g_blk->body)();
    g_blk->cur->st = EXITED;
    yield_to_sched(true);
    __builtin_unreachable();
}

/* ---- kernel errors -------------------------------------------------------------------- */
std::string fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char *f, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, sizeof buf, f, ap);
    va_end(ap);
    return buf;
}

std::string where(const Block *b) {
    return fmt("kernel '%s' block (%u,%u,%u)", b->kname, b->bid.x, b->bid.y, b->bid.z);
}
std::string who(const Thr *t) { return fmt("thread (%u,%u,%u)", t->tid.x, t->tid.y, t->tid.z); }

void block_fail(Block *b, const std::string &msg) {
    if (b->failed) return;
    b->failed = true;
    pn_emu_fail(cudaErrorLaunchFailure, "%s", msg.c_str());
}

/* A kernel error found on a thread: report it and never resume this thread. */
[[noreturn]] void thread_fail(const std::string &msg) {
    block_fail(g_blk, msg);
    g_blk->cur->st = ABORTED;
    yield_to_sched(true);
    __builtin_unreachable();
}

const char *op_name(int op) {
    static const char *names[] = {"__syncwarp", "__shfl_sync", "__shfl_xor_sync", "__shfl_down_sync",
                                  "__shfl_up_sync", "__ballot_sync", "wmma::load_matrix_sync",
                                  "wmma::store_matrix_sync", "wmma::mma_sync", "mma.sync.m16n8k16 (pn_mma_16816)",
                                  "ldmatrix.m8n8 (pn_ldmatrix)", "mma.sync.m8n8k4.f64 (pn_dmma_884)"};
    return op >= 0 && op <= PN_EMU_DMMA_884 ? names[op] : "?";
}

bool is_wmma(int op) { return op >= PN_EMU_WMMA_LOAD && op <= PN_EMU_DMMA_884; }

bool same_site(const Thr &a, const Thr &b) {
    return a.line == b.line && (a.file == b.file || !strcmp(a.file, b.file));
}

/* lanes of warp w that exist (a partial last warp has fewer than 32) */
unsigned lanes_of(const Block *b, int w) {
    int n = (int)b->th.size() - w * 32;
    return n >= 32 ? 0xffffffffu : (1u << n) - 1;
}

/* Release warp groups whose lanes have all arrived; report impossible ones. */
void release_warps(Block *b) {
    for (Thr &t : b->th) {
        if (b->failed) return;
        if (t.st != AT_WARP) continue;
        int w = t.lin / 32, base = w * 32;
        unsigned m = t.mask & lanes_of(b, w);
        bool ready = true;
        for (int l = 0; l < 32; l++) {
            if (!(m >> l & 1)) continue;
            Thr &u = b->th[base + l];
            if (u.st == EXITED)
                return block_fail(b, fmt("%s: lane %d of the mask 0x%08x exited before the %s at %s:%d (%s)",
                                         where(b).c_str(), l, t.mask, op_name(t.op), t.file, t.line, who(&t).c_str()));
            if (u.st != AT_WARP) {
                ready = false;
                continue;
            }
            /* __syncwarp may be reached at different sites (sm_70+); data exchanges may not */
            if (u.op != t.op || (t.op != PN_EMU_SYNCWARP && !same_site(u, t)))
                return block_fail(b, fmt("%s: lanes of one mask at different warp operations: lane %d at %s %s:%d, lane %d "
                                         "at %s %s:%d",
                                         where(b).c_str(), t.lin % 32, op_name(t.op), t.file, t.line, l, op_name(u.op),
                                         u.file, u.line));
            if ((u.mask & lanes_of(b, w)) != m)
                return block_fail(b, fmt("%s: lanes at %s %s:%d use different masks: lane %d 0x%08x, lane %d 0x%08x",
                                         where(b).c_str(), op_name(t.op), t.file, t.line, t.lin % 32, t.mask, l,
                                         u.mask));
        }
        if (!ready) continue;
        if (is_wmma(t.op)) {
            /* a warp-collective matrix op: every lane of a full warp, then one computation for all */
            if (lanes_of(b, w) != 0xffffffffu)
                return block_fail(b, fmt("%s: %s at %s:%d in warp %d, which has %d lanes: wmma needs a full warp of 32",
                                         where(b).c_str(), op_name(t.op), t.file, t.line, w,
                                         __builtin_popcount(lanes_of(b, w))));
            const pn_emu_wmma::call *calls[32];
            for (int l = 0; l < 32; l++) calls[l] = (const pn_emu_wmma::call *)(uintptr_t)b->th[base + l].val;
            char err[640];
            if (pn_emu_wmma::release(t.op, calls, err, sizeof err) != 0)
                return block_fail(b, fmt("%s: %s at %s:%d (warp %d): %s", where(b).c_str(), op_name(t.op), t.file, t.line,
                                         w, err));
            for (int l = 0; l < 32; l++) b->th[base + l].st = RUNNABLE;
            continue;
        }
        int width = t.width;
        if (t.op != PN_EMU_SYNCWARP && t.op != PN_EMU_BALLOT && (width < 1 || width > 32 || (width & (width - 1))))
            return block_fail(b, fmt("%s: %s at %s:%d with width %d (must be a power of 2 ≤ 32)", where(b).c_str(),
                                     op_name(t.op), t.file, t.line, width));
        unsigned ballot = 0;
        for (int l = 0; l < 32; l++)
            if ((m >> l & 1) && b->th[base + l].val) ballot |= 1u << l;
        for (int l = 0; l < 32; l++) {
            if (!(m >> l & 1)) continue;
            Thr &u = b->th[base + l];
            int seg = l & ~(width - 1), src = l;
            switch (u.op) {
            case PN_EMU_SHFL: src = seg + (u.arg & (width - 1)); break;
            case PN_EMU_SHFL_XOR: src = l ^ u.arg; if (src < seg || src >= seg + width) src = l; break;
            case PN_EMU_SHFL_DOWN: src = (l - seg) + u.arg >= width ? l : l + u.arg; break;
            case PN_EMU_SHFL_UP: src = (l - seg) < u.arg ? l : l - u.arg; break;
            }
            if (u.op == PN_EMU_BALLOT) u.res = ballot;
            else if (src == l) u.res = u.val;
            else if (src >= 0 && src < 32 && (m >> src & 1)) u.res = b->th[base + src].val;
            else u.res = ~0ull; /* undefined in CUDA: the NaN/-1 pattern */
        }
        for (int l = 0; l < 32; l++)
            if (m >> l & 1) b->th[base + l].st = RUNNABLE;
    }
}

/* Release the barrier when every live thread waits at it; else report a deadlock. */
void release_barrier_or_report(Block *b) {
    Thr *first = nullptr;
    int live = 0, at_bar = 0;
    for (Thr &t : b->th) {
        if (t.st == RUNNABLE) return; /* progress possible */
        if (t.st == EXITED) continue;
        live++;
        if (t.st == AT_BARRIER) {
            at_bar++;
            if (!first) first = &t;
            else if (!same_site(*first, t))
                return block_fail(b, fmt("divergent barrier in %s: %s at %s:%d, %s at %s:%d", where(b).c_str(),
                                         who(first).c_str(), first->file, first->line, who(&t).c_str(), t.file, t.line));
        }
    }
    if (live == 0) return;
    if (at_bar == live) {
        int count = 0;
        for (Thr &t : b->th)
            if (t.st == AT_BARRIER) count += t.val != 0;
        for (Thr &t : b->th) {
            if (t.st != AT_BARRIER) continue;
            t.res = t.op == PN_EMU_SYNC_COUNT ? count : t.op == PN_EMU_SYNC_AND ? count == live : t.op == PN_EMU_SYNC_OR ? count > 0 : 0;
            t.st = RUNNABLE;
        }
        return;
    }
    /* deadlock: name the distinct places where threads wait */
    std::string msg = fmt("deadlock in %s (%d live threads, none can proceed):", where(b).c_str(), live);
    std::vector<const Thr *> shown;
    for (Thr &t : b->th) {
        if (t.st != AT_BARRIER && t.st != AT_WARP) continue;
        bool dup = false;
        for (const Thr *s : shown) dup |= s->st == t.st && s->op == t.op && same_site(*s, t);
        if (dup || shown.size() >= 4) continue;
        shown.push_back(&t);
        if (t.st == AT_BARRIER) msg += fmt(" %s waits at __syncthreads %s:%d;", who(&t).c_str(), t.file, t.line);
        else msg += fmt(" %s (lane %d) waits at %s %s:%d for mask 0x%08x;", who(&t).c_str(), t.lin % 32, op_name(t.op),
                        t.file, t.line, t.mask);
    }
    msg.pop_back();
    block_fail(b, msg);
}

void free_shared(SharedArr &a) {
    free(a.p);
    a.p = nullptr;
}

void check_canary(Block *b, const SharedArr &a) {
    for (size_t i = 0; i < GUARD; i++)
        if ((unsigned char)a.p[a.bytes + i] != CANARY)
            return block_fail(b, fmt("shared array '%s' (%s:%d, %zu B) written past its end in %s", a.name, a.file, a.line,
                                     a.bytes, where(b).c_str()));
}

/* malloc'd (so ASan sees it), 0xFF-filled, canary after. At least 32-byte aligned, the most any
 * access here asks for (a wmma tile), so the interpreter's alignment checks judge the offset
 * inside the array and not where malloc put it. */
char *alloc_shared(size_t bytes, size_t align) {
    void *p = nullptr;
    if (align < 32) align = 32;
    if (posix_memalign(&p, align, bytes + GUARD)) return nullptr;
    memset(p, 0xFF, bytes);
    memset((char *)p + bytes, CANARY, GUARD);
    return (char *)p;
}

void run_block(Block *b, dim3 bdim) {
    int n = (int)(bdim.x * bdim.y * bdim.z);
    b->th.resize(n);
    for (int i = 0; i < n; i++) {
        Thr &t = b->th[i];
        t = Thr{};
        t.lin = i;
        t.tid = uint3{i % bdim.x, i / bdim.x % bdim.y, i / (bdim.x * bdim.y)};
        t.st = RUNNABLE;
        t.f = fiber_get();
        if (!t.f) {
            for (int j = 0; j < i; j++) g_pool.push_back(b->th[j].f);
            return block_fail(b, fmt("%s: cannot map fiber stacks for %d threads", where(b).c_str(), n));
        }
        b->cur = &t;
        fiber_start(t.f);
    }
    /* per block and per launch (so the same block of the next launch runs in another order) */
    uint64_t rng = g_seed ^ (0x9E3779B97F4A7C15ull * (1 + b->bid.x + 65536ull * (b->bid.y + 65536ull * b->bid.z))) ^
                   (0xA24BAED4963EE407ull * (uint64_t)g_grids_since_set);
    b->cp_rng = rng ^ 0xC2B2AE3D27D4EB4Full;
    /* rand: each warp's pace — it sits a round out with probability pace/4 (0, ¼, ½, ¾) */
    const int nw = (n + 31) / 32;
    std::vector<unsigned char> pace(nw, 0);
    if (g_kind == RAND)
        for (int w = 0; w < nw; w++) pace[w] = (unsigned char)(splitmix(&rng) & 3);
    std::vector<int> order;
    while (!b->failed) {
        order.clear();
        for (int i = 0; i < n; i++)
            if (b->th[i].st == RUNNABLE) order.push_back(i);
        if (order.empty()) break; /* all exited */
        if (g_kind == REV) std::reverse(order.begin(), order.end());
        else if (g_kind == RAND) {
            for (size_t i = order.size() - 1; i > 0; i--) std::swap(order[i], order[splitmix(&rng) % (i + 1)]);
            /* Lagging warps: a warp sits this round out with the probability its pace gives, so
             * between two barriers one warp can get many warp operations (mma, shuffles) ahead of
             * another, as on the GPU, where warps do not run in lockstep; otherwise every warp
             * advances one warp operation per round and a kernel that refills a buffer another
             * warp is still reading (no barrier between) would pass. At least one thread runs. */
            if (nw > 1) {
                std::vector<char> sit(nw);
                for (int w = 0; w < nw; w++) sit[w] = (int)(splitmix(&rng) & 3) < pace[w];
                size_t k = 0;
                for (int i : order)
                    if (!sit[i / 32]) order[k++] = i;
                if (k > 0) order.resize(k);
            }
        }
        for (int i : order) {
            resume(b, &b->th[i]);
            if (b->failed) break;
        }
        if (!b->failed) release_warps(b);
        if (!b->failed) release_barrier_or_report(b);
    }
    b->cur = nullptr;
    for (Thr &t : b->th) g_pool.push_back(t.f);
}

} // namespace

/* ---- the kernel-side API --------------------------------------------------------------- */
int pn_emu_syncthreads(int kind, int pred, const char *file, int line) {
    if (!g_blk) return 0; /* host code: nothing to wait for */
    Thr *t = g_blk->cur;
    t->st = AT_BARRIER, t->op = kind, t->val = (uint64_t)pred, t->file = file, t->line = line;
    yield_to_sched(false);
    return (int)t->res;
}

uint64_t pn_emu_warp(int op, unsigned mask, uint64_t value, int arg, int width, const char *file, int line) {
    if (!g_blk) return value;
    Thr *t = g_blk->cur;
    int lane = t->lin % 32;
    if (!(mask >> lane & 1))
        thread_fail(fmt("%s: %s lane %d calls %s at %s:%d with mask 0x%08x, which does not include it",
                        where(g_blk).c_str(), who(t).c_str(), lane, op_name(op), file, line, mask));
    t->st = AT_WARP, t->op = op, t->mask = mask, t->val = value, t->arg = arg, t->width = width;
    t->file = file, t->line = line;
    yield_to_sched(false);
    return t->res;
}

unsigned pn_emu_activemask(void) {
    if (!g_blk) return 1;
    Thr *t = g_blk->cur;
    int base = t->lin / 32 * 32;
    unsigned m = 0;
    for (int l = 0; l < 32 && base + l < (int)g_blk->th.size(); l++)
        if (g_blk->th[base + l].st != EXITED) m |= 1u << l;
    return m;
}

void *pn_emu_shared(size_t bytes, size_t align, const char *name, const char *file, int line) {
    Block *b = g_blk;
    if (!b) return nullptr;
    for (SharedArr &a : b->shared)
        if (a.line == line && (a.file == file || !strcmp(a.file, file)) && (a.name == name || !strcmp(a.name, name)))
            return a.p;
    b->static_bytes += bytes;
    if (b->static_bytes > 49152)
        thread_fail(fmt("%s: static shared memory exceeds 48 KiB (%zu B with '%s' at %s:%d)", where(b).c_str(),
                        b->static_bytes, name, file, line));
    if (b->static_bytes + b->dyn.bytes > 232448)
        thread_fail(fmt("%s: static + dynamic shared memory %zu B exceeds 232448 B", where(b).c_str(),
                        b->static_bytes + b->dyn.bytes));
    char *p = alloc_shared(bytes, align);
    if (!p) thread_fail(fmt("%s: out of host memory for shared array '%s'", where(b).c_str(), name));
    b->shared.push_back(SharedArr{name, file, line, bytes, p});
    return p;
}

void *pn_emu_dyn_shared(void) { return g_blk ? g_blk->dyn.p : nullptr; }

void pn_emu_cp_async(void *dst, const void *src, int n, const char *file, int line) {
    Block *b = g_blk;
    if (!b) {
        pn_emu_fail(cudaErrorLaunchFailure, "cp.async at %s:%d outside a kernel", file, line);
        return;
    }
    Thr *t = b->cur;
    /* a bad copy fails the launch and is skipped; the thread goes on (thread_fail would abandon
     * its fiber with the message's strings on it, which LeakSanitizer reports) */
    const char *bad = n != 4 && n != 8 && n != 16               ? "has a size PTX's cp.async lacks here"
                      : ((uintptr_t)dst | (uintptr_t)src) & (n - 1) ? "is misaligned"
                      : !pn_emu_wmma::in_shared(dst, n)             ? "writes outside every shared array"
                      : !pn_emu_is_device(src, n)                   ? "reads outside device memory"
                                                                    : nullptr;
    if (bad) {
        block_fail(b, fmt("%s: %s: cp.async of %d bytes from %p to %p at %s:%d %s", where(b).c_str(), who(t).c_str(), n,
                          src, dst, file, line, bad));
        return;
    }
    AsyncCopy c;
    c.dst = (char *)dst;
    c.n = n;
    memcpy(c.bytes, src, (size_t)n);
    const bool now = g_kind == REV || (g_kind == RAND && (splitmix(&b->cp_rng) & 1));
    if (now) memcpy(c.dst, c.bytes, (size_t)n);
    else t->cp_open.push_back(c);
}

void pn_emu_cp_async_commit(void) {
    if (!g_blk) return;
    Thr *t = g_blk->cur;
    t->cp_groups.push_back(std::move(t->cp_open));
    t->cp_open.clear();
}

void pn_emu_cp_async_wait(int pending) {
    if (!g_blk) return;
    Thr *t = g_blk->cur;
    size_t landed = 0;
    while (t->cp_groups.size() - landed > (size_t)(pending > 0 ? pending : 0)) {
        for (const AsyncCopy &c : t->cp_groups[landed]) memcpy(c.dst, c.bytes, (size_t)c.n);
        landed++;
    }
    t->cp_groups.erase(t->cp_groups.begin(), t->cp_groups.begin() + (std::ptrdiff_t)landed);
}

namespace pn_emu_wmma {
uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

grid_key current_grid(void) {
    uint64_t st = g_seed ^ (0xD1B54A32D192ED03ull * (uint64_t)g_grids_since_set);
    return grid_key{(int)g_kind, splitmix(&st), g_grid_serial};
}

bool in_shared(const void *p, size_t bytes) {
    const Block *b = g_blk;
    if (!b) return false;
    auto inside = [&](const SharedArr &a) {
        return a.p && (const char *)p >= a.p && (size_t)((const char *)p - a.p) <= a.bytes &&
               bytes <= a.bytes - (size_t)((const char *)p - a.p);
    };
    for (const SharedArr &a : b->shared)
        if (inside(a)) return true;
    return inside(b->dyn);
}
} // namespace pn_emu_wmma

bool pn_emu_run_grid(const char *name, dim3 grid, dim3 block, size_t dyn_shmem, const std::function<void()> &body) {
    sched_init();
    Block b;
    b.kname = name;
    b.bdim = block;
    b.body = &body;
    pn_emu_bi.gdim = grid;
    pn_emu_bi.bdim = block;
    Block *saved = g_blk;
    g_blk = &b;
    g_grids_since_set++, g_grid_serial++;
    for (unsigned z = 0; z < grid.z && !b.failed; z++)
        for (unsigned y = 0; y < grid.y && !b.failed; y++)
            for (unsigned x = 0; x < grid.x && !b.failed; x++) {
                b.bid = pn_emu_bi.bid = uint3{x, y, z};
                b.dyn = SharedArr{"(dynamic)", "(launch)", 0, dyn_shmem, alloc_shared(dyn_shmem, 256)};
                b.static_bytes = 0;
                if (!b.dyn.p) block_fail(&b, fmt("%s: out of host memory for dynamic shared memory", where(&b).c_str()));
                else run_block(&b, block);
                if (!b.failed) {
                    for (SharedArr &a : b.shared) check_canary(&b, a);
                    if (b.dyn.p) check_canary(&b, b.dyn);
                }
                for (SharedArr &a : b.shared) free_shared(a);
                b.shared.clear();
                if (b.dyn.p) free_shared(b.dyn);
            }
    g_blk = saved;
    pn_emu_bi.tid = uint3{0, 0, 0};
    return !b.failed;
}

extern "C" int pn_emu_set_schedule(const char *spec) {
    SchedKind k;
    uint64_t seed;
    if (!parse_schedule(spec, &k, &seed)) return -1;
    g_sched_init = true; /* an explicit setting wins over the environment */
    g_kind = k, g_seed = seed;
    g_spec = spec && *spec ? spec : "fwd";
    g_grids_since_set = 0;
    return 0;
}

extern "C" const char *pn_emu_schedule(void) {
    sched_init();
    return g_spec.c_str();
}

/* alloc.c — counted, aligned host allocation and the live-object counters that the
 * ownership specs read (pn_live_tensors / pn_live_bytes / pn_live_nodes). */
#define _GNU_SOURCE /* mremap */
#include "internal.h"

#include <cblas.h>
#include <malloc.h>
#include <omp.h>
#include <pthread.h>
#include <sys/mman.h>

static int64_t live_bytes, live_tensors, live_nodes;

int64_t pn_live_bytes(void) { return __atomic_load_n(&live_bytes, __ATOMIC_RELAXED); }
int64_t pn_live_tensors(void) { return __atomic_load_n(&live_tensors, __ATOMIC_RELAXED); }
int64_t pn_live_nodes(void) { return __atomic_load_n(&live_nodes, __ATOMIC_RELAXED); }
void pn_count_tensor(int d) { __atomic_add_fetch(&live_tensors, d, __ATOMIC_RELAXED); }
void pn_count_node(int d) { __atomic_add_fetch(&live_nodes, d, __ATOMIC_RELAXED); }
void pn_count_bytes(int64_t d) { __atomic_add_fetch(&live_bytes, d, __ATOMIC_RELAXED); }

/* Tensors of tens of MB are freed and reallocated every training step; glibc would hand
 * each one back to the kernel (mmap/munmap) and fault fresh pages in on the next
 * allocation, which costs more than the arithmetic of a softmax. So: keep blocks below
 * 32 MiB in the heap (mallopt), and park freed blocks from 1 MiB up in a small cache
 * (sizes rounded to 1 MiB) for the next request that fits one of them. A block handed out
 * from the cache may be larger than asked; it is parked again under the size asked for,
 * which it holds (a mapped one, below, is cut to that size). Off in ASan builds, where
 * reuse would hide use-after-free. */
__attribute__((constructor)) static void pn_tune_malloc(void) {
    mallopt(M_MMAP_THRESHOLD, 32 << 20); /* glibc's maximum on 64-bit */
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

#define BIG (1u << 20)             /* blocks from here on are cached */
#define HUGE ((size_t)32 << 20)    /* blocks from here on are mapped in huge pages (map_huge) */
#define HUGE_PAGE ((size_t)2 << 20)
#define CACHE_SLOTS 64
#define CACHE_LIMIT ((size_t)1 << 30) /* bytes parked at most */

static struct {
    void *p[CACHE_SLOTS];
    size_t n[CACHE_SLOTS];
    size_t total;
} cache;
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;

static size_t rounded(size_t nbytes) {
    size_t n = (nbytes + 63) & ~(size_t)63;
    if (n == 0) n = 64;
    if (n >= BIG) n = (n + BIG - 1) & ~(size_t)(BIG - 1);
    if (n >= HUGE) n = (n + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    return n;
}

/* Blocks past glibc's mmap threshold (the logits of a translation batch and their gradient,
 * 100+ MB) are mapped here instead, 2 MiB-aligned and advised into transparent huge pages
 * (Debian's default THP mode is "madvise"): a fresh block then faults in 512× fewer times —
 * 4 KiB pages made ~20k faults a step, 3 % of it in the kernel — and a GEMM streaming over it
 * misses the TLB less. Where THP is off the advice is ignored and this is plain mmap. */
static void *map_huge(size_t n) {
    size_t len = n + HUGE_PAGE;
    char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    char *p = (char *)(((uintptr_t)m + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (p > m) munmap(m, (size_t)(p - m));
    if (m + len > p + n) munmap(p + n, (size_t)(m + len - (p + n)));
#ifdef MADV_HUGEPAGE
    madvise(p, n, MADV_HUGEPAGE); /* advice only: a kernel without THP keeps 4 KiB pages */
#endif
    return p;
}

/* A parked mapped block for a mapped size n: the smallest that holds n, its tail beyond n
 * given back (so pn_free's munmap of n bytes releases all of it), or else the largest
 * smaller one, moved to the head of a fresh mapping of n — its pages keep their contents and
 * only the rest faults in. Batches of varying token counts then reuse the logits' pages step
 * after step instead of clearing 100+ MB of fresh ones. Call with cache_lock held; NULL when
 * nothing is parked. */
static void *take_mapped(size_t n) {
    int best = -1;
    for (int i = 0; i < CACHE_SLOTS; i++) {
        if (!cache.p[i] || cache.n[i] < HUGE) continue;
        if (best < 0) {
            best = i;
        } else if (cache.n[best] >= n ? (cache.n[i] >= n && cache.n[i] < cache.n[best])
                                      : cache.n[i] > cache.n[best]) {
            best = i;
        }
    }
    if (best < 0) return NULL;
    char *p = cache.p[best];
    size_t had = cache.n[best];
    cache.p[best] = NULL;
    cache.total -= had;
    if (had > n) munmap(p + n, had - n);
    if (had >= n) return p;
    char *q = map_huge(n);
    if (q && mremap(p, had, had, MREMAP_MAYMOVE | MREMAP_FIXED, q) != MAP_FAILED) return q;
    munmap(p, had);
    return q;
}

static void *cache_take(size_t n) {
#ifdef PN_ASAN_BUILD
    (void)n;
    return NULL;
#else
    /* the smallest parked block that holds n and wastes at most a quarter of it: batches of
     * varying size (token-count batching) reuse each other's logits and activations. A block
     * from the heap serves heap sizes only (pn_free tells heap and mapped blocks apart by the
     * size), and mapped sizes are served by take_mapped. */
    void *p = NULL;
    int best = -1;
    pthread_mutex_lock(&cache_lock);
    if (n >= HUGE) {
        p = take_mapped(n);
    } else {
        for (int i = 0; i < CACHE_SLOTS; i++)
            if (cache.p[i] && cache.n[i] >= n && cache.n[i] - n <= n / 4 && (best < 0 || cache.n[i] < cache.n[best]))
                best = i;
        if (best >= 0) {
            p = cache.p[best];
            cache.p[best] = NULL;
            cache.total -= cache.n[best];
        }
    }
    pthread_mutex_unlock(&cache_lock);
    return p;
#endif
}

static bool cache_put(void *p, size_t n) {
#ifdef PN_ASAN_BUILD
    (void)p;
    (void)n;
    return false;
#else
    bool kept = false;
    pthread_mutex_lock(&cache_lock);
    if (cache.total + n <= CACHE_LIMIT) {
        for (int i = 0; i < CACHE_SLOTS; i++)
            if (!cache.p[i]) {
                cache.p[i] = p;
                cache.n[i] = n;
                cache.total += n;
                kept = true;
                break;
            }
    }
    pthread_mutex_unlock(&cache_lock);
    return kept;
#endif
}

void *pn_alloc(size_t nbytes) {
    size_t n = rounded(nbytes);
    void *p = n >= BIG ? cache_take(n) : NULL;
    if (!p) p = n >= HUGE ? map_huge(n) : aligned_alloc(64, n);
    if (!p) return pn_error_null(PN_ERR_OOM, "alloc: out of memory allocating %zu bytes", nbytes);
    __atomic_add_fetch(&live_bytes, (int64_t)nbytes, __ATOMIC_RELAXED);
    return p;
}

void pn_free(void *p, size_t nbytes) {
    if (!p) return;
    size_t n = rounded(nbytes);
    if (n >= BIG && cache_put(p, n)) {
    } else if (n >= HUGE) {
        munmap(p, n);
    } else {
        free(p);
    }
    __atomic_sub_fetch(&live_bytes, (int64_t)nbytes, __ATOMIC_RELAXED);
}

int pn_num_threads(void) { return omp_get_max_threads(); }
/* Both pools: our OpenMP loops and OpenBLAS's GEMM threads. */
void pn_set_num_threads(int n) {
    if (n > 0) {
        omp_set_num_threads(n);
        openblas_set_num_threads(n);
    }
}

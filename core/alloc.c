/* alloc.c — counted, aligned host allocation and the live-object counters that the
 * ownership specs read (pn_live_tensors / pn_live_bytes / pn_live_nodes). */
#include "internal.h"

#include <cblas.h>
#include <malloc.h>
#include <omp.h>
#include <pthread.h>

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
 * 32 MiB in the heap (mallopt), and park freed blocks from 1 MiB up in a cache (sizes
 * rounded to 1 MiB) for the next request that fits one of them. A block handed out from
 * the cache may be larger than asked; it is parked again under the size asked for, which
 * it holds. The cache holds up to the larger of 1 GiB and the most bytes ever live at once
 * (memory the job has already needed); to park a block past that, the longest-parked blocks
 * go back to the allocator first. With a fixed 1 GiB and 64 slots, refusing what did not
 * fit, an NMT training step (base preset, 4096-token batches: the logits and their gradient
 * are 118 MB each) handed a logits-sized block back to the kernel every few steps, and 13 %
 * of the step went to the kernel clearing fresh pages. If an allocation fails, every parked
 * block is released and it is tried once more. Off in ASan builds, where reuse would hide
 * use-after-free. */
__attribute__((constructor)) static void pn_tune_malloc(void) {
    mallopt(M_MMAP_THRESHOLD, 32 << 20); /* glibc's maximum on 64-bit */
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

#define BIG (1u << 20)                /* blocks from here on are cached */
#define CACHE_SLOTS 1024
#define CACHE_FLOOR ((size_t)1 << 30) /* bytes parked at most, unless more were live at once */

static int64_t live_peak;
static struct {
    void *p[CACHE_SLOTS];
    size_t n[CACHE_SLOTS];
    uint64_t when[CACHE_SLOTS]; /* parking order: the oldest goes first */
    uint64_t clock;
    size_t total;
} cache;
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;

static size_t rounded(size_t nbytes) {
    size_t n = (nbytes + 63) & ~(size_t)63;
    if (n == 0) n = 64;
    if (n >= BIG) n = (n + BIG - 1) & ~(size_t)(BIG - 1);
    return n;
}

static void *cache_take(size_t n) {
#ifdef PN_ASAN_BUILD
    (void)n;
    return NULL;
#else
    /* the smallest parked block that holds n and wastes at most a quarter of it: batches of
     * varying size (token-count batching) reuse each other's logits and activations */
    void *p = NULL;
    int best = -1;
    pthread_mutex_lock(&cache_lock);
    for (int i = 0; i < CACHE_SLOTS; i++)
        if (cache.p[i] && cache.n[i] >= n && cache.n[i] - n <= n / 4 && (best < 0 || cache.n[i] < cache.n[best]))
            best = i;
    if (best >= 0) {
        p = cache.p[best];
        cache.p[best] = NULL;
        cache.total -= cache.n[best];
    }
    pthread_mutex_unlock(&cache_lock);
    return p;
#endif
}

#ifndef PN_ASAN_BUILD
/* the slot parked longest (-1: none); with the lock held */
static int cache_oldest(void) {
    int old = -1;
    for (int i = 0; i < CACHE_SLOTS; i++)
        if (cache.p[i] && (old < 0 || cache.when[i] < cache.when[old])) old = i;
    return old;
}
#endif

static void cache_drop(int i) {
    free(cache.p[i]);
    cache.p[i] = NULL;
    cache.total -= cache.n[i];
}

static bool cache_put(void *p, size_t n) {
#ifdef PN_ASAN_BUILD
    (void)p;
    (void)n;
    return false;
#else
    const int64_t peak = __atomic_load_n(&live_peak, __ATOMIC_RELAXED);
    const size_t limit = (size_t)peak > CACHE_FLOOR ? (size_t)peak : CACHE_FLOOR;
    if (n > limit) return false;
    pthread_mutex_lock(&cache_lock);
    while (cache.total + n > limit) cache_drop(cache_oldest()); /* total > 0 here, so a slot is parked */
    int slot = -1;
    for (int i = 0; i < CACHE_SLOTS && slot < 0; i++)
        if (!cache.p[i]) slot = i;
    if (slot < 0) cache_drop(slot = cache_oldest());
    cache.p[slot] = p;
    cache.n[slot] = n;
    cache.when[slot] = ++cache.clock;
    cache.total += n;
    pthread_mutex_unlock(&cache_lock);
    return true;
#endif
}

/* every parked block back to the allocator (before giving up on an allocation) */
static void cache_release(void) {
    pthread_mutex_lock(&cache_lock);
    for (int i = 0; i < CACHE_SLOTS; i++)
        if (cache.p[i]) cache_drop(i);
    pthread_mutex_unlock(&cache_lock);
}

int64_t pn_host_cached_bytes(void) {
#ifdef PN_ASAN_BUILD
    return -1;
#else
    pthread_mutex_lock(&cache_lock);
    const int64_t n = (int64_t)cache.total;
    pthread_mutex_unlock(&cache_lock);
    return n;
#endif
}
void pn_host_empty_cache(void) { cache_release(); }

void *pn_alloc(size_t nbytes) {
    size_t n = rounded(nbytes);
    void *p = n >= BIG ? cache_take(n) : NULL;
    if (!p) p = aligned_alloc(64, n);
    if (!p) {
        cache_release();
        p = aligned_alloc(64, n);
    }
    if (!p) return pn_error_null(PN_ERR_OOM, "alloc: out of memory allocating %zu bytes", nbytes);
    const int64_t live = __atomic_add_fetch(&live_bytes, (int64_t)nbytes, __ATOMIC_RELAXED);
    int64_t peak = __atomic_load_n(&live_peak, __ATOMIC_RELAXED);
    while (live > peak && !__atomic_compare_exchange_n(&live_peak, &peak, live, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return p;
}

void pn_free(void *p, size_t nbytes) {
    if (!p) return;
    size_t n = rounded(nbytes);
    if (!(n >= BIG && cache_put(p, n))) free(p);
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

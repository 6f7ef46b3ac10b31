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
 * 32 MiB in the heap (mallopt), and park freed blocks from 1 MiB up in a small cache
 * (sizes rounded to 1 MiB) for the next request that fits one of them. A block handed out
 * from the cache may be larger than asked; it is parked again under the size asked for,
 * which it holds. Off in ASan builds, where
 * reuse would hide use-after-free. */
__attribute__((constructor)) static void pn_tune_malloc(void) {
    mallopt(M_MMAP_THRESHOLD, 32 << 20); /* glibc's maximum on 64-bit */
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

#define BIG (1u << 20)             /* blocks from here on are cached */
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
    if (!p) p = aligned_alloc(64, n);
    if (!p) return pn_error_null(PN_ERR_OOM, "alloc: out of memory allocating %zu bytes", nbytes);
    __atomic_add_fetch(&live_bytes, (int64_t)nbytes, __ATOMIC_RELAXED);
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

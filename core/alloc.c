/* alloc.c — counted, aligned host allocation and the live-object counters that the
 * ownership specs read (pn_live_tensors / pn_live_bytes / pn_live_nodes). */
#include "internal.h"

#include <cblas.h>
#include <malloc.h>
#include <omp.h>

static int64_t live_bytes, live_tensors, live_nodes;

int64_t pn_live_bytes(void) { return __atomic_load_n(&live_bytes, __ATOMIC_RELAXED); }
int64_t pn_live_tensors(void) { return __atomic_load_n(&live_tensors, __ATOMIC_RELAXED); }
int64_t pn_live_nodes(void) { return __atomic_load_n(&live_nodes, __ATOMIC_RELAXED); }
void pn_count_tensor(int d) { __atomic_add_fetch(&live_tensors, d, __ATOMIC_RELAXED); }
void pn_count_node(int d) { __atomic_add_fetch(&live_nodes, d, __ATOMIC_RELAXED); }

/* Tensors of tens of MB are freed and reallocated every step; glibc would hand each one
 * back to the kernel (mmap/munmap) and fault fresh pages in on the next allocation, which
 * costs more than the arithmetic of a softmax. Keep such blocks in the heap for reuse. */
__attribute__((constructor)) static void pn_tune_malloc(void) {
    mallopt(M_MMAP_THRESHOLD, 32 << 20); /* glibc's maximum on 64-bit */
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

void *pn_alloc(size_t nbytes) {
    /* 64-byte alignment for SIMD and cache lines; never a zero-size request */
    size_t n = (nbytes + 63) & ~(size_t)63;
    if (n == 0) n = 64;
    void *p = aligned_alloc(64, n);
    if (!p) return pn_error_null(PN_ERR_OOM, "alloc: out of memory allocating %zu bytes", nbytes);
    __atomic_add_fetch(&live_bytes, (int64_t)nbytes, __ATOMIC_RELAXED);
    return p;
}

void pn_free(void *p, size_t nbytes) {
    if (!p) return;
    free(p);
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

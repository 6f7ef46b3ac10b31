/* internal.h — private helpers shared by core/ (every .c file). Not part of the public API.
 *
 * What lives here (look here before writing a helper):
 *   errors      pn_error / pn_error_null, PN_TRY, pn_shape_str / pn_dims_str
 *   memory      pn_alloc / pn_free (counted), pn_empty_like, pn_contig / pn_contig_copy,
 *               storage refcounts
 *   dims        pn_wrap_dim, pn_broadcast_shape, pn_broadcast_strides
 *   dtype       pn_ld / pn_st (generic load/store as double), pn_is_float
 *   iteration   pn_iter: N operands over one (broadcast) shape, inner-row loops
 *   autograd    pn_node, pn_ag_needed, pn_ag_record, pn_ag_save (no-grad: pn_set_grad_enabled)
 *   threads     PN_PAR_MIN: below this many elements a loop stays serial
 */
#ifndef PN_INTERNAL_H
#define PN_INTERNAL_H

#include "penumbra.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#if defined(__cplusplus) && !defined(PN_FFI)
extern "C" { /* C linkage for core/cuda/ and core/text/spm.cc */
#endif

#define PN_PAR_MIN 32768 /* elements; smaller loops are not worth waking threads for */

/* A function C and CUDA both compile from the same source (Philox below, the score maths of
 * core/attention/): empty in C, __host__ __device__ under nvcc. */
#ifndef PN_HD
#if defined(__CUDACC__)
#define PN_HD __host__ __device__
#else
#define PN_HD
#endif
#endif

/* ---- errors ------------------------------------------------------------------- */
/* Set the thread-local message and return code (printf-style). */
pn_status pn_error(pn_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Same, returning NULL: `return pn_error_null(PN_ERR_SHAPE, "op: …");` */
void *pn_error_null(pn_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Shapes as "[2,3,4]" — ring of thread-local buffers, so several fit in one message. */
const char *pn_shape_str(const pn_tensor *t);
const char *pn_dims_str(int nd, const int64_t *shape);
/* Row-major linear position p of shape as the Lua reader counts it (1-based): "[i,j,…]". */
const char *pn_pos_str(int nd, const int64_t *shape, int64_t p);

#define PN_TRY(expr)                        \
    do {                                    \
        pn_status pn_try_s_ = (expr);       \
        if (pn_try_s_ != PN_OK) return pn_try_s_; \
    } while (0)

/* ---- memory ------------------------------------------------------------------- */
void *pn_alloc(size_t nbytes);   /* 64-byte aligned, counted in pn_live_bytes; NULL + error on OOM */
void pn_free(void *p, size_t nbytes);
void pn_count_tensor(int delta);
void pn_count_node(int delta);
void pn_count_bytes(int64_t delta); /* device memory, counted by its allocator */

struct pn_storage {
    void *data;
    size_t nbytes;
    int64_t refcount;
    int dev;
    uint64_t version; /* bumped by every in-place update: a saved tensor's must not change */
};
/* An in-place update of t's storage (copy_, fill_, axpy_, scale_, optimiser steps): autograd
 * refuses to backpropagate through a node whose saved tensors changed since they were saved. */
static inline void pn_bump_version(pn_tensor *t) { __atomic_add_fetch(&t->storage->version, 1, __ATOMIC_RELAXED); }
pn_storage *pn_storage_new(size_t nbytes, int dev);  /* uninitialised */
void pn_storage_retain(pn_storage *s);
void pn_storage_release(pn_storage *s);

/* A tensor struct viewing storage s (retained) — no data allocation. */
pn_tensor *pn_tensor_view_of(pn_storage *s, int nd, const int64_t *shape, const int64_t *strides,
                             int64_t offset, int dtype);
/* Fresh contiguous CPU tensor (uninitialised); same as pn_empty with dtype/shape of x. */
pn_tensor *pn_empty_like(const pn_tensor *x);
/* x itself (a new reference) when contiguous, else an unrecorded contiguous copy: what a
 * kernel reads while the autograd node is recorded on the caller's x. NULL + error on OOM. */
pn_tensor *pn_contig(pn_tensor *x);
/* Always a fresh contiguous copy (not recorded) that the caller owns alone. */
pn_tensor *pn_contig_copy(const pn_tensor *x);
/* Row-major strides for shape. */
void pn_contiguous_strides(int nd, const int64_t *shape, int64_t *strides);
int64_t pn_shape_numel(int nd, const int64_t *shape);
/* Error messages count dims, positions and list elements from 1, as the Lua reader does
 * (negative positions count from the end and are shown as given): PN_POS(i) for a 0-based i. */
#define PN_POS(i) ((i) >= 0 ? (i) + 1 : (i))
/* nd in range, no negative size, and Π max(size, 1) · element size fits in int64 (so strides,
 * offsets, numel and byte counts cannot overflow); the error names op and the shape */
pn_status pn_check_shape(const char *op, int nd, const int64_t *shape, int dtype);
bool pn_same_shape(const pn_tensor *a, const pn_tensor *b);

static inline size_t pn_elsize(int dt) {
    switch (dt) {
    case PN_F32: case PN_I32: return 4;
    case PN_F64: case PN_I64: return 8;
    default: return 1;
    }
}
/* Copies n bytes between buffers that do not overlap. Short runs (a head's row of 64 floats, a
 * 32-column panel row) are the common case in strided copies and packing: as inline 64-byte
 * moves they cost a few cycles, where a call to memcpy costs more than the bytes (a transposed
 * (T, H, D) copy spent a third of its time in the calls). Long runs take memcpy. */
static inline void pn_copy_run(void *__restrict dst, const void *__restrict src, size_t n) {
    char *d = (char *)dst;
    const char *s = (const char *)src;
    if (n >= 2048) {
        memcpy(d, s, n);
        return;
    }
    size_t i = 0;
    for (; i + 64 <= n; i += 64) memcpy(d + i, s + i, 64); /* constant sizes: inlined moves */
    for (; i + 4 <= n; i += 4) memcpy(d + i, s + i, 4);
    for (; i < n; i++) d[i] = s[i];
}

static inline bool pn_is_float(int dt) { return dt == PN_F32 || dt == PN_F64; }
static inline bool pn_is_index(int dt) { return dt == PN_I32 || dt == PN_I64; }

/* element 0 of the view */
static inline char *pn_ptr(const pn_tensor *t) {
    return (char *)t->storage->data + (size_t)t->offset * pn_elsize(t->dt);
}

/* ---- generic element access (slow path; kernels specialise f32/f64) ----------- */
PN_HD static inline double pn_ld(const void *p, int dt, int64_t i) {
    switch (dt) {
    case PN_F32: return ((const float *)p)[i];
    case PN_F64: return ((const double *)p)[i];
    case PN_I32: return ((const int32_t *)p)[i];
    case PN_I64: return (double)((const int64_t *)p)[i];
    default: return ((const uint8_t *)p)[i];
    }
}
PN_HD static inline void pn_st(void *p, int dt, int64_t i, double v) {
    switch (dt) {
    case PN_F32: ((float *)p)[i] = (float)v; break;
    case PN_F64: ((double *)p)[i] = v; break;
    case PN_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case PN_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    default: ((uint8_t *)p)[i] = (uint8_t)v; break;
    }
}
/* integer index load (i32 or i64 tensors) */
PN_HD static inline int64_t pn_ldi(const void *p, int dt, int64_t i) {
    return dt == PN_I64 ? ((const int64_t *)p)[i] : (int64_t)((const int32_t *)p)[i];
}

/* ---- random (rng.c) ---------------------------------------------------------------- */
/* Kernels that draw their own numbers: reserve `blocks` counter blocks of the global stream
 * (returns the first; *seed gets the key), then call pn_philox4x32(seed, first + b, w) for
 * block b — any thread, any order, same numbers. */
uint64_t pn_philox_reserve(int64_t blocks, uint64_t *seed);

/* Philox 4x32-10 (Salmon et al. 2011): 4 random words for counter block ctr under key seed.
 * Inline so kernels that draw per element keep it in registers. */
/* one round on one counter's words under the round's key (k0, k1); the key then advances by
 * PN_PHILOX_W0, PN_PHILOX_W1. A round of its own so a CPU kernel can run it over several
 * counters side by side (dropout.c: sixteen in a vector), the same words as pn_philox4x32's. */
#define PN_PHILOX_W0 0x9E3779B9u
#define PN_PHILOX_W1 0xBB67AE85u
PN_HD static inline void pn_philox_round(uint32_t *c0, uint32_t *c1, uint32_t *c2, uint32_t *c3, uint32_t k0,
                                         uint32_t k1) {
    uint64_t p0 = (uint64_t)0xD2511F53u * *c0, p1 = (uint64_t)0xCD9E8D57u * *c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ *c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ *c3 ^ k1;
    *c1 = (uint32_t)p1;
    *c3 = (uint32_t)p0;
    *c0 = n0;
    *c2 = n2;
}
PN_HD static inline void pn_philox4x32(uint64_t seed, uint64_t ctr, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)ctr, c1 = (uint32_t)(ctr >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++, k0 += PN_PHILOX_W0, k1 += PN_PHILOX_W1) pn_philox_round(&c0, &c1, &c2, &c3, k0, k1);
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* The two values of counter block ctr (fill_random, CPU and CUDA): uniform in [0, 1) with 53
 * bits each (kind 0), or a Box–Muller pair of standard normals (kind 1). */
PN_HD static inline void pn_philox_pair(uint64_t seed, uint64_t ctr, int kind, double *v0, double *v1) {
    uint32_t w[4];
    pn_philox4x32(seed, ctr, w);
    const double two53 = 1.0 / 9007199254740992.0;
    double u0 = (double)(((uint64_t)w[0] << 21) ^ (uint64_t)(w[1] >> 11)) * two53;
    double u1 = (double)(((uint64_t)w[2] << 21) ^ (uint64_t)(w[3] >> 11)) * two53;
    *v0 = u0;
    *v1 = u1;
    if (kind == 1) { /* Box–Muller: both outputs used */
        double r = sqrt(-2.0 * log(1.0 - u0)), th = 2.0 * 3.14159265358979323846 * u1;
        *v0 = r * cos(th);
        *v1 = r * sin(th);
    }
}

/* fill_random's block b (CPU and CUDA): values 2b and 2b+1 of the n-element contiguous p */
PN_HD static inline void pn_random_block(void *p, int dt, int64_t n, int kind, uint64_t seed, uint64_t base,
                                         int64_t b) {
    double v0, v1;
    pn_philox_pair(seed, base + (uint64_t)b, kind, &v0, &v1);
    int64_t i = 2 * b;
    if (dt == PN_F32) {
        float f0 = (float)v0, f1 = (float)v1;
        if (kind == 0) { /* keep [0,1): rounding to float could reach 1.0 */
            if (f0 >= 1.0f) f0 = 0x1.fffffep-1f;
            if (f1 >= 1.0f) f1 = 0x1.fffffep-1f;
        }
        ((float *)p)[i] = f0;
        if (i + 1 < n) ((float *)p)[i + 1] = f1;
    } else {
        pn_st(p, dt, i, v0);
        if (i + 1 < n) pn_st(p, dt, i + 1, v1);
    }
}

/* ---- dims and broadcasting ------------------------------------------------------ */
/* dim in [-nd, nd) → [0, nd); error names op. */
pn_status pn_wrap_dim(const char *op, int dim, int nd, int *out);
/* NumPy broadcast of two shapes; error names op and both shapes. */
pn_status pn_broadcast_shape(const char *op, int nda, const int64_t *sa, int ndb, const int64_t *sb,
                             int *nd_out, int64_t *out);
/* Strides of t viewed at shape (nd, shape): right-aligned, 0 where t has size 1 or is missing.
 * Caller has checked that t broadcasts to shape. */
void pn_broadcast_strides(const pn_tensor *t, int nd, const int64_t *shape, int64_t *strides);
/* When t is contiguous and its shape is a trailing part of big's (t's dims left of the match
 * all 1) — a bias (C) against (R, C) — the number of elements of that part (= numel(t));
 * otherwise -1. The row-broadcast fast paths of elementwise ops and sum_to use it. */
int64_t pn_suffix_numel(const pn_tensor *t, const pn_tensor *big);
/* Checks dtype/device: float tensors for differentiable maths. */
pn_status pn_check_float(const char *op, const char *arg, const pn_tensor *t);
pn_status pn_check_cpu(const char *op, const char *arg, const pn_tensor *t);

/* ---- iteration ------------------------------------------------------------------- */
#define PN_ITER_MAX_OPS 4
/* N operands walked over one shape. Operand 0 is usually the output.
 * Dims that are contiguous for every operand are merged, so the common case
 * is one long inner row. Usage:
 *     pn_iter it; pn_iter_init(&it, nd, shape, 2, (pn_tensor*[]){out, x}, NULL);
 *     for (int64_t r = 0; r < it.rows; r++) {
 *         int64_t off[PN_ITER_MAX_OPS]; pn_iter_row(&it, r, off);
 *         for (int64_t i = 0; i < it.inner; i++) o[off[0] + i*it.istride[0]] = …;
 *     }
 * Rows are independent, so `#pragma omp parallel for` over r is safe. */
typedef struct {
    int nd;                                  /* after merging; >= 1 */
    int nops;
    int64_t shape[PN_MAX_DIMS];
    int64_t strides[PN_ITER_MAX_OPS][PN_MAX_DIMS];
    int64_t inner;                           /* length of the last dim */
    int64_t istride[PN_ITER_MAX_OPS];        /* stride of each operand along it */
    int64_t rows;                            /* product of the other dims */
    int64_t numel;
} pn_iter;
/* strides_override: per-operand strides already broadcast to shape (or NULL to compute
 * them with pn_broadcast_strides from ops[i]). */
void pn_iter_init(pn_iter *it, int nd, const int64_t *shape, int nops, pn_tensor *const *ops,
                  const int64_t (*strides_override)[PN_MAX_DIMS]);
void pn_iter_row(const pn_iter *it, int64_t row, int64_t *off);

/* A thread's walk over consecutive rows (its share of a static schedule): row r + 1's offsets
 * follow from row r's by one odometer step instead of pn_iter_row's division per dim, which
 * cost more than the row itself for short rows (a (B, T, H, 64) permute copies 64-float rows).
 * Declare `pn_iter_pos pos = PN_ITER_POS_INIT;` before the loop, `firstprivate(pos)` on the
 * omp pragma, and call pn_iter_at(&it, r, &pos) for each r: pos.off then holds row r's
 * offsets (any r works; only the step from r to r + 1 is the fast one). */
typedef struct {
    int64_t row;
    int64_t idx[PN_MAX_DIMS];
    int64_t off[PN_ITER_MAX_OPS];
} pn_iter_pos;
#define PN_ITER_POS_INIT {.row = -2}
void pn_iter_seek(const pn_iter *it, int64_t row, pn_iter_pos *p);
static inline void pn_iter_at(const pn_iter *it, int64_t row, pn_iter_pos *p) {
    if (row != p->row + 1) {
        pn_iter_seek(it, row, p);
        return;
    }
    p->row = row;
    for (int d = it->nd - 2; d >= 0; d--) {
        for (int k = 0; k < it->nops; k++) p->off[k] += it->strides[k][d];
        if (++p->idx[d] < it->shape[d]) return;
        for (int k = 0; k < it->nops; k++) p->off[k] -= it->shape[d] * it->strides[k][d];
        p->idx[d] = 0;
    }
}

/* ---- autograd --------------------------------------------------------------------- */
/* gout: gradient wrt the node's output (borrowed). Fill gin[i] (new references) for the
 * inputs with pn_ag_input_needs(n, i); leave others NULL. Runs with grad mode off. */
typedef pn_status (*pn_backward_fn)(pn_node *n, pn_tensor *gout, pn_tensor **gin);

#define PN_NODE_SAVED 6
#define PN_NODE_SCALARS 8
#define PN_NODE_INTS (4 * PN_MAX_DIMS)
typedef struct {
    pn_node *node;    /* producer of input i, retained (non-leaf) */
    pn_tensor *leaf;  /* input i itself when it is a leaf requiring grad, retained */
    int32_t dtype;    /* input i's dtype, nd and shape (casts and broadcasting backwards need */
    int32_t nd;       /* them): recorded for every input, however many (graph attention has */
    int64_t shape[PN_MAX_DIMS]; /* 10, cat/stack a list of any length) */
} pn_edge;

struct pn_node {
    const char *name;
    pn_backward_fn backward;
    int n_in;
    pn_edge *in;                        /* n_in edges; an edge with neither is not needed */
    pn_tensor *saved[PN_NODE_SAVED];    /* retained; released after backward */
    uint64_t saved_version[PN_NODE_SAVED]; /* their storages' versions when saved */
    double sc[PN_NODE_SCALARS];         /* scalar arguments of the forward */
    int64_t iv[PN_NODE_INTS];           /* integer arguments (dims, shapes, op codes) */
    void *extra;                        /* op-owned data, freed with free_extra */
    void (*free_extra)(void *);
    int64_t refcount;                   /* output tensors + child nodes holding it */
    /* backward bookkeeping */
    pn_tensor *gacc;                    /* accumulated gradient wrt the output */
    int64_t deps;
    uint32_t mark;
    int released;                       /* saved state dropped after a backward */
};

/* 1 when grad mode is on and any of ins requires grad. */
bool pn_ag_needed(int n, pn_tensor *const *ins);
/* Create the node for out (which must not have one yet) over inputs ins; records the
 * input shapes. Returns NULL with an error set on OOM (caller releases out). */
pn_node *pn_ag_record(pn_tensor *out, const char *name, pn_backward_fn bw, int n, pn_tensor *const *ins);
/* Retains t into n->saved[next]; an error naming the node's op when all PN_NODE_SAVED slots
 * are taken (a programming error in the op, never silently dropped). */
__attribute__((warn_unused_result)) pn_status pn_ag_save(pn_node *n, pn_tensor *t);
/* A watcher of leaf gradients during pn_backward (core/dist/reducer.c sends each one to the other
 * ranks as soon as it is final, while the backward goes on). Pass 1 calls edge() once per edge
 * into a leaf it reaches, then counted(); pass 2 calls done() after each such edge's gradient
 * was added (with or without one), so a leaf is final when its edges are all done, and
 * progress() after every node. An error from a callback ends the backward with it. One
 * watcher at a time; NULL: none. */
typedef struct {
    void (*edge)(void *ctx, pn_tensor *leaf);
    pn_status (*counted)(void *ctx);
    pn_status (*done)(void *ctx, pn_tensor *leaf);
    pn_status (*progress)(void *ctx);
    void *ctx;
} pn_leaf_watch;
void pn_ag_watch(const pn_leaf_watch *w);
static inline bool pn_ag_input_needs(const pn_node *n, int i) {
    return n->in[i].node != NULL || n->in[i].leaf != NULL;
}
void pn_node_release(pn_node *n);

/* Convenience for backward functions: the gradient g (borrowed) reduced to input i's
 * recorded shape (sum over broadcast dims). New reference. */
pn_tensor *pn_grad_to_input(pn_node *n, int i, pn_tensor *g);

#if defined(__cplusplus) && !defined(PN_FFI)
}
#endif
#endif /* PN_INTERNAL_H */

/* index.c — indexing and graph ops: embedding, index_select, gather, scatter_add,
 * index_add, and the CSR segment ops segment_sum / segment_softmax used by graph
 * attention. Each forward is next to its backward.
 *
 * Index tensors are i32 or i64 and hold 0-based indices. Every index is checked before
 * anything is allocated; a bad one is an error naming the op, the value, its position
 * in the index tensor and the shapes.
 *
 * Determinism: accumulating kernels (index_add, scatter_add, the backward of embedding,
 * index_select and gather) never use float atomics. Work is split so that each output
 * element is owned by one thread, which adds its contributions in index order; the
 * result does not depend on the thread count. */
#include "../backend.h"

#include <stdio.h>

/* ---- helpers ----------------------------------------------------------------------------- */
static pn_status check_index_tensor(const char *op, const char *arg, const pn_tensor *idx) {
    if (!idx) return pn_error(PN_ERR_ARG, "%s: %s is nil", op, arg);
    if (!pn_is_index(idx->dt))
        return pn_error(PN_ERR_DTYPE, "%s: %s %s has dtype %s, expected i32 or i64", op, arg, pn_shape_str(idx),
                        pn_dtype_name(idx->dt));
    return PN_OK;
}

/* CPU kernel (kernels.def): idx any shape and strides, i32/i64. The first row-major position
 * whose value is outside [0, limit) and is not `skip` (-1: none) with its value, and how many
 * values are not `skip`. One of the two kernels that answer to the host (index errors name
 * the value and its position). */
pn_status pn_cpu_index_scan(const pn_tensor *idx, int64_t limit, int64_t skip, int64_t *first_bad, int64_t *bad_value,
                            int64_t *kept) {
    pn_iter it;
    pn_iter_init(&it, idx->nd, idx->sizes, 1, (pn_tensor *const[]){(pn_tensor *)idx}, NULL);
    const char *p = pn_ptr(idx);
    int64_t k = 0;
    *first_bad = -1;
    for (int64_t r = 0; r < it.rows; r++) { /* serial: the first bad position is the one reported */
        int64_t off[PN_ITER_MAX_OPS];
        pn_iter_row(&it, r, off);
        for (int64_t i = 0; i < it.inner; i++) {
            int64_t v = pn_ldi(p, idx->dt, off[0] + i * it.istride[0]);
            if (v == skip) continue;
            k++;
            if ((v < 0 || v >= limit) && *first_bad < 0) *first_bad = r * it.inner + i, *bad_value = v;
        }
    }
    *kept = k;
    return PN_OK;
}

/* Every value of idx in [0, limit) or equal to skip (pass INT64_MIN for none), scanned on idx's
 * device; *kept (may be NULL) the values not equal to skip. what describes the target. */
static pn_status scan_range(const char *op, const char *arg, const pn_tensor *idx, int64_t limit, int64_t skip,
                            const char *what, int64_t *kept) {
    const pn_kernels *k;
    PN_TRY(pn_backend_for(op, idx->dev, &k));
    int64_t bad = -1, v = 0, n = 0;
    PN_TRY(PN_KCALL(op, k, index_scan, idx, limit, skip, &bad, &v, &n));
    if (kept) *kept = n;
    if (bad >= 0)
        return pn_error(PN_ERR_INDEX, "%s: %s value %lld at position %s of %s %s is out of range for %s "
                        "(valid 0..%lld)", op, arg, (long long)v, pn_pos_str(idx->nd, idx->sizes, bad), arg,
                        pn_shape_str(idx), what, (long long)limit - 1);
    return PN_OK;
}

static pn_status check_range(const char *op, const char *arg, const pn_tensor *idx, int64_t limit, const char *what) {
    return scan_range(op, arg, idx, limit, INT64_MIN, what, NULL);
}

static int64_t prod(const int64_t *s, int from, int to) {
    int64_t n = 1;
    for (int i = from; i < to; i++) n *= s[i];
    return n;
}

/* Record a node over the float inputs ins[0..n) and save the given tensors. */
static pn_tensor *record(pn_tensor *out, const char *name, pn_backward_fn bw, int n, pn_tensor *const *ins,
                         pn_tensor *s0, pn_tensor *s1) {
    if (!pn_ag_needed(n, ins)) return out;
    pn_node *node = pn_ag_record(out, name, bw, n, ins);
    if (!node) {
        pn_release(out);
        return NULL;
    }
    if ((s0 && pn_ag_save(node, s0)) || (s1 && pn_ag_save(node, s1))) {
        pn_release(out);
        return NULL;
    }
    return out;
}

/* ---- shared kernels ------------------------------------------------------------------------ */
/* out (outer, n, inner) = x (outer, V, inner)[:, idx, :]; both contiguous, idx (n) contiguous.
 * Any dtype. */
pn_status pn_cpu_select_rows(const pn_tensor *xt, const pn_tensor *idx, int64_t outer, int64_t V, int64_t n,
                             int64_t inner, pn_tensor *outt) {
    size_t es = pn_elsize(xt->dt);
    char *out = pn_ptr(outt);
    const char *x = pn_ptr(xt);
    const void *ip = pn_ptr(idx);
    size_t row = (size_t)inner * es;
    #pragma omp parallel for if (outer * n * inner > PN_PAR_MIN) schedule(static)
    for (int64_t t = 0; t < outer * n; t++) {
        int64_t o = t / n, j = t % n;
        memcpy(out + (size_t)t * row, x + (size_t)(o * V + pn_ldi(ip, idx->dt, j)) * row, row);
    }
    return PN_OK;
}

/* dst (outer, V, inner) += src (outer, n, inner) scattered by idx (n) along the middle dim.
 * Both contiguous. Tasks own (o, column block) pairs and walk j in order: deterministic. */
#define ADD_BLOCK 256
pn_status pn_cpu_add_rows(pn_tensor *dstt, const pn_tensor *srct, const pn_tensor *idx, int64_t outer, int64_t V,
                          int64_t n, int64_t inner) {
    const int dt = dstt->dt;
    char *dst = pn_ptr(dstt);
    const char *src = pn_ptr(srct);
    const void *ip = pn_ptr(idx);
    int64_t nblk = (inner + ADD_BLOCK - 1) / ADD_BLOCK;
    #pragma omp parallel for if (outer * n * inner > PN_PAR_MIN && outer * nblk > 1) schedule(static)
    for (int64_t t = 0; t < outer * nblk; t++) {
        int64_t o = t / nblk, c0 = (t % nblk) * ADD_BLOCK, c1 = c0 + ADD_BLOCK < inner ? c0 + ADD_BLOCK : inner;
        for (int64_t j = 0; j < n; j++) {
            int64_t d = (o * V + pn_ldi(ip, idx->dt, j)) * inner, s = (o * n + j) * inner;
            if (dt == PN_F32) {
                float *pd = (float *)dst + d;
                const float *ps = (const float *)src + s;
                for (int64_t i = c0; i < c1; i++) pd[i] += ps[i];
            } else if (dt == PN_F64) {
                double *pd = (double *)dst + d;
                const double *ps = (const double *)src + s;
                for (int64_t i = c0; i < c1; i++) pd[i] += ps[i];
            } else {
                for (int64_t i = c0; i < c1; i++) pn_st(dst, dt, d + i, pn_ld(dst, dt, d + i) + pn_ld(src, dt, s + i));
            }
        }
    }
    return PN_OK;
}

/* dst (contiguous, x's shape)[… idx[p] …] += src[p] for every position p of idx along dim
 * (torch scatter_add_). src is read with its own strides over idx's shape. The iteration
 * puts `dim` innermost, so a row is one set of the other coordinates: rows touch disjoint
 * outputs and may run in parallel, each adding in index order. */
pn_status pn_cpu_scatter_add(pn_tensor *dst, int dim, const pn_tensor *idx, const pn_tensor *src) {
    int nd = idx->nd, dt = dst->dt;
    int64_t shape[PN_MAX_DIMS], st[PN_ITER_MAX_OPS][PN_MAX_DIMS];
    int order[PN_MAX_DIMS], k = 0;
    for (int i = 0; i < nd; i++)
        if (i != dim) order[k++] = i;
    order[k] = dim;
    for (int i = 0; i < nd; i++) {
        int d = order[i];
        shape[i] = idx->sizes[d];
        st[0][i] = d == dim ? 0 : dst->strides[d];
        st[1][i] = idx->strides[d];
        st[2][i] = src->strides[d];
    }
    pn_iter it;
    pn_iter_init(&it, nd, shape, 3, (pn_tensor *const[]){dst, (pn_tensor *)idx, (pn_tensor *)src}, st);
    char *pd = pn_ptr(dst);
    const char *pi = pn_ptr(idx), *ps = pn_ptr(src);
    int64_t dstride = dst->strides[dim];
    #pragma omp parallel for if (it.numel > PN_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < it.rows; r++) {
        int64_t off[PN_ITER_MAX_OPS];
        pn_iter_row(&it, r, off);
        for (int64_t i = 0; i < it.inner; i++) {
            int64_t d = off[0] + i * it.istride[0] + pn_ldi(pi, idx->dt, off[1] + i * it.istride[1]) * dstride;
            int64_t s = off[2] + i * it.istride[2];
            if (dt == PN_F32) ((float *)pd)[d] += ((const float *)ps)[s];
            else if (dt == PN_F64) ((double *)pd)[d] += ((const double *)ps)[s];
            else pn_st(pd, dt, d, pn_ld(pd, dt, d) + pn_ld(ps, dt, s));
        }
    }
    return PN_OK;
}

/* ---- embedding ------------------------------------------------------------------------------- */
/* saved: idx (contiguous). dW (V, D) = Σ over positions p of g[p] into row idx[p]. */
static pn_status embedding_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    pn_tensor *idx = n->saved[0];
    int64_t V = n->in[0].shape[0], D = n->in[0].shape[1];
    pn_tensor *gw = pn_zeros(2, n->in[0].shape, g->dt, g->dev);
    pn_tensor *gc = gw ? pn_contig(g) : NULL;
    pn_status st = gc ? PN_KCALL_ON("embedding", gw, add_rows, gw, gc, idx, 1, V, pn_numel(idx), D) : PN_ERR_OOM;
    return pn_bw_result(st, gc, gw, &gin[0]);
}

pn_tensor *pn_embedding(pn_tensor *w, pn_tensor *idx) {
    int dev;
    const pn_kernels *k;
    if (!w) return pn_error_null(PN_ERR_ARG, "embedding: weight is nil");
    if (check_index_tensor("embedding", "idx", idx) ||
        pn_kernels_for("embedding", 2, (const pn_tensor *const[]){w, idx}, (const char *const[]){"weight", "idx"},
                       &dev, &k))
        return NULL;
    if (w->nd != 2) return pn_error_null(PN_ERR_SHAPE, "embedding: weight %s must be 2-D (V, D)", pn_shape_str(w));
    if (idx->nd + 1 > PN_MAX_DIMS)
        return pn_error_null(PN_ERR_SHAPE, "embedding: idx %s has too many dims for a (…, D) result", pn_shape_str(idx));
    pn_tensor *ic = pn_contig(idx);
    if (!ic) return NULL;
    char what[96];
    snprintf(what, sizeof what, "the rows of weight %s", pn_shape_str(w));
    if (check_range("embedding", "idx", ic, w->sizes[0], what)) {
        pn_release(ic);
        return NULL;
    }
    int64_t shape[PN_MAX_DIMS];
    memcpy(shape, idx->sizes, sizeof(int64_t) * (size_t)idx->nd);
    shape[idx->nd] = w->sizes[1];
    pn_tensor *wc = pn_contig(w);
    pn_tensor *out = wc ? pn_empty(idx->nd + 1, shape, w->dt, dev) : NULL;
    if (out && PN_KCALL("embedding", k, select_rows, wc, ic, 1, w->sizes[0], pn_numel(ic), w->sizes[1], out)) {
        pn_release(out);
        out = NULL;
    }
    pn_release(wc);
    if (out) out = record(out, "embedding", embedding_bw, 1, &w, ic, NULL);
    pn_release(ic);
    return out;
}

/* ---- index_select / index_add ------------------------------------------------------------------ */
/* x, idx (and src) given, idx an index tensor, all on one device; dim of x wrapped into *d */
static pn_status index_front(const char *op, pn_tensor *x, int dim, pn_tensor *idx, pn_tensor *src, int *d) {
    int dev;
    const pn_kernels *k;
    if (!x) return pn_error(PN_ERR_ARG, "%s: x is nil", op);
    PN_TRY(check_index_tensor(op, "idx", idx));
    PN_TRY(pn_kernels_for(op, 3, (const pn_tensor *const[]){x, idx, src}, (const char *const[]){"x", "idx", "src"}, &dev,
                          &k));
    if (x->nd == 0) return pn_error(PN_ERR_SHAPE, "%s: x is 0-dim; it needs at least 1 dim", op);
    return pn_wrap_dim(op, dim, x->nd, d);
}

/* Common checks: x, dim → d; idx 1-D, values in [0, x.size(d)). Returns a contiguous idx. */
static pn_tensor *index_args(const char *op, pn_tensor *x, int dim, pn_tensor *idx, pn_tensor *src, int *d) {
    if (index_front(op, x, dim, idx, src, d)) return NULL;
    if (idx->nd != 1) return pn_error_null(PN_ERR_SHAPE, "%s: idx %s must be 1-D", op, pn_shape_str(idx));
    pn_tensor *ic = pn_contig(idx);
    if (!ic) return NULL;
    char what[96];
    snprintf(what, sizeof what, "dim %d of x %s", *d + 1, pn_shape_str(x));
    if (check_range(op, "idx", ic, x->sizes[*d], what)) {
        pn_release(ic);
        return NULL;
    }
    return ic;
}

/* iv[0] = dim; saved: idx. dx = zeros with g added into rows idx along dim. */
static pn_status index_select_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    int d = (int)n->iv[0], nd = (int)n->in[0].nd;
    const int64_t *xs = n->in[0].shape;
    pn_tensor *idx = n->saved[0];
    pn_tensor *gx = pn_zeros(nd, xs, g->dt, g->dev);
    pn_tensor *gc = gx ? pn_contig(g) : NULL;
    pn_status st = gc ? PN_KCALL_ON("index_select", gx, add_rows, gx, gc, idx, prod(xs, 0, d), xs[d], pn_numel(idx),
                                    prod(xs, d + 1, nd))
                      : PN_ERR_OOM;
    return pn_bw_result(st, gc, gx, &gin[0]);
}

pn_tensor *pn_index_select(pn_tensor *x, int dim, pn_tensor *idx) {
    int d;
    pn_tensor *ic = index_args("index_select", x, dim, idx, NULL, &d);
    if (!ic) return NULL;
    int64_t shape[PN_MAX_DIMS];
    memcpy(shape, x->sizes, sizeof shape);
    shape[d] = idx->sizes[0];
    pn_tensor *xc = pn_contig(x);
    pn_tensor *out = xc ? pn_empty(x->nd, shape, x->dt, x->dev) : NULL;
    if (out && PN_KCALL_ON("index_select", out, select_rows, xc, ic, prod(x->sizes, 0, d), x->sizes[d], shape[d],
                           prod(x->sizes, d + 1, x->nd), out)) {
        pn_release(out);
        out = NULL;
    }
    pn_release(xc);
    if (out) out = record(out, "index_select", index_select_bw, 1, &x, ic, NULL);
    if (out && out->fn) out->fn->iv[0] = d;
    pn_release(ic);
    return out;
}

/* iv[0] = dim; saved: idx. dx = g; dsrc = g[:, idx, :] along dim. */
static pn_status index_add_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    if (pn_ag_input_needs(n, 0)) {
        pn_retain(g);
        gin[0] = g;
    }
    if (pn_ag_input_needs(n, 1) && !(gin[1] = pn_index_select(g, (int)n->iv[0], n->saved[0]))) return PN_ERR_OOM;
    return PN_OK;
}

pn_tensor *pn_index_add(pn_tensor *x, int dim, pn_tensor *idx, pn_tensor *src) {
    int d;
    if (!src) return pn_error_null(PN_ERR_ARG, "index_add: src is nil");
    pn_tensor *ic = index_args("index_add", x, dim, idx, src, &d);
    if (!ic) return NULL;
    bool ok = src->nd == x->nd && src->dt == x->dt;
    for (int i = 0; ok && i < x->nd; i++) ok = src->sizes[i] == (i == d ? idx->sizes[0] : x->sizes[i]);
    if (!ok) {
        pn_release(ic);
        return pn_error_null(PN_ERR_SHAPE, "index_add: src %s %s must be %s shaped like x %s %s with dim %d of size "
                             "%lld (the length of idx %s)", pn_dtype_name(src->dt), pn_shape_str(src),
                             pn_dtype_name(x->dt), pn_dtype_name(x->dt), pn_shape_str(x), d + 1,
                             (long long)idx->sizes[0], pn_shape_str(idx));
    }
    pn_tensor *out = pn_empty_like(x), *sc = NULL;
    if (out && pn_copy_(out, x)) {
        pn_release(out);
        out = NULL;
    }
    if (out && !(sc = pn_contig(src))) {
        pn_release(out);
        out = NULL;
    }
    if (out && PN_KCALL_ON("index_add", out, add_rows, out, sc, ic, prod(x->sizes, 0, d), x->sizes[d], idx->sizes[0],
                           prod(x->sizes, d + 1, x->nd))) {
        pn_release(out);
        out = NULL;
    }
    pn_release(sc);
    pn_tensor *ins[2] = {x, src};
    if (out) out = record(out, "index_add", index_add_bw, 2, ins, ic, NULL);
    if (out && out->fn) out->fn->iv[0] = d;
    pn_release(ic);
    return out;
}

/* ---- gather / scatter_add ------------------------------------------------------------------------- */
/* Shared checks (torch semantics): x, idx (and src) have the same number of dims;
 * idx.size(k) <= x.size(k) for k != dim; idx.size(k) <= src.size(k) for every k;
 * values in [0, x.size(dim)). Returns idx (retained) or NULL. */
static pn_tensor *gather_args(const char *op, pn_tensor *x, int dim, pn_tensor *idx, pn_tensor *src, int *d) {
    if (index_front(op, x, dim, idx, src, d)) return NULL;
    if (idx->nd != x->nd)
        return pn_error_null(PN_ERR_SHAPE, "%s: idx %s and x %s must have the same number of dims", op,
                             pn_shape_str(idx), pn_shape_str(x));
    for (int k = 0; k < x->nd; k++)
        if (k != *d && idx->sizes[k] > x->sizes[k])
            return pn_error_null(PN_ERR_SHAPE, "%s: idx %s is larger than x %s at dim %d", op, pn_shape_str(idx),
                                 pn_shape_str(x), k + 1);
    if (src) {
        if (src->dt != x->dt)
            return pn_error_null(PN_ERR_DTYPE, "%s: src %s has dtype %s, x %s has %s", op, pn_shape_str(src),
                                 pn_dtype_name(src->dt), pn_shape_str(x), pn_dtype_name(x->dt));
        bool ok = src->nd == idx->nd;
        for (int k = 0; ok && k < idx->nd; k++) ok = idx->sizes[k] <= src->sizes[k];
        if (!ok)
            return pn_error_null(PN_ERR_SHAPE, "%s: idx %s must fit inside src %s (same dims, no larger size)", op,
                                 pn_shape_str(idx), pn_shape_str(src));
    }
    char what[96];
    snprintf(what, sizeof what, "dim %d of x %s", *d + 1, pn_shape_str(x));
    if (check_range(op, "idx", idx, x->sizes[*d], what)) return NULL;
    pn_retain(idx);
    return idx;
}

/* iv[0] = dim; saved: idx. dx = zeros(x) scatter-added with g. */
static pn_status gather_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    pn_tensor *gx = pn_zeros((int)n->in[0].nd, n->in[0].shape, g->dt, g->dev);
    if (!gx) return PN_ERR_OOM;
    pn_status st = PN_KCALL_ON("gather", gx, scatter_add, gx, (int)n->iv[0], n->saved[0], g);
    if (st) {
        pn_release(gx);
        return st;
    }
    gin[0] = gx;
    return PN_OK;
}

pn_tensor *pn_gather(pn_tensor *x, int dim, pn_tensor *idx) {
    int d;
    if (!(idx = gather_args("gather", x, dim, idx, NULL, &d))) return NULL;
    pn_tensor *out = pn_empty(idx->nd, idx->sizes, x->dt, x->dev);
    if (out && PN_KCALL_ON("gather", out, gather, out, d, idx, x)) {
        pn_release(out);
        out = NULL;
    }
    if (!out) {
        pn_release(idx);
        return NULL;
    }
    out = record(out, "gather", gather_bw, 1, &x, idx, NULL);
    if (out && out->fn) out->fn->iv[0] = d;
    pn_release(idx);
    return out;
}

/* CPU kernel: out (idx's shape) = x read at idx's coordinates, idx's value along dim */
pn_status pn_cpu_gather(pn_tensor *out, int d, const pn_tensor *idx, const pn_tensor *x) {
    /* walk idx's shape; x is read at the same coordinates except along dim */
    int64_t st[PN_ITER_MAX_OPS][PN_MAX_DIMS];
    memcpy(st[0], out->strides, sizeof st[0]);
    memcpy(st[1], idx->strides, sizeof st[1]);
    memcpy(st[2], x->strides, sizeof st[2]);
    st[2][d] = 0;
    pn_iter it;
    pn_iter_init(&it, idx->nd, idx->sizes, 3, (pn_tensor *const[]){out, (pn_tensor *)idx, (pn_tensor *)x}, st);
    char *po = pn_ptr(out);
    const char *pi = pn_ptr(idx), *px = pn_ptr(x);
    int dt = x->dt;
    size_t es = pn_elsize(dt);
    int64_t xs = x->strides[d];
    #pragma omp parallel for if (it.numel > PN_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < it.rows; r++) {
        int64_t off[PN_ITER_MAX_OPS];
        pn_iter_row(&it, r, off);
        for (int64_t i = 0; i < it.inner; i++) {
            int64_t o = off[0] + i * it.istride[0];
            int64_t s = off[2] + i * it.istride[2] + pn_ldi(pi, idx->dt, off[1] + i * it.istride[1]) * xs;
            if (dt == PN_F32) ((float *)po)[o] = ((const float *)px)[s];
            else if (dt == PN_F64) ((double *)po)[o] = ((const double *)px)[s];
            else memcpy(po + (size_t)o * es, px + (size_t)s * es, es);
        }
    }
    return PN_OK;
}

/* iv[0] = dim; saved: idx. dx = g; dsrc = gather(g, dim, idx) in the leading block of
 * src's shape that idx covers, zero elsewhere (those src elements were not used). */
static pn_status scatter_add_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    pn_tensor *idx = n->saved[0];
    int d = (int)n->iv[0];
    if (pn_ag_input_needs(n, 0)) {
        pn_retain(g);
        gin[0] = g;
    }
    if (!pn_ag_input_needs(n, 2)) return PN_OK;
    pn_tensor *gs = pn_gather(g, d, idx);
    if (!gs) return PN_ERR_OOM;
    int nd = (int)n->in[2].nd;
    const int64_t *ss = n->in[2].shape;
    if (pn_shape_numel(nd, ss) == pn_numel(gs)) {
        gin[2] = gs;
        return PN_OK;
    }
    pn_tensor *z = pn_zeros(nd, ss, g->dt, g->dev);
    pn_tensor *v = z;
    if (z) pn_retain(z);
    for (int k = 0; v && k < nd; k++) {
        pn_tensor *nv = pn_narrow(v, k, 0, idx->sizes[k]);
        pn_release(v);
        v = nv;
    }
    pn_status s = v ? pn_copy_(v, gs) : PN_ERR_OOM;
    pn_release(v);
    pn_release(gs);
    if (s) {
        pn_release(z);
        return s;
    }
    gin[2] = z;
    return PN_OK;
}

pn_tensor *pn_scatter_add(pn_tensor *x, int dim, pn_tensor *idx, pn_tensor *src) {
    int d;
    if (!src) return pn_error_null(PN_ERR_ARG, "scatter_add: src is nil");
    if (!(idx = gather_args("scatter_add", x, dim, idx, src, &d))) return NULL;
    pn_tensor *out = pn_empty_like(x);
    if (out && pn_copy_(out, x)) {
        pn_release(out);
        out = NULL;
    }
    if (out && PN_KCALL_ON("scatter_add", out, scatter_add, out, d, idx, src)) {
        pn_release(out);
        out = NULL;
    }
    pn_tensor *ins[3] = {x, NULL, src};
    if (out) out = record(out, "scatter_add", scatter_add_bw, 3, ins, idx, NULL);
    if (out && out->fn) out->fn->iv[0] = d;
    pn_release(idx);
    return out;
}

/* ---- segments (CSR) ---------------------------------------------------------------------------------- */
/* offsets: 1-D i32/i64 of length S+1, offsets[0] = 0, non-decreasing, offsets[S] = rows of x.
 * Returns the offsets as a contiguous i64 tensor (one format for the kernels). */
/* CPU kernel: off (S+1) i64 contiguous. ends[0], ends[1] = off[0], off[S]; *first_drop = the
 * first i with off[i] < off[i-1] (-1: none), *drop = {off[i-1], off[i]} there. The other kernel
 * that answers to the host (for the error messages). */
pn_status pn_cpu_offsets_scan(const pn_tensor *off, int64_t *ends, int64_t *first_drop, int64_t *drop) {
    const int64_t *o = (const int64_t *)pn_ptr(off);
    int64_t S = off->sizes[0] - 1;
    ends[0] = o[0], ends[1] = o[S], *first_drop = -1;
    for (int64_t i = 1; i <= S; i++)
        if (o[i] < o[i - 1]) {
            *first_drop = i, drop[0] = o[i - 1], drop[1] = o[i];
            break;
        }
    return PN_OK;
}

static pn_tensor *segment_args(const char *op, pn_tensor *x, pn_tensor *offsets) {
    int dev;
    const pn_kernels *k;
    if (!x) return pn_error_null(PN_ERR_ARG, "%s: x is nil", op);
    if (check_index_tensor(op, "offsets", offsets) ||
        pn_kernels_for(op, 2, (const pn_tensor *const[]){x, offsets}, (const char *const[]){"x", "offsets"}, &dev, &k))
        return NULL;
    if (x->nd == 0) return pn_error_null(PN_ERR_SHAPE, "%s: x is 0-dim; it needs a leading (E) dim", op);
    if (offsets->nd != 1 || offsets->sizes[0] < 1)
        return pn_error_null(PN_ERR_SHAPE, "%s: offsets %s must be 1-D with S+1 >= 1 entries", op,
                             pn_shape_str(offsets));
    pn_tensor *oc = pn_empty(1, offsets->sizes, PN_I64, dev);
    if (!oc) return NULL;
    int64_t ends[2], i = -1, drop[2];
    if (pn_copy_(oc, offsets) || PN_KCALL(op, k, offsets_scan, oc, ends, &i, drop)) {
        pn_release(oc);
        return NULL;
    }
    int64_t S = oc->sizes[0] - 1, E = x->sizes[0];
    pn_status s = PN_OK;
    if (ends[0] != 0)
        s = pn_error(PN_ERR_INDEX, "%s: offsets %s must start at 0, got offsets[1] = %lld", op, pn_shape_str(offsets),
                     (long long)ends[0]);
    else if (i >= 0)
        s = pn_error(PN_ERR_INDEX, "%s: offsets must be non-decreasing, got offsets[%lld] = %lld after "
                     "offsets[%lld] = %lld", op, (long long)i + 1, (long long)drop[1], (long long)i,
                     (long long)drop[0]);
    else if (ends[1] != E)
        s = pn_error(PN_ERR_INDEX, "%s: offsets must end at the %lld rows of x %s, got offsets[%lld] = %lld", op,
                     (long long)E, pn_shape_str(x), (long long)S + 1, (long long)ends[1]);
    if (s) {
        pn_release(oc);
        return NULL;
    }
    return oc;
}

/* saved: offsets (i64). dx[e] = g[segment of e]. */
static pn_status segment_sum_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    pn_tensor *gx = pn_empty((int)n->in[0].nd, n->in[0].shape, g->dt, g->dev);
    pn_tensor *gc = gx ? pn_contig(g) : NULL;
    pn_status st = gc ? PN_KCALL_ON("segment_sum", gx, segment_sum_bwd, gx, gc, n->saved[0]) : PN_ERR_OOM;
    return pn_bw_result(st, gc, gx, &gin[0]);
}

/* CPU kernel: gx (E, …) row e = g (S, …) row of e's segment; both contiguous */
pn_status pn_cpu_segment_sum_bwd(pn_tensor *gx, const pn_tensor *g, const pn_tensor *offsets) {
    const int64_t *o = (const int64_t *)pn_ptr(offsets);
    int64_t S = offsets->sizes[0] - 1;
    size_t row = (size_t)prod(gx->sizes, 1, gx->nd) * pn_elsize(g->dt);
    char *pd = pn_ptr(gx);
    const char *ps = pn_ptr(g);
    #pragma omp parallel for if (pn_numel(gx) > PN_PAR_MIN) schedule(dynamic, 64)
    for (int64_t s = 0; s < S; s++)
        for (int64_t e = o[s]; e < o[s + 1]; e++) memcpy(pd + (size_t)e * row, ps + (size_t)s * row, row);
    return PN_OK;
}

pn_tensor *pn_segment_sum(pn_tensor *x, pn_tensor *offsets) {
    pn_tensor *oc = segment_args("segment_sum", x, offsets);
    if (!oc) return NULL;
    int64_t S = oc->sizes[0] - 1;
    int64_t shape[PN_MAX_DIMS];
    memcpy(shape, x->sizes, sizeof shape);
    shape[0] = S;
    pn_tensor *xc = pn_contig(x);
    pn_tensor *out = xc ? pn_zeros(x->nd, shape, x->dt, x->dev) : NULL;
    if (out && PN_KCALL_ON("segment_sum", out, segment_sum, out, xc, oc)) {
        pn_release(out);
        out = NULL;
    }
    pn_release(xc);
    if (out) out = record(out, "segment_sum", segment_sum_bw, 1, &x, oc, NULL);
    pn_release(oc);
    return out;
}

/* CPU kernel: out (S, …) zeroed += the rows of x (E, …) segment by segment; both contiguous */
pn_status pn_cpu_segment_sum(pn_tensor *out, const pn_tensor *x, const pn_tensor *offsets) {
    int64_t S = offsets->sizes[0] - 1, inner = prod(x->sizes, 1, x->nd);
    {
        const int64_t *o = (const int64_t *)pn_ptr(offsets);
        char *po = pn_ptr(out);
        const char *px = pn_ptr(x);
        int dt = x->dt;
        /* one thread owns a segment and adds its rows in order */
        #pragma omp parallel for if (pn_numel(x) > PN_PAR_MIN) schedule(dynamic, 64)
        for (int64_t s = 0; s < S; s++) {
            for (int64_t e = o[s]; e < o[s + 1]; e++) {
                if (dt == PN_F32) {
                    float *d = (float *)po + s * inner;
                    const float *r = (const float *)px + e * inner;
                    for (int64_t i = 0; i < inner; i++) d[i] += r[i];
                } else if (dt == PN_F64) {
                    double *d = (double *)po + s * inner;
                    const double *r = (const double *)px + e * inner;
                    for (int64_t i = 0; i < inner; i++) d[i] += r[i];
                } else {
                    for (int64_t i = 0; i < inner; i++)
                        pn_st(po, dt, s * inner + i, pn_ld(po, dt, s * inner + i) + pn_ld(px, dt, e * inner + i));
                }
            }
        }
    }
    return PN_OK;
}

/* Softmax over the rows [e0, e1) of one segment, separately for each of the inner
 * columns. A segment whose entries are all -inf gets zeros (nothing to attend to)
 * rather than NaN. Strided along the rows; inner is small in graph attention (heads). */
#define SEGMENT_SOFTMAX(T, EXP)                                                      \
    static void segment_softmax_##T(T *y, const T *x, int64_t e0, int64_t e1, int64_t inner) { \
        for (int64_t i = 0; i < inner; i++) {                                        \
            T m = -INFINITY;                                                         \
            for (int64_t e = e0; e < e1; e++) m = x[e * inner + i] > m ? x[e * inner + i] : m; \
            if (m == -INFINITY) {                                                    \
                for (int64_t e = e0; e < e1; e++) y[e * inner + i] = 0;              \
                continue;                                                            \
            }                                                                        \
            double sum = 0;                                                          \
            for (int64_t e = e0; e < e1; e++) {                                      \
                T v = EXP(x[e * inner + i] - m);                                     \
                y[e * inner + i] = v;                                                \
                sum += v;                                                            \
            }                                                                        \
            T inv = (T)(1.0 / sum);                                                  \
            for (int64_t e = e0; e < e1; e++) y[e * inner + i] *= inv;               \
        }                                                                            \
    }
SEGMENT_SOFTMAX(float, expf)
SEGMENT_SOFTMAX(double, exp)

/* dx = y ⊙ (g − Σ_segment y·g), per column. */
#define SEGMENT_SOFTMAX_BW(T)                                                        \
    static void segment_softmax_bw_##T(T *dx, const T *y, const T *g, int64_t e0, int64_t e1, int64_t inner) { \
        for (int64_t i = 0; i < inner; i++) {                                        \
            double dot = 0;                                                          \
            for (int64_t e = e0; e < e1; e++) dot += (double)y[e * inner + i] * g[e * inner + i]; \
            for (int64_t e = e0; e < e1; e++)                                        \
                dx[e * inner + i] = (T)(y[e * inner + i] * (g[e * inner + i] - dot)); \
        }                                                                            \
    }
SEGMENT_SOFTMAX_BW(float)
SEGMENT_SOFTMAX_BW(double)

/* saved: offsets (i64), y (the output). */
static pn_status segment_softmax_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    pn_tensor *oc = n->saved[0], *y = n->saved[1];
    pn_tensor *gx = pn_empty_like(y);
    pn_tensor *gc = gx ? pn_contig(g) : NULL;
    pn_status st = gc ? PN_KCALL_ON("segment_softmax", gx, segment_softmax_bwd, gx, y, gc, oc) : PN_ERR_OOM;
    return pn_bw_result(st, gc, gx, &gin[0]);
}

/* CPU kernels: y, x, gx, g (E, …) contiguous, softmax per segment and column */
pn_status pn_cpu_segment_softmax_bwd(pn_tensor *gx, const pn_tensor *y, const pn_tensor *g, const pn_tensor *offsets) {
    const int64_t *o = (const int64_t *)pn_ptr(offsets);
    int64_t S = offsets->sizes[0] - 1, inner = prod(y->sizes, 1, y->nd);
    void *pd = pn_ptr(gx);
    const void *py = pn_ptr(y), *pg = pn_ptr(g);
    #pragma omp parallel for if (pn_numel(y) > PN_PAR_MIN) schedule(dynamic, 64)
    for (int64_t s = 0; s < S; s++) {
        if (y->dt == PN_F32) segment_softmax_bw_float(pd, py, pg, o[s], o[s + 1], inner);
        else segment_softmax_bw_double(pd, py, pg, o[s], o[s + 1], inner);
    }
    return PN_OK;
}

pn_status pn_cpu_segment_softmax(pn_tensor *y, const pn_tensor *x, const pn_tensor *offsets) {
    const int64_t *o = (const int64_t *)pn_ptr(offsets);
    int64_t S = offsets->sizes[0] - 1, inner = prod(x->sizes, 1, x->nd);
    void *py = pn_ptr(y);
    const void *px = pn_ptr(x);
    #pragma omp parallel for if (pn_numel(x) > PN_PAR_MIN) schedule(dynamic, 64)
    for (int64_t s = 0; s < S; s++) {
        if (x->dt == PN_F32) segment_softmax_float(py, px, o[s], o[s + 1], inner);
        else segment_softmax_double(py, px, o[s], o[s + 1], inner);
    }
    return PN_OK;
}

pn_tensor *pn_segment_softmax(pn_tensor *x, pn_tensor *offsets) {
    if (pn_check_float("segment_softmax", "x", x)) return NULL;
    pn_tensor *oc = segment_args("segment_softmax", x, offsets);
    if (!oc) return NULL;
    pn_tensor *xc = pn_contig(x);
    pn_tensor *out = xc ? pn_empty_like(x) : NULL;
    if (out && PN_KCALL_ON("segment_softmax", out, segment_softmax, out, xc, oc)) {
        pn_release(out);
        out = NULL;
    }
    pn_release(xc);
    if (out && pn_ag_needed(1, &x)) {
        /* save y detached: the node must not hold its own output (a reference cycle) */
        pn_tensor *y = pn_detach(out);
        out = y ? record(out, "segment_softmax", segment_softmax_bw, 1, &x, oc, y) : (pn_release(out), NULL);
        pn_release(y);
    }
    pn_release(oc);
    return out;
}

/* rowmap.c — the row driver of rowmap.h: packs blocks of points (rows of the last dim) into
 * double scratch, runs the map's block kernel, stores the result, and runs the backward
 * kernel over the same rows. Rows are independent, so the row loop is an OpenMP loop and
 * results do not depend on the thread count. */
#include "rowmap.h"

#include <omp.h>
#include <stdio.h>

pn_status pn_rowmap_check(const char *op, pn_tensor *x, pn_tensor *y) {
    PN_TRY(pn_check_float(op, "x", x));
    int dev;
    PN_TRY(pn_common_device(op, 2, (const pn_tensor *const[]){x, y}, (const char *const[]){"x", "y"}, &dev));
    if (x->nd < 1) return pn_error(PN_ERR_SHAPE, "%s: x %s is 0-dim; points are rows of the last dim", op, pn_shape_str(x));
    if (!y) return PN_OK;
    PN_TRY(pn_check_float(op, "y", y));
    if (y->nd < 1) return pn_error(PN_ERR_SHAPE, "%s: y %s is 0-dim; points are rows of the last dim", op, pn_shape_str(y));
    if (x->dt != y->dt)
        return pn_error(PN_ERR_DTYPE, "%s: x %s is %s but y %s is %s; convert one first", op, pn_shape_str(x),
                        pn_dtype_name(x->dt), pn_shape_str(y), pn_dtype_name(y->dt));
    if (x->sizes[x->nd - 1] != y->sizes[y->nd - 1])
        return pn_error(PN_ERR_SHAPE, "%s: x %s and y %s differ in the last dim (the point dimension)", op,
                        pn_shape_str(x), pn_shape_str(y));
    return PN_OK;
}

/* Strides of t's leading dims (all but the last) viewed at the batch shape (nd, shape):
 * right-aligned, 0 where t has size 1 or lacks the dim. */
static void batch_strides(const pn_tensor *t, int nd, const int64_t *shape, int64_t *st) {
    int tnd = t->nd - 1;
    for (int i = 0; i < nd; i++) {
        int j = tnd - nd + i;
        st[i] = (j >= 0 && t->sizes[j] == shape[i] && shape[i] != 1) ? t->strides[j] : 0;
    }
}

/* row k of a strided f32/f64 row → double */
static inline void gather(const char *base, int dt, int64_t off, int64_t stride, int64_t n, double *dst) {
    if (dt == PN_F32) {
        const float *p = (const float *)base + off;
        for (int64_t k = 0; k < n; k++) dst[k] = p[k * stride];
    } else {
        const double *p = (const double *)base + off;
        for (int64_t k = 0; k < n; k++) dst[k] = p[k * stride];
    }
}

static inline void scatter(char *base, int dt, int64_t off, int64_t n, const double *src) {
    if (dt == PN_F32) {
        float *p = (float *)base + off;
        for (int64_t k = 0; k < n; k++) p[k] = (float)src[k];
    } else {
        double *p = (double *)base + off;
        for (int64_t k = 0; k < n; k++) p[k] = src[k];
    }
}

/* Rows are processed in blocks of up to BLK points: packed into double scratch, one call of
 * the map's block kernel (or its row kernel per row), then stored. */
enum { BLK = 128 };

/* t holds its points packed in batch order, D numbers each: contiguous, with exactly the batch
 * shape (nd, shape) before its last dim (no broadcast). Then point pt starts at pt·D and a
 * block of points is one run of memory: converted in one flat loop, or read in place (f64). */
static bool packed(const pn_tensor *t, int nd, const int64_t *shape, int tnd) {
    if (tnd != nd || !pn_is_contiguous((pn_tensor *)t)) return false;
    for (int i = 0; i < nd; i++)
        if (t->sizes[i] != shape[i]) return false;
    return true;
}

/* n numbers of a contiguous f32/f64 run → double (dst), or a pointer to the run itself (f64) */
static inline const double *load_run(const char *base, int dt, int64_t off, int64_t n, double *dst) {
    if (dt == PN_F64) return (const double *)base + off;
    const float *p = (const float *)base + off;
    for (int64_t k = 0; k < n; k++) dst[k] = p[k];
    return dst;
}

/* the batch shape: x's leading dims, or their broadcast with y's */
static pn_status batch_shape(const pn_rowmap *m, pn_tensor *x, pn_tensor *y, int *nd, int64_t *shape) {
    if (!y) {
        *nd = x->nd - 1;
        memcpy(shape, x->sizes, sizeof(int64_t) * (size_t)*nd);
        return PN_OK;
    }
    if (pn_broadcast_shape(m->op, x->nd - 1, x->sizes, y->nd - 1, y->sizes, nd, shape))
        return pn_error(PN_ERR_SHAPE, "%s: x %s and y %s: the leading dims do not broadcast", m->op,
                        pn_shape_str(x), pn_shape_str(y));
    return PN_OK;
}

static void free_extra(void *p) { free(p); }

/* This thread's share [lo, hi) of n points, in one contiguous run, so the row offsets are
 * computed once per row (pn_iter_row) and not once per point. */
static void thread_range(int64_t n, int64_t *lo, int64_t *hi) {
    int64_t nt = omp_get_num_threads(), t = omp_get_thread_num(), q = n / nt, r = n % nt;
    *lo = t * q + (t < r ? t : r);
    *hi = *lo + q + (t < r ? 1 : 0);
}

/* ---- backward -------------------------------------------------------------------------------- */
static pn_status rowmap_bw(pn_node *n, pn_tensor *gout, pn_tensor **gin) {
    const pn_rowmap *m = n->extra;
    pn_tensor *x = n->saved[0], *y = m->nin == 2 ? n->saved[1] : NULL;
    int bnd;
    int64_t bshape[PN_MAX_DIMS];
    PN_TRY(batch_shape(m, x, y, &bnd, bshape));
    const int64_t D = m->D;
    bool need_x = pn_ag_input_needs(n, 0), need_y = m->nin == 2 && pn_ag_input_needs(n, 1);

    int64_t gshape[PN_MAX_DIMS];
    memcpy(gshape, bshape, sizeof(int64_t) * (size_t)bnd);
    gshape[bnd] = D;
    pn_tensor *gx = need_x ? pn_empty(bnd + 1, gshape, m->dt, x->dev) : NULL;
    pn_tensor *gy = need_y ? pn_empty(bnd + 1, gshape, m->dt, x->dev) : NULL;
    pn_status s = ((need_x && !gx) || (need_y && !gy)) ? pn_error(PN_ERR_OOM, "%s: out of memory in backward", m->op)
                                                       : PN_KCALL_ON(m->op, x, rowmap_bwd, m, x, y, gout, gx, gy);
    if (!s && gx && !(gin[0] = pn_grad_to_input(n, 0, gx))) s = PN_ERR_OOM;
    if (!s && gy && !(gin[1] = pn_grad_to_input(n, 1, gy))) s = PN_ERR_OOM;
    pn_release(gx);
    pn_release(gy);
    return s;
}

/* CPU kernel: gx, gy (batch…, D) contiguous at the broadcast batch shape, or NULL */
pn_status pn_cpu_rowmap_bwd(const pn_rowmap *m, const pn_tensor *x, const pn_tensor *y, const pn_tensor *gout,
                            pn_tensor *gx, pn_tensor *gy) {
    int bnd;
    int64_t bshape[PN_MAX_DIMS];
    PN_TRY(batch_shape(m, (pn_tensor *)x, (pn_tensor *)y, &bnd, bshape));
    const int64_t D = m->D, Dg = m->Dout > 0 ? m->Dout : 1;
    int nth = omp_get_max_threads();
    const int64_t W = BLK * (4 * D + Dg); /* per thread: x, y, gx, gy (D each) and gout (Dg) rows */
    double *scratch = malloc(sizeof(double) * (size_t)(W * nth));
    if (!scratch) return pn_error(PN_ERR_OOM, "%s: out of memory in backward", m->op);

    /* operands: 0 the (contiguous) gradient rows — gx and gy share the layout — 1 gout, 2 x, 3 y */
    int64_t st[PN_ITER_MAX_OPS][PN_MAX_DIMS] = {{0}};
    int64_t acc = D;
    for (int i = bnd - 1; i >= 0; i--) {
        st[0][i] = bshape[i] == 1 ? 0 : acc;
        acc *= bshape[i];
    }
    /* gout has the output's shape: the batch dims, then Dout unless the last dim was dropped */
    {
        pn_tensor gview = *gout;
        if (m->Dout == 0) gview.nd = gout->nd + 1; /* pretend a trailing point dim so batch_strides skips it */
        batch_strides(&gview, bnd, bshape, st[1]);
    }
    batch_strides(x, bnd, bshape, st[2]);
    if (y) batch_strides(y, bnd, bshape, st[3]);
    pn_iter it;
    pn_iter_init(&it, bnd, bshape, y ? 4 : 3, NULL, (const int64_t(*)[PN_MAX_DIMS])st);

    const int64_t gst = m->Dout > 0 ? gout->strides[gout->nd - 1] : 0;
    const int64_t xst = x->strides[x->nd - 1], yst = y ? y->strides[y->nd - 1] : 0;
    const char *gb = pn_ptr(gout), *xb = pn_ptr(x), *yb = y ? pn_ptr(y) : NULL;
    char *gxb = gx ? pn_ptr(gx) : NULL, *gyb = gy ? pn_ptr(gy) : NULL;
    const int dt = m->dt;
    const bool xp = packed(x, bnd, bshape, x->nd - 1), yp = !y || packed(y, bnd, bshape, y->nd - 1),
               gp = packed(gout, bnd, bshape, m->Dout > 0 ? gout->nd - 1 : gout->nd);
    const pn_rows_bwd rows = m->bwd_rows;
#pragma omp parallel if (it.numel * D > PN_PAR_MIN)
    {
        double *s = scratch + W * omp_get_thread_num();
        double *xs = s, *ys = s + BLK * D, *gxs = s + 2 * BLK * D, *gys = s + 3 * BLK * D, *gs = s + 4 * BLK * D;
        int64_t off[PN_ITER_MAX_OPS], lo, hi;
        thread_range(it.numel, &lo, &hi);
        for (int64_t b = lo; b < hi; b += BLK) {
            const int64_t n = hi - b < BLK ? hi - b : BLK;
            const double *xr = xs, *yr = ys, *gr = gs;
            if (xp) xr = load_run(xb, dt, b * D, n * D, xs);
            if (yb && yp) yr = load_run(yb, dt, b * D, n * D, ys);
            if (gp) gr = load_run(gb, dt, b * Dg, n * Dg, gs);
            if (!xp || !yp || !gp)
                for (int64_t pt = b; pt < b + n; pt++) { /* the batch often merges into one row */
                    const int64_t i = pt % it.inner, k = pt - b;
                    if (i == 0 || pt == b) pn_iter_row(&it, pt / it.inner, off);
                    if (!xp) gather(xb, dt, off[2] + i * it.istride[2], xst, D, xs + k * D);
                    if (yb && !yp) gather(yb, dt, off[3] + i * it.istride[3], yst, D, ys + k * D);
                    if (!gp) gather(gb, dt, off[1] + i * it.istride[1], gst, Dg, gs + k * Dg);
                }
            rows(m, n, xr, yb ? yr : NULL, gr, gxs, gys);
            if (gxb) scatter(gxb, dt, b * D, n * D, gxs);
            if (gyb) scatter(gyb, dt, b * D, n * D, gys);
        }
    }
    free(scratch);
    return PN_OK;
}

/* ---- forward ---------------------------------------------------------------------------------- */
pn_tensor *pn_rowmap_apply(const pn_rowmap *mp, pn_tensor *x, pn_tensor *y) {
    pn_rowmap m = *mp;
    m.dt = x->dt;
    int bnd;
    int64_t bshape[PN_MAX_DIMS];
    if (batch_shape(&m, x, y, &bnd, bshape)) return NULL;
    int64_t oshape[PN_MAX_DIMS];
    memcpy(oshape, bshape, sizeof(int64_t) * (size_t)bnd);
    int ond = bnd;
    if (m.Dout > 0) oshape[ond++] = m.Dout;

    pn_tensor *out = pn_empty(ond, oshape, m.dt, x->dev);
    if (!out) return NULL;
    int64_t bad_row = INT64_MAX;
    int bad_arg = 0;
    double bad_val = 0;
    if (PN_KCALL_ON(m.op, x, rowmap_fwd, &m, x, y, out, &bad_row, &bad_arg, &bad_val)) {
        pn_release(out);
        return NULL;
    }
    if (bad_row != INT64_MAX) {
        pn_release(out);
        char why[256];
        snprintf(why, sizeof why, m.bad_fmt, bad_val);
        pn_tensor *t = bad_arg == 2 ? y : x;
        return pn_error_null(PN_ERR_ARG, "%s: %s %s, point %lld (row-major over the leading dims, from 1): %s", m.op,
                             m.arg[bad_arg == 2 ? 1 : 0], pn_shape_str(t), (long long)bad_row + 1, why);
    }

    pn_tensor *ins[2] = {x, y};
    if (pn_ag_needed(m.nin, ins)) {
        pn_rowmap *keep = malloc(sizeof *keep);
        pn_node *node = keep ? pn_ag_record(out, m.op, rowmap_bw, m.nin, ins) : NULL;
        if (!node) {
            free(keep);
            pn_release(out);
            return keep ? NULL : pn_error_null(PN_ERR_OOM, "%s: out of memory", m.op);
        }
        *keep = m;
        keep->bad_fmt = NULL; /* the caller's buffer; backward never reports */
        node->extra = keep;
        node->free_extra = free_extra;
        if (pn_ag_save(node, x) || (y && pn_ag_save(node, y))) {
            pn_release(out);
            return NULL;
        }
    }
    return out;
}

/* CPU kernel: out (batch…, Dout | nothing) contiguous at the broadcast batch shape; the first
 * point the map rejects (row-major, whatever the thread count): *bad_row (INT64_MAX: none),
 * which argument (*bad_arg 1: x, 2: y) and the offending value. Answers to the host: the
 * error names the point. */
pn_status pn_cpu_rowmap_fwd(const pn_rowmap *mp, const pn_tensor *x, const pn_tensor *y, pn_tensor *out,
                            int64_t *bad_row_out, int *bad_arg_out, double *bad_val_out) {
    const pn_rowmap m = *mp;
    int bnd;
    int64_t bshape[PN_MAX_DIMS];
    PN_TRY(batch_shape(&m, (pn_tensor *)x, (pn_tensor *)y, &bnd, bshape));
    const int64_t D = m.D, Do = m.Dout > 0 ? m.Dout : 1;
    int nth = omp_get_max_threads();
    const int64_t W = BLK * (2 * D + Do); /* per thread: x, y (D each) and out (Do) rows */
    double *scratch = malloc(sizeof(double) * (size_t)(W * nth));
    if (!scratch) return pn_error(PN_ERR_OOM, "%s: out of memory", m.op);

    int64_t st[PN_ITER_MAX_OPS][PN_MAX_DIMS] = {{0}};
    int64_t acc = Do;
    for (int i = bnd - 1; i >= 0; i--) {
        st[0][i] = bshape[i] == 1 ? 0 : acc;
        acc *= bshape[i];
    }
    batch_strides(x, bnd, bshape, st[1]);
    if (y) batch_strides(y, bnd, bshape, st[2]);
    pn_iter it;
    pn_iter_init(&it, bnd, bshape, y ? 3 : 2, NULL, (const int64_t(*)[PN_MAX_DIMS])st);

    const int64_t xst = x->strides[x->nd - 1], yst = y ? y->strides[y->nd - 1] : 0;
    const char *xb = pn_ptr(x), *yb = y ? pn_ptr(y) : NULL;
    char *ob = pn_ptr(out);
    const bool xp = packed(x, bnd, bshape, x->nd - 1), yp = !y || packed(y, bnd, bshape, y->nd - 1);
    const pn_rows_fwd rows = m.fwd_rows;
    int64_t bad_row = INT64_MAX;
    int bad_arg = 0;
    double bad_val = 0;
#pragma omp parallel if (it.numel * D > PN_PAR_MIN)
    {
        double *s = scratch + W * omp_get_thread_num();
        double *xs = s, *ys = s + BLK * D, *os = s + 2 * BLK * D;
        int64_t off[PN_ITER_MAX_OPS], lo, hi;
        thread_range(it.numel, &lo, &hi);
        int64_t my_row = INT64_MAX;
        int my_arg = 0;
        double my_val = 0;
        for (int64_t b = lo; b < hi; b += BLK) {
            const int64_t n = hi - b < BLK ? hi - b : BLK;
            const double *xr = xs, *yr = ys;
            if (xp) xr = load_run(xb, m.dt, b * D, n * D, xs);
            if (yb && yp) yr = load_run(yb, m.dt, b * D, n * D, ys);
            if (!xp || !yp)
                for (int64_t pt = b; pt < b + n; pt++) { /* the batch often merges into one row */
                    const int64_t i = pt % it.inner, k = pt - b;
                    if (i == 0 || pt == b) pn_iter_row(&it, pt / it.inner, off);
                    if (!xp) gather(xb, m.dt, off[1] + i * it.istride[1], xst, D, xs + k * D);
                    if (yb && !yp) gather(yb, m.dt, off[2] + i * it.istride[2], yst, D, ys + k * D);
                }
            /* f64: the kernel writes the output in place */
            double *orow = m.dt == PN_F64 ? (double *)ob + b * Do : os;
            int rej = 0;
            double bv = 0;
            int64_t k = rows(&m, n, xr, yb ? yr : NULL, orow, &rej, &bv);
            if (k >= 0 && b + k < my_row) { /* the first rejected point, whatever the thread count */
                my_row = b + k;
                my_arg = rej;
                my_val = bv;
            }
            if (m.dt != PN_F64) scatter(ob, m.dt, b * Do, n * Do, os);
        }
#pragma omp critical(pn_rowmap_bad)
        if (my_row < bad_row) {
            bad_row = my_row;
            bad_arg = my_arg;
            bad_val = my_val;
        }
    }
    free(scratch);
    *bad_row_out = bad_row, *bad_arg_out = bad_arg, *bad_val_out = bad_val;
    return PN_OK;
}

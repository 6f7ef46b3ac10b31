/* reduce.c — reductions over any set of dims (sum, mean, max, min, logsumexp, prod),
 * argmax/argmin and p-norms, each forward next to its backward.
 *
 * Layout. Every reduction reads a dense block seen as (O, R, I): O outer kept elements,
 * R reduced elements, I inner kept elements. An input that is dense in some dim order
 * (contiguous, or a transpose/permutation of a contiguous tensor) and whose reduced dims
 * form one run in that order is read in place (sum over the last dim: I = 1; over the
 * first: O = 1); otherwise the reduced dims are permuted to the end and the view is copied
 * once, which costs no more than the reduction itself.
 *
 * Determinism. Every output is accumulated in a fixed order that depends only on the
 * shapes, never on the thread count: threads split the outputs, and when there are few
 * long rows (e.g. a sum over all dims) each row is cut into fixed 16k-element chunks whose
 * partial results are merged in chunk order. Float inputs accumulate in double.
 *
 * Conventions (torch's): sum/prod of integer tensors give i64, max/min keep the dtype,
 * mean/logsumexp/norm need f32/f64. Empty reductions give 0 (sum), 1 (prod), NaN (mean),
 * -inf (logsumexp), 0 (norm); max/min/argmax/argmin of an empty dim are errors. NaN
 * propagates through max/min; argmax/argmin return the first NaN if there is one,
 * otherwise the first index of the extreme value (ties → lowest index).
 *
 * Gradients of max/min (and of the inf-norm) are split evenly between tied extremes, as
 * torch.amax does: with k elements equal to the maximum each receives g/k. The gradient
 * of a norm at 0 is 0 (a subgradient), never NaN. */
#include "../backend.h"
#include "fast_math.h"
#include "reduce_math.h" /* kinds, accumulators, backward maps: shared with cuda/ops/reduce.cu */

static const char *kind_name(int k) {
    static const char *names[] = {"sum", "mean", "max", "min", "logsumexp", "prod", "norm", "norm", "norm", "norm"};
    return names[k];
}

#define CHUNK 16384 /* elements per partial result when one row is split across threads */
#define CB 256      /* kept inner elements accumulated together in the (O, R, I>1) kernel */

/* ---- which dims are reduced ------------------------------------------------------------- */
typedef struct {
    bool red[PN_MAX_DIMS];       /* reduced input dims */
    int out_nd;
    int64_t out_shape[PN_MAX_DIMS];
    int64_t keep_shape[PN_MAX_DIMS]; /* the input's nd, reduced dims set to 1 */
    int64_t R;                   /* elements reduced into each output */
} rplan;

/* ndims == 0 means every dim. Dims may be negative; repeats are errors. */
static pn_status make_plan(const char *op, const pn_tensor *x, int ndims, const int64_t *dims, int keepdim,
                           rplan *pl) {
    memset(pl, 0, sizeof *pl);
    if (ndims < 0 || ndims > PN_MAX_DIMS)
        return pn_error(PN_ERR_ARG, "%s: %d dims given for x %s", op, ndims, pn_shape_str(x));
    if (ndims > 0 && !dims) return pn_error(PN_ERR_ARG, "%s: dims is NULL", op);
    for (int i = 0; i < ndims; i++) {
        int d;
        PN_TRY(pn_wrap_dim(op, (int)dims[i], x->nd, &d));
        if (x->nd == 0) continue; /* dim 0 / -1 of a scalar: nothing to reduce */
        if (pl->red[d])
            return pn_error(PN_ERR_ARG, "%s: dim %d repeated in %s for x %s", op, d + 1, pn_dims_str(ndims, dims),
                            pn_shape_str(x));
        pl->red[d] = true;
    }
    if (ndims == 0)
        for (int d = 0; d < x->nd; d++) pl->red[d] = true;
    pl->R = 1;
    for (int d = 0; d < x->nd; d++) {
        pl->keep_shape[d] = pl->red[d] ? 1 : x->sizes[d];
        if (pl->red[d]) pl->R *= x->sizes[d];
        if (!pl->red[d] || keepdim) pl->out_shape[pl->out_nd++] = pl->keep_shape[d];
    }
    return PN_OK;
}

/* Where a reduction reads and writes. The kernels read src as a contiguous (O, R, I) block
 * starting at pn_ptr(src) and write O*I results, row-major, into dst. */
typedef struct {
    pn_tensor *src;     /* new reference: x itself, or a contiguous copy */
    int64_t O, R, I;
    pn_tensor *dst;     /* new reference: out, or a temporary when the kept dims come out reordered */
    pn_tensor *scatter; /* view of out in dst's dim order (copied into by layout_finish), or NULL */
} layout;

/* x read in its memory order: the dims of size > 1 sorted by stride, largest first. Works when x
 * is dense in that order (contiguous, or a transpose/permutation of a contiguous tensor) and the
 * reduced dims form one run — in increasing dim order when ordered_r (argmax over all dims counts
 * positions row-major). Kept dims that come out in another order go through a temporary. */
static bool try_memory_order(layout *L, pn_tensor *x, const rplan *pl, pn_tensor *out, bool ordered_r) {
    int perm[PN_MAX_DIMS], m = 0;
    for (int d = 0; d < x->nd; d++)
        if (x->sizes[d] != 1) perm[m++] = d;
    for (int i = 1; i < m; i++) { /* stable insertion sort, largest stride first */
        int v = perm[i], j = i;
        for (; j > 0 && x->strides[perm[j - 1]] < x->strides[v]; j--) perm[j] = perm[j - 1];
        perm[j] = v;
    }
    int64_t expect = 1;
    for (int i = m - 1; i >= 0; i--) {
        if (x->strides[perm[i]] != expect) return false;
        expect *= x->sizes[perm[i]];
    }
    int64_t o = 1, r = 1, in = 1, ksh[PN_MAX_DIMS], kst[PN_MAX_DIMS], ost[PN_MAX_DIMS];
    int state = 0, last_red = -1, last_kept = -1, nk = 0; /* state: 0 before the reduced run, 1 in it, 2 after */
    bool reorder = false;
    pn_contiguous_strides(x->nd, pl->keep_shape, ost); /* out's strides, keepdim form */
    for (int i = 0; i < m; i++) {
        int d = perm[i];
        if (pl->red[d]) {
            if (state == 2 || (ordered_r && d < last_red)) return false;
            last_red = d;
            state = 1;
            r *= x->sizes[d];
        } else {
            if (state == 0) o *= x->sizes[d];
            else state = 2, in *= x->sizes[d];
            reorder |= d < last_kept;
            last_kept = d;
            ksh[nk] = x->sizes[d];
            kst[nk++] = ost[d];
        }
    }
    L->O = o, L->R = r, L->I = in;
    pn_retain(x);
    L->src = x;
    if (!reorder) {
        pn_retain(out);
        L->dst = out;
        return true;
    }
    L->dst = pn_empty(nk, ksh, out->dt, out->dev);
    L->scatter = pn_tensor_view_of(out->storage, nk, ksh, kst, out->offset, out->dt);
    return true;
}

static pn_status layout_init(layout *L, pn_tensor *x, const rplan *pl, pn_tensor *out, bool ordered_r) {
    memset(L, 0, sizeof *L);
    if (!try_memory_order(L, x, pl, out, ordered_r)) {
        /* otherwise: kept dims (in order), then reduced dims, copied once */
        int64_t sh[PN_MAX_DIMS], st[PN_MAX_DIMS];
        int k = 0;
        L->O = L->R = L->I = 1;
        for (int pass = 0; pass < 2; pass++)
            for (int d = 0; d < x->nd; d++)
                if (pl->red[d] == (pass == 1)) {
                    sh[k] = x->sizes[d];
                    st[k++] = x->strides[d];
                    if (pass) L->R *= x->sizes[d];
                    else L->O *= x->sizes[d];
                }
        pn_tensor *v = pn_tensor_view_of(x->storage, x->nd, sh, st, x->offset, x->dt);
        L->src = v ? pn_empty(x->nd, sh, x->dt, x->dev) : NULL;
        if (L->src) pn_copy_(L->src, v);
        pn_release(v);
        pn_retain(out);
        L->dst = out;
    }
    if (!L->src || !L->dst || (L->dst != out && !L->scatter)) return PN_ERR_OOM;
    return PN_OK;
}

/* Copies a reordered result into out; releases what the layout holds. */
static pn_status layout_finish(layout *L, pn_status s) {
    if (!s && L->scatter) s = pn_copy_(L->scatter, L->dst);
    pn_release(L->src);
    pn_release(L->dst);
    pn_release(L->scatter);
    return s;
}

/* ---- float kernels ---------------------------------------------------------------------- */
/* Eight independent double accumulators in a fixed order: vectorisable and deterministic. */
static double sum_f32(const float *x, int64_t n, bool square) {
    double s[8] = {0};
    int64_t i = 0;
    if (square) {
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; j++) s[j] += (double)x[i + j] * x[i + j];
        for (; i < n; i++) s[0] += (double)x[i] * x[i];
    } else {
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; j++) s[j] += x[i + j];
        for (; i < n; i++) s[0] += x[i];
    }
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}
static double sum_f64(const double *x, int64_t n, bool square) {
    double s[8] = {0};
    int64_t i = 0;
    if (square) {
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; j++) s[j] += x[i + j] * x[i + j];
        for (; i < n; i++) s[0] += x[i] * x[i];
    } else {
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; j++) s[j] += x[i + j];
        for (; i < n; i++) s[0] += x[i];
    }
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* logsumexp of a contiguous run in two passes (max, then Σ exp(x - max)); f32 uses the
 * vectorisable pn_fast_expf_nonpos (x − max <= 0). Returns the (max, sum) pair that pn_acc_merge/pn_acc_final take. x: (n) */
PN_VEC_FN static pn_acc lse_run(const void *xv, int dt, int64_t n) {
    const float *xf = xv;
    const double *xd = xv;
    double m = -INFINITY, a[8] = {0};
    int nan = 0;
    if (dt == PN_F32) {
        float mf = -INFINITY;
        for (int64_t i = 0; i < n; i++) {
            mf = xf[i] > mf ? xf[i] : mf;
            nan |= xf[i] != xf[i];
        }
        m = mf;
    } else {
        for (int64_t i = 0; i < n; i++) {
            m = xd[i] > m ? xd[i] : m;
            nan |= xd[i] != xd[i];
        }
    }
    if (nan) return (pn_acc){NAN, NAN};
    if (m == -INFINITY) return (pn_acc){-INFINITY, 0}; /* empty or all -inf */
    if (m == INFINITY) return (pn_acc){INFINITY, 1};
    int64_t i = 0;
    if (dt == PN_F32) {
        float mf = (float)m;
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; j++) a[j] += pn_fast_expf_nonpos(xf[i + j] - mf);
        for (; i < n; i++) a[0] += pn_fast_expf_nonpos(xf[i] - mf);
    } else {
        for (; i < n; i++) a[i & 7] += exp(xd[i] - m);
    }
    return (pn_acc){m, ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))};
}

/* One contiguous run of n elements. x: (n) */
static pn_acc run_acc(int k, double p, const void *x, int dt, int64_t n) {
    if (k == K_LSE) return lse_run(x, dt, n);
    if (k == K_SUM || k == K_MEAN || k == K_L2) {
        bool sq = k == K_L2;
        double s = dt == PN_F32 ? sum_f32(x, n, sq) : sum_f64(x, n, sq);
        return (pn_acc){s, 0};
    }
    pn_acc s = pn_acc_init(k);
    if (dt == PN_F32)
        for (int64_t i = 0; i < n; i++) pn_acc_add(k, p, &s, ((const float *)x)[i]);
    else
        for (int64_t i = 0; i < n; i++) pn_acc_add(k, p, &s, ((const double *)x)[i]);
    return s;
}

/* One row of R elements, split into CHUNK pieces reduced in parallel, merged in order. */
static pn_status row_chunked(int k, double p, const char *x, int dt, int64_t R, double *result) {
    int64_t nc = (R + CHUNK - 1) / CHUNK;
    pn_acc *part = malloc(sizeof *part * (size_t)nc);
    if (!part) return pn_error(PN_ERR_OOM, "%s: out of memory", kind_name(k));
    size_t es = pn_elsize(dt);
    #pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < nc; c++) {
        int64_t lo = c * CHUNK, len = R - lo < CHUNK ? R - lo : CHUNK;
        part[c] = run_acc(k, p, x + (size_t)lo * es, dt, len);
    }
    pn_acc s = part[0];
    for (int64_t c = 1; c < nc; c++) s = pn_acc_merge(k, s, part[c]);
    free(part);
    *result = pn_acc_final(k, s, R, p);
    return PN_OK;
}

/* x: (O, R, I) contiguous float; out: (O*I) contiguous, same dtype */
static pn_status reduce_float(int k, double p, const pn_tensor *xt, int64_t O, int64_t R, int64_t I, pn_tensor *out) {
    const char *x = pn_ptr(xt);
    char *o = pn_ptr(out);
    int dt = xt->dt;
    size_t es = pn_elsize(dt);
    int64_t total = O * R * I;
    if (I == 1) {
        if (O < 16 && R >= 2 * CHUNK) { /* few long rows (e.g. all dims): split each row */
            for (int64_t r = 0; r < O; r++) {
                double v = 0;
                PN_TRY(row_chunked(k, p, x + (size_t)(r * R) * es, dt, R, &v));
                pn_st(o, dt, r, v);
            }
            return PN_OK;
        }
        #pragma omp parallel for if (total > PN_PAR_MIN) schedule(static)
        for (int64_t r = 0; r < O; r++)
            pn_st(o, dt, r, pn_acc_final(k, run_acc(k, p, x + (size_t)(r * R) * es, dt, R), R, p));
        return PN_OK;
    }
    /* I > 1: accumulate CB kept elements at a time while walking the reduced axis */
    int64_t nb = (I + CB - 1) / CB;
    #pragma omp parallel for if (total > PN_PAR_MIN) schedule(static)
    for (int64_t t = 0; t < O * nb; t++) {
        int64_t ob = t / nb, i0 = (t % nb) * CB, len = I - i0 < CB ? I - i0 : CB;
        pn_acc s[CB];
        for (int64_t j = 0; j < len; j++) s[j] = pn_acc_init(k);
        for (int64_t r = 0; r < R; r++) {
            int64_t base = (ob * R + r) * I + i0;
            if (dt == PN_F32) {
                const float *row = (const float *)x + base;
                if (k == K_SUM || k == K_MEAN)
                    for (int64_t j = 0; j < len; j++) s[j].a += row[j];
                else
                    for (int64_t j = 0; j < len; j++) pn_acc_add(k, p, &s[j], row[j]);
            } else {
                const double *row = (const double *)x + base;
                if (k == K_SUM || k == K_MEAN)
                    for (int64_t j = 0; j < len; j++) s[j].a += row[j];
                else
                    for (int64_t j = 0; j < len; j++) pn_acc_add(k, p, &s[j], row[j]);
            }
        }
        for (int64_t j = 0; j < len; j++) pn_st(o, dt, ob * I + i0 + j, pn_acc_final(k, s[j], R, p));
    }
    return PN_OK;
}

/* ---- integer kernel (i32, i64, u8): exact int64 arithmetic, serial ---------------------- */
static inline int64_t ld_int(const void *p, int dt, int64_t i) {
    return dt == PN_U8 ? (int64_t)((const uint8_t *)p)[i] : pn_ldi(p, dt, i);
}
static inline void st_int(void *p, int dt, int64_t i, int64_t v) {
    if (dt == PN_I64) ((int64_t *)p)[i] = v;
    else if (dt == PN_I32) ((int32_t *)p)[i] = (int32_t)v;
    else ((uint8_t *)p)[i] = (uint8_t)v;
}

/* x: (O, R, I) contiguous integer; out: (O*I); sums wrap around like C unsigned maths */
static void reduce_int(int k, const pn_tensor *xt, int64_t O, int64_t R, int64_t I, pn_tensor *out) {
    const char *x = pn_ptr(xt);
    char *o = pn_ptr(out);
    for (int64_t ob = 0; ob < O; ob++)
        for (int64_t i = 0; i < I; i++) {
            uint64_t acc = k == K_PROD ? 1 : 0;
            int64_t ext = 0;
            for (int64_t r = 0; r < R; r++) {
                int64_t v = ld_int(x, xt->dt, (ob * R + r) * I + i);
                if (k == K_SUM) acc += (uint64_t)v;
                else if (k == K_PROD) acc *= (uint64_t)v;
                else if (r == 0 || (k == K_MAX ? v > ext : v < ext)) ext = v;
            }
            st_int(o, out->dt, ob * I + i, (k == K_SUM || k == K_PROD) ? (int64_t)acc : ext);
        }
}

/* CPU kernel (kernels.def): src a contiguous (O, R, I) block, dst O·I results */
pn_status pn_cpu_reduce(int kind, double p, const pn_tensor *src, int64_t O, int64_t R, int64_t I, pn_tensor *dst) {
    if (pn_is_float(src->dt)) return reduce_float(kind, p, src, O, R, I, dst);
    reduce_int(kind, src, O, R, I, dst);
    return PN_OK;
}

/* Reduce x per plan into out (already allocated with the output shape) on x's device. The
 * layout (which block to read, where to write) is planned from the strides alone. */
static pn_status run_reduce(int k, double p, pn_tensor *x, const rplan *pl, pn_tensor *out) {
    if (pn_numel(out) == 0) return PN_OK;
    const pn_kernels *kt;
    PN_TRY(pn_backend_for(kind_name(k), x->dev, &kt));
    layout L;
    pn_status s = layout_init(&L, x, pl, out, false);
    if (!s) s = PN_KCALL(kind_name(k), kt, reduce, k, p, L.src, L.O, L.R, L.I, L.dst);
    return layout_finish(&L, s);
}

/* ---- backward helpers ------------------------------------------------------------------ */
/* The recorded reduction mask (iv[2]) as a list of dims. */
static int mask_dims(const pn_node *n, int64_t *dims) {
    int k = 0;
    for (int d = 0; d < (int)n->in[0].nd; d++)
        if (n->iv[2] >> d & 1) dims[k++] = d;
    return k;
}

/* View of t (output-shaped) in the keepdim shape: size-1 dims re-inserted. New reference. */
static pn_tensor *keep_view(const pn_node *n, pn_tensor *t) {
    int nd = (int)n->in[0].nd;
    int64_t sh[PN_MAX_DIMS], st[PN_MAX_DIMS];
    for (int d = 0, j = 0; d < nd; d++) {
        bool red = n->iv[2] >> d & 1;
        bool kept_in_t = !red || t->nd == nd; /* keepdim output has every dim */
        if (kept_in_t) {
            sh[d] = t->sizes[j];
            st[d] = t->strides[j++];
        } else {
            sh[d] = 1;
            st[d] = 0;
        }
    }
    return pn_tensor_view_of(t->storage, nd, sh, st, t->offset, t->dt);
}

/* out = f(a, b, c) elementwise over out's shape; a, b, c broadcast (c may be NULL): the
 * pointwise steps of the backward passes, named by id so that a device kernel can switch on it
 * (the maps: reduce_math.h, pn_m_*) */
typedef double (*map3_fn)(double a, double b, double c, const double *prm);
static const map3_fn map3_fns[M_COUNT] = {
    [M_IS_EXT] = pn_m_is_ext, [M_SPLIT] = pn_m_split, [M_SIGN_MUL] = pn_m_sign_mul, [M_LSE_GRAD] = pn_m_lse_grad,
    [M_IS_ZERO] = pn_m_is_zero, [M_ZERO_TO_ONE] = pn_m_zero_to_one, [M_MUL] = pn_m_mul,
    [M_PROD_GRAD] = pn_m_prod_grad, [M_NORM_GRAD] = pn_m_norm_grad};

pn_status pn_cpu_reduce_map(int fn, double prm_v, pn_tensor *out, const pn_tensor *a, const pn_tensor *b,
                            const pn_tensor *c) {
    const map3_fn f = map3_fns[fn];
    const double prm[1] = {prm_v};
    pn_iter it;
    pn_tensor *ops[4] = {out, (pn_tensor *)a, (pn_tensor *)b, (pn_tensor *)(c ? c : a)};
    pn_iter_init(&it, out->nd, out->sizes, 4, ops, NULL);
    char *po = pn_ptr(out);
    const char *pa = pn_ptr(a), *pb = pn_ptr(b), *pc = pn_ptr(ops[3]);
    int dt = out->dt;
    #pragma omp parallel for if (it.numel > PN_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < it.rows; r++) {
        int64_t off[PN_ITER_MAX_OPS];
        pn_iter_row(&it, r, off);
        for (int64_t i = 0; i < it.inner; i++)
            pn_st(po, dt, off[0] + i * it.istride[0],
                  f(pn_ld(pa, dt, off[1] + i * it.istride[1]), pn_ld(pb, dt, off[2] + i * it.istride[2]),
                    pn_ld(pc, dt, off[3] + i * it.istride[3]), prm));
    }
    return PN_OK;
}

static pn_status map3(pn_tensor *out, pn_tensor *a, pn_tensor *b, pn_tensor *c, int fn, double prm) {
    const pn_kernels *k;
    PN_TRY(pn_backend_for("reduce backward", out->dev, &k));
    return PN_KCALL("reduce backward", k, reduce_map, fn, prm, out, a, b, c);
}

/* the input's shape on the device of t (the gradient being computed) */
static pn_tensor *input_like(const pn_node *n, int dt, const pn_tensor *t) {
    return pn_empty((int)n->in[0].nd, n->in[0].shape, dt, t->dev);
}

/* Gradient of max/min/inf-norm: g split evenly over the elements equal to the extreme. */
static pn_status extreme_bw(pn_node *n, pn_tensor *gk, bool use_abs, pn_tensor **gin) {
    pn_tensor *x = n->saved[0], *outk = n->saved[1];
    pn_tensor *m = input_like(n, x->dt, x);
    if (!m) return PN_ERR_OOM;
    pn_status s = map3(m, x, outk, NULL, M_IS_EXT, use_abs);
    int64_t dims[PN_MAX_DIMS];
    int nd = mask_dims(n, dims);
    pn_tensor *cnt = (!s && nd) ? pn_reduce(PN_SUM, m, nd, dims, 1) : NULL;
    if (!s && nd && !cnt) s = PN_ERR_OOM;
    if (!s) s = map3(m, m, gk, cnt ? cnt : m, M_SPLIT, use_abs); /* no reduced dims: the count is the mask itself */
    if (!s && use_abs) s = map3(m, m, x, NULL, M_SIGN_MUL, use_abs);
    pn_release(cnt);
    if (s) {
        pn_release(m);
        return s;
    }
    gin[0] = m;
    return PN_OK;
}

/* ---- pn_reduce ---------------------------------------------------------------------------- */
static pn_status reduce_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    int k = (int)n->iv[0];
    if (n->in[0].nd == 0) { /* a 0-dim input: every reduction is the identity */
        gin[0] = pn_clone(g);
        return gin[0] ? PN_OK : PN_ERR_OOM;
    }
    pn_tensor *gk = keep_view(n, g);
    if (!gk) return PN_ERR_OOM;
    pn_status s = PN_OK;
    if (k == K_MAX || k == K_MIN) {
        s = extreme_bw(n, gk, false, gin);
        pn_release(gk);
        return s;
    }
    pn_tensor *out = input_like(n, g->dt, g);
    if (!out) {
        pn_release(gk);
        return PN_ERR_OOM;
    }
    if (k == K_SUM || k == K_MEAN) {
        s = pn_copy_(out, gk);
        int64_t R = 1;
        for (int d = 0; d < (int)n->in[0].nd; d++)
            if (n->iv[2] >> d & 1) R *= n->in[0].shape[d];
        if (!s && k == K_MEAN && R > 1) s = pn_scale_(out, 1.0 / (double)R);
    } else if (k == K_LSE) {
        s = map3(out, n->saved[0], n->saved[1], gk, M_LSE_GRAD, 0);
    } else { /* K_PROD: exact with zeros, no division by 0 */
        pn_tensor *x = n->saved[0];
        int64_t dims[PN_MAX_DIMS];
        int nd = mask_dims(n, dims);
        pn_tensor *tmp = input_like(n, x->dt, x), *nzp = NULL, *zc = NULL;
        if (!tmp) s = PN_ERR_OOM;
        if (!s) s = map3(tmp, x, x, NULL, M_ZERO_TO_ONE, 0);
        if (!s && !(nzp = pn_reduce(PN_PROD, tmp, nd, dims, 1))) s = PN_ERR_OOM;
        if (!s) s = map3(tmp, x, x, NULL, M_IS_ZERO, 0);
        if (!s && !(zc = pn_reduce(PN_SUM, tmp, nd, dims, 1))) s = PN_ERR_OOM;
        if (!s) {
            pn_tensor *gp = pn_empty(nzp->nd, nzp->sizes, nzp->dt, nzp->dev);
            if (!gp) s = PN_ERR_OOM;
            else {
                s = map3(gp, gk, nzp, NULL, M_MUL, 0);
                if (!s) s = map3(out, x, gp, zc, M_PROD_GRAD, 0);
                pn_release(gp);
            }
        }
        pn_release(tmp);
        pn_release(nzp);
        pn_release(zc);
    }
    pn_release(gk);
    if (s) {
        pn_release(out);
        return s;
    }
    gin[0] = out;
    return PN_OK;
}

/* Record the node for a float reduction; saves x and the output (keepdim view) when needed. */
static pn_status record(pn_tensor *out, pn_tensor *x, const rplan *pl, int k, double p, int keepdim) {
    pn_node *n = pn_ag_record(out, kind_name(k), reduce_bw, 1, &x);
    if (!n) return PN_ERR_OOM;
    n->iv[0] = k;
    n->iv[1] = keepdim;
    n->iv[2] = 0;
    for (int d = 0; d < x->nd; d++)
        if (pl->red[d]) n->iv[2] |= (int64_t)1 << d;
    n->sc[0] = p;
    if (k == K_SUM || k == K_MEAN) return PN_OK;
    pn_tensor *xd = pn_detach(x);
    pn_tensor *ok = pn_tensor_view_of(out->storage, x->nd, pl->keep_shape, (int64_t[PN_MAX_DIMS]){0}, out->offset,
                                      out->dt);
    if (!xd || !ok) {
        pn_release(xd);
        pn_release(ok);
        return PN_ERR_OOM;
    }
    pn_contiguous_strides(x->nd, pl->keep_shape, ok->strides); /* out is contiguous */
    pn_status st = pn_ag_save(n, xd);
    if (!st) st = pn_ag_save(n, ok);
    pn_release(xd);
    pn_release(ok);
    return st;
}

pn_tensor *pn_reduce(int op, pn_tensor *x, int ndims, const int64_t *dims, int keepdim) {
    if (op < PN_SUM || op > PN_PROD) return pn_error_null(PN_ERR_ARG, "reduce: unknown op %d", op);
    const char *name = kind_name(op);
    if (!x) return pn_error_null(PN_ERR_ARG, "%s: x is nil", name);
    if ((op == PN_MEAN || op == PN_LOGSUMEXP) && pn_check_float(name, "x", x)) return NULL;
    rplan pl;
    if (make_plan(name, x, ndims, dims, keepdim, &pl)) return NULL;
    int64_t nout = pn_shape_numel(pl.out_nd, pl.out_shape);
    if ((op == PN_MAX || op == PN_MIN) && pl.R == 0 && nout > 0)
        return pn_error_null(PN_ERR_SHAPE, "%s: cannot reduce x %s over empty dims %s", name, pn_shape_str(x),
                             pn_dims_str(ndims, dims));
    int odt = (!pn_is_float(x->dt) && (op == PN_SUM || op == PN_PROD)) ? PN_I64 : x->dt;
    pn_tensor *out = pn_empty(pl.out_nd, pl.out_shape, odt, x->dev);
    if (!out) return NULL;
    if (run_reduce(op, 0, x, &pl, out) ||
        (pn_is_float(x->dt) && pn_ag_needed(1, &x) && record(out, x, &pl, op, 0, keepdim))) {
        pn_release(out);
        return NULL;
    }
    return out;
}

/* ---- norm ------------------------------------------------------------------------------- */
static pn_status norm_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    pn_tensor *gk = keep_view(n, g);
    if (!gk) return PN_ERR_OOM;
    pn_status s = PN_OK;
    if (n->iv[0] == K_LINF) {
        s = extreme_bw(n, gk, true, gin);
    } else {
        pn_tensor *out = input_like(n, g->dt, g);
        if (!out) s = PN_ERR_OOM;
        else if ((s = map3(out, n->saved[0], n->saved[1], gk, M_NORM_GRAD, n->sc[0])) != PN_OK) pn_release(out);
        else gin[0] = out;
    }
    pn_release(gk);
    return s;
}

pn_tensor *pn_norm(pn_tensor *x, double p, int ndims, const int64_t *dims, int keepdim) {
    if (!x) return pn_error_null(PN_ERR_ARG, "norm: x is nil");
    if (pn_check_float("norm", "x", x)) return NULL;
    if (!(p > 0)) /* also NaN */
        return pn_error_null(PN_ERR_ARG, "norm: p must be positive or inf, got %g (x %s)", p, pn_shape_str(x));
    int k = p == 1 ? K_L1 : p == 2 ? K_L2 : p == INFINITY ? K_LINF : K_LP;
    rplan pl;
    if (make_plan("norm", x, ndims, dims, keepdim, &pl)) return NULL;
    pn_tensor *out = pn_empty(pl.out_nd, pl.out_shape, x->dt, x->dev);
    if (!out) return NULL;
    if (run_reduce(k, p, x, &pl, out)) {
        pn_release(out);
        return NULL;
    }
    if (pn_ag_needed(1, &x)) {
        if (record(out, x, &pl, k, p, keepdim)) {
            pn_release(out);
            return NULL;
        }
        out->fn->backward = norm_bw;
    }
    return out;
}

/* ---- argmax / argmin --------------------------------------------------------------------- */
/* dim = PN_ALL_DIMS: index into the flattened (row-major) tensor, like torch.argmax(x). */
static pn_tensor *arg_extreme(const char *op, bool is_max, pn_tensor *x, int dim, int keepdim) {
    if (!x) return pn_error_null(PN_ERR_ARG, "%s: x is nil", op);
    const pn_kernels *kt;
    if (pn_backend_for(op, x->dev, &kt)) return NULL;
    rplan pl;
    int64_t d64 = dim;
    if (make_plan(op, x, dim == PN_ALL_DIMS ? 0 : 1, &d64, keepdim, &pl)) return NULL;
    int64_t nout = pn_shape_numel(pl.out_nd, pl.out_shape);
    if (pl.R == 0 && nout > 0)
        return pn_error_null(PN_ERR_SHAPE, "%s: cannot reduce x %s over an empty dim", op, pn_shape_str(x));
    pn_tensor *out = pn_empty(pl.out_nd, pl.out_shape, PN_I64, x->dev);
    if (!out) return NULL;
    if (nout == 0) return out;
    layout L;
    if (layout_init(&L, x, &pl, out, true)) {
        layout_finish(&L, PN_ERR_OOM);
        pn_release(out);
        return NULL;
    }
    pn_status st = PN_KCALL(op, kt, arg_reduce, is_max, L.src, L.O, L.R, L.I, L.dst);
    if (layout_finish(&L, st)) {
        pn_release(out);
        return NULL;
    }
    return out;
}

/* CPU kernel: src a contiguous (O, R, I) block; dst (O·I) i64, the first extreme's r (NaN wins) */
pn_status pn_cpu_arg_reduce(int is_max, const pn_tensor *src, int64_t O, int64_t R, int64_t I, pn_tensor *dst) {
    const char *px = pn_ptr(src);
    int64_t *po = (int64_t *)pn_ptr(dst);
    int dt = src->dt;
    #pragma omp parallel for if (O * R * I > PN_PAR_MIN) schedule(static)
    for (int64_t t = 0; t < O * I; t++) {
        int64_t ob = t / I, i = t % I, best = 0;
        const int64_t base = ob * R * I + i;
        if (pn_is_index(dt)) { /* exact for all of int64 */
            int64_t bv = pn_ldi(px, dt, base);
            for (int64_t r = 1; r < R; r++) {
                int64_t v = pn_ldi(px, dt, base + r * I);
                if (is_max ? v > bv : v < bv) bv = v, best = r;
            }
        } else {
            double bv = pn_ld(px, dt, base);
            for (int64_t r = 1; r < R && !isnan(bv); r++) {
                double v = pn_ld(px, dt, base + r * I);
                if ((is_max ? v > bv : v < bv) || isnan(v)) bv = v, best = r;
            }
        }
        po[t] = best;
    }
    return PN_OK;
}

pn_tensor *pn_argmax(pn_tensor *x, int dim, int keepdim) { return arg_extreme("argmax", true, x, dim, keepdim); }
pn_tensor *pn_argmin(pn_tensor *x, int dim, int keepdim) { return arg_extreme("argmin", false, x, dim, keepdim); }

/* loss.c — cross entropy, negative log-likelihood, BCE with logits, MSE (torch semantics),
 * forward and backward. reduction: PN_REDUCE_NONE (per-element losses), PN_REDUCE_MEAN,
 * PN_REDUCE_SUM (0-dim results).
 *
 * Class losses take logits/logp (N, C) and target (N) i32/i64 holding 0-based class ids.
 * Rows whose target equals ignore_index contribute 0 and are left out of the mean (all
 * rows ignored: mean = 0/0 = NaN, like torch). Any other target outside [0, C) is an
 * error naming the row and the value.
 *
 * cross_entropy with label smoothing ε (torch): loss_i = (1-ε)·(-logp[i, t_i]) + ε·mean_j(-logp[i, j]),
 * logp = log_softmax(logits). Its gradient wrt logits is softmax - (1-ε)·onehot(t) - ε/C.
 *
 * Sums over rows or elements go through pn_reduce (fixed order, double accumulation). */
#include "../backend.h"
#include "fast_math.h"
#include "rows_f32.h"
#include "loss.h"

static inline double ldf(const char *p, bool f32, int64_t i) {
    return f32 ? ((const float *)p)[i] : ((const double *)p)[i];
}
static inline void stf(char *p, bool f32, int64_t i, double v) {
    if (f32) ((float *)p)[i] = (float)v;
    else ((double *)p)[i] = v;
}

static pn_status check_reduction(const char *op, int reduction) {
    if (reduction < PN_REDUCE_NONE || reduction > PN_REDUCE_SUM)
        return pn_error(PN_ERR_ARG, "%s: reduction %d is not 0 (none), 1 (mean) or 2 (sum)", op, reduction);
    return PN_OK;
}

/* Per-element losses L → the requested reduction (L is consumed). count: divisor of the mean. */
static pn_tensor *finish(pn_tensor *L, int reduction, double count) {
    if (reduction == PN_REDUCE_NONE) return L;
    pn_tensor *s = pn_reduce(PN_SUM, L, 0, NULL, 0);
    pn_release(L);
    if (s && reduction == PN_REDUCE_MEAN && pn_scale_(s, 1.0 / count)) { /* count 0: 0·inf = NaN, as torch */
        pn_release(s);
        return NULL;
    }
    return s;
}

/* The factor that multiplies row/element i's local gradient: g[i] (none), g (sum), g/count (mean).
 * g: the output gradient, (N) or 0-dim. */
static inline double gscale(const pn_tensor *g, int reduction, double count, int64_t i) {
    if (reduction == PN_REDUCE_NONE) return pn_ld(pn_ptr(g), g->dt, i * (g->nd ? g->strides[0] : 0));
    double v = pn_ld(pn_ptr(g), g->dt, 0);
    return reduction == PN_REDUCE_MEAN ? v / count : v;
}

/* ---- class losses: argument checks -------------------------------------------------------- */
/* x (N, C) float; target (N) i32/i64 with values in [0, C) or ignore_index. Counts kept rows. */
static pn_status check_class_args(const char *op, const char *xname, const pn_tensor *x, const pn_tensor *target,
                                  int64_t ignore_index, int reduction, int64_t *kept) {
    if (!x) return pn_error(PN_ERR_ARG, "%s: %s is nil", op, xname);
    if (!target) return pn_error(PN_ERR_ARG, "%s: target is nil", op);
    int dev;
    const pn_kernels *k;
    PN_TRY(pn_kernels_for(op, 2, (const pn_tensor *const[]){x, target}, (const char *const[]){xname, "target"}, &dev,
                          &k));
    PN_TRY(pn_check_float(op, xname, x));
    PN_TRY(check_reduction(op, reduction));
    if (x->nd != 2)
        return pn_error(PN_ERR_SHAPE, "%s: %s must be 2-D (N, C), got %s", op, xname, pn_shape_str(x));
    if (!pn_is_index(target->dt))
        return pn_error(PN_ERR_DTYPE, "%s: target %s has dtype %s, expected i32 or i64 class ids", op,
                        pn_shape_str(target), pn_dtype_name(target->dt));
    int64_t N = x->sizes[0], C = x->sizes[1];
    if (target->nd != 1 || target->sizes[0] != N)
        return pn_error(PN_ERR_SHAPE, "%s: target %s must have shape [%lld] to match %s %s", op,
                        pn_shape_str(target), (long long)N, xname, pn_shape_str(x));
    int64_t bad = -1, t = 0;
    PN_TRY(PN_KCALL(op, k, index_scan, target, C, ignore_index, &bad, &t, kept));
    if (bad >= 0)
        return pn_error(PN_ERR_INDEX, "%s: target[%lld] = %lld is out of range for %lld classes (%s %s, "
                        "ignore_index %lld)", op, (long long)bad + 1, (long long)t, (long long)C, xname,
                        pn_shape_str(x), (long long)ignore_index);
    return PN_OK;
}

static inline int64_t target_at(const pn_tensor *target, int64_t i) {
    return pn_ldi(pn_ptr(target), target->dt, i * target->strides[0]);
}

/* Saved tensors are views without history; iv[0] ignore_index, iv[1] reduction, sc[0] count. */
static pn_status save_all(pn_node *n, int ns, pn_tensor *const *ts) {
    for (int i = 0; i < ns; i++) {
        pn_tensor *d = pn_detach(ts[i]);
        if (!d) return PN_ERR_OOM;
        pn_status st = pn_ag_save(n, d);
        pn_release(d);
        if (st) return st;
    }
    return PN_OK;
}

/* ---- cross entropy ------------------------------------------------------------------------ */
/* logsumexp of one row and the row's plain sum (for label smoothing). x: (C). The max and the
 * sums are softmax's (rows_f32.h): log_softmax and this logsumexp agree to the bit. */
PN_VEC_FN PN_VEC static double row_lse_f32(const float *x, int64_t C, double *sum_x) {
    const float m = pn_row_max_f32(x, C);
    *sum_x = pn_row_sum8_f32(x, C, false, 0);
    return m + log(pn_row_sum8_f32(x, C, true, m));
}
static double row_lse_f64(const double *x, int64_t C, double *sum_x) {
    double m = -INFINITY, s = 0, sx = 0;
    for (int64_t j = 0; j < C; j++) m = fmax(m, x[j]);
    for (int64_t j = 0; j < C; j++) {
        s += exp(x[j] - m);
        sx += x[j];
    }
    *sum_x = sx;
    return m + log(s);
}

/* gradient row: s · (softmax - (1-ε)·onehot(t) - ε/C). x, gx: (C) */
PN_VEC_FN PN_VEC static void row_ce_grad_f32(const float *x, float *gx, int64_t C, int64_t t, double lse, double s,
                                      double eps) {
    float l = (float)lse, sf = (float)s, off = (float)(eps / (double)C);
    for (int64_t j = 0; j < C; j++) gx[j] = sf * (pn_fast_expf_nonpos(x[j] - l) - off);
    gx[t] -= sf * (float)(1.0 - eps);
}
static void row_ce_grad_f64(const double *x, double *gx, int64_t C, int64_t t, double lse, double s, double eps) {
    for (int64_t j = 0; j < C; j++) gx[j] = s * (exp(x[j] - lse) - eps / (double)C);
    gx[t] -= s * (1.0 - eps);
}

/* saved: [0] logits (N, C) contiguous, [1] target (N), [2] lse (N) f64; sc[1] = ε */
static pn_status cross_entropy_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    pn_tensor *x = n->saved[0], *gx = pn_empty_like(x);
    if (!gx) return PN_ERR_OOM;
    pn_status st = PN_KCALL_ON("cross_entropy", x, cross_entropy_bwd, x, n->saved[1], n->saved[2], g, n->iv[0],
                               (int)n->iv[1], n->sc[0], n->sc[1], gx);
    if (st) {
        pn_release(gx);
        return st;
    }
    gin[0] = gx;
    return PN_OK;
}

/* CPU kernel: gx (N, C) from x (N, C) contiguous, target (N), lse (N) f64, g (N) | 0-dim */
pn_status pn_cpu_cross_entropy_bwd(const pn_tensor *x, const pn_tensor *target, const pn_tensor *lse,
                                   const pn_tensor *g, int64_t ign, int red, double count, double eps, pn_tensor *gx) {
    int64_t N = x->sizes[0], C = x->sizes[1];
    bool f32 = x->dt == PN_F32;
    const char *px = pn_ptr(x);
    const double *pl = (const double *)pn_ptr(lse);
    char *po = pn_ptr(gx);
    #pragma omp parallel for if (N * C > PN_PAR_MIN) schedule(static)
    for (int64_t i = 0; i < N; i++) {
        int64_t t = target_at(target, i);
        if (t == ign) {
            for (int64_t j = 0; j < C; j++) stf(po, f32, i * C + j, 0.0);
            continue;
        }
        double s = gscale(g, red, count, i);
        if (f32) row_ce_grad_f32((const float *)px + i * C, (float *)po + i * C, C, t, pl[i], s, eps);
        else row_ce_grad_f64((const double *)px + i * C, (double *)po + i * C, C, t, pl[i], s, eps);
    }
    return PN_OK;
}

/* CPU kernel: x (N, C) contiguous, target (N) any stride; L (N) the row losses, lse (N) f64 */
pn_status pn_cpu_cross_entropy_fwd(const pn_tensor *x, const pn_tensor *target, int64_t ignore_index, double eps,
                                   pn_tensor *L, pn_tensor *lse) {
    int64_t N = x->sizes[0], C = x->sizes[1];
    bool f32 = x->dt == PN_F32;
    const char *px = pn_ptr(x);
    char *pL = pn_ptr(L);
    double *pl = (double *)pn_ptr(lse);
    #pragma omp parallel for if (N * C > PN_PAR_MIN) schedule(static)
    for (int64_t i = 0; i < N; i++) {
        int64_t t = target_at(target, i);
        const int64_t o = i * C;
        double sx;
        double z = f32 ? row_lse_f32((const float *)px + o, C, &sx) : row_lse_f64((const double *)px + o, C, &sx);
        pl[i] = z;
        double loss = 0;
        if (t != ignore_index) {
            loss = (1 - eps) * (z - ldf(px, f32, o + t));
            if (eps > 0) loss += eps * (z - sx / (double)C);
        }
        stf(pL, f32, i, loss);
    }
    return PN_OK;
}

pn_tensor *pn_cross_entropy(pn_tensor *logits, pn_tensor *target, double label_smoothing, int64_t ignore_index,
                            int reduction) {
    const char *op = "cross_entropy";
    int64_t kept;
    if (check_class_args(op, "logits", logits, target, ignore_index, reduction, &kept)) return NULL;
    if (!(label_smoothing >= 0 && label_smoothing < 1))
        return pn_error_null(PN_ERR_ARG, "cross_entropy: label_smoothing must be in [0, 1), got %g",
                             label_smoothing);
    int64_t N = logits->sizes[0], C = logits->sizes[1];
    if (C == 0 && kept > 0) return pn_error_null(PN_ERR_SHAPE, "cross_entropy: logits %s have no classes", pn_shape_str(logits));
    pn_tensor *x = pn_contig(logits), *out = NULL;
    pn_tensor *L = pn_empty(1, &N, logits->dt, logits->dev), *lse = pn_empty(1, &N, PN_F64, logits->dev);
    double eps = label_smoothing;
    if (!x || !L || !lse || PN_KCALL_ON(op, x, cross_entropy_fwd, x, target, ignore_index, eps, L, lse)) goto fail;
    out = finish(L, reduction, (double)kept);
    L = NULL;
    if (!out) goto fail;
    pn_tensor *ins[2] = {logits, target};
    if (pn_ag_needed(1, ins)) {
        pn_node *n = pn_ag_record(out, op, cross_entropy_bw, 2, ins);
        if (!n || save_all(n, 3, (pn_tensor *const[]){x, target, lse})) {
            pn_release(out);
            goto fail;
        }
        n->iv[0] = ignore_index;
        n->iv[1] = reduction;
        n->sc[0] = (double)kept;
        n->sc[1] = eps;
    }
    pn_release(x);
    pn_release(lse);
    return out;
fail:
    pn_release(x);
    pn_release(L);
    pn_release(lse);
    return NULL;
}

/* ---- nll ---------------------------------------------------------------------------------- */
/* saved: [0] target; the gradient is -scale at (i, target_i), 0 elsewhere */
static pn_status nll_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    pn_tensor *gx = pn_zeros((int)n->in[0].nd, n->in[0].shape, n->in[0].dtype, g->dev);
    if (!gx) return PN_ERR_OOM;
    pn_status st = PN_KCALL_ON("nll_loss", gx, nll_bwd, n->saved[0], g, n->iv[0], (int)n->iv[1], n->sc[0], gx);
    if (st) {
        pn_release(gx);
        return st;
    }
    gin[0] = gx;
    return PN_OK;
}

/* CPU kernels: logp (N, C) any strides, target (N); L (N); gx (N, C) zeroed, contiguous */
pn_status pn_cpu_nll_bwd(const pn_tensor *target, const pn_tensor *g, int64_t ignore_index, int reduction,
                         double count, pn_tensor *gx) {
    int64_t N = gx->sizes[0], C = gx->sizes[1];
    for (int64_t i = 0; i < N; i++) {
        int64_t t = target_at(target, i);
        if (t == ignore_index) continue;
        pn_st(pn_ptr(gx), gx->dt, i * C + t, -gscale(g, reduction, count, i));
    }
    return PN_OK;
}

pn_status pn_cpu_nll_fwd(const pn_tensor *logp, const pn_tensor *target, int64_t ignore_index, pn_tensor *L) {
    const char *pp = pn_ptr(logp);
    for (int64_t i = 0; i < L->sizes[0]; i++) {
        int64_t t = target_at(target, i);
        double v = t == ignore_index ? 0.0 : -pn_ld(pp, logp->dt, i * logp->strides[0] + t * logp->strides[1]);
        pn_st(pn_ptr(L), L->dt, i, v);
    }
    return PN_OK;
}

pn_tensor *pn_nll_loss(pn_tensor *logp, pn_tensor *target, int64_t ignore_index, int reduction) {
    const char *op = "nll_loss";
    int64_t kept;
    if (check_class_args(op, "logp", logp, target, ignore_index, reduction, &kept)) return NULL;
    int64_t N = logp->sizes[0];
    pn_tensor *L = pn_empty(1, &N, logp->dt, logp->dev);
    if (L && PN_KCALL_ON(op, L, nll_fwd, logp, target, ignore_index, L)) {
        pn_release(L);
        return NULL;
    }
    if (!L) return NULL;
    pn_tensor *out = finish(L, reduction, (double)kept);
    if (!out) return NULL;
    pn_tensor *ins[2] = {logp, target};
    if (pn_ag_needed(1, ins)) {
        pn_node *n = pn_ag_record(out, op, nll_bw, 2, ins);
        if (!n || save_all(n, 1, &target)) {
            pn_release(out);
            return NULL;
        }
        n->iv[0] = ignore_index;
        n->iv[1] = reduction;
        n->sc[0] = (double)kept;
    }
    return out;
}

/* ---- elementwise losses: BCE with logits, MSE ----------------------------------------------- */
enum { L_BCE = PN_LOSS_BCE, L_MSE = PN_LOSS_MSE }; /* the formulas are loss.h's, shared with CUDA */

/* CPU kernels: L, gx fresh and x-shaped; x, y same shape, any strides; g x-shaped (reduction
 * none) or 0-dim (broadcast); wrt 0: x, 1: y */
pn_status pn_cpu_elem_loss_bwd(int kind, int wrt, double scale, const pn_tensor *x, const pn_tensor *y,
                               const pn_tensor *g, pn_tensor *o) {
    bool f32 = x->dt == PN_F32;
    pn_iter it; /* g is x-shaped (none) or 0-dim (broadcast) */
    pn_iter_init(&it, x->nd, x->sizes, 4, (pn_tensor *const[]){o, (pn_tensor *)x, (pn_tensor *)y, (pn_tensor *)g},
                 NULL);
    char *po = pn_ptr(o);
    const char *px = pn_ptr(x), *py = pn_ptr(y), *pg = pn_ptr(g);
    #pragma omp parallel for if (it.numel > PN_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < it.rows; r++) {
        int64_t off[PN_ITER_MAX_OPS];
        pn_iter_row(&it, r, off);
        for (int64_t i = 0; i < it.inner; i++) {
            double xv = ldf(px, f32, off[1] + i * it.istride[1]), yv = ldf(py, f32, off[2] + i * it.istride[2]);
            double gv = ldf(pg, f32, off[3] + i * it.istride[3]);
            stf(po, f32, off[0] + i * it.istride[0], gv * scale * pn_elem_dloss(kind, wrt, xv, yv));
        }
    }
    return PN_OK;
}

pn_status pn_cpu_elem_loss_fwd(int kind, const pn_tensor *x, const pn_tensor *y, pn_tensor *L) {
    bool f32 = x->dt == PN_F32;
    pn_iter it;
    pn_iter_init(&it, x->nd, x->sizes, 3, (pn_tensor *const[]){L, (pn_tensor *)x, (pn_tensor *)y}, NULL);
    char *pL = pn_ptr(L);
    const char *px = pn_ptr(x), *py = pn_ptr(y);
    #pragma omp parallel for if (it.numel > PN_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < it.rows; r++) {
        int64_t off[PN_ITER_MAX_OPS];
        pn_iter_row(&it, r, off);
        for (int64_t i = 0; i < it.inner; i++)
            stf(pL, f32, off[0] + i * it.istride[0],
                pn_elem_loss(kind, ldf(px, f32, off[1] + i * it.istride[1]), ldf(py, f32, off[2] + i * it.istride[2])));
    }
    return PN_OK;
}

/* saved: [0] x, [1] y; iv[0] kind, iv[1] reduction; sc[0] count */
static pn_status elem_loss_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    pn_tensor *x = n->saved[0], *y = n->saved[1];
    int kind = (int)n->iv[0], red = (int)n->iv[1];
    double scale = red == PN_REDUCE_MEAN ? 1.0 / n->sc[0] : 1.0;
    for (int w = 0; w < 2; w++) {
        if (!pn_ag_input_needs(n, w)) continue;
        pn_tensor *o = pn_empty_like(x);
        if (!o) return PN_ERR_OOM;
        pn_status st = PN_KCALL_ON(n->name, o, elem_loss_bwd, kind, w, scale, x, y, g, o);
        if (st) {
            pn_release(o);
            return st;
        }
        gin[w] = o;
    }
    return PN_OK;
}

static pn_tensor *elem_loss(const char *op, int kind, pn_tensor *x, pn_tensor *y, int reduction) {
    if (!x || !y) return pn_error_null(PN_ERR_ARG, "%s: %s is nil", op, x ? "y" : "x");
    int dev;
    const pn_kernels *k;
    if (pn_kernels_for(op, 2, (const pn_tensor *const[]){x, y}, (const char *const[]){"x", "y"}, &dev, &k) ||
        pn_check_float(op, "x", x) || pn_check_float(op, "y", y) || check_reduction(op, reduction))
        return NULL;
    if (x->dt != y->dt)
        return pn_error_null(PN_ERR_DTYPE, "%s: x %s is %s but y %s is %s", op, pn_shape_str(x),
                             pn_dtype_name(x->dt), pn_shape_str(y), pn_dtype_name(y->dt));
    if (!pn_same_shape(x, y))
        return pn_error_null(PN_ERR_SHAPE, "%s: x %s and y %s must have the same shape", op, pn_shape_str(x),
                             pn_shape_str(y));
    pn_tensor *L = pn_empty_like(x);
    if (!L) return NULL;
    if (PN_KCALL(op, k, elem_loss_fwd, kind, x, y, L)) {
        pn_release(L);
        return NULL;
    }
    double count = (double)pn_numel(x);
    pn_tensor *out = finish(L, reduction, count);
    if (!out) return NULL;
    pn_tensor *ins[2] = {x, y};
    if (pn_ag_needed(2, ins)) {
        pn_node *n = pn_ag_record(out, op, elem_loss_bw, 2, ins);
        if (!n || save_all(n, 2, ins)) {
            pn_release(out);
            return NULL;
        }
        n->iv[0] = kind;
        n->iv[1] = reduction;
        n->sc[0] = count;
    }
    return out;
}

pn_tensor *pn_bce_with_logits(pn_tensor *x, pn_tensor *y, int reduction) {
    return elem_loss("bce_with_logits", L_BCE, x, y, reduction);
}
pn_tensor *pn_mse_loss(pn_tensor *x, pn_tensor *y, int reduction) {
    return elem_loss("mse_loss", L_MSE, x, y, reduction);
}

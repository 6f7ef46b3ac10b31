/* norm.c — layer normalisation over the last dim, forward and backward.
 *
 *   y = (x - mean) · rstd · weight + bias,   rstd = 1/sqrt(var + eps), var biased (/D)
 *
 * Rows (every index but the last) are independent and run in parallel; statistics are
 * computed in double (two passes: mean, then the centred sum of squares; f32 rows sum through
 * rows_f32.h's eight double lanes in a fixed order, so they vectorise and stay deterministic). The weight and
 * bias gradients sum over rows: rows are cut into at most 64 fixed blocks whose partial
 * sums are added in block order, so the result does not depend on the thread count. */
#include "../backend.h"
#include "fast_math.h"
#include "rows_f32.h"

static inline double ldf(const char *p, bool f32, int64_t i) {
    return f32 ? ((const float *)p)[i] : ((const double *)p)[i];
}
static inline void stf(char *p, bool f32, int64_t i, double v) {
    if (f32) ((float *)p)[i] = (float)v;
    else ((double *)p)[i] = v;
}

/* one row of the forward: y (D), its mean and rstd */
PN_VEC_FN PN_VEC static void ln_fwd_row_f32(const float *x, const float *w, const float *b, int64_t D, double eps,
                                            float *y, double *st) {
    double mean, var;
    PN_SUM8(mean, D, j, (double)x[j]);
    mean /= (double)D;
    PN_SUM8(var, D, j, ((double)x[j] - mean) * ((double)x[j] - mean));
    const double rstd = 1.0 / sqrt(var / (double)D + eps);
    st[0] = mean;
    st[1] = rstd;
    for (int64_t j = 0; j < D; j++) {
        double v = ((double)x[j] - mean) * rstd;
        if (w) v *= w[j];
        if (b) v += b[j];
        y[j] = (float)v;
    }
}

/* one row of the input gradient: gx = rstd (dxhat − mean(dxhat) − xhat · mean(dxhat · xhat)) */
PN_VEC_FN PN_VEC static void ln_bwd_row_f32(const float *x, const float *g, const float *w, int64_t D, double mean,
                                            double rstd, float *gx) {
#define DXH(j) ((double)g[j] * (w ? (double)w[j] : 1.0))
#define XH(j) (((double)x[j] - mean) * rstd)
    double a, b;
    PN_SUM8_2(a, b, D, j, DXH(j), DXH(j) * XH(j));
    a /= (double)D;
    b /= (double)D;
    for (int64_t j = 0; j < D; j++) gx[j] = (float)(rstd * (DXH(j) - a - XH(j) * b));
#undef DXH
#undef XH
}

static pn_status check_param(const char *arg, const pn_tensor *p, const pn_tensor *x, int64_t D) {
    if (!p) return PN_OK;
    if (p->dt != x->dt)
        return pn_error(PN_ERR_DTYPE, "layer_norm: %s %s has dtype %s but x %s has dtype %s", arg, pn_shape_str(p),
                        pn_dtype_name(p->dt), pn_shape_str(x), pn_dtype_name(x->dt));
    if (p->nd != 1 || p->sizes[0] != D)
        return pn_error(PN_ERR_SHAPE, "layer_norm: %s %s must have shape [%lld] to match the last dim of x %s", arg,
                        pn_shape_str(p), (long long)D, pn_shape_str(x));
    return PN_OK;
}

/* one f32 row's share of the weight and bias gradients: pw += g·xhat, pb += g. Vectorised
 * across j, without FMA contraction (PN_VEC_EXACT_FN): the same bits on every CPU. */
PN_VEC_EXACT_FN PN_VEC static void ln_bwd_sums_row_f32(const float *x, const float *g, int64_t D, double mean,
                                                       double rstd, double *pw, double *pb) {
    for (int64_t j = 0; j < D; j++) {
        double gv = g[j];
        pw[j] += gv * ((double)x[j] - mean) * rstd;
        pb[j] += gv;
    }
}

/* CPU kernel: x, g (rows, D) contiguous, stats (rows, 2) f64 (mean, rstd), w (D) or NULL; writes
 * each of gx (rows, D), gw (D), gb (D) that is not NULL. One pass over x and g: the rows go in at
 * most 64 fixed blocks, each row's gx and its share of the block's weight and bias sums together;
 * the blocks' partial sums are added in block order (independent of the thread count). */
pn_status pn_cpu_layer_norm_bwd(const pn_tensor *x, const pn_tensor *stats, const pn_tensor *w, const pn_tensor *g,
                                pn_tensor *gx, pn_tensor *gw, pn_tensor *gb) {
    int64_t D = x->sizes[x->nd - 1], rows = D ? pn_numel(x) / D : 0;
    bool f32 = x->dt == PN_F32;
    const char *px = pn_ptr(x), *pg = pn_ptr(g), *pw = w ? pn_ptr(w) : NULL;
    char *po = gx ? pn_ptr(gx) : NULL;
    const double *st = (const double *)pn_ptr(stats);
    int64_t bs = rows > 64 ? (rows + 63) / 64 : 1, nb = rows ? (rows + bs - 1) / bs : 0;
    /* part[k]: (2, D) partial sums of block k: g·xhat and g */
    double *part = NULL;
    if ((gw || gb) && !(part = calloc((size_t)(nb ? nb : 1) * 2 * (size_t)D + 1, sizeof *part)))
        return pn_error(PN_ERR_OOM, "layer_norm: out of memory for the weight gradient (%lld rows)", (long long)rows);
    #pragma omp parallel for if (rows * D > PN_PAR_MIN) schedule(static)
    for (int64_t k = 0; k < nb; k++) {
        int64_t r1 = (k + 1) * bs < rows ? (k + 1) * bs : rows;
        double *pw_k = part ? part + k * 2 * D : NULL, *pb_k = pw_k ? pw_k + D : NULL; /* this block's sums */
        for (int64_t r = k * bs; r < r1; r++) {
            double mean = st[2 * r], rstd = st[2 * r + 1];
            int64_t o = r * D;
            if (part && f32)
                ln_bwd_sums_row_f32((const float *)px + o, (const float *)pg + o, D, mean, rstd, pw_k, pb_k);
            else if (part)
                for (int64_t j = 0; j < D; j++) {
                    double gv = ldf(pg, f32, o + j);
                    pw_k[j] += gv * (ldf(px, f32, o + j) - mean) * rstd;
                    pb_k[j] += gv;
                }
            if (!po) continue;
            if (f32) {
                ln_bwd_row_f32((const float *)px + o, (const float *)pg + o, (const float *)pw, D, mean, rstd,
                               (float *)po + o);
                continue;
            }
            double a = 0, b = 0;
            for (int64_t j = 0; j < D; j++) { /* a = mean(dxhat), b = mean(dxhat · xhat) */
                double dxh = ldf(pg, f32, o + j) * (pw ? ldf(pw, f32, j) : 1.0);
                a += dxh;
                b += dxh * (ldf(px, f32, o + j) - mean) * rstd;
            }
            a /= (double)D;
            b /= (double)D;
            for (int64_t j = 0; j < D; j++) {
                double dxh = ldf(pg, f32, o + j) * (pw ? ldf(pw, f32, j) : 1.0);
                double xh = (ldf(px, f32, o + j) - mean) * rstd;
                stf(po, f32, o + j, rstd * (dxh - a - xh * b));
            }
        }
    }
    if (part) {
        for (int64_t k = 1; k < nb; k++)
            for (int64_t j = 0; j < 2 * D; j++) part[j] += part[k * 2 * D + j];
        if (gw)
            for (int64_t j = 0; j < D; j++) stf(pn_ptr(gw), f32, j, part[j]);
        if (gb)
            for (int64_t j = 0; j < D; j++) stf(pn_ptr(gb), f32, j, part[D + j]);
        free(part);
    }
    return PN_OK;
}

/* saved: [0] x (contiguous), [1] stats (rows, 2) f64 = (mean, rstd), [2] weight (contiguous) or absent */
static pn_status layer_norm_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    pn_tensor *x = n->saved[0], *stats = n->saved[1], *w = n->iv[0] ? n->saved[2] : NULL;
    int64_t D = x->sizes[x->nd - 1];
    bool need_x = pn_ag_input_needs(n, 0), need_w = n->iv[0] && pn_ag_input_needs(n, 1),
         need_b = n->iv[1] && pn_ag_input_needs(n, 2);
    const pn_kernels *k;
    PN_TRY(pn_backend_for("layer_norm", x->dev, &k));
    pn_tensor *gc = pn_contig(g), *gx = NULL, *gw = NULL, *gb = NULL;
    int64_t dsh[1] = {D};
    pn_status s = PN_ERR_OOM;
    if (!gc || (need_x && !(gx = pn_empty_like(x))) || (need_w && !(gw = pn_empty(1, dsh, x->dt, x->dev))) ||
        (need_b && !(gb = pn_empty(1, dsh, x->dt, x->dev))) ||
        (s = PN_KCALL("layer_norm", k, layer_norm_bwd, x, stats, w, gc, gx, gw, gb)) != PN_OK) {
        pn_release(gc);
        pn_release(gx);
        pn_release(gw);
        pn_release(gb);
        return s;
    }
    pn_release(gc);
    gin[0] = gx;
    gin[1] = gw;
    gin[2] = gb;
    return PN_OK;
}

/* CPU kernel: x (rows, D) contiguous, w / b (D) contiguous or NULL; y (rows, D), stats (rows, 2)
 * f64 (mean, rstd) */
pn_status pn_cpu_layer_norm_fwd(const pn_tensor *x, const pn_tensor *w, const pn_tensor *b, double eps, pn_tensor *y,
                                pn_tensor *stats) {
    int64_t D = x->sizes[x->nd - 1], rows = D ? pn_numel(x) / D : 0;
    bool f32 = x->dt == PN_F32;
    const char *px = pn_ptr(x), *pw = w ? pn_ptr(w) : NULL, *pb = b ? pn_ptr(b) : NULL;
    char *py = pn_ptr(y);
    double *st = (double *)pn_ptr(stats);
    #pragma omp parallel for if (rows * D > PN_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        int64_t o = r * D;
        if (f32) {
            ln_fwd_row_f32((const float *)px + o, (const float *)pw, (const float *)pb, D, eps, (float *)py + o,
                           st + 2 * r);
            continue;
        }
        double mean = 0, var = 0;
        for (int64_t j = 0; j < D; j++) mean += ldf(px, f32, o + j);
        mean /= (double)D;
        for (int64_t j = 0; j < D; j++) {
            double c = ldf(px, f32, o + j) - mean;
            var += c * c;
        }
        double rstd = 1.0 / sqrt(var / (double)D + eps);
        st[2 * r] = mean;
        st[2 * r + 1] = rstd;
        for (int64_t j = 0; j < D; j++) {
            double v = (ldf(px, f32, o + j) - mean) * rstd;
            if (pw) v *= ldf(pw, f32, j);
            if (pb) v += ldf(pb, f32, j);
            stf(py, f32, o + j, v);
        }
    }
    return PN_OK;
}

pn_tensor *pn_layer_norm(pn_tensor *x, pn_tensor *weight, pn_tensor *bias, double eps) {
    if (!x) return pn_error_null(PN_ERR_ARG, "layer_norm: x is nil");
    const pn_kernels *k;
    int dev;
    if (pn_kernels_for("layer_norm", 3, (const pn_tensor *const[]){x, weight, bias},
                       (const char *const[]){"x", "weight", "bias"}, &dev, &k) ||
        pn_check_float("layer_norm", "x", x))
        return NULL;
    if (x->nd == 0) return pn_error_null(PN_ERR_SHAPE, "layer_norm: x must have at least 1 dim, got a 0-dim tensor");
    int64_t D = x->sizes[x->nd - 1];
    if (check_param("weight", weight, x, D) || check_param("bias", bias, x, D)) return NULL;
    if (!(eps >= 0)) return pn_error_null(PN_ERR_ARG, "layer_norm: eps must be >= 0, got %g (x %s)", eps, pn_shape_str(x));
    int64_t rows = D ? pn_numel(x) / D : 0;

    pn_tensor *xc = pn_contig(x), *wc = weight ? pn_contig(weight) : NULL, *bc = bias ? pn_contig(bias) : NULL;
    int64_t ssh[2] = {rows, 2};
    pn_tensor *y = pn_empty_like(x), *stats = pn_empty(2, ssh, PN_F64, dev);
    if (!xc || (weight && !wc) || (bias && !bc) || !y || !stats) goto fail;
    if (PN_KCALL("layer_norm", k, layer_norm_fwd, xc, wc, bc, eps, y, stats)) goto fail;

    pn_tensor *ins[3] = {x, weight, bias};
    if (pn_ag_needed(3, ins)) {
        pn_node *n = pn_ag_record(y, "layer_norm", layer_norm_bw, 3, ins);
        pn_tensor *xd = n ? pn_detach(xc) : NULL, *wd = (n && wc) ? pn_detach(wc) : NULL;
        if (!n || !xd || (wc && !wd)) {
            pn_release(xd);
            goto fail;
        }
        n->iv[0] = weight != NULL;
        n->iv[1] = bias != NULL;
        pn_status st = pn_ag_save(n, xd);
        if (!st) st = pn_ag_save(n, stats);
        if (!st && wd) st = pn_ag_save(n, wd);
        pn_release(xd);
        pn_release(wd);
        if (st) goto fail;
    }
    pn_release(xc);
    pn_release(wc);
    pn_release(bc);
    pn_release(stats);
    return y;
fail:
    pn_release(xc);
    pn_release(wc);
    pn_release(bc);
    pn_release(y);
    pn_release(stats);
    return NULL;
}

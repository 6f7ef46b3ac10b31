/* softmax.c — softmax and log_softmax along any dim, forward and backward.
 *
 * The input is seen as (O, R, I) with R the softmax dim (a contiguous copy is made when
 * x is not contiguous). Each of the O·I lines of R elements is independent: stable form
 * exp(x - max) / Σ exp(x - max), sums in double. The last dim (I = 1) is the fast,
 * unit-stride case; f32 uses the vectorisable pn_fast_expf_nonpos (fast_math.h, ≈ 1.4 ulp; +0
 * below e^-80 of the line's maximum, never a subnormal, as the attention softmax).
 * A line of all -inf gives NaN, as in torch. */
#include "../backend.h"
#include "fast_math.h"
#include "rows_f32.h"

/* (O, R, I) sizes for dim d of x */
static void ori(const pn_tensor *x, int d, int64_t *O, int64_t *R, int64_t *I) {
    *O = 1, *I = 1, *R = x->nd ? x->sizes[d] : 1;
    for (int i = 0; i < x->nd; i++) {
        if (i < d) *O *= x->sizes[i];
        if (i > d) *I *= x->sizes[i];
    }
}

/* ---- line kernels: R elements at stride s ------------------------------------------------ */
/* f32, unit stride (the last dim): max, exp, sum, then scale (exp stored in y) or shift (log
 * softmax: the exps only summed, the same sum). x, y: (R). The max and the sums: rows_f32.h. */
PN_VEC_FN PN_VEC static void row_f32(const float *x, float *y, int64_t R, bool logsm) {
    const float m = pn_row_max_f32(x, R); /* a NaN makes the sum NaN below */
    if (logsm) {
        float lz = m + (float)log(pn_row_sum8_f32(x, R, true, m));
        for (int64_t r = 0; r < R; r++) y[r] = x[r] - lz;
    } else {
        for (int64_t r = 0; r < R; r++) y[r] = pn_fast_expf_nonpos(x[r] - m);
        float inv = (float)(1.0 / pn_row_sum8_f32(y, R, false, 0));
        for (int64_t r = 0; r < R; r++) y[r] *= inv;
    }
}

/* f32 along a dim other than the last: SW neighbouring lines at once, so every row of the
 * (R, I) slab is read as one contiguous run of w floats. x, y: (R, I) slabs, columns [0, w). */
#define SW 64
PN_VEC_FN static void block_f32(const float *x, float *y, int64_t R, int64_t I, int64_t w, bool logsm) {
    float m[SW], f[SW];
    double s[SW];
    for (int64_t j = 0; j < w; j++) m[j] = -INFINITY, s[j] = 0;
    for (int64_t r = 0; r < R; r++)
        for (int64_t j = 0; j < w; j++) m[j] = x[r * I + j] > m[j] ? x[r * I + j] : m[j];
    for (int64_t r = 0; r < R; r++)
        for (int64_t j = 0; j < w; j++) {
            float e = pn_fast_expf_nonpos(x[r * I + j] - m[j]);
            y[r * I + j] = e;
            s[j] += e;
        }
    for (int64_t j = 0; j < w; j++) f[j] = logsm ? m[j] + (float)log(s[j]) : (float)(1.0 / s[j]);
    for (int64_t r = 0; r < R; r++)
        for (int64_t j = 0; j < w; j++) y[r * I + j] = logsm ? x[r * I + j] - f[j] : y[r * I + j] * f[j];
}

/* backward of block_f32. y, g, gx: (R, I) slabs, columns [0, w) */
PN_VEC_FN static void block_bw_f32(const float *y, const float *g, float *gx, int64_t R, int64_t I, int64_t w,
                                   bool logsm) {
    double acc[SW];
    float a[SW];
    for (int64_t j = 0; j < w; j++) acc[j] = 0;
    for (int64_t r = 0; r < R; r++)
        for (int64_t j = 0; j < w; j++) acc[j] += logsm ? (double)g[r * I + j] : (double)g[r * I + j] * y[r * I + j];
    for (int64_t j = 0; j < w; j++) a[j] = (float)acc[j];
    for (int64_t r = 0; r < R; r++)
        for (int64_t j = 0; j < w; j++) {
            int64_t k = r * I + j;
            gx[k] = logsm ? g[k] - pn_fast_expf_nonpos(y[k]) * a[j] : y[k] * (g[k] - a[j]);
        }
}

static inline void line_f64(const double *x, double *y, int64_t R, int64_t s, bool logsm) {
    double m = -INFINITY;
    for (int64_t r = 0; r < R; r++) m = x[r * s] > m ? x[r * s] : m;
    double sum = 0;
    for (int64_t r = 0; r < R; r++) {
        double e = exp(x[r * s] - m);
        y[r * s] = e;
        sum += e;
    }
    if (logsm) {
        double lz = m + log(sum);
        for (int64_t r = 0; r < R; r++) y[r * s] = x[r * s] - lz;
    } else {
        double inv = 1.0 / sum;
        for (int64_t r = 0; r < R; r++) y[r * s] *= inv;
    }
}

/* Backward along one line. softmax: gx = y (g - Σ g y); log_softmax: gx = g - exp(y) Σ g.
 * y, g, gx: (R) at stride s */
PN_VEC_FN PN_VEC static void row_bw_f32(const float *y, const float *g, float *gx, int64_t R, bool logsm) {
    float a = (float)(logsm ? pn_row_sum8_f32(g, R, false, 0) : pn_row_dot8_f32(g, y, R));
    if (logsm)
        for (int64_t r = 0; r < R; r++) gx[r] = g[r] - pn_fast_expf_nonpos(y[r]) * a;
    else
        for (int64_t r = 0; r < R; r++) gx[r] = y[r] * (g[r] - a);
}
static inline void line_bw_f64(const double *y, const double *g, double *gx, int64_t R, int64_t s, bool logsm) {
    double acc = 0;
    if (logsm) {
        for (int64_t r = 0; r < R; r++) acc += g[r * s];
        for (int64_t r = 0; r < R; r++) gx[r * s] = g[r * s] - exp(y[r * s]) * acc;
    } else {
        for (int64_t r = 0; r < R; r++) acc += g[r * s] * y[r * s];
        for (int64_t r = 0; r < R; r++) gx[r * s] = y[r * s] * (g[r * s] - acc);
    }
}

/* CPU kernel: every line of (O, R, I). a: input (x or y), b: g or NULL (forward), out: result;
 * all contiguous. */
pn_status pn_cpu_softmax_lines(const pn_tensor *a, const pn_tensor *b, pn_tensor *out, int64_t O, int64_t R,
                               int64_t I, int logsm) {
    const char *pa = pn_ptr(a), *pb = b ? pn_ptr(b) : NULL;
    char *po = pn_ptr(out);
    if (a->dt == PN_F32 && I > 1) { /* slabs of SW lines */
        int64_t nb = (I + SW - 1) / SW;
        #pragma omp parallel for if (O * R * I > PN_PAR_MIN) schedule(static)
        for (int64_t t = 0; t < O * nb; t++) {
            int64_t i0 = (t % nb) * SW, w = I - i0 < SW ? I - i0 : SW, start = (t / nb) * R * I + i0;
            const float *x = (const float *)pa + start;
            float *y = (float *)po + start;
            if (pb) block_bw_f32(x, (const float *)pb + start, y, R, I, w, logsm);
            else block_f32(x, y, R, I, w, logsm);
        }
        return PN_OK;
    }
    int64_t lines = O * I;
    #pragma omp parallel for if (lines * R > PN_PAR_MIN) schedule(static)
    for (int64_t t = 0; t < lines; t++) {
        int64_t start = (t / I) * R * I + t % I;
        if (a->dt == PN_F32) { /* I == 1 */
            const float *x = (const float *)pa + start;
            float *y = (float *)po + start;
            if (pb) row_bw_f32(x, (const float *)pb + start, y, R, logsm);
            else row_f32(x, y, R, logsm);
        } else {
            const double *x = (const double *)pa + start, *g = pb ? (const double *)pb + start : NULL;
            double *y = (double *)po + start;
            if (g) line_bw_f64(x, g, y, R, I, logsm);
            else line_f64(x, y, R, I, logsm);
        }
    }
    return PN_OK;
}

/* saved[0]: the output y (a view without history); iv[0]: the wrapped dim */
static pn_status softmax_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    pn_tensor *y = n->saved[0];
    pn_tensor *gc = pn_contig(g);
    pn_tensor *gx = gc ? pn_empty_like(y) : NULL;
    if (!gx) {
        pn_release(gc);
        return PN_ERR_OOM;
    }
    int64_t O, R, I;
    ori(y, (int)n->iv[0], &O, &R, &I);
    const pn_kernels *k;
    pn_status st = pn_backend_for(n->name, y->dev, &k);
    if (!st) st = PN_KCALL(n->name, k, softmax_lines, y, gc, gx, O, R, I, n->iv[1] != 0);
    return pn_bw_result(st, gc, gx, &gin[0]);
}

static pn_tensor *softmax_impl(const char *op, pn_tensor *x, int dim, bool logsm) {
    if (!x) return pn_error_null(PN_ERR_ARG, "%s: x is nil", op);
    const pn_kernels *k;
    if (pn_backend_for(op, x->dev, &k) || pn_check_float(op, "x", x)) return NULL;
    int d;
    if (pn_wrap_dim(op, dim, x->nd, &d)) return NULL;
    pn_tensor *xc = pn_contig(x);
    if (!xc) return NULL;
    pn_tensor *y = pn_empty_like(x);
    if (!y) {
        pn_release(xc);
        return NULL;
    }
    int64_t O, R, I;
    ori(x, d, &O, &R, &I);
    pn_status st = pn_numel(x) > 0 ? PN_KCALL(op, k, softmax_lines, xc, NULL, y, O, R, I, logsm) : PN_OK;
    pn_release(xc);
    if (st) {
        pn_release(y);
        return NULL;
    }
    if (pn_ag_needed(1, &x)) {
        pn_node *n = pn_ag_record(y, op, softmax_bw, 1, &x);
        pn_tensor *yv = n ? pn_detach(y) : NULL; /* a view without history: no cycle y → node → y */
        if (!yv) {
            pn_release(y);
            return NULL;
        }
        n->iv[0] = d;
        n->iv[1] = logsm;
        st = pn_ag_save(n, yv);
        pn_release(yv);
        if (st) {
            pn_release(y);
            return NULL;
        }
    }
    return y;
}

pn_tensor *pn_softmax(pn_tensor *x, int dim) { return softmax_impl("softmax", x, dim, false); }
pn_tensor *pn_log_softmax(pn_tensor *x, int dim) { return softmax_impl("log_softmax", x, dim, true); }

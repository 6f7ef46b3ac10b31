/* dropout.c — inverted dropout: y = x · m, m = (u >= p) / (1 - p), u ~ U[0,1) drawn with
 * pn_rand from the global Philox stream, so a given seed and draw order give the same
 * mask on every thread count. Each element is kept with probability 1 - p, and E[y] = x.
 * The scaled mask is saved; the backward is g · m. */
#include "../internal.h"

/* saved[0]: the scaled mask m, same shape and dtype as x */
static pn_status dropout_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    pn_tensor *m = n->saved[0];
    pn_tensor *gx = pn_empty_like(m);
    if (!gx) return PN_ERR_OOM;
    pn_iter it;
    pn_iter_init(&it, m->nd, m->sizes, 3, (pn_tensor *const[]){gx, g, m}, NULL);
    char *po = pn_ptr(gx);
    const char *pg = pn_ptr(g), *pm = pn_ptr(m);
    bool f32 = m->dt == PN_F32;
    #pragma omp parallel for if (it.numel > PN_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < it.rows; r++) {
        int64_t off[PN_ITER_MAX_OPS];
        pn_iter_row(&it, r, off);
        for (int64_t i = 0; i < it.inner; i++) {
            int64_t a = off[0] + i * it.istride[0], b = off[1] + i * it.istride[1], c = off[2] + i * it.istride[2];
            if (f32) ((float *)po)[a] = ((const float *)pg)[b] * ((const float *)pm)[c];
            else ((double *)po)[a] = ((const double *)pg)[b] * ((const double *)pm)[c];
        }
    }
    gin[0] = gx;
    return PN_OK;
}

pn_tensor *pn_dropout(pn_tensor *x, double p, int train) {
    if (!x) return pn_error_null(PN_ERR_ARG, "dropout: x is nil");
    if (pn_check_cpu("dropout", "x", x) || pn_check_float("dropout", "x", x)) return NULL;
    if (!(p >= 0 && p < 1))
        return pn_error_null(PN_ERR_ARG, "dropout: p must be in [0, 1), got %g (x %s)", p, pn_shape_str(x));
    if (p == 0 || !train) {
        pn_retain(x);
        return x;
    }
    pn_tensor *m = pn_rand(x->nd, x->sizes, x->dt, x->dev); /* contiguous; becomes the scaled mask */
    pn_tensor *y = m ? pn_empty_like(x) : NULL;
    if (!y) {
        pn_release(m);
        return NULL;
    }
    double scale = 1.0 / (1.0 - p);
    bool f32 = x->dt == PN_F32;
    char *pm = pn_ptr(m), *py = pn_ptr(y);
    const char *px = pn_ptr(x);
    pn_iter it;
    pn_iter_init(&it, x->nd, x->sizes, 3, (pn_tensor *const[]){y, x, m}, NULL);
    #pragma omp parallel for if (it.numel > PN_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < it.rows; r++) {
        int64_t off[PN_ITER_MAX_OPS];
        pn_iter_row(&it, r, off);
        for (int64_t i = 0; i < it.inner; i++) {
            int64_t a = off[0] + i * it.istride[0], b = off[1] + i * it.istride[1], c = off[2] + i * it.istride[2];
            if (f32) {
                float *mk = (float *)pm + c;
                *mk = (double)*mk >= p ? (float)scale : 0.0f;
                ((float *)py)[a] = ((const float *)px)[b] * *mk;
            } else {
                double *mk = (double *)pm + c;
                *mk = *mk >= p ? scale : 0.0;
                ((double *)py)[a] = ((const double *)px)[b] * *mk;
            }
        }
    }
    if (pn_ag_needed(1, &x)) {
        pn_node *n = pn_ag_record(y, "dropout", dropout_bw, 1, &x);
        if (!n) {
            pn_release(m);
            pn_release(y);
            return NULL;
        }
        pn_ag_save(n, m);
    }
    pn_release(m);
    return y;
}

/* dropout.c — inverted dropout: y = x · keep / (1 − p), keep ~ Bernoulli(1 − p).
 * The keep mask is drawn straight from the global Philox stream, eight elements per
 * counter block (16 bits each, kept when the half-word >= round(p·2¹⁶)), so a given seed
 * and draw order give the same mask on every thread count. p is thus resolved to 2⁻¹⁶
 * (|error| ≤ 7.7e-6), which buys an 8× cheaper mask than one Philox word pair per element
 * — Philox is the cost of dropout on large inputs such as Cora's features. The mask is
 * saved as u8; the backward is g · keep / (1 − p). */
#include "../internal.h"

typedef struct {
    double scale;
} drop_ctx;

/* saved[0]: keep mask u8, contiguous, x's shape; sc[0] = 1/(1−p) */
static pn_status dropout_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    pn_tensor *m = n->saved[0];
    pn_tensor *gc = pn_contiguous(g);
    pn_tensor *gx = gc ? pn_empty(m->nd, m->sizes, g->dt, g->dev) : NULL;
    if (!gx) {
        pn_release(gc);
        return PN_ERR_OOM;
    }
    int64_t n_el = pn_numel(m);
    const uint8_t *keep = (const uint8_t *)pn_ptr(m);
    double scale = n->sc[0];
    if (g->dt == PN_F32) {
        const float *pg = (const float *)pn_ptr(gc);
        float *po = (float *)pn_ptr(gx), s = (float)scale;
        #pragma omp parallel for if (n_el > PN_PAR_MIN) schedule(static)
        for (int64_t i = 0; i < n_el; i++) po[i] = pg[i] * ((float)keep[i] * s);
    } else {
        const double *pg = (const double *)pn_ptr(gc);
        double *po = (double *)pn_ptr(gx);
        #pragma omp parallel for if (n_el > PN_PAR_MIN) schedule(static)
        for (int64_t i = 0; i < n_el; i++) po[i] = pg[i] * ((double)keep[i] * scale);
    }
    pn_release(gc);
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
    pn_tensor *xc = pn_contiguous(x);
    pn_tensor *m = xc ? pn_empty(x->nd, x->sizes, PN_U8, x->dev) : NULL;
    pn_tensor *y = m ? pn_empty_like(x) : NULL;
    if (!y) {
        pn_release(xc);
        pn_release(m);
        return NULL;
    }
    int64_t n = pn_numel(x), blocks = (n + 7) / 8;
    uint64_t seed, base = pn_philox_reserve(blocks, &seed);
    uint32_t thresh = (uint32_t)lround(p * 65536.0); /* p < 1, so at most 65536 */
    double scale = 1.0 / (1.0 - p);
    float fscale = (float)scale;
    uint8_t *keep = (uint8_t *)pn_ptr(m);
    bool f32 = x->dt == PN_F32;
    const char *px = pn_ptr(xc);
    char *py = pn_ptr(y);
    #pragma omp parallel for if (n > PN_PAR_MIN / 8) schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        uint32_t w[4];
        pn_philox4x32(seed, base + (uint64_t)b, w);
        int64_t i0 = 8 * b, i1 = i0 + 8 < n ? i0 + 8 : n;
        for (int64_t i = i0; i < i1; i++) {
            int j = (int)(i - i0);
            uint32_t half = (w[j >> 1] >> ((j & 1) * 16)) & 0xFFFFu;
            uint8_t k = half >= thresh;
            keep[i] = k;
            /* branch-free: keep is a coin flip, a branch on it mispredicts half the time */
            if (f32) ((float *)py)[i] = ((const float *)px)[i] * ((float)k * fscale);
            else ((double *)py)[i] = ((const double *)px)[i] * ((double)k * scale);
        }
    }
    pn_release(xc);
    if (pn_ag_needed(1, &x)) {
        pn_node *nd = pn_ag_record(y, "dropout", dropout_bw, 1, &x);
        if (!nd) {
            pn_release(m);
            pn_release(y);
            return NULL;
        }
        nd->sc[0] = scale;
        pn_ag_save(nd, m);
    }
    pn_release(m);
    return y;
}

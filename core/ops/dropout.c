/* dropout.c — inverted dropout: y = x · keep / (1 − p), keep ~ Bernoulli(1 − p).
 * The keep mask is drawn straight from the global Philox stream, eight elements per
 * counter block (16 bits each, kept when the half-word >= round(p·2¹⁶)), so a given seed
 * and draw order give the same mask on every thread count. p is thus resolved to 2⁻¹⁶
 * (|error| ≤ 7.7e-6), which buys an 8× cheaper mask than one Philox word pair per element
 * — Philox is the cost of dropout on large inputs such as Cora's features. The mask is
 * saved as u8; the backward is g · keep / (1 − p). */
#include "../backend.h"
#include "dropout.h"
#include "fast_math.h"

/* saved[0]: keep mask u8, contiguous, x's shape; sc[0] = 1/(1−p) */
static pn_status dropout_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    pn_tensor *m = n->saved[0];
    pn_tensor *gc = pn_contiguous(g);
    pn_tensor *gx = gc ? pn_empty(m->nd, m->sizes, g->dt, g->dev) : NULL;
    pn_status st = gx ? PN_KCALL_ON("dropout", gx, dropout_bwd, gc, m, n->sc[0], gx) : PN_ERR_OOM;
    return pn_bw_result(st, gc, gx, &gin[0]);
}

/* CPU kernel: gx = g · keep · scale; all contiguous, keep u8 */
pn_status pn_cpu_dropout_bwd(const pn_tensor *gc, const pn_tensor *m, double scale, pn_tensor *gx) {
    int64_t n_el = pn_numel(m);
    const uint8_t *keep = (const uint8_t *)pn_ptr(m);
    if (gc->dt == PN_F32) {
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
    return PN_OK;
}

pn_tensor *pn_dropout(pn_tensor *x, double p, int train) {
    if (!x) return pn_error_null(PN_ERR_ARG, "dropout: x is nil");
    const pn_kernels *kt;
    if (pn_backend_for("dropout", x->dev, &kt) || pn_check_float("dropout", "x", x)) return NULL;
    if (!(p >= 0 && p < 1))
        return pn_error_null(PN_ERR_ARG, "dropout: p must be in [0, 1), got %g (x %s)", p, pn_shape_str(x));
    if (p == 0 || !train) {
        pn_retain(x);
        return x;
    }
    pn_tensor *xc = pn_contiguous(x);
    bool need_mask = pn_ag_needed(1, &x); /* no gradient, no mask to keep */
    pn_tensor *m = (xc && need_mask) ? pn_empty(x->nd, x->sizes, PN_U8, x->dev) : NULL;
    pn_tensor *y = (xc && (m || !need_mask)) ? pn_empty_like(x) : NULL;
    if (!y) {
        pn_release(xc);
        pn_release(m);
        return NULL;
    }
    int64_t n = pn_numel(x), blocks = (n + 7) / 8;
    uint64_t seed, base = pn_philox_reserve(blocks, &seed); /* the stream is reserved on the host */
    double scale = 1.0 / (1.0 - p);
    if (PN_KCALL("dropout", kt, dropout_fwd, xc, p, seed, base, y, m)) {
        pn_release(xc);
        pn_release(m);
        pn_release(y);
        return NULL;
    }
    pn_release(xc);
    if (need_mask) {
        pn_node *nd = pn_ag_record(y, "dropout", dropout_bw, 1, &x);
        if (!nd) {
            pn_release(m);
            pn_release(y);
            return NULL;
        }
        nd->sc[0] = scale;
        if (pn_ag_save(nd, m)) {
            pn_release(m);
            pn_release(y);
            return NULL;
        }
    }
    pn_release(m);
    return y;
}

/* Blocks [b0, b1) of an f32 tensor with its mask kept (training), LANES blocks at a time: the
 * Philox rounds run over the LANES counters side by side (one vector of each word), the same
 * words as pn_dropout_block_f32's one block at a time, which Philox's dependent rounds kept
 * scalar. x, y, keep: the whole tensor's (n elements) */
#define LANES 16
PN_VEC_FN PN_VEC static void dropout_blocks_f32(const float *x, float *y, uint8_t *keep, int64_t n, int64_t b0,
                                               int64_t b1, float s, uint64_t seed, uint64_t base, uint32_t thresh) {
    int64_t b = b0;
    for (; b + LANES <= b1 && 8 * (b + LANES) <= n; b += LANES) {
        uint32_t c0[LANES], c1[LANES], c2[LANES], c3[LANES];
        for (int l = 0; l < LANES; l++) {
            uint64_t ctr = base + (uint64_t)(b + l);
            c0[l] = (uint32_t)ctr, c1[l] = (uint32_t)(ctr >> 32), c2[l] = 0, c3[l] = 0;
        }
        uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
        for (int r = 0; r < 10; r++, k0 += PN_PHILOX_W0, k1 += PN_PHILOX_W1) {
            /* omp simd: left alone, GCC unrolls the 16 lanes first and then finds SLP unprofitable */
            #pragma omp simd
            for (int l = 0; l < LANES; l++) pn_philox_round(&c0[l], &c1[l], &c2[l], &c3[l], k0, k1);
        }
        /* kk: the LANES blocks' keep flags in memory order (block l's element j at 8l + j) */
        uint8_t kk[8 * LANES];
        for (int j = 0; j < 8; j++) {
            const uint32_t *wj = j < 2 ? c0 : j < 4 ? c1 : j < 6 ? c2 : c3; /* word j >> 1 */
            #pragma omp simd
            for (int l = 0; l < LANES; l++) kk[8 * l + j] = pn_dropout_keep(wj[l], j, thresh);
        }
        const int64_t i0 = 8 * b;
        #pragma omp simd
        for (int e = 0; e < 8 * LANES; e++) {
            keep[i0 + e] = kk[e];
            y[i0 + e] = x[i0 + e] * ((float)kk[e] * s);
        }
    }
    for (; b < b1; b++) {
        int64_t i0 = 8 * b;
        int len = n - i0 < 8 ? (int)(n - i0) : 8;
        pn_dropout_block_f32(x + i0, y + i0, keep + i0, len, s, seed, base + (uint64_t)b, thresh);
    }
}

/* CPU kernel: x, y contiguous; keep (x's shape, u8) or NULL when no gradient needs it; Philox
 * counters base + b for the 8-element blocks b under key seed (the block maths is dropout.h's,
 * shared with the CUDA kernel) */
pn_status pn_cpu_dropout_fwd(const pn_tensor *xc, double p, uint64_t seed, uint64_t base, pn_tensor *y,
                             pn_tensor *m) {
    const pn_tensor *x = xc;
    int64_t n = pn_numel(x), blocks = (n + 7) / 8;
    uint32_t thresh = pn_dropout_thresh(p); /* p < 1, so at most 65536 */
    double scale = 1.0 / (1.0 - p);
    float fscale = (float)scale;
    uint8_t *keep = m ? (uint8_t *)pn_ptr(m) : NULL;
    const char *px = pn_ptr(xc);
    char *py = pn_ptr(y);
    /* Block b covers elements 8b … 8b+7 with counter base + b, whatever the thread. */
    if (x->dt == PN_F32 && keep) { /* training: every block's mask is drawn, LANES at a time */
        int64_t per = (blocks + LANES - 1) / LANES; /* whole groups of LANES blocks a piece */
        #pragma omp parallel for if (n > PN_PAR_MIN / 8) schedule(static)
        for (int64_t q = 0; q < per; q++) {
            int64_t b0 = q * LANES, b1 = b0 + LANES < blocks ? b0 + LANES : blocks;
            dropout_blocks_f32((const float *)px, (float *)py, keep, n, b0, b1, fscale, seed, base, thresh);
        }
        return PN_OK;
    }
    #pragma omp parallel for if (n > PN_PAR_MIN / 8) schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t i0 = 8 * b;
        int len = n - i0 < 8 ? (int)(n - i0) : 8;
        if (x->dt == PN_F32)
            pn_dropout_block_f32((const float *)px + i0, (float *)py + i0, keep ? keep + i0 : NULL, len, fscale, seed,
                                 base + (uint64_t)b, thresh);
        else
            pn_dropout_block_f64((const double *)px + i0, (double *)py + i0, keep ? keep + i0 : NULL, len, scale,
                                 seed, base + (uint64_t)b, thresh);
    }
    return PN_OK;
}

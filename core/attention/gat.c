/* gat.c — the GAT score (Veličković et al.): s = LeakyReLU_slope(a_l·q_i + a_r·k_j), one
 * (a_l, a_r) pair of (H, D) vectors per head (opts a_l, a_r), slope 0.2. Graph attention
 * only: no GEMM, the two projections are the PROJ row and column terms, so their
 * gradients (into q, k, a_l, a_r) come from the drivers' term backward. */
#ifndef PN_EPI_PASS
#include "attention.h"
#include "fastmath.h"

#define PN_EPI_FILE "gat.c"
#include "epilogue_twice.h"

static const pn_score_plan gat_tmpl = {
    .gemm = PN_GEMM_NONE,
    .qterm = {PN_TERM_PROJ, PN_TERM_NONE},
    .kterm = {PN_TERM_PROJ, PN_TERM_NONE},
    .fwd32 = pn_epi_gat_fwd_f32, .vjp32 = pn_epi_gat_vjp_f32,
    .fwd64 = pn_epi_gat_fwd_f64, .vjp64 = pn_epi_gat_vjp_f64};

static pn_status gat_plan(const char *op, const pn_attn_opts *o, pn_score_plan *p) {
    if (!o->a_l || !o->a_r)
        return pn_error(PN_ERR_ARG, "%s: score 'gat' needs a_l and a_r ((H, D) tensors)%s%s", op,
                        o->a_l ? "" : "; a_l is missing", o->a_r ? "" : "; a_r is missing");
    *p = gat_tmpl;
    return PN_OK;
}

const pn_score_desc pn_score_gat = {
    .name = "gat",
    .flags = PN_VARIANT_FLAG_GRAPH_ONLY,
    .defaults = {.scale = NAN, .gamma = NAN, .r = NAN, .beta = NAN, .c = NAN, .curvature = NAN, .slope = 0.2},
    .plan = gat_plan,
};

#else /* typed part: real, EPI() */

PN_VEC PN_HIDDEN void EPI(gat_fwd)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const real *G,
        const real *q0, const real *q1, const real *k0, const real *k1, real *s) {
    const real slope = (real)p->slope;
    for (int64_t i = 0; i < rows; i++) {
        const real qq = q0[i];
        real *o = s + i * ld;
        for (int64_t j = 0; j < n; j++) {
            real e = qq + k0[j];
            o[j] = e > 0 ? e : slope * e;
        }
    }
}

PN_VEC PN_HIDDEN void EPI(gat_vjp)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const real *G,
        const real *q0, const real *q1, const real *k0, const real *k1, const real *ds, real *dG,
        double *dq, real *dk0, real *dk1, double *dparam) {
    const real slope = (real)p->slope;
    for (int64_t i = 0; i < rows; i++) {
        const real qq = q0[i], *dsi = ds + i * ld;
        real *o = dG + i * ld;
        real sq = 0;
        #pragma omp simd reduction(+ : sq)
        for (int64_t j = 0; j < n; j++) {
            real e = qq + k0[j];
            real f = e > 0 ? dsi[j] : slope * dsi[j];
            o[j] = 0;
            sq += f;
            dk0[j] += f;
        }
        dq[2 * i] += sq;
    }
}

#endif

/* dot.c — the dot-product score (Vaswani et al.): s = scale·q·k, scale 1/√D by default.
 * GEMM over all coordinates, no row or column terms. */
#ifndef PN_EPI_PASS
#include "attention.h"
#include "fastmath.h"

#define PN_EPI_FILE "dot.c"
#include "epilogue_twice.h"

static const pn_score_plan dot_tmpl = {
    .gemm = PN_GEMM_ALL,
    .fwd32 = pn_epi_dot_fwd_f32, .vjp32 = pn_epi_dot_vjp_f32,
    .fwd64 = pn_epi_dot_fwd_f64, .vjp64 = pn_epi_dot_vjp_f64};

static pn_status dot_plan(const char *op, const pn_attn_opts *o, pn_score_plan *p) {
    (void)op, (void)o;
    *p = dot_tmpl;
    return PN_OK;
}

const pn_score_desc pn_score_dot = {
    .name = "dot",
    .defaults = {.scale = NAN, .gamma = NAN, .r = NAN, .beta = NAN, .c = NAN, .curvature = NAN, .slope = NAN},
    .plan = dot_plan,
};

#else /* typed part: real, EPI() */

PN_VEC PN_HIDDEN void EPI(dot_fwd)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const real *G,
        const real *q0, const real *q1, const real *k0, const real *k1, real *s) {
    const real sc = (real)p->scale;
    for (int64_t i = 0; i < rows; i++) {
        const real *g = G + i * ld;
        real *o = s + i * ld;
        for (int64_t j = 0; j < n; j++) o[j] = sc * g[j];
    }
}

PN_VEC PN_HIDDEN void EPI(dot_vjp)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const real *G,
        const real *q0, const real *q1, const real *k0, const real *k1, const real *ds, real *dG,
        double *dq, real *dk0, real *dk1, double *dparam) {
    const real sc = (real)p->scale;
    for (int64_t i = 0; i < rows; i++) {
        const real *g = ds + i * ld;
        real *o = dG + i * ld;
        for (int64_t j = 0; j < n; j++) o[j] = sc * g[j];
    }
}

#endif

/* laplacian.h — the Laplacian score (Coneheads §4.1): s = −γ‖q−k‖, γ = 1 by default.
 *
 * ‖q−k‖² = ‖q‖² + ‖k‖² − 2q·k (GEMM over all coordinates plus NORM2 terms). The norm has a
 * kink at q = k; below a relative floor PN_EPI_EPS·(‖q‖²+‖k‖²) (1e-6 in f32, 1e-14 in f64 —
 * the rounding noise of the expansion) the distance is taken as 0 and its subgradient as 0,
 * so values and gradients stay finite there. */
#ifndef PN_EPI_PLAN /* the typed part: real, EPI(), PN_EPI_EPS (epi_impl.h, once per precision) */
PN_VEC PN_HIDDEN void EPI(laplacian_fwd)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const real *G,
        const real *q0, const real *q1, const real *k0, const real *k1, real *s) {
    const real gamma = (real)p->v[PN_P_gamma];
    for (int64_t i = 0; i < rows; i++) {
        const real *g = G + i * ld, qq = q0[i];
        real *o = s + i * ld;
        for (int64_t j = 0; j < n; j++) {
            real n2 = qq + k0[j];
            real d2 = n2 - 2 * g[j];
            real d = d2 > PN_EPI_EPS * n2 ? d2 * pn_rsqrt(d2) : 0;
            o[j] = -gamma * d;
        }
    }
}

PN_VEC PN_HIDDEN void EPI(laplacian_vjp)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const real *G,
        const real *q0, const real *q1, const real *k0, const real *k1, const real *ds, real *dG,
        double *dq, real *dk0, real *dk1, double *dparam) {
    const real gamma = (real)p->v[PN_P_gamma];
    double sg_all = 0;
    for (int64_t i = 0; i < rows; i++) {
        const real *g = G + i * ld, *dsi = ds + i * ld, qq = q0[i];
        real *o = dG + i * ld;
        real sq = 0, sg = 0;
        #pragma omp simd reduction(+ : sq, sg)
        for (int64_t j = 0; j < n; j++) {
            real n2 = qq + k0[j];
            real d2 = n2 - 2 * g[j];
            real gj = dsi[j];
            int live = d2 > PN_EPI_EPS * n2 && gj != 0;
            real rd = live ? pn_rsqrt(d2) : 0; /* 1/Δ */
            real f = -gamma * gj * (real)0.5 * rd; /* ds·∂s/∂(Δ²) */
            sg += -d2 * rd * gj;
            o[j] = -2 * f;
            sq += f;
            dk0[j] += f;
        }
        dq[2 * i] += sq;
        sg_all += sg;
    }
    dparam[PN_P_gamma] += sg_all;
}

#else /* the plan (epi_impl.h, once, after both precisions) */

static const pn_score_plan laplacian_tmpl = {
    .gemm = PN_GEMM_ALL,
    .qterm = {PN_TERM_NORM2, PN_TERM_NONE},
    .kterm = {PN_TERM_NORM2, PN_TERM_NONE},
    .params = PN_PBIT(PN_P_gamma),
    .fwd32 = pn_epi_laplacian_fwd_f32, .vjp32 = pn_epi_laplacian_vjp_f32,
    .fwd64 = pn_epi_laplacian_fwd_f64, .vjp64 = pn_epi_laplacian_vjp_f64};

pn_status pn_score_plan_laplacian(const char *op, const pn_attn_opts *o, pn_score_plan *p) {
    (void)op, (void)o;
    *p = laplacian_tmpl;
    return PN_OK;
}

#endif

/* dot.h — the dot-product score (Vaswani et al.): s = scale·q·k, scale 1/√D by default.
 * GEMM over all coordinates, no row or column terms. */
#ifndef PN_EPI_PLAN /* the typed part: real, EPI(), PN_EPI_EPS (epi_impl.h, once per precision) */
PN_VEC PN_HIDDEN void EPI(dot_fwd)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const real *G,
        const real *q0, const real *q1, const real *k0, const real *k1, real *s) {
    const real sc = (real)p->v[PN_P_scale];
    for (int64_t i = 0; i < rows; i++) {
        const real *g = G + i * ld;
        real *o = s + i * ld;
        for (int64_t j = 0; j < n; j++) o[j] = sc * g[j];
    }
}

/* want: scale is learnable (its gradient Σ ds·q·k is then summed; else compiled out) */
PN_INLINE void EPI(dot_vjp_body)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const real *G,
        const real *ds, real *dG, double *dparam, const int want) {
    const real sc = (real)p->v[PN_P_scale];
    double ss_all = 0;
    for (int64_t i = 0; i < rows; i++) {
        const real *g = ds + i * ld, *gg = G + i * ld;
        real *o = dG + i * ld;
        real ss = 0;
        #pragma omp simd reduction(+ : ss)
        for (int64_t j = 0; j < n; j++) {
            if (want) ss += g[j] * gg[j]; /* read G before dG (which may alias ds, not G) */
            o[j] = sc * g[j];
        }
        ss_all += ss;
    }
    if (want) dparam[PN_P_scale] += ss_all;
}

PN_VEC PN_HIDDEN void EPI(dot_vjp)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const real *G,
        const real *q0, const real *q1, const real *k0, const real *k1, const real *ds, real *dG,
        double *dq, real *dk0, real *dk1, double *dparam) {
    PN_BOOL_SWITCH(p->learn & PN_PBIT(PN_P_scale), want, EPI(dot_vjp_body)(p, rows, n, ld, G, ds, dG, dparam, want));
}

#else /* the plan (epi_impl.h, once, after both precisions) */

static const pn_score_plan dot_tmpl = {
    .gemm = PN_GEMM_ALL,
    .params = PN_PBIT(PN_P_scale),
    .fwd32 = pn_epi_dot_fwd_f32, .vjp32 = pn_epi_dot_vjp_f32,
    .fwd64 = pn_epi_dot_fwd_f64, .vjp64 = pn_epi_dot_vjp_f64};

pn_status pn_score_plan_dot(const char *op, const pn_attn_opts *o, pn_score_plan *p) {
    (void)op, (void)o;
    *p = dot_tmpl;
    return PN_OK;
}

#endif

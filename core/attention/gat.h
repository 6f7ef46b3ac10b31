/* gat.h — the GAT score (Veličković et al.): s = LeakyReLU_slope(a_l·q_i + a_r·k_j), one
 * (a_l, a_r) pair of (H, D) vectors per head (opts a_l, a_r), slope 0.2. Graph attention
 * only: no GEMM, the two projections are the PROJ row and column terms, so their
 * gradients (into q, k, a_l, a_r) come from the drivers' term backward. */
#ifndef PN_EPI_PLAN /* the typed part: real, EPI(), PN_EPI_EPS (epi_impl.h, once per precision) */
PN_VEC PN_HIDDEN void EPI(gat_fwd)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const real *G,
        const real *q0, const real *q1, const real *k0, const real *k1, real *s) {
    const real slope = (real)p->v[PN_P_slope];
    for (int64_t i = 0; i < rows; i++) {
        const real qq = q0[i];
        real *o = s + i * ld;
        for (int64_t j = 0; j < n; j++) {
            real e = qq + k0[j];
            o[j] = e > 0 ? e : slope * e;
        }
    }
}

/* want: slope is learnable (its gradient Σ ds·min(e, 0) is then summed; else compiled out) */
PN_INLINE void EPI(gat_vjp_body)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld,
        const real *q0, const real *k0, const real *ds, real *dG, double *dq, real *dk0, double *dparam,
        const int want) {
    const real slope = (real)p->v[PN_P_slope];
    double sl_all = 0;
    for (int64_t i = 0; i < rows; i++) {
        const real qq = q0[i], *dsi = ds + i * ld;
        real *o = dG + i * ld;
        real sq = 0, sl = 0;
        #pragma omp simd reduction(+ : sq, sl)
        for (int64_t j = 0; j < n; j++) {
            real e = qq + k0[j];
            real f = e > 0 ? dsi[j] : slope * dsi[j];
            if (want) sl += e > 0 ? 0 : dsi[j] * e;
            o[j] = 0;
            sq += f;
            dk0[j] += f;
        }
        dq[2 * i] += sq;
        sl_all += sl;
    }
    if (want) dparam[PN_P_slope] += sl_all;
}

PN_VEC PN_HIDDEN void EPI(gat_vjp)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const real *G,
        const real *q0, const real *q1, const real *k0, const real *k1, const real *ds, real *dG,
        double *dq, real *dk0, real *dk1, double *dparam) {
    PN_BOOL_SWITCH(p->learn & PN_PBIT(PN_P_slope), want,
                   EPI(gat_vjp_body)(p, rows, n, ld, q0, k0, ds, dG, dq, dk0, dparam, want));
}

#else /* the plan (epi_impl.h, once, after both precisions) */

static const pn_score_plan gat_tmpl = {
    .gemm = PN_GEMM_NONE,
    .qterm = {PN_TERM_PROJ, PN_TERM_NONE},
    .kterm = {PN_TERM_PROJ, PN_TERM_NONE},
    .params = PN_PBIT(PN_P_slope),
    .fwd32 = pn_epi_gat_fwd_f32, .vjp32 = pn_epi_gat_vjp_f32,
    .fwd64 = pn_epi_gat_fwd_f64, .vjp64 = pn_epi_gat_vjp_f64};

pn_status pn_score_plan_gat(const char *op, const pn_attn_opts *o, pn_score_plan *p) {
    if (!o->a_l || !o->a_r)
        return pn_error(PN_ERR_ARG, "%s: score 'gat' needs a_l and a_r ((H, D) tensors)%s%s", op,
                        o->a_l ? "" : "; a_l is missing", o->a_r ? "" : "; a_r is missing");
    *p = gat_tmpl;
    return PN_OK;
}

#endif

/* sqdist.h — a spec-only score (PN_VF_TEST in variants.def): s = −τ‖q−k‖², τ > 0 (default 1).
 * It exists to prove the registry's promise: a score with a parameter of its own is this
 * header, one variants.def row (+ its PN_PARAM line) and one include line in epi_impl.h —
 * the drivers, the Lua options (tau = number | tensor), pn.attention_variants{all = true}
 * and the specs (values, f64 gradchecks, dense vs graph) pick it up.
 *
 * ‖q−k‖² = ‖q‖² + ‖k‖² − 2q·k (GEMM over all coordinates, NORM2 terms), a polynomial: no
 * clamp and no kink, so the gradients are exact everywhere. The per-pair functions are the
 * maths (PN_HD: a CUDA tile kernel can call them as they are); the block functions below only
 * loop over the pairs. */
#ifndef PN_EPI_PLAN /* the typed part: real, EPI(), PN_EPI_EPS (epi_impl.h, once per precision) */

/* s for one pair: G = q·k, n2q = ‖q‖², n2k = ‖k‖² */
PN_HD static inline real EPI(sqdist_pair)(real tau, real G, real n2q, real n2k) { return -tau * (n2q + n2k - 2 * G); }

/* the pair's vector-Jacobian product for ds = ∂L/∂s: returns ∂L/∂G; *dn2 = ∂L/∂‖q‖² = ∂L/∂‖k‖²,
 * *dtau = ∂L/∂τ */
PN_HD static inline real EPI(sqdist_pair_vjp)(real tau, real G, real n2q, real n2k, real ds, real *dn2, real *dtau) {
    *dn2 = -tau * ds;
    *dtau = -(n2q + n2k - 2 * G) * ds;
    return 2 * tau * ds;
}

PN_VEC PN_HIDDEN void EPI(sqdist_fwd)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const real *G,
        const real *q0, const real *q1, const real *k0, const real *k1, real *s) {
    const real tau = (real)p->v[PN_P_tau];
    for (int64_t i = 0; i < rows; i++) {
        const real *g = G + i * ld, qq = q0[i];
        real *o = s + i * ld;
        for (int64_t j = 0; j < n; j++) o[j] = EPI(sqdist_pair)(tau, g[j], qq, k0[j]);
    }
}

PN_VEC PN_HIDDEN void EPI(sqdist_vjp)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const real *G,
        const real *q0, const real *q1, const real *k0, const real *k1, const real *ds, real *dG,
        double *dq, real *dk0, real *dk1, double *dparam) {
    const real tau = (real)p->v[PN_P_tau];
    double st_all = 0;
    for (int64_t i = 0; i < rows; i++) {
        const real *g = G + i * ld, *dsi = ds + i * ld, qq = q0[i];
        real *o = dG + i * ld;
        real sq = 0, st = 0;
        #pragma omp simd reduction(+ : sq, st)
        for (int64_t j = 0; j < n; j++) {
            real dn2, dtau;
            o[j] = EPI(sqdist_pair_vjp)(tau, g[j], qq, k0[j], dsi[j], &dn2, &dtau);
            sq += dn2;
            dk0[j] += dn2;
            st += dtau;
        }
        dq[2 * i] += sq;
        st_all += st;
    }
    dparam[PN_P_tau] += st_all;
}

#else /* the plan (epi_impl.h, once, after both precisions) */

pn_status pn_score_plan_sqdist(const char *op, const pn_attn_opts *o, pn_score_plan *p) {
    (void)op, (void)o;
    *p = (pn_score_plan){.gemm = PN_GEMM_ALL,
                         .qterm = {PN_TERM_NORM2, PN_TERM_NONE},
                         .kterm = {PN_TERM_NORM2, PN_TERM_NONE},
                         .params = PN_PBIT(PN_P_tau),
                         .fwd32 = pn_epi_sqdist_fwd_f32, .vjp32 = pn_epi_sqdist_vjp_f32,
                         .fwd64 = pn_epi_sqdist_fwd_f64, .vjp64 = pn_epi_sqdist_vjp_f64};
    return PN_OK;
}

#endif

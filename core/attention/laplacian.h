/* laplacian.h — the Laplacian score (Coneheads §4.1): s = −γ‖q−k‖, γ = 1 by default.
 *
 * A distance score (plan.diff): G = −½‖q−k‖² over all coordinates, exact for close points
 * (attention.h). The norm has a kink at q = k: there (and below the smallest normal float)
 * the distance is 0 and its subgradient 0, so values and gradients stay finite. */
#ifndef PN_EPI_PLAN /* the typed part: real, EPI(), PN_EPI_EPS (epi_impl.h, once per precision) */

typedef struct { real gamma; } EPI(laplacian_h);
PN_HD static inline EPI(laplacian_h) EPI(laplacian_head)(const pn_score_params *p) {
    EPI(laplacian_h) h = {(real)p->v[PN_P_gamma]};
    return h;
}
PN_EPI_NO_KEY(laplacian)
PN_EPI_NO_ROW(laplacian)

/* s = −γΔ, Δ² = −2G */
PN_HD static inline EPI(spair) EPI(laplacian_pair)(const EPI(laplacian_h) *h, const EPI(x4) r, const EPI(x4) k, real G,
                                             real q0, real q1, real k0, real k1) {
    real d2 = -2 * G;
    real d = d2 * pn_rsqrt(d2); /* 0 at the kink (pn_rsqrt is 0 for 0 and subnormals) */
    EPI(spair) o = {-h->gamma * d, 0, 0};
    return o;
}

/* f = ds·∂s/∂(Δ²) = −γ·ds/(2Δ), so ∂L/∂G = −2f; ∂s/∂γ = −Δ */
PN_HD static inline EPI(dpair) EPI(laplacian_pair_vjp)(const EPI(laplacian_h) *h, const EPI(x4) r, const EPI(x4) k,
                                                 real G, real q0, real q1, real k0, real k1, real ds, real sv0,
                                                 real sv1, int keep, int want) {
    EPI(dpair) d = {0, 0, 0, 0, 0, 0, 0, 0};
    real d2 = -2 * G;
    real rd = ds != 0 ? pn_rsqrt(d2) : 0; /* 1/Δ, 0 at the kink */
    real f = -h->gamma * ds * (real)0.5 * rd;
    if (want) d.p0 = -d2 * rd * ds;
    d.g = -2 * f;
    return d;
}

PN_EPI_BLOCKS(laplacian, 0, 0, PN_P_gamma, -1, -1)

#else /* the plan (epi_impl.h, once, after both precisions) */

static const pn_score_plan laplacian_tmpl = {
    .gemm = PN_GEMM_ALL,
    .diff = 1,
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

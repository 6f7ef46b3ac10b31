/* dot.h — the dot-product score (Vaswani et al.): s = scale·q·k, scale 1/√D by default.
 * GEMM over all coordinates, no row or column terms. */
#ifndef PN_EPI_PLAN /* the typed part: real, EPI(), PN_EPI_EPS (epi_impl.h, once per precision) */

typedef struct { real sc; } EPI(dot_h);
PN_HD static inline EPI(dot_h) EPI(dot_head)(const pn_score_params *p) {
    EPI(dot_h) h = {(real)p->v[PN_P_scale]};
    return h;
}
PN_EPI_NO_KEY(dot)
PN_EPI_NO_ROW(dot)

/* s = scale·G */
PN_HD static inline EPI(spair) EPI(dot_pair)(const EPI(dot_h) *h, const EPI(x4) r, const EPI(x4) k, real G, real q0,
                                       real q1, real k0, real k1) {
    EPI(spair) o = {h->sc * G, 0, 0};
    return o;
}

/* ∂s/∂G = scale, ∂s/∂scale = G */
PN_HD static inline EPI(dpair) EPI(dot_pair_vjp)(const EPI(dot_h) *h, const EPI(x4) r, const EPI(x4) k, real G, real q0,
                                           real q1, real k0, real k1, real ds, real sv0, real sv1, int keep, int want) {
    EPI(dpair) d = {0, 0, 0, 0, 0, 0, 0, 0};
    if (want) d.p0 = ds * G;
    d.g = h->sc * ds;
    return d;
}

PN_EPI_BLOCKS(dot, 0, 0, PN_P_scale, -1, -1)

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

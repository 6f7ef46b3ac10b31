/* gat.h — the GAT score (Veličković et al.): s = LeakyReLU_slope(a_l·q_i + a_r·k_j), one
 * (a_l, a_r) pair of (H, D) vectors per head (opts a_l, a_r), slope 0.2. Graph attention
 * only: no GEMM, the two projections are the PROJ row and column terms, so their
 * gradients (into q, k, a_l, a_r) come from the drivers' term backward. */
#ifndef PN_EPI_PLAN /* the typed part: real, EPI(), PN_EPI_EPS (epi_impl.h, once per precision) */

typedef struct { real slope; } EPI(gat_h);
PN_HD static inline EPI(gat_h) EPI(gat_head)(const pn_score_params *p) {
    EPI(gat_h) h = {(real)p->v[PN_P_slope]};
    return h;
}
PN_EPI_NO_KEY(gat)
PN_EPI_NO_ROW(gat)

/* s = LeakyReLU(e), e = a_l·q + a_r·k (the PROJ terms q0, k0) */
PN_HD static inline EPI(spair) EPI(gat_pair)(const EPI(gat_h) *h, const EPI(x4) r, const EPI(x4) k, real G, real q0,
                                       real q1, real k0, real k1) {
    real e = q0 + k0;
    EPI(spair) o = {e > 0 ? e : h->slope * e, 0, 0};
    return o;
}

/* no GEMM (∂L/∂G = 0); both terms get ds·s'(e); ∂s/∂slope = min(e, 0) */
PN_HD static inline EPI(dpair) EPI(gat_pair_vjp)(const EPI(gat_h) *h, const EPI(x4) r, const EPI(x4) k, real G, real q0,
                                           real q1, real k0, real k1, real ds, real sv0, real sv1, int keep, int want) {
    EPI(dpair) d = {0, 0, 0, 0, 0, 0, 0, 0};
    real e = q0 + k0;
    real f = e > 0 ? ds : h->slope * ds;
    d.q0 = f;
    d.k0 = f;
    if (want) d.p0 = e > 0 ? 0 : ds * e;
    d.g = 0;
    return d;
}

PN_EPI_BLOCKS(gat, PN_T_Q0 | PN_T_K0, 0, PN_P_slope, -1, -1)

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

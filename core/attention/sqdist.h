/* sqdist.h — a spec-only score (PN_VF_TEST in variants.def): s = −τ‖q−k‖², τ > 0 (default 1).
 * It exists to prove the registry's promise: a score with a parameter of its own is this
 * header, one variants.def row (+ its PN_PARAM line) and one include line in epi_impl.h —
 * the drivers, the Lua options (tau = number | tensor), pn.attention_variants{all = true}
 * and the specs (values, f64 gradchecks, dense vs graph) pick it up.
 *
 * A distance score (plan.diff): the drivers hand it G = −½‖q−k‖² (attention.h), so s = 2τG,
 * a polynomial: no clamp and no kink, the gradients are exact everywhere. The per-pair functions are the
 * maths (PN_HD: a CUDA tile kernel can call them as they are); PN_EPI_BLOCKS instantiates
 * the CPU block loop (block.h) over them. */
#ifndef PN_EPI_PLAN /* the typed part: real, EPI(), PN_EPI_EPS (epi_impl.h, once per precision) */

typedef struct { real tau; } EPI(sqdist_h);
PN_HD static inline EPI(sqdist_h) EPI(sqdist_head)(const pn_score_params *p) {
    EPI(sqdist_h) h = {(real)p->v[PN_P_tau]};
    return h;
}
PN_EPI_NO_KEY(sqdist)
PN_EPI_NO_ROW(sqdist)

/* s = −τ‖q−k‖² = 2τG (a distance score: G = −½‖q−k‖²) */
PN_HD static inline EPI(spair) EPI(sqdist_pair)(const EPI(sqdist_h) *h, const EPI(x4) r, const EPI(x4) k, real G,
                                          real q0, real q1, real k0, real k1) {
    EPI(spair) o = {2 * h->tau * G, 0, 0};
    return o;
}

/* ∂s/∂G = 2τ, ∂s/∂τ = −‖q−k‖² = 2G */
PN_HD static inline EPI(dpair) EPI(sqdist_pair_vjp)(const EPI(sqdist_h) *h, const EPI(x4) r, const EPI(x4) k, real G,
                                              real q0, real q1, real k0, real k1, real ds, real sv0, real sv1,
                                              int keep, int want) {
    EPI(dpair) d = {0, 0, 0, 0, 0, 0, 0, 0};
    if (want) d.p0 = 2 * G * ds;
    d.g = 2 * h->tau * ds;
    return d;
}

PN_EPI_BLOCKS(sqdist, 0, 0, PN_P_tau, -1, -1)

#else /* the plan (epi_impl.h, once, after both precisions) */

pn_status pn_score_plan_sqdist(const char *op, const pn_attn_opts *o, pn_score_plan *p) {
    (void)op, (void)o;
    *p = (pn_score_plan){.gemm = PN_GEMM_ALL,
                         .diff = 1,
                         .qterm = {PN_TERM_NORM2, PN_TERM_NONE},
                         .kterm = {PN_TERM_NORM2, PN_TERM_NONE},
                         .params = PN_PBIT(PN_P_tau),
                         .fwd32 = pn_epi_sqdist_fwd_f32, .vjp32 = pn_epi_sqdist_vjp_f32,
                         .fwd64 = pn_epi_sqdist_fwd_f64, .vjp64 = pn_epi_sqdist_vjp_f64};
    return PN_OK;
}

#endif

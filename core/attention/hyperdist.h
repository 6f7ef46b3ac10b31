/* hyperdist.h — the hyperbolic-distance score (Gulcehre et al., Eq. 2): s = −β·d_H(q, k) − c,
 * β 1, c 0, in one of three models (opts.model):
 *
 *   hyperboloid  d = arcosh(−⟨q,k⟩_M), ⟨q,k⟩_M = q₋·k₋ − q_d·k_d, the time-like coordinate
 *                LAST (as pn_map_pseudopolar writes it). GEMM over q₋·k₋, terms q_d, k_d.
 *                Points must be on the upper sheet (q_d > 0).
 *   halfspace    d = arcosh(1 + ‖q−k‖²/(2 q_d k_d)) (Coneheads App. 7.1), heights q_d > 0.
 *                GEMM over q₋·k₋, terms ‖x₋‖², x_d.
 *   poincare     d = (1/√κ)·arcosh(1 + 2κ‖q−k‖²/((1−κ‖q‖²)(1−κ‖k‖²))), κ = curvature (1),
 *                points inside the ball κ‖x‖² < 1. GEMM over all, terms ‖x‖².
 *
 * Clamps: the arcosh argument X is clamped to ≥ 1 for the value (rounding can push it below
 * on or near the diagonal). The distance has a kink at q = k where 1/√(X²−1) blows up, so its
 * derivative is taken as 0 (a subgradient) while X − 1 is within the rounding noise of the
 * terms that produced it (PN_EPI_EPS = 1e-6 in f32, 1e-14 in f64, relative to their size:
 * q_d·k_d + |q₋·k₋| on the hyperboloid, (‖q₋‖²+‖k₋‖²)/(2q_d k_d) in the half-space,
 * 2κ(‖q‖²+‖k‖²)/((1−κ‖q‖²)(1−κ‖k‖²)) in the ball) — as the Laplacian's norm does. ‖q−k‖² from
 * the GEMM expansion is clamped at 0 (gradient 0 there). */
#ifndef PN_EPI_PLAN /* the typed part: real, EPI(), PN_EPI_EPS (epi_impl.h, once per precision) */

/* d arcosh(X)/dX, or 0 (the subgradient at the kink q = k) while X − 1 is within the rounding
 * noise PN_EPI_EPS·S of the terms that produced it (S: their magnitude). */
PN_HD static inline real EPI(dacosh)(real X, real S) {
    real t = X - 1;
    int live = t > PN_EPI_EPS * S;
    real tt = live ? t : 1;
    return live ? pn_rsqrt(tt * (X + 1)) : 0;
}

/* all three models: β, c (and κ, 1/√κ for the ball) */
typedef struct { real beta, c, kap, isk; } EPI(hyp_h);
PN_HD static inline EPI(hyp_h) EPI(hyp_head)(const pn_score_params *p) {
    EPI(hyp_h) h = {(real)p->v[PN_P_beta], (real)p->v[PN_P_c], (real)p->v[PN_P_curvature], (real)p->aux[0]};
    return h;
}

/* ---- hyperboloid: X = −⟨q,k⟩_M = q_d k_d − q₋·k₋ (terms q_d, k_d) -------------------------- */
typedef EPI(hyp_h) EPI(hyperboloid_h);
PN_HD static inline EPI(hyperboloid_h) EPI(hyperboloid_head)(const pn_score_params *p) { return EPI(hyp_head)(p); }
PN_EPI_NO_KEY(hyperboloid)
PN_EPI_NO_ROW(hyperboloid)

PN_HD static inline EPI(spair) EPI(hyperboloid_pair)(const EPI(hyp_h) *h, const EPI(x4) r, const EPI(x4) k, real G,
                                                     real q0, real q1, real k0, real k1) {
    real X = q1 * k1 - G;
    EPI(spair) o = {-h->beta * pn_acosh(X) - h->c, 0, 0};
    return o;
}

PN_HD static inline EPI(dpair) EPI(hyperboloid_pair_vjp)(const EPI(hyp_h) *h, const EPI(x4) r, const EPI(x4) k, real G,
                                                   real q0, real q1, real k0, real k1, real ds, real sv0, real sv1,
                                                   int keep, int want) {
    EPI(dpair) d = {0, 0, 0, 0, 0, 0, 0, 0};
    real g = ds;
    real qk = q1 * k1;
    real X = qk - G;
    real S = (qk > 0 ? qk : -qk) + (G > 0 ? G : -G);
    real gX = g != 0 ? -h->beta * g * EPI(dacosh)(X, S) : 0; /* ∂L/∂X */
    d.q1 = gX * k1;
    d.k1 = gX * q1;
    if (want) {
        d.p0 = g != 0 ? -pn_acosh(X) * g : 0;
        d.p1 = -g;
    }
    d.g = -gX;
    return d;
}

PN_EPI_BLOCKS(hyperboloid, PN_T_Q1 | PN_T_K1, 0, PN_P_beta, PN_P_c, -1)

/* ---- half-space: X = 1 + (‖q₋−k₋‖² + (q_d−k_d)²)/(2 q_d k_d) (terms ‖x₋‖², x_d) ----------- */
typedef EPI(hyp_h) EPI(halfspace_h);
PN_HD static inline EPI(halfspace_h) EPI(halfspace_head)(const pn_score_params *p) { return EPI(hyp_head)(p); }
/* {1/k_d} */
PN_HD static inline EPI(x4) EPI(halfspace_key)(const EPI(hyp_h) *h, real k0, real k1) {
    EPI(x4) x = {1 / k1, 0, 0, 0};
    return x;
}
/* {1/(2q_d), 1/q_d} */
PN_HD static inline EPI(x4) EPI(halfspace_row)(const EPI(hyp_h) *h, real q0, real q1) {
    EPI(x4) x = {(real)0.5 / q1, 1 / q1, 0, 0};
    return x;
}

PN_HD static inline EPI(spair) EPI(halfspace_pair)(const EPI(hyp_h) *h, const EPI(x4) r, const EPI(x4) k, real G,
                                             real q0, real q1, real k0, real k1) {
    real d2 = q0 + k0 - 2 * G;
    d2 = d2 > 0 ? d2 : 0;
    real dh = q1 - k1;
    real X = 1 + (d2 + dh * dh) * r.a * k.a;
    EPI(spair) o = {-h->beta * pn_acosh(X) - h->c, 0, 0};
    return o;
}

PN_HD static inline EPI(dpair) EPI(halfspace_pair_vjp)(const EPI(hyp_h) *h, const EPI(x4) r, const EPI(x4) k, real G,
                                                 real q0, real q1, real k0, real k1, real ds, real sv0, real sv1,
                                                 int keep, int want) {
    EPI(dpair) d = {0, 0, 0, 0, 0, 0, 0, 0};
    const real iq = r.b, ik = k.a;
    real g = ds;
    real d2 = q0 + k0 - 2 * G;
    int pos = d2 > 0;
    d2 = pos ? d2 : 0;
    real dh = q1 - k1;
    real den = (real)0.5 * iq * ik; /* 1/(2 q_d k_d) */
    real Xm1 = (d2 + dh * dh) * den;
    real X = 1 + Xm1;
    real gX = g != 0 ? -h->beta * g * EPI(dacosh)(X, (q0 + k0) * den) : 0;
    real f = pos ? gX * den : 0; /* ∂L/∂(‖q₋−k₋‖²) */
    d.q0 = f;
    d.k0 = f;
    real cross = dh * iq * ik; /* (q_d − k_d)/(q_d k_d) */
    d.q1 = gX * (cross - Xm1 * iq);
    d.k1 = gX * (-cross - Xm1 * ik);
    if (want) {
        d.p0 = g != 0 ? -pn_acosh(X) * g : 0;
        d.p1 = -g;
    }
    d.g = -2 * f;
    return d;
}

PN_EPI_BLOCKS(halfspace, PN_T_Q0 | PN_T_Q1 | PN_T_K0 | PN_T_K1, 1, PN_P_beta, PN_P_c, -1)

/* ---- Poincaré ball: X = 1 + 2κ‖q−k‖²/((1−κ‖q‖²)(1−κ‖k‖²)), d = arcosh(X)/√κ (terms ‖x‖²) --- */
typedef EPI(hyp_h) EPI(poincare_h);
PN_HD static inline EPI(poincare_h) EPI(poincare_head)(const pn_score_params *p) { return EPI(hyp_head)(p); }
/* {1/(1 − κ‖k‖²)} */
PN_HD static inline EPI(x4) EPI(poincare_key)(const EPI(hyp_h) *h, real k0, real k1) {
    EPI(x4) x = {1 / (1 - h->kap * k0), 0, 0, 0};
    return x;
}
/* {2κ/(1 − κ‖q‖²), 1/(1 − κ‖q‖²)} */
PN_HD static inline EPI(x4) EPI(poincare_row)(const EPI(hyp_h) *h, real q0, real q1) {
    EPI(x4) x = {2 * h->kap / (1 - h->kap * q0), 1 / (1 - h->kap * q0), 0, 0};
    return x;
}

PN_HD static inline EPI(spair) EPI(poincare_pair)(const EPI(hyp_h) *h, const EPI(x4) r, const EPI(x4) k, real G,
                                            real q0, real q1, real k0, real k1) {
    real d2 = q0 + k0 - 2 * G;
    d2 = d2 > 0 ? d2 : 0;
    real X = 1 + r.a * d2 * k.a;
    EPI(spair) o = {-h->beta * h->isk * pn_acosh(X) - h->c, 0, 0};
    return o;
}

PN_HD static inline EPI(dpair) EPI(poincare_pair_vjp)(const EPI(hyp_h) *h, const EPI(x4) r, const EPI(x4) k, real G,
                                                real q0, real q1, real k0, real k1, real ds, real sv0, real sv1,
                                                int keep, int want) {
    EPI(dpair) d = {0, 0, 0, 0, 0, 0, 0, 0};
    const real kap = h->kap, isk = h->isk, beta = h->beta, iu = r.b, iw = k.a;
    real g = ds;
    real d2 = q0 + k0 - 2 * G;
    int pos = d2 > 0;
    d2 = pos ? d2 : 0;
    real iuw = iu * iw;
    real Xm1 = 2 * kap * d2 * iuw;
    real X = 1 + Xm1;
    real gX = g != 0 ? -beta * g * isk * EPI(dacosh)(X, 2 * kap * (q0 + k0) * iuw) : 0; /* ∂L/∂X */
    real f = pos ? gX * 2 * kap * iuw : 0; /* through ‖q−k‖² */
    d.q0 = f + gX * Xm1 * kap * iu;
    d.k0 = f + gX * Xm1 * kap * iw;
    if (want) {
        real dist = isk * pn_acosh(X);
        /* ∂X/∂κ = (X−1)(1/κ + ‖q‖²/u + ‖k‖²/w); ∂d/∂κ = −arcosh(X)/(2κ^(3/2)) + … */
        real gk = gX * Xm1 * (1 / kap + q0 * iu + k0 * iw);
        d.p0 = g != 0 ? -dist * g : 0;
        d.p1 = -g;
        d.p2 = g != 0 ? gk + beta * g * dist / (2 * kap) : 0;
    }
    d.g = -2 * f;
    return d;
}

PN_EPI_BLOCKS(poincare, PN_T_Q0 | PN_T_K0, 1, PN_P_beta, PN_P_c, PN_P_curvature)

#else /* the plan (epi_impl.h, once, after both precisions) */

/* aux[0] = 1/√κ (Poincaré) */
static void poincare_prepare(pn_score_params *p) { p->aux[0] = 1.0 / sqrt(p->v[PN_P_curvature]); }

static const pn_score_plan hyperboloid_tmpl = {
    .note = " (hyperboloid)",
    .gemm = PN_GEMM_HEAD,
    .qterm = {PN_TERM_NONE, PN_TERM_LAST},
    .kterm = {PN_TERM_NONE, PN_TERM_LAST},
    .req = PN_REQ_LAST_POS,
    .params = PN_PBIT(PN_P_beta) | PN_PBIT(PN_P_c),
    .fwd32 = pn_epi_hyperboloid_fwd_f32, .vjp32 = pn_epi_hyperboloid_vjp_f32,
    .fwd64 = pn_epi_hyperboloid_fwd_f64, .vjp64 = pn_epi_hyperboloid_vjp_f64};
static const pn_score_plan halfspace_tmpl = {
    .note = " (halfspace)",
    .gemm = PN_GEMM_HEAD,
    .qterm = {PN_TERM_NORM2, PN_TERM_LAST},
    .kterm = {PN_TERM_NORM2, PN_TERM_LAST},
    .req = PN_REQ_LAST_POS,
    .params = PN_PBIT(PN_P_beta) | PN_PBIT(PN_P_c),
    .fwd32 = pn_epi_halfspace_fwd_f32, .vjp32 = pn_epi_halfspace_vjp_f32,
    .fwd64 = pn_epi_halfspace_fwd_f64, .vjp64 = pn_epi_halfspace_vjp_f64};
static const pn_score_plan poincare_tmpl = {
    .note = " (poincare)",
    .gemm = PN_GEMM_ALL,
    .qterm = {PN_TERM_NORM2, PN_TERM_NONE},
    .kterm = {PN_TERM_NORM2, PN_TERM_NONE},
    .req = PN_REQ_BALL,
    .params = PN_PBIT(PN_P_beta) | PN_PBIT(PN_P_c) | PN_PBIT(PN_P_curvature),
    .prepare = poincare_prepare,
    .fwd32 = pn_epi_poincare_fwd_f32, .vjp32 = pn_epi_poincare_vjp_f32,
    .fwd64 = pn_epi_poincare_fwd_f64, .vjp64 = pn_epi_poincare_vjp_f64};

pn_status pn_score_plan_hyperbolic(const char *op, const pn_attn_opts *o, pn_score_plan *p) {
    switch (o->model) {
    case PN_MODEL_HYPERBOLOID:
        *p = hyperboloid_tmpl;
        return PN_OK;
    case PN_MODEL_HALFSPACE:
        *p = halfspace_tmpl;
        return PN_OK;
    case PN_MODEL_POINCARE:
        *p = poincare_tmpl;
        return PN_OK;
    default:
        return pn_error(PN_ERR_ARG, "%s: unknown model code %d for score 'hyperbolic' (valid: hyperboloid, "
                        "halfspace, poincare)", op, o->model);
    }
}

#endif

/* hyperdist.h — the hyperbolic-distance score (Gulcehre et al., Eq. 2): s = −β·d_H(q, k) − c,
 * β 1, c 0, in one of three models (opts.model):
 *
 *   hyperboloid  d = arcosh(−⟨q,k⟩_M), ⟨q,k⟩_M = q₋·k₋ − q_d·k_d, the time-like coordinate
 *                LAST (as pn_map_pseudopolar writes it). Points must be on the upper sheet
 *                (q_d > 0); on the hyperboloid (⟨x,x⟩_M = −1) −⟨q,k⟩_M = 1 − ½⟨q−k,q−k⟩_M,
 *                and that difference form is what is computed: X − 1 = ½(‖q₋−k₋‖² − (q_d−k_d)²)
 *                (off the hyperboloid the two differ by the points' own ⟨x,x⟩_M + 1).
 *   halfspace    d = arcosh(1 + ‖q−k‖²/(2 q_d k_d)) (Coneheads App. 7.1), heights q_d > 0.
 *   poincare     d = (1/√κ)·arcosh(1 + 2κ‖q−k‖²/((1−κ‖q‖²)(1−κ‖k‖²))), κ = curvature (1),
 *                points inside the ball κ‖x‖² < 1.
 *
 * All three are distance scores (plan.diff): G = −½‖q_g − k_g‖² over the GEMM coordinates
 * (all but the last for the hyperboloid and the half-space, all for the ball), exact for close
 * points (attention.h), with terms ‖x_g‖² and x_d. So t = X − 1 keeps its relative precision
 * however close the points are, and d = arcosh(1 + t) is evaluated from t (pn_acosh1p) —
 * the distance and its gradient 1/√(t(t + 2)) stay accurate down to t ≈ 0. At t = 0 (q = k,
 * the kink; or t < 0 off the manifold) the distance is 0 with subgradient 0. */
#ifndef PN_EPI_PLAN /* the typed part: real, EPI(), PN_EPI_EPS (epi_impl.h, once per precision) */

/* d arcosh(1 + t)/dt = 1/√(t(t + 2)), or 0 at the kink t <= 0 (and below the smallest normal) */
PN_HD static inline real EPI(dacosh1p)(real t) { return pn_rsqrt(t * (t + 2)); }

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

/* t = X − 1 = −G − ½(q_d − k_d)² */
PN_HD static inline EPI(spair) EPI(hyperboloid_pair)(const EPI(hyp_h) *h, const EPI(x4) r, const EPI(x4) k, real G,
                                                     real q0, real q1, real k0, real k1) {
    real dh = q1 - k1;
    real t = -G - (real)0.5 * dh * dh;
    EPI(spair) o = {-h->beta * pn_acosh1p(t) - h->c, 0, 0};
    return o;
}

PN_HD static inline EPI(dpair) EPI(hyperboloid_pair_vjp)(const EPI(hyp_h) *h, const EPI(x4) r, const EPI(x4) k, real G,
                                                   real q0, real q1, real k0, real k1, real ds, real sv0, real sv1,
                                                   int keep, int want) {
    EPI(dpair) d = {0, 0, 0, 0, 0, 0, 0, 0};
    real g = ds;
    real dh = q1 - k1;
    real t = -G - (real)0.5 * dh * dh;
    real gt = g != 0 ? -h->beta * g * EPI(dacosh1p)(t) : 0; /* ∂L/∂t */
    d.q1 = -gt * dh;
    d.k1 = gt * dh;
    if (want) {
        d.p0 = g != 0 ? -pn_acosh1p(t) * g : 0;
        d.p1 = -g;
    }
    d.g = -gt;
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

/* t = X − 1 = (‖q₋−k₋‖² + (q_d−k_d)²)/(2 q_d k_d), ‖q₋−k₋‖² = −2G */
PN_HD static inline EPI(spair) EPI(halfspace_pair)(const EPI(hyp_h) *h, const EPI(x4) r, const EPI(x4) k, real G,
                                             real q0, real q1, real k0, real k1) {
    real d2 = -2 * G;
    d2 = d2 > 0 ? d2 : 0;
    real dh = q1 - k1;
    real t = (d2 + dh * dh) * r.a * k.a;
    EPI(spair) o = {-h->beta * pn_acosh1p(t) - h->c, 0, 0};
    return o;
}

PN_HD static inline EPI(dpair) EPI(halfspace_pair_vjp)(const EPI(hyp_h) *h, const EPI(x4) r, const EPI(x4) k, real G,
                                                 real q0, real q1, real k0, real k1, real ds, real sv0, real sv1,
                                                 int keep, int want) {
    EPI(dpair) d = {0, 0, 0, 0, 0, 0, 0, 0};
    const real iq = r.b, ik = k.a;
    real g = ds;
    real d2 = -2 * G;
    int pos = d2 > 0;
    d2 = pos ? d2 : 0;
    real dh = q1 - k1;
    real den = (real)0.5 * iq * ik; /* 1/(2 q_d k_d) */
    real t = (d2 + dh * dh) * den;
    real gt = g != 0 ? -h->beta * g * EPI(dacosh1p)(t) : 0; /* ∂L/∂t */
    real f = pos ? gt * den : 0; /* ∂L/∂(‖q₋−k₋‖²) */
    real cross = dh * iq * ik; /* (q_d − k_d)/(q_d k_d) */
    d.q1 = gt * (cross - t * iq);
    d.k1 = gt * (-cross - t * ik);
    if (want) {
        d.p0 = g != 0 ? -pn_acosh1p(t) * g : 0;
        d.p1 = -g;
    }
    d.g = -2 * f;
    return d;
}

PN_EPI_BLOCKS(halfspace, PN_T_Q1 | PN_T_K1, 1, PN_P_beta, PN_P_c, -1)

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

/* t = X − 1 = 2κ‖q−k‖²/(u w), ‖q−k‖² = −2G, u = 1 − κ‖q‖², w = 1 − κ‖k‖² */
PN_HD static inline EPI(spair) EPI(poincare_pair)(const EPI(hyp_h) *h, const EPI(x4) r, const EPI(x4) k, real G,
                                            real q0, real q1, real k0, real k1) {
    real d2 = -2 * G;
    d2 = d2 > 0 ? d2 : 0;
    real t = r.a * d2 * k.a;
    EPI(spair) o = {-h->beta * h->isk * pn_acosh1p(t) - h->c, 0, 0};
    return o;
}

/* d.q0, d.k0: through u and w only (the drivers carry ∂G/∂q) */
PN_HD static inline EPI(dpair) EPI(poincare_pair_vjp)(const EPI(hyp_h) *h, const EPI(x4) r, const EPI(x4) k, real G,
                                                real q0, real q1, real k0, real k1, real ds, real sv0, real sv1,
                                                int keep, int want) {
    EPI(dpair) d = {0, 0, 0, 0, 0, 0, 0, 0};
    const real kap = h->kap, isk = h->isk, beta = h->beta, iu = r.b, iw = k.a;
    real g = ds;
    real d2 = -2 * G;
    int pos = d2 > 0;
    d2 = pos ? d2 : 0;
    real iuw = iu * iw;
    real t = 2 * kap * d2 * iuw;
    real gt = g != 0 ? -beta * g * isk * EPI(dacosh1p)(t) : 0; /* ∂L/∂t */
    real f = pos ? gt * 2 * kap * iuw : 0; /* through ‖q−k‖² */
    d.q0 = gt * t * kap * iu;
    d.k0 = gt * t * kap * iw;
    if (want) {
        real dist = isk * pn_acosh1p(t);
        /* ∂t/∂κ = t(1/κ + ‖q‖²/u + ‖k‖²/w); ∂d/∂κ = −arcosh(1 + t)/(2κ^(3/2)) + … */
        real gk = gt * t * (1 / kap + q0 * iu + k0 * iw);
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
    .diff = 1,
    .qterm = {PN_TERM_NORM2, PN_TERM_LAST},
    .kterm = {PN_TERM_NORM2, PN_TERM_LAST},
    .req = PN_REQ_LAST_POS,
    .params = PN_PBIT(PN_P_beta) | PN_PBIT(PN_P_c),
    .fwd32 = pn_epi_hyperboloid_fwd_f32, .vjp32 = pn_epi_hyperboloid_vjp_f32,
    .fwd64 = pn_epi_hyperboloid_fwd_f64, .vjp64 = pn_epi_hyperboloid_vjp_f64};
static const pn_score_plan halfspace_tmpl = {
    .note = " (halfspace)",
    .gemm = PN_GEMM_HEAD,
    .diff = 1,
    .qterm = {PN_TERM_NORM2, PN_TERM_LAST},
    .kterm = {PN_TERM_NORM2, PN_TERM_LAST},
    .req = PN_REQ_LAST_POS,
    .params = PN_PBIT(PN_P_beta) | PN_PBIT(PN_P_c),
    .fwd32 = pn_epi_halfspace_fwd_f32, .vjp32 = pn_epi_halfspace_vjp_f32,
    .fwd64 = pn_epi_halfspace_fwd_f64, .vjp64 = pn_epi_halfspace_vjp_f64};
static const pn_score_plan poincare_tmpl = {
    .note = " (poincare)",
    .gemm = PN_GEMM_ALL,
    .diff = 1,
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

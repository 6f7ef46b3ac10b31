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
PN_INLINE real EPI(dacosh)(real X, real S) {
    real t = X - 1;
    int live = t > PN_EPI_EPS * S;
    real tt = live ? t : 1;
    return live ? pn_rsqrt(tt * (X + 1)) : 0;
}

/* ---- hyperboloid ------------------------------------------------------------------------- */
PN_VEC PN_HIDDEN void EPI(hyperboloid_fwd)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const real *G,
        const real *q0, const real *q1, const real *k0, const real *k1, real *s) {
    const real beta = (real)p->v[PN_P_beta], c = (real)p->v[PN_P_c];
    for (int64_t i = 0; i < rows; i++) {
        const real *g = G + i * ld, qh = q1[i];
        real *o = s + i * ld;
        for (int64_t j = 0; j < n; j++) {
            real X = qh * k1[j] - g[j]; /* −⟨q,k⟩_M */
            o[j] = -beta * pn_acosh(X) - c;
        }
    }
}

PN_INLINE void EPI(hyperboloid_vjp_body)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const real *G,
        const real *q0, const real *q1, const real *k0, const real *k1, const real *ds, real *dG,
        double *dq, real *dk0, real *dk1, double *dparam, const int want) {
    const real beta = (real)p->v[PN_P_beta];
    double sb_all = 0, sc_all = 0;
    for (int64_t i = 0; i < rows; i++) {
        const real *gg = G + i * ld, *dsi = ds + i * ld, qh = q1[i];
        real *o = dG + i * ld;
        real sq1 = 0, sb = 0, sc = 0;
        #pragma omp simd reduction(+ : sq1, sb, sc)
        for (int64_t j = 0; j < n; j++) {
            real g = dsi[j];
            real qk = qh * k1[j];
            real X = qk - gg[j];
            real d = pn_acosh(X);
            real S = (qk > 0 ? qk : -qk) + (gg[j] > 0 ? gg[j] : -gg[j]);
            real gX = g != 0 ? -beta * g * EPI(dacosh)(X, S) : 0; /* ∂L/∂X */
            o[j] = -gX;
            sq1 += gX * k1[j];
            dk1[j] += gX * qh;
            if (want) {
                sb += g != 0 ? -d * g : 0;
                sc += -g;
            }
        }
        dq[2 * i + 1] += sq1;
        sb_all += sb;
        sc_all += sc;
    }
    if (want) {
        dparam[PN_P_beta] += sb_all;
        dparam[PN_P_c] += sc_all;
    }
}

/* want: the learnable parameters need their gradients (else their maths is compiled out) */
PN_VEC PN_HIDDEN void EPI(hyperboloid_vjp)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const real *G,
        const real *q0, const real *q1, const real *k0, const real *k1, const real *ds, real *dG,
        double *dq, real *dk0, real *dk1, double *dparam) {
    PN_BOOL_SWITCH(p->learn & (PN_PBIT(PN_P_beta) | PN_PBIT(PN_P_c)), want,
                   EPI(hyperboloid_vjp_body)(p, rows, n, ld, G, q0, q1, k0, k1, ds, dG, dq, dk0, dk1, dparam, want));
}

/* ---- half-space ---------------------------------------------------------------------------- */
/* per key, once per block: 1/k_d */
PN_INLINE void EPI(recip)(int64_t n, const real *x, real *out) {
    for (int64_t j = 0; j < n; j++) out[j] = 1 / x[j];
}

PN_VEC PN_HIDDEN void EPI(halfspace_fwd)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const real *G,
        const real *q0, const real *q1, const real *k0, const real *k1, real *s) {
    const real beta = (real)p->v[PN_P_beta], c = (real)p->v[PN_P_c];
    real ik[PN_EPI_CHUNK];
    for (int64_t j0 = 0; j0 < n; j0 += PN_EPI_CHUNK) {
        const int64_t nb = n - j0 < PN_EPI_CHUNK ? n - j0 : PN_EPI_CHUNK;
        const real *kk0 = k0 + j0, *kk1 = k1 + j0;
        EPI(recip)(nb, kk1, ik);
        for (int64_t i = 0; i < rows; i++) {
            const real *g = G + i * ld + j0, qq = q0[i], qh = q1[i], hq = (real)0.5 / qh;
            real *o = s + i * ld + j0;
            for (int64_t j = 0; j < nb; j++) {
                real d2 = qq + kk0[j] - 2 * g[j];
                d2 = d2 > 0 ? d2 : 0;
                real dh = qh - kk1[j];
                real X = 1 + (d2 + dh * dh) * hq * ik[j];
                o[j] = -beta * pn_acosh(X) - c;
            }
        }
    }
}

PN_INLINE void EPI(halfspace_vjp_body)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const real *G,
        const real *q0, const real *q1, const real *k0, const real *k1, const real *ds, real *dG,
        double *dq, real *dk0, real *dk1, double *dparam, const int want) {
    const real beta = (real)p->v[PN_P_beta];
    real ik[PN_EPI_CHUNK];
    double sb_all = 0, sc_all = 0;
    for (int64_t j0 = 0; j0 < n; j0 += PN_EPI_CHUNK) {
        const int64_t nb = n - j0 < PN_EPI_CHUNK ? n - j0 : PN_EPI_CHUNK;
        const real *kk0 = k0 + j0, *kk1 = k1 + j0;
        real *dkk0 = dk0 + j0, *dkk1 = dk1 + j0;
        EPI(recip)(nb, kk1, ik);
        for (int64_t i = 0; i < rows; i++) {
            const real *gg = G + i * ld + j0, *dsi = ds + i * ld + j0, qq = q0[i], qh = q1[i];
            const real iq = 1 / qh;
            real *o = dG + i * ld + j0;
            real sq0 = 0, sq1 = 0, sb = 0, sc = 0;
            #pragma omp simd reduction(+ : sq0, sq1, sb, sc)
            for (int64_t j = 0; j < nb; j++) {
                real g = dsi[j];
                real kh = kk1[j];
                real d2 = qq + kk0[j] - 2 * gg[j];
                int pos = d2 > 0;
                d2 = pos ? d2 : 0;
                real dh = qh - kh;
                real den = (real)0.5 * iq * ik[j]; /* 1/(2 q_d k_d) */
                real Xm1 = (d2 + dh * dh) * den;
                real X = 1 + Xm1;
                real d = pn_acosh(X);
                real gX = g != 0 ? -beta * g * EPI(dacosh)(X, (qq + kk0[j]) * den) : 0;
                real f = pos ? gX * den : 0; /* ∂L/∂(‖q₋−k₋‖²) */
                o[j] = -2 * f;
                sq0 += f;
                dkk0[j] += f;
                real cross = dh * iq * ik[j]; /* (q_d − k_d)/(q_d k_d) */
                sq1 += gX * (cross - Xm1 * iq);
                dkk1[j] += gX * (-cross - Xm1 * ik[j]);
                if (want) {
                    sb += g != 0 ? -d * g : 0;
                    sc += -g;
                }
            }
            dq[2 * i] += sq0;
            dq[2 * i + 1] += sq1;
            sb_all += sb;
            sc_all += sc;
        }
    }
    if (want) {
        dparam[PN_P_beta] += sb_all;
        dparam[PN_P_c] += sc_all;
    }
}

/* want: the learnable parameters need their gradients (else their maths is compiled out) */
PN_VEC PN_HIDDEN void EPI(halfspace_vjp)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const real *G,
        const real *q0, const real *q1, const real *k0, const real *k1, const real *ds, real *dG,
        double *dq, real *dk0, real *dk1, double *dparam) {
    PN_BOOL_SWITCH(p->learn & (PN_PBIT(PN_P_beta) | PN_PBIT(PN_P_c)), want,
                   EPI(halfspace_vjp_body)(p, rows, n, ld, G, q0, q1, k0, k1, ds, dG, dq, dk0, dk1, dparam, want));
}

/* ---- Poincaré ball ------------------------------------------------------------------------- */
/* per key, once per block: 1/(1 − κ‖k‖²) */
PN_INLINE void EPI(ball_keys)(int64_t n, const real *k0, real kap, real *iw) {
    for (int64_t j = 0; j < n; j++) iw[j] = 1 / (1 - kap * k0[j]);
}

PN_VEC PN_HIDDEN void EPI(poincare_fwd)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const real *G,
        const real *q0, const real *q1, const real *k0, const real *k1, real *s) {
    const real beta = (real)p->v[PN_P_beta], c = (real)p->v[PN_P_c], kap = (real)p->v[PN_P_curvature], isk = (real)p->aux[0];
    real iw[PN_EPI_CHUNK];
    for (int64_t j0 = 0; j0 < n; j0 += PN_EPI_CHUNK) {
        const int64_t nb = n - j0 < PN_EPI_CHUNK ? n - j0 : PN_EPI_CHUNK;
        const real *kk0 = k0 + j0;
        EPI(ball_keys)(nb, kk0, kap, iw);
        for (int64_t i = 0; i < rows; i++) {
            const real *g = G + i * ld + j0, qq = q0[i];
            const real c2 = 2 * kap / (1 - kap * qq);
            real *o = s + i * ld + j0;
            for (int64_t j = 0; j < nb; j++) {
                real d2 = qq + kk0[j] - 2 * g[j];
                d2 = d2 > 0 ? d2 : 0;
                real X = 1 + c2 * d2 * iw[j];
                o[j] = -beta * isk * pn_acosh(X) - c;
            }
        }
    }
}

PN_INLINE void EPI(poincare_vjp_body)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const real *G,
        const real *q0, const real *q1, const real *k0, const real *k1, const real *ds, real *dG,
        double *dq, real *dk0, real *dk1, double *dparam, const int want) {
    const real beta = (real)p->v[PN_P_beta], kap = (real)p->v[PN_P_curvature], isk = (real)p->aux[0];
    real iw[PN_EPI_CHUNK];
    double sb_all = 0, sc_all = 0, sk_all = 0;
    for (int64_t j0 = 0; j0 < n; j0 += PN_EPI_CHUNK) {
        const int64_t nb = n - j0 < PN_EPI_CHUNK ? n - j0 : PN_EPI_CHUNK;
        const real *kk0 = k0 + j0;
        real *dkk0 = dk0 + j0;
        EPI(ball_keys)(nb, kk0, kap, iw);
        for (int64_t i = 0; i < rows; i++) {
            const real *gg = G + i * ld + j0, *dsi = ds + i * ld + j0, qq = q0[i];
            const real iu = 1 / (1 - kap * qq);
            real *o = dG + i * ld + j0;
            real sq0 = 0, sb = 0, sc = 0, sk = 0;
            #pragma omp simd reduction(+ : sq0, sb, sc, sk)
            for (int64_t j = 0; j < nb; j++) {
                real g = dsi[j];
                real d2 = qq + kk0[j] - 2 * gg[j];
                int pos = d2 > 0;
                d2 = pos ? d2 : 0;
                real iuw = iu * iw[j];
                real Xm1 = 2 * kap * d2 * iuw;
                real X = 1 + Xm1;
                real a = pn_acosh(X);
                real dist = isk * a;
                real gX = g != 0 ? -beta * g * isk * EPI(dacosh)(X, 2 * kap * (qq + kk0[j]) * iuw) : 0; /* ∂L/∂X */
                real f = pos ? gX * 2 * kap * iuw : 0; /* through ‖q−k‖² */
                o[j] = -2 * f;
                sq0 += f + gX * Xm1 * kap * iu;
                dkk0[j] += f + gX * Xm1 * kap * iw[j];
                /* ∂X/∂κ = (X−1)(1/κ + ‖q‖²/u + ‖k‖²/w); ∂d/∂κ = −arcosh(X)/(2κ^(3/2)) + … */
                real gk = gX * Xm1 * (1 / kap + qq * iu + kk0[j] * iw[j]);
                if (want) {
                    sk += g != 0 ? gk + beta * g * dist / (2 * kap) : 0;
                    sb += g != 0 ? -dist * g : 0;
                    sc += -g;
                }
            }
            dq[2 * i] += sq0;
            sb_all += sb;
            sc_all += sc;
            sk_all += sk;
        }
    }
    if (want) {
        dparam[PN_P_beta] += sb_all;
        dparam[PN_P_c] += sc_all;
        dparam[PN_P_curvature] += sk_all;
    }
}

/* want: the learnable parameters need their gradients (else their maths is compiled out) */
PN_VEC PN_HIDDEN void EPI(poincare_vjp)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const real *G,
        const real *q0, const real *q1, const real *k0, const real *k1, const real *ds, real *dG,
        double *dq, real *dk0, real *dk1, double *dparam) {
    PN_BOOL_SWITCH(p->learn & (PN_PBIT(PN_P_beta) | PN_PBIT(PN_P_c) | PN_PBIT(PN_P_curvature)), want,
                   EPI(poincare_vjp_body)(p, rows, n, ld, G, q0, q1, k0, k1, ds, dG, dq, dk0, dk1, dparam, want));
}

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

/* cone.h — the hierarchy-aware cone scores of Coneheads (Tseng et al. 2023), infinite-setting
 * shadow cones in the Poincaré half-space: s = −γ·height of sup₂(q, k), the lowest common
 * ancestor's Euclidean height. q₋ is q without its last coordinate, q_d its last (height).
 * Both use the GEMM over all but the last coordinate (q₋·k₋) with terms ‖x₋‖² and x_d.
 *
 * umbral (Def. 2, Eq. 8):    height = max(q_d, k_d, Δ/(2 sinh r) + (q_d + k_d)/2),
 *                            Δ = ‖q₋ − k₋‖; γ 1, r 0.1 (the ball radius, > 0).
 * penumbral (Def. 1):        with A = √(r² − q_d²), B = √(r² − k_d²) (clamped at 0 for
 *                            heights ≥ r) and the cone test (Eq. 23)
 *                              (Δ − A)² + k_d² < r²   or   Δ ≤ A,
 *                            inside:  height = max(q_d, k_d, √(r² − ((A + B − Δ)/2)²))   (Eq. 5)
 *                            outside: height = √(x² + k_d²), x = (Δ² + q_d² − k_d²)/(2Δ)   (Eq. 6)
 *                            γ 1, r 1 (the horosphere's height, > 0). On the boundary Eq. 33
 *                            both give r (continuity; a spec checks it). `squared` returns
 *                            −γ·height², what the authors' released code computes.
 *
 * Clamps (values and gradients finite everywhere on the half-space):
 *  - Δ: below the relative floor PN_EPI_EPS·(‖q₋‖²+‖k₋‖²) it is 0 with subgradient 0 (kink).
 *  - A, B: √ clamped at 0; their derivatives −q_d/A, r/A are taken as 0 when
 *    r² − q_d² ≤ PN_EPI_EPS·r² (at the horosphere the branch is not differentiable).
 *  - Eq. 6 only runs when Δ > A ≥ 0, so Δ > 0. In f32, x² + k_d² overflows only for heights
 *    beyond ~1e18 (where the coordinates' own squares overflow too): the height is then +inf
 *    and the weight 0.
 *  - ties in the max go to the LCA term first, then q_d, then k_d (a subgradient). */
#ifndef PN_EPI_PLAN /* the typed part: real, EPI(), PN_EPI_EPS (epi_impl.h, once per precision) */
/* ---- umbral ------------------------------------------------------------------------------ */
PN_VEC PN_HIDDEN void EPI(umbral_fwd)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const real *G,
        const real *q0, const real *q1, const real *k0, const real *k1, real *s) {
    const real gamma = (real)p->v[PN_P_gamma], inv = (real)p->aux[0];
    for (int64_t i = 0; i < rows; i++) {
        const real *g = G + i * ld, qq = q0[i], qh = q1[i];
        real *o = s + i * ld;
        for (int64_t j = 0; j < n; j++) {
            real n2 = qq + k0[j];
            real d2 = n2 - 2 * g[j];
            real d = d2 > PN_EPI_EPS * n2 ? d2 * pn_rsqrt(d2) : 0;
            real z = d * inv + (qh + k1[j]) * (real)0.5;
            real h = z >= qh ? z : qh;
            h = h >= k1[j] ? h : k1[j];
            o[j] = -gamma * h;
        }
    }
}

PN_INLINE void EPI(umbral_vjp_body)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const real *G,
        const real *q0, const real *q1, const real *k0, const real *k1, const real *ds, real *dG,
        double *dq, real *dk0, real *dk1, double *dparam, const int want) {
    const real gamma = (real)p->v[PN_P_gamma], inv = (real)p->aux[0], dinv_dr = (real)p->aux[1];
    double sgam_all = 0, sr_all = 0;
    for (int64_t i = 0; i < rows; i++) {
        const real *gg = G + i * ld, *dsi = ds + i * ld, qq = q0[i], qh = q1[i];
        real *o = dG + i * ld;
        real sq0 = 0, sq1 = 0, sgam = 0, sr = 0;
        #pragma omp simd reduction(+ : sq0, sq1, sgam, sr)
        for (int64_t j = 0; j < n; j++) {
            real g = dsi[j];
            real n2 = qq + k0[j];
            real d2 = n2 - 2 * gg[j];
            int pos = d2 > PN_EPI_EPS * n2;
            real rd = pos ? pn_rsqrt(d2) : 0; /* 1/Δ, or 0 at the kink */
            real d = d2 * rd;
            real kh = k1[j];
            real z = d * inv + (qh + kh) * (real)0.5;
            int isz = z >= qh && z >= kh;
            int isq = !isz && qh >= kh;
            int isk = !isz && !isq;
            real h = isz ? z : (isq ? qh : kh);
            real gh = -gamma * g;        /* ∂L/∂height */
            real gz = isz ? gh : 0;
            real f = gz * inv * (real)0.5 * rd; /* ∂L/∂(Δ²) = ∂L/∂Δ / (2Δ) */
            o[j] = -2 * f;
            sq0 += f;
            dk0[j] += f;
            sq1 += (isq ? gh : 0) + gz * (real)0.5;
            dk1[j] += (isk ? gh : 0) + gz * (real)0.5;
            if (want) {
                sgam += g != 0 ? -h * g : 0;
                sr += gz * d * dinv_dr;
            }
        }
        dq[2 * i] += sq0;
        dq[2 * i + 1] += sq1;
        sgam_all += sgam;
        sr_all += sr;
    }
    if (want) {
        dparam[PN_P_gamma] += sgam_all;
        dparam[PN_P_r] += sr_all;
    }
}

/* want: the learnable parameters need their gradients (else their maths is compiled out) */
PN_VEC PN_HIDDEN void EPI(umbral_vjp)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const real *G,
        const real *q0, const real *q1, const real *k0, const real *k1, const real *ds, real *dG,
        double *dq, real *dk0, real *dk1, double *dparam) {
    PN_BOOL_SWITCH(p->learn & (PN_PBIT(PN_P_gamma) | PN_PBIT(PN_P_r)), want,
                   EPI(umbral_vjp_body)(p, rows, n, ld, G, q0, q1, k0, k1, ds, dG, dq, dk0, dk1, dparam, want));
}

/* ---- penumbral --------------------------------------------------------------------------- */
/* Per key, once per block: B = √(r² − k_d²), 1/√(r² − k_d²) (clamped, see above), r² − k_d²
 * (the cone test is (Δ − A)² < r² − k_d²) and k_d². Both branches then end in one square
 * root: r² − mm² inside (then the max with the heights), x² + k_d² outside — the lane's
 * branch picks the radicand first. 1/√ of the radicands gives the roots and the divisions of
 * the derivative together.
 * The dense backward recomputes the scores (penumbral_fwd_save) before the VJP: that pass
 * stores the two reciprocal roots of every pair, 1/Δ and 1/√rad, and the VJP
 * (penumbral_vjp_saved) reads them instead of evaluating them again — the roots are most of
 * the score's arithmetic. Same numbers either way (bit for bit): the VJP redoes only the
 * cheap arithmetic around them, so its branch tests see exactly the forward's values. */
PN_INLINE void EPI(penumbral_keys)(int64_t n, const real *k1, real r2, real *B, real *iB, real *B2, real *K2) {
    for (int64_t j = 0; j < n; j++) {
        real kh2 = k1[j] * k1[j];
        real bk = r2 - kh2;
        real ib = bk > 0 ? pn_rsqrt(bk) : 0;
        B[j] = bk * ib;
        iB[j] = bk > PN_EPI_EPS * r2 ? ib : 0; /* derivative clamped near the horosphere */
        B2[j] = bk;
        K2[j] = kh2;
    }
}

/* keep: store into save (2, rows, ld): 1/Δ (0 at the kink) then 1/√rad (0 where rad ∉ (0, 3e38)) */
PN_INLINE void EPI(penumbral_fwd_body)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const real *G,
        const real *q0, const real *q1, const real *k0, const real *k1, real *s, real *save, const int keep) {
    const real gamma = (real)p->v[PN_P_gamma], r = (real)p->v[PN_P_r], r2 = r * r;
    const int squared = p->squared;
    real B[PN_EPI_CHUNK], iB[PN_EPI_CHUNK], B2[PN_EPI_CHUNK], K2[PN_EPI_CHUNK];
    for (int64_t j0 = 0; j0 < n; j0 += PN_EPI_CHUNK) {
        const int64_t nb = n - j0 < PN_EPI_CHUNK ? n - j0 : PN_EPI_CHUNK;
        const real *kk0 = k0 + j0, *kk1 = k1 + j0;
        EPI(penumbral_keys)(nb, kk1, r2, B, iB, B2, K2);
        for (int64_t i = 0; i < rows; i++) {
            const real *g = G + i * ld + j0, qq = q0[i], qh = q1[i], qh2 = qh * qh;
            real *o = s + i * ld + j0;
            real *srd = keep ? save + i * ld + j0 : NULL, *sih = keep ? save + (rows + i) * ld + j0 : NULL;
            const real aq = r2 - qh2;
            const real A = aq > 0 ? aq * pn_rsqrt(aq) : 0;
            /* simd: too many arrays for GCC's runtime alias checks; o may alias g (same j) */
            #pragma omp simd
            for (int64_t j = 0; j < nb; j++) {
                real n2 = qq + kk0[j];
                real d2 = n2 - 2 * g[j];
                real rd = d2 > PN_EPI_EPS * n2 ? pn_rsqrt(d2) : 0;
                real d = d2 * rd;
                real kh = kk1[j];
                real t = d - A;
                int in = t * t < B2[j] || d <= A;
                real mm = (A + B[j] - d) * (real)0.5;
                /* outside (Eq. 6): x = (Δ² + q_d² − k_d²)/(2Δ); there Δ > A ≥ 0, so rd = 1/Δ */
                real x = (real)0.5 * d + (real)0.5 * (qh2 - K2[j]) * rd;
                real rad = in ? r2 - mm * mm : x * x + K2[j];
                real ih = rad > 0 && rad < (real)3e38 ? pn_rsqrt(rad) : 0;
                real hh = rad > (real)3e38 ? rad : rad * ih; /* f32 overflow of x²: height +inf, weight 0 */
                real h = hh;
                h = in && qh > h ? qh : h; /* inside (Eq. 5): max(q_d, k_d, z) */
                h = in && kh > h ? kh : h;
                o[j] = squared ? -gamma * h * h : -gamma * h;
                if (keep) {
                    srd[j] = rd;
                    sih[j] = ih;
                }
            }
        }
    }
}

PN_VEC PN_HIDDEN void EPI(penumbral_fwd)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const real *G,
        const real *q0, const real *q1, const real *k0, const real *k1, real *s) {
    EPI(penumbral_fwd_body)(p, rows, n, ld, G, q0, q1, k0, k1, s, NULL, 0);
}

PN_VEC PN_HIDDEN void EPI(penumbral_fwd_save)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld,
        const real *G, const real *q0, const real *q1, const real *k0, const real *k1, real *s, real *save) {
    EPI(penumbral_fwd_body)(p, rows, n, ld, G, q0, q1, k0, k1, s, save, 1);
}

/* keep: read the roots from save, penumbral_fwd_save's (2, rows, ld) for the same block (else
 * recompute them) */
PN_INLINE void EPI(penumbral_vjp_body)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const real *G,
        const real *q0, const real *q1, const real *k0, const real *k1, const real *ds, real *dG,
        double *dq, real *dk0, real *dk1, double *dparam, const real *save, const int keep, const int want) {
    const real gamma = (real)p->v[PN_P_gamma], r = (real)p->v[PN_P_r], r2 = r * r;
    const int squared = p->squared;
    real B[PN_EPI_CHUNK], iB[PN_EPI_CHUNK], B2[PN_EPI_CHUNK], K2[PN_EPI_CHUNK], KB[PN_EPI_CHUNK];
    double sgam_all = 0, sr_all = 0;
    for (int64_t j0 = 0; j0 < n; j0 += PN_EPI_CHUNK) {
        const int64_t nb = n - j0 < PN_EPI_CHUNK ? n - j0 : PN_EPI_CHUNK;
        const real *kk0 = k0 + j0, *kk1 = k1 + j0;
        real *dkk0 = dk0 + j0, *dkk1 = dk1 + j0;
        EPI(penumbral_keys)(nb, kk1, r2, B, iB, B2, K2);
        for (int64_t j = 0; j < nb; j++) KB[j] = (real)0.5 * kk1[j] * iB[j]; /* −∂B/∂k_d / 2 */
        for (int64_t i = 0; i < rows; i++) {
            const real *gg = G + i * ld + j0, *dsi = ds + i * ld + j0, qq = q0[i], qh = q1[i], qh2 = qh * qh;
            const real *srd = keep ? save + i * ld + j0 : NULL, *sih = keep ? save + (rows + i) * ld + j0 : NULL;
            real *o = dG + i * ld + j0;
            const real aq = r2 - qh2;
            const real iAq = aq > 0 ? pn_rsqrt(aq) : 0;
            const real A = aq * iAq;
            const real iA = aq > PN_EPI_EPS * r2 ? iAq : 0; /* derivative clamped near the horosphere */
            const real QA = (real)0.5 * qh * iA;            /* −∂A/∂q_d / 2 */
            real sq0 = 0, sq1 = 0, sgam = 0, sr = 0;
            #pragma omp simd reduction(+ : sq0, sq1, sgam, sr)
            for (int64_t j = 0; j < nb; j++) {
                real g = dsi[j];
                real n2 = qq + kk0[j];
                real d2 = n2 - 2 * gg[j];
                real rd = keep ? srd[j] : (d2 > PN_EPI_EPS * n2 ? pn_rsqrt(d2) : 0); /* 1/Δ, 0 at the kink */
                real d = d2 * rd;
                real kh = kk1[j];
                real t = d - A;
                int in = t * t < B2[j] || d <= A;
                real mm = (A + B[j] - d) * (real)0.5;
                real u = (real)0.5 * (qh2 - K2[j]) * rd; /* (q_d² − k_d²)/(2Δ) */
                real x = (real)0.5 * d + u;
                real rad = in ? r2 - mm * mm : x * x + K2[j];
                real ih = keep ? sih[j] : (rad > 0 && rad < (real)3e38 ? pn_rsqrt(rad) : 0); /* 1/z or 1/h */
                real hh = rad * ih;
                int isz = in && hh >= qh && hh >= kh;
                int isq = in && !isz && qh >= kh;
                int isk = in && !isz && !isq;
                real h = isq ? qh : (isk ? kh : hh);

                real gh = squared ? -gamma * 2 * h * g : -gamma * g; /* ∂L/∂height */
                real w = gh * ih;                                    /* ∂L/∂rad · 2 */
                /* inside, height = z = √(r² − mm²), mm = (A + B − Δ)/2:
                 *   ∂z/∂mm = −mm/z, ∂mm/∂A = ∂mm/∂B = ½, ∂mm/∂Δ = −½; gmm = ∂L/∂mm */
                real gmm = isz ? -w * mm : 0;
                /* outside, height = √(x² + k_d²), x = Δ/2 + u: gx = ∂L/∂x */
                real gx = in ? 0 : w * x;
                real gd = (real)0.5 * (gx - gmm) - gx * u * rd;         /* ∂L/∂Δ */
                real gq1 = (isq ? gh : 0) - gmm * QA + gx * qh * rd;
                real gk1 = (isk ? gh : 0) - gmm * KB[j] + (in ? 0 : w * kh) - gx * kh * rd;

                real f = g != 0 ? (real)0.5 * gd * rd : 0; /* ∂L/∂(Δ²) */
                o[j] = -2 * f;
                sq0 += f;
                dkk0[j] += f;
                sq1 += g != 0 ? gq1 : 0;
                dkk1[j] += g != 0 ? gk1 : 0;
                if (want) {
                    /* through r²: z (r/z), A (r/A) and B (r/B) */
                    real ginr = (isz ? w * r : 0) + (real)0.5 * gmm * r * (iA + iB[j]);
                    sr += g != 0 ? ginr : 0;
                    sgam += g != 0 ? (squared ? -h * h * g : -h * g) : 0;
                }
            }
            dq[2 * i] += sq0;
            dq[2 * i + 1] += sq1;
            sgam_all += sgam;
            sr_all += sr;
        }
    }
    if (want) {
        dparam[PN_P_gamma] += sgam_all;
        dparam[PN_P_r] += sr_all;
    }
}

/* want: the learnable parameters need their gradients (else their maths is compiled out) */
PN_VEC PN_HIDDEN void EPI(penumbral_vjp)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const real *G,
        const real *q0, const real *q1, const real *k0, const real *k1, const real *ds, real *dG,
        double *dq, real *dk0, real *dk1, double *dparam) {
    PN_BOOL_SWITCH(p->learn & (PN_PBIT(PN_P_gamma) | PN_PBIT(PN_P_r)), want,
                   EPI(penumbral_vjp_body)(p, rows, n, ld, G, q0, q1, k0, k1, ds, dG, dq, dk0, dk1, dparam, NULL, 0, want));
}

PN_VEC PN_HIDDEN void EPI(penumbral_vjp_saved)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld,
        const real *G, const real *q0, const real *q1, const real *k0, const real *k1, const real *ds, real *dG,
        double *dq, real *dk0, real *dk1, double *dparam, const real *save) {
    PN_BOOL_SWITCH(p->learn & (PN_PBIT(PN_P_gamma) | PN_PBIT(PN_P_r)), want,
                   EPI(penumbral_vjp_body)(p, rows, n, ld, G, q0, q1, k0, k1, ds, dG, dq, dk0, dk1, dparam, save, 1, want));
}

#else /* the plan (epi_impl.h, once, after both precisions) */

/* aux[0] = 1/(2 sinh r), aux[1] = its derivative in r */
static void umbral_prepare(pn_score_params *p) {
    p->aux[0] = 0.5 / sinh(p->v[PN_P_r]);
    p->aux[1] = -0.5 * cosh(p->v[PN_P_r]) / (sinh(p->v[PN_P_r]) * sinh(p->v[PN_P_r]));
}

static const pn_score_plan umbral_tmpl = {
    .gemm = PN_GEMM_HEAD,
    .qterm = {PN_TERM_NORM2, PN_TERM_LAST},
    .kterm = {PN_TERM_NORM2, PN_TERM_LAST},
    .req = PN_REQ_LAST_POS,
    .params = PN_PBIT(PN_P_gamma) | PN_PBIT(PN_P_r),
    .prepare = umbral_prepare,
    .fwd32 = pn_epi_umbral_fwd_f32, .vjp32 = pn_epi_umbral_vjp_f32,
    .fwd64 = pn_epi_umbral_fwd_f64, .vjp64 = pn_epi_umbral_vjp_f64};
static const pn_score_plan penumbral_tmpl = {
    .gemm = PN_GEMM_HEAD,
    .qterm = {PN_TERM_NORM2, PN_TERM_LAST},
    .kterm = {PN_TERM_NORM2, PN_TERM_LAST},
    .req = PN_REQ_LAST_POS,
    .params = PN_PBIT(PN_P_gamma) | PN_PBIT(PN_P_r),
    .fwd32 = pn_epi_penumbral_fwd_f32, .vjp32 = pn_epi_penumbral_vjp_f32,
    .fwd64 = pn_epi_penumbral_fwd_f64, .vjp64 = pn_epi_penumbral_vjp_f64,
    .fwds32 = pn_epi_penumbral_fwd_save_f32, .vjps32 = pn_epi_penumbral_vjp_saved_f32,
    .fwds64 = pn_epi_penumbral_fwd_save_f64, .vjps64 = pn_epi_penumbral_vjp_saved_f64};

pn_status pn_score_plan_umbral(const char *op, const pn_attn_opts *o, pn_score_plan *p) {
    (void)op, (void)o;
    *p = umbral_tmpl;
    return PN_OK;
}

pn_status pn_score_plan_penumbral(const char *op, const pn_attn_opts *o, pn_score_plan *p) {
    (void)op, (void)o;
    *p = penumbral_tmpl;
    return PN_OK;
}

#endif

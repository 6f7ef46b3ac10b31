/* cone.h — the hierarchy-aware cone scores of Coneheads (Tseng et al. 2023), infinite-setting
 * shadow cones in the Poincaré half-space: s = −γ·height of sup₂(q, k), the lowest common
 * ancestor's Euclidean height. q₋ is q without its last coordinate, q_d its last (height).
 * Both are distance scores (plan.diff): G = −½‖q₋ − k₋‖², exact for close points
 * (attention.h), with the terms ‖x₋‖² (for the drivers) and x_d.
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
 *  - Δ: at the kink Δ = 0 (and below the smallest normal float) 0 with subgradient 0.
 *  - A, B: √ clamped at 0; their derivatives −q_d/A, r/A are taken as 0 when
 *    r² − q_d² ≤ PN_EPI_EPS·r² (at the horosphere the branch is not differentiable).
 *  - Eq. 6 only runs when Δ > A ≥ 0, so Δ > 0. In f32, x² + k_d² overflows only for heights
 *    beyond ~1e18 (where the coordinates' own squares overflow too): the height is then +inf
 *    and the weight 0.
 *  - ties in the max go to the LCA term first, then q_d, then k_d (a subgradient). */
#ifndef PN_EPI_PLAN /* the typed part: real, EPI(), PN_EPI_EPS (epi_impl.h, once per precision) */

/* ---- umbral ------------------------------------------------------------------------------ */
/* inv = 1/(2 sinh r), dinv = its derivative in r (plan.prepare's aux) */
typedef struct { real gamma, inv, dinv; } EPI(umbral_h);
PN_HD static inline EPI(umbral_h) EPI(umbral_head)(const pn_score_params *p) {
    EPI(umbral_h) h = {(real)p->v[PN_P_gamma], (real)p->aux[0], (real)p->aux[1]};
    return h;
}
PN_EPI_NO_KEY(umbral)
PN_EPI_NO_ROW(umbral)

/* s = −γ·max(q_d, k_d, z), z = Δ/(2 sinh r) + (q_d + k_d)/2; Δ² = −2G, x_d (q1, k1);
 * sv0 = 1/Δ (0 at the kink): the dense backward keeps it for the VJP (fwd_save / vjp_saved),
 * which then skips its own square root — the same number either way */
PN_HD static inline EPI(spair) EPI(umbral_pair)(const EPI(umbral_h) *h, const EPI(x4) r, const EPI(x4) k, real G,
                                          real q0, real q1, real k0, real k1) {
    real d2 = -2 * G;
    real rd = pn_rsqrt(d2);
    real d = d2 * rd; /* 0 at the kink */
    real z = d * h->inv + (q1 + k1) * (real)0.5;
    real hh = z >= q1 ? z : q1;
    hh = hh >= k1 ? hh : k1;
    EPI(spair) o = {-h->gamma * hh, rd, 0};
    return o;
}

/* ties go to z, then q_d, then k_d (a subgradient); f = ∂L/∂(Δ²) = ∂L/∂Δ / (2Δ); keep: sv0 is
 * umbral_pair's 1/Δ (else recomputed) */
PN_HD static inline EPI(dpair) EPI(umbral_pair_vjp)(const EPI(umbral_h) *h, const EPI(x4) r, const EPI(x4) k, real G,
                                              real q0, real q1, real k0, real k1, real ds, real sv0, real sv1,
                                              int keep, int want) {
    EPI(dpair) d = {0, 0, 0, 0, 0, 0, 0, 0};
    real g = ds;
    real d2 = -2 * G;
    real rd = keep ? sv0 : pn_rsqrt(d2); /* 1/Δ, or 0 at the kink */
    real dd = d2 * rd;
    real qh = q1, kh = k1;
    real z = dd * h->inv + (qh + kh) * (real)0.5;
    int isz = z >= qh && z >= kh;
    int isq = !isz && qh >= kh;
    int isk = !isz && !isq;
    real hh = isz ? z : (isq ? qh : kh);
    real gh = -h->gamma * g; /* ∂L/∂height */
    real gz = isz ? gh : 0;
    real f = gz * h->inv * (real)0.5 * rd;
    d.q1 = (isq ? gh : 0) + gz * (real)0.5;
    d.k1 = (isk ? gh : 0) + gz * (real)0.5;
    if (want) {
        d.p0 = g != 0 ? -hh * g : 0;
        d.p1 = gz * dd * h->dinv;
    }
    d.g = -2 * f;
    return d;
}

PN_EPI_BLOCKS(umbral, PN_T_Q1 | PN_T_K1, 0, PN_P_gamma, PN_P_r, -1)

/* ---- penumbral --------------------------------------------------------------------------- */
/* Per key, once per block (penumbral_key): B/2 with B = √(r² − k_d²), 1/B (clamped, see
 * above), k_d² and −∂B/∂k_d / 2. Per row (penumbral_row): A/2 with A = √(r² − q_d²), 1/A,
 * −∂A/∂q_d / 2 and q_d². Halves, because the pair's arithmetic wants mm = (A + B − Δ)/2, and the cone test
 * needs no other number: for Δ > A it is (Δ − A)² < B², i.e. Δ < A + B, i.e. mm > 0 (B ≥ 0
 * clamped: a key above the horosphere has B = 0 and only Δ ≤ A is inside). Both branches then
 * end in one square root: r² − mm² inside (then the max with the heights), x² + k_d² outside —
 * the lane's branch picks the radicand first. 1/√ of the radicands gives the roots and the
 * divisions of the derivative together. penumbral_geom holds that part once, for the score and
 * its VJP, so their branch tests see the same numbers.
 * The dense backward recomputes the scores (fwd_save) before the VJP: that pass stores the two
 * reciprocal roots of every pair, 1/Δ and 1/√rad (sv0, sv1), and the VJP (vjp_saved, keep)
 * reads them instead of evaluating them again — the roots are most of the score's arithmetic.
 * Same numbers either way (bit for bit): the VJP redoes only the cheap arithmetic around
 * them. */
typedef struct { real gamma, r, r2; int squared; } EPI(penumbral_h);
PN_HD static inline EPI(penumbral_h) EPI(penumbral_head)(const pn_score_params *p) {
    const real r = (real)p->v[PN_P_r];
    EPI(penumbral_h) h = {(real)p->v[PN_P_gamma], r, r * r, p->squared};
    return h;
}
/* {B/2, 1/B (0 near the horosphere), k_d², −∂B/∂k_d / 2} */
PN_HD static inline EPI(x4) EPI(penumbral_key)(const EPI(penumbral_h) *h, real k0, real k1) {
    real kh2 = k1 * k1;
    real bk = h->r2 - kh2;
    real ib = bk > 0 ? pn_rsqrt(bk) : 0;
    const real iB = bk > PN_EPI_EPS * h->r2 ? ib : 0;
    EPI(x4) x = {(real)0.5 * bk * ib, iB, kh2, (real)0.5 * k1 * iB};
    return x;
}
/* {A/2, 1/A (0 near the horosphere), −∂A/∂q_d / 2, q_d²} */
PN_HD static inline EPI(x4) EPI(penumbral_row)(const EPI(penumbral_h) *h, real q0, real q1) {
    const real qh2 = q1 * q1;
    const real aq = h->r2 - qh2;
    const real iAq = aq > 0 ? pn_rsqrt(aq) : 0;
    const real iA = aq > PN_EPI_EPS * h->r2 ? iAq : 0;
    EPI(x4) x = {(real)0.5 * aq * iAq, iA, (real)0.5 * q1 * iA, qh2};
    return x;
}

/* one pair's geometry from Δ and 1/Δ: inside the cone or not, mm = (A + B − Δ)/2,
 * u = (q_d² − k_d²)/(2Δ) and x = Δ/2 + u (Eq. 6), and the radicand of the height */
typedef struct { real mm, u, x, rad; int in; } EPI(penumbral_g);
PN_HD static inline EPI(penumbral_g) EPI(penumbral_geom)(const EPI(penumbral_h) *h, const EPI(x4) r,
                                                        const EPI(x4) k, real d, real rd) {
    EPI(penumbral_g) g;
    const real hd = (real)0.5 * d;
    g.mm = (r.a + k.a) - hd;
    g.in = g.mm > 0 || hd <= r.a; /* Δ < A + B, or Δ ≤ A */
    /* outside, Δ > A ≥ 0, so rd = 1/Δ */
    g.u = ((real)0.5 * r.d - (real)0.5 * k.c) * rd;
    g.x = hd + g.u;
    g.rad = g.in ? h->r2 - g.mm * g.mm : g.x * g.x + k.c;
    return g;
}

/* sv0 = 1/Δ (0 at the kink), sv1 = 1/√rad (0 where rad is not a positive normal float) */
PN_HD static inline EPI(spair) EPI(penumbral_pair)(const EPI(penumbral_h) *h, const EPI(x4) r, const EPI(x4) k, real G,
                                             real q0, real q1, real k0, real k1) {
    real d2 = -2 * G;
    real rd = pn_rsqrt(d2); /* 1/Δ, 0 at the kink */
    const EPI(penumbral_g) g = EPI(penumbral_geom)(h, r, k, d2 * rd, rd);
    real ih = pn_rsqrt(g.rad);
    real hh = g.rad > (real)3e38 ? g.rad : g.rad * ih; /* f32 overflow of x²: height +inf, weight 0 */
    real qk = q1 > k1 ? q1 : k1;
    /* inside (Eq. 5): max(q_d, k_d, z), as a max (NaN hh stays) and a select: one vector op
     * fewer than a select on `in && qk > hh` */
    real mx = qk > hh ? qk : hh;
    real ht = g.in ? mx : hh;
    EPI(spair) o = {h->squared ? -h->gamma * ht * ht : -h->gamma * ht, rd, ih};
    return o;
}

/* keep: sv0, sv1 are penumbral_pair's (else recomputed) */
PN_HD static inline EPI(dpair) EPI(penumbral_pair_vjp)(const EPI(penumbral_h) *h, const EPI(x4) r, const EPI(x4) k,
                                                 real G, real q0, real q1, real k0, real k1, real ds, real sv0,
                                                 real sv1, int keep, int want) {
    EPI(dpair) dp = {0, 0, 0, 0, 0, 0, 0, 0};
    const real iA = r.b, QA = r.c, iB = k.b, KB = k.d;
    const real rr = h->r, gamma = h->gamma;
    real g = ds;
    real d2 = -2 * G;
    real rd = keep ? sv0 : pn_rsqrt(d2); /* 1/Δ, 0 at the kink */
    const EPI(penumbral_g) ge = EPI(penumbral_geom)(h, r, k, d2 * rd, rd);
    const real mm = ge.mm, u = ge.u, x = ge.x;
    const int in = ge.in;
    real qh = q1, kh = k1;
    real ih = keep ? sv1 : pn_rsqrt(ge.rad); /* 1/z or 1/h */
    real hh = ge.rad * ih;
    int isz = in && hh >= qh && hh >= kh;
    int isq = in && !isz && qh >= kh;
    int isk = in && !isz && !isq;
    real ht = isq ? qh : (isk ? kh : hh);

    real gh = h->squared ? -gamma * 2 * ht * g : -gamma * g; /* ∂L/∂height */
    real w = gh * ih;                                        /* ∂L/∂rad · 2 */
    /* inside, height = z = √(r² − mm²), mm = (A + B − Δ)/2:
     *   ∂z/∂mm = −mm/z, ∂mm/∂A = ∂mm/∂B = ½, ∂mm/∂Δ = −½; gmm = ∂L/∂mm */
    real gmm = isz ? -w * mm : 0;
    /* outside, height = √(x² + k_d²), x = Δ/2 + u, u = (q_d² − k_d²)/(2Δ): gx = ∂L/∂x,
     * and ∂u/∂Δ = −u/Δ, ∂u/∂q_d = q_d/Δ, ∂u/∂k_d = −k_d/Δ (gxr = gx/Δ) */
    real wo = in ? 0 : w;
    real gx = wo * x;
    real gxr = gx * rd;
    real gd = (real)0.5 * (gx - gmm) - gxr * u; /* ∂L/∂Δ */
    real gq1 = (isq ? gh : 0) - gmm * QA + gxr * qh;
    real gk1 = (isk ? gh : 0) - gmm * KB + kh * (wo - gxr);

    real f = g != 0 ? (real)0.5 * gd * rd : 0; /* ∂L/∂(Δ²) */
    dp.q1 = g != 0 ? gq1 : 0;
    dp.k1 = g != 0 ? gk1 : 0;
    if (want) {
        /* through r²: z (r/z), A (r/A) and B (r/B) */
        real ginr = (isz ? w * rr : 0) + (real)0.5 * gmm * rr * (iA + iB);
        dp.p1 = g != 0 ? ginr : 0;
        dp.p0 = g != 0 ? (h->squared ? -ht * ht * g : -ht * g) : 0;
    }
    dp.g = -2 * f;
    return dp;
}

PN_EPI_BLOCKS(penumbral, PN_T_Q1 | PN_T_K1, 1, PN_P_gamma, PN_P_r, -1)

#else /* the plan (epi_impl.h, once, after both precisions) */

/* aux[0] = 1/(2 sinh r), aux[1] = its derivative in r */
static void umbral_prepare(pn_score_params *p) {
    p->aux[0] = 0.5 / sinh(p->v[PN_P_r]);
    p->aux[1] = -0.5 * cosh(p->v[PN_P_r]) / (sinh(p->v[PN_P_r]) * sinh(p->v[PN_P_r]));
}

static const pn_score_plan umbral_tmpl = {
    .gemm = PN_GEMM_HEAD,
    .diff = 1,
    .qterm = {PN_TERM_NORM2, PN_TERM_LAST},
    .kterm = {PN_TERM_NORM2, PN_TERM_LAST},
    .req = PN_REQ_LAST_POS,
    .params = PN_PBIT(PN_P_gamma) | PN_PBIT(PN_P_r),
    .prepare = umbral_prepare,
    .fwd32 = pn_epi_umbral_fwd_f32, .vjp32 = pn_epi_umbral_vjp_f32,
    .fwd64 = pn_epi_umbral_fwd_f64, .vjp64 = pn_epi_umbral_vjp_f64,
    .fwds32 = pn_epi_umbral_fwd_save_f32, .vjps32 = pn_epi_umbral_vjp_saved_f32,
    .fwds64 = pn_epi_umbral_fwd_save_f64, .vjps64 = pn_epi_umbral_vjp_saved_f64};
static const pn_score_plan penumbral_tmpl = {
    .gemm = PN_GEMM_HEAD,
    .diff = 1,
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

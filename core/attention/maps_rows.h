/* maps_rows.h — private to core/attention/: the row kernels of the manifold maps (maps.c, see its
 * header comment for the maths): forward and vector-Jacobian product of one point, in double.
 * PN_HD: maps.c instantiates its CPU block loops over them (PN_ROWMAP_ROWS) and
 * core/cuda/attention/rowmap.cu calls the same functions from its device kernels. */
#ifndef PN_ATTENTION_MAPS_ROWS_H
#define PN_ATTENTION_MAPS_ROWS_H

#include "rowmap.h"

#include <float.h>

/* ---- psi: (x₋ e^{x_d}, e^{x_d}) ------------------------------------------------------------------
 * e^{x_d} overflows f32 past x_d ≈ 88, like the paper's; scale the inputs or use exp0 when
 * that can happen.
 * FLOOR: the height is at least sc[1], the smallest normal number of the dtype (FLT_MIN,
 * DBL_MIN): below x_d ≈ −87 (f32) e^{x_d} would round to 0 or a subnormal, a point on the
 * boundary of the half-space that every cone score refuses — a PPI run with umbral attention
 * drove a head there after 7 epochs and stopped. Where the floor holds the height is constant
 * (its gradient 0; the true one is below 1e-38 anyway). NaN stays NaN. */
PN_HD static inline double floor_height(double v, double lo, int *held) {
    *held = v < lo;
    return *held ? lo : v;
}

PN_HD static inline int psi_fwd(const pn_rowmap *m, const double *x, const double *y, double *out, double *bad) {
    int64_t d = m->D - 1;
    int held;
    double e = floor_height(exp(x[d]), m->sc[1], &held);
    for (int64_t j = 0; j < d; j++) out[j] = x[j] * e;
    out[d] = e;
    return 0;
}

/* ∂out_j/∂x_j = e, ∂out_j/∂x_d = x_j e, ∂out_d/∂x_d = e */
PN_HD static inline void psi_bwd(const pn_rowmap *m, const double *x, const double *y, const double *g, double *gx, double *gy) {
    int64_t d = m->D - 1;
    int held;
    double e = floor_height(exp(x[d]), m->sc[1], &held), s = g[d];
    for (int64_t j = 0; j < d; j++) {
        gx[j] = g[j] * e;
        s += g[j] * x[j];
    }
    gx[d] = held ? 0 : e * s;
}

/* ---- xi: (x₋ h σ(x_d), h σ(x_d)), h = sc[0] --------------------------------------------------------
 * σ is evaluated without overflow for either sign. FLOOR as psi: the height h σ(x_d) is at
 * least sc[1], the dtype's smallest normal number (it would reach 0, the boundary, below
 * x_d ≈ −87 in f32), with gradient 0 for x_d where the floor holds. */
PN_HD static inline double sigmoid(double t) {
    if (t >= 0) return 1.0 / (1.0 + exp(-t));
    double e = exp(t); /* no overflow of exp(-t) for very negative t */
    return e / (1.0 + e);
}

PN_HD static inline int xi_fwd(const pn_rowmap *m, const double *x, const double *y, double *out, double *bad) {
    int64_t d = m->D - 1;
    int held;
    double s = floor_height(m->sc[0] * sigmoid(x[d]), m->sc[1], &held);
    for (int64_t j = 0; j < d; j++) out[j] = x[j] * s;
    out[d] = s;
    return 0;
}

/* s = hσ(x_d), ds/dx_d = s(1 − σ(x_d)) */
PN_HD static inline void xi_bwd(const pn_rowmap *m, const double *x, const double *y, const double *g, double *gx, double *gy) {
    int64_t d = m->D - 1;
    int held;
    double sg = sigmoid(x[d]), s = floor_height(m->sc[0] * sg, m->sc[1], &held), acc = g[d];
    for (int64_t j = 0; j < d; j++) {
        gx[j] = g[j] * s;
        acc += g[j] * x[j];
    }
    gx[d] = held ? 0 : s * (1.0 - sg) * acc;
}

/* ---- pseudopolar ------------------------------------------------------------------------------------------
 * (sinh r·u/‖u‖, cosh r) with u = x₋, r = x_d. The direction u/‖u‖ is undefined at u = 0:
 * CLAMP: the norm in the denominator is max(‖u‖, eps) (eps = sc[0]: 1e-6 for f32, 1e-12 for
 * f64), and the time-like coordinate is sqrt(1 + ‖y₋‖²), which equals cosh r whenever
 * ‖u‖ ≥ eps. So below eps the point slides along its geodesic towards the origin
 * (0,…,0,1), which is where u = 0 lands: every output lies on the hyperboloid, and values
 * and gradients are finite (the gradient is at most sinh(r)/eps there). */
/* sinh r and cosh r from ONE expm1 (libm's sinh and cosh cost an exp each): with a = |r|,
 * E = e^a − 1, sinh a = E(E + 2)/(2(E + 1)) and cosh a = 1 + E²/(2(E + 1)) — no cancellation
 * (E ≥ 0), within 2 ulps of libm over [−30, 30]. Beyond a = 20 the e^−a part is below an ulp;
 * past 709, ½e^(a/2)·e^(a/2) overflows where sinh and cosh do. NaN propagates. */
PN_HD static inline void sinh_cosh(double r, double *S, double *C) {
    double a = fabs(r);
    if (a <= 20) {
        double E = expm1(a), inv = 0.5 / (E + 1);
        *S = copysign(E * (E + 2) * inv, r);
        *C = 1 + E * E * inv;
    } else {
        double e = exp(0.5 * a), h = a < 709 ? 0.5 * exp(a) : (0.5 * e) * e; /* e^a itself would overflow first */
        *S = copysign(h, r);
        *C = h;
    }
}

PN_HD static inline int pp_fwd(const pn_rowmap *m, const double *x, const double *y, double *out, double *bad) {
    int64_t d = m->D - 1;
    double eps = m->sc[0], nu = pn_row_norm(x, d), r = x[d];
    double S, Ch;
    sinh_cosh(r, &S, &Ch);
    if (nu >= eps) {
        for (int64_t j = 0; j < d; j++) out[j] = S * (x[j] / nu);
        out[d] = Ch;
    } else {
        for (int64_t j = 0; j < d; j++) out[j] = S * x[j] / eps;
        double rho = S * nu / eps; /* ‖y₋‖ */
        out[d] = sqrt(1.0 + rho * rho);
    }
    return 0;
}

PN_HD static inline void pp_bwd(const pn_rowmap *m, const double *x, const double *y, const double *g, double *gx, double *gy) {
    int64_t d = m->D - 1;
    double eps = m->sc[0], nu = pn_row_norm(x, d), r = x[d];
    double S, Ch;
    sinh_cosh(r, &S, &Ch);
    if (nu >= eps) {
        /* y₋ = S û: ∂/∂u = (S/ν)(I − û ûᵀ), ∂/∂r = C û; y_d = cosh r */
        double gu = 0; /* g₋·û */
        for (int64_t j = 0; j < d; j++) gu += g[j] * (x[j] / nu);
        for (int64_t j = 0; j < d; j++) gx[j] = (S / nu) * (g[j] - (x[j] / nu) * gu);
        gx[d] = Ch * gu + S * g[d];
    } else {
        /* y₋ = S u/ε, y_d = T = sqrt(1 + S²ν²/ε²) */
        double rho = S * nu / eps, T = sqrt(1.0 + rho * rho), gxu = 0;
        for (int64_t j = 0; j < d; j++) gxu += g[j] * x[j];
        for (int64_t j = 0; j < d; j++) gx[j] = S * g[j] / eps + g[d] * S * S * x[j] / (eps * eps * T);
        gx[d] = Ch * gxu / eps + g[d] * S * Ch * nu * nu / (eps * eps * T);
    }
}

/* ---- exp0: Coneheads Eq. 9 at O = (0,…,0,1) -----------------------------------------------------------
 * With n = ‖v‖ and s(n) = sinh n / n, Eq. 9 at x = O reads
 *     y_d = 1 / (cosh n − v_d s(n)),      y₋ = v₋ s(n) y_d.
 * Written like that it overflows (cosh, sinh) and cancels (cosh n − sinh n when v points up)
 * long before the result leaves the float range, and 0/0 at v = 0. The kernels use instead,
 * with a = v_d/n, p = 1 − a, q = 1 + a, E = e^{−2n}:
 *     Den = p + q E,   y_d = 2 e^{−n} / Den,   σ := s(n) y_d = (1 − E)/(n Den),   y₋ = σ v₋
 * where the small one of p, q is computed without cancellation as ‖v₋‖²/(n (n ± v_d)).
 * v = 0 maps to O.
 * CLAMP (huge/tiny heights): ‖v‖ is capped at NMAX (sc[1]: 30 for f32, 300 for f64) — the
 * point then lies at hyperbolic distance NMAX from O along the same geodesic. Since
 * e^{−n} ≤ y_d ≤ e^{n} and ‖y₋‖ ≤ e^{n}/2, heights stay in [e^{−30}, e^{30}] in f32 and their
 * squares (used by the scores) stay finite; gradients stay finite too (≤ ~e^{2n}/n).
 * Options: h (sc[0], NaN = none) clamps the height, y_d = min(y_d, h) (the paper's
 * penumbral variant); scale_last (iv[0]) divides x_d by D first, as the authors' code does. */
typedef struct {
    double n, yd, sigma, G; /* G = y_d (cosh n − s(n))/n², for the backward */
} exp0_row;

PN_HD static inline void exp0_core(const double *v, int64_t D, exp0_row *e) {
    int64_t d = D - 1;
    double w2 = pn_row_dot(v, v, d), vd = v[d];
    double n = pn_row_norm(v, D);
    e->n = n;
    if (n == 0) {
        e->yd = 1;
        e->sigma = 1;
        e->G = 1.0 / 3.0;
        return;
    }
    double p, q;
    if (vd >= 0) {
        q = 1.0 + vd / n;
        p = w2 > 0 ? w2 / (n * (n + vd)) : 0;
    } else {
        p = 1.0 - vd / n;
        q = w2 > 0 ? w2 / (n * (n - vd)) : 0;
    }
    double E = exp(-2.0 * n), omE = -expm1(-2.0 * n); /* 1 − E without cancellation */
    double Den = p + q * E;                           /* ≥ 2E > 0 for n ≤ NMAX */
    e->yd = 2.0 * exp(-n) / Den;
    e->sigma = omE / (n * Den);
    if (n < 0.1) { /* (cosh n − sinh n/n)/n² = 1/3 + n²/30 + n⁴/840 + n⁶/45360 + n⁸/3991680 + … */
        double n2 = n * n;
        e->G = e->yd * (1.0 / 3 + n2 * (1.0 / 30 + n2 * (1.0 / 840 + n2 * (1.0 / 45360 + n2 / 3991680))));
    } else { /* y_d cosh n = (1 + E)/Den, y_d sinh n / n = σ */
        e->G = ((1.0 + E) - omE / n) / (Den * n * n);
    }
}

/* v = x with the options applied; returns the factor κ of the NMAX cap (1 when not capped) */
PN_HD static inline double exp0_input(const pn_rowmap *m, const double *x, double *v) {
    int64_t D = m->D;
    memcpy(v, x, sizeof(double) * (size_t)D);
    if (m->iv[0]) v[D - 1] /= (double)D;
    double n = pn_row_norm(v, D), kappa = 1.0;
    if (n > m->sc[1]) {
        kappa = m->sc[1] / n;
        for (int64_t i = 0; i < D; i++) v[i] *= kappa;
    }
    return kappa;
}

PN_HD static inline int exp0_fwd(const pn_rowmap *m, const double *x, const double *y, double *out, double *bad) {
    int64_t D = m->D, d = D - 1;
    double *v = out; /* out doubles as the scratch for v: each v_j is read before out_j is written */
    exp0_input(m, x, v);
    exp0_row e;
    exp0_core(v, D, &e);
    for (int64_t j = 0; j < d; j++) out[j] = e.sigma * v[j];
    double h = m->sc[0];
    out[d] = (h == h && e.yd > h) ? h : e.yd;
    return 0;
}

/* VJP of Eq. 9 in terms of the stable quantities (derivation in the header comment's notation):
 *   K_i = y_d ∂(1/y_d)/∂v_i = α v_i − σ δ_id,   α = σ − v_d G
 *   ∂y_d/∂v_i = −y_d K_i,    ∂y_j/∂v_i = σ δ_ij + G v_j v_i − y_j K_i
 *   gv_i = σ g_i [i<d] + G v_i (g₋·v₋) − K_i (g₋·y₋ + g_d y_d)
 * then through the NMAX cap (a radial projection) and the 1/D scaling of x_d. */
PN_HD static inline void exp0_bwd(const pn_rowmap *m, const double *x, const double *y, const double *g, double *gx, double *gy) {
    int64_t D = m->D, d = D - 1;
    double *v = gy; /* gy is free scratch (one-input map) */
    double kappa = exp0_input(m, x, v);
    exp0_row e;
    exp0_core(v, D, &e);
    double h = m->sc[0];
    double gd = (h == h && e.yd > h) ? 0.0 : g[d]; /* the h clamp cuts the height's gradient */
    double gv = 0, gyv = gd * e.yd;
    for (int64_t j = 0; j < d; j++) {
        gv += g[j] * v[j];
        gyv += g[j] * e.sigma * v[j];
    }
    double alpha = e.sigma - v[d] * e.G;
    for (int64_t i = 0; i < D; i++) {
        double K = alpha * v[i] - (i == d ? e.sigma : 0.0);
        gx[i] = (i < d ? e.sigma * g[i] : 0.0) + e.G * v[i] * gv - K * gyv;
    }
    if (kappa < 1.0) { /* v = NMAX x/‖x‖: gx ← κ (gx − v̂ (v̂·gx)) */
        double nn = pn_row_norm(v, D), dot = 0;
        for (int64_t i = 0; i < D; i++) dot += gx[i] * v[i] / nn;
        for (int64_t i = 0; i < D; i++) gx[i] = kappa * (gx[i] - v[i] / nn * dot);
    }
    if (m->iv[0]) gx[d] /= (double)D;
}

#endif /* PN_ATTENTION_MAPS_ROWS_H */

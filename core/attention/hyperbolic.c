/* hyperbolic.c — the Poincaré-ball toolkit and the Klein conversions (DESIGN §3.1; Gulcehre
 * Eq. 2–3 and Coneheads App. 7.1 for the models, the Poincaré-ball note for the ball maps).
 *
 * Models and conventions (curvature −c, c > 0):
 *   Poincaré ball  ‖p‖ < 1/√c.
 *   Klein ball     ‖k‖ < 1/√c.   Poincaré → Klein k = 2p/(1 + c‖p‖²); Klein → Poincaré
 *                  p = k/(1 + √(1 − c‖k‖²)).
 *   Hyperboloid    −x_d² + ‖x₋‖² = −1/c, x_d > 0, the TIME-LIKE COORDINATE LAST (as the
 *                  pseudopolar map produces it; c = 1 is Gulcehre's unit hyperboloid).
 *                  Hyperboloid → Klein k = x₋/(√c x_d); Klein → hyperboloid
 *                  x = (k, 1/√c)/√(1 − c‖k‖²) (Coneheads Eq. 16–17 at c = 1).
 *   expmap0(v) = tanh(√c‖v‖) v/(√c‖v‖)          logmap0(y) = artanh(√c‖y‖) y/(√c‖y‖)
 *   x ⊕ y = ((1 + 2c x·y + c‖y‖²) x + (1 − c‖x‖²) y) / (1 + 2c x·y + c²‖x‖²‖y‖²)
 *   dist(x, y) = (2/√c) artanh(√c ‖(−x) ⊕ y‖), computed as
 *                (2/√c) artanh(√c ‖x − y‖ / √(1 − 2c x·y + c²‖x‖²‖y‖²)) — the same number
 *                (‖(−x)⊕y‖² = ‖x − y‖²/(1 − 2c x·y + c²‖x‖²‖y‖²)), but exactly 0 at x = y and
 *                without the cancellation of forming (−x)⊕y.
 *
 * Boundary handling — the constants, chosen per dtype (the row maths is in double for both):
 *   EPS   4e-3 (f32), 1e-5 (f64): project keeps ‖x‖ ≤ (1 − EPS)/√c (f32 cannot resolve the
 *         hyperbolic distances of points much closer to the boundary; geoopt's values).
 *   TOL   1e-5 (f32), 1e-12 (f64): a point with 1 ≤ √c‖x‖ ≤ 1 + TOL is ON the boundary up to
 *         rounding (e.g. a float32 tanh that rounded to 1) and is accepted; the clamps below
 *         keep what is computed from it finite. Beyond 1 + TOL the point is not in the ball:
 *         an error naming the op, the argument, the point and √c‖x‖ — never a silent NaN.
 *         Non-finite points are errors too.
 *   AMAX  artanh arguments are clamped to ≤ AMAX = 1 − 1e-7 (f32), 1 − 1e-15 (f64), about
 *         the last representable value below 1: logmap0 and dist saturate (logmap0 ≤ 8.4/√c
 *         in f32, 17.6/√c in f64) instead of reaching inf, monotonically, and their
 *         gradients are 0 past the clamp and ≤ ~1/(2(1 − AMAX)) before it.
 *   ‖x‖ = 0 in expmap0/logmap0: the factors tanh(t)/t and artanh(t)/t are evaluated as their
 *         limits (→ 1) and their derivatives by Taylor series for t < 0.01, so the gradient
 *         at 0 is the identity, not 0/0.
 *   Denominators of ⊕ and dist are evaluated as (1 ± c x·y)² + c²(‖x‖²‖y‖² − (x·y)²), a sum
 *         of non-negatives (the expanded form cancels near the boundary), floored at DBL_MIN.
 *   Klein points are capped at √c‖k‖ ≤ 2r/(1 + r²), r = 1 − EPS (the image of the project
 *         radius), so that 1 − c‖k‖² never reaches 0 (and γ(k) of the Einstein midpoint stays
 *         finite); from_klein floors 1 − c‖k‖² at EPS²/4 for the same reason.
 */
#include "rowmap.h"

#include <float.h>
#include <stdio.h>

/* sc[] layout shared by every kernel here */
enum { C_ = 0, SQC = 1, EPS = 2, TOL = 3, KMIN = 4, KMAX = 5, AMAX = 6 };

static inline void axpy_row(double *dst, double a, const double *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] += a * x[i];
}

/* *z = √c‖x‖; returns nonzero when x is not in the ball (up to TOL), inf or NaN */
static int ball_check(const pn_rowmap *m, const double *x, double *z) {
    *z = m->sc[SQC] * pn_row_norm(x, m->D);
    return !(*z <= 1.0 + m->sc[TOL]);
}

/* g (w.r.t. x' = κ x) → g w.r.t. x, where κ = r/‖x‖ for a fixed radius r (a radial
 * projection, as in project and the caps): ∂x'/∂x = κ (I − x̂ x̂ᵀ). κ = 1: identity. */
static void radial_bw(const double *x, int64_t D, double kappa, double *g) {
    if (kappa == 1.0) return;
    double n = pn_row_norm(x, D), dot = 0;
    if (n == 0) return;
    for (int64_t i = 0; i < D; i++) dot += g[i] * (x[i] / n);
    for (int64_t i = 0; i < D; i++) g[i] = kappa * (g[i] - (x[i] / n) * dot);
}

/* ---- expmap0 ------------------------------------------------------------------------------------------ */
/* (t sech²t − tanh t)/t³ = d/dt(tanh t / t) / t */
static double tanhc_d(double t) {
    if (t < 0.01) {
        double t2 = t * t;
        return -2.0 / 3 + t2 * (8.0 / 15 - t2 * 34.0 / 105);
    }
    double th = tanh(t), sech = 1.0 / cosh(t); /* cosh → inf gives sech = 0, fine */
    return (t * sech * sech - th) / (t * t * t);
}

static int expmap0_fwd(const pn_rowmap *m, const double *x, const double *y, double *out, double *bad) {
    int64_t D = m->D;
    double n = pn_row_norm(x, D), t = m->sc[SQC] * n;
    if (!isfinite(n)) {
        *bad = n;
        return 1;
    }
    /* CLAMP: the result's radius tanh(t)/√c is capped at the project radius (1 − EPS)/√c, so
     * a long tangent vector (tanh → 1 in float) lands strictly inside the ball */
    double r = tanh(t), F = t > 0 ? fmin(r, 1.0 - m->sc[EPS]) / t : 1.0;
    for (int64_t i = 0; i < D; i++) out[i] = F * x[i];
    return 0;
}

static void expmap0_bwd(const pn_rowmap *m, const double *x, const double *y, const double *g, double *gx,
                        double *gy) {
    int64_t D = m->D;
    double n = pn_row_norm(x, D), t = m->sc[SQC] * n;
    memcpy(gx, g, sizeof(double) * (size_t)D);
    if (t == 0) return; /* the limit: factor 1, identity Jacobian */
    double r = tanh(t);
    if (r > 1.0 - m->sc[EPS]) { /* capped: a radial projection to a fixed radius */
        double F = (1.0 - m->sc[EPS]) / t, dot = 0;
        for (int64_t i = 0; i < D; i++) dot += g[i] * x[i] / n;
        for (int64_t i = 0; i < D; i++) gx[i] = F * (g[i] - x[i] / n * dot);
        return;
    }
    /* out = f x, f = tanh t / t: gx = f g + c u(t) (g·x) x */
    double F = r / t, gxv = pn_row_dot(g, x, D);
    for (int64_t i = 0; i < D; i++) gx[i] = F * g[i];
    axpy_row(gx, m->sc[C_] * tanhc_d(t) * gxv, x, D);
}

/* ---- logmap0 ------------------------------------------------------------------------------------------ */
/* (z/(1 − z²) − artanh z)/z³ = d/dz(artanh z / z) / z */
static double atanhc_d(double z) {
    if (z < 0.01) {
        double z2 = z * z;
        return 2.0 / 3 + z2 * (4.0 / 5 + z2 * 6.0 / 7);
    }
    return (z / (1.0 - z * z) - atanh(z)) / (z * z * z);
}

static int logmap0_fwd(const pn_rowmap *m, const double *x, const double *y, double *out, double *bad) {
    int64_t D = m->D;
    double z;
    if (ball_check(m, x, &z)) {
        *bad = z;
        return 1;
    }
    if (z == 0) {
        memset(out, 0, sizeof(double) * (size_t)D);
        return 0;
    }
    /* out = artanh(min(z, AMAX))/√c · x̂ */
    double F = atanh(fmin(z, m->sc[AMAX])) / z;
    for (int64_t i = 0; i < D; i++) out[i] = F * x[i];
    return 0;
}

static void logmap0_bwd(const pn_rowmap *m, const double *x, const double *y, const double *g, double *gx,
                        double *gy) {
    int64_t D = m->D;
    double z;
    ball_check(m, x, &z);
    memcpy(gx, g, sizeof(double) * (size_t)D);
    if (z == 0) return;
    double n = z / m->sc[SQC];
    if (z > m->sc[AMAX]) { /* past the clamp: a fixed radius, i.e. a radial projection */
        double F = atanh(m->sc[AMAX]) / z, dot = 0;
        for (int64_t i = 0; i < D; i++) dot += g[i] * x[i] / n;
        for (int64_t i = 0; i < D; i++) gx[i] = F * (g[i] - x[i] / n * dot);
        return;
    }
    /* out = f x, f = artanh z / z: gx = f g + c a(z) (g·x) x */
    double F = atanh(z) / z, gxv = pn_row_dot(g, x, D);
    for (int64_t i = 0; i < D; i++) gx[i] = F * g[i];
    axpy_row(gx, m->sc[C_] * atanhc_d(z) * gxv, x, D);
}

/* ---- project ------------------------------------------------------------------------------------------ */
static int project_fwd(const pn_rowmap *m, const double *x, const double *y, double *out, double *bad) {
    int64_t D = m->D;
    double n = pn_row_norm(x, D), rmax = (1.0 - m->sc[EPS]) / m->sc[SQC];
    if (!isfinite(n)) {
        *bad = n;
        return 1;
    }
    double F = n > rmax ? rmax / n : 1.0;
    for (int64_t i = 0; i < D; i++) out[i] = F * x[i];
    return 0;
}

static void project_bwd(const pn_rowmap *m, const double *x, const double *y, const double *g, double *gx,
                        double *gy) {
    int64_t D = m->D;
    double n = pn_row_norm(x, D), rmax = (1.0 - m->sc[EPS]) / m->sc[SQC];
    memcpy(gx, g, sizeof(double) * (size_t)D);
    radial_bw(x, D, n > rmax ? rmax / n : 1.0, gx);
}

/* ---- mobius_add ------------------------------------------------------------------------------------------ */
/* The scalars of x ⊕ y */
typedef struct {
    double x2, y2, xy, A, B, den;
} mob;

static int mob_setup(const pn_rowmap *m, const double *x, const double *y, mob *s, double *bad) {
    if (ball_check(m, x, bad)) return 1;
    if (ball_check(m, y, bad)) return 2;
    int64_t D = m->D;
    double c = m->sc[C_];
    s->x2 = pn_row_dot(x, x, D);
    s->y2 = pn_row_dot(y, y, D);
    s->xy = pn_row_dot(x, y, D);
    s->A = 1.0 + 2.0 * c * s->xy + c * s->y2;
    s->B = 1.0 - c * s->x2;
    double u = 1.0 + c * s->xy;
    s->den = fmax(u * u + c * c * fmax(s->x2 * s->y2 - s->xy * s->xy, 0.0), DBL_MIN);
    return 0;
}

static int mobius_fwd(const pn_rowmap *m, const double *x, const double *y, double *out, double *bad) {
    mob s;
    int rej = mob_setup(m, x, y, &s, bad);
    if (rej) return rej;
    for (int64_t i = 0; i < m->D; i++) out[i] = (s.A * x[i] + s.B * y[i]) / s.den;
    return 0;
}

/* with ĝ = g/den, out = (A x + B y)/den, A = 1 + 2c x·y + c‖y‖², B = 1 − c‖x‖²:
 *   gx = A ĝ + 2c (ĝ·x) y − 2c (ĝ·y) x − (ĝ·out)(2c y + 2c² ‖y‖² x)
 *   gy = B ĝ + 2c (ĝ·x)(x + y) − (ĝ·out)(2c x + 2c² ‖x‖² y)
 * (den is differentiated in its expanded form 1 + 2c x·y + c²‖x‖²‖y‖²) */
static void mobius_bwd(const pn_rowmap *m, const double *x, const double *y, const double *g, double *gx,
                       double *gy) {
    int64_t D = m->D;
    double c = m->sc[C_], bad;
    mob s = {0}; /* the forward accepted this row, so setup fills s; zeroed for the compiler */
    mob_setup(m, x, y, &s, &bad);
    double gX = 0, gY = 0, gO = 0;
    for (int64_t i = 0; i < D; i++) {
        double gh = g[i] / s.den, xi = x[i], yi = y[i];
        gX += gh * xi;
        gY += gh * yi;
        gO += gh * (s.A * xi + s.B * yi) / s.den;
    }
    for (int64_t i = 0; i < D; i++) {
        double gh = g[i] / s.den, xi = x[i], yi = y[i];
        gx[i] = s.A * gh + 2 * c * gX * yi - 2 * c * gY * xi - gO * (2 * c * yi + 2 * c * c * s.y2 * xi);
        gy[i] = s.B * gh + 2 * c * gX * (xi + yi) - gO * (2 * c * xi + 2 * c * c * s.x2 * yi);
    }
}

/* ---- dist ------------------------------------------------------------------------------------------------ */
/* z = √c δ / √den with δ = ‖x − y‖, den = (1 − c x·y)² + c²(‖x‖²‖y‖² − (x·y)²) */
typedef struct {
    double x2, y2, xy, delta, den, z;
} dst;

static int dist_setup(const pn_rowmap *m, const double *x, const double *y, dst *s, double *bad) {
    if (ball_check(m, x, bad)) return 1;
    if (ball_check(m, y, bad)) return 2;
    int64_t D = m->D;
    double c = m->sc[C_], d2 = 0;
    for (int64_t i = 0; i < D; i++) d2 += (x[i] - y[i]) * (x[i] - y[i]);
    s->delta = sqrt(d2);
    s->x2 = pn_row_dot(x, x, D);
    s->y2 = pn_row_dot(y, y, D);
    s->xy = pn_row_dot(x, y, D);
    double u = 1.0 - c * s->xy;
    s->den = fmax(u * u + c * c * fmax(s->x2 * s->y2 - s->xy * s->xy, 0.0), DBL_MIN);
    s->z = m->sc[SQC] * s->delta / sqrt(s->den);
    return 0;
}

static int dist_fwd(const pn_rowmap *m, const double *x, const double *y, double *out, double *bad) {
    dst s;
    int rej = dist_setup(m, x, y, &s, bad);
    if (rej) return rej;
    out[0] = 2.0 / m->sc[SQC] * atanh(fmin(s.z, m->sc[AMAX]));
    return 0;
}

/* dd/dz = (2/√c)/(1 − z²);
 * ∂z/∂x = √c [ (x − y)/(δ √den) − δ/(2 den^{3/2}) (−2c y + 2c² ‖y‖² x) ]
 * ∂z/∂y = √c [ (y − x)/(δ √den) − δ/(2 den^{3/2}) (−2c x + 2c² ‖x‖² y) ]
 * At x = y (δ = 0) the distance has a cone point; its gradient is taken as 0 there
 * (and it is finite, ≈ the conformal factor, at any nearby pair). Past the artanh clamp
 * the distance is constant: gradient 0. */
static void dist_bwd(const pn_rowmap *m, const double *x, const double *y, const double *g, double *gx, double *gy) {
    int64_t D = m->D;
    double c = m->sc[C_], sq = m->sc[SQC], bad;
    dst s = {0}; /* as in mobius_bwd */
    dist_setup(m, x, y, &s, &bad);
    if (s.delta == 0 || s.z > m->sc[AMAX]) {
        memset(gx, 0, sizeof(double) * (size_t)D);
        memset(gy, 0, sizeof(double) * (size_t)D);
        return;
    }
    double G = g[0] * (2.0 / sq) / (1.0 - s.z * s.z) * sq;
    double rd = sqrt(s.den), t1 = 1.0 / (s.delta * rd), t2 = s.delta / (2.0 * s.den * rd);
    for (int64_t i = 0; i < D; i++) {
        double xi = x[i], yi = y[i];
        gx[i] = G * ((xi - yi) * t1 - t2 * (-2 * c * yi + 2 * c * c * s.y2 * xi));
        gy[i] = G * ((yi - xi) * t1 - t2 * (-2 * c * xi + 2 * c * c * s.x2 * yi));
    }
}

/* ---- Klein conversions ---------------------------------------------------------------------------------- */
/* Poincaré → Klein: k = f p, f = 2/(1 + c‖p‖²), then the Klein cap (factor kk) */
static void p2k_setup(const pn_rowmap *m, const double *x, double *f, double *kk) {
    double p2 = pn_row_dot(x, x, m->D);
    *f = 2.0 / (1.0 + m->sc[C_] * p2);
    double rho = m->sc[SQC] * *f * sqrt(p2); /* √c ‖k‖ */
    *kk = rho > m->sc[KMAX] ? m->sc[KMAX] / rho : 1.0;
}

static int p2k_fwd(const pn_rowmap *m, const double *x, const double *y, double *out, double *bad) {
    double f, kk;
    if (ball_check(m, x, bad)) return 1;
    p2k_setup(m, x, &f, &kk);
    for (int64_t i = 0; i < m->D; i++) out[i] = kk * f * x[i];
    return 0;
}

/* gp = f g_k − c f² (g_k·p) p, with g_k the gradient through the cap */
static void p2k_bwd(const pn_rowmap *m, const double *x, const double *y, const double *g, double *gx, double *gy) {
    int64_t D = m->D;
    double f, kk;
    p2k_setup(m, x, &f, &kk);
    memcpy(gx, g, sizeof(double) * (size_t)D);
    radial_bw(x, D, kk, gx); /* k is parallel to p, so the cap is a radial projection along p̂ */
    double gp = pn_row_dot(gx, x, D), c = m->sc[C_];
    for (int64_t i = 0; i < D; i++) gx[i] = f * gx[i] - c * f * f * gp * x[i];
}

/* Hyperboloid (…, D) → Klein (…, D−1): k = x₋/(√c x_d), then the Klein cap */
static int h2k_fwd(const pn_rowmap *m, const double *x, const double *y, double *out, double *bad) {
    int64_t d = m->D - 1;
    double t = x[d], nu = pn_row_norm(x, d);
    double rho = t > 0 ? nu / t : INFINITY; /* √c ‖k‖ */
    if (!(rho <= 1.0 + m->sc[TOL]) || !isfinite(t)) {
        *bad = rho;
        return 1;
    }
    double kk = rho > m->sc[KMAX] ? m->sc[KMAX] / rho : 1.0, F = kk / (m->sc[SQC] * t);
    for (int64_t j = 0; j < d; j++) out[j] = F * x[j];
    return 0;
}

/* k_j = u_j/(√c t): gu = g_k/(√c t), gt = −(g_k·u)/(√c t²) */
static void h2k_bwd(const pn_rowmap *m, const double *x, const double *y, const double *g, double *gx, double *gy) {
    int64_t d = m->D - 1;
    double t = x[d], nu = pn_row_norm(x, d), rho = nu / t, sq = m->sc[SQC];
    memcpy(gx, g, sizeof(double) * (size_t)d);
    radial_bw(x, d, rho > m->sc[KMAX] ? m->sc[KMAX] / rho : 1.0, gx);
    double gu = pn_row_dot(gx, x, d);
    for (int64_t j = 0; j < d; j++) gx[j] /= sq * t;
    gx[d] = -gu / (sq * t * t);
}

/* Klein: s = √max(1 − c‖k‖², KMIN); rejects √c‖k‖ > 1 + TOL */
static int klein_s(const pn_rowmap *m, const double *k, double *s, double *bad) {
    double n = pn_row_norm(k, m->D), rho = m->sc[SQC] * n;
    *s = 1.0;
    if (!(rho <= 1.0 + m->sc[TOL])) {
        *bad = rho;
        return 1;
    }
    double s2 = 1.0 - rho * rho;
    *s = sqrt(fmax(s2, m->sc[KMIN]));
    return s2 > m->sc[KMIN] ? 0 : -1; /* -1: floored (gradient through s is 0) */
}

/* Klein → Poincaré: p = k/(1 + s) */
static int k2p_fwd(const pn_rowmap *m, const double *x, const double *y, double *out, double *bad) {
    double s;
    if (klein_s(m, x, &s, bad) > 0) return 1;
    for (int64_t i = 0; i < m->D; i++) out[i] = x[i] / (1.0 + s);
    return 0;
}

/* f = 1/(1+s), ∂f/∂k = c f² k/s: gk = f g + c f² (g·k)/s k */
static void k2p_bwd(const pn_rowmap *m, const double *x, const double *y, const double *g, double *gx, double *gy) {
    int64_t D = m->D;
    double s, bad;
    int floored = klein_s(m, x, &s, &bad) < 0;
    double f = 1.0 / (1.0 + s), gk = pn_row_dot(g, x, D);
    for (int64_t i = 0; i < D; i++) gx[i] = f * g[i];
    if (!floored) axpy_row(gx, m->sc[C_] * f * f * gk / s, x, D);
}

/* Klein (…, D) → hyperboloid (…, D+1): x₋ = k/s, x_d = 1/(√c s) */
static int k2h_fwd(const pn_rowmap *m, const double *x, const double *y, double *out, double *bad) {
    double s;
    if (klein_s(m, x, &s, bad) > 0) return 1;
    for (int64_t i = 0; i < m->D; i++) out[i] = x[i] / s;
    out[m->D] = 1.0 / (m->sc[SQC] * s);
    return 0;
}

/* ∂s/∂k = −c k/s: gk = g₋/s + c k [(g₋·k) + g_d/√c] / s³ */
static void k2h_bwd(const pn_rowmap *m, const double *x, const double *y, const double *g, double *gx, double *gy) {
    int64_t D = m->D;
    double s, bad;
    int floored = klein_s(m, x, &s, &bad) < 0;
    double gk = pn_row_dot(g, x, D);
    for (int64_t i = 0; i < D; i++) gx[i] = g[i] / s;
    if (!floored) axpy_row(gx, m->sc[C_] * (gk + g[D] / m->sc[SQC]) / (s * s * s), x, D);
}

/* block versions of every row kernel above (rowmap.h) */
PN_ROWMAP_ROWS(expmap0)
PN_ROWMAP_ROWS(logmap0)
PN_ROWMAP_ROWS(project)
PN_ROWMAP_ROWS(mobius)
PN_ROWMAP_ROWS(dist)
PN_ROWMAP_ROWS(p2k)
PN_ROWMAP_ROWS(h2k)
PN_ROWMAP_ROWS(k2p)
PN_ROWMAP_ROWS(k2h)

/* ---- public entry points ---------------------------------------------------------------------------------- */
/* checks shared by every toolkit op; fills the constants of the header comment */
static pn_status setup(pn_rowmap *m, const char *op, pn_tensor *x, pn_tensor *y, double c) {
    PN_TRY(pn_rowmap_check(op, x, y));
    if (!(c > 0) || isinf(c))
        return pn_error(PN_ERR_ARG, "%s: x %s: curvature argument c = %g must be a finite number > 0 (the space has "
                        "curvature -c)", op, pn_shape_str(x), c);
    if (x->sizes[x->nd - 1] < 1)
        return pn_error(PN_ERR_SHAPE, "%s: x %s has no coordinates in the last dim", op, pn_shape_str(x));
    bool f32 = x->dt == PN_F32;
    double eps = f32 ? 4e-3 : 1e-5, r = 1.0 - eps;
    *m = (pn_rowmap){.op = op, .arg = {"x", "y"}, .nin = y ? 2 : 1};
    m->D = m->Dout = x->sizes[x->nd - 1];
    m->sc[C_] = c;
    m->sc[SQC] = sqrt(c);
    m->sc[EPS] = eps;
    m->sc[TOL] = f32 ? 1e-5 : 1e-12;
    m->sc[KMIN] = eps * eps / 4;
    m->sc[KMAX] = 2 * r / (1 + r * r);
    m->sc[AMAX] = f32 ? 1.0 - 1e-7 : 1.0 - 1e-15;
    return PN_OK;
}

#define BALL_FMT "sqrt(c)*|point| = %%g with c = %g: outside the Poincare ball or not finite (needs < 1; hyper.project " \
    "moves points inside)"

pn_tensor *pn_hyp_expmap0(pn_tensor *x, double c) {
    pn_rowmap m;
    if (setup(&m, "hyper.expmap0", x, NULL, c)) return NULL;
    PN_ROWMAP_USE(m, expmap0);
    m.bad_fmt = "|v| = %g: a tangent vector must be finite";
    return pn_rowmap_apply(&m, x, NULL);
}

pn_tensor *pn_hyp_logmap0(pn_tensor *x, double c) {
    pn_rowmap m;
    char fmt[200];
    if (setup(&m, "hyper.logmap0", x, NULL, c)) return NULL;
    snprintf(fmt, sizeof fmt, BALL_FMT, c);
    PN_ROWMAP_USE(m, logmap0);
    m.bad_fmt = fmt;
    return pn_rowmap_apply(&m, x, NULL);
}

pn_tensor *pn_hyp_project(pn_tensor *x, double c) {
    pn_rowmap m;
    if (setup(&m, "hyper.project", x, NULL, c)) return NULL;
    PN_ROWMAP_USE(m, project);
    m.bad_fmt = "|x| = %g: a point to project must be finite";
    return pn_rowmap_apply(&m, x, NULL);
}

pn_tensor *pn_hyp_mobius_add(pn_tensor *x, pn_tensor *y, double c) {
    pn_rowmap m;
    char fmt[200];
    if (!y) return pn_error_null(PN_ERR_ARG, "hyper.mobius_add: y is nil");
    if (setup(&m, "hyper.mobius_add", x, y, c)) return NULL;
    snprintf(fmt, sizeof fmt, BALL_FMT, c);
    PN_ROWMAP_USE(m, mobius);
    m.bad_fmt = fmt;
    return pn_rowmap_apply(&m, x, y);
}

pn_tensor *pn_hyp_dist(pn_tensor *x, pn_tensor *y, double c) {
    pn_rowmap m;
    char fmt[200];
    if (!y) return pn_error_null(PN_ERR_ARG, "hyper.dist: y is nil");
    if (setup(&m, "hyper.dist", x, y, c)) return NULL;
    snprintf(fmt, sizeof fmt, BALL_FMT, c);
    m.Dout = 0;
    PN_ROWMAP_USE(m, dist);
    m.bad_fmt = fmt;
    return pn_rowmap_apply(&m, x, y);
}

static const char *model_name(int model) {
    switch (model) {
    case PN_MODEL_HYPERBOLOID: return "hyperboloid";
    case PN_MODEL_HALFSPACE: return "halfspace";
    case PN_MODEL_POINCARE: return "poincare";
    case PN_MODEL_KLEIN: return "klein";
    default: return "unknown";
    }
}

pn_tensor *pn_hyp_to_klein(pn_tensor *x, int from_model, double c) {
    pn_rowmap m;
    char fmt[200];
    const char *op = "hyper.to_klein";
    if (setup(&m, op, x, NULL, c)) return NULL;
    if (from_model == PN_MODEL_POINCARE) {
        snprintf(fmt, sizeof fmt, BALL_FMT, c);
        PN_ROWMAP_USE(m, p2k);
    } else if (from_model == PN_MODEL_HYPERBOLOID) {
        if (m.D < 2)
            return pn_error_null(PN_ERR_SHAPE, "%s: x %s: a hyperboloid point needs at least 2 coordinates "
                                 "(space-like ones, then the time-like one last)", op, pn_shape_str(x));
        snprintf(fmt, sizeof fmt, "|x_-|/x_d = %%g: not on the upper sheet of the hyperboloid (needs "
                 "0 <= |x_-| < x_d, time-like coordinate last)");
        m.Dout = m.D - 1;
        PN_ROWMAP_USE(m, h2k);
    } else {
        return pn_error_null(PN_ERR_ARG, "%s: x %s: from model %d (%s) is not supported; use hyperboloid or poincare",
                             op, pn_shape_str(x), from_model, model_name(from_model));
    }
    m.bad_fmt = fmt;
    return pn_rowmap_apply(&m, x, NULL);
}

pn_tensor *pn_hyp_from_klein(pn_tensor *x, int to_model, double c) {
    pn_rowmap m;
    char fmt[200];
    const char *op = "hyper.from_klein";
    if (setup(&m, op, x, NULL, c)) return NULL;
    snprintf(fmt, sizeof fmt, "sqrt(c)*|k| = %%g with c = %g: outside the Klein ball (needs < 1)", c);
    if (to_model == PN_MODEL_POINCARE) {
        PN_ROWMAP_USE(m, k2p);
    } else if (to_model == PN_MODEL_HYPERBOLOID) {
        m.Dout = m.D + 1;
        PN_ROWMAP_USE(m, k2h);
    } else {
        return pn_error_null(PN_ERR_ARG, "%s: x %s: to model %d (%s) is not supported; use hyperboloid or poincare",
                             op, pn_shape_str(x), to_model, model_name(to_model));
    }
    m.bad_fmt = fmt;
    return pn_rowmap_apply(&m, x, NULL);
}

/* hyperbolic_rows.h — private to core/attention/: the row kernels of the Poincaré-ball toolkit and
 * the Klein conversions (hyperbolic.c, see its header comment for the models, constants and
 * clamps): forward and vector-Jacobian product of one point, in double. PN_HD: hyperbolic.c
 * instantiates its CPU block loops over them (PN_ROWMAP_ROWS) and
 * core/cuda/attention/rowmap.cu calls the same functions from its device kernels. */
#ifndef PN_ATTENTION_HYPERBOLIC_ROWS_H
#define PN_ATTENTION_HYPERBOLIC_ROWS_H

#include "rowmap.h"

#include <float.h>

/* sc[] layout shared by every kernel here */
enum { C_ = 0, SQC = 1, EPS = 2, TOL = 3, KMIN = 4, KMAX = 5, AMAX = 6 };

PN_HD static inline void axpy_row(double *dst, double a, const double *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] += a * x[i];
}

/* *z = √c‖x‖; returns nonzero when x is not in the ball (up to TOL), inf or NaN */
PN_HD static inline int ball_check(const pn_rowmap *m, const double *x, double *z) {
    *z = m->sc[SQC] * pn_row_norm(x, m->D);
    return !(*z <= 1.0 + m->sc[TOL]);
}

/* g (w.r.t. x' = κ x) → g w.r.t. x, where κ = r/‖x‖ for a fixed radius r (a radial
 * projection, as in project and the caps): ∂x'/∂x = κ (I − x̂ x̂ᵀ). κ = 1: identity. */
PN_HD static inline void radial_bw(const double *x, int64_t D, double kappa, double *g) {
    if (kappa == 1.0) return;
    double n = pn_row_norm(x, D), dot = 0;
    if (n == 0) return;
    for (int64_t i = 0; i < D; i++) dot += g[i] * (x[i] / n);
    for (int64_t i = 0; i < D; i++) g[i] = kappa * (g[i] - (x[i] / n) * dot);
}

/* ---- expmap0 ------------------------------------------------------------------------------------------ */
/* (t sech²t − tanh t)/t³ = d/dt(tanh t / t) / t */
PN_HD static inline double tanhc_d(double t) {
    if (t < 0.01) {
        double t2 = t * t;
        return -2.0 / 3 + t2 * (8.0 / 15 - t2 * 34.0 / 105);
    }
    double th = tanh(t), sech = 1.0 / cosh(t); /* cosh → inf gives sech = 0, fine */
    return (t * sech * sech - th) / (t * t * t);
}

PN_HD static inline int expmap0_fwd(const pn_rowmap *m, const double *x, const double *y, double *out, double *bad) {
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

PN_HD static inline void expmap0_bwd(const pn_rowmap *m, const double *x, const double *y, const double *g, double *gx,
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
PN_HD static inline double atanhc_d(double z) {
    if (z < 0.01) {
        double z2 = z * z;
        return 2.0 / 3 + z2 * (4.0 / 5 + z2 * 6.0 / 7);
    }
    return (z / (1.0 - z * z) - atanh(z)) / (z * z * z);
}

PN_HD static inline int logmap0_fwd(const pn_rowmap *m, const double *x, const double *y, double *out, double *bad) {
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

PN_HD static inline void logmap0_bwd(const pn_rowmap *m, const double *x, const double *y, const double *g, double *gx,
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
PN_HD static inline int project_fwd(const pn_rowmap *m, const double *x, const double *y, double *out, double *bad) {
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

PN_HD static inline void project_bwd(const pn_rowmap *m, const double *x, const double *y, const double *g, double *gx,
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

PN_HD static inline int mob_setup(const pn_rowmap *m, const double *x, const double *y, mob *s, double *bad) {
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

PN_HD static inline int mobius_fwd(const pn_rowmap *m, const double *x, const double *y, double *out, double *bad) {
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
PN_HD static inline void mobius_bwd(const pn_rowmap *m, const double *x, const double *y, const double *g, double *gx,
                       double *gy) {
    int64_t D = m->D;
    double c = m->sc[C_], bad;
    mob s = {0, 0, 0, 0, 0, 0}; /* the forward accepted this row, so setup fills s; zeroed for the compiler */
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

PN_HD static inline int dist_setup(const pn_rowmap *m, const double *x, const double *y, dst *s, double *bad) {
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

PN_HD static inline int dist_fwd(const pn_rowmap *m, const double *x, const double *y, double *out, double *bad) {
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
PN_HD static inline void dist_bwd(const pn_rowmap *m, const double *x, const double *y, const double *g, double *gx, double *gy) {
    int64_t D = m->D;
    double c = m->sc[C_], sq = m->sc[SQC], bad;
    dst s = {0, 0, 0, 0, 0, 0}; /* as in mobius_bwd */
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
PN_HD static inline void p2k_setup(const pn_rowmap *m, const double *x, double *f, double *kk) {
    double p2 = pn_row_dot(x, x, m->D);
    *f = 2.0 / (1.0 + m->sc[C_] * p2);
    double rho = m->sc[SQC] * *f * sqrt(p2); /* √c ‖k‖ */
    *kk = rho > m->sc[KMAX] ? m->sc[KMAX] / rho : 1.0;
}

PN_HD static inline int p2k_fwd(const pn_rowmap *m, const double *x, const double *y, double *out, double *bad) {
    double f, kk;
    if (ball_check(m, x, bad)) return 1;
    p2k_setup(m, x, &f, &kk);
    for (int64_t i = 0; i < m->D; i++) out[i] = kk * f * x[i];
    return 0;
}

/* gp = f g_k − c f² (g_k·p) p, with g_k the gradient through the cap */
PN_HD static inline void p2k_bwd(const pn_rowmap *m, const double *x, const double *y, const double *g, double *gx, double *gy) {
    int64_t D = m->D;
    double f, kk;
    p2k_setup(m, x, &f, &kk);
    memcpy(gx, g, sizeof(double) * (size_t)D);
    radial_bw(x, D, kk, gx); /* k is parallel to p, so the cap is a radial projection along p̂ */
    double gp = pn_row_dot(gx, x, D), c = m->sc[C_];
    for (int64_t i = 0; i < D; i++) gx[i] = f * gx[i] - c * f * f * gp * x[i];
}

/* Hyperboloid (…, D) → Klein (…, D−1): k = x₋/(√c x_d), then the Klein cap */
PN_HD static inline int h2k_fwd(const pn_rowmap *m, const double *x, const double *y, double *out, double *bad) {
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
PN_HD static inline void h2k_bwd(const pn_rowmap *m, const double *x, const double *y, const double *g, double *gx, double *gy) {
    int64_t d = m->D - 1;
    double t = x[d], nu = pn_row_norm(x, d), rho = nu / t, sq = m->sc[SQC];
    memcpy(gx, g, sizeof(double) * (size_t)d);
    radial_bw(x, d, rho > m->sc[KMAX] ? m->sc[KMAX] / rho : 1.0, gx);
    double gu = pn_row_dot(gx, x, d);
    for (int64_t j = 0; j < d; j++) gx[j] /= sq * t;
    gx[d] = -gu / (sq * t * t);
}

/* Klein: s = √max(1 − c‖k‖², KMIN); rejects √c‖k‖ > 1 + TOL */
PN_HD static inline int klein_s(const pn_rowmap *m, const double *k, double *s, double *bad) {
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
PN_HD static inline int k2p_fwd(const pn_rowmap *m, const double *x, const double *y, double *out, double *bad) {
    double s;
    if (klein_s(m, x, &s, bad) > 0) return 1;
    for (int64_t i = 0; i < m->D; i++) out[i] = x[i] / (1.0 + s);
    return 0;
}

/* f = 1/(1+s), ∂f/∂k = c f² k/s: gk = f g + c f² (g·k)/s k */
PN_HD static inline void k2p_bwd(const pn_rowmap *m, const double *x, const double *y, const double *g, double *gx, double *gy) {
    int64_t D = m->D;
    double s, bad;
    int floored = klein_s(m, x, &s, &bad) < 0;
    double f = 1.0 / (1.0 + s), gk = pn_row_dot(g, x, D);
    for (int64_t i = 0; i < D; i++) gx[i] = f * g[i];
    if (!floored) axpy_row(gx, m->sc[C_] * f * f * gk / s, x, D);
}

/* Klein (…, D) → hyperboloid (…, D+1): x₋ = k/s, x_d = 1/(√c s) */
PN_HD static inline int k2h_fwd(const pn_rowmap *m, const double *x, const double *y, double *out, double *bad) {
    double s;
    if (klein_s(m, x, &s, bad) > 0) return 1;
    for (int64_t i = 0; i < m->D; i++) out[i] = x[i] / s;
    out[m->D] = 1.0 / (m->sc[SQC] * s);
    return 0;
}

/* ∂s/∂k = −c k/s: gk = g₋/s + c k [(g₋·k) + g_d/√c] / s³ */
PN_HD static inline void k2h_bwd(const pn_rowmap *m, const double *x, const double *y, const double *g, double *gx, double *gy) {
    int64_t D = m->D;
    double s, bad;
    int floored = klein_s(m, x, &s, &bad) < 0;
    double gk = pn_row_dot(g, x, D);
    for (int64_t i = 0; i < D; i++) gx[i] = g[i] / s;
    if (!floored) axpy_row(gx, m->sc[C_] * (gk + g[D] / m->sc[SQC]) / (s * s * s), x, D);
}

#endif /* PN_ATTENTION_HYPERBOLIC_ROWS_H */

/* reduce_math.h — the reductions' semantics written once for the CPU (ops/reduce.c) and the
 * device (cuda/ops/reduce.cu): the kinds, the accumulator (init, add one element, merge two
 * partial results, finish), and the backward passes' pointwise maps (the M_ ids that the
 * reduce_map kernel switches on). Private to those two files.
 *
 * Float inputs accumulate in double. NaN propagates through max/min/inf-norm; empty
 * reductions give 0 (sum), 1 (prod), NaN (mean), -inf (logsumexp), 0 (norm). */
#ifndef PN_REDUCE_MATH_H
#define PN_REDUCE_MATH_H

#include "../internal.h"

/* internal kinds: the first six are pn_reduce_op, the rest are norms */
enum { K_SUM = PN_SUM, K_MEAN = PN_MEAN, K_MAX = PN_MAX, K_MIN = PN_MIN, K_LSE = PN_LOGSUMEXP,
       K_PROD = PN_PROD, K_L1, K_L2, K_LINF, K_LP };

/* ---- accumulators --------------------------------------------------------------------- */
/* a: the running value; b: logsumexp's sum of exp(x - a) */
typedef struct { double a, b; } pn_acc;

PN_HD static inline pn_acc pn_acc_make(double a, double b) {
    pn_acc r;
    r.a = a;
    r.b = b;
    return r;
}

PN_HD static inline pn_acc pn_acc_init(int k) {
    switch (k) {
    case K_PROD: return pn_acc_make(1, 0);
    case K_MAX: case K_LSE: return pn_acc_make(-INFINITY, 0);
    case K_MIN: return pn_acc_make(INFINITY, 0);
    default: return pn_acc_make(0, 0); /* sums and norms (|x| >= 0, so 0 also starts the inf-norm) */
    }
}

/* online logsumexp: keep the running max a and sum b of exp(x - a) */
PN_HD static inline void pn_lse_add(pn_acc *s, double v) {
    if (v == -INFINITY) return; /* contributes exp(-inf) = 0; also avoids -inf - -inf */
    if (v > s->a) {
        s->b = s->b * exp(s->a - v) + 1;
        s->a = v;
    } else if (v == s->a) {
        s->b += 1; /* also +inf == +inf, where exp(inf - inf) would be NaN */
    } else {
        s->b += exp(v - s->a); /* NaN v or a: NaN, as it should */
    }
}

PN_HD static inline void pn_acc_add(int k, double p, pn_acc *s, double v) {
    switch (k) {
    case K_SUM: case K_MEAN: s->a += v; break;
    case K_PROD: s->a *= v; break;
    case K_MAX: if (v > s->a || isnan(v)) s->a = v; break; /* once NaN, nothing compares greater */
    case K_MIN: if (v < s->a || isnan(v)) s->a = v; break;
    case K_LINF: v = fabs(v); if (v > s->a || isnan(v)) s->a = v; break;
    case K_L1: s->a += fabs(v); break;
    case K_L2: s->a += v * v; break;
    case K_LP: s->a += pow(fabs(v), p); break;
    case K_LSE: pn_lse_add(s, v); break;
    }
}

/* Two partial results of one output (u before v). A logsumexp part that saw a NaN must carry
 * it in a (as the two-pass runs return it), or a later +inf part would hide it. */
PN_HD static inline pn_acc pn_acc_merge(int k, pn_acc u, pn_acc v) {
    switch (k) {
    case K_PROD: u.a *= v.a; return u;
    case K_MAX: case K_LINF: return (v.a > u.a || (isnan(v.a) && !isnan(u.a))) ? v : u;
    case K_MIN: return (v.a < u.a || (isnan(v.a) && !isnan(u.a))) ? v : u;
    case K_LSE: {
        if (v.a == -INFINITY) return u;
        if (u.a == -INFINITY) return v;
        if (isnan(u.a) || isnan(v.a)) return pn_acc_make(NAN, NAN);
        double m = u.a > v.a ? u.a : v.a;
        if (m == INFINITY) return pn_acc_make(INFINITY, (u.a == m ? u.b : 0) + (v.a == m ? v.b : 0));
        return pn_acc_make(m, u.b * exp(u.a - m) + v.b * exp(v.a - m));
    }
    default: u.a += v.a; return u;
    }
}

PN_HD static inline double pn_acc_final(int k, pn_acc s, int64_t R, double p) {
    switch (k) {
    case K_MEAN: return s.a / (double)R; /* R == 0: 0/0 = NaN, like torch */
    case K_L2: return sqrt(s.a);
    case K_LP: return pow(s.a, 1.0 / p);
    case K_LSE: return s.a == -INFINITY ? -INFINITY : s.a + log(s.b);
    default: return s.a;
    }
}

/* ---- the backward passes' pointwise maps: out = f(a, b, c; prm) ------------------------- */
enum { M_IS_EXT, M_SPLIT, M_SIGN_MUL, M_LSE_GRAD, M_IS_ZERO, M_ZERO_TO_ONE, M_MUL, M_PROD_GRAD, M_NORM_GRAD,
       M_COUNT };

/* mask of extreme positions: (f(x) == out) — f = |.| for the inf-norm (prm[0] != 0); NaN matches NaN */
PN_HD static inline double pn_m_is_ext(double x, double out, double unused, const double *prm) {
    (void)unused;
    if (prm[0]) x = fabs(x);
    return (x == out || (isnan(x) && isnan(out))) ? 1.0 : 0.0;
}
/* mask · g / count (· sign(x) for the inf-norm, so that 0 gets 0) */
PN_HD static inline double pn_m_split(double m, double g, double cnt, const double *prm) {
    (void)prm;
    return m * g / cnt;
}
PN_HD static inline double pn_m_sign_mul(double v, double x, double unused, const double *prm) {
    (void)unused, (void)prm;
    return x > 0 ? v : x < 0 ? -v : 0.0;
}
PN_HD static inline double pn_m_lse_grad(double x, double out, double g, const double *prm) {
    (void)prm;
    return out == -INFINITY ? 0.0 : g * exp(x - out);
}
PN_HD static inline double pn_m_is_zero(double x, double u1, double u2, const double *prm) {
    (void)u1, (void)u2, (void)prm;
    return x == 0 ? 1.0 : 0.0;
}
PN_HD static inline double pn_m_zero_to_one(double x, double u1, double u2, const double *prm) {
    (void)u1, (void)u2, (void)prm;
    return x == 0 ? 1.0 : x;
}
PN_HD static inline double pn_m_mul(double a, double b, double u, const double *prm) {
    (void)u, (void)prm;
    return a * b;
}
/* gp = g · (product of the non-zero elements), zc = number of zeros in the group */
PN_HD static inline double pn_m_prod_grad(double x, double gp, double zc, const double *prm) {
    (void)prm;
    if (zc == 0) return gp / x;
    if (zc == 1) return x == 0 ? gp : 0.0;
    return 0.0;
}
/* g · sign(x)|x|^(p-1) / out^(p-1): p = 1 gives g·sign(x), p = 2 gives g·x/out; 0 where x or out is 0 */
PN_HD static inline double pn_m_norm_grad(double x, double out, double g, const double *prm) {
    double p = prm[0];
    if (x == 0 || out == 0) return 0.0;
    double sgn = x > 0 ? 1.0 : -1.0;
    if (p == 1) return g * sgn;
    if (p == 2) return g * x / out;
    return g * sgn * pow(fabs(x) / out, p - 1);
}

/* map fn applied to one element (the device's switch; the CPU holds the same functions in a table) */
PN_HD static inline double pn_reduce_map_apply(int fn, double a, double b, double c, const double *prm) {
    switch (fn) {
    case M_IS_EXT: return pn_m_is_ext(a, b, c, prm);
    case M_SPLIT: return pn_m_split(a, b, c, prm);
    case M_SIGN_MUL: return pn_m_sign_mul(a, b, c, prm);
    case M_LSE_GRAD: return pn_m_lse_grad(a, b, c, prm);
    case M_IS_ZERO: return pn_m_is_zero(a, b, c, prm);
    case M_ZERO_TO_ONE: return pn_m_zero_to_one(a, b, c, prm);
    case M_MUL: return pn_m_mul(a, b, c, prm);
    case M_PROD_GRAD: return pn_m_prod_grad(a, b, c, prm);
    default: return pn_m_norm_grad(a, b, c, prm);
    }
}

#endif /* PN_REDUCE_MATH_H */

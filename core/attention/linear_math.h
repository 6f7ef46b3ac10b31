/* linear_math.h — the per-element maths of the linear-attention family (cosine.c, power.c,
 * rope.c, lin_state.c), written once for the CPU and the device (core/cuda/attention/{cosine,
 * power,rope,lin_state}.cu): dot products and the cosine normalisation in f64, integer powers,
 * n^{−σ}, the power form's log gates, and the symmetric power embedding φᵖ over its table's raw
 * arrays. PN_HD: __host__ __device__ under nvcc. Private to those files (linear.h includes it). */
#ifndef PN_ATTENTION_LINEAR_MATH_H
#define PN_ATTENTION_LINEAR_MATH_H

#include "../internal.h"

#include <math.h>

/* Cosine attention normalises x̂ = x / sqrt(‖x‖² + PN_COSINE_EPS): smooth everywhere, equal
 * to x/‖x‖ up to 1e-12 relative for ‖x‖ ≳ 1e-3, and a zero vector maps to zero with a
 * finite gradient (1e6·I). Used by the parallel forms and the recurrent state alike. */
#define PN_COSINE_EPS 1e-12

/* Largest supported power p and symmetric-power dimension C(D+p−1, p). */
#define PN_SYMPOW_MAX_P 32
#define PN_SYMPOW_MAX_DIM ((int64_t)1 << 28)

#define PN_SQRT2 1.41421356237309504880

PN_HD static inline double dotd(const double *a, const double *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* x (n) → x̂ = x·r with r = 1/sqrt(‖x‖² + eps); returns r. */
PN_HD static inline double cos_normalize(const double *x, double *xh, int64_t n) {
    double r = 1.0 / sqrt(dotd(x, x, n) + PN_COSINE_EPS);
    for (int64_t i = 0; i < n; i++) xh[i] = x[i] * r;
    return r;
}

/* Backward of x̂ = x·r: gx = r·gx̂ − r³ (x·gx̂) x. x, gxh, gx: (n) */
PN_HD static inline void cos_normalize_bw(const double *x, double r, const double *gxh, double *gx, int64_t n) {
    double c = r * r * r * dotd(x, gxh, n);
    for (int64_t i = 0; i < n; i++) gx[i] = r * gxh[i] - c * x[i];
}

/* x^p for an integer p ≥ 0 (exact repeated squaring; x = 0 gives 0 for p ≥ 1) */
PN_HD static inline double ipow(double x, int p) {
    double r = 1;
    while (p) {
        if (p & 1) r *= x;
        x *= x;
        p >>= 1;
    }
    return r;
}

/* σ(m) of a cosine head's stabiliser */
PN_HD static inline double cos_sigmoid(double m) { return 1.0 / (1.0 + exp(-m)); }

/* n^{−s} with n counted as at least 1 (cosine attention's row scale) */
PN_HD static inline double count_scale(int64_t n, double s) { return n > 1 ? exp(-s * log((double)n)) : 1.0; }

/* power attention: log g_ij = L_later − L_earlier from the cumulative log gates L */
PN_HD static inline double log_gate(const double *L, int64_t i, int64_t j) { return i >= j ? L[i] - L[j] : L[j] - L[i]; }

/* rope: the pair (x0, x1) rotated by the angle with cosine c and sine s */
PN_HD static inline void rope_rotate(double x0, double x1, double c, double s, double *y0, double *y1) {
    *y0 = x0 * c - x1 * s;
    *y1 = x0 * s + x1 * c;
}

/* rope backward of one pair: gx ← the inverse rotation of g; returns ∂angle = −g0·y1 + g1·y0
 * (y the rotated x) when want_ga, else 0 */
PN_HD static inline double rope_pair_bw(double x0, double x1, double g0, double g1, double c, double s, int want_ga,
                                        double *gx0, double *gx1) {
    double ga = 0;
    if (want_ga) {
        double y0, y1;
        rope_rotate(x0, x1, c, s, &y0, &y1);
        ga = -g0 * y1 + g1 * y0;
    }
    *gx0 = g0 * c + g1 * s;
    *gx1 = -g0 * s + g1 * c;
    return ga;
}

/* ---- the symmetric power embedding φᵖ ----------------------------------------------------
 * Monomials of degree p in D variables, one per multiset i_1 ≤ … ≤ i_p, in lexicographic
 * order; φ_α(x) = sqrt(p!/Π_d m_d!) Π_r x_{i_r} with m_d the multiplicity of d in α, so that
 * φ(q)·φ(k) = Σ_α (p!/Π m_d!) Π (q_d k_d)^{m_d} = (q·k)^p (multinomial theorem). */
typedef struct pn_sympow_table {
    int64_t D;
    int p;
    int64_t Dp;    /* C(D+p−1, p) */
    int32_t *idx;  /* (Dp, p): the coordinates of each monomial, nondecreasing */
    double *w;     /* (Dp): sqrt of the multinomial coefficient */
} pn_sympow_table;

/* p = 2, the common case, without the index table: φ = (x_a x_b, a ≤ b), √2 off the diagonal,
 * in the table's order (a-major). The inner loops run over contiguous b. */
PN_HD static inline void sympow2_apply(int64_t D, const double *x, double *phi) {
    for (int64_t a = 0; a < D; a++) {
        const double xa = x[a], xs = PN_SQRT2 * xa;
        *phi++ = xa * xa;
        for (int64_t b = a + 1; b < D; b++) *phi++ = xs * x[b];
    }
}

PN_HD static inline void sympow2_grad(int64_t D, const double *x, const double *gphi, double *gx) {
    for (int64_t a = 0; a < D; a++) {
        const double xs = PN_SQRT2 * x[a];
        double acc = 2 * x[a] * gphi[0];
        for (int64_t b = a + 1; b < D; b++) {
            const double g = gphi[b - a];
            acc += PN_SQRT2 * g * x[b];
            gx[b] += xs * g;
        }
        gx[a] += acc;
        gphi += D - a;
    }
}

/* x (D) → phi (Dp), from the table's arrays idx (Dp, p) and w (Dp) (unused for p = 2) */
PN_HD static inline void sympow_apply_raw(int64_t D, int p, int64_t Dp, const int32_t *idx, const double *w,
                                          const double *x, double *phi) {
    if (p == 2) {
        sympow2_apply(D, x, phi);
        return;
    }
    for (int64_t a = 0; a < Dp; a++) {
        const int32_t *ix = idx + a * p;
        double v = w[a];
        for (int r = 0; r < p; r++) v *= x[ix[r]];
        phi[a] = v;
    }
}

/* gx (D) += J_φ(x)ᵀ gphi, gphi (Dp) */
PN_HD static inline void sympow_grad_raw(int64_t D, int p, int64_t Dp, const int32_t *idx, const double *w,
                                         const double *x, const double *gphi, double *gx) {
    if (p == 2) {
        sympow2_grad(D, x, gphi, gx);
        return;
    }
    double pre[PN_SYMPOW_MAX_P + 1];
    for (int64_t a = 0; a < Dp; a++) {
        if (gphi[a] == 0) continue;
        const int32_t *ix = idx + a * p;
        /* ∂/∂x_{i_r} of Π x = prefix·suffix products (exact when some x are 0) */
        pre[0] = 1;
        for (int r = 0; r < p; r++) pre[r + 1] = pre[r] * x[ix[r]];
        double suf = gphi[a] * w[a];
        for (int r = p - 1; r >= 0; r--) {
            gx[ix[r]] += pre[r] * suf;
            suf *= x[ix[r]];
        }
    }
}

#endif /* PN_ATTENTION_LINEAR_MATH_H */

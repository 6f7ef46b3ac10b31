/* linear.h — private helpers shared by the linear-attention files (cosine.c, power.c,
 * rope.c, lin_state.c). Not part of the public API.
 *
 * Every linear-attention kernel works one (batch, head) pair at a time on contiguous
 * (B, H, N, D) data, with f64 accumulators for both f32 and f64 tensors: rows are loaded
 * into double scratch (ld_row), the O(D·Dv) state work runs in double, results are
 * stored back in the tensor's dtype (st_row). The state sums run over the whole
 * sequence, so f64 accumulation keeps long sequences exact enough for the parallel,
 * chunked and recurrent forms to agree. */
#ifndef PN_ATTENTION_LINEAR_H
#define PN_ATTENTION_LINEAR_H

#include "../backend.h"

/* The chunked forms call BLAS from inside our own OpenMP loop over (b, h), with OpenBLAS's
 * threads off (PN_BLAS_SERIAL_*): chunk GEMMs are too small to split. */
#include "../blas.h"

/* Cosine attention normalises x̂ = x / sqrt(‖x‖² + PN_COSINE_EPS): smooth everywhere, equal
 * to x/‖x‖ up to 1e-12 relative for ‖x‖ ≳ 1e-3, and a zero vector maps to zero with a
 * finite gradient (1e6·I). Used by the parallel forms and the recurrent state alike. */
#define PN_COSINE_EPS 1e-12

/* Largest supported power p and symmetric-power dimension C(D+p−1, p). */
#define PN_SYMPOW_MAX_P 32
#define PN_SYMPOW_MAX_DIM ((int64_t)1 << 28)

/* p: (…) f32/f64 data; dst: (n) doubles ← p[off .. off+n) */
static inline void ld_row(const void *p, int dt, int64_t off, int64_t n, double *dst) {
    if (dt == PN_F32) {
        const float *s = (const float *)p + off;
        for (int64_t i = 0; i < n; i++) dst[i] = s[i];
    } else {
        memcpy(dst, (const double *)p + off, sizeof(double) * (size_t)n);
    }
}

/* p[off .. off+n) ← src (n) doubles */
static inline void st_row(void *p, int dt, int64_t off, int64_t n, const double *src) {
    if (dt == PN_F32) {
        float *d = (float *)p + off;
        for (int64_t i = 0; i < n; i++) d[i] = (float)src[i];
    } else {
        memcpy((double *)p + off, src, sizeof(double) * (size_t)n);
    }
}

static inline double dotd(const double *a, const double *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* x (n) → x̂ = x·r with r = 1/sqrt(‖x‖² + eps); returns r. */
static inline double cos_normalize(const double *x, double *xh, int64_t n) {
    double r = 1.0 / sqrt(dotd(x, x, n) + PN_COSINE_EPS);
    for (int64_t i = 0; i < n; i++) xh[i] = x[i] * r;
    return r;
}

/* Backward of x̂ = x·r: gx = r·gx̂ − r³ (x·gx̂) x. x, gxh, gx: (n) */
static inline void cos_normalize_bw(const double *x, double r, const double *gxh, double *gx, int64_t n) {
    double c = r * r * r * dotd(x, gxh, n);
    for (int64_t i = 0; i < n; i++) gx[i] = r * gxh[i] - c * x[i];
}

/* x^p for an integer p ≥ 0 (exact repeated squaring; x = 0 gives 0 for p ≥ 1) */
static inline double ipow(double x, int p) {
    double r = 1;
    while (p) {
        if (p & 1) r *= x;
        x *= x;
        p >>= 1;
    }
    return r;
}

/* ---- the symmetric power embedding φᵖ (power.c) ---------------------------------------
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

/* D' = C(D+p−1, p), or an error naming op when p or D' is out of range. */
pn_status pn_sympow_dim(const char *op, int64_t D, int p, int64_t *out);
pn_sympow_table *pn_sympow_table_new(const char *op, int64_t D, int p);
void pn_sympow_table_free(pn_sympow_table *t);
/* x (D) → phi (Dp) */
void pn_sympow_apply(const pn_sympow_table *t, const double *x, double *phi);
/* gx (D) += J_φ(x)ᵀ gphi, gphi (Dp) */
void pn_sympow_grad(const pn_sympow_table *t, const double *x, const double *gphi, double *gx);

/* Shape checks shared by the parallel forms: q, k (B,H,N,D), v (B,H,N,Dv), same float
 * dtype, on the cpu. */
pn_status pn_lin_check_qkv(const char *op, const pn_tensor *q, const pn_tensor *k, const pn_tensor *v);

#endif /* PN_ATTENTION_LINEAR_H */

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

/* PN_COSINE_EPS, PN_SYMPOW_MAX_*, dotd, cos_normalize(_bw), ipow, count_scale, log_gate and
 * the φᵖ table and maths: shared with the device (linear_math.h) */
#include "linear_math.h"

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

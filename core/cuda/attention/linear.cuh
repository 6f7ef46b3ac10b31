/* linear.cuh — what the linear-family kernels (cosine.cu, power.cu, rope.cu, lin_state.cu)
 * share: scratch tensors from the caching allocator, released together, and the φᵖ table
 * uploaded for one call. The maths itself is attention/linear_math.h (PN_HD, the CPU's). */
#ifndef PN_CUDA_ATTENTION_LINEAR_CUH
#define PN_CUDA_ATTENTION_LINEAR_CUH

#include "../cuda.cuh"
#include "../../attention/linear_math.h"

namespace {

/* the scratch tensors of one call (cuda.cuh), released by lin_free (also on errors) */
typedef pn_cu_scratch lin_scratch;

/* n elements (at least 1) of dtype dt on the device, or NULL (error set) */
inline void *lin_alloc(lin_scratch &s, int64_t n, int dt) {
    pn_tensor *t = pn_cu_scratch_new(&s, n, dt, false);
    return t ? pn_ptr(t) : NULL;
}

inline void lin_free(lin_scratch &s) { pn_cu_scratch_free(&s); }

/* the φᵖ table's arrays on the device */
struct lin_tab {
    int64_t D, Dp;
    int p;
    const int32_t *idx; /* (Dp, p) */
    const double *w;    /* (Dp) */
};

/* upload t's arrays for every p, p = 2 included: kernels that take φ one feature at a time
 * (lin_phi_one, lin_phi_grad_part; power.cu's chunked form) read the table for p = 2 too */
inline pn_status lin_tab_upload_full(const char *op, const pn_sympow_table *t, lin_scratch &s, lin_tab *out) {
    out->D = t->D, out->Dp = t->Dp, out->p = t->p, out->idx = NULL, out->w = NULL;
    int32_t *idx = (int32_t *)lin_alloc(s, t->Dp * t->p, PN_I32);
    double *w = (double *)lin_alloc(s, t->Dp, PN_F64);
    if (!idx || !w) return pn_error(PN_ERR_OOM, "%s: out of device memory for the symmetric power table", op);
    PN_TRY(pn_cuda_upload(idx, t->idx, sizeof(int32_t) * (size_t)(t->Dp * t->p)));
    PN_TRY(pn_cuda_upload(w, t->w, sizeof(double) * (size_t)t->Dp));
    out->idx = idx, out->w = w;
    return PN_OK;
}

/* upload t's arrays into scratch of s (p = 2 reads neither: sympow2_* needs no table) */
inline pn_status lin_tab_upload(const char *op, const pn_sympow_table *t, lin_scratch &s, lin_tab *out) {
    if (t->p != 2) return lin_tab_upload_full(op, t, s, out);
    out->D = t->D, out->Dp = t->Dp, out->p = t->p, out->idx = NULL, out->w = NULL;
    return PN_OK;
}

__device__ inline void lin_phi(const lin_tab &t, const double *x, double *phi) {
    sympow_apply_raw(t.D, t.p, t.Dp, t.idx, t.w, x, phi);
}

__device__ inline void lin_phi_grad(const lin_tab &t, const double *x, const double *gphi, double *gx) {
    sympow_grad_raw(t.D, t.p, t.Dp, t.idx, t.w, x, gphi, gx);
}


/* feature a of φᵖ(x) = w_a Π_r x[idx[a, r]], multiplied in sympow_apply_raw's order (so bitwise
 * its value; for p = 2 also sympow2_apply's, (√2·x_a)·x_b). Needs lin_tab_upload_full. */
__device__ inline double lin_phi_one(const lin_tab &t, const double *x, int64_t a) {
    const int32_t *ix = t.idx + a * t.p;
    double v = t.w[a];
    for (int r = 0; r < t.p; r++) v *= x[ix[r]];
    return v;
}

/* gx (D) += the part of J_φ(x)ᵀ gphi from the n features [a0, a0 + n), gphi (n) indexed from a0:
 * sympow_grad_raw's terms (prefix·suffix products, exact at zeros; p = 2 without the prefix array,
 * the same products). In the table's lexicographic order a feature's first coordinate stays the
 * same over runs of features, so its terms are summed in a register and added to gx once a run:
 * a chain of shared-memory read-modify-writes to one gx element per feature (the power backward's
 * one thread per row waited on them) became register adds. The sums' association differs from
 * sympow_grad_raw's by rounding only. Needs lin_tab_upload_full. */
__device__ inline void lin_phi_grad_part(const lin_tab &t, const double *x, const double *gphi, int64_t a0, int64_t n,
                                         double *gx) {
    int64_t held = -1; /* the run's first coordinate, its terms so far in hs */
    double hs = 0;
    auto add = [&](int64_t d, double v, bool first) {
        if (d == held) hs += v;
        else if (!first) gx[d] += v;
        else {
            if (held >= 0) gx[held] += hs;
            held = d, hs = v;
        }
    };
    if (t.p == 2) { /* r = 1: x_a·(g w) to gx[b]; r = 0: (g w)·x_b to gx[a] */
        for (int64_t f = 0; f < n; f++) {
            if (gphi[f] == 0) continue;
            const int32_t *ix = t.idx + (a0 + f) * 2;
            const double s = gphi[f] * t.w[a0 + f];
            add(ix[1], x[ix[0]] * s, false);
            add(ix[0], s * x[ix[1]], true);
        }
    } else {
        double pre[PN_SYMPOW_MAX_P + 1];
        for (int64_t f = 0; f < n; f++) {
            if (gphi[f] == 0) continue;
            const int32_t *ix = t.idx + (a0 + f) * t.p;
            pre[0] = 1;
            for (int r = 0; r < t.p; r++) pre[r + 1] = pre[r] * x[ix[r]];
            double suf = gphi[f] * t.w[a0 + f];
            for (int r = t.p - 1; r >= 0; r--) {
                add(ix[r], pre[r] * suf, r == 0);
                suf *= x[ix[r]];
            }
        }
    }
    if (held >= 0) gx[held] += hs;
}

/* p = 2: lin_phi_grad_part by the 32 lanes of a warp, each lane owning gx[d] for d ≡ lane
 * (mod 32), so the lanes write disjoint elements and each element once. Lexicographic
 * order puts feature (i, j), i ≤ j, at start(i) + j − i with start(i) = i·D − i(i − 1)/2, so the
 * features of [a0, a0 + n) with first coordinate d are one contiguous range and those with
 * second coordinate d one feature per first coordinate the range spans. The terms are
 * lin_phi_grad_part's products (s = g w; x_i·s to gx[j], s·x_j to gx[i]; features with g = 0
 * skipped), summed in another order: rounding only. The weights in closed form (1 on the
 * diagonal, √2 off it: the table's sqrt(2!/Π m!), the same doubles) instead of a global load a
 * term. gphi's n ≤ 32 entries must be visible to every lane (a __syncwarp after writing them).
 * Needs lin_tab_upload_full (the first coordinates of a0 and a0 + n − 1). */
__device__ inline void lin_phi2_grad_warp(const lin_tab &t, const double *x, const double *gphi, int64_t a0, int n,
                                          double *gx, int lane) {
    const int64_t D = t.D, a1 = a0 + n, ilo = t.idx[a0 * 2], ihi = t.idx[(a1 - 1) * 2];
    for (int64_t d = lane; d < D; d += 32) {
        double acc = 0;
        if (d >= ilo && d <= ihi) { /* features (d, j), j ≥ d */
            const int64_t b = d * D - d * (d - 1) / 2, f1 = b + D - d < a1 ? b + D - d : a1;
            for (int64_t f = b > a0 ? b : a0; f < f1; f++) {
                const double g = gphi[f - a0];
                if (g != 0) acc += (g * (f == b ? 1.0 : PN_SQRT2)) * x[d + (f - b)];
            }
        }
        for (int64_t i = ilo; i <= d && i <= ihi; i++) { /* features (i, d), i ≤ d */
            const int64_t f = i * D - i * (i - 1) / 2 + (d - i);
            if (f < a0 || f >= a1) continue;
            const double g = gphi[f - a0];
            if (g != 0) acc += x[i] * (g * (i == d ? 1.0 : PN_SQRT2));
        }
        gx[d] += acc;
    }
}

} // namespace

#endif /* PN_CUDA_ATTENTION_LINEAR_CUH */

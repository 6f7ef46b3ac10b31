/* power.cu — the CUDA twin of attention/power.c: the symmetric power embedding φᵖ and power
 * attention (forward and backward).
 *
 * φᵖ: one thread per row, through sympow_apply_raw / sympow_grad_raw (linear_math.h, the very
 * functions the CPU runs) on f64 copies of the row; the table's arrays (p > 2) are uploaded for
 * the call (linear.cuh).
 *
 * Power attention, first (correctness) step: the quadratic form in log space, as power.c's
 * chunk = 0, with L the cumulative log gates (one thread per (b, h)):
 *   row pass     one thread per query i: the row max of log B_ij, Z_i = Σ_j exp(log B_ij − max),
 *                out_i (and for the backward o_i and g_i·o_i kept in f64 scratch)
 *   row grads    one thread per query i: g q_i = scale Σ_j ∂s_ij k_j, and the gate terms where i is
 *                the later index (+∂log B_ij) or the earlier one (−)
 *   column grads one thread per key j: g k_j = Σ_i ∂s_ij qs_i, g v_j = Σ_i A_ij g_i and j's gate terms
 *   gates        one thread per (b, h): g log_gate = the reverse running sum of g L.
 * Every sum has one owner and a fixed order: deterministic, no atomics. The chunked request
 * (chunk > 0, causal) runs through the same quadratic kernels: both forms compute the same
 * function (power.c: "two parallel forms, which agree"), in f64 for both dtypes, and the specs
 * check the device's result against the CPU's chunked one (f32 1e-5, f64 1e-12 relative); the
 * quadratic form also stays finite where the chunked one's (scale·q·k)^p would overflow. The
 * chunked tensor-core kernels come later (issue 17). */
#include "linear.cuh"

namespace {

/* ---- φᵖ ------------------------------------------------------------------------------------- */
// x (R, D) → out (R, Dp); scratch (R, D + Dp)
template <class T>
__global__ void sympow_fwd_k(lin_tab t, int64_t R, const T *x, T *out, double *scratch) {
    const int64_t D = t.D, Dp = t.Dp;
    PN_CU_LOOP(r, R) {
        double *xs = scratch + r * (D + Dp), *ph = xs + D;
        for (int64_t d = 0; d < D; d++) xs[d] = x[r * D + d];
        lin_phi(t, xs, ph);
        for (int64_t a = 0; a < Dp; a++) out[r * Dp + a] = (T)ph[a];
    }
}

// x (R, D), g (R, Dp) → gx (R, D); scratch (R, 2D + Dp)
template <class T>
__global__ void sympow_bwd_k(lin_tab t, int64_t R, const T *x, const T *g, T *gx, double *scratch) {
    const int64_t D = t.D, Dp = t.Dp;
    PN_CU_LOOP(r, R) {
        double *xs = scratch + r * (2 * D + Dp), *gr = xs + D, *gp = gr + D;
        for (int64_t d = 0; d < D; d++) xs[d] = x[r * D + d], gr[d] = 0;
        for (int64_t a = 0; a < Dp; a++) gp[a] = g[r * Dp + a];
        lin_phi_grad(t, xs, gp, gr);
        for (int64_t d = 0; d < D; d++) gx[r * D + d] = (T)gr[d];
    }
}

/* ---- power attention ---------------------------------------------------------------------- */
struct pw_geo {
    int64_t B, H, N, D, Dv;
    int p, causal;
    double scale;
    const double *L; /* (BH, N) cumulative log gates (0 without gates) */
};

// L (BH, N) ← the running sums of lg (BH, N), or 0
template <class T>
__global__ void pw_cum_gates(int64_t BH, int64_t N, const T *lg, double *L) {
    PN_CU_LOOP(bh, BH) {
        double acc = 0;
        for (int64_t t = 0; t < N; t++) {
            if (lg) {
                const double x = lg[bh * N + t];
                acc = t ? acc + x : x;
            }
            L[bh * N + t] = acc;
        }
    }
}

/* s_ij = (scale·q_i)·k_j in the CPU's order, and log B_ij (−inf for s = 0) */
template <class T>
__device__ inline double pw_score(const pw_geo &a, const T *Q, const T *K, const double *L, int64_t i, int64_t j,
                                  double *lb) {
    double s = 0;
    for (int64_t d = 0; d < a.D; d++) s += ((double)Q[i * a.D + d] * a.scale) * (double)K[j * a.D + d];
    *lb = s == 0 ? -INFINITY : a.p * log(fabs(s)) + log_gate(L, i, j);
    return s;
}

/* One thread per query row (b, h, i). Forward (g = NULL): out_i = Σ_j w_ij v_j / Σ_j w_ij
 * (power.c's quad_forward) into out, o64 the f64 row. Backward statistics (g given): mx, Z and
 * o_i = Σ_j (w_ij/Z) v_j (quad_backward's order) and go_i = g_i·o_i. */
template <class T>
__global__ void pw_rows(pw_geo a, const T *q, const T *k, const T *v, const T *g, T *out, double *o64, double *mx_,
                        double *Z_, double *go_) {
    const int64_t N = a.N, D = a.D, Dv = a.Dv;
    PN_CU_LOOP(row, a.B * a.H * N) {
        const int64_t bh = row / N, i = row % N, n = a.causal ? i + 1 : N;
        const T *Q = q + bh * N * D, *K = k + bh * N * D, *V = v + bh * N * Dv;
        const double *L = a.L + bh * N;
        double *o = o64 + row * Dv, lb, mx = -INFINITY, Z = 0;
        for (int64_t j = 0; j < n; j++) {
            pw_score(a, Q, K, L, i, j, &lb);
            if (lb > mx) mx = lb;
        }
        for (int64_t e = 0; e < Dv; e++) o[e] = 0;
        if (mx > -INFINITY) {
            for (int64_t j = 0; j < n; j++) {
                pw_score(a, Q, K, L, i, j, &lb);
                Z += exp(lb - mx);
            }
            for (int64_t j = 0; j < n; j++) {
                pw_score(a, Q, K, L, i, j, &lb);
                double w = exp(lb - mx);
                if (g) w /= Z;
                for (int64_t e = 0; e < Dv; e++) o[e] += w * (double)V[j * Dv + e];
            }
            if (!g)
                for (int64_t e = 0; e < Dv; e++) o[e] /= Z;
        }
        if (!g) {
            for (int64_t e = 0; e < Dv; e++) out[row * Dv + e] = (T)o[e];
            continue;
        }
        double go = 0;
        for (int64_t e = 0; e < Dv; e++) go += (double)g[row * Dv + e] * o[e];
        mx_[row] = mx, Z_[row] = Z, go_[row] = go;
    }
}

/* A_ij and ∂log B_ij of the pair (i, j) from row i's statistics; false when A_ij = 0 (no gradient) */
template <class T>
__device__ inline bool pw_pair(const pw_geo &a, const T *Q, const T *K, const T *V, const T *G, const double *L,
                               double mx, double Z, double go, int64_t i, int64_t j, double *A, double *dlb,
                               double *s) {
    double lb;
    *s = pw_score(a, Q, K, L, i, j, &lb);
    *A = exp(lb - mx) / Z;
    if (*A == 0) return false;
    double gv = 0;
    for (int64_t e = 0; e < a.Dv; e++) gv += (double)G[i * a.Dv + e] * (double)V[j * a.Dv + e];
    *dlb = *A * (gv - go);
    return true;
}

/* One thread per query row i: gq_i (T) and gLr_i, i's share of g L */
template <class T>
__global__ void pw_row_grads(pw_geo a, const T *q, const T *k, const T *v, const T *g, const double *mx_,
                             const double *Z_, const double *go_, T *gq, double *gq64, double *gLr) {
    const int64_t N = a.N, D = a.D, Dv = a.Dv;
    PN_CU_LOOP(row, a.B * a.H * N) {
        const int64_t bh = row / N, i = row % N, n = a.causal ? i + 1 : N;
        const T *Q = q + bh * N * D, *K = k + bh * N * D, *V = v + bh * N * Dv, *G = g + bh * N * Dv;
        double *acc = gq64 + row * D, gl = 0;
        for (int64_t d = 0; d < D; d++) acc[d] = 0;
        if (mx_[row] > -INFINITY) {
            for (int64_t j = 0; j < n; j++) {
                double A, dlb, s;
                if (!pw_pair(a, Q, K, V, G, a.L + bh * N, mx_[row], Z_[row], go_[row], i, j, &A, &dlb, &s)) continue;
                const double ds = a.p * dlb / s; /* A ≠ 0 ⇒ s ≠ 0 */
                for (int64_t d = 0; d < D; d++) acc[d] += ds * (double)K[j * D + d];
                gl += i >= j ? dlb : -dlb;
            }
        }
        if (gq)
            for (int64_t d = 0; d < D; d++) gq[row * D + d] = (T)(acc[d] * a.scale);
        gLr[row] = gl;
    }
}

/* One thread per key row j: gk_j, gv_j (T) and gLc_j, j's share of g L */
template <class T>
__global__ void pw_col_grads(pw_geo a, const T *q, const T *k, const T *v, const T *g, const double *mx_,
                             const double *Z_, const double *go_, T *gk, T *gv, double *gk64, double *gv64,
                             double *gLc) {
    const int64_t N = a.N, D = a.D, Dv = a.Dv;
    PN_CU_LOOP(row, a.B * a.H * N) {
        const int64_t bh = row / N, j = row % N;
        const T *Q = q + bh * N * D, *K = k + bh * N * D, *V = v + bh * N * Dv, *G = g + bh * N * Dv;
        double *ak = gk64 + row * D, *av = gv64 + row * Dv, gl = 0;
        for (int64_t d = 0; d < D; d++) ak[d] = 0;
        for (int64_t e = 0; e < Dv; e++) av[e] = 0;
        for (int64_t i = a.causal ? j : 0; i < N; i++) {
            const int64_t ri = bh * N + i;
            if (!(mx_[ri] > -INFINITY)) continue;
            double A, dlb, s;
            if (!pw_pair(a, Q, K, V, G, a.L + bh * N, mx_[ri], Z_[ri], go_[ri], i, j, &A, &dlb, &s)) continue;
            for (int64_t e = 0; e < Dv; e++) av[e] += A * (double)G[i * Dv + e];
            const double ds = a.p * dlb / s;
            for (int64_t d = 0; d < D; d++) ak[d] += ds * ((double)Q[i * D + d] * a.scale);
            gl += i >= j ? -dlb : dlb;
        }
        if (gk)
            for (int64_t d = 0; d < D; d++) gk[row * D + d] = (T)ak[d];
        if (gv)
            for (int64_t e = 0; e < Dv; e++) gv[row * Dv + e] = (T)av[e];
        gLc[row] = gl;
    }
}

// glg (BH, N) ← Σ_{t ≥ k} (gLr + gLc)_t
template <class T>
__global__ void pw_gate_grads(int64_t BH, int64_t N, const double *gLr, const double *gLc, T *glg) {
    PN_CU_LOOP(bh, BH) {
        double acc = 0;
        for (int64_t t = N - 1; t >= 0; t--) glg[bh * N + t] = (T)(acc += gLr[bh * N + t] + gLc[bh * N + t]);
    }
}

pn_status pw_setup(const char *op, const pn_tensor *q, const pn_tensor *v, const pn_tensor *lg, int p, int causal,
                   double scale, lin_scratch &s, pw_geo *a) {
    a->B = q->sizes[0], a->H = q->sizes[1], a->N = q->sizes[2], a->D = q->sizes[3], a->Dv = v->sizes[3];
    a->p = p, a->causal = causal != 0, a->scale = scale;
    double *L = (double *)lin_alloc(s, a->B * a->H * a->N, PN_F64);
    if (!L) return pn_error(PN_ERR_OOM, "%s: out of device memory for q %s", op, pn_shape_str(q));
    a->L = L;
    PN_CU_FLOAT_SWITCH(q->dt, T, {
        auto kn = pw_cum_gates<T>;
        PN_CU_TRY(op, PN_LAUNCH(kn, pn_cu_blocks(a->B * a->H), PN_CU_THREADS, 0, pn_cu_stream(), a->B * a->H, a->N,
                                lg ? (const T *)pn_ptr(lg) : (const T *)NULL, L));
    });
    return PN_OK;
}

enum { PW_THREADS = 64 }; /* rows per block: each thread walks a whole row */

} // namespace

/* x (…, D), out (…, Dp) contiguous */
pn_status pn_cuda_sympow_fwd(const pn_sympow_table *t, const pn_tensor *x, pn_tensor *out) {
    const char *op = "sympow_embed";
    const int64_t R = pn_numel(x) / t->D;
    if (R == 0) return PN_OK;
    lin_scratch s = {};
    lin_tab tab;
    pn_status st = lin_tab_upload(op, t, s, &tab);
    double *scr = st ? NULL : (double *)lin_alloc(s, R * (t->D + t->Dp), PN_F64);
    if (!st && !scr) st = pn_error(PN_ERR_OOM, "%s: out of device memory for x %s", op, pn_shape_str(x));
    if (!st)
        PN_CU_FLOAT_SWITCH(x->dt, T, {
            auto kn = sympow_fwd_k<T>;
            st = pn_cu_check(op, PN_LAUNCH(kn, pn_cu_blocks(R, PW_THREADS), PW_THREADS, 0, pn_cu_stream(), tab, R,
                                           (const T *)pn_ptr(x), (T *)pn_ptr(out), scr));
        });
    lin_free(s);
    return st;
}

pn_status pn_cuda_sympow_bwd(const pn_sympow_table *t, const pn_tensor *x, const pn_tensor *g, pn_tensor *gx) {
    const char *op = "sympow_embed";
    const int64_t R = pn_numel(x) / t->D;
    if (R == 0) return PN_OK;
    lin_scratch s = {};
    lin_tab tab;
    pn_status st = lin_tab_upload(op, t, s, &tab);
    double *scr = st ? NULL : (double *)lin_alloc(s, R * (2 * t->D + t->Dp), PN_F64);
    if (!st && !scr) st = pn_error(PN_ERR_OOM, "%s: backward out of device memory for x %s", op, pn_shape_str(x));
    if (!st)
        PN_CU_FLOAT_SWITCH(x->dt, T, {
            auto kn = sympow_bwd_k<T>;
            st = pn_cu_check(op, PN_LAUNCH(kn, pn_cu_blocks(R, PW_THREADS), PW_THREADS, 0, pn_cu_stream(), tab, R,
                                           (const T *)pn_ptr(x), (const T *)pn_ptr(g), (T *)pn_ptr(gx), scr));
        });
    lin_free(s);
    return st;
}

/* q, k (B, H, N, D), v, out (B, H, N, Dv), lg (B, H, N) or NULL, contiguous; chunk and tab: see
 * the file comment (the quadratic kernels serve both forms) */
pn_status pn_cuda_power_fwd(const pn_tensor *q, const pn_tensor *k, const pn_tensor *v, const pn_tensor *lg, int p,
                            int causal, int64_t chunk, double scale, const pn_sympow_table *tab, pn_tensor *out) {
    (void)chunk, (void)tab;
    const char *op = "power_attention";
    if (pn_numel(out) == 0) return PN_OK;
    lin_scratch s = {};
    pw_geo a;
    pn_status st = pw_setup(op, q, v, lg, p, causal, scale, s, &a);
    const int64_t rows = a.B * a.H * a.N;
    double *o64 = st ? NULL : (double *)lin_alloc(s, rows * a.Dv, PN_F64);
    if (!st && !o64) st = pn_error(PN_ERR_OOM, "%s: out of device memory for q %s", op, pn_shape_str(q));
    if (!st)
        PN_CU_FLOAT_SWITCH(q->dt, T, {
            auto kn = pw_rows<T>;
            st = pn_cu_check(op, PN_LAUNCH(kn, pn_cu_blocks(rows, PW_THREADS), PW_THREADS, 0, pn_cu_stream(), a,
                                           (const T *)pn_ptr(q), (const T *)pn_ptr(k), (const T *)pn_ptr(v),
                                           (const T *)NULL, (T *)pn_ptr(out), o64, (double *)NULL, (double *)NULL,
                                           (double *)NULL));
        });
    lin_free(s);
    return st;
}

pn_status pn_cuda_power_bwd(const pn_tensor *q, const pn_tensor *k, const pn_tensor *v, const pn_tensor *lg, int p,
                            int causal, int64_t chunk, double scale, const pn_sympow_table *tab, const pn_tensor *g,
                            pn_tensor *gq, pn_tensor *gk, pn_tensor *gv, pn_tensor *glg) {
    (void)chunk, (void)tab;
    const char *op = "power_attention";
    lin_scratch s = {};
    pw_geo a;
    pn_status st = pw_setup(op, q, v, lg, p, causal, scale, s, &a);
    if (st) {
        lin_free(s);
        return st;
    }
    const int64_t rows = a.B * a.H * a.N, W = a.D > a.Dv ? a.D : a.Dv;
    double *stats = (double *)lin_alloc(s, 5 * rows, PN_F64); /* mx, Z, go, gLr, gLc */
    double *o64 = (double *)lin_alloc(s, rows * W, PN_F64), *a64 = (double *)lin_alloc(s, rows * a.D, PN_F64),
           *b64 = (double *)lin_alloc(s, rows * a.Dv, PN_F64);
    if (!stats || !o64 || !a64 || !b64) {
        lin_free(s);
        return pn_error(PN_ERR_OOM, "%s: backward out of device memory for q %s, v %s", op, pn_shape_str(q),
                        pn_shape_str(v));
    }
    double *mx = stats, *Z = mx + rows, *go = Z + rows, *gLr = go + rows, *gLc = gLr + rows;
    const unsigned nb = pn_cu_blocks(rows, PW_THREADS);
    PN_CU_FLOAT_SWITCH(q->dt, T, {
        const T *Q = (const T *)pn_ptr(q), *K = (const T *)pn_ptr(k), *V = (const T *)pn_ptr(v),
                *G = (const T *)pn_ptr(g);
        auto k1 = pw_rows<T>;
        st = pn_cu_check(op, PN_LAUNCH(k1, nb, PW_THREADS, 0, pn_cu_stream(), a, Q, K, V, G, (T *)NULL, o64, mx, Z, go));
        auto k2 = pw_row_grads<T>;
        if (!st)
            st = pn_cu_check(op, PN_LAUNCH(k2, nb, PW_THREADS, 0, pn_cu_stream(), a, Q, K, V, G, (const double *)mx,
                                           (const double *)Z, (const double *)go, gq ? (T *)pn_ptr(gq) : (T *)NULL,
                                           o64, gLr));
        auto k3 = pw_col_grads<T>;
        if (!st)
            st = pn_cu_check(op, PN_LAUNCH(k3, nb, PW_THREADS, 0, pn_cu_stream(), a, Q, K, V, G, (const double *)mx,
                                           (const double *)Z, (const double *)go, gk ? (T *)pn_ptr(gk) : (T *)NULL,
                                           gv ? (T *)pn_ptr(gv) : (T *)NULL, a64, b64, gLc));
        auto k4 = pw_gate_grads<T>;
        if (!st && glg)
            st = pn_cu_check(op, PN_LAUNCH(k4, pn_cu_blocks(a.B * a.H), PN_CU_THREADS, 0, pn_cu_stream(), a.B * a.H,
                                           a.N, (const double *)gLr, (const double *)gLc, (T *)pn_ptr(glg)));
    });
    lin_free(s);
    return st;
}

/* cosine.cu — the CUDA twin of attention/cosine.c (Cottention, forward and backward).
 *
 * First, correctness-first step (the chunked tensor-core form comes later). Every kernel keeps
 * the running state of cosine.c one row or column per thread, so nothing is shared between
 * threads and every sum runs in a fixed order (deterministic, f64 for both dtypes):
 *   forward   thread (b, h, e): S[:, e] = Σ_{j ∈ keys} k̂_j v_je  (D doubles), out_te = n_t^{−σ} q̂_t·S[:, e]
 *   g q̂       thread (b, h, d): S[d, :] (Dv), g q̂_td = Σ_e S[d, e] G_te       (G_t = n_t^{−σ} g_t)
 *   g k̂       thread (b, h, d): R[d, :] = Σ_{t ∋ j} q̂_td G_t (reverse scan),  g k̂_jd = R[d, :]·v_j
 *   g v       thread (b, h, e): R[:, e] (reverse scan),  g v_je = R[:, e]·k̂_j  (0 for a masked key)
 * Causal: the state grows as t advances (forward) or retreats (backward), each row adding its
 * term before it reads; bidirectional: the whole sum first, then every row reads it. Then one
 * thread per row takes g q̂ and g k̂ through the normalisation (cos_normalize_bw) and forms the
 * row's term of g m; one thread per head sums those over (b, t) in the CPU's order.
 * n_t (keys at or before t) comes from a per-batch prefix count of the mask. */
#include "linear.cuh"

namespace {

/* one call's geometry; q, k (BH, N, D), v, g (BH, N, Dv) contiguous */
struct cos_geo {
    int64_t B, H, N, D, Dv;
    int causal;
    const uint8_t *mask; /* (B, N) or NULL */
    const int64_t *cnt;  /* (B, N): real keys at or before t */
    const double *rq, *rk; /* (BH, N): 1/sqrt(‖row‖² + ε) */
    const void *m;       /* (H) the stabilisers */
    int mdt;
};

__device__ inline bool is_key(const cos_geo &a, int64_t b, int64_t j) { return !a.mask || a.mask[b * a.N + j]; }

/* n_t^{−σ(m_h)} of row t (the bidirectional rows all use the total) */
__device__ inline double row_scale(const cos_geo &a, int64_t b, int64_t h, int64_t t) {
    const int64_t n = a.cnt[b * a.N + (a.causal ? t : a.N - 1)];
    return count_scale(n, cos_sigmoid(pn_ld(a.m, a.mdt, h)));
}

// x: (BH·N, D) → r (BH·N)
template <class T>
__global__ void cos_norms(int64_t rows, int64_t D, const T *q, const T *k, double *rq, double *rk) {
    PN_CU_LOOP(i, rows) {
        double sq = 0, sk = 0;
        for (int64_t d = 0; d < D; d++) {
            sq += (double)q[i * D + d] * q[i * D + d];
            sk += (double)k[i * D + d] * k[i * D + d];
        }
        rq[i] = 1.0 / sqrt(sq + PN_COSINE_EPS);
        rk[i] = 1.0 / sqrt(sk + PN_COSINE_EPS);
    }
}

// cnt (B, N) ← running count of real keys
__global__ void cos_counts(int64_t B, int64_t N, const uint8_t *mask, int64_t *cnt) {
    PN_CU_LOOP(b, B) {
        int64_t run = 0;
        for (int64_t t = 0; t < N; t++) cnt[b * N + t] = (run += (!mask || mask[b * N + t]));
    }
}

enum { SCAN_OUT = 0, SCAN_GQ = 1, SCAN_GK = 2, SCAN_GV = 3 };

/* One thread per (b, h, o): o = e (OUT, GV) or d (GQ, GK); st (L doubles, its slot of state)
 * with L = D (OUT, GV) or Dv (GQ, GK). See the file comment for what each mode adds and reads.
 * OUT writes out (T), GV writes gv (T), GQ / GK write the raw g q̂ / g k̂ into r64 (BH, N, D). */
template <class T, int MODE>
__global__ void cos_scan(cos_geo a, const T *q, const T *k, const T *v, const T *g, T *res, double *r64,
                         double *state) {
    const bool own_e = MODE == SCAN_OUT || MODE == SCAN_GV;
    const int64_t O = own_e ? a.Dv : a.D, L = own_e ? a.D : a.Dv, N = a.N, D = a.D, Dv = a.Dv;
    const bool rev = MODE == SCAN_GK || MODE == SCAN_GV;
    PN_CU_LOOP(it, a.B * a.H * O) {
        const int64_t bh = it / O, o = it % O, b = bh / a.H, h = bh % a.H;
        const T *Q = q + bh * N * D, *K = k + bh * N * D, *V = v + bh * N * Dv, *G = g ? g + bh * N * Dv : NULL;
        const double *rq = a.rq + bh * N, *rk = a.rk + bh * N;
        double *st = state + it * L;
        for (int64_t l = 0; l < L; l++) st[l] = 0;
        /* row t's term into the state */
        auto add = [&](int64_t t) {
            if (MODE == SCAN_OUT || MODE == SCAN_GQ) {
                if (!is_key(a, b, t)) return;
                if (MODE == SCAN_OUT) {
                    const double ve = V[t * Dv + o];
                    for (int64_t d = 0; d < D; d++) st[d] += (double)K[t * D + d] * rk[t] * ve;
                } else {
                    const double kd = (double)K[t * D + o] * rk[t];
                    for (int64_t e = 0; e < Dv; e++) st[e] += kd * V[t * Dv + e];
                }
            } else {
                const double f = row_scale(a, b, h, t);
                if (MODE == SCAN_GK) {
                    const double qd = (double)Q[t * D + o] * rq[t];
                    for (int64_t e = 0; e < Dv; e++) st[e] += qd * (f * G[t * Dv + e]);
                } else {
                    const double ge = f * G[t * Dv + o];
                    for (int64_t d = 0; d < D; d++) st[d] += (double)Q[t * D + d] * rq[t] * ge;
                }
            }
        };
        /* row t reads the state */
        auto read = [&](int64_t t) {
            double acc = 0;
            if (MODE == SCAN_OUT) {
                for (int64_t d = 0; d < D; d++) acc += (double)Q[t * D + d] * rq[t] * st[d];
                res[(bh * N + t) * Dv + o] = (T)(row_scale(a, b, h, t) * acc);
            } else if (MODE == SCAN_GQ) {
                const double f = row_scale(a, b, h, t);
                for (int64_t e = 0; e < Dv; e++) acc += st[e] * (f * G[t * Dv + e]);
                r64[(bh * N + t) * D + o] = acc;
            } else if (MODE == SCAN_GK) {
                for (int64_t e = 0; e < Dv; e++) acc += st[e] * V[t * Dv + e];
                r64[(bh * N + t) * D + o] = acc;
            } else {
                if (is_key(a, b, t))
                    for (int64_t d = 0; d < D; d++) acc += st[d] * ((double)K[t * D + d] * rk[t]);
                res[(bh * N + t) * Dv + o] = (T)acc;
            }
        };
        if (!a.causal) {
            for (int64_t t = 0; t < N; t++) add(t);
            for (int64_t t = 0; t < N; t++) read(t);
        } else if (!rev) {
            for (int64_t t = 0; t < N; t++) add(t), read(t);
        } else {
            for (int64_t t = N - 1; t >= 0; t--) add(t), read(t);
        }
    }
}

/* One thread per row (b, h, t): graw (BH, N, D) the raw g q̂ (keys = false) or g k̂ (keys = true)
 * → through the normalisation into gx (T); x64 a row of scratch per row. For the queries also
 * the row's term of g m: gmt (BH, N) = (q̂_t·g q̂_t)·ln n_t (0 when n_t ≤ 1). */
template <class T>
__global__ void cos_rows_bw(cos_geo a, const T *x, double *graw, T *gx, double *x64, double *gmt, int keys) {
    const int64_t N = a.N, D = a.D;
    PN_CU_LOOP(row, a.B * a.H * N) {
        const int64_t bh = row / N, t = row % N, b = bh / a.H;
        double *xs = x64 + row * D, *gr = graw + row * D;
        const double r = keys ? a.rk[row] : a.rq[row];
        for (int64_t d = 0; d < D; d++) xs[d] = x[row * D + d];
        if (gmt) {
            const int64_t n = a.cnt[b * N + (a.causal ? t : N - 1)];
            double o = 0;
            for (int64_t d = 0; d < D; d++) o += xs[d] * r * gr[d];
            gmt[row] = n > 1 ? o * log((double)n) : 0;
        }
        if (!gx) continue;
        if (keys && !is_key(a, b, t)) {
            for (int64_t d = 0; d < D; d++) gx[row * D + d] = 0;
            continue;
        }
        cos_normalize_bw(xs, r, gr, gr, D); /* in place: gr[i] is read before written */
        for (int64_t d = 0; d < D; d++) gx[row * D + d] = (T)gr[d];
    }
}

/* gm (H) ← σ'(m_h) Σ_b (−Σ_t gmt), sums in the CPU's order */
template <class T>
__global__ void cos_gm(cos_geo a, const double *gmt, T *gm) {
    PN_CU_LOOP(h, a.H) {
        double acc = 0;
        for (int64_t b = 0; b < a.B; b++) {
            double s = 0;
            for (int64_t t = 0; t < a.N; t++) s -= gmt[(b * a.H + h) * a.N + t];
            acc += s;
        }
        const double sg = cos_sigmoid(pn_ld(a.m, a.mdt, h));
        gm[h] = (T)(acc * sg * (1 - sg));
    }
}

/* the norms and counts every pass needs; fills a */
pn_status cos_setup(const char *op, const pn_tensor *q, const pn_tensor *k, const pn_tensor *v, const pn_tensor *m,
                    const pn_tensor *mask, int causal, lin_scratch &s, cos_geo *a) {
    a->B = q->sizes[0], a->H = q->sizes[1], a->N = q->sizes[2], a->D = q->sizes[3], a->Dv = v->sizes[3];
    a->causal = causal != 0;
    a->mask = mask ? (const uint8_t *)pn_ptr(mask) : NULL;
    a->m = pn_ptr(m), a->mdt = m->dt;
    const int64_t rows = a->B * a->H * a->N;
    double *rq = (double *)lin_alloc(s, rows, PN_F64), *rk = (double *)lin_alloc(s, rows, PN_F64);
    int64_t *cnt = (int64_t *)lin_alloc(s, a->B * a->N, PN_I64);
    if (!rq || !rk || !cnt) return pn_error(PN_ERR_OOM, "%s: out of device memory for q %s", op, pn_shape_str(q));
    a->rq = rq, a->rk = rk, a->cnt = cnt;
    PN_CU_FLOAT_SWITCH(q->dt, T, {
        auto kn = cos_norms<T>;
        PN_CU_TRY(op, PN_LAUNCH(kn, pn_cu_blocks(rows), PN_CU_THREADS, 0, pn_cu_stream(), rows, a->D,
                                (const T *)pn_ptr(q), (const T *)pn_ptr(k), rq, rk));
    });
    PN_CU_TRY(op, PN_LAUNCH(cos_counts, pn_cu_blocks(a->B), PN_CU_THREADS, 0, pn_cu_stream(), a->B, a->N, a->mask, cnt));
    return PN_OK;
}

template <class T, int MODE>
pn_status cos_run_scan(const char *op, const cos_geo &a, const pn_tensor *q, const pn_tensor *k, const pn_tensor *v,
                       const pn_tensor *g, pn_tensor *res, double *r64, double *state) {
    const int64_t O = (MODE == SCAN_OUT || MODE == SCAN_GV) ? a.Dv : a.D, n = a.B * a.H * O;
    auto kn = cos_scan<T, MODE>;
    PN_CU_TRY(op, PN_LAUNCH(kn, pn_cu_blocks(n, 64), 64, 0, pn_cu_stream(), a, (const T *)pn_ptr(q),
                            (const T *)pn_ptr(k), (const T *)pn_ptr(v), g ? (const T *)pn_ptr(g) : (const T *)NULL,
                            res ? (T *)pn_ptr(res) : (T *)NULL, r64, state));
    return PN_OK;
}

} // namespace

/* q, k (B, H, N, D), v, out (B, H, N, Dv), m (H), mask (B, N) u8 or NULL, all contiguous */
pn_status pn_cuda_cosine_fwd(const pn_tensor *q, const pn_tensor *k, const pn_tensor *v, const pn_tensor *m,
                             const pn_tensor *mask, int causal, pn_tensor *out) {
    const char *op = "cosine_attention";
    if (pn_numel(out) == 0) return PN_OK;
    lin_scratch s = {};
    cos_geo a;
    pn_status st = cos_setup(op, q, k, v, m, mask, causal, s, &a);
    double *state = st ? NULL : (double *)lin_alloc(s, a.B * a.H * a.D * a.Dv, PN_F64);
    if (!st && !state) st = pn_error(PN_ERR_OOM, "%s: out of device memory for the state of v %s", op, pn_shape_str(v));
    if (!st) PN_CU_FLOAT_SWITCH(q->dt, T, st = (cos_run_scan<T, SCAN_OUT>(op, a, q, k, v, NULL, out, NULL, state)));
    lin_free(s);
    return st;
}

pn_status pn_cuda_cosine_bwd(const pn_tensor *q, const pn_tensor *k, const pn_tensor *v, const pn_tensor *m,
                             const pn_tensor *mask, int causal, const pn_tensor *g, pn_tensor *gq, pn_tensor *gk,
                             pn_tensor *gv, pn_tensor *gm) {
    const char *op = "cosine_attention";
    lin_scratch s = {};
    cos_geo a;
    pn_status st = cos_setup(op, q, k, v, m, mask, causal, s, &a);
    if (st) {
        lin_free(s);
        return st;
    }
    const int64_t rows = a.B * a.H * a.N;
    double *state = (double *)lin_alloc(s, a.B * a.H * a.D * a.Dv, PN_F64);
    double *graw = (double *)lin_alloc(s, rows * a.D, PN_F64), *x64 = (double *)lin_alloc(s, rows * a.D, PN_F64);
    double *gmt = gm ? (double *)lin_alloc(s, rows, PN_F64) : NULL;
    if (!state || !graw || !x64 || (gm && !gmt)) {
        lin_free(s);
        return pn_error(PN_ERR_OOM, "%s: backward out of device memory for q %s, v %s", op, pn_shape_str(q),
                        pn_shape_str(v));
    }
    const unsigned nb = pn_cu_blocks(rows);
    PN_CU_FLOAT_SWITCH(q->dt, T, {
        if (!st && (gq || gm)) {
            st = cos_run_scan<T, SCAN_GQ>(op, a, q, k, v, g, NULL, graw, state);
            auto kr = cos_rows_bw<T>;
            if (!st)
                st = pn_cu_check(op, PN_LAUNCH(kr, nb, PN_CU_THREADS, 0, pn_cu_stream(), a, (const T *)pn_ptr(q),
                                               graw, gq ? (T *)pn_ptr(gq) : (T *)NULL, x64, gmt, 0));
            auto kg = cos_gm<T>;
            if (!st && gm)
                st = pn_cu_check(op, PN_LAUNCH(kg, pn_cu_blocks(a.H), PN_CU_THREADS, 0, pn_cu_stream(), a,
                                               (const double *)gmt, (T *)pn_ptr(gm)));
        }
        if (!st && gk) {
            st = cos_run_scan<T, SCAN_GK>(op, a, q, k, v, g, NULL, graw, state);
            auto kr = cos_rows_bw<T>;
            if (!st)
                st = pn_cu_check(op, PN_LAUNCH(kr, nb, PN_CU_THREADS, 0, pn_cu_stream(), a, (const T *)pn_ptr(k),
                                               graw, (T *)pn_ptr(gk), x64, (double *)NULL, 1));
        }
        if (!st && gv) st = cos_run_scan<T, SCAN_GV>(op, a, q, k, v, g, gv, NULL, state);
    });
    lin_free(s);
    return st;
}

/* graph.cu — the CUDA twins of attention/graph.c's kernels: fused attention over a CSR
 * neighbourhood (attention_graph_fwd, attention_graph_weights, attention_graph_bwd) for every
 * score of variants.def, every normalize, einstein aggregation, dropout, learnable parameters.
 *
 * The maths is the CPU's: the score headers' per-pair functions (PN_HD), instantiated for float
 * and double in scores.cuh (shared with dense.cu) with one struct S_<X> per epilogue of the list
 * GRAPH_SCORES.
 *
 * Layout as graph_impl.h: node-major q, k (N, H, D), v (N, H, Dv); per-row arrays (terms,
 * Lorentz factors, NaN flags) (N, H), row x = i·H + h; per-edge arrays (E, H); stat (H, N).
 *
 * Work: one thread per (destination node, head), walking its CSR neighbourhood in order:
 *   forward   pass A: scores, online max and sum (softmax) or Σσγ (sigmoid) → stat;
 *             pass B: the scores again → weights → out = Σ w·v (and the per-edge weights);
 *   backward  pass 1 per (destination, head): the weights from stat, dS, the score's VJP, dQ,
 *             and per-edge results (dG, the key-term partials, m·w, ∂L/∂γ);
 *             pass 2 per (source, head) over the transposed CSR (edge ids grouped by source in
 *             increasing order, built on the device: counts, a scan, a fill, and a sort of each
 *             source's segment so the order does not depend on the atomics): dK, dV and the
 *             column sums, summed in a fixed order — no float atomics anywhere;
 *             then the terms' backward (dQ, dK, da_l, da_r), the Lorentz factors' (dV, ∂κ) and
 *             the parameters' per-node partials reduced per head in node order.
 * Deterministic for a given input. The front end's checks of the options, the CSR contents and
 * the manifolds run here as on the CPU, with the CPU's messages: the device computes flags and
 * the first offending index (atomicMin of an index is order-independent), the host reads them. */
#include "scores.cuh"

#include <stdio.h>
#include <type_traits>

namespace {

/* ---- the call: everything the kernels read, by value -------------------------------------------- */
template <typename T> struct gcall {
    int64_t N, H, D, Dv, Dg, E;
    int gemm, diff, norm, normalized, einstein;
    int qk[2], kk[2];          /* term kinds (PN_TERM_*) of the row / column slots */
    const T *q, *k, *v;        /* (N, H, D), (N, H, D), (N, H, Dv) contiguous */
    const T *a_l, *a_r;        /* (H, D) or NULL */
    const int64_t *off, *src;  /* (N+1), (E) */
    T *qt[2], *kt[2];          /* (N, H) or NULL */
    T *g;                      /* (N, H) Lorentz factors or NULL */
    const int32_t *qbad, *kbad; /* (N, H) non-finite rows */
    const pn_score_params *hp; /* (H) */
};


/* the score of the row's query against node j; also the key terms and G (for the VJP) */
template <typename T, typename S>
__device__ T score(const gcall<T> &c, const qrow<T, S> &r, int64_t j, int64_t h, T *G, T *k0, T *k1,
                   typename prec<T>::x4 *kx) {
    const int64_t y = j * c.H + h;
    T s = pair_score(c, r, y, G, k0, k1, kx);
    if (r.qb || c.kbad[y]) s = (T)NAN; /* NaN in, NaN out */
    return s;
}

/* ---- forward ------------------------------------------------------------------------------------- */
/* out (N, H, Dv) or NULL; stat (H, N); drop (E, H) scaled mask or NULL; wedge (E, H) or NULL */
template <typename T, typename S>
__global__ void gfwd_kernel(gcall<T> c, const T *drop, T *out, T *stat, T *wedge) {
    PN_CU_LOOP(x, c.N * c.H) {
        const int64_t i = x / c.H, h = x - i * c.H, e0 = c.off[i], e1 = c.off[i + 1];
        qrow<T, S> r;
        qrow_init(c, h, x, r);
        T G, k0, k1;
        typename prec<T>::x4 kx;
        /* pass A: the statistic */
        T st, inv = 1;
        int nan = 0;
        if (c.norm == PN_NORM_SOFTMAX) {
            T m = (T)-INFINITY, z = 0;
            for (int64_t e = e0; e < e1; e++) {
                const int64_t j = c.src[e];
                const T s = score<T, S>(c, r, j, h, &G, &k0, &k1, &kx);
                const T gv = c.g ? c.g[j * c.H + h] : (T)1;
                nan |= s != s;
                if (s > m) { /* online: rescale the running sum to the new max */
                    z = m == (T)-INFINITY ? (T)0 : z * pn_exp(m - s);
                    m = s;
                }
                if (s != (T)-INFINITY && s == s) z += pn_exp(s - m) * gv;
            }
            st = (nan || m == (T)INFINITY) ? (T)NAN : m == (T)-INFINITY ? (T)-INFINITY : m + pn_log(z);
        } else {
            T z = 0;
            for (int64_t e = e0; e < e1; e++) {
                const int64_t j = c.src[e];
                const T s = score<T, S>(c, r, j, h, &G, &k0, &k1, &kx);
                const T gv = c.g ? c.g[j * c.H + h] : (T)1;
                z += sigm(s) * gv;
            }
            st = z;
            if (c.normalized) inv = z != z ? z : z > 0 ? 1 / z : 0;
        }
        stat[h * c.N + i] = st;
        /* pass B: the weights, the aggregation */
        T *o = out ? out + x * c.Dv : NULL;
        if (o)
            for (int64_t d = 0; d < c.Dv; d++) o[d] = 0;
        if (!o && !wedge) continue;
        for (int64_t e = e0; e < e1; e++) {
            const int64_t j = c.src[e];
            const T gv = c.g ? c.g[j * c.H + h] : (T)1;
            T w;
            if (c.norm == PN_NORM_SOFTMAX) {
                if (st != st) w = (T)NAN;
                else if (st == (T)-INFINITY) w = 0;
                else w = pn_exp(score<T, S>(c, r, j, h, &G, &k0, &k1, &kx) - st) * gv;
            } else {
                w = sigm(score<T, S>(c, r, j, h, &G, &k0, &k1, &kx)) * gv;
                if (c.normalized) w *= inv;
            }
            if (wedge) wedge[e * c.H + h] = w;
            if (!o) continue;
            const T we = drop ? w * drop[e * c.H + h] : w;
            if (we == 0) continue; /* a dropped or zero weight reads nothing (NaN weights do) */
            const T *vj = c.v + (j * c.H + h) * c.Dv;
            for (int64_t d = 0; d < c.Dv; d++) o[d] += we * vj[d];
        }
    }
}

/* drop (n) uniform draws → the inverted-dropout mask (u >= p) / (1 − p), in place */
template <typename T> __global__ void drop_kernel(T *drop, int64_t n, double p) {
    const double keep = 1.0 / (1.0 - p);
    PN_CU_LOOP(i, n) drop[i] = (T)((double)drop[i] >= p ? keep : 0.0);
}

/* ---- preparation: terms, flags, Lorentz factors, the checks ------------------------------------ */
/* slots (unsigned long long, all ones = none): 0, 1 the first non-finite q / k row (memory
 * order); 2, 3 q's term m = 0, 1 and 4, 5 k's breaking the manifold (h·N + r order, as
 * find_bad); 6 the first v row outside the Klein ball (h·N + j order, as lorentz) */
enum { SL_QNF, SL_KNF, SL_QT0, SL_QT1, SL_KT0, SL_KT1, SL_LOR, SL_N };

/* out = term `kind` of row xr (D), a: the head's PROJ vector */
template <typename T> __device__ T term_of(int kind, const T *xr, int64_t D, int64_t Dg, const T *a) {
    T t = 0;
    if (kind == PN_TERM_NORM2)
        for (int64_t d = 0; d < Dg; d++) t += xr[d] * xr[d];
    else if (kind == PN_TERM_LAST) t = xr[D - 1];
    else if (kind == PN_TERM_PROJ)
        for (int64_t d = 0; d < D; d++) t += a[d] * xr[d];
    return t;
}

template <typename T>
__global__ void prep_kernel(gcall<T> c, unsigned req, int32_t *qbad, int32_t *kbad, unsigned long long *slot) {
    PN_CU_LOOP(x, c.N * c.H) {
        const int64_t i = x / c.H, h = x - i * c.H, hx = h * c.N + i; /* hx: the head-major order */
        const T *qr = c.q + x * c.D, *kr = c.k + x * c.D;
        const double kap = c.hp[h].v[PN_P_curvature];
        for (int side = 0; side < 2; side++) {
            const T *xr = side ? kr : qr;
            const int *kinds = side ? c.kk : c.qk;
            T *const *t = side ? c.kt : c.qt;
            const T *a = side ? c.a_r : c.a_l;
            for (int m = 0; m < 2; m++) {
                if (!t[m]) continue;
                const T v = term_of(kinds[m], xr, c.D, c.Dg, a ? a + h * c.D : (const T *)NULL);
                t[m][x] = v;
                if (term_bad(kinds[m], req, kap, v)) atomicMin(&slot[SL_QT0 + 2 * side + m], (unsigned long long)hx);
            }
            const int nf = nonfinite(xr, c.D);
            (side ? kbad : qbad)[x] = nf;
            if (nf) atomicMin(&slot[SL_QNF + side], (unsigned long long)x);
        }
        if (c.g && !lorentz(c.v + x * c.Dv, c.Dv, kap, &c.g[x])) /* γ(v) = 1/√(1 − κ‖v‖²) */
            atomicMin(&slot[SL_LOR], (unsigned long long)hx);
    }
}

/* offsets (N+1) and src (E) of any index dtype and stride → contiguous i64 */
__global__ void idx_kernel(const char *p, int dt, int64_t stride, int64_t n, int64_t *out) {
    PN_CU_LOOP(i, n) out[i] = pn_ldi(p, dt, i * stride);
}

/* slot 0: the first node whose offsets decrease; slot 1: the first edge whose source is out of
 * [0, N) */
__global__ void csr_check_kernel(const int64_t *off, const int64_t *src, int64_t N, int64_t E,
                                 unsigned long long *slot) {
    PN_CU_LOOP(i, N > E ? N : E) {
        if (i < N && off[i + 1] < off[i]) atomicMin(&slot[0], (unsigned long long)i);
        if (i < E && (src[i] < 0 || src[i] >= N)) atomicMin(&slot[1], (unsigned long long)i);
    }
}

/* ---- backward ------------------------------------------------------------------------------------ */
template <typename T> struct gbw {
    const T *dout, *out, *stat, *drop; /* (N, H, Dv) | (E, H) for the weights, (N, H, Dv), (H, N), (E, H) or NULL */
    int weights;
    T *dq;                             /* (N, H, D) zeros */
    double *dqt[2];                    /* (N, H) or NULL */
    double *dparam;                    /* (N, H, PN_NPARAM) or NULL */
    T *eG, *ek[2], *ew, *edg;          /* (E, H) each (ek, edg or NULL) */
};

template <typename T, typename S> __global__ void gbw1_kernel(gcall<T> c, gbw<T> a) {
    PN_CU_LOOP(x, c.N * c.H) {
        const int64_t i = x / c.H, h = x - i * c.H, e0 = c.off[i], e1 = c.off[i + 1];
        qrow<T, S> r;
        qrow_init(c, h, x, r);
        T G, k0, k1;
        typename prec<T>::x4 kx;
        const int want = wants<S>(&c.hp[h]);
        const T st = a.stat[h * c.N + i];
        const T *dO = a.weights ? NULL : a.dout + x * c.Dv, *O = a.weights ? NULL : a.out + x * c.Dv;
        /* the forward's weights from the statistic (and, for sigmoid, σ(s)) */
#define GBW_WEIGHT(e, j, s, w, sg)                                                              \
    do {                                                                                        \
        const T gv_ = c.g ? c.g[(j) * c.H + h] : (T)1;                                          \
        s = score<T, S>(c, r, j, h, &G, &k0, &k1, &kx);                                         \
        if (c.norm == PN_NORM_SOFTMAX) {                                                        \
            w = st == (T)-INFINITY ? (T)0 : pn_exp(s - st) * gv_;                               \
            sg = 0;                                                                             \
        } else {                                                                                \
            sg = sigm(s);                                                                       \
            w = c.normalized ? (st > 0 ? sg * gv_ / st : (T)0) : sg * gv_;                      \
        }                                                                                       \
    } while (0)
        /* D_i = Σ_e dW_e·w_e (the weights' backward) or dO_i·O_i */
        T Di = 0;
        if (c.normalized && a.weights) {
            for (int64_t e = e0; e < e1; e++) {
                const int64_t j = c.src[e];
                T s, w, sg;
                GBW_WEIGHT(e, j, s, w, sg);
                Di += a.dout[e * c.H + h] * w;
            }
        } else if (c.normalized) {
            for (int64_t d = 0; d < c.Dv; d++) Di += dO[d] * O[d];
        }
        T aq0 = 0, aq1 = 0, b0 = 0, b1 = 0, b2 = 0;
        for (int64_t e = e0; e < e1; e++) {
            const int64_t j = c.src[e], eh = e * c.H + h;
            T s, w, sg;
            GBW_WEIGHT(e, j, s, w, sg);
            T dpv;
            if (a.weights) {
                dpv = a.dout[eh];
            } else {
                const T *vj = c.v + (j * c.H + h) * c.Dv;
                dpv = 0;
                for (int64_t d = 0; d < c.Dv; d++) dpv += dO[d] * vj[d];
            }
            const T m = a.drop ? a.drop[eh] : (T)1;
            const T dp = dpv * m;
            a.ew[eh] = a.weights ? (T)0 : m * w;
            T ds;
            if (c.norm == PN_NORM_SOFTMAX) ds = w * (dp - Di);
            else if (c.normalized) ds = w * (1 - sg) * (dp - Di);
            else ds = dp * sg * (1 - sg);
            if (a.edg) a.edg[eh] = (dp - Di) * w / c.g[j * c.H + h];
            const auto dd = S::vjp(&r.hd, r.rx, kx, G, r.q0, r.q1, k0, k1, ds, want);
            a.eG[eh] = dd.g;
            if (a.ek[0]) a.ek[0][eh] = (S::terms & T_K0) ? dd.k0 : (T)0;
            if (a.ek[1]) a.ek[1][eh] = (S::terms & T_K1) ? dd.k1 : (T)0;
            aq0 += dd.q0, aq1 += dd.q1;
            if (want) b0 += dd.p0, b1 += dd.p1, b2 += dd.p2;
        }
#undef GBW_WEIGHT
        if (a.dqt[0]) a.dqt[0][x] = (S::terms & T_Q0) ? (double)aq0 : 0.0;
        if (a.dqt[1]) a.dqt[1][x] = (S::terms & T_Q1) ? (double)aq1 : 0.0;
        if (want && a.dparam) {
            double *dp = a.dparam + x * PN_NPARAM;
            if (S::pid(0) >= 0) dp[S::pid(0) >= 0 ? S::pid(0) : 0] += (double)b0;
            if (S::pid(1) >= 0) dp[S::pid(1) >= 0 ? S::pid(1) : 0] += (double)b1;
            if (S::pid(2) >= 0) dp[S::pid(2) >= 0 ? S::pid(2) : 0] += (double)b2;
        }
        if (!c.gemm) continue;
        /* ∂G/∂q: k, or k − q for a distance score */
        T *dqi = a.dq + x * c.D;
        for (int64_t e = e0; e < e1; e++) {
            const T dG = a.eG[e * c.H + h];
            if (dG == 0) continue;
            const T *kj = c.k + (c.src[e] * c.H + h) * c.D;
            if (c.diff)
                for (int64_t d = 0; d < c.Dg; d++) dqi[d] += dG * (kj[d] - r.qr[d]);
            else
                for (int64_t d = 0; d < c.Dg; d++) dqi[d] += dG * kj[d];
        }
    }
}

/* pass 2, per (source j, head h) over its edges (rev: edge ids by source, increasing; dst: each
 * edge's destination): dk, dv and the column sums dkt, dg */
template <typename T>
__global__ void gbw2_kernel(gcall<T> c, gbw<T> a, const int64_t *roff, const int64_t *rev, const int64_t *dst, T *dk,
                            T *dv, double *dkt0, double *dkt1, double *dg) {
    PN_CU_LOOP(y, c.N * c.H) {
        const int64_t j = y / c.H, h = y - j * c.H;
        T *dkj = dk + y * c.D, *dvj = dv ? dv + y * c.Dv : NULL;
        const T *kj = c.k + y * c.D;
        double s0 = 0, s1 = 0, sg = 0;
        for (int64_t r = roff[j]; r < roff[j + 1]; r++) {
            const int64_t e = rev[r], i = dst[e], eh = e * c.H + h;
            if (c.gemm) {
                const T dG = a.eG[eh];
                if (dG != 0) {
                    const T *qi = c.q + (i * c.H + h) * c.D;
                    if (c.diff)
                        for (int64_t d = 0; d < c.Dg; d++) dkj[d] += dG * (qi[d] - kj[d]);
                    else
                        for (int64_t d = 0; d < c.Dg; d++) dkj[d] += dG * qi[d];
                }
            }
            if (dvj) {
                const T we = a.ew[eh];
                if (we != 0) {
                    const T *dO = a.dout + (i * c.H + h) * c.Dv;
                    for (int64_t d = 0; d < c.Dv; d++) dvj[d] += we * dO[d];
                }
            }
            if (dkt0) s0 += a.ek[0][eh];
            if (dkt1) s1 += a.ek[1][eh];
            if (dg) sg += a.edg[eh];
        }
        if (dkt0) dkt0[y] = s0;
        if (dkt1) dkt1[y] = s1;
        if (dg) dg[y] = sg;
    }
}

/* the transposed CSR: dst[e] for every edge, counts per source (integer atomics: exact) */
__global__ void dst_kernel(const int64_t *off, const int64_t *src, int64_t N, int64_t *dst, int64_t *cnt) {
    PN_CU_LOOP(i, N) {
        for (int64_t e = off[i]; e < off[i + 1]; e++) {
            dst[e] = i;
            atomicAdd((unsigned long long *)&cnt[src[e] + 1], 1ull);
        }
    }
}

/* exclusive scan of the counts (N+1), one thread: roff; fill a copy */
__global__ void scan_kernel(int64_t *roff, int64_t *fill, int64_t N) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    roff[0] = 0;
    for (int64_t j = 0; j < N; j++) roff[j + 1] += roff[j];
    for (int64_t j = 0; j <= N; j++) fill[j] = roff[j];
}

__global__ void rfill_kernel(const int64_t *src, int64_t E, int64_t *fill, int64_t *rev) {
    PN_CU_LOOP(e, E) {
        const unsigned long long p = atomicAdd((unsigned long long *)&fill[src[e]], 1ull);
        rev[p] = e;
    }
}

/* each source's segment of rev sorted by edge id (heapsort: the atomics' order is gone) */
__device__ void sift(int64_t *a, int64_t root, int64_t n) {
    for (;;) {
        int64_t ch = 2 * root + 1;
        if (ch >= n) return;
        if (ch + 1 < n && a[ch] < a[ch + 1]) ch++;
        if (a[root] >= a[ch]) return;
        const int64_t t = a[root];
        a[root] = a[ch], a[ch] = t;
        root = ch;
    }
}

__global__ void rsort_kernel(const int64_t *roff, int64_t N, int64_t *rev) {
    PN_CU_LOOP(j, N) {
        int64_t *a = rev + roff[j];
        const int64_t n = roff[j + 1] - roff[j];
        for (int64_t start = n / 2 - 1; start >= 0; start--) sift(a, start, n);
        for (int64_t end = n - 1; end > 0; end--) {
            const int64_t t = a[0];
            a[0] = a[end], a[end] = t;
            sift(a, 0, end);
        }
    }
}

/* the terms' backward, per row: dx += Σ_m dt_m·∂term_m/∂x (q side: dqt, a_l; k side: dkt, a_r) */
template <typename T>
__global__ void terms_bw_kernel(gcall<T> c, const double *dq0, const double *dq1, const double *dk0,
                                const double *dk1, T *dq, T *dk) {
    PN_CU_LOOP(x, c.N * c.H) {
        const int64_t h = x % c.H;
        for (int side = 0; side < 2; side++) {
            const double *dt[2] = {side ? dk0 : dq0, side ? dk1 : dq1};
            const int *kind = side ? c.kk : c.qk;
            const T *xr = (side ? c.k : c.q) + x * c.D, *a = side ? c.a_r : c.a_l;
            T *gr = (side ? dk : dq) + x * c.D;
            for (int m = 0; m < 2; m++) {
                if (!dt[m] || kind[m] == PN_TERM_NONE) continue;
                const double t = dt[m][x];
                if (t == 0) continue;
                if (kind[m] == PN_TERM_NORM2) {
                    for (int64_t d = 0; d < c.Dg; d++) gr[d] += (T)(2 * t) * xr[d];
                } else if (kind[m] == PN_TERM_LAST) {
                    gr[c.D - 1] += (T)t;
                } else {
                    const T *ah = a + h * c.D;
                    for (int64_t d = 0; d < c.D; d++) gr[d] += (T)t * ah[d];
                }
            }
        }
    }
}

/* da (H, D) of a PROJ term: Σ_r dt[r, h]·x[r, h, :], rows in order; one thread per (h, d) */
template <typename T>
__global__ void proj_grad_kernel(gcall<T> c, const double *dt, const T *x, char *da, int dadt) {
    PN_CU_LOOP(hd, c.H * c.D) {
        const int64_t h = hd / c.D, d = hd - h * c.D;
        double acc = 0;
        for (int64_t r = 0; r < c.N; r++) acc += dt[r * c.H + h] * x[(r * c.H + h) * c.D + d];
        pn_st(da, dadt, hd, acc);
    }
}

/* einstein: dv += dg·κγ³·v per row */
template <typename T> __global__ void lorentz_bw_kernel(gcall<T> c, const double *dg, T *dv) {
    PN_CU_LOOP(x, c.N * c.H) {
        const double t = dg[x];
        if (t == 0) continue;
        const double kap = c.hp[x % c.H].v[PN_P_curvature], gj = c.g[x], g3 = gj * gj * gj;
        const T *vr = c.v + x * c.Dv;
        T *gr = dv + x * c.Dv;
        for (int64_t d = 0; d < c.Dv; d++) gr[d] += (T)(t * kap * g3 * vr[d]);
    }
}

/* gpar (PN_NPARAM, H): per head, ∂κ of the Lorentz factors (nodes in order) then the per-node
 * parameter partials (nodes in order); one thread per (p, h) */
template <typename T>
__global__ void param_reduce_kernel(gcall<T> c, const double *dg, const double *dparam, double *gpar) {
    PN_CU_LOOP(ph, (int64_t)PN_NPARAM * c.H) {
        const int64_t p = ph / c.H, h = ph - p * c.H;
        double acc = 0;
        if (p == PN_P_curvature && dg) {
            double a = 0;
            for (int64_t j = 0; j < c.N; j++) {
                const int64_t x = j * c.H + h;
                const double t = dg[x];
                if (t == 0) continue;
                const T *vr = c.v + x * c.Dv;
                double n2 = 0;
                for (int64_t d = 0; d < c.Dv; d++) n2 += (double)vr[d] * vr[d];
                const double gj = c.g[x], g3 = gj * gj * gj;
                a += t * 0.5 * n2 * g3;
            }
            acc += a;
        }
        if (dparam)
            for (int64_t i = 0; i < c.N; i++) acc += dparam[(i * c.H + h) * PN_NPARAM + p];
        gpar[ph] = acc;
    }
}

/* ---- host side ------------------------------------------------------------------------------------ */
enum { GT = 128 };

/* "[r,h]" (from 1) of the node-major row x, as graph.c's messages */
const char *row_str(int64_t x, int64_t H) {
    static thread_local char buf[64];
    snprintf(buf, sizeof buf, "[%lld,%lld]", (long long)(x / H + 1), (long long)(x % H + 1));
    return buf;
}

/* one call's device state: the setup (host), the contiguous inputs and the scratch it owns */
struct gstate : pn_cu_scratch {
    pn_attn_setup st;
    int kind;
    int64_t N, H, D, Dv, Dg, E;
};

void gstate_free(gstate *g) {
    pn_attn_setup_free(&g->st);
    pn_cu_scratch_free(g);
}

/* graph.c's graph_call_init + csr_load + pn_attn_prepare, on the device: checks (with the CPU's
 * messages), contiguous inputs, the CSR as i64, terms, NaN flags, Lorentz factors. */
template <typename T>
pn_status gsetup(const char *op, gstate *g, gcall<T> *c, const pn_tensor *q, const pn_tensor *k, const pn_tensor *v,
                 const pn_tensor *offsets, const pn_tensor *src, const pn_attn_opts *o) {
    memset(g, 0, sizeof *g);
    memset(c, 0, sizeof *c);
    g->op = op;
    const int64_t N = q->sizes[0], H = q->nd == 3 ? q->sizes[1] : 1, D = q->sizes[q->nd - 1],
                  Dv = v->sizes[v->nd - 1], E = src->sizes[0];
    g->N = N, g->H = H, g->D = D, g->Dv = Dv, g->E = E;
    if (offsets->nd != 1 || offsets->sizes[0] != N + 1 || src->nd != 1 || !pn_is_index(offsets->dt) ||
        !pn_is_index(src->dt))
        return pn_error(PN_ERR_SHAPE, "%s: offsets %s and src %s do not form a CSR over the %lld nodes of q %s", op,
                        pn_shape_str(offsets), pn_shape_str(src), (long long)N, pn_shape_str(q));
    /* the CSR as contiguous i64, and its contents checked (csr_load's order and messages) */
    pn_tensor *off = pn_cu_scratch_new(g, N + 1, PN_I64, false), *sr = pn_cu_scratch_new(g, E, PN_I64, false),
              *slots = pn_cu_scratch_new(g, 8, PN_I64, false);
    if (!off || !sr || !slots) return PN_ERR_OOM;
    unsigned long long *sl = (unsigned long long *)pn_ptr(slots);
    PN_TRY(pn_cu_check(op, PN_LAUNCH(idx_kernel, pn_cu_blocks(N + 1), PN_CU_THREADS, 0, pn_cu_stream(),
                                (const char *)pn_ptr(offsets), offsets->dt, offsets->strides[0], N + 1,
                                (int64_t *)pn_ptr(off))));
    if (E > 0)
        PN_TRY(pn_cu_check(op, PN_LAUNCH(idx_kernel, pn_cu_blocks(E), PN_CU_THREADS, 0, pn_cu_stream(),
                                    (const char *)pn_ptr(src), src->dt, src->strides[0], E, (int64_t *)pn_ptr(sr))));
    PN_TRY(pn_cu_check(op, cudaMemsetAsync(sl, 0xff, 8 * sizeof(unsigned long long), pn_cu_stream())));
    if (N > 0 || E > 0)
        PN_TRY(pn_cu_check(op, PN_LAUNCH(csr_check_kernel, pn_cu_blocks(N > E ? N : E), PN_CU_THREADS, 0, pn_cu_stream(),
                                    (const int64_t *)pn_ptr(off), (const int64_t *)pn_ptr(sr), N, E, sl)));
    {
        int64_t ends[2], bad[2];
        PN_TRY(pn_cuda_download(&ends[0], pn_ptr(off), sizeof(int64_t)));
        PN_TRY(pn_cuda_download(&ends[1], (int64_t *)pn_ptr(off) + N, sizeof(int64_t)));
        PN_TRY(pn_cuda_download(bad, sl, sizeof bad));
        if (ends[0] != 0 || ends[1] != E)
            return pn_error(PN_ERR_INDEX, "%s: offsets %s must start at 0 and end at the number of edges %lld (src %s), "
                            "got %lld and %lld", op, pn_shape_str(offsets), (long long)E, pn_shape_str(src),
                            (long long)ends[0], (long long)ends[1]);
        if (bad[0] != -1)
            return pn_error(PN_ERR_INDEX, "%s: offsets %s decrease at node %lld", op, pn_shape_str(offsets),
                            (long long)bad[0]);
        if (bad[1] != -1) {
            int64_t node;
            PN_TRY(pn_cuda_download(&node, (int64_t *)pn_ptr(sr) + bad[1], sizeof node));
            return pn_error(PN_ERR_INDEX, "%s: src %s holds node %lld at edge %lld, outside [0, %lld) for q %s", op,
                            pn_shape_str(src), (long long)node, (long long)bad[1], (long long)N, pn_shape_str(q));
        }
    }
    /* the options, the plan, the per-head parameters */
    PN_TRY(pn_attn_setup_init(op, o, q->dt, H, D, 1, &g->st));
    const pn_score_plan *pl = &g->st.plan;
    g->kind = score_kind(&g->st, o);
    if (g->kind == K_NONE)
        return pn_error(PN_ERR_ARG, "%s: score '%s'%s has no CUDA epilogue (core/cuda/attention/graph.cu)", op,
                        g->st.desc->name, pl->note);
    PN_TRY(resolve_params(op, o, D, &g->st));
    g->Dg = pl->gemm == PN_GEMM_HEAD ? D - 1 : D;
    /* inputs: contiguous node-major */
    pn_tensor *qc = pn_cu_keep(g, pn_contig((pn_tensor *)q)), *kc = pn_cu_keep(g, pn_contig((pn_tensor *)k)),
              *vc = pn_cu_keep(g, pn_contig((pn_tensor *)v));
    if (!qc || !kc || !vc) return PN_ERR_OOM;
    const bool proj = pl->qterm[0] == PN_TERM_PROJ || pl->qterm[1] == PN_TERM_PROJ;
    pn_tensor *al = NULL, *ar = NULL;
    if (proj && (!(al = pn_cu_keep(g, pn_contig(o->a_l))) || !(ar = pn_cu_keep(g, pn_contig(o->a_r))))) return PN_ERR_OOM;
    pn_tensor *hp = pn_cu_scratch_new(g, (int64_t)(H * sizeof(pn_score_params)), PN_U8, false);
    if (!hp) return PN_ERR_OOM;
    PN_TRY(pn_cuda_upload(pn_ptr(hp), g->st.hp, (size_t)H * sizeof(pn_score_params)));

    c->N = N, c->H = H, c->D = D, c->Dv = Dv, c->Dg = g->Dg, c->E = E;
    c->einstein = g->st.einstein;
    c->q = (const T *)pn_ptr(qc), c->k = (const T *)pn_ptr(kc), c->v = (const T *)pn_ptr(vc);
    c->a_l = al ? (const T *)pn_ptr(al) : NULL, c->a_r = ar ? (const T *)pn_ptr(ar) : NULL;
    c->off = (const int64_t *)pn_ptr(off), c->src = (const int64_t *)pn_ptr(sr);
    c->hp = (const pn_score_params *)pn_ptr(hp);
    PN_TRY(call_rows(g, &g->st, q->dt, N * H, N * H, c));
    if (N == 0) return PN_OK;

    /* terms, flags, Lorentz factors; then the checks in pn_attn_prepare's order */
    PN_TRY(pn_cu_check(op, cudaMemsetAsync(sl, 0xff, 8 * sizeof(unsigned long long), pn_cu_stream())));
    auto kp = prep_kernel<T>;
    PN_TRY(pn_cu_check(op, PN_LAUNCH(kp, pn_cu_blocks(N * H, GT), GT, 0, pn_cu_stream(), *c, pl->req, (int32_t *)c->qbad,
                                (int32_t *)c->kbad, sl)));
    int64_t bad[SL_N];
    PN_TRY(pn_cuda_download(bad, sl, sizeof bad));
    const char *qs = pn_shape_str(q), *ks = pn_shape_str(k), *vs = pn_shape_str(v);
    char qsb[128], ksb[128], vsb[128];
    snprintf(qsb, sizeof qsb, "%s", qs);
    snprintf(ksb, sizeof ksb, "%s", ks);
    snprintf(vsb, sizeof vsb, "%s", vs);
    for (int side = 0; side < 2 && pl->req; side++)
        if (bad[SL_QNF + side] != -1)
            return pn_error(PN_ERR_ARG, "%s: %s %s is not on the manifold of score '%s': a coordinate is NaN or "
                            "infinite at %s", op, side ? "k" : "q", side ? ksb : qsb, g->st.desc->name,
                            row_str(bad[SL_QNF + side], H));
    for (int side = 0; side < 2; side++) {
        const int *kinds = side ? pl->kterm : pl->qterm;
        for (int m = 0; m < 2; m++) {
            const int64_t hx = bad[SL_QT0 + 2 * side + m];
            if (hx == -1) continue;
            const int64_t h = hx / N, x = (hx % N) * H + h;
            T tv;
            PN_TRY(pn_cuda_download(&tv, (side ? c->kt : c->qt)[m] + x, sizeof tv));
            const double val = tv, kap = g->st.hp[h].v[PN_P_curvature];
            if (kinds[m] == PN_TERM_LAST)
                return pn_error(PN_ERR_ARG, "%s: %s %s is not on the manifold of score '%s'%s: the last coordinate "
                                "(height / time) must be > 0 and finite, got %g at %s", op, side ? "k" : "q",
                                side ? ksb : qsb, g->st.desc->name, pl->note, val, row_str(x, H));
            return pn_error(PN_ERR_ARG, "%s: %s %s has a point outside the Poincaré ball of score '%s': "
                            "curvature·‖x‖² = %g must be < 1, at %s", op, side ? "k" : "q", side ? ksb : qsb,
                            g->st.desc->name, kap * val, row_str(x, H));
        }
    }
    if (bad[SL_LOR] != -1) {
        const int64_t h = bad[SL_LOR] / N, x = (bad[SL_LOR] % N) * H + h;
        double n2 = 0;
        PN_TRY(row_norm2(op, c->v + x * Dv, Dv, &n2));
        return pn_error(PN_ERR_ARG, "%s: v %s has a point outside the Klein ball of the einstein aggregation: "
                        "curvature·‖v‖² = %g must be < 1, at %s", op, vsb, g->st.hp[h].v[PN_P_curvature] * n2,
                        row_str(x, H));
    }
    return PN_OK;
}

template <typename T>
pn_status gforward(const char *op, const pn_tensor *q, const pn_tensor *k, const pn_tensor *v,
                   const pn_tensor *offsets, const pn_tensor *src, const pn_attn_opts *o, pn_tensor *out,
                   pn_tensor *stat, pn_tensor *drop, pn_tensor *w) {
    gstate g;
    gcall<T> c;
    pn_status s = gsetup<T>(op, &g, &c, q, k, v, offsets, src, o);
    if (!s && drop && pn_numel(drop) > 0) {
        auto kd = drop_kernel<T>;
        s = pn_cu_check(op, PN_LAUNCH(kd, pn_cu_blocks(pn_numel(drop)), PN_CU_THREADS, 0, pn_cu_stream(), (T *)pn_ptr(drop),
                                 pn_numel(drop), o->dropout));
    }
    if (!s && c.N > 0) {
        score_switch(g.kind, [&](auto tag) {
            typedef decltype(tag) S;
            auto kf = gfwd_kernel<T, S>;
            s = pn_cu_check(op, PN_LAUNCH(kf, pn_cu_blocks(c.N * c.H, GT), GT, 0, pn_cu_stream(), c,
                                     drop ? (const T *)pn_ptr(drop) : (const T *)NULL,
                                     out ? (T *)pn_ptr(out) : (T *)NULL, (T *)pn_ptr(stat),
                                     w ? (T *)pn_ptr(w) : (T *)NULL));
        });
    }
    gstate_free(&g);
    return s;
}

template <typename T>
pn_status gbackward(const char *op, const pn_tensor *q, const pn_tensor *k, const pn_tensor *v,
                    const pn_tensor *offsets, const pn_tensor *src, const pn_attn_opts *o, const pn_tensor *out_,
                    const pn_tensor *stat_, const pn_tensor *drop_, const pn_tensor *gout, pn_tensor *dq_t,
                    pn_tensor *dk_t, pn_tensor *dv_t, pn_tensor *const *dparam_t, pn_tensor *da_l_t,
                    pn_tensor *da_r_t) {
    if (!pn_is_contiguous(dq_t) || !pn_is_contiguous(dk_t) || (dv_t && !pn_is_contiguous(dv_t)))
        return pn_error(PN_ERR_ARG, "%s: the gradients handed to the CUDA kernel must be contiguous", op);
    gstate g;
    gcall<T> c;
    pn_status s = gsetup<T>(op, &g, &c, q, k, v ? v : k, offsets, src, o);
    const int64_t N = c.N, H = c.H, E = c.E, NH = N * H, EH = E * H;
    const int dt = q->dt;
    pn_tensor *gc = NULL;
    if (!s && !(gc = pn_cu_keep(&g, pn_contig((pn_tensor *)gout)))) s = PN_ERR_OOM;
    if (s || N == 0) {
        gstate_free(&g);
        return s;
    }
    const pn_score_plan *pl = &g.st.plan;
    unsigned learn = 0;
    for (int64_t h = 0; h < H; h++) learn |= g.st.hp[h].learn;
    gbw<T> a;
    memset(&a, 0, sizeof a);
    a.dout = (const T *)pn_ptr(gc), a.weights = v == NULL;
    a.out = a.weights ? NULL : (const T *)pn_ptr(out_);
    a.stat = (const T *)pn_ptr(stat_), a.drop = drop_ ? (const T *)pn_ptr(drop_) : NULL;
    a.dq = (T *)pn_ptr(dq_t);
    double *dkt[2] = {NULL, NULL}, *dg = NULL, *gpar = NULL;
    pn_tensor *t;
    int64_t *roff = NULL, *fill = NULL, *rev = NULL, *dst = NULL;
    bool oom = false;
#define SCRATCH(ptr, n, dtype, zero)                                                                     \
    do {                                                                                                 \
        if (!(t = pn_cu_scratch_new(&g, (n), (dtype), (zero))))                                                   \
            oom = true;                                                                                  \
        else                                                                                             \
            ptr = (typename std::remove_reference<decltype(ptr)>::type)pn_ptr(t);                                                            \
    } while (0)
    if (learn) SCRATCH(a.dparam, NH * PN_NPARAM, PN_F64, 1);
    SCRATCH(a.eG, EH, dt, 0);
    SCRATCH(a.ew, EH, dt, 0);
    for (int m = 0; m < 2; m++) {
        if (pl->qterm[m] != PN_TERM_NONE) SCRATCH(a.dqt[m], NH, PN_F64, 1);
        if (pl->kterm[m] != PN_TERM_NONE) {
            SCRATCH(dkt[m], NH, PN_F64, 1);
            SCRATCH(a.ek[m], EH, dt, 0);
        }
    }
    if (g.st.einstein) {
        SCRATCH(dg, NH, PN_F64, 1);
        SCRATCH(a.edg, EH, dt, 0);
    }
    SCRATCH(roff, N + 1, PN_I64, 1);
    SCRATCH(fill, N + 1, PN_I64, 0);
    SCRATCH(rev, E, PN_I64, 0);
    SCRATCH(dst, E, PN_I64, 0);
    SCRATCH(gpar, (int64_t)PN_NPARAM * H, PN_F64, 0);
#undef SCRATCH
    if (oom) {
        gstate_free(&g);
        return PN_ERR_OOM;
    }
    const unsigned nb = pn_cu_blocks(NH, GT);
    /* the transposed CSR: edge ids grouped by source, increasing within a group */
    s = pn_cu_check(op, PN_LAUNCH(dst_kernel, pn_cu_blocks(N), PN_CU_THREADS, 0, pn_cu_stream(), c.off, c.src, N, dst,
                             roff));
    if (!s) s = pn_cu_check(op, PN_LAUNCH(scan_kernel, 1, 1, 0, pn_cu_stream(), roff, fill, N));
    if (!s && E > 0)
        s = pn_cu_check(op, PN_LAUNCH(rfill_kernel, pn_cu_blocks(E), PN_CU_THREADS, 0, pn_cu_stream(), c.src, E, fill, rev));
    if (!s) s = pn_cu_check(op, PN_LAUNCH(rsort_kernel, pn_cu_blocks(N), PN_CU_THREADS, 0, pn_cu_stream(), roff, N, rev));
    /* pass 1 per destination, pass 2 per source */
    if (!s) {
        score_switch(g.kind, [&](auto tag) {
            typedef decltype(tag) S;
            auto k1 = gbw1_kernel<T, S>;
            s = pn_cu_check(op, PN_LAUNCH(k1, nb, GT, 0, pn_cu_stream(), c, a));
        });
    }
    auto k2 = gbw2_kernel<T>;
    if (!s)
        s = pn_cu_check(op, PN_LAUNCH(k2, nb, GT, 0, pn_cu_stream(), c, a, (const int64_t *)roff, (const int64_t *)rev,
                                 (const int64_t *)dst, (T *)pn_ptr(dk_t), dv_t ? (T *)pn_ptr(dv_t) : (T *)NULL, dkt[0],
                                 dkt[1], dg));
    /* the terms' backward, the PROJ vectors' gradients, the Lorentz factors', the parameters' */
    auto kt = terms_bw_kernel<T>;
    if (!s)
        s = pn_cu_check(op, PN_LAUNCH(kt, nb, GT, 0, pn_cu_stream(), c, (const double *)a.dqt[0],
                                 (const double *)a.dqt[1], (const double *)dkt[0], (const double *)dkt[1],
                                 (T *)pn_ptr(dq_t), (T *)pn_ptr(dk_t)));
    pn_tensor *da_t[2] = {da_l_t, da_r_t};
    for (int side = 0; side < 2 && !s && c.a_l; side++) {
        if (!da_t[side]) continue;
        const int *kinds = side ? pl->kterm : pl->qterm;
        double *const *dts = side ? dkt : a.dqt;
        int m = kinds[0] == PN_TERM_PROJ ? 0 : kinds[1] == PN_TERM_PROJ ? 1 : -1;
        if (m < 0 || !dts[m]) continue;
        auto kp = proj_grad_kernel<T>;
        s = pn_cu_check(op, PN_LAUNCH(kp, pn_cu_blocks(H * c.D), PN_CU_THREADS, 0, pn_cu_stream(), c,
                                 (const double *)dts[m], side ? c.k : c.q, (char *)pn_ptr(da_t[side]),
                                 da_t[side]->dt));
    }
    if (!s && dg && dv_t) {
        auto kl = lorentz_bw_kernel<T>;
        s = pn_cu_check(op, PN_LAUNCH(kl, nb, GT, 0, pn_cu_stream(), c, (const double *)dg, (T *)pn_ptr(dv_t)));
    }
    bool any_param = false;
    for (int p = 0; p < PN_NPARAM; p++) any_param |= dparam_t[p] != NULL;
    if (!s && any_param) {
        auto kr = param_reduce_kernel<T>;
        s = pn_cu_check(op, PN_LAUNCH(kr, pn_cu_blocks((int64_t)PN_NPARAM * H), PN_CU_THREADS, 0, pn_cu_stream(), c,
                                 (const double *)dg, (const double *)a.dparam, gpar));
        for (int p = 0; p < PN_NPARAM && !s; p++) {
            pn_tensor *pt = dparam_t[p];
            if (!pt) continue;
            const int per_head = pt->nd == 1 && pt->sizes[0] == H && H > 1;
            s = pn_cu_check(op, PN_LAUNCH(param_into_kernel, 1, 1, 0, pn_cu_stream(), (char *)pn_ptr(pt), pt->dt, per_head,
                                     per_head ? pt->strides[0] : (int64_t)0, (const double *)gpar + p * H, H));
        }
    }
    gstate_free(&g);
    return s;
}

} // namespace

/* ---- the kernels of kernels.def ---------------------------------------------------------------- */
pn_status pn_cuda_attention_graph_fwd(const pn_tensor *q, const pn_tensor *k, const pn_tensor *v,
                                      const pn_tensor *offsets, const pn_tensor *src, const pn_attn_opts *o,
                                      pn_tensor *out, pn_tensor *stat, pn_tensor *drop) {
    const char *op = "graph_attention";
    if (q->dt == PN_F32) return gforward<float>(op, q, k, v, offsets, src, o, out, stat, drop, NULL);
    return gforward<double>(op, q, k, v, offsets, src, o, out, stat, drop, NULL);
}

pn_status pn_cuda_attention_graph_weights(const pn_tensor *q, const pn_tensor *k, const pn_tensor *offsets,
                                          const pn_tensor *src, const pn_attn_opts *o, pn_tensor *w, pn_tensor *stat) {
    const char *op = "graph_attention_weights";
    if (q->dt == PN_F32) return gforward<float>(op, q, k, k, offsets, src, o, NULL, stat, NULL, w);
    return gforward<double>(op, q, k, k, offsets, src, o, NULL, stat, NULL, w);
}

pn_status pn_cuda_attention_graph_bwd(const pn_tensor *q, const pn_tensor *k, const pn_tensor *v,
                                      const pn_tensor *offsets, const pn_tensor *src, const pn_attn_opts *o,
                                      const pn_tensor *out, const pn_tensor *stat, const pn_tensor *drop,
                                      const pn_tensor *gout, pn_tensor *dq, pn_tensor *dk, pn_tensor *dv,
                                      pn_tensor *const *dparam, pn_tensor *da_l, pn_tensor *da_r) {
    const char *op = v ? "graph_attention" : "graph_attention_weights";
    if (q->dt == PN_F32)
        return gbackward<float>(op, q, k, v, offsets, src, o, out, stat, drop, gout, dq, dk, dv, dparam, da_l, da_r);
    return gbackward<double>(op, q, k, v, offsets, src, o, out, stat, drop, gout, dq, dk, dv, dparam, da_l, da_r);
}

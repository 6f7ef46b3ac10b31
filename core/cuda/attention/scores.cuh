/* scores.cuh — what the CUDA attention drivers (graph.cu: CSR neighbourhoods; dense.cu: dense
 * (B, H, N, D) inputs) share: the score headers' per-pair maths instantiated for float and double,
 * one struct S_<X> per epilogue generated from THE list GRAPH_SCORES (a new score is one line
 * there), the lookup of a resolved setup's epilogue (score_kind) and the dispatch (score_switch),
 * the per-head parameters read from device tensors (resolve_params) and a parameter gradient's
 * accumulation (param_into_kernel).
 *
 * The maths is the CPU's: the score headers (dot.h, laplacian.h, cone.h, hyperdist.h, gat.h,
 * sqdist.h) are included with their per-pair functions (PN_HD: <X>_head, <X>_key, <X>_row, <X>_pair,
 * <X>_pair_vjp) and without the CPU block loops (PN_EPI_BLOCKS is defined empty before they are
 * included); the f32 exp/log/rsqrt/acosh are fastmath.h's, as on the CPU. Everything lives in an
 * anonymous namespace: each including .cu gets its own copy. */
#ifndef PN_CUDA_ATTENTION_SCORES_CUH
#define PN_CUDA_ATTENTION_SCORES_CUH

#include "../cuda.cuh"

#define _Static_assert static_assert /* attention.h is C11 */
extern "C" {
#include "../../attention/attention.h"
}
#undef _Static_assert
#include "../../attention/fastmath.h"

#include <stdio.h>
#include <type_traits>

/* ---- the score maths, per pair (no CPU block loops) ------------------------------------------- */
#define PN_EPI_BLOCKS(X, TERMS, NKX, P0, P1, P2)

#define real float
#define EPI(name) cu_##name##_f32
#define PN_EPI_EPS 1e-6f
#include "../../attention/epi_impl.h"
#undef real
#undef EPI
#undef PN_EPI_EPS

#define real double
#define EPI(name) cu_##name##_f64
#define PN_EPI_EPS 1e-14
#include "../../attention/epi_impl.h"
#undef real
#undef EPI
#undef PN_EPI_EPS

namespace {

enum { T_Q0 = 1, T_Q1 = 2, T_K0 = 4, T_K1 = 8 };

/* the per-row / per-key value type of a precision */
template <typename T> struct prec;
template <> struct prec<float> { typedef cu_x4_f32 x4; };
template <> struct prec<double> { typedef cu_x4_f64 x4; };

/* A score as the kernels see it: its per-pair functions for float and double (overloads), the
 * terms it reads (as in its PN_EPI_BLOCKS line: absent ones are passed as 0) and the parameter
 * ids of its VJP's p0, p1, p2 (−1: none). */
#define SCORE(X, TERMS, DIFF, P0, P1, P2)                                                                            \
    struct S_##X {                                                                                                   \
        enum { terms = (TERMS), diff = (DIFF) };                                                                     \
        __device__ static int pid(int i) { return i == 0 ? (P0) : i == 1 ? (P1) : (P2); }                           \
        __device__ static cu_##X##_h_f32 head(const pn_score_params *p, float) { return cu_##X##_head_f32(p); }     \
        __device__ static cu_##X##_h_f64 head(const pn_score_params *p, double) { return cu_##X##_head_f64(p); }    \
        __device__ static cu_x4_f32 key(const cu_##X##_h_f32 *h, float k0, float k1) {                              \
            return cu_##X##_key_f32(h, k0, k1);                                                                      \
        }                                                                                                            \
        __device__ static cu_x4_f64 key(const cu_##X##_h_f64 *h, double k0, double k1) {                            \
            return cu_##X##_key_f64(h, k0, k1);                                                                      \
        }                                                                                                            \
        __device__ static cu_x4_f32 row(const cu_##X##_h_f32 *h, float q0, float q1) {                              \
            return cu_##X##_row_f32(h, q0, q1);                                                                      \
        }                                                                                                            \
        __device__ static cu_x4_f64 row(const cu_##X##_h_f64 *h, double q0, double q1) {                            \
            return cu_##X##_row_f64(h, q0, q1);                                                                      \
        }                                                                                                            \
        __device__ static float pair(const cu_##X##_h_f32 *h, cu_x4_f32 r, cu_x4_f32 k, float G, float q0, float q1, \
                                     float k0, float k1) {                                                           \
            return cu_##X##_pair_f32(h, r, k, G, q0, q1, k0, k1).s;                                                  \
        }                                                                                                            \
        __device__ static double pair(const cu_##X##_h_f64 *h, cu_x4_f64 r, cu_x4_f64 k, double G, double q0,        \
                                      double q1, double k0, double k1) {                                             \
            return cu_##X##_pair_f64(h, r, k, G, q0, q1, k0, k1).s;                                                  \
        }                                                                                                            \
        __device__ static cu_dpair_f32 vjp(const cu_##X##_h_f32 *h, cu_x4_f32 r, cu_x4_f32 k, float G, float q0,     \
                                           float q1, float k0, float k1, float ds, int want) {                       \
            return cu_##X##_pair_vjp_f32(h, r, k, G, q0, q1, k0, k1, ds, 0, 0, 0, want);                             \
        }                                                                                                            \
        __device__ static cu_dpair_f64 vjp(const cu_##X##_h_f64 *h, cu_x4_f64 r, cu_x4_f64 k, double G, double q0,   \
                                           double q1, double k0, double k1, double ds, int want) {                   \
            return cu_##X##_pair_vjp_f64(h, r, k, G, q0, q1, k0, k1, ds, 0, 0, 0, want);                             \
        }                                                                                                            \
    };
/* THE list of the CUDA attention epilogues (graph.cu, dense.cu): one line per epilogue of epi_impl.h's headers — its name
 * (a registry score, or one of hyperbolic's models), the terms it reads, whether it is a distance
 * score (its plan's .diff: G = −½‖q − k‖², which the tensor-core kernels compile in or out; they
 * leave a call whose plan disagrees to the wmma ones) and its parameters (from its PN_EPI_BLOCKS
 * line). The per-pair structs, the kinds, the lookup from a registry row and the dispatch all come
 * from this list: a new score adds one line here. */
#define GRAPH_SCORES(X)                                      \
    X(dot, 0, 0, PN_P_scale, -1, -1)                         \
    X(laplacian, 0, 1, PN_P_gamma, -1, -1)                   \
    X(umbral, T_Q1 | T_K1, 1, PN_P_gamma, PN_P_r, -1)        \
    X(penumbral, T_Q1 | T_K1, 1, PN_P_gamma, PN_P_r, -1)     \
    X(hyperboloid, T_Q1 | T_K1, 1, PN_P_beta, PN_P_c, -1)    \
    X(halfspace, T_Q1 | T_K1, 1, PN_P_beta, PN_P_c, -1)      \
    X(poincare, T_Q0 | T_K0, 1, PN_P_beta, PN_P_c, PN_P_curvature) \
    X(gat, T_Q0 | T_K0, 0, PN_P_slope, -1, -1)               \
    X(sqdist, 0, 1, PN_P_tau, -1, -1)
GRAPH_SCORES(SCORE)
#undef SCORE
#define KIND_ID(X, ...) K_##X,
enum { GRAPH_SCORES(KIND_ID) K_NONE };
#undef KIND_ID

/* the epilogue of a resolved setup: the registry row's name (for hyperbolic, its model's) */
inline int score_kind(const pn_attn_setup *st, const pn_attn_opts *o) {
    const char *n = st->desc->name;
    if (!strcmp(n, "hyperbolic"))
        n = o->model == PN_MODEL_HYPERBOLOID ? "hyperboloid"
            : o->model == PN_MODEL_HALFSPACE ? "halfspace"
            : o->model == PN_MODEL_POINCARE  ? "poincare"
                                             : "";
#define KIND_OF(X, ...) \
    if (!strcmp(n, #X)) return K_##X;
    GRAPH_SCORES(KIND_OF)
#undef KIND_OF
    return K_NONE;
}

/* f(S_<X>{}) for the epilogue of kind (a generic lambda: `typedef decltype(tag) S;`) */
template <typename F> void score_switch(int kind, F &&f) {
#ifdef PN_CU_ONLY_SCORE /* tools/gpu/sass.sh: one score's kernels alone (-DPN_CU_ONLY_SCORE=S_dot), to read their SASS in a minute */
    (void)kind;
    f(PN_CU_ONLY_SCORE{});
#else
    switch (kind) {
#define KIND_CASE(X, ...) \
    case K_##X: f(S_##X{}); break;
        GRAPH_SCORES(KIND_CASE)
#undef KIND_CASE
    }
#endif
}

/* The per-head parameters, read where they are (the device): pn_attn_setup_resolve on host
 * copies of the parameter tensors, then the learn bits of the originals. */
inline pn_status resolve_params(const char *op, const pn_attn_opts *o, int64_t D, pn_attn_setup *st) {
    pn_attn_opts h = *o;
    pn_tensor *cp[PN_ATTN_MAX_PARAMS] = {NULL};
    pn_status s = PN_OK;
    for (int p = 0; p < PN_NPARAM && !s; p++) {
        pn_tensor *t = o->param_t[p];
        if (!t || t->dev == PN_CPU) continue;
        if (!(cp[p] = pn_empty(t->nd, t->sizes, t->dt, PN_CPU)) || pn_copy_(cp[p], t)) s = PN_ERR_OOM;
        h.param_t[p] = cp[p];
    }
    if (!s) s = pn_attn_setup_resolve(op, &h, D, st);
    for (int p = 0; p < PN_NPARAM; p++) pn_release(cp[p]);
    if (s) return s;
    for (int p = 0; p < PN_NPARAM; p++)
        if (o->param_t[p] && pn_requires_grad(o->param_t[p]))
            for (int64_t i = 0; i < st->H; i++) st->hp[i].learn |= PN_PBIT(p);
    return PN_OK;
}

/* ---- per-pair helpers of the kernels, over either call struct (graph.cu's gcall<T>, dense.cu's
 * dcall<T>: both have q, k, D, Dg, gemm, diff, qt, kt, qbad, kbad, hp) ---------------------------- */

/* G of q row qr against k row kr (over Dg coordinates): q·k, or −½‖q − k‖² for a distance score */
template <typename C, typename T> __device__ T gdot(const C &c, const T *qr, const T *kr) {
    if (!c.gemm) return 0;
    T acc = 0;
    if (c.diff) {
        for (int64_t d = 0; d < c.Dg; d++) {
            const T t = qr[d] - kr[d];
            acc += t * t;
        }
        acc *= (T)-0.5;
    } else {
        for (int64_t d = 0; d < c.Dg; d++) acc += qr[d] * kr[d];
    }
    return acc;
}

/* One query row as the kernels see it: its head constants, row values and terms; x its flat row
 * index in the per-row arrays (the drivers' row structs add their own indices). */
template <typename T, typename S> struct qrow {
    decltype(S::head((const pn_score_params *)0, T(0))) hd;
    typename prec<T>::x4 rx;
    T q0, q1;
    int qb;
    const T *qr;
    int64_t x;
};

/* r's head constants (head h), row terms and values for the flat row x */
template <typename C, typename T, typename S> __device__ void qrow_init(const C &c, int64_t h, int64_t x, qrow<T, S> &r) {
    r.x = x;
    r.hd = S::head(&c.hp[h], T(0));
    r.q0 = (S::terms & T_Q0) ? c.qt[0][x] : 0;
    r.q1 = (S::terms & T_Q1) ? c.qt[1][x] : 0;
    r.rx = S::row(&r.hd, r.q0, r.q1);
    r.qb = c.qbad[x];
    r.qr = c.q + x * c.D;
}

/* the score's pair value of row r against the key of flat row y (no modifiers, no NaN rows);
 * also G, the key terms and values (for the VJP) */
template <typename C, typename T, typename S>
__device__ T pair_score(const C &c, const qrow<T, S> &r, int64_t y, T *G, T *k0, T *k1, typename prec<T>::x4 *kx) {
    *G = gdot(c, r.qr, c.k + y * c.D);
    *k0 = (S::terms & T_K0) ? c.kt[0][y] : 0;
    *k1 = (S::terms & T_K1) ? c.kt[1][y] : 0;
    *kx = S::key(&r.hd, *k0, *k1);
    return S::pair(&r.hd, r.rx, *kx, *G, r.q0, r.q1, *k0, *k1);
}

template <typename T> __device__ T sigm(T s) { return 1 / (1 + pn_exp(-s)); }

/* the learn bits of the score's VJP parameters on head h */
template <typename S> __device__ int wants(const pn_score_params *hp) {
    return (hp->learn & ((S::pid(0) >= 0 ? PN_PBIT(S::pid(0)) : 0u) | (S::pid(1) >= 0 ? PN_PBIT(S::pid(1)) : 0u) |
                         (S::pid(2) >= 0 ? PN_PBIT(S::pid(2)) : 0u))) != 0;
}

/* whether row r (n coordinates) has a non-finite coordinate */
template <typename T> __device__ int nonfinite(const T *r, int64_t n) {
    T z = 0;
    for (int64_t d = 0; d < n; d++) z += r[d] * (T)0;
    return z != 0 || z != z;
}

/* whether a row's term value v of kind breaks the manifold the score requires (req: PN_REQ_*
 * bits; kap: the head's curvature) */
__device__ inline bool term_bad(int kind, unsigned req, double kap, double v) {
    unsigned rq = 0;
    if (kind == PN_TERM_LAST && (req & PN_REQ_LAST_POS)) rq = PN_REQ_LAST_POS;
    if (kind == PN_TERM_NORM2 && (req & PN_REQ_BALL)) rq = PN_REQ_BALL;
    return rq == PN_REQ_LAST_POS ? !(v > 0 && v < INFINITY) : rq ? !(kap * v < 1) : false;
}

/* the Lorentz factor γ(v) = 1/√(1 − κ‖v‖²) of row vr (Dv) into *g; false (g untouched) when v is
 * outside the Klein ball */
template <typename T> __device__ bool lorentz(const T *vr, int64_t Dv, double kap, T *g) {
    double n2 = 0;
    for (int64_t d = 0; d < Dv; d++) n2 += (double)vr[d] * vr[d];
    if (!(kap * n2 < 1)) return false;
    *g = (T)(1.0 / sqrt(1.0 - kap * n2));
    return true;
}

/* Host side: ‖r‖² of the device row r (n values), for a message */
template <typename T> pn_status row_norm2(const char *op, const T *r, int64_t n, double *n2) {
    T *row = (T *)malloc(sizeof(T) * (size_t)(n > 0 ? n : 1));
    if (!row) return pn_error(PN_ERR_OOM, "%s: out of memory", op);
    pn_status s = n > 0 ? pn_cuda_download(row, r, sizeof(T) * (size_t)n) : PN_OK;
    *n2 = 0;
    for (int64_t d = 0; d < n; d++) *n2 += (double)row[d] * row[d];
    free(row);
    return s;
}

/* Host side: a call struct's (gcall<T>, dcall<T>) fields from the resolved setup st — the plan
 * (gemm, diff, the term kinds) and the normalization — and its per-row scratch in g: the terms of
 * nq query / nk key rows, their NaN flags, the Lorentz factors of the nk keys (einstein). */
template <template <typename> class C, typename T>
pn_status call_rows(pn_cu_scratch *g, const pn_attn_setup *st, int dt, int64_t nq, int64_t nk, C<T> *c) {
    const pn_score_plan *pl = &st->plan;
    c->gemm = pl->gemm != PN_GEMM_NONE, c->diff = pl->diff;
    c->norm = st->normalize, c->normalized = st->normalized;
    for (int m = 0; m < 2; m++) c->qk[m] = pl->qterm[m], c->kk[m] = pl->kterm[m];
    for (int m = 0; m < 2; m++) {
        pn_tensor *t;
        if (pl->qterm[m] != PN_TERM_NONE) {
            if (!(t = pn_cu_scratch_new(g, nq, dt, false))) return PN_ERR_OOM;
            c->qt[m] = (T *)pn_ptr(t);
        }
        if (pl->kterm[m] != PN_TERM_NONE) {
            if (!(t = pn_cu_scratch_new(g, nk, dt, false))) return PN_ERR_OOM;
            c->kt[m] = (T *)pn_ptr(t);
        }
    }
    pn_tensor *qb = pn_cu_scratch_new(g, nq, PN_I32, false), *kb = pn_cu_scratch_new(g, nk, PN_I32, false), *gt = NULL;
    if (!qb || !kb || (st->einstein && !(gt = pn_cu_scratch_new(g, nk, dt, false)))) return PN_ERR_OOM;
    c->qbad = (int32_t *)pn_ptr(qb), c->kbad = (int32_t *)pn_ptr(kb);
    c->g = gt ? (T *)pn_ptr(gt) : NULL;
    return PN_OK;
}

/* a parameter's gradient (its shape: 0-dim, (1) or (H)) += the per-head sums g (H); one thread */
__global__ void param_into_kernel(char *out, int dt, int per_head, int64_t stride, const double *g, int64_t H) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    if (per_head) {
        for (int64_t h = 0; h < H; h++) pn_st(out, dt, h * stride, pn_ld(out, dt, h * stride) + g[h]);
    } else {
        double s = 0;
        for (int64_t h = 0; h < H; h++) s += g[h];
        pn_st(out, dt, 0, pn_ld(out, dt, 0) + s);
    }
}

} // namespace

#endif /* PN_CUDA_ATTENTION_SCORES_CUH */

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
#define SCORE(X, TERMS, P0, P1, P2)                                                                                  \
    struct S_##X {                                                                                                   \
        enum { terms = (TERMS) };                                                                                    \
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
 * (a registry score, or one of hyperbolic's models), the terms it reads and its parameters
 * (from its PN_EPI_BLOCKS line). The per-pair structs, the kinds, the lookup from a registry row
 * and the dispatch all come from this list: a new score adds one line here. */
#define GRAPH_SCORES(X)                                   \
    X(dot, 0, PN_P_scale, -1, -1)                         \
    X(laplacian, 0, PN_P_gamma, -1, -1)                   \
    X(umbral, T_Q1 | T_K1, PN_P_gamma, PN_P_r, -1)        \
    X(penumbral, T_Q1 | T_K1, PN_P_gamma, PN_P_r, -1)     \
    X(hyperboloid, T_Q1 | T_K1, PN_P_beta, PN_P_c, -1)    \
    X(halfspace, T_Q1 | T_K1, PN_P_beta, PN_P_c, -1)      \
    X(poincare, T_Q0 | T_K0, PN_P_beta, PN_P_c, PN_P_curvature) \
    X(gat, T_Q0 | T_K0, PN_P_slope, -1, -1)               \
    X(sqdist, 0, PN_P_tau, -1, -1)
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
    switch (kind) {
#define KIND_CASE(X, ...) \
    case K_##X: f(S_##X{}); break;
        GRAPH_SCORES(KIND_CASE)
#undef KIND_CASE
    }
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

/* dense.cu — the CUDA twins of attention/dense.c's kernels: fused distance-family attention on
 * dense (B, H, N, D) inputs (attention_dense_fwd, attention_dense_weights, attention_dense_bwd)
 * for every score of variants.def that is not graph-only (hyperbolic's three models included),
 * every normalize, causal (query i sees keys j <= i + Nk − Nq), mask, bias (and its gradient),
 * ALiBi, einstein aggregation, learnable per-head parameters.
 *
 * The maths is the CPU's: the per-pair functions of the score headers (PN_HD), one struct S_<X>
 * per epilogue from scores.cuh's list (shared with graph.cu). Semantics as dense.c / dense_impl.h
 * (the modifiers of row_mods in its order: bias, ALiBi, mask, causal, NaN rows; a fully masked row
 * gives 0 and the statistic −inf; a NaN or +inf score poisons its row; the statistic is the
 * logsumexp for softmax and Σσ·γ for sigmoid). One difference of method, none of meaning: the
 * distance scores' G = −½‖q − k‖² always comes from the coordinates' differences (the CPU uses the
 * expansion ‖q‖² + ‖k‖² − 2q·k where it keeps its precision) — as graph.cu does.
 *
 * Layout: q (BH, Nq, D), k (BH, Nk, D), v (BH, Nk, Dv) made contiguous; per-row arrays (terms,
 * NaN flags) (BH, Nq) and (BH, Nk); Lorentz factors (BH, Nk); stat (BH, Nq).
 *
 * Work. The tiled kernels (section "the tiled kernels" below) carry the forward and the backward's
 * dq and dk/dv: a block of 128 threads owns 32 query rows (or 32 keys) of one (b, h) and walks
 * the other side in 32-wide tiles through shared memory, four threads per row, an online softmax
 * per row, never an Nq × Nk buffer; the backward recomputes each tile from the saved statistic.
 * The row kernels — one thread per (bh, query row) walking its keys, per (bh, key) walking its
 * queries — are the fallback where the tiles do not fit the device's shared memory (D in the
 * thousands), and they compute what has no tiled kernel:
 *   weights   one thread per (bh, query row): the statistic, then its Nk weights;
 *   bias      the bias gradient per element of gb walking the pairs that broadcast to it;
 *   params    the parameters reduced per head in a fixed order.
 * Deterministic, no float atomics. These are CUDA-core kernels in T (f32, f64); with precision
 * bf16 / f16 the forward and both backward passes run on tensor cores instead (section "tensor
 * cores"), with the same tiling and the same per-pair code.
 * The CPU kernel's checks (the parameters, the manifolds, non-finite rows of a manifold score, the
 * Klein ball of einstein) run here too, with the CPU's messages: the device flags rows and finds
 * the first offending index (atomicMin of an index is order-independent), the host reads it. */
#include "scores.cuh"
#include "../mma_ptx.cuh"
#include "../ops/block_reduce.cuh" /* pn_cu_lanes_sum, _max, _or */

#include <stdio.h>

namespace {

enum { DT = 128 }; /* threads per block: (bh, row) items */

/* ---- the call: everything the kernels read, by value -------------------------------------------- */
template <typename T> struct dcall : pn_attn_dims { /* B, H, BH, Nq, Nk, D, Dv, off (= Nk − Nq: query i sees keys
                                                   * j <= i + off when causal), causal */
    int64_t Dg;
    int gemm, diff, norm, normalized;
    int qk[2], kk[2];              /* term kinds (PN_TERM_*) of the row / column slots */
    const T *q, *k, *v;            /* (BH, Nq, D), (BH, Nk, D), (BH, Nk, Dv) contiguous; v NULL: weights */
    T *qt[2], *kt[2];              /* (BH, Nq), (BH, Nk) or NULL */
    T *g;                          /* (BH, Nk) Lorentz factors γ(v_j) (einstein) or NULL */
    int32_t *qbad, *kbad;          /* (BH, Nq), (BH, Nk): rows with a non-finite coordinate (32-bit:
                                    * the mma kernels copy them by cp.async, 4 bytes at least) */
    const uint8_t *mask;           /* u8, canonical (b, h, i, j) strides ms, 0 where broadcast; or NULL */
    int64_t ms[4];
    const T *bias;                 /* q's dtype, canonical strides bs; or NULL */
    int64_t bs[4];
    const double *alibi;           /* (H) ALiBi slopes or NULL */
    const pn_score_params *hp;     /* (H) */
};

/* the keys query row i may see: [0, key_end) (causal: j <= i + off) */
template <typename T> __device__ int64_t key_end(const dcall<T> &c, int64_t i) {
    if (!c.causal) return c.Nk;
    const int64_t e = i + c.off + 1;
    return e < 0 ? 0 : e < c.Nk ? e : c.Nk;
}

/* One query row (bh, i) as the kernels see it (scores.cuh's qrow, x = bh·Nq + i) and its indices. */
template <typename T, typename S> struct drow : qrow<T, S> {
    int64_t bh, b, h, i;
};

template <typename T, typename S> __device__ void row_init(const dcall<T> &c, int64_t bh, int64_t i, drow<T, S> &r) {
    r.bh = bh, r.b = bh / c.H, r.h = bh - r.b * c.H, r.i = i;
    qrow_init(c, r.h, bh * c.Nq + i, r);
}

/* dense_impl.h's row modifiers (bias, ALiBi, mask, causal, NaN rows, in that order) on the pair
 * value s of row r against key j; kb: the key's NaN flag */
template <typename T, typename S> __device__ T mods(const dcall<T> &c, const drow<T, S> &r, int64_t j, T s, int kb) {
    bool masked = false; /* by the mask, the causal cut or a −inf bias: not by the score's value */
    if (c.bias) {
        const T bv = c.bias[r.b * c.bs[0] + r.h * c.bs[1] + r.i * c.bs[2] + j * c.bs[3]];
        s += bv;
        masked = bv == (T)-INFINITY;
    }
    if (c.alibi) s -= (T)c.alibi[r.h] * (T)(r.i + c.off - j);
    if (c.mask && !c.mask[r.b * c.ms[0] + r.h * c.ms[1] + r.i * c.ms[2] + j * c.ms[3]]) s = (T)-INFINITY, masked = true;
    if (c.causal && j > r.i + c.off) s = (T)-INFINITY, masked = true;
    if (r.qb || kb) s = masked ? (T)-INFINITY : (T)NAN; /* NaN in, NaN out (a −inf dot product too) */
    return s;
}

/* The score of the row against key j with the row modifiers; also G, the key terms and values
 * (for the VJP). */
template <typename T, typename S>
__device__ T score(const dcall<T> &c, const drow<T, S> &r, int64_t j, T *G, T *k0, T *k1, typename prec<T>::x4 *kx) {
    const int64_t y = r.bh * c.Nk + j;
    return mods(c, r, j, pair_score(c, r, y, G, k0, k1, kx), c.kbad[y]);
}

/* ---- forward ------------------------------------------------------------------------------------- */
/* out (BH, Nq, Dv): the row accumulates in place (rescaled as the running max grows); stat (BH, Nq) */
template <typename T, typename S> __global__ void fwd_kernel(dcall<T> c, T *out, T *stat) {
    PN_CU_LOOP(x, c.BH * c.Nq) {
        const int64_t bh = x / c.Nq, i = x - bh * c.Nq, kend = key_end(c, i);
        drow<T, S> r;
        row_init<T, S>(c, bh, i, r);
        T G, k0, k1;
        typename prec<T>::x4 kx;
        T *o = out + x * c.Dv;
        for (int64_t d = 0; d < c.Dv; d++) o[d] = 0;
        const bool soft = c.norm == PN_NORM_SOFTMAX;
        T m = (T)-INFINITY, l = 0;
        bool nan = false;
        for (int64_t j = 0; j < kend && !nan; j++) {
            const T s = score<T, S>(c, r, j, &G, &k0, &k1, &kx);
            const T gv = c.g ? c.g[bh * c.Nk + j] : (T)1;
            T p;
            if (soft) {
                if (s != s || s == (T)INFINITY) { /* row_softmax's poison: NaN, or +inf (inf − inf) */
                    nan = true;
                    break;
                }
                if (s == (T)-INFINITY) {
                    p = 0;
                } else {
                    if (s > m) { /* online: rescale the running sum and the row to the new max */
                        const T alpha = m == (T)-INFINITY ? (T)0 : pn_exp(m - s);
                        l *= alpha;
                        for (int64_t d = 0; d < c.Dv; d++) o[d] *= alpha;
                        m = s;
                    }
                    p = pn_exp(s - m) * gv;
                    l += p;
                }
            } else {
                p = sigm(s) * gv;
                l += p;
            }
            const T *vj = c.v + (bh * c.Nk + j) * c.Dv;
            for (int64_t d = 0; d < c.Dv; d++) o[d] += p * vj[d];
        }
        if (nan) l = (T)NAN;
        if (l != l) { /* a NaN row (not a fully masked one) */
            for (int64_t d = 0; d < c.Dv; d++) o[d] = (T)NAN;
        } else if (c.normalized) {
            const T inv = l > 0 ? 1 / l : 0; /* a fully masked row gives 0 */
            for (int64_t d = 0; d < c.Dv; d++) o[d] *= inv;
        }
        if (l != l) stat[x] = l;
        else if (soft) stat[x] = l > 0 ? m + pn_log(l) : (T)-INFINITY;
        else stat[x] = l;
    }
}

/* ---- weights ------------------------------------------------------------------------------------- */
/* w (BH, Nq, Nk): the normalised α_ij (no Lorentz factors); stat (BH, Nq) as the forward's */
template <typename T, typename S> __global__ void weights_kernel(dcall<T> c, T *w, T *stat) {
    PN_CU_LOOP(x, c.BH * c.Nq) {
        const int64_t bh = x / c.Nq, i = x - bh * c.Nq;
        drow<T, S> r;
        row_init<T, S>(c, bh, i, r);
        T G, k0, k1;
        typename prec<T>::x4 kx;
        T *wr = w + x * c.Nk;
        if (c.norm == PN_NORM_SOFTMAX) {
            T m = (T)-INFINITY, l = 0;
            bool nan = false;
            for (int64_t j = 0; j < c.Nk; j++) {
                const T s = score<T, S>(c, r, j, &G, &k0, &k1, &kx);
                if (s != s || s == (T)INFINITY) {
                    nan = true;
                    break;
                }
                if (s == (T)-INFINITY) continue;
                if (s > m) {
                    l = m == (T)-INFINITY ? (T)0 : l * pn_exp(m - s);
                    m = s;
                }
                l += pn_exp(s - m);
            }
            if (nan) {
                for (int64_t j = 0; j < c.Nk; j++) wr[j] = (T)NAN;
                stat[x] = (T)NAN;
                continue;
            }
            const T inv = l > 0 ? 1 / l : 0;
            for (int64_t j = 0; j < c.Nk; j++) {
                const T s = l > 0 ? score<T, S>(c, r, j, &G, &k0, &k1, &kx) : (T)-INFINITY;
                wr[j] = s == (T)-INFINITY ? (T)0 : pn_exp(s - m) * inv;
            }
            stat[x] = l > 0 ? m + pn_log(l) : (T)-INFINITY;
        } else {
            T l = 0;
            for (int64_t j = 0; j < c.Nk; j++) {
                const T sg = sigm(score<T, S>(c, r, j, &G, &k0, &k1, &kx));
                wr[j] = sg;
                l += sg;
            }
            stat[x] = l;
            if (c.norm == PN_NORM_SIGMOID_NORMALIZED) {
                const T inv = l > 0 ? 1 / l : 0;
                for (int64_t j = 0; j < c.Nk; j++) wr[j] *= inv;
            }
        }
    }
}

/* ---- backward ------------------------------------------------------------------------------------ */
template <typename T> struct dbw {
    const T *dout, *out, *stat; /* (BH, Nq, Do), (BH, Nq, Do), (BH, Nq); Do = Dv, or Nk for the weights */
    int weights;                /* the weights' backward: out = W, dout = dW, no v (V = I) */
    T *Drow;                    /* (BH, Nq) D_i = dO_i·O_i (normalized), written by the row pass */
    T *dq, *dk, *dv;            /* (BH, Nq, D), (BH, Nk, D), (BH, Nk, Dv) or NULL: += */
    double *dparam;             /* (BH, Nq, PN_NPARAM) per-row partials, or NULL */
    double *kcurv;              /* (BH, Nk) per-key ∂L/∂κ of the Lorentz factors, or NULL */
};

/* one pair recomputed from the row's statistic: its score, weight, σ, dS and ∂L/∂γ_j */
template <typename T> struct dpv {
    T s, p, ds, dgam, G, k0, k1;
    typename prec<T>::x4 kx;
};

/* the pair's weight p, dS and ∂L/∂γ_j from its score s, the key's Lorentz factor gv, the row's
 * statistic st and D_i, and dP = dO_i·v_j (or dW_ij) — the kernels' one copy of the normalizations.
 * SFU: the softmax's exp and the sigmoid on the special function unit (pn_cu_exp_sfu,
 * pn_cu_sigm_sfu: the tensor-core kernels). PLAIN: the caller knows the call is a softmax without
 * γ (gv = 1), so the run-time tests per pair fold away (SASS: two branches and both modes' code a
 * pair in the mma kernels without it) */
template <typename T, bool SFU = false, bool PLAIN = false>
__device__ void norm_ds(const dcall<T> &c, T s, T gv, T st, T Di, T dp, dpv<T> &o) {
    const bool soft = PLAIN || c.norm == PN_NORM_SOFTMAX, gam = !PLAIN && c.g;
    o.s = s;
    T sg = 0, w; /* w: the weight before γ, so ∂p/∂γ_j = w without dividing p by γ per pair */
    if (soft) {
        T e;
        if constexpr (SFU) e = pn_cu_exp_sfu(s - st);
        else e = pn_exp(s - st);
        w = st == (T)-INFINITY ? (T)0 : e;
    } else {
        T inv = 0; /* 1 / Σσ: per row, hoisted where st is (the query pass), per pair in the key pass */
        if constexpr (SFU) sg = pn_cu_sigm_sfu(s), inv = st > 0 ? pn_cu_rcp_sfu(st) : 0.0f;
        else sg = sigm(s), inv = st > 0 ? 1 / st : (T)0;
        w = c.normalized ? sg * inv : sg;
    }
    o.p = PLAIN ? w : w * gv;
    o.dgam = 0;
    if (soft) {
        o.ds = o.p * (dp - Di);
        if (gam) o.dgam = (dp - Di) * w;
    } else if (c.normalized) {
        o.ds = o.p * (1 - sg) * (dp - Di);
        if (gam) o.dgam = (dp - Di) * w;
    } else {
        o.ds = dp * sg * (1 - sg);
    }
}

template <typename T, typename S>
__device__ void pair_ds(const dcall<T> &c, const dbw<T> &a, const drow<T, S> &r, T st, T Di, int64_t j, dpv<T> &o) {
    const T s = score<T, S>(c, r, j, &o.G, &o.k0, &o.k1, &o.kx);
    T dp;
    if (a.weights) {
        dp = a.dout[r.x * c.Nk + j];
    } else {
        const T *dO = a.dout + r.x * c.Dv, *vj = c.v + (r.bh * c.Nk + j) * c.Dv;
        dp = 0;
        for (int64_t d = 0; d < c.Dv; d++) dp += dO[d] * vj[d];
    }
    norm_ds(c, s, c.g ? c.g[r.bh * c.Nk + j] : (T)1, st, Di, dp, o);
}

/* coordinate d's share of the terms' chain rule (t: ∂L/∂term per slot): NORM2 2t·x_d (d < Dg),
 * LAST t at d = D − 1 (dense scores have no PROJ terms) */
template <typename T> __device__ T term_col(const dcall<T> &c, const int kind[2], const double t[2], T xd, int64_t d) {
    T g = 0;
    for (int m = 0; m < 2; m++) {
        if (kind[m] == PN_TERM_NONE || t[m] == 0) continue;
        if (kind[m] == PN_TERM_NORM2 && d < c.Dg) g += (T)(2 * t[m]) * xd;
        else if (kind[m] == PN_TERM_LAST && d == c.D - 1) g += (T)t[m];
    }
    return g;
}

/* x (D) += the terms' chain rule */
template <typename T> __device__ void terms_chain(const dcall<T> &c, const int kind[2], const double t[2], const T *xr,
                                                  T *gr) {
    for (int64_t d = 0; d < c.D; d++) gr[d] += term_col(c, kind, t, xr[d], d);
}

/* D_i per (bh, row): dO_i·O_i when the weights are normalized, else 0 */
template <typename T> __global__ void drow_kernel(dcall<T> c, dbw<T> a) {
    PN_CU_LOOP(x, c.BH * c.Nq) {
        const int64_t Do = a.weights ? c.Nk : c.Dv;
        T s = 0;
        if (c.normalized)
            for (int64_t d = 0; d < Do; d++) s += a.dout[x * Do + d] * a.out[x * Do + d];
        a.Drow[x] = s;
    }
}

/* per (bh, query row): dq (through G and the row terms) and the parameters' partials */
template <typename T, typename S> __global__ void bwq_kernel(dcall<T> c, dbw<T> a) {
    PN_CU_LOOP(x, c.BH * c.Nq) {
        const int64_t bh = x / c.Nq, i = x - bh * c.Nq, kend = key_end(c, i);
        drow<T, S> r;
        row_init<T, S>(c, bh, i, r);
        const int want = wants<S>(&c.hp[r.h]);
        const T st = a.stat[x], Di = a.Drow[x];
        T *dqi = a.dq + x * c.D;
        double aq0 = 0, aq1 = 0, b0 = 0, b1 = 0, b2 = 0; /* as the CPU epilogues' double accumulators */
        dpv<T> pv;
        for (int64_t j = 0; j < kend; j++) {
            pair_ds<T, S>(c, a, r, st, Di, j, pv);
            if (pv.ds == 0) continue; /* a masked (or underflowed) pair contributes nothing */
            const auto dd = S::vjp(&r.hd, r.rx, pv.kx, pv.G, r.q0, r.q1, pv.k0, pv.k1, pv.ds, want);
            aq0 += dd.q0, aq1 += dd.q1;
            if (want) b0 += dd.p0, b1 += dd.p1, b2 += dd.p2;
            if (!c.gemm || dd.g == 0) continue;
            const T *kj = c.k + (bh * c.Nk + j) * c.D;
            if (c.diff) /* ∂G/∂q = k − q */
                for (int64_t d = 0; d < c.Dg; d++) dqi[d] += dd.g * (kj[d] - r.qr[d]);
            else
                for (int64_t d = 0; d < c.Dg; d++) dqi[d] += dd.g * kj[d];
        }
        const double t[2] = {(S::terms & T_Q0) ? aq0 : 0.0, (S::terms & T_Q1) ? aq1 : 0.0};
        terms_chain(c, c.qk, t, r.qr, dqi);
        if (want && a.dparam) {
            double *dp = a.dparam + x * PN_NPARAM;
            if (S::pid(0) >= 0) dp[S::pid(0) >= 0 ? S::pid(0) : 0] += b0;
            if (S::pid(1) >= 0) dp[S::pid(1) >= 0 ? S::pid(1) : 0] += b1;
            if (S::pid(2) >= 0) dp[S::pid(2) >= 0 ? S::pid(2) : 0] += b2;
        }
    }
}

/* per (bh, key): dk (through G and the column terms), dv (Pᵀ·dO and the Lorentz factor's share),
 * the per-key ∂L/∂κ; the queries that see key j in order */
template <typename T, typename S> __global__ void bwk_kernel(dcall<T> c, dbw<T> a) {
    PN_CU_LOOP(y, c.BH * c.Nk) {
        const int64_t bh = y / c.Nk, j = y - bh * c.Nk;
        const int64_t i0 = c.causal ? (j - c.off > 0 ? j - c.off : 0) : 0; /* causal: i + off >= j */
        const int want = wants<S>(&c.hp[bh % c.H]);
        const T *kj = c.k + y * c.D;
        T *dkj = a.dk + y * c.D, *dvj = a.dv ? a.dv + y * c.Dv : NULL;
        double s0 = 0, s1 = 0, sg = 0;
        dpv<T> pv;
        drow<T, S> r;
        for (int64_t i = i0; i < c.Nq; i++) {
            row_init<T, S>(c, bh, i, r);
            pair_ds<T, S>(c, a, r, a.stat[r.x], a.Drow[r.x], j, pv);
            if (dvj && pv.p != 0) {
                const T *dO = a.dout + r.x * c.Dv;
                for (int64_t d = 0; d < c.Dv; d++) dvj[d] += pv.p * dO[d];
            }
            sg += pv.dgam;
            if (pv.ds == 0) continue;
            const auto dd = S::vjp(&r.hd, r.rx, pv.kx, pv.G, r.q0, r.q1, pv.k0, pv.k1, pv.ds, want);
            s0 += dd.k0, s1 += dd.k1;
            if (!c.gemm || dd.g == 0) continue;
            if (c.diff) /* ∂G/∂k = q − k */
                for (int64_t d = 0; d < c.Dg; d++) dkj[d] += dd.g * (r.qr[d] - kj[d]);
            else
                for (int64_t d = 0; d < c.Dg; d++) dkj[d] += dd.g * r.qr[d];
        }
        const double t[2] = {(S::terms & T_K0) ? s0 : 0.0, (S::terms & T_K1) ? s1 : 0.0};
        terms_chain(c, c.kk, t, kj, dkj);
        if (c.g) { /* einstein: dv += ∂L/∂γ·κγ³·v, ∂L/∂κ += ∂L/∂γ·½‖v‖²γ³ */
            const double tg = sg, kap = c.hp[bh % c.H].v[PN_P_curvature], gj = c.g[y], g3 = gj * gj * gj;
            const T *vr = c.v + y * c.Dv;
            double n2 = 0;
            for (int64_t d = 0; d < c.Dv; d++) n2 += (double)vr[d] * vr[d];
            if (tg != 0 && dvj)
                for (int64_t d = 0; d < c.Dv; d++) dvj[d] += (T)(tg * kap * g3 * vr[d]);
            if (a.kcurv) a.kcurv[y] = tg != 0 ? tg * 0.5 * n2 * g3 : 0.0;
        }
    }
}

/* the bias gradient, one thread per element of gb (contiguous, the bias's shape): the sum of dS
 * over the (b, h, i, j) that broadcast to it, in that order. W: the weights' dims (B, H, Nq, Nk);
 * st: gb's canonical strides (0 where broadcast). */
struct gbmap {
    int64_t W[4], st[4];
};

template <typename T, typename S> __global__ void gbias_kernel(dcall<T> c, dbw<T> a, gbmap m, T *gb, int64_t n) {
    PN_CU_LOOP(e, n) {
        int64_t lo[4], hi[4];
        for (int d = 0; d < 4; d++) {
            if (m.st[d] == 0) {
                lo[d] = 0, hi[d] = m.W[d];
            } else {
                lo[d] = (e / m.st[d]) % m.W[d];
                hi[d] = lo[d] + 1;
            }
        }
        T acc = 0;
        dpv<T> pv;
        drow<T, S> r;
        for (int64_t b = lo[0]; b < hi[0]; b++)
            for (int64_t h = lo[1]; h < hi[1]; h++)
                for (int64_t i = lo[2]; i < hi[2]; i++) {
                    const int64_t bh = b * c.H + h, kend = key_end(c, i);
                    row_init<T, S>(c, bh, i, r);
                    const T st = a.stat[r.x], Di = a.Drow[r.x];
                    for (int64_t j = lo[3]; j < hi[3] && j < kend; j++) {
                        pair_ds<T, S>(c, a, r, st, Di, j, pv);
                        acc += pv.ds;
                    }
                }
        gb[e] += acc;
    }
}

/* gpar (PN_NPARAM, H): per head, ∂κ of the Lorentz factors (keys in order) then the per-row
 * parameter partials (rows in order); one thread per (p, h) */
template <typename T>
__global__ void param_reduce_kernel(dcall<T> c, const double *kcurv, const double *dparam, double *gpar) {
    PN_CU_LOOP(ph, (int64_t)PN_NPARAM * c.H) {
        const int64_t p = ph / c.H, h = ph - p * c.H;
        double acc = 0;
        if (p == PN_P_curvature && kcurv)
            for (int64_t bh = h; bh < c.BH; bh += c.H)
                for (int64_t j = 0; j < c.Nk; j++) acc += kcurv[bh * c.Nk + j];
        if (dparam)
            for (int64_t bh = h; bh < c.BH; bh += c.H)
                for (int64_t i = 0; i < c.Nq; i++) acc += dparam[(bh * c.Nq + i) * PN_NPARAM + p];
        gpar[ph] = acc;
    }
}

/* ---- the tiled kernels: shared-memory tiles of Q and K, FlashAttention-style ----------------------
 * A block owns TQ query rows (forward, dq) or TK keys (dk, dv) of one (b, h) and walks the other
 * side in tiles through shared memory; TPR threads share a row (or key), each taking every TPR-th
 * pair of a tile, so a row's reductions are shuffles among TPR neighbouring lanes of one warp
 * (butterflies: every lane ends with the same, order-independent value). The pair maths, the
 * modifiers and the normalizations are the row kernels' functions above (pair value from the
 * score's struct, mods, norm_ds, term_col); only G's dot product reads shared memory. The P·V-like
 * products go through a (TQ, TK) tile of weights in shared memory, each thread accumulating every
 * TPR-th output column. The arrays have odd leading dimensions so the lanes' column-parallel reads
 * fall in different banks. Deterministic: fixed orders, no atomics. Inputs whose tiles do not fit
 * the device's shared memory (very large D in f64) run the row kernels instead. */
enum { TQ = 32, TK = 32, TPR = 4, TT = TQ * TPR }; /* TQ == TK: the key-side kernel swaps the roles */
static_assert(TQ == TK && TT % 32 == 0 && 32 % TPR == 0, "tile shape");

/* the dynamic shared memory of a tiled kernel, in T elements. Every kernel: coordinate tiles a
 * (its own 32 rows or keys) and b (the tile walked), value tiles va (own: dO or V) and vb (walked: V
 * or dO), an accumulator acc and a weight tile p (32 × TK). The forward accumulates O (Dv wide),
 * the query side of the backward dQ (D wide), the key side dK (D) and dV in acc2 with a second
 * weight tile p2 (P for dV; p holds ∂L/∂G). */
enum { TL_FWD, TL_BWQ, TL_BWK };
struct tlay {
    int64_t ld, ldv, ldp; /* leading dimensions (odd) */
    int64_t a, b, va, vb, acc, acc2, p, p2, total;
};

inline int64_t odd(int64_t n) { return n | 1; }

inline tlay tlay_of(int64_t D, int64_t Dv, int kind) {
    tlay L;
    L.ld = odd(D), L.ldv = odd(Dv), L.ldp = odd(TK);
    L.a = 0;
    L.b = L.a + 32 * L.ld;
    L.va = L.b + 32 * L.ld;
    L.vb = L.va + 32 * L.ldv;
    L.acc = L.vb + 32 * L.ldv;
    L.acc2 = L.acc + 32 * (kind == TL_FWD ? L.ldv : L.ld);
    L.p = L.acc2 + (kind == TL_BWK ? 32 * L.ldv : 0);
    L.p2 = L.p + 32 * L.ldp;
    L.total = L.p2 + (kind == TL_BWK ? 32 * L.ldp : 0);
    return L;
}

/* a key's (or query's) per-tile values, staged once per tile for every thread of the block */
template <typename T> struct kstage {
    typename prec<T>::x4 kx; /* the score's key (row) values under the block's head */
    T t0, t1, gv;            /* the terms; the Lorentz factor (1 without einstein) */
    int bad;                 /* NaN flag */
};

/* rows [r0, r0 + 32) of src (n rows of D, contiguous) into dst (ld), zeros past n. A warp per row,
 * its lanes along the row (coalesced), and no division: a 64-bit `e / D` per element costs more
 * than the rest of a tile's work (measured on an H100, 2026-11-27). blockDim.x: a multiple of 32. */
template <typename T> __device__ void tile_load(T *dst, int64_t ld, const T *src, int64_t r0, int64_t n, int64_t D) {
    const int lane = threadIdx.x % 32, nw = blockDim.x / 32;
    for (int r = threadIdx.x / 32; r < 32; r += nw) {
        T *o = dst + r * ld;
        if (r0 + r < n) {
            const T *x = src + (r0 + r) * D;
            for (int64_t d = lane; d < D; d += 32) o[d] = x[d];
        } else {
            for (int64_t d = lane; d < D; d += 32) o[d] = (T)0;
        }
    }
}

/* G of shared rows a and b (Dg coordinates): a·b, or −½‖a − b‖² */
template <typename T> __device__ T gdot_sh(const dcall<T> &c, const T *a, const T *b) {
    if (!c.gemm) return 0;
    T acc = 0;
    if (c.diff) {
        for (int64_t d = 0; d < c.Dg; d++) {
            const T t = a[d] - b[d];
            acc += t * t;
        }
        return acc * (T)-0.5;
    }
    for (int64_t d = 0; d < c.Dg; d++) acc += a[d] * b[d];
    return acc;
}

/* the block's keys [j0, j0 + N) staged: S::key under head hd, terms, γ, NaN flags */
template <int N, typename T, typename S, typename Hd>
__device__ void stage_keys(const dcall<T> &c, const Hd &hd, int64_t bh, int64_t j0, kstage<T> *ks) {
    for (int jl = threadIdx.x; jl < N; jl += blockDim.x) {
        const int64_t j = j0 + jl, y = bh * c.Nk + j;
        kstage<T> &z = ks[jl];
        const bool in = j < c.Nk;
        z.t0 = in && (S::terms & T_K0) ? c.kt[0][y] : (T)0;
        z.t1 = in && (S::terms & T_K1) ? c.kt[1][y] : (T)0;
        z.kx = S::key(&hd, z.t0, z.t1);
        z.gv = in && c.g ? c.g[y] : (T)1;
        z.bad = in ? c.kbad[y] : 0;
    }
}

/* ∂G's share of a row's gradient over the lane's columns d = t, t + TPR, … < Dg: acc[d] += Σ_l
 * w_l·(x_l[d] − y[d]) for a distance score, w_l·x_l[d] for a dot product (x: the n shared rows of
 * the other side, leading dimension ld; y: the row itself), pairs with w_l = 0 skipped */
template <typename T>
__device__ void grad_cols(const dcall<T> &c, T *acc, const T *w, const T *x, int64_t ld, const T *y, int n, int t) {
    for (int64_t d = t; d < c.Dg; d += TPR) {
        T a = acc[d];
        for (int l = 0; l < n; l++)
            if (w[l] != 0) a += w[l] * (c.diff ? x[l * ld + d] - y[d] : x[l * ld + d]);
        acc[d] = a;
    }
}

/* forward: a block per (bh, TQ query rows); out (BH, Nq, Dv), stat (BH, Nq) as fwd_kernel's */
template <typename T, typename S> __global__ void tfwd_kernel(dcall<T> c, tlay L, T *out, T *stat) {
    PN_SHARED_DYN(T, sm);
    PN_SHARED(kstage<T>, ks, TK);
    const int64_t nqt = (c.Nq + TQ - 1) / TQ, bh = blockIdx.x / nqt, i0 = (blockIdx.x - bh * nqt) * TQ;
    const int rr = threadIdx.x / TPR, t = threadIdx.x % TPR;
    const int64_t i = i0 + rr;
    const bool live = i < c.Nq;
    T *Qs = sm + L.a, *Ks = sm + L.b, *Vs = sm + L.vb, *Os = sm + L.acc + rr * L.ldv, *Pr = sm + L.p + rr * L.ldp;
    tile_load(Qs, L.ld, c.q + bh * c.Nq * c.D, i0, c.Nq, c.D);
    for (int64_t d = t; d < c.Dv; d += TPR) Os[d] = 0;
    drow<T, S> r;
    row_init<T, S>(c, bh, live ? i : c.Nq - 1, r);
    const T *qs = Qs + rr * L.ld;
    const int64_t kend = live ? key_end(c, i) : 0;
    const int64_t kend_blk = key_end(c, (i0 + TQ < c.Nq ? i0 + TQ : c.Nq) - 1);
    const bool soft = c.norm == PN_NORM_SOFTMAX;
    T m = (T)-INFINITY, l = 0;
    int nan = 0;
    for (int64_t j0 = 0; j0 < kend_blk; j0 += TK) {
        __syncthreads(); /* the previous tile's readers are done */
        tile_load(Ks, L.ld, c.k + bh * c.Nk * c.D, j0, c.Nk, c.D);
        tile_load(Vs, L.ldv, c.v + bh * c.Nk * c.Dv, j0, c.Nk, c.Dv);
        stage_keys<TK, T, S>(c, r.hd, bh, j0, ks);
        __syncthreads();
        T s[TK / TPR];
        T tmax = (T)-INFINITY;
        int tnan = 0;
        for (int jj = 0; jj < TK / TPR; jj++) {
            const int jl = t + TPR * jj;
            const int64_t j = j0 + jl;
            T v = (T)-INFINITY;
            if (j < kend && !nan) {
                const kstage<T> &z = ks[jl];
                v = S::pair(&r.hd, r.rx, z.kx, gdot_sh(c, qs, Ks + jl * L.ld), r.q0, r.q1, z.t0, z.t1);
                v = mods(c, r, j, v, z.bad);
            }
            s[jj] = v;
            if (v != v || v == (T)INFINITY) tnan = 1; /* row_softmax's poison */
            else if (v > tmax) tmax = v;
        }
        T alpha = 1;
        if (soft) {
            nan |= pn_cu_lanes_or<TPR>(tnan);
            const T mt = pn_cu_lanes_max<TPR>(tmax), mn = mt > m ? mt : m;
            if (mn != (T)-INFINITY && mn != m) alpha = m == (T)-INFINITY ? (T)0 : pn_exp(m - mn);
            m = mn;
        }
        T ps = 0;
        for (int jj = 0; jj < TK / TPR; jj++) {
            const int jl = t + TPR * jj;
            T p;
            if (soft) p = nan || s[jj] == (T)-INFINITY ? (T)0 : pn_exp(s[jj] - m) * ks[jl].gv;
            else p = sigm(s[jj]) * ks[jl].gv;
            Pr[jl] = p;
            ps += p;
        }
        l = l * alpha + pn_cu_lanes_sum<TPR>(ps);
        __syncwarp();
        /* the row's visible keys of this tile (the row kernel never touches the others' v) */
        const int nv = kend - j0 < TK ? (int)(kend - j0 > 0 ? kend - j0 : 0) : TK;
        if (!nan)
            for (int64_t d = t; d < c.Dv; d += TPR) {
                T acc = Os[d] * alpha;
                for (int jl = 0; jl < nv; jl++) acc += Pr[jl] * Vs[jl * L.ldv + d];
                Os[d] = acc;
            }
        __syncwarp(); /* Pr is rewritten by the next tile */
    }
    if (!live) return;
    if (nan) l = (T)NAN;
    const int64_t x = bh * c.Nq + i;
    T *o = out + x * c.Dv;
    const T inv = c.normalized ? (l > 0 ? 1 / l : (T)0) : (T)1;
    for (int64_t d = t; d < c.Dv; d += TPR) o[d] = l != l ? (T)NAN : Os[d] * inv;
    if (t == 0) {
        if (l != l) stat[x] = l;
        else if (soft) stat[x] = l > 0 ? m + pn_log(l) : (T)-INFINITY;
        else stat[x] = l;
    }
}

/* the backward's query side: a block per (bh, TQ query rows); dq (through G and the row terms) and
 * the parameters' partials, as bwq_kernel */
template <typename T, typename S> __global__ void tbwq_kernel(dcall<T> c, dbw<T> a, tlay L) {
    PN_SHARED_DYN(T, sm);
    PN_SHARED(kstage<T>, ks, TK);
    const int64_t nqt = (c.Nq + TQ - 1) / TQ, bh = blockIdx.x / nqt, i0 = (blockIdx.x - bh * nqt) * TQ;
    const int rr = threadIdx.x / TPR, t = threadIdx.x % TPR;
    const int64_t i = i0 + rr;
    const bool live = i < c.Nq;
    T *Qs = sm + L.a, *Ks = sm + L.b, *dOs = sm + L.va, *Vs = sm + L.vb, *dQ = sm + L.acc + rr * L.ld,
      *Gr = sm + L.p + rr * L.ldp;
    tile_load(Qs, L.ld, c.q + bh * c.Nq * c.D, i0, c.Nq, c.D);
    if (!a.weights) tile_load(dOs, L.ldv, a.dout + bh * c.Nq * c.Dv, i0, c.Nq, c.Dv);
    for (int64_t d = t; d < c.D; d += TPR) dQ[d] = 0;
    drow<T, S> r;
    row_init<T, S>(c, bh, live ? i : c.Nq - 1, r);
    const int want = wants<S>(&c.hp[r.h]);
    const T st = a.stat[r.x], Di = a.Drow[r.x];
    const T *qs = Qs + rr * L.ld, *dos = dOs + rr * L.ldv;
    const int64_t kend = live ? key_end(c, i) : 0;
    const int64_t kend_blk = key_end(c, (i0 + TQ < c.Nq ? i0 + TQ : c.Nq) - 1);
    double aq0 = 0, aq1 = 0, b0 = 0, b1 = 0, b2 = 0; /* as the CPU epilogues' double accumulators */
    for (int64_t j0 = 0; j0 < kend_blk; j0 += TK) {
        __syncthreads();
        tile_load(Ks, L.ld, c.k + bh * c.Nk * c.D, j0, c.Nk, c.D);
        if (!a.weights) tile_load(Vs, L.ldv, c.v + bh * c.Nk * c.Dv, j0, c.Nk, c.Dv);
        stage_keys<TK, T, S>(c, r.hd, bh, j0, ks);
        __syncthreads();
        for (int jj = 0; jj < TK / TPR; jj++) {
            const int jl = t + TPR * jj;
            const int64_t j = j0 + jl;
            T g = 0;
            if (j < kend) {
                const kstage<T> &z = ks[jl];
                const T G = gdot_sh(c, qs, Ks + jl * L.ld);
                const T sv = mods(c, r, j, S::pair(&r.hd, r.rx, z.kx, G, r.q0, r.q1, z.t0, z.t1), z.bad);
                T dp = 0;
                if (a.weights) dp = a.dout[r.x * c.Nk + j];
                else
                    for (int64_t d = 0; d < c.Dv; d++) dp += dos[d] * Vs[jl * L.ldv + d];
                dpv<T> pv;
                norm_ds(c, sv, z.gv, st, Di, dp, pv);
                if (pv.ds != 0) { /* a masked (or underflowed) pair contributes nothing */
                    const auto dd = S::vjp(&r.hd, r.rx, z.kx, G, r.q0, r.q1, z.t0, z.t1, pv.ds, want);
                    aq0 += dd.q0, aq1 += dd.q1;
                    if (want) b0 += dd.p0, b1 += dd.p1, b2 += dd.p2;
                    if (c.gemm) g = dd.g;
                }
            }
            Gr[jl] = g;
        }
        __syncwarp();
        grad_cols(c, dQ, Gr, Ks, L.ld, qs, TK, t); /* ∂G/∂q = k (dot) or k − q (distance) */
        __syncwarp();
    }
    aq0 = pn_cu_lanes_sum<TPR>(aq0), aq1 = pn_cu_lanes_sum<TPR>(aq1);
    b0 = pn_cu_lanes_sum<TPR>(b0), b1 = pn_cu_lanes_sum<TPR>(b1), b2 = pn_cu_lanes_sum<TPR>(b2);
    if (!live) return;
    const double tq[2] = {(S::terms & T_Q0) ? aq0 : 0.0, (S::terms & T_Q1) ? aq1 : 0.0};
    T *dqi = a.dq + r.x * c.D;
    for (int64_t d = t; d < c.D; d += TPR) dqi[d] += dQ[d] + term_col(c, c.qk, tq, qs[d], d);
    if (t == 0 && want && a.dparam) {
        double *dp = a.dparam + r.x * PN_NPARAM;
        if (S::pid(0) >= 0) dp[S::pid(0) >= 0 ? S::pid(0) : 0] += b0;
        if (S::pid(1) >= 0) dp[S::pid(1) >= 0 ? S::pid(1) : 0] += b1;
        if (S::pid(2) >= 0) dp[S::pid(2) >= 0 ? S::pid(2) : 0] += b2;
    }
}

/* a query's per-tile values for the key side (under the block's head) */
template <typename T> struct qstage {
    typename prec<T>::x4 rx;
    T q0, q1, st, Di;
    int bad;
};

/* the query rows [i0, i0 + N) staged for the key side: S::row under head hd, terms, NaN flags, the
 * statistic and D_i (zeros past Nq) */
template <int N, typename T, typename S, typename Hd>
__device__ void stage_queries(const dcall<T> &c, const dbw<T> &a, const Hd &hd, int64_t bh, int64_t i0,
                              qstage<T> *qsg) {
    for (int il = threadIdx.x; il < N; il += blockDim.x) {
        const int64_t x = bh * c.Nq + i0 + il;
        qstage<T> &z = qsg[il];
        const bool in = i0 + il < c.Nq;
        z.q0 = in && (S::terms & T_Q0) ? c.qt[0][x] : (T)0;
        z.q1 = in && (S::terms & T_Q1) ? c.qt[1][x] : (T)0;
        z.rx = S::row(&hd, z.q0, z.q1);
        z.bad = in ? c.qbad[x] : 0;
        z.st = in ? a.stat[x] : (T)0;
        z.Di = in ? a.Drow[x] : (T)0;
    }
}

/* the backward's key side: a block per (bh, TK keys); dk (through G and the column terms), dv
 * (Pᵀ·dO and the Lorentz factor's share), the per-key ∂L/∂κ, as bwk_kernel; the query tiles that
 * see the block's keys in order */
template <typename T, typename S> __global__ void tbwk_kernel(dcall<T> c, dbw<T> a, tlay L) {
    PN_SHARED_DYN(T, sm);
    PN_SHARED(qstage<T>, qsg, TQ);
    const int64_t nkt = (c.Nk + TK - 1) / TK, bh = blockIdx.x / nkt, j0 = (blockIdx.x - bh * nkt) * TK;
    const int kk = threadIdx.x / TPR, t = threadIdx.x % TPR;
    const int64_t j = j0 + kk, y = bh * c.Nk + j, b = bh / c.H, h = bh - b * c.H;
    const bool live = j < c.Nk;
    T *Ks = sm + L.a, *Qs = sm + L.b, *Vs = sm + L.va, *dOs = sm + L.vb, *dK = sm + L.acc + kk * L.ld,
      *dV = sm + L.acc2 + kk * L.ldv, *Gt = sm + L.p + kk * L.ldp, *Pt = sm + L.p2 + kk * L.ldp;
    tile_load(Ks, L.ld, c.k + bh * c.Nk * c.D, j0, c.Nk, c.D);
    if (!a.weights) tile_load(Vs, L.ldv, c.v + bh * c.Nk * c.Dv, j0, c.Nk, c.Dv);
    for (int64_t d = t; d < c.D; d += TPR) dK[d] = 0;
    for (int64_t d = t; d < c.Dv; d += TPR) dV[d] = 0;
    const int want = wants<S>(&c.hp[h]);
    drow<T, S> r; /* the query row of a pair: the block's head, the staged row values */
    r.hd = S::head(&c.hp[h], T(0));
    r.bh = bh, r.b = b, r.h = h;
    const T k0 = live && (S::terms & T_K0) ? c.kt[0][y] : (T)0, k1 = live && (S::terms & T_K1) ? c.kt[1][y] : (T)0;
    const auto kx = S::key(&r.hd, k0, k1);
    const T gv = live && c.g ? c.g[y] : (T)1;
    const int kb = live ? c.kbad[y] : 0;
    const T *kr = Ks + kk * L.ld, *vr = Vs + kk * L.ldv;
    /* the first query that sees key j0: i + off >= j0 */
    const int64_t istart = c.causal ? (j0 - c.off > 0 ? j0 - c.off : 0) : 0;
    double s0 = 0, s1 = 0, sg = 0;
    for (int64_t i0 = istart / TQ * TQ; i0 < c.Nq; i0 += TQ) {
        __syncthreads();
        tile_load(Qs, L.ld, c.q + bh * c.Nq * c.D, i0, c.Nq, c.D);
        if (!a.weights) tile_load(dOs, L.ldv, a.dout + bh * c.Nq * c.Dv, i0, c.Nq, c.Dv);
        stage_queries<TQ, T, S>(c, a, r.hd, bh, i0, qsg);
        __syncthreads();
        for (int ii = 0; ii < TQ / TPR; ii++) {
            const int il = t + TPR * ii;
            const int64_t i = i0 + il;
            T p = 0, g = 0;
            if (live && i < c.Nq && !(c.causal && j > i + c.off)) {
                const qstage<T> &z = qsg[il];
                r.i = i, r.x = bh * c.Nq + i, r.rx = z.rx, r.q0 = z.q0, r.q1 = z.q1, r.qb = z.bad;
                const T G = gdot_sh(c, Qs + il * L.ld, kr);
                const T sv = mods(c, r, j, S::pair(&r.hd, z.rx, kx, G, z.q0, z.q1, k0, k1), kb);
                T dp = 0;
                if (a.weights) dp = a.dout[r.x * c.Nk + j];
                else
                    for (int64_t d = 0; d < c.Dv; d++) dp += dOs[il * L.ldv + d] * vr[d];
                dpv<T> pv;
                norm_ds(c, sv, gv, z.st, z.Di, dp, pv);
                p = pv.p;
                sg += pv.dgam;
                if (pv.ds != 0) {
                    const auto dd = S::vjp(&r.hd, z.rx, kx, G, z.q0, z.q1, k0, k1, pv.ds, want);
                    s0 += dd.k0, s1 += dd.k1;
                    if (c.gemm) g = dd.g;
                }
            }
            Pt[il] = p;
            Gt[il] = g;
        }
        __syncwarp();
        if (!a.weights)
            for (int64_t d = t; d < c.Dv; d += TPR) {
                T acc = dV[d];
                for (int il = 0; il < TQ; il++)
                    if (Pt[il] != 0) acc += Pt[il] * dOs[il * L.ldv + d];
                dV[d] = acc;
            }
        grad_cols(c, dK, Gt, Qs, L.ld, kr, TQ, t); /* ∂G/∂k = q (dot) or q − k (distance) */
        __syncwarp();
    }
    s0 = pn_cu_lanes_sum<TPR>(s0), s1 = pn_cu_lanes_sum<TPR>(s1), sg = pn_cu_lanes_sum<TPR>(sg);
    if (!live) return;
    const double tk[2] = {(S::terms & T_K0) ? s0 : 0.0, (S::terms & T_K1) ? s1 : 0.0};
    T *dkj = a.dk + y * c.D;
    for (int64_t d = t; d < c.D; d += TPR) dkj[d] += dK[d] + term_col(c, c.kk, tk, kr[d], d);
    if (a.weights) return;
    T *dvj = a.dv ? a.dv + y * c.Dv : NULL;
    double ein = 0, n2 = 0; /* einstein: dv += ∂L/∂γ·κγ³·v, ∂L/∂κ += ∂L/∂γ·½‖v‖²γ³ */
    const double kap = c.hp[h].v[PN_P_curvature];
    if (c.g) {
        const double gj = c.g[y], g3 = gj * gj * gj;
        ein = sg * kap * g3;
        for (int64_t d = 0; d < c.Dv; d++) n2 += (double)vr[d] * vr[d];
        if (t == 0 && a.kcurv) a.kcurv[y] = sg != 0 ? sg * 0.5 * n2 * g3 : 0.0;
    }
    if (dvj)
        for (int64_t d = t; d < c.Dv; d += TPR) dvj[d] += dV[d] + (sg != 0 ? (T)(ein * vr[d]) : (T)0);
}

/* ---- tensor cores: precision = 'bf16' / 'f16' ------------------------------------------------------
 * f32 tensors whose products Q·Kᵀ and P·V take inputs rounded to H (__nv_bfloat16 or __half) and
 * accumulate in f32 on tensor cores through nvcuda::wmma (m16n16k16). A block of four warps owns
 * WQ = 64 query rows of one (b, h), 16 per warp, and walks the keys in tiles of WK = 64: the
 * rounded tiles in shared memory, each warp's 16 × 64 scores Q_w·Kᵀ stored from its accumulators
 * to a shared f32 tile, the epilogue per element there (two lanes per row: the same pair maths,
 * modifiers and online softmax as the f32 tiles), P rounded to H, and O_w += P_w·V formed 64
 * columns at a time into the same f32 tile, from which the lanes rescale and add into O (f32, in
 * shared memory). The accumulators never leave the wmma calls' element-wise use: the fragment map
 * is unspecified, so the per-row rescaling happens in shared memory. A distance score's
 * −½‖q − k‖² is q·k − ½‖q‖² − ½‖k‖² over the rounded coordinates (their norms in f32), the terms
 * the f32 rows' (prep_kernel). The backward likewise: per tile S and dP = dO·Vᵀ by wmma, the
 * pair's dS and VJP per element, ∂G and P rounded to H for dQ += ∂G·K, dK += ∂Gᵀ·Q, dV += Pᵀ·dO.
 * As in any GEMM, a non-finite v (or dO) reaches every row of its tile through 0·NaN, also rows
 * that do not see that key (the f32 kernels skip such pairs). The weights (attention_weights)
 * and their backward stay on the f32 kernels. */
enum { WQ = 64, WK = 64, WTPR = 2, WT = 128 }; /* rows per block, keys per tile, threads per row, threads */
static_assert(WQ == 16 * (WT / 32) && WQ * WTPR == WT && WK <= WT, "one warp per 16 rows, WTPR lanes per row, a thread per key");

template <typename H> __device__ H to16(float x);
template <> __device__ __nv_bfloat16 to16<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __half to16<__half>(float x) { return __float2half_rn(x); }
__device__ inline float from16(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline float from16(__half x) { return __half2float(x); }

/* The dynamic shared memory of the tensor-core kernels, in bytes from a 128-byte aligned base (the
 * launch asks for 128 more). Rounded (H) tiles of 64 rows: a — the block's own rows' coordinates
 * (Q; K on the key side) and b — the walked tile's (K; Q), over the Dg coordinates of the product
 * padded to 16 (Dp); va — the own rows' values (dO on the query side, V on the key side; unused by
 * the forward) and vb — the walked tile's (V; dO), Dv padded (Dvp). f32 tiles (64, 64): s (the
 * scores, then each product's 64-column chunk) and dp (dP, the backward). H tiles (64, 64): p (P;
 * ∂L/∂G) and p2 (the key side's second: P). f32 accumulators in the block's rows: acc (O over Dv,
 * dQ / dK over Dg) and acc2 (dV, the key side). an, bn: ‖row‖² of the rounded a and b rows. wmma
 * needs leading dimensions that are multiples of 8 (16-bit) or 4 (f32) and 32-byte aligned tiles;
 * the extra 8 / 4 elements move consecutive rows to other banks. */
/* WL_BWKF: the key side with dK and dV in wmma accumulators (widths ≤ WFR_MAX): no acc, acc2 */
enum { WL_FWD, WL_BWQ, WL_BWK, WL_BWKF };
struct wlay {
    int64_t Dp, Dvp, ldq, ldv, lds, ldp, ldo, ldo2;
    int64_t a, b, va, vb, s, dp, p, p2, acc, acc2, an, bn, total;
};

inline int64_t up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

inline wlay wlay_of(int64_t Dg, int64_t Dv, int kind) {
    wlay L;
    const bool bw = kind != WL_FWD, bk = kind == WL_BWK || kind == WL_BWKF, fr = kind == WL_BWKF;
    L.Dp = up(Dg > 0 ? Dg : 1, 16), L.Dvp = up(Dv > 0 ? Dv : 1, 16);
    L.ldq = L.Dp + 8, L.ldv = L.Dvp + 8, L.lds = WK + 4, L.ldp = WK + 8;
    L.ldo = odd(kind == WL_FWD ? Dv : Dg), L.ldo2 = odd(Dv);
    L.a = 0;
    L.b = up(L.a + 64 * L.ldq * 2, 128);
    L.va = up(L.b + 64 * L.ldq * 2, 128);
    L.vb = up(L.va + (bw ? 64 * L.ldv * 2 : 0), 128);
    L.s = up(L.vb + 64 * L.ldv * 2, 128);
    L.dp = up(L.s + 64 * L.lds * 4, 128);
    L.p = up(L.dp + (bw ? 64 * L.lds * 4 : 0), 128);
    L.p2 = up(L.p + 64 * L.ldp * 2, 128);
    L.acc = up(L.p2 + (bk ? 64 * L.ldp * 2 : 0), 128);
    L.acc2 = up(L.acc + (fr ? 0 : 64 * L.ldo * 4), 128);
    L.an = up(L.acc2 + (bk && !fr ? 64 * L.ldo2 * 4 : 0), 128);
    L.bn = up(L.an + 64 * 4, 128);
    L.total = up(L.bn + 64 * 4, 128);
    return L;
}

/* rows [r0, r0 + 64) of src (n rows of D floats, contiguous), coordinates [0, w), rounded to H
 * into dst (ld), zeros past n and in the padding up to wp; a warp per row, as tile_load */
template <typename H>
__device__ void wtile_load(H *dst, int64_t ld, const float *src, int64_t r0, int64_t n, int64_t D, int64_t w,
                           int64_t wp) {
    const int lane = threadIdx.x % 32, nw = blockDim.x / 32;
    for (int r = threadIdx.x / 32; r < 64; r += nw) {
        H *o = dst + r * ld;
        if (r0 + r < n) {
            const float *x = src + (r0 + r) * D;
            for (int64_t d = lane; d < wp; d += 32) o[d] = to16<H>(d < w ? x[d] : 0.0f);
        } else {
            for (int64_t d = lane; d < wp; d += 32) o[d] = to16<H>(0.0f);
        }
    }
}

/* ‖row‖² of the 64 rounded rows of t (ld) over w coordinates, into nrm */
template <typename H> __device__ void wnorms(const H *t, int64_t ld, int64_t w, float *nrm) {
    for (int r = threadIdx.x; r < 64; r += blockDim.x) {
        float a = 0;
        for (int64_t d = 0; d < w; d++) {
            const float x = from16(t[r * ld + d]);
            a += x * x;
        }
        nrm[r] = a;
    }
}

/* The warp's 16 × 64 f32 tile out (ld lds) = A·Bᵀ: A the warp's 16 rows (ld lda), B 64 rows (ld
 * ldb), both kp wide (a multiple of 16). */
template <typename H> __device__ void w_abt(const H *A, int64_t lda, const H *B, int64_t ldb, int64_t kp, float *out,
                                            int64_t lds) {
    namespace wm = nvcuda::wmma;
    for (int nb = 0; nb < 4; nb++) {
        wm::fragment<wm::accumulator, 16, 16, 16, float> acc;
        wm::fill_fragment(acc, 0.0f);
        for (int64_t kb = 0; kb < kp; kb += 16) {
            wm::fragment<wm::matrix_a, 16, 16, 16, H, wm::row_major> fa;
            wm::fragment<wm::matrix_b, 16, 16, 16, H, wm::col_major> fb; /* Bᵀ from B's rows */
            wm::load_matrix_sync(fa, A + kb, (unsigned)lda);
            wm::load_matrix_sync(fb, B + nb * 16 * ldb + kb, (unsigned)ldb);
            wm::mma_sync(acc, fa, fb, acc);
        }
        wm::store_matrix_sync(out + nb * 16, acc, (unsigned)lds, wm::mem_row_major);
    }
}

/* The lane's row of the warp's product A·B added into orow (orow = orow·alpha + (A·B)_row, over
 * `width` columns, each lane every WTPR-th from t; nothing when skip): A the warp's 16 × 64 (ld
 * lda), B 64 rows of wp (width padded to 16) columns (ld ldb); formed 64 columns at a time in the
 * warp's f32 tile tmp (ld lds; trow: the lane's row of it). */
template <typename H>
__device__ void w_ab_into(const H *A, int64_t lda, const H *B, int64_t ldb, int64_t width, int64_t wp, float *tmp,
                          int64_t lds, const float *trow, float *orow, float alpha, bool skip, int t) {
    namespace wm = nvcuda::wmma;
    for (int64_t c0 = 0; c0 < wp; c0 += 64) {
        const int64_t nleft = (wp - c0) / 16;
        const int nb_n = (int)(nleft < 4 ? nleft : 4);
        for (int nb = 0; nb < nb_n; nb++) {
            wm::fragment<wm::accumulator, 16, 16, 16, float> acc;
            wm::fill_fragment(acc, 0.0f);
            for (int kb = 0; kb < 64; kb += 16) {
                wm::fragment<wm::matrix_a, 16, 16, 16, H, wm::row_major> fa;
                wm::fragment<wm::matrix_b, 16, 16, 16, H, wm::row_major> fb;
                wm::load_matrix_sync(fa, A + kb, (unsigned)lda);
                wm::load_matrix_sync(fb, B + kb * ldb + c0 + nb * 16, (unsigned)ldb);
                wm::mma_sync(acc, fa, fb, acc);
            }
            wm::store_matrix_sync(tmp + nb * 16, acc, (unsigned)lds, wm::mem_row_major);
        }
        __syncwarp();
        const int64_t cn = width - c0 < (int64_t)64 ? width - c0 : (int64_t)64;
        if (!skip)
            for (int64_t d = t; d < cn; d += WTPR) orow[c0 + d] = orow[c0 + d] * alpha + trow[d];
        __syncwarp(); /* tmp is rewritten by the next chunk */
    }
}

/* The warp's product A·B added into its accumulators acc[nb] (16 × 16 each, nb < wp / 16 ≤
 * WFR_MAX / 16): A the warp's 16 × 64 (ld lda), B 64 rows of wp columns (ld ldb). Only mma_sync
 * and the final store touch the fragments, so no code depends on their map. */
enum { WFR_MAX = 64 };
template <typename H>
__device__ void w_ab_acc(const H *A, int64_t lda, const H *B, int64_t ldb, int64_t wp,
                         nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> *acc) {
    namespace wm = nvcuda::wmma;
#pragma unroll
    for (int nb = 0; nb < WFR_MAX / 16; nb++) {
        if (nb * 16 >= wp) break;
        for (int kb = 0; kb < 64; kb += 16) {
            wm::fragment<wm::matrix_a, 16, 16, 16, H, wm::row_major> fa;
            wm::fragment<wm::matrix_b, 16, 16, 16, H, wm::row_major> fb;
            wm::load_matrix_sync(fa, A + kb, (unsigned)lda);
            wm::load_matrix_sync(fb, B + kb * ldb + nb * 16, (unsigned)ldb);
            wm::mma_sync(acc[nb], fa, fb, acc[nb]);
        }
    }
}

/* G of a pair from the product tile: q·k, or −½‖q − k‖² = q·k − ½‖q‖² − ½‖k‖² (rounded rows) */
__device__ inline float w_G(const dcall<float> &c, float qk, float qn, float kn) {
    return !c.gemm ? 0.0f : c.diff ? qk - 0.5f * (qn + kn) : qk;
}

/* forward: a block per (bh, 64 query rows); out, stat as fwd_kernel's */
template <typename H, typename S> __global__ void wfwd_kernel(dcall<float> c, wlay L, float *out, float *stat) {
    PN_SHARED_DYN(unsigned char, smu);
    PN_SHARED(kstage<float>, ks, WK);
    unsigned char *sm = pn_cu_align128(smu); /* wmma: 32-byte tiles */
    H *Qs = (H *)(sm + L.a), *Ks = (H *)(sm + L.b), *Vs = (H *)(sm + L.vb), *Ps = (H *)(sm + L.p);
    float *Ss = (float *)(sm + L.s), *Os = (float *)(sm + L.acc), *qn = (float *)(sm + L.an), *kn = (float *)(sm + L.bn);
    const int64_t nqt = (c.Nq + WQ - 1) / WQ, bh = blockIdx.x / nqt, i0 = (blockIdx.x - bh * nqt) * WQ;
    const int w = threadIdx.x / 32, rr = threadIdx.x / WTPR, t = threadIdx.x % WTPR;
    const int64_t i = i0 + rr;
    const bool live = i < c.Nq;
    float *Sw = Ss + w * 16 * L.lds, *Sr = Ss + rr * L.lds, *Orow = Os + rr * L.ldo;
    H *Pw = Ps + w * 16 * L.ldp, *Prow = Ps + rr * L.ldp;
    wtile_load(Qs, L.ldq, c.q + bh * c.Nq * c.D, i0, c.Nq, c.D, c.gemm ? c.Dg : 0, L.Dp);
    for (int64_t d = t; d < c.Dv; d += WTPR) Orow[d] = 0;
    __syncthreads();
    if (c.diff) wnorms(Qs, L.ldq, c.Dg, qn);
    drow<float, S> r;
    row_init<float, S>(c, bh, live ? i : c.Nq - 1, r);
    const int64_t kend = live ? key_end(c, i) : 0;
    const int64_t kend_blk = key_end(c, (i0 + WQ < c.Nq ? i0 + WQ : c.Nq) - 1);
    const bool soft = c.norm == PN_NORM_SOFTMAX;
    float m = -INFINITY, l = 0;
    int nan = 0;
    for (int64_t j0 = 0; j0 < kend_blk; j0 += WK) {
        __syncthreads(); /* the previous tile's readers are done */
        wtile_load(Ks, L.ldq, c.k + bh * c.Nk * c.D, j0, c.Nk, c.D, c.gemm ? c.Dg : 0, L.Dp);
        wtile_load(Vs, L.ldv, c.v + bh * c.Nk * c.Dv, j0, c.Nk, c.Dv, c.Dv, L.Dvp);
        stage_keys<WK, float, S>(c, r.hd, bh, j0, ks);
        __syncthreads();
        if (c.diff) wnorms(Ks, L.ldq, c.Dg, kn);
        if (c.gemm) w_abt(Qs + w * 16 * L.ldq, L.ldq, Ks, L.ldq, L.Dp, Sw, L.lds); /* S_w = Q_w·Kᵀ */
        __syncthreads(); /* the key norms and the warp's scores */
        float s[WK / WTPR];
        float tmax = -INFINITY;
        int tnan = 0;
        for (int jj = 0; jj < WK / WTPR; jj++) {
            const int jl = t + WTPR * jj;
            const int64_t j = j0 + jl;
            float v = -INFINITY;
            if (j < kend && !nan) {
                const kstage<float> &z = ks[jl];
                const float G = w_G(c, Sr[jl], c.diff ? qn[rr] : 0.0f, c.diff ? kn[jl] : 0.0f);
                v = mods(c, r, j, S::pair(&r.hd, r.rx, z.kx, G, r.q0, r.q1, z.t0, z.t1), z.bad);
            }
            s[jj] = v;
            if (v != v || v == INFINITY) tnan = 1;
            else if (v > tmax) tmax = v;
        }
        float alpha = 1;
        if (soft) {
            nan |= pn_cu_lanes_or<WTPR>(tnan);
            const float mt = pn_cu_lanes_max<WTPR>(tmax), mn = mt > m ? mt : m;
            if (mn != -INFINITY && mn != m) alpha = m == -INFINITY ? 0.0f : pn_exp(m - mn);
            m = mn;
        }
        float ps = 0;
        for (int jj = 0; jj < WK / WTPR; jj++) {
            const int jl = t + WTPR * jj;
            float p;
            if (soft) p = nan || s[jj] == -INFINITY ? 0.0f : pn_exp(s[jj] - m) * ks[jl].gv;
            else p = sigm(s[jj]) * ks[jl].gv;
            Prow[jl] = to16<H>(p);
            ps += p;
        }
        l = l * alpha + pn_cu_lanes_sum<WTPR>(ps);
        __syncwarp();
        w_ab_into(Pw, L.ldp, Vs, L.ldv, c.Dv, L.Dvp, Sw, L.lds, Sr, Orow, alpha, nan != 0, t); /* O_w = O_w·α + P_w·V */
    }
    if (!live) return;
    if (nan) l = NAN;
    const int64_t x = bh * c.Nq + i;
    float *o = out + x * c.Dv;
    const float inv = c.normalized ? (l > 0 ? 1 / l : 0.0f) : 1.0f;
    for (int64_t d = t; d < c.Dv; d += WTPR) o[d] = l != l ? NAN : Orow[d] * inv;
    if (t == 0) {
        if (l != l) stat[x] = l;
        else if (soft) stat[x] = l > 0 ? m + pn_log(l) : -INFINITY;
        else stat[x] = l;
    }
}

/* ---- the forward on mma.sync: the scores stay in registers ----------------------------------------
 * precision bf16 / f16 with both widths ≤ 128 (the padded Dg and Dv): what wfwd_kernel computes —
 * a block of four warps per 64 query rows of one (b, h), key tiles of 64, the same per-pair maths,
 * modifiers and online softmax — with the products on PTX mma.sync m16n8k16 (mma_ptx.cuh), whose
 * accumulator layout is documented: lane (g = lane / 4, t = lane % 4) holds rows g and g + 8 of
 * its warp's 16 at columns 2t and 2t + 1 of every 8-wide block. So nothing goes through shared
 * memory between the products: the epilogue, the row max and sum (over the 4 lanes of a row) and
 * O's rescaling act on the accumulators, and the accumulators of two adjacent 8-key blocks of P,
 * rounded to H, are P·V's A operand as they stand (FlashAttention-2's arrangement). Q's fragments
 * stay in registers for the whole walk; K is staged as rows (B's pairs are two consecutive
 * coordinates of one key) and V transposed (two consecutive keys of one column), both copied from
 * the operands packed once per call (mpk); the fragments are loaded by ldmatrix, and row strides
 * of Dp + 8 and 64 + 8 halves keep each of its 8 × 8 matrices in distinct banks.
 * MW (64 or 128) bounds the widths, so a narrow head does not hold a wide one's registers. */
enum { MF_MAX = 128 };

struct mlay {
    int64_t Dp, Dvp, ldq, ldvt; /* padded widths; row strides (halves) of Q / K and of Vᵀ */
    int64_t a, b, vt, an, bn, total;
};

inline mlay mlay_of(int64_t Dg, int64_t Dv) {
    mlay L;
    L.Dp = up(Dg > 0 ? Dg : 1, 16), L.Dvp = up(Dv > 0 ? Dv : 1, 16);
    L.ldq = L.Dp + 8, L.ldvt = WK + 8;
    L.a = 0;
    L.b = up(L.a + 64 * L.ldq * 2, 128);
    L.vt = up(L.b + 64 * L.ldq * 2, 128);
    L.an = up(L.vt + L.Dvp * L.ldvt * 2, 128);
    L.bn = up(L.an + 64 * 4, 128);
    L.total = up(L.bn + 64 * 4, 128);
    return L;
}

/* An operand rounded to H once per call, so that the mma kernels' tiles are plain 16-byte copies:
 * rounding f32 tiles per block (a conversion, bounds and padding per element, once per block that
 * walks them) took most of the forward's instructions on an H100 (Nsight Compute, 2026-11-27).
 * rows: (BH, np, wp), zero rows past the n rows and zero coordinates past w; cols: the same
 * transposed, (BH, wp, np), for a kernel that stages the operand so; nrm: ‖row‖² of the rounded
 * coordinates, (BH, np), for a distance score. np: n rounded up to 64 (WQ = WK), wp: a multiple of
 * 16, so every tile row starts 16-byte aligned. */
template <typename H> struct mpk {
    const H *rows, *cols;
    const float *nrm;
    int64_t np, wp;
};

/* dst: P's rows (cols = 0) or its transposed rows (cols = 1) of src, rounded */
template <typename H>
__global__ void pack_kernel(H *dst, const float *src, int64_t BH, int64_t n, int64_t np, int64_t D, int64_t w,
                            int64_t wp, int cols) {
    PN_CU_LOOP(e, BH * np * wp) {
        const int64_t inner = cols ? np : wp, rest = e / inner, mid = cols ? wp : np;
        const int64_t r = cols ? e % np : rest % np, d = cols ? rest % wp : e % wp, bh = rest / mid;
        dst[e] = to16<H>(r < n && d < w ? src[(bh * n + r) * D + d] : 0.0f);
    }
}

template <typename H> __global__ void pack_norms_kernel(float *nrm, const H *rows, int64_t nrows, int64_t wp) {
    PN_CU_LOOP(x, nrows) {
        float a = 0;
        for (int64_t d = 0; d < wp; d++) {
            const float v = from16(rows[x * wp + d]);
            a += v * v;
        }
        nrm[x] = a;
    }
}

/* The mma kernels' tiles of the packed operands, copied asynchronously (cp.async, cuda.cuh): a
 * thread's copies land by its wait for their group; then a barrier, before anyone reads them. */
/* rows × cols halves (cols a multiple of 8) from src (row stride lds) into dst (row stride ldd), a
 * 16-byte word per thread and step */
template <typename H> __device__ void copy_tile16(H *dst, int64_t ldd, const H *src, int64_t lds, int rows, int cols) {
    const int cpr = cols / 8;
    for (int e = threadIdx.x; e < rows * cpr; e += blockDim.x) {
        const int r = e / cpr, q = e - r * cpr;
        pn_cu_cp_async16(dst + r * ldd + 8 * q, src + r * lds + 8 * q);
    }
}
/* the same for a shape and destination stride known when compiling (the common case: the packed
 * width is the kernel's MW): every thread copies one word column, q = thread % (COLS / 8), of rows
 * thread / (COLS / 8) + k·(WT / (COLS / 8)), so each copy's shared address is the first one's plus a
 * constant. copy_tile16's word index divided by a run-time row length took ~50 SASS instructions a
 * word (an integer division and 64-bit address arithmetic), four words per thread and tile: a third
 * of mfwd_kernel's instructions per key tile at D = 64. blockDim.x = WT. */
template <int ROWS, int COLS, int LDD, typename H> __device__ void copy_tile16_c(H *dst, const H *src, int64_t lds) {
    enum { CPR = COLS / 8, STEP = WT / CPR };
    static_assert(COLS % 8 == 0 && WT % CPR == 0 && ROWS % STEP == 0, "copy_tile16_c: tile shape");
    const int q = threadIdx.x % CPR, r = threadIdx.x / CPR;
    H *d = dst + r * LDD + 8 * q;
    const H *s = src + r * lds + 8 * q;
#pragma unroll
    for (int k = 0; k < ROWS / STEP; k++) pn_cu_cp_async16(d + k * STEP * LDD, s + k * STEP * lds);
}
/* rows [r0, r0 + 64) of head bh of P into dst (ld halves per row; P.wp coordinates). MW: the
 * kernel's width bound; a tile of width MW in the layouts' row stride MW + 8 (mlay, mblay, mklay)
 * takes the copy whose shape the compiler knows */
template <int MW, typename H>
__device__ void ptile_rows(H *dst, int64_t ld, const mpk<H> &P, int64_t bh, int64_t r0) {
    const H *src = P.rows + (bh * P.np + r0) * P.wp;
    if (P.wp == MW && ld == MW + 8) copy_tile16_c<64, MW, MW + 8>(dst, src, MW);
    else copy_tile16(dst, ld, src, P.wp, 64, (int)P.wp);
}
/* the same rows transposed: dst[d·ld + r] for d < P.wp (the layouts' stride: 64 + 8) */
template <int MW, typename H>
__device__ void ptile_cols(H *dst, int64_t ld, const mpk<H> &P, int64_t bh, int64_t r0) {
    const H *src = P.cols + bh * P.wp * P.np + r0;
    if (P.wp == MW && ld == 64 + 8) copy_tile16_c<MW, 64, 64 + 8>(dst, src, P.np);
    else copy_tile16(dst, ld, src, P.np, (int)P.wp, 64);
}
/* their norms: 64 floats, 16 words (r0 and np multiples of 64 keep them 16-byte aligned) */
template <typename H> __device__ void ptile_norms(float *dst, const mpk<H> &P, int64_t bh, int64_t r0) {
    for (int e = threadIdx.x; e < 16; e += blockDim.x) pn_cu_cp_async16(dst + 4 * e, P.nrm + bh * P.np + r0 + 4 * e);
}

/* The mma kernels' staged keys (queries), fetched with their tile: thread jl < WK copies key j0 + jl's
 * terms, γ and NaN flag into its own slot by cp.async, in the caller's commit group, and after the
 * wait applies S::key itself (key_finish). Each thread reads back only what it copied, so no barrier
 * lies between; the slot's other readers are past the barrier before the fetch. Loaded by plain
 * loads at the top of a tile, each tile began with a wait for global memory ahead of its barrier;
 * held in registers across the products instead, they added spills to the backward's kernels. */
template <typename S> __device__ void key_fetch(const dcall<float> &c, int64_t bh, int64_t j0, kstage<float> *ks) {
    const int jl = threadIdx.x;
    if (jl >= WK) return;
    kstage<float> &z = ks[jl];
    const int64_t j = j0 + jl, y = bh * c.Nk + j;
    if (j >= c.Nk) {
        z.t0 = z.t1 = 0, z.gv = 1, z.bad = 0;
        return;
    }
    if (S::terms & T_K0) pn_cu_cp_async4(&z.t0, c.kt[0] + y);
    else z.t0 = 0;
    if (S::terms & T_K1) pn_cu_cp_async4(&z.t1, c.kt[1] + y);
    else z.t1 = 0;
    if (c.g) pn_cu_cp_async4(&z.gv, c.g + y);
    else z.gv = 1;
    pn_cu_cp_async4(&z.bad, c.kbad + y);
}
/* after the wait: S::key of the thread's key; its NaN flag, for the barrier to or */
template <typename S, typename Hd> __device__ int key_finish(const Hd &hd, kstage<float> *ks) {
    if (threadIdx.x >= WK) return 0;
    kstage<float> &z = ks[threadIdx.x];
    z.kx = S::key(&hd, z.t0, z.t1);
    return z.bad;
}
/* the key pass's queries [i0, i0 + WQ) likewise: terms, NaN flag, statistic, D_i (zeros past Nq) */
template <typename S>
__device__ void query_fetch(const dcall<float> &c, const dbw<float> &a, int64_t bh, int64_t i0, qstage<float> *qsg) {
    const int il = threadIdx.x;
    if (il >= WQ) return;
    qstage<float> &z = qsg[il];
    const int64_t i = i0 + il, x = bh * c.Nq + i;
    if (i >= c.Nq) {
        z.q0 = z.q1 = z.st = z.Di = 0, z.bad = 0;
        return;
    }
    if (S::terms & T_Q0) pn_cu_cp_async4(&z.q0, c.qt[0] + x);
    else z.q0 = 0;
    if (S::terms & T_Q1) pn_cu_cp_async4(&z.q1, c.qt[1] + x);
    else z.q1 = 0;
    pn_cu_cp_async4(&z.bad, c.qbad + x);
    pn_cu_cp_async4(&z.st, a.stat + x);
    pn_cu_cp_async4(&z.Di, a.Drow + x);
}
template <typename S, typename Hd> __device__ int query_finish(const Hd &hd, qstage<float> *qsg) {
    if (threadIdx.x >= WQ) return 0;
    qstage<float> &z = qsg[threadIdx.x];
    z.rx = S::row(&hd, z.q0, z.q1);
    return z.bad;
}

/* Whole tiles: keys [0, keys_whole) are seen by both of a lane's rows r with no modifier — no bias,
 * ALiBi or mask, no NaN flag on the rows (a tile's keys: or-ed at its barrier), inside the causal
 * limit (kend) — so there the score alone is what mods would return, without its per-pair index work */
template <typename S>
__device__ int64_t keys_whole(const dcall<float> &c, const drow<float, S> *r, const int64_t *kend) {
    if (c.bias || c.alibi || c.mask || r[0].qb || r[1].qb) return 0;
    return kend[0] < kend[1] ? kend[0] : kend[1];
}

/* The fragments come from shared memory by ldmatrix (mma_ptx.cuh): lane 8m + r names row r of
 * 8 × 8 matrix m; the tiles' row strides (width + 8 halves: 16 mod 128 bytes) keep the 8 rows of
 * each matrix in distinct banks. One .x4 loads what four 32-bit loads per lane did. */
__device__ inline int ldm_row() { return threadIdx.x % 8; }      /* r */
__device__ inline int ldm_mat() { return threadIdx.x % 32 / 8; } /* m */

/* the warp's A fragments of its 16 rows of X (ld halves), chunks kc < n of 16 columns (zeros past
 * n): matrices 0–3 = rows 0–7 / 8–15 of columns 0–7, then of columns 8–15 — a[0] … a[3] */
template <typename H> __device__ inline const H *frag_a_row(const H *X, int64_t ld) {
    const int w = threadIdx.x / 32, m = ldm_mat();
    return X + (w * 16 + ldm_row() + 8 * (m % 2)) * ld + 8 * (m / 2);
}
template <typename H, int KC> __device__ void frags_a(uint32_t (*fa)[4], const H *X, int64_t ld, int n) {
    const H *x = frag_a_row(X, ld);
#pragma unroll
    for (int kc = 0; kc < KC; kc++) {
        if (kc < n) pn_ldmatrix_x4(fa[kc], x + kc * 16); /* n is the same for the whole warp */
        else fa[kc][0] = fa[kc][1] = fa[kc][2] = fa[kc][3] = 0u;
    }
}

/* the B fragments b[0], b[1] of two adjacent 8-column blocks for one 16-deep chunk, from Bt: the
 * blocks' 16 rows (ld halves), whose pairs run along k, from column k0. Matrices 0–3 = the first
 * block's k 0–7 and 8–15, then the second's: b[0][0], b[0][1], b[1][0], b[1][1] */
template <typename H> __device__ inline void frags_b2(uint32_t (*b)[2], const H *Bt, int64_t ld, int k0) {
    const int m = ldm_mat();
    uint32_t r[4];
    pn_ldmatrix_x4(r, Bt + ((m / 2) * 8 + ldm_row()) * ld + k0 + 8 * (m % 2));
    b[0][0] = r[0], b[0][1] = r[1], b[1][0] = r[2], b[1][1] = r[3];
}

/* acc[nb] (nb < 8: the 16 × 8 blocks of 64 columns) = A·Bᵀ, A's 16-wide chunk kc < n from
 * afrag(kc, a) (mma_abt, mma_abt_s below), B 64 rows (ld halves) whose pairs are consecutive columns.
 * Chunk by chunk, the eight blocks' mma in a row: they are independent, so the tensor core pipelines
 * them — block by block, each mma waited for the one before it and for its own shared-memory load
 * (nvcc kept that order: SASS) */
template <typename H, int KC, bool FULL, typename F>
__device__ void mma_abt_run(float (*acc)[4], const H *B, int64_t ld, int n, F afrag) {
#pragma unroll
    for (int nb = 0; nb < WK / 8; nb++) acc[nb][0] = acc[nb][1] = acc[nb][2] = acc[nb][3] = 0;
#pragma unroll
    for (int kc = 0; kc < KC; kc++) {
        if (!FULL && kc >= n) break; /* the same for the whole warp */
        uint32_t a[4], b[WK / 8][2];
        afrag(kc, a);
#pragma unroll
        for (int nb = 0; nb < WK / 8; nb += 2) frags_b2(b + nb, B + nb * 8 * ld, ld, kc * 16);
#pragma unroll
        for (int nb = 0; nb < WK / 8; nb++) pn_mma_16816<H>(acc[nb], a, b[nb], acc[nb]);
    }
}
/* n = KC (the width is the kernel's bound, the common case) takes a copy without the test per
 * chunk: straight-line code, in which ptxas may load the next chunk's fragments while the products
 * of this one run. STRAIGHT = false leaves it out: the backward's kernels at width 128 are at 255
 * registers, where the second copy added spills (ptxas) */
template <typename H, int KC, bool STRAIGHT, typename F>
__device__ void mma_abt_from(float (*acc)[4], const H *B, int64_t ld, int n, F afrag) {
    if (STRAIGHT && n == KC) mma_abt_run<H, KC, true>(acc, B, ld, n, afrag);
    else mma_abt_run<H, KC, false>(acc, B, ld, n, afrag);
}

/* … with A the fragments fa the warp holds in registers (frags_a) */
template <typename H, int KC, bool STRAIGHT = true>
__device__ void mma_abt(float (*acc)[4], const uint32_t (*fa)[4], const H *B, int64_t ld, int n) {
    mma_abt_from<H, KC, STRAIGHT>(acc, B, ld, n, [&](int kc, uint32_t *a) {
        a[0] = fa[kc][0], a[1] = fa[kc][1], a[2] = fa[kc][2], a[3] = fa[kc][3];
    });
}
/* the same with A's fragments read from shared memory (A: the warp's 16 rows, lda halves) chunk by
 * chunk, for a kernel that cannot keep them in registers (mbwk_kernel at width 128) */
template <typename H, int KC, bool STRAIGHT = true>
__device__ void mma_abt_s(float (*acc)[4], const H *A, int64_t lda, const H *B, int64_t ld, int n) {
    const H *x = frag_a_row(A, lda);
    mma_abt_from<H, KC, STRAIGHT>(acc, B, ld, n, [&](int kc, uint32_t *a) { pn_ldmatrix_x4(a, x + kc * 16); });
}

/* acc[nb] += P·B (nb < n, n even: 8-wide column blocks of B): P the warp's 16 × 64 accumulators p
 * (blocks of 8 keys) rounded to H — blocks 2kk and 2kk + 1 are the A operand of keys 16kk … 16kk
 * + 15 as they stand — and B (64 × width) staged transposed in Bt (row d of Bt: column d of B;
 * ld halves), so B's pairs (two consecutive keys) run along Bt's rows */
template <typename H, int NB, bool FULL>
__device__ void mma_pb_run(float (*acc)[4], const float (*p)[4], const H *Bt, int64_t ld, int n) {
#pragma unroll
    for (int kk = 0; kk < WK / 16; kk++) {
        const float *p0 = p[2 * kk], *p1 = p[2 * kk + 1];
        const uint32_t pa[4] = {pn_pack16(to16<H>(p0[0]), to16<H>(p0[1])), pn_pack16(to16<H>(p0[2]), to16<H>(p0[3])),
                                pn_pack16(to16<H>(p1[0]), to16<H>(p1[1])), pn_pack16(to16<H>(p1[2]), to16<H>(p1[3]))};
#pragma unroll
        for (int nb = 0; nb < NB; nb += 2) {
            if (!FULL && nb >= n) break;
            uint32_t b[2][2];
            frags_b2(b, Bt + nb * 8 * ld, ld, kk * 16);
            pn_mma_16816<H>(acc[nb], pa, b[0], acc[nb]);
            pn_mma_16816<H>(acc[nb + 1], pa, b[1], acc[nb + 1]);
        }
    }
}
/* n = NB: a copy without the test per block pair, as mma_abt_from (STRAIGHT likewise). With the
 * test, each pair's ldmatrix waited for the products before it to read its registers (SASS: one
 * fragment register set reused, its load's latency exposed a pair at a time) */
template <typename H, int NB, bool STRAIGHT = true>
__device__ void mma_pb(float (*acc)[4], const float (*p)[4], const H *Bt, int64_t ld, int n) {
    if (STRAIGHT && n == NB) mma_pb_run<H, NB, true>(acc, p, Bt, ld, n);
    else mma_pb_run<H, NB, false>(acc, p, Bt, ld, n);
}

/* at widths ≤ 64, three blocks per SM: 168 registers a thread at most (the tensor-core products'
 * straight-line copies alone left ptxas at 171, which fits two) */
template <typename H, typename S, int MW>
__global__ void __launch_bounds__(WT, MW <= 64 ? 3 : 1)
    mfwd_kernel(dcall<float> c, mlay L, mpk<H> Kp, mpk<H> Vp, float *out, float *stat) {
    enum { KC = MW / 16, NV = MW / 8, NS = WK / 8 }; /* Q's 16-wide chunks, O's and S's 8-wide blocks */
    PN_SHARED_DYN(unsigned char, smu);
    PN_SHARED(kstage<float>, ks, WK);
    unsigned char *sm = pn_cu_align128(smu);
    H *Qs = (H *)(sm + L.a), *Ks = (H *)(sm + L.b), *Vt = (H *)(sm + L.vt);
    float *qn = (float *)(sm + L.an), *kn = (float *)(sm + L.bn);
    const int64_t nqt = (c.Nq + WQ - 1) / WQ, bh = blockIdx.x / nqt, i0 = (blockIdx.x - bh * nqt) * WQ;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int kc_n = (int)(L.Dp / 16), nv_n = (int)(L.Dvp / 8);
    wtile_load(Qs, L.ldq, c.q + bh * c.Nq * c.D, i0, c.Nq, c.D, c.gemm ? c.Dg : 0, L.Dp);
    __syncthreads();
    if (c.diff) wnorms(Qs, L.ldq, c.Dg, qn);
    /* the lane's two rows: local rl[h] = 16w + g + 8h */
    int rl[2];
    int64_t ri[2], kend[2];
    bool live[2];
    drow<float, S> r[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        rl[h] = w * 16 + g + 8 * h;
        ri[h] = i0 + rl[h];
        live[h] = ri[h] < c.Nq;
        row_init<float, S>(c, bh, live[h] ? ri[h] : c.Nq - 1, r[h]);
        kend[h] = live[h] ? key_end(c, ri[h]) : 0;
    }
    uint32_t qa[KC][4];
    frags_a<H, KC>(qa, Qs, L.ldq, kc_n);
    float o[NV][4];
#pragma unroll
    for (int nb = 0; nb < NV; nb++) o[nb][0] = o[nb][1] = o[nb][2] = o[nb][3] = 0;
    const int64_t kend_blk = key_end(c, (i0 + WQ < c.Nq ? i0 + WQ : c.Nq) - 1);
    const bool soft = c.norm == PN_NORM_SOFTMAX;
    const int64_t kwhole = keys_whole(c, r, kend);
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0};
    int nan[2] = {0, 0};
    /* The loads overlap the products as in FlashAttention-2, with one buffer each for K and Vᵀ:
     * V's tile is copied (cp.async) while S = Q·Kᵀ and the softmax run, the next K tile while
     * P·V runs, and with it the keys' staged values (key_fetch). Each copy is issued after the
     * barrier that ends its buffer's last reads. */
    auto fetch_k = [&](int64_t j0) {
        ptile_rows<MW>(Ks, L.ldq, Kp, bh, j0);
        if (c.diff) ptile_norms(kn, Kp, bh, j0);
        key_fetch<S>(c, bh, j0, ks);
        pn_cu_cp_async_commit();
    };
    if (kend_blk > 0) fetch_k(0);
    for (int64_t j0 = 0; j0 < kend_blk; j0 += WK) {
        pn_cu_cp_async_wait<0>(); /* this thread's copies of K's tile and its staged key have landed … */
        /* … and everyone's after the barrier, past which no one reads Vᵀ's previous tile; the
         * barrier ors the keys' NaN flags */
        const int tbad = __syncthreads_or(key_finish<S>(r[0].hd, ks));
        ptile_cols<MW>(Vt, L.ldvt, Vp, bh, j0);
        pn_cu_cp_async_commit();
        /* S_w = Q_w·Kᵀ: sc[nb] the 16 × 8 block of keys 8nb … 8nb + 7 */
        float sc[NS][4];
        mma_abt<H, KC>(sc, qa, Ks, L.ldq, c.gemm ? kc_n : 0);
        /* the epilogue on the accumulators: element e of block nb is row h = e / 2, key 8nb + 2t + e % 2.
         * One copy for whole tiles (most of them), which test nothing per pair, one for the rest; a
         * product score (S::diff = 0) reads no norms. One loop testing both at run time cost the dot
         * ~10 instructions a pair (SASS: nvcc recomputed the 64-bit `whole` test for each of the 32
         * and issued the norms' loads, predicated off). */
        float tmax[2] = {-INFINITY, -INFINITY}; /* NaN once a score is NaN */
        auto epilogue = [&](auto whole_c) {
            constexpr bool whole = decltype(whole_c)::value, diff = S::diff;
            const float qh[2] = {diff ? qn[rl[0]] : 0.0f, diff ? qn[rl[1]] : 0.0f};
#pragma unroll
            for (int nb = 0; nb < NS; nb++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int h = e >> 1, jl = nb * 8 + 2 * t + (e & 1);
                    const kstage<float> &z = ks[jl];
                    float v = -INFINITY;
                    if (whole || (j0 + jl < kend[h] && !nan[h])) {
                        /* w_G: the product, or −½‖q − k‖² (without c.gemm the product is 0) */
                        const float G = diff ? sc[nb][e] - 0.5f * (qh[h] + kn[jl]) : sc[nb][e];
                        v = S::pair(&r[h].hd, r[h].rx, z.kx, G, r[h].q0, r[h].q1, z.t0, z.t1);
                        if (!whole) v = mods(c, r[h], j0 + jl, v, z.bad);
                    }
                    sc[nb][e] = v;
                    tmax[h] = pn_cu_fmax_nan(tmax[h], v);
                }
        };
        if (!tbad && j0 + WK <= kwhole) epilogue(std::true_type{});
        else epilogue(std::false_type{});
        float alpha[2] = {1, 1}, ml2[2] = {0, 0};
        if (soft)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float mt = tmax[h];
#pragma unroll
                for (int o = 1; o < 4; o <<= 1) mt = pn_cu_fmax_nan(mt, __shfl_xor_sync(0xffffffffu, mt, o));
                /* a NaN or +inf score: the row will be NaN, whatever its max (a NaN max raises nothing) */
                nan[h] |= !(mt < INFINITY);
                const float mn = mt > m[h] ? mt : m[h];
                if (mn != -INFINITY && mn != m[h]) alpha[h] = m[h] == -INFINITY ? 0.0f : pn_cu_exp_sfu(m[h] - mn);
                m[h] = mn;
                /* a row masked so far (every v = −inf): 2^(−inf − 0) = 0 */
                ml2[h] = mn == -INFINITY ? 0.0f : mn * PN_LOG2E_F;
            }
        /* the weights, p = e^(v − m)·γ = 2^(v·log₂e − m·log₂e)·γ: one FFMA and the SFU's exp2 a pair
         * (v = −inf gives 0); γ (the einstein aggregation's) in its own copy. A row with a NaN flag
         * gets weights of no meaning: its output and statistic are NaN whatever they are (below),
         * and P·V mixes no rows. A select of 0 for such rows cost a move per pair (SASS). */
        float ps[2] = {0, 0};
        auto weights = [&](auto gam_c) {
#pragma unroll
            for (int nb = 0; nb < NS; nb++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int h = e >> 1, jl = nb * 8 + 2 * t + (e & 1);
                    float p = pn_cu_exp2_sfu(fmaf(sc[nb][e], PN_LOG2E_F, -ml2[h]));
                    if (decltype(gam_c)::value) p *= ks[jl].gv;
                    sc[nb][e] = p;
                    ps[h] += p;
                }
        };
        if (!soft) {
#pragma unroll
            for (int nb = 0; nb < NS; nb++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int h = e >> 1, jl = nb * 8 + 2 * t + (e & 1);
                    float p = pn_cu_sigm_sfu(sc[nb][e]);
                    if (c.g) p *= ks[jl].gv;
                    sc[nb][e] = p;
                    ps[h] += p;
                }
        } else if (c.g) {
            weights(std::true_type{});
        } else {
            weights(std::false_type{});
        }
#pragma unroll
        for (int h = 0; h < 2; h++) l[h] = l[h] * alpha[h] + pn_cu_lanes_sum<4>(ps[h]);
        pn_cu_cp_async_wait<0>(); /* Vᵀ's tile: this thread's copies, then everyone's */
        __syncthreads();          /* and no one reads K's tile or ks any more: the next K tile may come */
        if (j0 + WK < kend_blk) fetch_k(j0 + WK);
        /* O_w = O_w·α + P_w·V: P's blocks 2kk and 2kk + 1 are the A operand of keys 16kk … 16kk + 15 */
        /* only when some row of the warp has a new max: past the first tiles, seldom (a vote, where
         * the rescale is 4·NV multiplications a lane) */
        if (__any_sync(0xffffffffu, alpha[0] != 1 || alpha[1] != 1))
#pragma unroll
            for (int nb = 0; nb < NV; nb++) {
                o[nb][0] *= alpha[0], o[nb][1] *= alpha[0], o[nb][2] *= alpha[1], o[nb][3] *= alpha[1];
            }
        mma_pb<H, NV>(o, sc, Vt, L.ldvt, nv_n);
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        if (!live[h]) continue;
        const float lh = nan[h] ? NAN : l[h];
        const int64_t x = bh * c.Nq + ri[h];
        float *orow = out + x * c.Dv;
        const float inv = c.normalized ? (lh > 0 ? 1 / lh : 0.0f) : 1.0f;
#pragma unroll
        for (int nb = 0; nb < NV; nb++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int64_t d = nb * 8 + 2 * t + e;
                if (d < c.Dv) orow[d] = lh != lh ? NAN : o[nb][2 * h + e] * inv;
            }
        if (t == 0) {
            if (lh != lh) stat[x] = lh;
            else if (soft) stat[x] = lh > 0 ? m[h] + pn_log(lh) : -INFINITY;
            else stat[x] = lh;
        }
    }
}

/* the backward's query side on tensor cores: a block per (bh, 64 query rows); S_w = Q_w·Kᵀ and
 * dP_w = dO_w·Vᵀ per key tile, the pair's dS and VJP per element (as tbwq_kernel), dQ_w += ∂G_w·K
 * (a distance score: − (Σ_j ∂G_ij)·q_i at the end, from the f32 q) */
template <typename H, typename S> __global__ void wbwq_kernel(dcall<float> c, dbw<float> a, wlay L) {
    PN_SHARED_DYN(unsigned char, smu);
    PN_SHARED(kstage<float>, ks, WK);
    unsigned char *sm = pn_cu_align128(smu);
    H *Qs = (H *)(sm + L.a), *Ks = (H *)(sm + L.b), *dOs = (H *)(sm + L.va), *Vs = (H *)(sm + L.vb), *Gs = (H *)(sm + L.p);
    float *Ss = (float *)(sm + L.s), *DPs = (float *)(sm + L.dp), *dQ = (float *)(sm + L.acc), *qn = (float *)(sm + L.an),
          *kn = (float *)(sm + L.bn);
    const int64_t nqt = (c.Nq + WQ - 1) / WQ, bh = blockIdx.x / nqt, i0 = (blockIdx.x - bh * nqt) * WQ;
    const int w = threadIdx.x / 32, rr = threadIdx.x / WTPR, t = threadIdx.x % WTPR;
    const int64_t i = i0 + rr;
    const bool live = i < c.Nq;
    float *Sw = Ss + w * 16 * L.lds, *Sr = Ss + rr * L.lds, *DPw = DPs + w * 16 * L.lds, *DPr = DPs + rr * L.lds,
          *dQrow = dQ + rr * L.ldo;
    H *Gw = Gs + w * 16 * L.ldp, *Grow = Gs + rr * L.ldp;
    wtile_load(Qs, L.ldq, c.q + bh * c.Nq * c.D, i0, c.Nq, c.D, c.gemm ? c.Dg : 0, L.Dp);
    wtile_load(dOs, L.ldv, a.dout + bh * c.Nq * c.Dv, i0, c.Nq, c.Dv, c.Dv, L.Dvp);
    for (int64_t d = t; d < c.Dg; d += WTPR) dQrow[d] = 0;
    __syncthreads();
    if (c.diff) wnorms(Qs, L.ldq, c.Dg, qn);
    drow<float, S> r;
    row_init<float, S>(c, bh, live ? i : c.Nq - 1, r);
    const int want = wants<S>(&c.hp[r.h]);
    const float st = a.stat[r.x], Di = a.Drow[r.x];
    const int64_t kend = live ? key_end(c, i) : 0;
    const int64_t kend_blk = key_end(c, (i0 + WQ < c.Nq ? i0 + WQ : c.Nq) - 1);
    double aq0 = 0, aq1 = 0, b0 = 0, b1 = 0, b2 = 0, gsum = 0;
    for (int64_t j0 = 0; j0 < kend_blk; j0 += WK) {
        __syncthreads();
        wtile_load(Ks, L.ldq, c.k + bh * c.Nk * c.D, j0, c.Nk, c.D, c.gemm ? c.Dg : 0, L.Dp);
        wtile_load(Vs, L.ldv, c.v + bh * c.Nk * c.Dv, j0, c.Nk, c.Dv, c.Dv, L.Dvp);
        stage_keys<WK, float, S>(c, r.hd, bh, j0, ks);
        __syncthreads();
        if (c.diff) wnorms(Ks, L.ldq, c.Dg, kn);
        if (c.gemm) w_abt(Qs + w * 16 * L.ldq, L.ldq, Ks, L.ldq, L.Dp, Sw, L.lds);
        w_abt(dOs + w * 16 * L.ldv, L.ldv, Vs, L.ldv, L.Dvp, DPw, L.lds);
        __syncthreads();
        /* the tile's sums in f32, added to the row's double sums once a tile (as mbwq_kernel) */
        float fq0 = 0, fq1 = 0, fb0 = 0, fb1 = 0, fb2 = 0, fg = 0;
        for (int jj = 0; jj < WK / WTPR; jj++) {
            const int jl = t + WTPR * jj;
            const int64_t j = j0 + jl;
            float g = 0;
            if (j < kend) {
                const kstage<float> &z = ks[jl];
                const float G = w_G(c, Sr[jl], c.diff ? qn[rr] : 0.0f, c.diff ? kn[jl] : 0.0f);
                const float sv = mods(c, r, j, S::pair(&r.hd, r.rx, z.kx, G, r.q0, r.q1, z.t0, z.t1), z.bad);
                dpv<float> pv;
                norm_ds(c, sv, z.gv, st, Di, DPr[jl], pv);
                if (pv.ds != 0) {
                    const auto dd = S::vjp(&r.hd, r.rx, z.kx, G, r.q0, r.q1, z.t0, z.t1, pv.ds, want);
                    fq0 += dd.q0, fq1 += dd.q1;
                    if (want) fb0 += dd.p0, fb1 += dd.p1, fb2 += dd.p2;
                    if (c.gemm) g = dd.g;
                }
            }
            fg += g;
            Grow[jl] = to16<H>(g);
        }
        aq0 += fq0, aq1 += fq1, gsum += fg;
        if (want) b0 += fb0, b1 += fb1, b2 += fb2;
        __syncwarp();
        if (c.gemm) w_ab_into(Gw, L.ldp, Ks, L.ldq, c.Dg, L.Dp, Sw, L.lds, Sr, dQrow, 1.0f, false, t);
    }
    aq0 = pn_cu_lanes_sum<WTPR>(aq0), aq1 = pn_cu_lanes_sum<WTPR>(aq1), gsum = pn_cu_lanes_sum<WTPR>(gsum);
    b0 = pn_cu_lanes_sum<WTPR>(b0), b1 = pn_cu_lanes_sum<WTPR>(b1), b2 = pn_cu_lanes_sum<WTPR>(b2);
    if (!live) return;
    const double tq[2] = {(S::terms & T_Q0) ? aq0 : 0.0, (S::terms & T_Q1) ? aq1 : 0.0};
    float *dqi = a.dq + r.x * c.D;
    for (int64_t d = t; d < c.D; d += WTPR) {
        float gd = d < c.Dg ? dQrow[d] - (c.diff ? (float)gsum * r.qr[d] : 0.0f) : 0.0f;
        dqi[d] += gd + term_col(c, c.qk, tq, r.qr[d], d);
    }
    if (t == 0 && want && a.dparam) {
        double *dp = a.dparam + r.x * PN_NPARAM;
        if (S::pid(0) >= 0) dp[S::pid(0) >= 0 ? S::pid(0) : 0] += b0;
        if (S::pid(1) >= 0) dp[S::pid(1) >= 0 ? S::pid(1) : 0] += b1;
        if (S::pid(2) >= 0) dp[S::pid(2) >= 0 ? S::pid(2) : 0] += b2;
    }
}

/* The backward's query side on mma.sync (as mfwd_kernel is to wfwd_kernel): per key tile S_w =
 * Q_w·Kᵀ and dP_w = dO_w·Vᵀ in registers (Q's and dO's fragments kept for the whole walk; B's
 * pairs from K and V as rows), the pair's dS and VJP on the accumulators, and ∂G's accumulators —
 * rounded to H, already the A operand — times K (staged transposed) into dQ's accumulators. The
 * row sums (the terms, the parameters, Σ_j ∂G_ij) over the 4 lanes of a row at the end. */
struct mblay {
    int64_t Dp, Dvp, ldq, ldv, ldkt; /* padded widths; row strides (halves) of Q / K, dO / V, Kᵀ */
    int64_t a, b, va, vb, kt, an, bn, total;
};

inline mblay mblay_of(int64_t Dg, int64_t Dv) {
    mblay L;
    L.Dp = up(Dg > 0 ? Dg : 1, 16), L.Dvp = up(Dv > 0 ? Dv : 1, 16);
    L.ldq = L.Dp + 8, L.ldv = L.Dvp + 8, L.ldkt = WK + 8;
    L.a = 0;
    L.b = up(L.a + 64 * L.ldq * 2, 128);
    L.va = up(L.b + 64 * L.ldq * 2, 128);
    L.vb = up(L.va + 64 * L.ldv * 2, 128);
    L.kt = up(L.vb + 64 * L.ldv * 2, 128);
    L.an = up(L.kt + L.Dp * L.ldkt * 2, 128);
    L.bn = up(L.an + 64 * 4, 128);
    L.total = up(L.bn + 64 * 4, 128);
    return L;
}

template <typename H, typename S, int MW>
__global__ void mbwq_kernel(dcall<float> c, dbw<float> a, mblay L, mpk<H> Kp, mpk<H> Vp) {
    enum { KC = MW / 16, NQ = MW / 8, NS = WK / 8 };
    PN_SHARED_DYN(unsigned char, smu);
    PN_SHARED(kstage<float>, ks, WK);
    unsigned char *sm = pn_cu_align128(smu);
    H *Qs = (H *)(sm + L.a), *Ks = (H *)(sm + L.b), *dOs = (H *)(sm + L.va), *Vs = (H *)(sm + L.vb),
      *Kt = (H *)(sm + L.kt);
    float *qn = (float *)(sm + L.an), *kn = (float *)(sm + L.bn);
    const int64_t nqt = (c.Nq + WQ - 1) / WQ, bh = blockIdx.x / nqt, i0 = (blockIdx.x - bh * nqt) * WQ;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int kc_n = (int)(L.Dp / 16), kv_n = (int)(L.Dvp / 16), nq_n = (int)(L.Dp / 8);
    wtile_load(Qs, L.ldq, c.q + bh * c.Nq * c.D, i0, c.Nq, c.D, c.gemm ? c.Dg : 0, L.Dp);
    wtile_load(dOs, L.ldv, a.dout + bh * c.Nq * c.Dv, i0, c.Nq, c.Dv, c.Dv, L.Dvp);
    __syncthreads();
    if (c.diff) wnorms(Qs, L.ldq, c.Dg, qn);
    int rl[2];
    int64_t ri[2], kend[2];
    bool live[2];
    float st[2], Di[2];
    drow<float, S> r[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        rl[h] = w * 16 + g + 8 * h;
        ri[h] = i0 + rl[h];
        live[h] = ri[h] < c.Nq;
        row_init<float, S>(c, bh, live[h] ? ri[h] : c.Nq - 1, r[h]);
        kend[h] = live[h] ? key_end(c, ri[h]) : 0;
        st[h] = a.stat[r[h].x], Di[h] = a.Drow[r[h].x];
    }
    const int want = wants<S>(&c.hp[r[0].h]);
    uint32_t qa[KC][4], da[KC][4];
    frags_a<H, KC>(qa, Qs, L.ldq, kc_n);
    frags_a<H, KC>(da, dOs, L.ldv, kv_n);
    float dq[NQ][4];
#pragma unroll
    for (int nb = 0; nb < NQ; nb++) dq[nb][0] = dq[nb][1] = dq[nb][2] = dq[nb][3] = 0;
    const int64_t kend_blk = key_end(c, (i0 + WQ < c.Nq ? i0 + WQ : c.Nq) - 1);
    double aq0[2] = {0, 0}, aq1[2] = {0, 0}, b0[2] = {0, 0}, b1[2] = {0, 0}, b2[2] = {0, 0}, gsum[2] = {0, 0};
    const int64_t kwhole = keys_whole(c, r, kend);
    const bool plain = MW <= 64 && c.norm == PN_NORM_SOFTMAX && !c.g; /* not at 128: spills (ptxas) */
    /* loads overlapping the products, as in mfwd_kernel: Kᵀ's tile is copied while S, dP and the
     * VJP run, the next K and V tiles and staged keys while ∂G·K runs */
    auto fetch_kv = [&](int64_t j0) {
        ptile_rows<MW>(Ks, L.ldq, Kp, bh, j0);
        ptile_rows<MW>(Vs, L.ldv, Vp, bh, j0);
        if (c.diff) ptile_norms(kn, Kp, bh, j0);
        key_fetch<S>(c, bh, j0, ks);
        pn_cu_cp_async_commit();
    };
    if (kend_blk > 0) fetch_kv(0);
    for (int64_t j0 = 0; j0 < kend_blk; j0 += WK) {
        pn_cu_cp_async_wait<0>(); /* K's and V's tiles and the staged key, then everyone's after the
                                   * barrier, past which no one reads Kᵀ's previous tile */
        const int tbad = __syncthreads_or(key_finish<S>(r[0].hd, ks));
        ptile_cols<MW>(Kt, L.ldkt, Kp, bh, j0);
        pn_cu_cp_async_commit();
        float sc[NS][4], dp[NS][4];
        mma_abt<H, KC, MW <= 64>(sc, qa, Ks, L.ldq, c.gemm ? kc_n : 0);
        mma_abt<H, KC, MW <= 64>(dp, da, Vs, L.ldv, kv_n);
        /* one copy for whole tiles, one for the rest; norms for distance scores only (as mfwd_kernel) */
        auto vjp_tile = [&](auto whole_c, auto plain_c) {
            constexpr bool whole = decltype(whole_c)::value, plain = decltype(plain_c)::value, diff = S::diff;
            const float qh[2] = {diff ? qn[rl[0]] : 0.0f, diff ? qn[rl[1]] : 0.0f};
            /* the tile's sums in f32, added to the rows' double sums once a tile: a double add
             * per pair runs at half the f32 rate on an H100 and at 1/64 on GeForce cards */
            float fq0[2] = {0, 0}, fq1[2] = {0, 0}, fb0[2] = {0, 0}, fb1[2] = {0, 0}, fb2[2] = {0, 0}, fg[2] = {0, 0};
#pragma unroll
            for (int nb = 0; nb < NS; nb++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int h = e >> 1, jl = nb * 8 + 2 * t + (e & 1);
                    const int64_t j = j0 + jl;
                    float gv = 0;
                    if (whole || j < kend[h]) {
                        const kstage<float> &z = ks[jl];
                        const float G = diff ? sc[nb][e] - 0.5f * (qh[h] + kn[jl]) : sc[nb][e]; /* w_G */
                        const float s0 = S::pair(&r[h].hd, r[h].rx, z.kx, G, r[h].q0, r[h].q1, z.t0, z.t1);
                        const float sv = whole ? s0 : mods(c, r[h], j, s0, z.bad);
                        dpv<float> pv;
                        norm_ds<float, true, plain>(c, sv, z.gv, st[h], Di[h], dp[nb][e], pv);
                        if (pv.ds != 0) {
                            const auto dd =
                                S::vjp(&r[h].hd, r[h].rx, z.kx, G, r[h].q0, r[h].q1, z.t0, z.t1, pv.ds, want);
                            if (S::terms & T_Q0) fq0[h] += dd.q0; /* only the terms the score has */
                            if (S::terms & T_Q1) fq1[h] += dd.q1;
                            if (want) fb0[h] += dd.p0, fb1[h] += dd.p1, fb2[h] += dd.p2;
                            if (c.gemm) gv = dd.g;
                        }
                    }
                    if (diff) fg[h] += gv; /* read by distance scores only */
                    sc[nb][e] = gv;
                }
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if (S::terms & T_Q0) aq0[h] += fq0[h];
                if (S::terms & T_Q1) aq1[h] += fq1[h];
                if (want) b0[h] += fb0[h], b1[h] += fb1[h], b2[h] += fb2[h];
                if (diff) gsum[h] += fg[h];
            }
        };
        /* whole tiles of a softmax without γ (the common case) in a copy of their own (norm_ds's PLAIN) */
        if (!tbad && j0 + WK <= kwhole) {
            if (plain) vjp_tile(std::true_type{}, std::true_type{});
            else vjp_tile(std::true_type{}, std::false_type{});
        } else {
            vjp_tile(std::false_type{}, std::false_type{});
        }
        pn_cu_cp_async_wait<0>(); /* Kᵀ's tile: this thread's copies, then everyone's */
        __syncthreads();          /* and no one reads K's, V's tiles or ks any more */
        if (j0 + WK < kend_blk) fetch_kv(j0 + WK);
        if (c.gemm) mma_pb<H, NQ, MW <= 64>(dq, sc, Kt, L.ldkt, nq_n); /* dQ_w += ∂G_w·K */
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        aq0[h] = pn_cu_lanes_sum<4>(aq0[h]), aq1[h] = pn_cu_lanes_sum<4>(aq1[h]), gsum[h] = pn_cu_lanes_sum<4>(gsum[h]);
        b0[h] = pn_cu_lanes_sum<4>(b0[h]), b1[h] = pn_cu_lanes_sum<4>(b1[h]), b2[h] = pn_cu_lanes_sum<4>(b2[h]);
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        if (!live[h]) continue;
        const drow<float, S> &rh = r[h];
        const double tq[2] = {(S::terms & T_Q0) ? aq0[h] : 0.0, (S::terms & T_Q1) ? aq1[h] : 0.0};
        float *dqi = a.dq + rh.x * c.D;
        /* the product's coordinates d < Dg from the accumulators, the rest (terms only) by the row's 4 lanes */
#pragma unroll
        for (int nb = 0; nb < NQ; nb++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int64_t d = nb * 8 + 2 * t + e;
                if (!c.gemm || d >= c.Dg) continue;
                const float gd = dq[nb][2 * h + e] - (c.diff ? (float)gsum[h] * rh.qr[d] : 0.0f);
                dqi[d] += gd + term_col(c, c.qk, tq, rh.qr[d], d);
            }
        for (int64_t d = (c.gemm ? c.Dg : 0) + t; d < c.D; d += 4) dqi[d] += term_col(c, c.qk, tq, rh.qr[d], d);
        if (t == 0 && want && a.dparam) {
            double *dpp = a.dparam + rh.x * PN_NPARAM;
            if (S::pid(0) >= 0) dpp[S::pid(0) >= 0 ? S::pid(0) : 0] += b0[h];
            if (S::pid(1) >= 0) dpp[S::pid(1) >= 0 ? S::pid(1) : 0] += b1[h];
            if (S::pid(2) >= 0) dpp[S::pid(2) >= 0 ? S::pid(2) : 0] += b2[h];
        }
    }
}

/* the backward's key side on tensor cores: a block per (bh, 64 keys); Sᵀ_w = K_w·Qᵀ and dPᵀ_w =
 * V_w·dOᵀ per query tile, the pair's dS and VJP per element (as tbwk_kernel), dV_w += Pᵀ_w·dO, dK_w
 * += ∂Gᵀ_w·Q (a distance score: − (Σ_i ∂G_ij)·k_j at the end, from the f32 k) */
/* FR: dK and dV accumulate in wmma accumulators (Dp, Dvp ≤ WFR_MAX; the layout WL_BWKF), not in
 * shared f32 rows — 33 KB less shared memory at D = 64, so two blocks fit an SM where one did
 * (Nsight Compute on an H100, 2026-11-27: one block per SM, 17 % of issue slots used) */
template <typename H, typename S, bool FR> __global__ void wbwk_kernel(dcall<float> c, dbw<float> a, wlay L) {
    PN_SHARED_DYN(unsigned char, smu);
    PN_SHARED(qstage<float>, qsg, WQ);
    unsigned char *sm = pn_cu_align128(smu);
    H *Ks = (H *)(sm + L.a), *Qs = (H *)(sm + L.b), *Vs = (H *)(sm + L.va), *dOs = (H *)(sm + L.vb),
      *Gt = (H *)(sm + L.p), *Pt = (H *)(sm + L.p2);
    float *Ss = (float *)(sm + L.s), *DPs = (float *)(sm + L.dp), *dK = (float *)(sm + L.acc),
          *dV = (float *)(sm + L.acc2), *kn = (float *)(sm + L.an), *qn = (float *)(sm + L.bn);
    const int64_t nkt = (c.Nk + WK - 1) / WK, bh = blockIdx.x / nkt, j0 = (blockIdx.x - bh * nkt) * WK;
    const int w = threadIdx.x / 32, kk = threadIdx.x / WTPR, t = threadIdx.x % WTPR;
    const int64_t j = j0 + kk, y = bh * c.Nk + j, b = bh / c.H, h = bh - b * c.H;
    const bool live = j < c.Nk;
    float *Sw = Ss + w * 16 * L.lds, *Sr = Ss + kk * L.lds, *DPw = DPs + w * 16 * L.lds, *DPr = DPs + kk * L.lds,
          *dKrow = dK + kk * L.ldo, *dVrow = dV + kk * L.ldo2;
    H *Gw = Gt + w * 16 * L.ldp, *Grow = Gt + kk * L.ldp, *Pw = Pt + w * 16 * L.ldp, *Prow = Pt + kk * L.ldp;
    wtile_load(Ks, L.ldq, c.k + bh * c.Nk * c.D, j0, c.Nk, c.D, c.gemm ? c.Dg : 0, L.Dp);
    wtile_load(Vs, L.ldv, c.v + bh * c.Nk * c.Dv, j0, c.Nk, c.Dv, c.Dv, L.Dvp);
    namespace wm = nvcuda::wmma;
    wm::fragment<wm::accumulator, 16, 16, 16, float> fdk[FR ? WFR_MAX / 16 : 1], fdv[FR ? WFR_MAX / 16 : 1];
    if (FR) {
#pragma unroll
        for (int nb = 0; nb < (FR ? WFR_MAX / 16 : 1); nb++) wm::fill_fragment(fdk[nb], 0.0f), wm::fill_fragment(fdv[nb], 0.0f);
    } else {
        for (int64_t d = t; d < c.Dg; d += WTPR) dKrow[d] = 0;
        for (int64_t d = t; d < c.Dv; d += WTPR) dVrow[d] = 0;
    }
    __syncthreads();
    if (c.diff) wnorms(Ks, L.ldq, c.Dg, kn);
    const int want = wants<S>(&c.hp[h]);
    drow<float, S> r; /* the query row of a pair: the block's head, the staged row values */
    r.hd = S::head(&c.hp[h], 0.0f);
    r.bh = bh, r.b = b, r.h = h;
    const float k0 = live && (S::terms & T_K0) ? c.kt[0][y] : 0.0f, k1 = live && (S::terms & T_K1) ? c.kt[1][y] : 0.0f;
    const auto kx = S::key(&r.hd, k0, k1);
    const float gv = live && c.g ? c.g[y] : 1.0f;
    const int kb = live ? c.kbad[y] : 0;
    const int64_t istart = c.causal ? (j0 - c.off > 0 ? j0 - c.off : 0) : 0;
    double s0 = 0, s1 = 0, sg = 0, gsum = 0;
    for (int64_t i0 = istart / WQ * WQ; i0 < c.Nq; i0 += WQ) {
        __syncthreads();
        wtile_load(Qs, L.ldq, c.q + bh * c.Nq * c.D, i0, c.Nq, c.D, c.gemm ? c.Dg : 0, L.Dp);
        wtile_load(dOs, L.ldv, a.dout + bh * c.Nq * c.Dv, i0, c.Nq, c.Dv, c.Dv, L.Dvp);
        stage_queries<WQ, float, S>(c, a, r.hd, bh, i0, qsg);
        __syncthreads();
        if (c.diff) wnorms(Qs, L.ldq, c.Dg, qn);
        if (c.gemm) w_abt(Ks + w * 16 * L.ldq, L.ldq, Qs, L.ldq, L.Dp, Sw, L.lds); /* Sᵀ_w */
        w_abt(Vs + w * 16 * L.ldv, L.ldv, dOs, L.ldv, L.Dvp, DPw, L.lds);         /* dPᵀ_w */
        __syncthreads();
        /* the tile's sums in f32, added to the key's double sums once a tile (as mbwq_kernel) */
        float fk0 = 0, fk1 = 0, fsg = 0, fg = 0;
        for (int ii = 0; ii < WQ / WTPR; ii++) {
            const int il = t + WTPR * ii;
            const int64_t i = i0 + il;
            float p = 0, g = 0;
            if (live && i < c.Nq && !(c.causal && j > i + c.off)) {
                const qstage<float> &z = qsg[il];
                r.i = i, r.x = bh * c.Nq + i, r.rx = z.rx, r.q0 = z.q0, r.q1 = z.q1, r.qb = z.bad;
                const float G = w_G(c, Sr[il], c.diff ? qn[il] : 0.0f, c.diff ? kn[kk] : 0.0f);
                const float sv = mods(c, r, j, S::pair(&r.hd, z.rx, kx, G, z.q0, z.q1, k0, k1), kb);
                dpv<float> pv;
                norm_ds(c, sv, gv, z.st, z.Di, DPr[il], pv);
                p = pv.p;
                fsg += pv.dgam;
                if (pv.ds != 0) {
                    const auto dd = S::vjp(&r.hd, z.rx, kx, G, z.q0, z.q1, k0, k1, pv.ds, want);
                    fk0 += dd.k0, fk1 += dd.k1;
                    if (c.gemm) g = dd.g;
                }
            }
            fg += g;
            Prow[il] = to16<H>(p);
            Grow[il] = to16<H>(g);
        }
        s0 += fk0, s1 += fk1, sg += fsg, gsum += fg;
        __syncwarp();
        if (FR) {
            w_ab_acc(Pw, L.ldp, dOs, L.ldv, L.Dvp, fdv);
            if (c.gemm) w_ab_acc(Gw, L.ldp, Qs, L.ldq, L.Dp, fdk);
        } else {
            w_ab_into(Pw, L.ldp, dOs, L.ldv, c.Dv, L.Dvp, Sw, L.lds, Sr, dVrow, 1.0f, false, t);
            if (c.gemm) w_ab_into(Gw, L.ldp, Qs, L.ldq, c.Dg, L.Dp, Sw, L.lds, Sr, dKrow, 1.0f, false, t);
        }
    }
    s0 = pn_cu_lanes_sum<WTPR>(s0), s1 = pn_cu_lanes_sum<WTPR>(s1), sg = pn_cu_lanes_sum<WTPR>(sg), gsum = pn_cu_lanes_sum<WTPR>(gsum);
    if (FR) { /* the warp's accumulators into its own f32 tiles (free now), read below as rows */
        __syncwarp();
#pragma unroll
        for (int nb = 0; nb < (FR ? WFR_MAX / 16 : 1); nb++) {
            if (nb * 16 < L.Dvp) wm::store_matrix_sync(Sw + nb * 16, fdv[nb], (unsigned)L.lds, wm::mem_row_major);
            if (c.gemm && nb * 16 < L.Dp) wm::store_matrix_sync(DPw + nb * 16, fdk[nb], (unsigned)L.lds, wm::mem_row_major);
        }
        __syncwarp();
        dVrow = Sr, dKrow = DPr;
    }
    if (!live) return;
    const float *kr = c.k + y * c.D, *vr = c.v + y * c.Dv;
    const double tk[2] = {(S::terms & T_K0) ? s0 : 0.0, (S::terms & T_K1) ? s1 : 0.0};
    float *dkj = a.dk + y * c.D;
    for (int64_t d = t; d < c.D; d += WTPR) {
        const float gd = d < c.Dg ? dKrow[d] - (c.diff ? (float)gsum * kr[d] : 0.0f) : 0.0f;
        dkj[d] += gd + term_col(c, c.kk, tk, kr[d], d);
    }
    double ein = 0, n2 = 0; /* einstein: dv += ∂L/∂γ·κγ³·v, ∂L/∂κ += ∂L/∂γ·½‖v‖²γ³ */
    const double kap = c.hp[h].v[PN_P_curvature];
    if (c.g) {
        const double gj = c.g[y], g3 = gj * gj * gj;
        ein = sg * kap * g3;
        for (int64_t d = 0; d < c.Dv; d++) n2 += (double)vr[d] * vr[d];
        if (t == 0 && a.kcurv) a.kcurv[y] = sg != 0 ? sg * 0.5 * n2 * g3 : 0.0;
    }
    if (a.dv)
        for (int64_t d = t; d < c.Dv; d += WTPR) a.dv[y * c.Dv + d] += dVrow[d] + (sg != 0 ? (float)(ein * vr[d]) : 0.0f);
}

/* The backward's key side on mma.sync (widths ≤ 128): a warp owns 16 keys, whose K and V fragments
 * it keeps; per query tile Sᵀ_w = K_w·Qᵀ and dPᵀ_w = V_w·dOᵀ in registers (B's pairs from Q and dO
 * as rows), the pair's p, dS and VJP on the accumulators (lane: keys g, g + 8; queries by column),
 * then dV_w += Pᵀ_w·dO and dK_w += ∂Gᵀ_w·Q from those accumulators (rounded: the A operand as they
 * stand) with dO and Q staged transposed. The keys' sums (terms, ∂L/∂γ, Σ_i ∂G_ij) over the 4
 * lanes of a key at the end. At width 64, K and V pass through the Q and dO tiles before the walk.
 * At width 128, dK and dV alone take 128 of a lane's registers, so K and V stay in shared memory of
 * their own (mklay's ks, vs) and their fragments are read a 16-wide chunk at a time (mma_abt_s). */
enum { MK_MAX = 128 };

struct mklay {
    int64_t Dp, Dvp, ldq, ldv, ldt; /* padded widths; row strides (halves) of Q / K, dO / V, the transposed */
    int64_t a, va, qt, vt, an, bn, ks, vs, total; /* ks, vs: the block's K and V past width 64 */
    bool wide; /* a padded width over 64: the MK_MAX kernel, with ks and vs */
};

inline mklay mklay_of(int64_t Dg, int64_t Dv) {
    mklay L;
    L.Dp = up(Dg > 0 ? Dg : 1, 16), L.Dvp = up(Dv > 0 ? Dv : 1, 16);
    L.ldq = L.Dp + 8, L.ldv = L.Dvp + 8, L.ldt = WQ + 8;
    L.a = 0;
    L.va = up(L.a + 64 * L.ldq * 2, 128);
    L.qt = up(L.va + 64 * L.ldv * 2, 128);
    L.vt = up(L.qt + L.Dp * L.ldt * 2, 128);
    L.an = up(L.vt + L.Dvp * L.ldt * 2, 128);
    L.bn = up(L.an + 64 * 4, 128);
    L.wide = L.Dp > 64 || L.Dvp > 64;
    L.ks = up(L.bn + 64 * 4, 128);
    L.vs = up(L.ks + (L.wide ? 64 * L.ldq * 2 : 0), 128);
    L.total = up(L.vs + (L.wide ? 64 * L.ldv * 2 : 0), 128);
    return L;
}

template <typename H, typename S, int MW>
__global__ void mbwk_kernel(dcall<float> c, dbw<float> a, mklay L, mpk<H> Qp, mpk<H> Op) {
    enum { KC = MW / 16, NB = MW / 8, NS = WQ / 8, REG = MW <= 64 }; /* REG: K's, V's fragments in registers */
    PN_SHARED_DYN(unsigned char, smu);
    PN_SHARED(qstage<float>, qsg, WQ);
    unsigned char *sm = pn_cu_align128(smu);
    H *Qs = (H *)(sm + L.a), *dOs = (H *)(sm + L.va), *Qt = (H *)(sm + L.qt), *dOt = (H *)(sm + L.vt);
    H *Ks = REG ? Qs : (H *)(sm + L.ks), *Vs = REG ? dOs : (H *)(sm + L.vs);
    float *kn = (float *)(sm + L.an), *qn = (float *)(sm + L.bn);
    const int64_t nkt = (c.Nk + WK - 1) / WK, bh = blockIdx.x / nkt, j0 = (blockIdx.x - bh * nkt) * WK;
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int64_t b = bh / c.H, hh = bh - b * c.H;
    const int kc_n = (int)(L.Dp / 16), kv_n = (int)(L.Dvp / 16), nk_n = (int)(L.Dp / 8), nv_n = (int)(L.Dvp / 8);
    /* the block's keys and values (at width 64 through the Q and dO tiles): the warps' fragments,
     * the key norms */
    wtile_load(Ks, L.ldq, c.k + bh * c.Nk * c.D, j0, c.Nk, c.D, c.gemm ? c.Dg : 0, L.Dp);
    wtile_load(Vs, L.ldv, c.v + bh * c.Nk * c.Dv, j0, c.Nk, c.Dv, c.Dv, L.Dvp);
    __syncthreads();
    if (c.diff) wnorms(Ks, L.ldq, c.Dg, kn);
    uint32_t ka[REG ? KC : 1][4], va[REG ? KC : 1][4];
    if constexpr (REG) {
        frags_a<H, KC>(ka, Ks, L.ldq, kc_n);
        frags_a<H, KC>(va, Vs, L.ldv, kv_n);
    }
    const int want = wants<S>(&c.hp[hh]);
    drow<float, S> r; /* the query row of a pair: the block's head, the staged row values */
    r.hd = S::head(&c.hp[hh], 0.0f);
    r.bh = bh, r.b = b, r.h = hh;
    /* the lane's two keys: local jl[h] = 16w + g + 8h */
    int jl[2], kb[2];
    int64_t jj[2], y[2];
    bool live[2];
    float k0[2], k1[2], gv[2];
    typename prec<float>::x4 kx[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        jl[h] = w * 16 + g + 8 * h;
        jj[h] = j0 + jl[h];
        live[h] = jj[h] < c.Nk;
        y[h] = bh * c.Nk + jj[h];
        k0[h] = live[h] && (S::terms & T_K0) ? c.kt[0][y[h]] : 0.0f;
        k1[h] = live[h] && (S::terms & T_K1) ? c.kt[1][y[h]] : 0.0f;
        kx[h] = S::key(&r.hd, k0[h], k1[h]);
        gv[h] = live[h] && c.g ? c.g[y[h]] : 1.0f;
        kb[h] = live[h] ? c.kbad[y[h]] : 0;
    }
    float dk[NB][4], dv[NB][4];
#pragma unroll
    for (int nb = 0; nb < NB; nb++) {
        dk[nb][0] = dk[nb][1] = dk[nb][2] = dk[nb][3] = 0;
        dv[nb][0] = dv[nb][1] = dv[nb][2] = dv[nb][3] = 0;
    }
    const int64_t istart = c.causal ? (j0 - c.off > 0 ? j0 - c.off : 0) : 0;
    double s0[2] = {0, 0}, s1[2] = {0, 0}, sg[2] = {0, 0}, gsum[2] = {0, 0};
    /* whole query tiles (as mfwd_kernel's key tiles): in range, no modifier, no NaN flag on the
     * lane's keys (nor, per tile, on the queries), every query past the causal limit of both keys */
    const bool keys_clean = !(c.bias || c.alibi || c.mask || kb[0] || kb[1] || !live[0] || !live[1]);
    const bool plain = MW <= 64 && c.norm == PN_NORM_SOFTMAX && !c.g; /* as mbwq_kernel's */
    /* loads overlapping the products, as in mfwd_kernel: Qᵀ's and dOᵀ's tiles are copied while Sᵀ,
     * dPᵀ and the VJP run, the next Q and dO tiles and staged queries while dV and dK accumulate */
    auto fetch_qd = [&](int64_t i0) {
        ptile_rows<MW>(Qs, L.ldq, Qp, bh, i0);
        ptile_rows<MW>(dOs, L.ldv, Op, bh, i0);
        if (c.diff) ptile_norms(qn, Qp, bh, i0);
        query_fetch<S>(c, a, bh, i0, qsg);
        pn_cu_cp_async_commit();
    };
    __syncthreads(); /* the fragments and the key norms are read: Q's and dO's tiles may come */
    if (istart / WQ * WQ < c.Nq) fetch_qd(istart / WQ * WQ);
    for (int64_t i0 = istart / WQ * WQ; i0 < c.Nq; i0 += WQ) {
        pn_cu_cp_async_wait<0>(); /* Q's and dO's tiles and the staged query, then everyone's after the
                                   * barrier, past which no one reads the previous Qᵀ and dOᵀ */
        const int tbad = __syncthreads_or(query_finish<S>(r.hd, qsg));
        ptile_cols<MW>(Qt, L.ldt, Qp, bh, i0);
        ptile_cols<MW>(dOt, L.ldt, Op, bh, i0);
        pn_cu_cp_async_commit();
        float sc[NS][4], dp[NS][4];
        if constexpr (REG) {
            mma_abt<H, KC, MW <= 64>(sc, ka, Qs, L.ldq, c.gemm ? kc_n : 0); /* Sᵀ_w */
            mma_abt<H, KC, MW <= 64>(dp, va, dOs, L.ldv, kv_n);             /* dPᵀ_w */
        } else {
            mma_abt_s<H, KC, false>(sc, Ks, L.ldq, Qs, L.ldq, c.gemm ? kc_n : 0);
            mma_abt_s<H, KC, false>(dp, Vs, L.ldv, dOs, L.ldv, kv_n);
        }
        /* one copy for whole tiles, one for the rest; norms for distance scores only (as mfwd_kernel) */
        auto vjp_tile = [&](auto whole_c, auto plain_c) {
            constexpr bool whole = decltype(whole_c)::value, plain = decltype(plain_c)::value, diff = S::diff;
            const float kh[2] = {diff ? kn[jl[0]] : 0.0f, diff ? kn[jl[1]] : 0.0f};
            /* the tile's sums in f32, added to the keys' double sums once a tile (as mbwq_kernel) */
            float fk0[2] = {0, 0}, fk1[2] = {0, 0}, fsg[2] = {0, 0}, fg[2] = {0, 0};
#pragma unroll
            for (int nb = 0; nb < NS; nb++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int h = e >> 1, il = nb * 8 + 2 * t + (e & 1);
                    const int64_t i = i0 + il;
                    float p = 0, gg = 0;
                    if (whole || (live[h] && i < c.Nq && !(c.causal && jj[h] > i + c.off))) {
                        const qstage<float> &z = qsg[il];
                        const float G = diff ? sc[nb][e] - 0.5f * (qn[il] + kh[h]) : sc[nb][e]; /* w_G */
                        const float s0v = S::pair(&r.hd, z.rx, kx[h], G, z.q0, z.q1, k0[h], k1[h]);
                        float sv = s0v;
                        if (!whole) {
                            r.i = i, r.x = bh * c.Nq + i, r.rx = z.rx, r.q0 = z.q0, r.q1 = z.q1, r.qb = z.bad;
                            sv = mods(c, r, jj[h], s0v, kb[h]);
                        }
                        dpv<float> pv;
                        norm_ds<float, true, plain>(c, sv, gv[h], z.st, z.Di, dp[nb][e], pv);
                        p = pv.p;
                        if (c.g) fsg[h] += pv.dgam; /* 0 without γ */
                        if (pv.ds != 0) {
                            const auto dd = S::vjp(&r.hd, z.rx, kx[h], G, z.q0, z.q1, k0[h], k1[h], pv.ds, want);
                            if (S::terms & T_K0) fk0[h] += dd.k0; /* only the terms the score has */
                            if (S::terms & T_K1) fk1[h] += dd.k1;
                            if (c.gemm) gg = dd.g;
                        }
                    }
                    if (diff) fg[h] += gg; /* read by distance scores only */
                    dp[nb][e] = p;  /* Pᵀ */
                    sc[nb][e] = gg; /* ∂Gᵀ */
                }
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if (S::terms & T_K0) s0[h] += fk0[h];
                if (S::terms & T_K1) s1[h] += fk1[h];
                if (c.g) sg[h] += fsg[h];
                if (diff) gsum[h] += fg[h];
            }
        };
        /* whole tiles of a softmax without γ in a copy of their own, as mbwq_kernel's */
        if (keys_clean && !tbad && i0 + WQ <= c.Nq && (!c.causal || jj[1] <= i0 + c.off)) {
            if (plain) vjp_tile(std::true_type{}, std::true_type{});
            else vjp_tile(std::true_type{}, std::false_type{});
        } else {
            vjp_tile(std::false_type{}, std::false_type{});
        }
        pn_cu_cp_async_wait<0>(); /* Qᵀ's and dOᵀ's tiles: this thread's copies, then everyone's */
        __syncthreads();          /* and no one reads Q's, dO's tiles or the staged queries any more */
        if (i0 + WQ < c.Nq) fetch_qd(i0 + WQ);
        mma_pb<H, NB, MW <= 64>(dv, dp, dOt, L.ldt, nv_n);             /* dV_w += Pᵀ_w·dO */
        if (c.gemm) mma_pb<H, NB, MW <= 64>(dk, sc, Qt, L.ldt, nk_n); /* dK_w += ∂Gᵀ_w·Q */
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        s0[h] = pn_cu_lanes_sum<4>(s0[h]), s1[h] = pn_cu_lanes_sum<4>(s1[h]);
        sg[h] = pn_cu_lanes_sum<4>(sg[h]), gsum[h] = pn_cu_lanes_sum<4>(gsum[h]);
    }
    const double kap = c.hp[hh].v[PN_P_curvature];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        if (!live[h]) continue;
        const float *kr = c.k + y[h] * c.D, *vr = c.v + y[h] * c.Dv;
        const double tk[2] = {(S::terms & T_K0) ? s0[h] : 0.0, (S::terms & T_K1) ? s1[h] : 0.0};
        float *dkj = a.dk + y[h] * c.D;
#pragma unroll
        for (int nb = 0; nb < NB; nb++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int64_t d = nb * 8 + 2 * t + e;
                if (!c.gemm || d >= c.Dg) continue;
                const float gd = dk[nb][2 * h + e] - (c.diff ? (float)gsum[h] * kr[d] : 0.0f);
                dkj[d] += gd + term_col(c, c.kk, tk, kr[d], d);
            }
        for (int64_t d = (c.gemm ? c.Dg : 0) + t; d < c.D; d += 4) dkj[d] += term_col(c, c.kk, tk, kr[d], d);
        double ein = 0; /* einstein: dv += ∂L/∂γ·κγ³·v, ∂L/∂κ += ∂L/∂γ·½‖v‖²γ³ */
        if (c.g) {
            const double gj = c.g[y[h]], g3 = gj * gj * gj;
            ein = sg[h] * kap * g3;
            if (t == 0 && a.kcurv) {
                double n2 = 0;
                for (int64_t d = 0; d < c.Dv; d++) n2 += (double)vr[d] * vr[d];
                a.kcurv[y[h]] = sg[h] != 0 ? sg[h] * 0.5 * n2 * g3 : 0.0;
            }
        }
        if (a.dv)
#pragma unroll
            for (int nb = 0; nb < NB; nb++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int64_t d = nb * 8 + 2 * t + e;
                    if (d < c.Dv)
                        a.dv[y[h] * c.Dv + d] += dv[nb][2 * h + e] + (sg[h] != 0 ? (float)(ein * vr[d]) : 0.0f);
                }
    }
}

/* ---- preparation: terms, flags, Lorentz factors, the checks ------------------------------------ */
/* slots (unsigned long long, all ones = none): the first non-finite q / k row, q's term m = 0, 1
 * and k's breaking the manifold, the first v row outside the Klein ball — flat bh·N + r, the
 * order of the CPU's scans */
enum { SL_QNF, SL_KNF, SL_QT0, SL_QT1, SL_KT0, SL_KT1, SL_LOR, SL_N };

/* the rows of one side (0: q, 1: k with v): terms, NaN flags, manifold flags, Lorentz factors */
template <typename T> __global__ void prep_kernel(dcall<T> c, int side, unsigned req, unsigned long long *slot) {
    const int64_t N = side ? c.Nk : c.Nq;
    PN_CU_LOOP(x, c.BH * N) {
        const int64_t h = (x / N) % c.H;
        const T *xr = (side ? c.k : c.q) + x * c.D;
        const double kap = c.hp[h].v[PN_P_curvature];
        const int *kinds = side ? c.kk : c.qk;
        T *const *t = side ? c.kt : c.qt;
        for (int m = 0; m < 2; m++) {
            if (!t[m]) continue;
            T v = 0;
            if (kinds[m] == PN_TERM_NORM2)
                for (int64_t d = 0; d < c.Dg; d++) v += xr[d] * xr[d];
            else if (kinds[m] == PN_TERM_LAST)
                v = xr[c.D - 1];
            t[m][x] = v;
            if (term_bad(kinds[m], req, kap, v)) atomicMin(&slot[SL_QT0 + 2 * side + m], (unsigned long long)x);
        }
        const int nf = nonfinite(xr, c.D);
        (side ? c.kbad : c.qbad)[x] = nf;
        if (nf) atomicMin(&slot[SL_QNF + side], (unsigned long long)x);
        if (side && c.g && !lorentz(c.v + x * c.Dv, c.Dv, kap, &c.g[x]))
            atomicMin(&slot[SL_LOR], (unsigned long long)x);
    }
}

/* ---- host side ------------------------------------------------------------------------------------ */
struct dstate : pn_cu_scratch {
    pn_attn_setup st;
    int kind, nd;
};

void dstate_free(dstate *g) {
    pn_attn_setup_free(&g->st);
    pn_cu_scratch_free(g);
}

/* canonical (b, h, i, j) strides of t broadcast to the weights (…, Nq, Nk) of q (dense.c's
 * bcast4; the front end checked that it broadcasts) */
void bcast4(const pn_tensor *t, const pn_tensor *q, int64_t Nq, int64_t Nk, int64_t s4[4]) {
    const int nd = q->nd;
    int64_t W[4], st[PN_MAX_DIMS];
    for (int i = 0; i < nd - 2; i++) W[i] = q->sizes[i];
    W[nd - 2] = Nq, W[nd - 1] = Nk;
    pn_broadcast_strides(t, nd, W, st);
    if (nd == 4) memcpy(s4, st, sizeof(int64_t) * 4);
    else if (nd == 3) s4[0] = st[0], s4[1] = 0, s4[2] = st[1], s4[3] = st[2];
    else s4[0] = 0, s4[1] = 0, s4[2] = st[0], s4[3] = st[1];
}

/* "[b,h,i]" (from 1) of flat row bh·N + r, as dense.c's messages */
const char *row_str(int nd, int64_t H, int64_t flat, int64_t N) {
    static thread_local char buf[96];
    const int64_t bh = flat / N, r = flat % N + 1, b = bh / H + 1, h = bh % H + 1;
    if (nd == 4) snprintf(buf, sizeof buf, "[%lld,%lld,%lld]", (long long)b, (long long)h, (long long)r);
    else if (nd == 3) snprintf(buf, sizeof buf, "[%lld,%lld]", (long long)b, (long long)r);
    else snprintf(buf, sizeof buf, "[%lld]", (long long)r);
    return buf;
}

/* dense.c's dense_call_init (run = 1) + pn_attn_prepare, on the device: the setup, masks, bias,
 * ALiBi, contiguous inputs, terms, NaN flags, Lorentz factors and the checks with the CPU's
 * messages. v NULL: the weights. */
template <typename T>
pn_status dsetup(const char *op, dstate *g, dcall<T> *c, const pn_tensor *q, const pn_tensor *k, const pn_tensor *v,
                 const pn_attn_opts *o) {
    memset(g, 0, sizeof *g);
    memset(c, 0, sizeof *c);
    g->op = op;
    const int nd = q->nd;
    g->nd = nd;
    static_cast<pn_attn_dims &>(*c) = pn_attn_dense_dims(q, k, v, o);
    const int64_t H = c->H, BH = c->BH, Nq = c->Nq, Nk = c->Nk, D = c->D;
    PN_TRY(pn_attn_setup_init(op, o, q->dt, H, D, 0, &g->st));
    if (!v) g->st.einstein = 0; /* the weights α do not involve the aggregation */
    const pn_score_plan *pl = &g->st.plan;
    g->kind = score_kind(&g->st, o);
    if (g->kind == K_NONE)
        return pn_error(PN_ERR_ARG, "%s: score '%s'%s has no CUDA epilogue (core/cuda/attention/scores.cuh)", op,
                        g->st.desc->name, pl->note);
    if (o->mask) {
        bcast4(o->mask, q, Nq, Nk, c->ms);
        c->mask = (const uint8_t *)pn_ptr(o->mask);
    }
    if (o->bias) {
        bcast4(o->bias, q, Nq, Nk, c->bs);
        c->bias = (const T *)pn_ptr(o->bias);
    }
    if (o->alibi) {
        if (!o->causal) return pn_error(PN_ERR_ARG, "%s: alibi needs causal = true (q %s)", op, pn_shape_str(q));
        pn_tensor *al = pn_cu_scratch_new(g, H, PN_F64, false);
        if (!al) return PN_ERR_OOM;
        double *sl = (double *)malloc(sizeof(double) * (size_t)H);
        if (!sl) return pn_error(PN_ERR_OOM, "%s: out of memory", op);
        for (int64_t h = 0; h < H; h++) sl[h] = pow(2.0, -8.0 * (double)(h + 1) / (double)H);
        pn_status s = pn_cuda_upload(pn_ptr(al), sl, sizeof(double) * (size_t)H);
        free(sl);
        if (s) return s;
        c->alibi = (const double *)pn_ptr(al);
    }
    /* inputs: contiguous (BH, N, ·) */
    pn_tensor *qc = pn_cu_keep(g, pn_contig((pn_tensor *)q)), *kc = pn_cu_keep(g, pn_contig((pn_tensor *)k)), *vc = NULL;
    if (!qc || !kc || (v && !(vc = pn_cu_keep(g, pn_contig((pn_tensor *)v))))) return PN_ERR_OOM;
    PN_TRY(resolve_params(op, o, D, &g->st));
    c->Dg = pl->gemm == PN_GEMM_HEAD ? D - 1 : D;
    pn_tensor *hp = pn_cu_scratch_new(g, (int64_t)(H * sizeof(pn_score_params)), PN_U8, false);
    if (!hp) return PN_ERR_OOM;
    PN_TRY(pn_cuda_upload(pn_ptr(hp), g->st.hp, (size_t)H * sizeof(pn_score_params)));
    c->q = (const T *)pn_ptr(qc), c->k = (const T *)pn_ptr(kc), c->v = vc ? (const T *)pn_ptr(vc) : NULL;
    c->hp = (const pn_score_params *)pn_ptr(hp);
    const int dt = q->dt;
    PN_TRY(call_rows(g, &g->st, dt, BH * Nq, BH * Nk, c));
    pn_tensor *slots = pn_cu_scratch_new(g, SL_N, PN_I64, false);
    if (!slots) return PN_ERR_OOM;

    /* terms, flags, Lorentz factors; then the checks in pn_attn_prepare's order */
    unsigned long long *sl = (unsigned long long *)pn_ptr(slots);
    PN_TRY(pn_cu_check(op, cudaMemsetAsync(sl, 0xff, SL_N * sizeof(unsigned long long), pn_cu_stream())));
    auto kp = prep_kernel<T>;
    if (BH * Nq > 0) PN_TRY(pn_cu_check(op, PN_LAUNCH(kp, pn_cu_blocks(BH * Nq, DT), DT, 0, pn_cu_stream(), *c, 0, pl->req, sl)));
    if (BH * Nk > 0) PN_TRY(pn_cu_check(op, PN_LAUNCH(kp, pn_cu_blocks(BH * Nk, DT), DT, 0, pn_cu_stream(), *c, 1, pl->req, sl)));
    int64_t bad[SL_N];
    PN_TRY(pn_cuda_download(bad, sl, sizeof bad));
    char qs[128], ks[128], vs[128];
    snprintf(qs, sizeof qs, "%s", pn_shape_str(q));
    snprintf(ks, sizeof ks, "%s", pn_shape_str(k));
    snprintf(vs, sizeof vs, "%s", v ? pn_shape_str(v) : "");
    for (int side = 0; side < 2 && pl->req; side++)
        if (bad[SL_QNF + side] != -1)
            return pn_error(PN_ERR_ARG, "%s: %s %s is not on the manifold of score '%s': a coordinate is NaN or "
                            "infinite at %s", op, side ? "k" : "q", side ? ks : qs, g->st.desc->name,
                            row_str(nd, H, bad[SL_QNF + side], side ? Nk : Nq));
    for (int side = 0; side < 2; side++) {
        const int *kinds = side ? pl->kterm : pl->qterm;
        const int64_t N = side ? Nk : Nq;
        for (int m = 0; m < 2; m++) {
            const int64_t x = bad[SL_QT0 + 2 * side + m];
            if (x == -1) continue;
            T tv;
            PN_TRY(pn_cuda_download(&tv, (side ? c->kt : c->qt)[m] + x, sizeof tv));
            const double val = tv, kap = g->st.hp[(x / N) % H].v[PN_P_curvature];
            if (kinds[m] == PN_TERM_LAST)
                return pn_error(PN_ERR_ARG, "%s: %s %s is not on the manifold of score '%s'%s: the last coordinate "
                                "(height / time) must be > 0 and finite, got %g at %s", op, side ? "k" : "q",
                                side ? ks : qs, g->st.desc->name, pl->note, val, row_str(nd, H, x, N));
            return pn_error(PN_ERR_ARG, "%s: %s %s has a point outside the Poincaré ball of score '%s': "
                            "curvature·‖x‖² = %g must be < 1, at %s", op, side ? "k" : "q", side ? ks : qs,
                            g->st.desc->name, kap * val, row_str(nd, H, x, N));
        }
    }
    if (bad[SL_LOR] != -1) {
        const int64_t x = bad[SL_LOR], Dv = c->Dv;
        double n2 = 0;
        PN_TRY(row_norm2(op, c->v + x * Dv, Dv, &n2));
        return pn_error(PN_ERR_ARG, "%s: v %s has a point outside the Klein ball of the einstein aggregation: "
                        "curvature·‖v‖² = %g must be < 1, at %s", op, vs,
                        g->st.hp[(x / Nk) % H].v[PN_P_curvature] * n2, row_str(nd, H, x, Nk));
    }
    return PN_OK;
}

/* Launch tiled kernel kf over nblk blocks of `threads` with `bytes` of dynamic shared memory
 * (asking for more than the default 48 KiB when it needs it); false when that does not fit the
 * device's shared memory (with the kernels' static arrays) or the grid — the caller runs the
 * row kernels. */
template <typename K, typename... A>
bool tiled_launch(const char *op, pn_status *s, K kf, int64_t nblk, int threads, size_t bytes, A... args) {
    const size_t stat_bytes = 2 * WK * sizeof(kstage<double>);
    if (nblk < 1 || nblk > INT32_MAX || bytes + stat_bytes > pn_cu_smem_optin()) return false;
    if (bytes > 48 * 1024 &&
        (*s = pn_cu_check(op, cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes))))
        return true;
    *s = pn_cu_check(op, PN_LAUNCH(kf, (unsigned)nblk, threads, bytes, pn_cu_stream(), args...));
    return true;
}

/* The mma.sync kernels run unless PENUMBRA_CUDA_MMA=0 (the wmma ones then, for comparison) or a
 * padded width (Dp, Dvp) is over the kernel's widest (max) */
inline bool mma_wanted(int64_t Dp, int64_t Dvp, int64_t max) {
    const char *e = getenv("PENUMBRA_CUDA_MMA");
    return !(e && strcmp(e, "0") == 0) && Dp <= max && Dvp <= max;
}

/* and only when the call's plan is what the kernels were compiled for: S::diff (scores.cuh's list)
 * — a distance score with its GEMM, or a product score (the wmma kernels test c.diff at run time) */
template <typename S> bool mma_plan(const dcall<float> &c, S) {
    return S::diff ? c.diff && c.gemm : !c.diff;
}

/* P: src (BH blocks of n rows of D floats) packed for the mma kernels over w coordinates padded to
 * wp (mpk: rows always, cols and nrm when asked) in scratch of g */
template <typename H>
pn_status mpack(const char *op, pn_cu_scratch *g, mpk<H> *P, const float *src, int64_t BH, int64_t n, int64_t D,
                int64_t w, int64_t wp, bool cols, bool nrm) {
    memset(P, 0, sizeof *P);
    P->np = up(n > 0 ? n : 1, 64), P->wp = wp;
    int64_t halves;
    if (__builtin_mul_overflow(BH, P->np, &halves) || __builtin_mul_overflow(halves, wp, &halves))
        return pn_error(PN_ERR_ARG, "%s: %lld × %lld × %lld packed tile elements overflow int64", op, (long long)BH,
                        (long long)P->np, (long long)wp);
    /* the copies are the tensor-core path's only memory beyond the inputs' (linear in n, no n²);
     * when they do not fit, the callers fall back to the wmma kernels (mpack_oom) */
    auto oom = [&]() {
        return pn_error(PN_ERR_OOM, "%s: out of device memory for a 16-bit copy of an operand (%lld × %lld rows of %lld) "
                        "for the tensor cores (precision bf16 / f16)", op, (long long)BH, (long long)P->np, (long long)wp);
    };
    pn_tensor *t;
    if (!(t = pn_cu_scratch_new(g, halves / 2, PN_F32, false))) return oom(); /* wp even: whole floats */
    H *rows = (H *)pn_ptr(t);
    P->rows = rows;
    PN_TRY(pn_cu_check(op, PN_LAUNCH(pack_kernel<H>, pn_cu_blocks(halves), PN_CU_THREADS, 0, pn_cu_stream(), rows, src,
                                     BH, n, P->np, D, w, wp, 0)));
    if (cols) {
        if (!(t = pn_cu_scratch_new(g, halves / 2, PN_F32, false))) return oom();
        P->cols = (H *)pn_ptr(t);
        PN_TRY(pn_cu_check(op, PN_LAUNCH(pack_kernel<H>, pn_cu_blocks(halves), PN_CU_THREADS, 0, pn_cu_stream(),
                                         (H *)pn_ptr(t), src, BH, n, P->np, D, w, wp, 1)));
    }
    if (nrm) {
        if (!(t = pn_cu_scratch_new(g, BH * P->np, PN_F32, false))) return oom();
        P->nrm = (const float *)pn_ptr(t);
        PN_TRY(pn_cu_check(op, PN_LAUNCH(pack_norms_kernel<H>, pn_cu_blocks(BH * P->np), PN_CU_THREADS, 0,
                                         pn_cu_stream(), (float *)pn_ptr(t), (const H *)rows, BH * P->np, wp)));
    }
    return PN_OK;
}

/* After a failed mpack: when it ran out of device memory, the copies' scratch (taken since nt0)
 * goes back and the status is cleared — true, and the caller returns false ("not launched"),
 * so the wmma kernels, which read the f32 operands and need no copies, run instead. */
inline bool mpack_oom(pn_status *s, pn_cu_scratch *g, int nt0) {
    if (*s != PN_ERR_OOM) return false;
    while (g->nt > nt0) pn_release(g->t[--g->nt]);
    *s = PN_OK;
    return true;
}

/* the forward on tensor cores (precision bf16 / f16, f32 tensors); false: not launched */
template <typename H, typename S>
bool mma_forward(const char *op, pn_status *s, pn_cu_scratch *g, const dcall<float> &c, float *out, float *stat) {
    const mlay L = mlay_of(c.gemm ? c.Dg : 0, c.Dv);
    if (!mma_wanted(L.Dp, L.Dvp, MF_MAX) || !mma_plan(c, S{})) return false;
    const int64_t nblk = c.BH * ((c.Nq + WQ - 1) / WQ);
    const size_t bytes = (size_t)L.total + 128;
    mpk<H> Kp, Vp;
    const int nt0 = g->nt;
    if ((*s = mpack<H>(op, g, &Kp, c.k, c.BH, c.Nk, c.D, c.gemm ? c.Dg : 0, L.Dp, false, c.diff)) ||
        (*s = mpack<H>(op, g, &Vp, c.v, c.BH, c.Nk, c.Dv, c.Dv, L.Dvp, true, false)))
        return !mpack_oom(s, g, nt0);
    if (L.Dp <= 64 && L.Dvp <= 64)
        return tiled_launch(op, s, mfwd_kernel<H, S, 64>, nblk, WT, bytes, c, L, Kp, Vp, out, stat);
    return tiled_launch(op, s, mfwd_kernel<H, S, MF_MAX>, nblk, WT, bytes, c, L, Kp, Vp, out, stat);
}

template <typename S> bool wmma_forward(const char *op, pn_status *s, pn_cu_scratch *g, int prec, const dcall<float> &c,
                                        float *out, float *stat) {
    if (prec == PN_PREC_BF16 ? mma_forward<__nv_bfloat16, S>(op, s, g, c, out, stat)
                             : mma_forward<__half, S>(op, s, g, c, out, stat))
        return true;
    const wlay L = wlay_of(c.gemm ? c.Dg : 0, c.Dv, WL_FWD);
    const int64_t nblk = c.BH * ((c.Nq + WQ - 1) / WQ);
    const size_t bytes = (size_t)L.total + 128;
    if (prec == PN_PREC_BF16) {
        auto kf = wfwd_kernel<__nv_bfloat16, S>;
        return tiled_launch(op, s, kf, nblk, WT, bytes, c, L, out, stat);
    }
    auto kf = wfwd_kernel<__half, S>;
    return tiled_launch(op, s, kf, nblk, WT, bytes, c, L, out, stat);
}
template <typename S>
bool wmma_forward(const char *, pn_status *, pn_cu_scratch *, int, const dcall<double> &, double *, double *) {
    return false; /* f64 tensors never ask (the front end refuses precision on them) */
}

/* the backward kernel of a side (key side: fr picks dK, dV in accumulators) in 16-bit type H */
template <typename H, typename S>
bool wmma_bw_launch(const char *op, pn_status *s, int side, bool fr, int64_t nblk, size_t bytes, const dcall<float> &c,
                    const dbw<float> &a, const wlay &L) {
    if (!side) {
        auto kq = wbwq_kernel<H, S>;
        return tiled_launch(op, s, kq, nblk, WT, bytes, c, a, L);
    }
    if (fr) {
        auto kf = wbwk_kernel<H, S, true>;
        return tiled_launch(op, s, kf, nblk, WT, bytes, c, a, L);
    }
    auto kk = wbwk_kernel<H, S, false>;
    return tiled_launch(op, s, kk, nblk, WT, bytes, c, a, L);
}

/* one side of the backward on tensor cores (0: the query side, 1: the key side); false: not
 * launched */
template <typename H, typename S>
bool mma_backward_q(const char *op, pn_status *s, pn_cu_scratch *g, const dcall<float> &c, const dbw<float> &a) {
    const mblay L = mblay_of(c.gemm ? c.Dg : 0, c.Dv);
    if (!mma_wanted(L.Dp, L.Dvp, MF_MAX) || !mma_plan(c, S{})) return false;
    const int64_t nblk = c.BH * ((c.Nq + WQ - 1) / WQ);
    const size_t bytes = (size_t)L.total + 128;
    mpk<H> Kp, Vp;
    const int nt0 = g->nt;
    if ((*s = mpack<H>(op, g, &Kp, c.k, c.BH, c.Nk, c.D, c.gemm ? c.Dg : 0, L.Dp, true, c.diff)) ||
        (*s = mpack<H>(op, g, &Vp, c.v, c.BH, c.Nk, c.Dv, c.Dv, L.Dvp, false, false)))
        return !mpack_oom(s, g, nt0);
    if (L.Dp <= 64 && L.Dvp <= 64) return tiled_launch(op, s, mbwq_kernel<H, S, 64>, nblk, WT, bytes, c, a, L, Kp, Vp);
    return tiled_launch(op, s, mbwq_kernel<H, S, MF_MAX>, nblk, WT, bytes, c, a, L, Kp, Vp);
}

template <typename H, typename S>
bool mma_backward_k(const char *op, pn_status *s, pn_cu_scratch *g, const dcall<float> &c, const dbw<float> &a) {
    const mklay L = mklay_of(c.gemm ? c.Dg : 0, c.Dv);
    if (!mma_wanted(L.Dp, L.Dvp, MK_MAX) || !mma_plan(c, S{})) return false;
    const int64_t nblk = c.BH * ((c.Nk + WK - 1) / WK);
    mpk<H> Qp, Op;
    const int nt0 = g->nt;
    if ((*s = mpack<H>(op, g, &Qp, c.q, c.BH, c.Nq, c.D, c.gemm ? c.Dg : 0, L.Dp, true, c.diff)) ||
        (*s = mpack<H>(op, g, &Op, a.dout, c.BH, c.Nq, c.Dv, c.Dv, L.Dvp, true, false)))
        return !mpack_oom(s, g, nt0);
    const size_t bytes = (size_t)L.total + 128;
    if (!L.wide) return tiled_launch(op, s, mbwk_kernel<H, S, 64>, nblk, WT, bytes, c, a, L, Qp, Op);
    return tiled_launch(op, s, mbwk_kernel<H, S, MK_MAX>, nblk, WT, bytes, c, a, L, Qp, Op);
}

template <typename S> bool wmma_backward(const char *op, pn_status *s, pn_cu_scratch *g, int prec, int side,
                                         const dcall<float> &c, const dbw<float> &a) {
    const bool bf = prec == PN_PREC_BF16;
    if (!side && (bf ? mma_backward_q<__nv_bfloat16, S>(op, s, g, c, a) : mma_backward_q<__half, S>(op, s, g, c, a)))
        return true;
    if (side && (bf ? mma_backward_k<__nv_bfloat16, S>(op, s, g, c, a) : mma_backward_k<__half, S>(op, s, g, c, a)))
        return true;
    /* the key side keeps dK, dV in wmma accumulators when they are narrow enough (WL_BWKF) */
    const bool fr = side && c.gemm && up(c.Dg, 16) <= WFR_MAX && up(c.Dv > 0 ? c.Dv : 1, 16) <= WFR_MAX;
    const wlay L = wlay_of(c.gemm ? c.Dg : 0, c.Dv, side ? (fr ? WL_BWKF : WL_BWK) : WL_BWQ);
    const int64_t nblk = side ? c.BH * ((c.Nk + WK - 1) / WK) : c.BH * ((c.Nq + WQ - 1) / WQ);
    const size_t bytes = (size_t)L.total + 128;
    return prec == PN_PREC_BF16 ? wmma_bw_launch<__nv_bfloat16, S>(op, s, side, fr, nblk, bytes, c, a, L)
                                : wmma_bw_launch<__half, S>(op, s, side, fr, nblk, bytes, c, a, L);
}
template <typename S>
bool wmma_backward(const char *, pn_status *, pn_cu_scratch *, int, int, const dcall<double> &, const dbw<double> &) {
    return false;
}

template <typename T>
pn_status dforward(const char *op, const pn_tensor *q, const pn_tensor *k, const pn_tensor *v, const pn_attn_opts *o,
                   pn_tensor *out, pn_tensor *w, pn_tensor *stat) {
    if ((out && !pn_is_contiguous(out)) || (w && !pn_is_contiguous(w)) || !pn_is_contiguous(stat))
        return pn_error(PN_ERR_ARG, "%s: the outputs handed to the CUDA kernel must be contiguous", op);
    dstate g;
    dcall<T> c;
    pn_status s = dsetup<T>(op, &g, &c, q, k, v, o);
    if (!s && c.BH * c.Nq > 0) {
        score_switch(g.kind, [&](auto tag) {
            typedef decltype(tag) S;
            auto kt = tfwd_kernel<T, S>;
            const tlay L = tlay_of(c.D, c.Dv, TL_FWD);
            if (out && o->precision != PN_PREC_NATIVE &&
                wmma_forward<S>(op, &s, &g, o->precision, c, (T *)pn_ptr(out), (T *)pn_ptr(stat))) {
            } else if (out && tiled_launch(op, &s, kt, c.BH * ((c.Nq + TQ - 1) / TQ), TT, (size_t)L.total * sizeof(T), c,
                                           L, (T *)pn_ptr(out), (T *)pn_ptr(stat))) {
            } else if (out) {
                auto kf = fwd_kernel<T, S>;
                s = pn_cu_check(op, PN_LAUNCH(kf, pn_cu_blocks(c.BH * c.Nq, DT), DT, 0, pn_cu_stream(), c, (T *)pn_ptr(out),
                                         (T *)pn_ptr(stat)));
            } else {
                auto kw = weights_kernel<T, S>;
                s = pn_cu_check(op, PN_LAUNCH(kw, pn_cu_blocks(c.BH * c.Nq, DT), DT, 0, pn_cu_stream(), c, (T *)pn_ptr(w),
                                         (T *)pn_ptr(stat)));
            }
        });
    }
    dstate_free(&g);
    return s;
}

template <typename T>
pn_status dbackward(const char *op, const pn_tensor *q, const pn_tensor *k, const pn_tensor *v, const pn_attn_opts *o,
                    const pn_tensor *out_, const pn_tensor *stat_, const pn_tensor *gout, pn_tensor *dq_t,
                    pn_tensor *dk_t, pn_tensor *dv_t, pn_tensor *gb_t, pn_tensor *const *dparam_t) {
    if (!pn_is_contiguous(dq_t) || !pn_is_contiguous(dk_t) || (dv_t && !pn_is_contiguous(dv_t)) ||
        (gb_t && !pn_is_contiguous(gb_t)))
        return pn_error(PN_ERR_ARG, "%s: the gradients handed to the CUDA kernel must be contiguous", op);
    dstate g;
    dcall<T> c;
    pn_status s = dsetup<T>(op, &g, &c, q, k, v, o);
    pn_tensor *gc = NULL, *oc = NULL, *sc = NULL;
    if (!s && (!(gc = pn_cu_keep(&g, pn_contig((pn_tensor *)gout))) || !(oc = pn_cu_keep(&g, pn_contig((pn_tensor *)out_))) ||
               !(sc = pn_cu_keep(&g, pn_contig((pn_tensor *)stat_)))))
        s = PN_ERR_OOM;
    if (s || c.BH * (c.Nq + c.Nk) == 0) {
        dstate_free(&g);
        return s;
    }
    const int64_t H = c.H, BH = c.BH, Nq = c.Nq, Nk = c.Nk;
    unsigned learn = 0;
    for (int64_t h = 0; h < H; h++) learn |= g.st.hp[h].learn;
    bool any_param = false;
    for (int p = 0; p < PN_NPARAM; p++) any_param |= dparam_t[p] != NULL;
    dbw<T> a;
    memset(&a, 0, sizeof a);
    a.dout = (const T *)pn_ptr(gc), a.out = (const T *)pn_ptr(oc), a.stat = (const T *)pn_ptr(sc);
    a.weights = v == NULL;
    a.dq = (T *)pn_ptr(dq_t), a.dk = (T *)pn_ptr(dk_t), a.dv = dv_t ? (T *)pn_ptr(dv_t) : NULL;
    pn_tensor *t, *tg = NULL;
    bool oom = !(t = pn_cu_scratch_new(&g, BH * Nq, q->dt, false));
    if (!oom) a.Drow = (T *)pn_ptr(t);
    if (!oom && learn && any_param) {
        oom = !(t = pn_cu_scratch_new(&g, BH * Nq * PN_NPARAM, PN_F64, true));
        if (!oom) a.dparam = (double *)pn_ptr(t);
    }
    if (!oom && c.g && any_param) {
        oom = !(t = pn_cu_scratch_new(&g, BH * Nk, PN_F64, true));
        if (!oom) a.kcurv = (double *)pn_ptr(t);
    }
    if (!oom && any_param) oom = !(tg = pn_cu_scratch_new(&g, (int64_t)PN_NPARAM * H, PN_F64, false));
    if (oom) {
        dstate_free(&g);
        return PN_ERR_OOM;
    }
    score_switch(g.kind, [&](auto tag) {
        typedef decltype(tag) S;
        auto kd = drow_kernel<T>;
        auto kq = bwq_kernel<T, S>;
        auto kk = bwk_kernel<T, S>;
        auto kb = gbias_kernel<T, S>;
        if (!s && BH * Nq > 0)
            s = pn_cu_check(op, PN_LAUNCH(kd, pn_cu_blocks(BH * Nq, DT), DT, 0, pn_cu_stream(), c, a));
        auto tq = tbwq_kernel<T, S>;
        auto tk = tbwk_kernel<T, S>;
        const tlay Lq = tlay_of(c.D, c.Dv, TL_BWQ), Lk = tlay_of(c.D, c.Dv, TL_BWK);
        const bool tc = o->precision != PN_PREC_NATIVE && !a.weights; /* tensor cores */
        if (!s && BH * Nq > 0 && !(tc && wmma_backward<S>(op, &s, &g, o->precision, 0, c, a)) &&
            !tiled_launch(op, &s, tq, BH * ((Nq + TQ - 1) / TQ), TT, (size_t)Lq.total * sizeof(T), c, a, Lq))
            s = pn_cu_check(op, PN_LAUNCH(kq, pn_cu_blocks(BH * Nq, DT), DT, 0, pn_cu_stream(), c, a));
        if (!s && BH * Nk > 0 && !(tc && wmma_backward<S>(op, &s, &g, o->precision, 1, c, a)) &&
            !tiled_launch(op, &s, tk, BH * ((Nk + TK - 1) / TK), TT, (size_t)Lk.total * sizeof(T), c, a, Lk))
            s = pn_cu_check(op, PN_LAUNCH(kk, pn_cu_blocks(BH * Nk, DT), DT, 0, pn_cu_stream(), c, a));
        if (!s && gb_t && pn_numel(gb_t) > 0) {
            gbmap m;
            bcast4(gb_t, q, Nq, Nk, m.st);
            m.W[0] = c.B, m.W[1] = H, m.W[2] = Nq, m.W[3] = Nk;
            s = pn_cu_check(op, PN_LAUNCH(kb, pn_cu_blocks(pn_numel(gb_t), DT), DT, 0, pn_cu_stream(), c, a, m,
                                     (T *)pn_ptr(gb_t), pn_numel(gb_t)));
        }
    });
    if (!s && any_param) {
        auto kr = param_reduce_kernel<T>;
        s = pn_cu_check(op, PN_LAUNCH(kr, pn_cu_blocks((int64_t)PN_NPARAM * H), PN_CU_THREADS, 0, pn_cu_stream(), c,
                                 (const double *)a.kcurv, (const double *)a.dparam, (double *)pn_ptr(tg)));
        for (int p = 0; p < PN_NPARAM && !s; p++) {
            pn_tensor *pt = dparam_t[p];
            if (!pt) continue;
            const int per_head = pt->nd == 1 && pt->sizes[0] == H && H > 1;
            s = pn_cu_check(op, PN_LAUNCH(param_into_kernel, 1, 1, 0, pn_cu_stream(), (char *)pn_ptr(pt), pt->dt, per_head,
                                     per_head ? pt->strides[0] : (int64_t)0, (const double *)pn_ptr(tg) + p * H, H));
        }
    }
    dstate_free(&g);
    return s;
}

} // namespace

/* ---- the kernels of kernels.def ---------------------------------------------------------------- */
pn_status pn_cuda_attention_dense_fwd(const pn_tensor *q, const pn_tensor *k, const pn_tensor *v,
                                      const pn_attn_opts *o, pn_tensor *out, pn_tensor *stat) {
    const char *op = "attention";
    if (q->dt == PN_F32) return dforward<float>(op, q, k, v, o, out, NULL, stat);
    return dforward<double>(op, q, k, v, o, out, NULL, stat);
}

pn_status pn_cuda_attention_dense_weights(const pn_tensor *q, const pn_tensor *k, const pn_attn_opts *o, pn_tensor *w,
                                          pn_tensor *stat) {
    const char *op = "attention_weights";
    if (q->dt == PN_F32) return dforward<float>(op, q, k, NULL, o, NULL, w, stat);
    return dforward<double>(op, q, k, NULL, o, NULL, w, stat);
}

pn_status pn_cuda_attention_dense_bwd(const pn_tensor *q, const pn_tensor *k, const pn_tensor *v,
                                      const pn_attn_opts *o, const pn_tensor *out, const pn_tensor *stat,
                                      const pn_tensor *gout, pn_tensor *dq, pn_tensor *dk, pn_tensor *dv,
                                      pn_tensor *gb, pn_tensor *const *dparam) {
    const char *op = v ? "attention" : "attention_weights"; /* no v: the weights' backward */
    if (q->dt == PN_F32) return dbackward<float>(op, q, k, v, o, out, stat, gout, dq, dk, dv, gb, dparam);
    return dbackward<double>(op, q, k, v, o, out, stat, gout, dq, dk, dv, gb, dparam);
}

/* dense.c — fused distance-family attention on dense (B, H, N, D) inputs (DESIGN §3.1):
 * pn_attention (forward + analytic backward), pn_attention_weights, and the preparation
 * shared with graph.c (terms, manifold checks, Lorentz factors).
 *
 * FlashAttention-style: query tiles of PN_TQ rows against key tiles of PN_TK keys, scores
 * from a GEMM plus the score's epilogue (attention.h), online softmax (running max and sum)
 * or sigmoid weights, acc += P·V by GEMM. The forward saves per row one statistic (the
 * logsumexp for softmax, Σσ for sigmoid_normalized) and the backward recomputes the tiles:
 * dV += Pᵀ·dO, dP = dO·Vᵀ, dS = P∘(dP − D) with D_i = dO_i·O_i, then the score's VJP turns
 * dS into dG, and dQ += dG·K, dK += dGᵀ·Q. Nothing of size Nq×Nk is ever allocated (the
 * bias gradient excepted, when the bias itself has that shape).
 *
 * Threads: an OpenMP loop over (batch·head, query tile) with single-threaded BLAS calls
 * inside (OpenBLAS's own threads are switched off around the region: two pools would fight
 * over the cores, and tile GEMMs are too small to split). The backward runs one item per
 * (batch·head, split): a split owns every S-th query tile of its head and its own copy of
 * dK, dV and the column sums, so no two threads ever add into the same memory; the copies
 * are summed in a fixed order afterwards. S = 1 unless there are fewer heads than 2×threads,
 * so results are deterministic for a given thread count.
 *
 * Conventions (documented in the Lua API too):
 *  - causal: query i attends keys j <= i + (Nk − Nq), i.e. the two sequences are aligned at
 *    their ends (Nq = Nk: the usual lower triangle; a decoder step with Nq = 1 sees all keys).
 *  - mask (u8) nonzero = may attend; bias adds to the scores; both broadcast to (…, Nq, Nk).
 *  - a row with no key left (fully masked) gives output 0 and zero gradients.
 *  - ALiBi (alibi = 1, causal only): bias −m_h·(i + off − j) with m_h = 2^(−8h/H), h = 1…H.
 *  - aggregate = einstein: out_i = Σ α_ij γ(v_j) v_j / Σ α_ij γ(v_j), γ(v) = 1/√(1 − κ‖v‖²)
 *    with κ = curvature, v in Klein coordinates (Gulcehre Eq. 3); it always divides by
 *    Σ α γ, for sigmoid weights too; gradients reach v through γ(v) as well.
 *  - pn_attention_weights returns the normalised α_ij (softmax rows sum to one; sigmoid
 *    gives σ(s), sigmoid_normalized σ/Σσ), without Lorentz factors. It is recorded: its
 *    backward is the output's with V = I (dP = dW, D_i = Σ_j dW_ij·W_ij, no dV). */
#include "attention.h"
#include "../backend.h"
#include "fastmath.h"
#include "microkernel.h"

#include "../blas.h"
#include <omp.h>
#include <stdio.h>
#include <unistd.h> /* sysconf: the L2 size for pn_attn_bwd_tq */

/* the whole driver vectorizes its float selects (fastmath.h, ops/fast_math.h) */
PN_NOTRAP_BEGIN

#include "dense_mk.h"

/* ---- the typed bodies ---------------------------------------------------------------------- */
#define PN_DENSE_MK 1 /* f32: the products on the microkernel (dense_mk.h) */
#define real float
#define SFX(x) x##_f32
#define GEMM cblas_sgemm
#define EPI_FWD fwd32
#define EPI_VJP vjp32
#define EPI_FWDS fwds32
#define EPI_VJPS vjps32
#define EPI_FWD_T pn_epi_fwd_f32
#define EPI_VJP_T pn_epi_vjp_f32
#define EPI_FWDS_T pn_epi_fwds_f32
#define EPI_VJPS_T pn_epi_vjps_f32
#include "dense_impl.h"
#undef real
#undef SFX
#undef GEMM
#undef EPI_FWD
#undef EPI_VJP
#undef EPI_FWD_T
#undef EPI_VJP_T
#undef EPI_FWDS
#undef EPI_VJPS
#undef EPI_FWDS_T
#undef EPI_VJPS_T

#undef PN_DENSE_MK
#define PN_DENSE_MK 0 /* f64 (the exact path of the gradchecks): BLAS */
#define real double
#define SFX(x) x##_f64
#define GEMM cblas_dgemm
#define EPI_FWD fwd64
#define EPI_VJP vjp64
#define EPI_FWDS fwds64
#define EPI_VJPS vjps64
#define EPI_FWD_T pn_epi_fwd_f64
#define EPI_VJP_T pn_epi_vjp_f64
#define EPI_FWDS_T pn_epi_fwds_f64
#define EPI_VJPS_T pn_epi_vjps_f64
#include "dense_impl.h"
#undef real
#undef SFX
#undef GEMM
#undef EPI_FWD
#undef EPI_VJP
#undef EPI_FWD_T
#undef EPI_VJP_T
#undef EPI_FWDS
#undef EPI_VJPS
#undef EPI_FWDS_T
#undef EPI_VJPS_T


#define VP(t) ((void *)pn_ptr(t))

/* ---- preparation (shared with graph.c) ------------------------------------------------------- */
static size_t esize(int dt) { return dt == PN_F32 ? sizeof(float) : sizeof(double); }

/* the layout of a dense operand t, (B, H, N, X), (B, N, X) or (N, X): its strides, those of its
 * size-1 dims made canonical (they are never multiplied by anything but 0, but BLAS checks a row
 * stride against the row's width): 0 for the batch and head, the row width for the rows */
static pn_attn_lay dense_lay(const pn_tensor *t) {
    const int nd = t->nd;
    const int64_t *st = t->strides, *sz = t->sizes;
    pn_attn_lay l = {0, 0, st[nd - 2]};
    if (nd >= 3 && sz[0] != 1) l.b = st[0];
    if (nd == 4 && sz[1] != 1) l.h = st[1];
    if (sz[nd - 2] == 1) l.n = sz[nd - 1] > 0 ? sz[nd - 1] : 1;
    return l;
}

static bool same_lay(const pn_tensor *t, pn_attn_lay l) {
    const pn_attn_lay m = dense_lay(t);
    return m.b == l.b && m.h == l.h && m.n == l.n;
}

/* x's dims in memory order, outermost first, in perm (the last dim last); true when x is dense
 * in that order — its numel elements one block, each once — with the last dim's stride 1 (or
 * size 1). Heads split from a projection, a (B, N, H, D) buffer seen as (B, H, N, D), are. */
static bool dense_order(const pn_tensor *x, int64_t perm[PN_MAX_DIMS]) {
    const int nd = x->nd;
    for (int i = 0; i < nd; i++) perm[i] = i;
    if (nd == 0 || pn_numel(x) == 0) return false;
    for (int i = 1; i < nd - 1; i++) /* insertion sort of dims 0 … nd−2 by stride, descending, stable */
        for (int j = i; j > 0 && x->strides[perm[j - 1]] < x->strides[perm[j]]; j--) {
            const int64_t t = perm[j];
            perm[j] = perm[j - 1], perm[j - 1] = t;
        }
    int64_t want = 1;
    for (int i = nd - 1; i >= 0; i--) {
        const int64_t d = perm[i];
        if (x->sizes[d] == 1) continue; /* its stride is never used */
        if (x->strides[d] != want) return false;
        want *= x->sizes[d];
    }
    return true;
}

/* What the CPU kernel reads for a q, k, v or output gradient x: x itself when it is dense in some
 * order (dense_order; the kernel takes its layout from the strides, dense_lay), else a
 * contiguous copy. The CUDA kernels read contiguous rows: a copy there unless x already is. */
static pn_tensor *kernel_input(pn_tensor *x) {
    int64_t perm[PN_MAX_DIMS];
    if (x->dev == PN_CPU && dense_order(x, perm)) {
        pn_retain(x);
        return x;
    }
    return pn_contig(x);
}

/* A new tensor of the given sizes (x's dims, dtype dt, device dev; zeros when zero) laid out in
 * x's memory order: the output in q's, the gradients in their inputs' (the CPU kernel writes
 * them through the same layouts it reads q, k, v with). Contiguous when x is. */
static pn_tensor *alloc_in_order(const pn_tensor *x, const int64_t *sizes, int dt, int dev, bool zero) {
    const int nd = x->nd;
    int64_t perm[PN_MAX_DIMS], inv[PN_MAX_DIMS], ps[PN_MAX_DIMS];
    if (!dense_order(x, perm))
        for (int i = 0; i < nd; i++) perm[i] = i;
    for (int i = 0; i < nd; i++) ps[i] = sizes[perm[i]], inv[perm[i]] = i;
    pn_tensor *base = zero ? pn_zeros(nd, ps, dt, dev) : pn_empty(nd, ps, dt, dev);
    if (!base) return NULL;
    pn_tensor *t = pn_permute(base, nd, inv);
    pn_release(base);
    return t;
}

void pn_attn_call_free(pn_attn_call *c) {
    for (int m = 0; m < 2; m++) {
        free(c->qt[m]);
        free(c->kt[m]);
        c->qt[m] = c->kt[m] = NULL;
    }
    free(c->g);
    free(c->alibi);
    free(c->qbad);
    free(c->kbad);
    c->g = NULL;
    c->alibi = NULL;
    c->qbad = c->kbad = NULL;
    for (int i = 0; i < 5; i++) {
        pn_release(c->own[i]);
        c->own[i] = NULL;
    }
    pn_attn_setup_free(&c->st);
}

/* "[b,h,i]" (as the Lua user indexes the tensor, from 1) for flat row index bh·N + r */
static const char *row_index(const pn_attn_call *c, int64_t flat, int64_t N) {
    static _Thread_local char buf[96];
    int64_t bh = c->nm ? flat % c->BH : flat / N, r = (c->nm ? flat / c->BH : flat % N) + 1, b = bh / c->H + 1,
            h = bh % c->H + 1;
    if (c->graph) snprintf(buf, sizeof buf, "[%lld,%lld]", (long long)r, (long long)h);
    else if (c->nd == 4) snprintf(buf, sizeof buf, "[%lld,%lld,%lld]", (long long)b, (long long)h, (long long)r);
    else if (c->nd == 3) snprintf(buf, sizeof buf, "[%lld,%lld]", (long long)b, (long long)r);
    else snprintf(buf, sizeof buf, "[%lld]", (long long)r);
    return buf;
}

/* Rows (BH, N) of x (q or k: rows of D, layout l) with a non-finite coordinate: *flags gets a (BH·N) array
 * of 0/1 in pn_attn_row's order, or stays NULL when every row is finite; returns the first such row, or -1. */
static int64_t nonfinite_rows(const pn_attn_call *c, const void *x, pn_attn_lay l, int64_t N, uint8_t **flags) {
    const int dt = c->dt;
    const int64_t rows = c->BH * N, D = c->D;
    int64_t first = -1;
    *flags = NULL;
    { /* the common case first: every coordinate finite, one vectorised pass over the whole array
       * (node-major or dense: its rows·D elements are one block, whatever the order of the rows) */
        double z = 0;
        const int64_t n = rows * D;
        /* across threads too: the sum is 0 or NaN whatever the order */
        if (dt == PN_F32) {
            const float *p = x;
            float zf = 0;
            #pragma omp parallel for simd reduction(+ : zf) if (n > PN_PAR_MIN) schedule(static)
            for (int64_t i = 0; i < n; i++) zf += p[i] * 0.0f;
            z = zf;
        } else {
            const double *p = x;
            #pragma omp parallel for simd reduction(+ : z) if (n > PN_PAR_MIN) schedule(static)
            for (int64_t i = 0; i < n; i++) z += p[i] * 0.0;
        }
        if (z == 0) return -1;
    }
    for (int64_t r = 0; r < rows; r++) {
        /* Σ x·0 is 0 for a finite row and NaN as soon as one coordinate is NaN or ±inf: one
         * vectorised pass (IEEE keeps x·0; nothing here is built with -ffast-math) */
        double z = 0;
        const int64_t xo = c->nm ? r * D : pn_attn_at(c, l, r / N, r % N);
        if (dt == PN_F32) {
            const float *p = (const float *)x + xo;
            float zf = 0;
            #pragma omp simd reduction(+ : zf)
            for (int64_t d = 0; d < D; d++) zf += p[d] * 0.0f;
            z = zf;
        } else {
            const double *p = (const double *)x + xo;
            #pragma omp simd reduction(+ : z)
            for (int64_t d = 0; d < D; d++) z += p[d] * 0.0;
        }
        if (z == 0) continue;
        if (!*flags && !(*flags = calloc((size_t)rows, 1))) return -2;
        (*flags)[r] = 1;
        if (first < 0) first = r;
    }
    return first;
}

pn_status pn_attn_prepare(pn_attn_call *c, const char *qs, const char *ks, const char *vs) {
    const pn_score_plan *pl = &c->st.plan;
    const size_t es = esize(c->dt);
    PN_TRY(pn_attn_setup_resolve(c->op, c->opts, c->D, &c->st));
    c->Dg = pl->gemm == PN_GEMM_HEAD ? c->D - 1 : c->D;
    for (int m = 0; m < 2; m++) {
        if (pl->qterm[m] != PN_TERM_NONE && !(c->qt[m] = malloc(es * (size_t)(c->BH * c->Nq + 1))))
            return pn_error(PN_ERR_OOM, "%s: out of memory", c->op);
        if (pl->kterm[m] != PN_TERM_NONE && !(c->kt[m] = malloc(es * (size_t)(c->BH * c->Nk + 1))))
            return pn_error(PN_ERR_OOM, "%s: out of memory", c->op);
    }
    if (c->dt == PN_F32) compute_terms_f32(c);
    else compute_terms_f64(c);

    /* non-finite inputs: a manifold score rejects them by name (the point is not on it);
     * the others give NaN for every weight that reads such a row (row_mods) */
    for (int side = 0; side < 2; side++) {
        const int64_t N = side ? c->Nk : c->Nq;
        uint8_t **flags = side ? &c->kbad : &c->qbad;
        int64_t bad = nonfinite_rows(c, side ? c->k : c->q, side ? c->lk : c->lq, N, flags);
        if (bad == -2) return pn_error(PN_ERR_OOM, "%s: out of memory", c->op);
        if (bad >= 0 && pl->req)
            return pn_error(PN_ERR_ARG, "%s: %s %s is not on the manifold of score '%s': a coordinate is NaN or "
                            "infinite at %s", c->op, side ? "k" : "q", side ? ks : qs, c->st.desc->name,
                            row_index(c, bad, N));
    }

    /* manifold checks, on the very numbers the epilogues will read */
    for (int side = 0; side < 2; side++) {
        const int *kinds = side ? pl->kterm : pl->qterm;
        void *const *t = side ? c->kt : c->qt;
        int64_t N = side ? c->Nk : c->Nq;
        const char *arg = side ? "k" : "q", *shape = side ? ks : qs;
        for (int m = 0; m < 2; m++) {
            unsigned req = 0;
            if (kinds[m] == PN_TERM_LAST && (pl->req & PN_REQ_LAST_POS)) req = PN_REQ_LAST_POS;
            if (kinds[m] == PN_TERM_NORM2 && (pl->req & PN_REQ_BALL)) req = PN_REQ_BALL;
            if (!req) continue;
            double val = 0;
            int64_t bad = c->dt == PN_F32 ? find_bad_f32(c, t[m], N, req, &val) : find_bad_f64(c, t[m], N, req, &val);
            if (bad < 0) continue;
            if (req == PN_REQ_LAST_POS)
                return pn_error(PN_ERR_ARG, "%s: %s %s is not on the manifold of score '%s'%s: the last coordinate "
                                "(height / time) must be > 0 and finite, got %g at %s", c->op, arg, shape,
                                c->st.desc->name, pl->note, val, row_index(c, bad, N));
            return pn_error(PN_ERR_ARG, "%s: %s %s has a point outside the Poincaré ball of score '%s': "
                            "curvature·‖x‖² = %g must be < 1, at %s", c->op, arg, shape, c->st.desc->name, val,
                            row_index(c, bad, N));
        }
    }
    if (c->st.einstein) {
        if (!(c->g = malloc(es * (size_t)(c->BH * c->Nk + 1)))) return pn_error(PN_ERR_OOM, "%s: out of memory", c->op);
        double val = 0;
        int64_t bad = c->dt == PN_F32 ? lorentz_f32(c, &val) : lorentz_f64(c, &val);
        if (bad >= 0)
            return pn_error(PN_ERR_ARG, "%s: v %s has a point outside the Klein ball of the einstein aggregation: "
                            "curvature·‖v‖² = %g must be < 1, at %s", c->op, vs, val, row_index(c, bad, c->Nk));
    }
    return PN_OK;
}

void pn_attn_terms_backward(const pn_attn_call *c, double *const dqt[2], double *const dkt[2], void *dq, void *dk,
                            double *da_l, double *da_r) {
    if (c->dt == PN_F32) {
        terms_backward_f32(c, c->st.plan.qterm, c->q, c->lq, c->Nq, dqt, c->a_l, dq, da_l);
        terms_backward_f32(c, c->st.plan.kterm, c->k, c->lk, c->Nk, dkt, c->a_r, dk, da_r);
    } else {
        terms_backward_f64(c, c->st.plan.qterm, c->q, c->lq, c->Nq, dqt, c->a_l, dq, da_l);
        terms_backward_f64(c, c->st.plan.kterm, c->k, c->lk, c->Nk, dkt, c->a_r, dk, da_r);
    }
}

void pn_attn_lorentz_backward(const pn_attn_call *c, const double *dg, void *dv, double *dcurv) {
    if (c->dt == PN_F32) lorentz_backward_f32(c, dg, dv, dcurv);
    else lorentz_backward_f64(c, dg, dv, dcurv);
}

/* ---- argument checks ------------------------------------------------------------------------- */
/* Canonical (b, h, i, j) strides of t (mask / bias) broadcast to the weights (…, Nq, Nk). */
static pn_status bcast4(const pn_attn_call *c, const char *arg, const pn_tensor *t, const pn_tensor *q,
                        int64_t s4[4]) {
    int64_t W[4];
    int nd = c->nd;
    for (int i = 0; i < nd - 2; i++) W[i] = q->sizes[i];
    W[nd - 2] = c->Nq;
    W[nd - 1] = c->Nk;
    bool ok = t->nd <= nd;
    for (int i = 0; ok && i < t->nd; i++) {
        int64_t ts = t->sizes[t->nd - 1 - i], ws = W[nd - 1 - i];
        ok = ts == 1 || ts == ws;
    }
    if (!ok)
        return pn_error(PN_ERR_SHAPE, "%s: %s %s does not broadcast to the weights %s", c->op, arg, pn_shape_str(t),
                        pn_dims_str(nd, W));
    int64_t st[PN_MAX_DIMS];
    pn_broadcast_strides(t, nd, W, st);
    if (nd == 4) memcpy(s4, st, sizeof(int64_t) * 4);
    else if (nd == 3) s4[0] = st[0], s4[1] = 0, s4[2] = st[1], s4[3] = st[2];
    else s4[0] = 0, s4[1] = 0, s4[2] = st[0], s4[3] = st[1];
    return PN_OK;
}

/* Checks q, k, v (v may be NULL: weights) and o. run = 0 (the front end): the checks only,
 * c is freed. run = 1 (the CPU kernel): also fills c (setup, the inputs and their layouts, masks, terms,
 * parameters). On error c is freed. */
static pn_status dense_call_init(pn_attn_call *c, const char *op, const pn_tensor *q_, const pn_tensor *k_,
                                 const pn_tensor *v_, const pn_attn_opts *o, int run) {
    pn_tensor *q = (pn_tensor *)q_, *k = (pn_tensor *)k_, *v = (pn_tensor *)v_; /* read, never written */
    memset(c, 0, sizeof *c);
    c->op = op;
    if (!q || !k || (!v && strcmp(op, "attention_weights") != 0))
        return pn_error(PN_ERR_ARG, "%s: %s is nil", op, !q ? "q" : (!k ? "k" : "v"));
    if (!o) return pn_error(PN_ERR_ARG, "%s: options are nil (fill them with pn_attn_opts_init)", op);
    PN_TRY(pn_check_float(op, "q", q));
    if (k->dt != q->dt || (v && v->dt != q->dt))
        return pn_error(PN_ERR_DTYPE, "%s: q %s %s, k %s %s%s%s%s%s must have the same float dtype", op,
                        pn_dtype_name(q->dt), pn_shape_str(q), pn_dtype_name(k->dt), pn_shape_str(k), v ? ", v " : "",
                        v ? pn_dtype_name(v->dt) : "", v ? " " : "", v ? pn_shape_str(v) : "");
    if (q->nd < 2 || q->nd > 4)
        return pn_error(PN_ERR_SHAPE, "%s: q %s must be (B, H, N, D), (B, N, D) or (N, D)", op, pn_shape_str(q));
    if (k->nd != q->nd || (v && v->nd != q->nd))
        return pn_error(PN_ERR_SHAPE, "%s: q %s, k %s%s%s must have the same number of dims", op, pn_shape_str(q),
                        pn_shape_str(k), v ? " and v " : "", v ? pn_shape_str(v) : "");
    int nd = q->nd;
    for (int i = 0; i < nd - 2; i++)
        if (k->sizes[i] != q->sizes[i] || (v && v->sizes[i] != q->sizes[i]))
            return pn_error(PN_ERR_SHAPE, "%s: q %s, k %s%s%s differ in the batch/head dims", op, pn_shape_str(q),
                            pn_shape_str(k), v ? " and v " : "", v ? pn_shape_str(v) : "");
    if (k->sizes[nd - 1] != q->sizes[nd - 1])
        return pn_error(PN_ERR_SHAPE, "%s: q %s and k %s differ in the last dim", op, pn_shape_str(q), pn_shape_str(k));
    if (v && v->sizes[nd - 2] != k->sizes[nd - 2])
        return pn_error(PN_ERR_SHAPE, "%s: k %s and v %s have different numbers of keys", op, pn_shape_str(k),
                        pn_shape_str(v));
    c->dt = q->dt;
    c->nd = nd;
    const pn_attn_dims dm = pn_attn_dense_dims(q, k, v, o);
    c->B = dm.B, c->H = dm.H, c->BH = dm.BH, c->Nq = dm.Nq, c->Nk = dm.Nk;
    c->D = dm.D, c->Dv = dm.Dv, c->off = dm.off, c->causal = dm.causal;
    if (c->D < 1) return pn_error(PN_ERR_SHAPE, "%s: q %s has no features", op, pn_shape_str(q));
    PN_TRY(pn_attn_setup_init(op, o, q->dt, c->H, c->D, 0, &c->st));
    c->opts = o;
    if (!v) c->st.einstein = 0; /* the weights α do not involve the aggregation */
    pn_status s = PN_OK;
    if (o->mask) {
        if (o->mask->dt != PN_U8) {
            s = pn_error(PN_ERR_DTYPE, "%s: mask %s has dtype %s, expected u8 (nonzero = may attend)", op,
                         pn_shape_str(o->mask), pn_dtype_name(o->mask->dt));
            goto fail;
        }
        if ((s = bcast4(c, "mask", o->mask, q, c->ms))) goto fail;
        c->mask = (const uint8_t *)pn_ptr(o->mask);
    }
    if (o->bias) {
        if (o->bias->dt != q->dt) {
            s = pn_error(PN_ERR_DTYPE, "%s: bias %s has dtype %s, expected %s like q", op, pn_shape_str(o->bias),
                         pn_dtype_name(o->bias->dt), pn_dtype_name(q->dt));
            goto fail;
        }
        if ((s = bcast4(c, "bias", o->bias, q, c->bs))) goto fail;
        c->bias = pn_ptr(o->bias);
    }
    if (o->alibi) {
        if (!o->causal) {
            s = pn_error(PN_ERR_ARG, "%s: alibi needs causal = true (q %s)", op, pn_shape_str(q));
            goto fail;
        }
        if (!(c->alibi = malloc(sizeof(double) * (size_t)c->H))) {
            s = pn_error(PN_ERR_OOM, "%s: out of memory", op);
            goto fail;
        }
        for (int64_t h = 0; h < c->H; h++) c->alibi[h] = pow(2.0, -8.0 * (double)(h + 1) / (double)c->H);
    }
    if (!run) {
        pn_attn_call_free(c);
        return PN_OK;
    }
    pn_tensor *ins[3] = {q, k, v};
    for (int i = 0; i < 3; i++) {
        if (!ins[i]) continue;
        if (!(c->own[i] = kernel_input(ins[i]))) {
            s = PN_ERR_OOM;
            goto fail;
        }
    }
    c->q = pn_ptr(c->own[0]);
    c->k = pn_ptr(c->own[1]);
    c->v = v ? pn_ptr(c->own[2]) : NULL;
    c->lq = dense_lay(c->own[0]);
    c->lk = dense_lay(c->own[1]);
    if (v) c->lv = dense_lay(c->own[2]);
    if ((s = pn_attn_prepare(c, pn_shape_str(q), pn_shape_str(k), v ? pn_shape_str(v) : "")) != PN_OK) goto fail;
    return PN_OK;
fail:
    pn_attn_call_free(c);
    return s;
}

/* ---- forward -------------------------------------------------------------------------------- */
typedef struct {
    pn_attn_opts o;          /* a copy; its tensors retained */
    pn_tensor *q, *k, *v;    /* the inputs as given (detached views) */
    pn_tensor *out, *stat;   /* detached: out (…, Nq, Dv) and the row statistics (BH, Nq) */
    int slot[PN_NPARAM];     /* autograd input index of each parameter tensor, or -1 */
} dense_saved;

static void dense_saved_free(void *p) {
    dense_saved *sv = p;
    pn_attn_opts_release(&sv->o);
    pn_release(sv->q);
    pn_release(sv->k);
    pn_release(sv->v);
    pn_release(sv->out);
    pn_release(sv->stat);
    free(sv);
}

static pn_status dense_bw(pn_node *n, pn_tensor *gout, pn_tensor **gin);

/* Records out = op(q, k, v, o) for autograd when an input needs it (v = NULL: the weights,
 * out = w); takes *stat (set to NULL) when it does. q, k, v are the graph's inputs; save holds
 * the tensors the backward reads (their contiguous copies, see contig_inputs). */
static pn_status dense_record(const char *op, pn_tensor *out, pn_tensor **stat, pn_tensor *q, pn_tensor *k,
                              pn_tensor *v, pn_tensor *const save[3], const pn_attn_opts *o) {
    /* autograd inputs: q, k, v, bias, then the parameter tensors given (slots in sv->slot) */
    pn_tensor *ins[4 + PN_NPARAM] = {q, k, v, o->bias};
    int nin = 4, slot[PN_NPARAM];
    pn_attn_param_inputs(o, ins, &nin, slot);
    if (!pn_ag_needed(nin, ins)) return PN_OK;
    dense_saved *sv = calloc(1, sizeof *sv);
    pn_node *nd_ = sv ? pn_ag_record(out, op, dense_bw, nin, ins) : NULL;
    if (!nd_) {
        free(sv);
        return sv ? PN_ERR_OOM : pn_error(PN_ERR_OOM, "%s: out of memory", op);
    }
    sv->o = *o;
    pn_attn_opts_retain(&sv->o);
    memcpy(sv->slot, slot, sizeof slot);
    sv->q = pn_detach(save[0]);
    sv->k = pn_detach(save[1]);
    sv->v = v ? pn_detach(save[2]) : NULL;
    sv->out = pn_detach(out);
    sv->stat = *stat;
    *stat = NULL;
    nd_->extra = sv;
    nd_->free_extra = dense_saved_free;
    return !sv->q || !sv->k || (v && !sv->v) || !sv->out ? PN_ERR_OOM : PN_OK;
}

/* The front end's device step: every tensor of the call on one device, and its kernels. */
static pn_status dense_device(const char *op, const pn_tensor *q, const pn_tensor *k, const pn_tensor *v,
                              const pn_attn_opts *o, int *dev, const pn_kernels **kt) {
    const pn_tensor *ts[4 + PN_NPARAM] = {q, k, v, o ? o->mask : NULL};
    const char *names[4 + PN_NPARAM] = {"q", "k", "v", "mask"};
    int n = 4;
    if (o) {
        ts[n] = o->bias, names[n++] = "bias";
        for (int p = 0; p < PN_NPARAM; p++)
            if (o->param_t[p]) ts[n] = o->param_t[p], names[n++] = pn_attention_param_name(p);
    }
    PN_TRY(pn_kernels_for(op, n, ts, names, dev, kt));
    if (o && o->precision != PN_PREC_NATIVE) { /* tensor-core inputs: f32 tensors on CUDA */
        const char *pn_ = o->precision == PN_PREC_BF16 ? "bf16" : "f16";
        if (*dev != PN_CUDA)
            return pn_error(PN_ERR_ARG, "%s: precision = '%s' runs on CUDA tensor cores; q %s is on the CPU (leave "
                            "precision out there)", op, pn_, pn_shape_str(q));
        if (q->dt != PN_F32)
            return pn_error(PN_ERR_DTYPE, "%s: precision = '%s' rounds f32 inputs; q %s is %s", op, pn_,
                            pn_shape_str(q), pn_dtype_name(q->dt));
    }
    return PN_OK;
}

/* The kernels' q, k, v (kernel_input): heads split from a projection reach the CPU kernel as
 * they are, and the backward keeps what the kernel read. c[i] NULL where in[i] is. */
static pn_status kernel_inputs(pn_tensor *const in[3], pn_tensor *c[3]) {
    for (int i = 0; i < 3; i++) c[i] = NULL;
    for (int i = 0; i < 3; i++)
        if (in[i] && !(c[i] = kernel_input(in[i]))) {
            for (int j = 0; j < i; j++) pn_release(c[j]);
            return PN_ERR_OOM;
        }
    return PN_OK;
}

pn_tensor *pn_attention(pn_tensor *q, pn_tensor *k, pn_tensor *v, const pn_attn_opts *o) {
    const char *op = "attention";
    pn_attn_call c;
    if (dense_call_init(&c, op, q, k, v, o, 0)) return NULL;
    int dev;
    const pn_kernels *kt;
    if (dense_device(op, q, k, v, o, &dev, &kt)) return NULL;
    const int nd = q->nd;
    const int64_t BH = (nd == 4 ? q->sizes[0] * q->sizes[1] : (nd == 3 ? q->sizes[0] : 1)), Nq = q->sizes[nd - 2];
    int64_t oshape[PN_MAX_DIMS];
    memcpy(oshape, q->sizes, sizeof(int64_t) * (size_t)nd);
    oshape[nd - 1] = v->sizes[nd - 1];
    pn_tensor *ci[3];
    if (kernel_inputs((pn_tensor *const[]){q, k, v}, ci)) return NULL;
    pn_tensor *out = alloc_in_order(ci[0], oshape, q->dt, dev, false); /* (B, N, H, Dv) in memory for split heads */
    int64_t sshape[2] = {BH, Nq};
    pn_tensor *stat = out ? pn_empty(2, sshape, q->dt, dev) : NULL;
    if (!stat || PN_KCALL(op, kt, attention_dense_fwd, ci[0], ci[1], ci[2], o, out, stat)) goto fail;
    if (dense_record(op, out, &stat, q, k, v, ci, o)) goto fail;
    pn_release(stat);
    for (int i = 0; i < 3; i++) pn_release(ci[i]);
    return out;
fail:
    pn_release(out);
    pn_release(stat);
    for (int i = 0; i < 3; i++) pn_release(ci[i]);
    return NULL;
}

pn_status pn_cpu_attention_dense_fwd(const pn_tensor *q, const pn_tensor *k, const pn_tensor *v,
                                     const pn_attn_opts *o, pn_tensor *out, pn_tensor *stat) {
    pn_attn_call c;
    PN_TRY(dense_call_init(&c, "attention", q, k, v, o, 1));
    c.lo = dense_lay(out);
    pn_status s = PN_OK;
    if (pn_numel(out) > 0 || c.BH * c.Nq > 0) {
        PN_BLAS_SERIAL_BEGIN;
        s = c.dt == PN_F32 ? forward_f32(&c, VP(out), VP(stat)) : forward_f64(&c, VP(out), VP(stat));
        PN_BLAS_SERIAL_END;
    }
    pn_attn_call_free(&c);
    return s;
}

pn_tensor *pn_attention_weights(pn_tensor *q, pn_tensor *k, const pn_attn_opts *o) {
    const char *op = "attention_weights";
    pn_attn_call c;
    if (dense_call_init(&c, op, q, k, NULL, o, 0)) return NULL;
    int dev;
    const pn_kernels *kt;
    if (dense_device(op, q, k, NULL, o, &dev, &kt)) return NULL;
    const int nd = q->nd;
    const int64_t BH = (nd == 4 ? q->sizes[0] * q->sizes[1] : (nd == 3 ? q->sizes[0] : 1)), Nq = q->sizes[nd - 2];
    int64_t wshape[PN_MAX_DIMS], sshape[2] = {BH, Nq};
    memcpy(wshape, q->sizes, sizeof(int64_t) * (size_t)nd);
    wshape[nd - 1] = k->sizes[nd - 2];
    pn_tensor *ci[3];
    if (kernel_inputs((pn_tensor *const[]){q, k, NULL}, ci)) return NULL;
    pn_tensor *w = pn_empty(nd, wshape, q->dt, dev);
    pn_tensor *stat = w ? pn_empty(2, sshape, q->dt, dev) : NULL;
    if (!stat || PN_KCALL(op, kt, attention_dense_weights, ci[0], ci[1], o, w, stat) ||
        dense_record(op, w, &stat, q, k, NULL, ci, o)) {
        pn_release(w);
        w = NULL;
    }
    pn_release(stat);
    for (int i = 0; i < 3; i++) pn_release(ci[i]);
    return w;
}

pn_status pn_cpu_attention_dense_weights(const pn_tensor *q, const pn_tensor *k, const pn_attn_opts *o,
                                         pn_tensor *w, pn_tensor *stat) {
    pn_attn_call c;
    PN_TRY(dense_call_init(&c, "attention_weights", q, k, NULL, o, 1));
    pn_status s = PN_OK;
    if (pn_numel(w) > 0) {
        PN_BLAS_SERIAL_BEGIN;
        s = c.dt == PN_F32 ? weights_f32(&c, VP(w), VP(stat)) : weights_f64(&c, VP(w), VP(stat));
        PN_BLAS_SERIAL_END;
    }
    pn_attn_call_free(&c);
    return s;
}

/* ---- backward ------------------------------------------------------------------------------- */
/* The front end allocates the gradients it will hand back (zeros, on the inputs' device) and
 * calls the kernel, which adds into them. */
static pn_status dense_bw(pn_node *n, pn_tensor *gout, pn_tensor **gin) {
    dense_saved *sv = n->extra;
    const char *op = sv->v ? "attention" : "attention_weights";
    int dev;
    const pn_kernels *kt;
    PN_TRY(dense_device(op, sv->q, sv->k, sv->v, &sv->o, &dev, &kt));
    const int dt = sv->q->dt;
    pn_status st = PN_OK;
    /* in the layouts of the q, k, v the kernel read (sv: kernel_input's), which it writes them with */
    pn_tensor *dq = alloc_in_order(sv->q, sv->q->sizes, dt, dev, true);
    pn_tensor *dk = alloc_in_order(sv->k, sv->k->sizes, dt, dev, true);
    pn_tensor *dv = sv->v ? alloc_in_order(sv->v, sv->v->sizes, dt, dev, true) : NULL;
    pn_tensor *gb = NULL, *dparam[PN_ATTN_MAX_PARAMS] = {NULL};
    bool oom = !dq || !dk || (sv->v && !dv);
    if (sv->o.bias && pn_ag_input_needs(n, 3)) oom |= !(gb = pn_zeros(sv->o.bias->nd, sv->o.bias->sizes, dt, dev));
    for (int p = 0; p < PN_NPARAM; p++) {
        const pn_tensor *t = sv->o.param_t[p];
        if (t && sv->slot[p] >= 0 && pn_ag_input_needs(n, sv->slot[p]))
            oom |= !(dparam[p] = pn_zeros(t->nd, t->sizes, t->dt, dev));
    }
    if (oom) st = PN_ERR_OOM;
    if (!st) st = PN_KCALL(op, kt, attention_dense_bwd, sv->q, sv->k, sv->v, &sv->o, sv->out, sv->stat, gout, dq, dk, dv, gb, dparam);
    if (!st) {
        if (pn_ag_input_needs(n, 0)) gin[0] = dq, dq = NULL;
        if (pn_ag_input_needs(n, 1)) gin[1] = dk, dk = NULL;
        if (dv && pn_ag_input_needs(n, 2)) gin[2] = dv, dv = NULL;
        if (gb) gin[3] = gb, gb = NULL;
        for (int p = 0; p < PN_NPARAM; p++)
            if (dparam[p]) gin[sv->slot[p]] = dparam[p], dparam[p] = NULL;
    }
    pn_release(dq);
    pn_release(dk);
    pn_release(dv);
    pn_release(gb);
    for (int p = 0; p < PN_NPARAM; p++) pn_release(dparam[p]);
    return st;
}

typedef struct {
    void *dk[PN_MAX_SPLITS], *dv[PN_MAX_SPLITS], *dkt[PN_MAX_SPLITS][2], *dg[PN_MAX_SPLITS];
    double *dqt[2], *dparam;
    void *gbias_threads;
} bw_bufs;

static void bw_bufs_free(bw_bufs *b, int64_t S) {
    for (int64_t s = 0; s < S; s++) {
        if (s > 0) {
            free(b->dk[s]);
            free(b->dv[s]);
        }
        free(b->dkt[s][0]);
        free(b->dkt[s][1]);
        free(b->dg[s]);
    }
    free(b->dqt[0]);
    free(b->dqt[1]);
    free(b->dparam);
    free(b->gbias_threads);
}

/* a += b over n elements of dtype dt */
static void add_into(int dt, void *a, const void *b, int64_t n) {
    if (dt == PN_F32) {
        float *x = a;
        const float *y = b;
        #pragma omp parallel for if (n > PN_PAR_MIN) schedule(static)
        for (int64_t i = 0; i < n; i++) x[i] += y[i];
    } else {
        double *x = a;
        const double *y = b;
        #pragma omp parallel for if (n > PN_PAR_MIN) schedule(static)
        for (int64_t i = 0; i < n; i++) x[i] += y[i];
    }
}

int64_t pn_attn_bwd_tq(const char *op, int64_t Nq) {
    const char *e = getenv("PENUMBRA_ATTN_BWD_TQ");
    if (e && *e) {
        if (!strcmp(e, "64") || !strcmp(e, "128")) return atoi(e);
        pn_error(PN_ERR_ARG, "%s: PENUMBRA_ATTN_BWD_TQ must be 64 or 128 (query rows per backward tile), got '%s'",
                 op, e);
        return 0;
    }
    static long l2_cached = -1; /* bytes (0: the system does not say); asked once, any thread */
    long l2 = __atomic_load_n(&l2_cached, __ATOMIC_RELAXED);
    if (l2 < 0) {
        l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
        if (l2 < 0) l2 = 0;
        __atomic_store_n(&l2_cached, l2, __ATOMIC_RELAXED);
    }
    const int64_t tq = Nq >= 512 && l2 >= (2L << 20) ? PN_TQ_BWD_MAX : PN_TQ;
    /* a multiple of the microkernel's rows (avx512: 6), so no strip of a tile runs part-empty */
    const pn_microkernel *mk = pn_mk_get();
    return mk ? tq - tq % mk->mr : tq;
}

/* dq, dk, dv (the inputs' shapes), gb (the bias's shape, or NULL) and dparam[p] (parameter
 * p's shape, or NULL) are zeros: the kernel adds the gradients into them. */
pn_status pn_cpu_attention_dense_bwd(const pn_tensor *q, const pn_tensor *k, const pn_tensor *v,
                                     const pn_attn_opts *o, const pn_tensor *out_, const pn_tensor *stat_,
                                     const pn_tensor *gout, pn_tensor *dq, pn_tensor *dk, pn_tensor *dv, pn_tensor *gb,
                                     pn_tensor *const *dparam) {
    const char *op = v ? "attention" : "attention_weights"; /* no v: the weights' backward */
    pn_attn_call c;
    PN_TRY(dense_call_init(&c, op, q, k, v, o, 1));
    const int dt = c.dt;
    const size_t es = esize(dt);
    const int64_t tq = pn_attn_bwd_tq(op, c.Nq);
    if (!tq) {
        pn_attn_call_free(&c);
        return PN_ERR_ARG;
    }
    const int64_t nqt = (c.Nq + tq - 1) / tq;
    const int nthreads = omp_get_max_threads();
    int64_t S = 1;
    if (c.BH < 2 * nthreads) {
        S = (2 * nthreads + c.BH - 1) / c.BH;
        if (S > nqt) S = nqt;
        if (S > PN_MAX_SPLITS) S = PN_MAX_SPLITS;
        if (S < 1) S = 1;
    }
    pn_status st = PN_OK;
    bw_bufs bb;
    memset(&bb, 0, sizeof bb);
    pn_tensor *gc = kernel_input((pn_tensor *)gout);
    if (!gc) {
        st = PN_ERR_OOM;
        goto done;
    }
    /* the gradients are written through q's, k's and v's layouts: the front end made them so */
    if (!same_lay(dq, c.lq) || !same_lay(dk, c.lk) || (dv && !same_lay(dv, c.lv))) {
        st = pn_error(PN_ERR_ARG, "%s: the gradients must be laid out as the q, k, v the kernel reads (dq %s, q %s)",
                      op, pn_dims_str(dq->nd, dq->strides), pn_dims_str(c.own[0]->nd, c.own[0]->strides));
        goto done;
    }
    const pn_score_plan *pl = &c.st.plan;
    const int64_t nkey = c.BH * c.Nk + 1;
    bool oom = false;
    for (int64_t s = 0; s < S; s++) {
        bb.dk[s] = s == 0 ? pn_ptr(dk) : calloc((size_t)(c.BH * c.Nk * c.D + 1), es);
        bb.dv[s] = !dv ? NULL : s == 0 ? pn_ptr(dv) : calloc((size_t)(c.BH * c.Nk * c.Dv + 1), es);
        for (int m = 0; m < 2; m++)
            if (pl->kterm[m] != PN_TERM_NONE) oom |= !(bb.dkt[s][m] = calloc((size_t)nkey, es));
        if (c.st.einstein) oom |= !(bb.dg[s] = calloc((size_t)nkey, es));
        oom |= !bb.dk[s] || (dv && !bb.dv[s]);
    }
    for (int m = 0; m < 2; m++)
        if (pl->qterm[m] != PN_TERM_NONE) oom |= !(bb.dqt[m] = calloc((size_t)(c.BH * c.Nq + 1), sizeof(double)));
    oom |= !(bb.dparam = calloc((size_t)(c.BH * S * PN_NPARAM), sizeof(double)));
    /* the bias gradient: direct when no two items share a bias element, else one copy per thread */
    bool want_gbias = gb != NULL;
    bool per_thread = false;
    int64_t gbs[4] = {0, 0, 0, 0}, gb_numel = 0;
    if (want_gbias && !oom) {
        if (bcast4(&c, "bias", gb, q, gbs)) {
            st = PN_ERR_SHAPE;
            goto done;
        }
        gb_numel = pn_numel(gb);
        per_thread = (gbs[0] == 0 && c.B > 1) || (gbs[1] == 0 && c.H > 1) || (gbs[2] == 0 && S > 1);
        if (per_thread) oom |= !(bb.gbias_threads = calloc((size_t)(gb_numel * nthreads + 1), es));
    }
    if (oom) {
        st = pn_error(PN_ERR_OOM, "%s: out of memory in backward", op);
        goto done;
    }
    {
        PN_BLAS_SERIAL_BEGIN;
        /* the f32 and f64 argument structs have the same fields: fill either the same way */
#define FILL_BWD_ARGS(a)                                                                   \
    do {                                                                                   \
        memset(&(a), 0, sizeof(a));                                                        \
        (a).dout = VP(gc), (a).out = VP(out_), (a).stat = VP(stat_), (a).dq = VP(dq);     \
        (a).ldo = dense_lay(gc), (a).lo = dense_lay(out_);                                 \
        (a).weights = v == NULL;                                                           \
        for (int64_t s = 0; s < S; s++) {                                                  \
            (a).dk[s] = bb.dk[s], (a).dv[s] = bb.dv[s], (a).dg[s] = bb.dg[s];              \
            (a).dkt[s][0] = bb.dkt[s][0], (a).dkt[s][1] = bb.dkt[s][1];                    \
        }                                                                                  \
        (a).dqt[0] = bb.dqt[0], (a).dqt[1] = bb.dqt[1], (a).dparam = bb.dparam, (a).S = S; \
        (a).tq = tq;                                                                       \
        (a).gbias = want_gbias ? (per_thread ? bb.gbias_threads : VP(gb)) : NULL;          \
        memcpy((a).gbs, gbs, sizeof gbs);                                                  \
        (a).gbias_numel = gb_numel, (a).gbias_per_thread = per_thread;                     \
    } while (0)
        if (dt == PN_F32) {
            bwd_args_f32 a;
            FILL_BWD_ARGS(a);
            st = backward_f32(&c, &a);
        } else {
            bwd_args_f64 a;
            FILL_BWD_ARGS(a);
            st = backward_f64(&c, &a);
        }
#undef FILL_BWD_ARGS
        PN_BLAS_SERIAL_END;
    }
    if (st) goto done;

    /* splits summed in a fixed order */
    for (int64_t s = 1; s < S; s++) {
        add_into(dt, bb.dk[0], bb.dk[s], c.BH * c.Nk * c.D);
        if (dv) add_into(dt, bb.dv[0], bb.dv[s], c.BH * c.Nk * c.Dv);
        for (int m = 0; m < 2; m++)
            if (bb.dkt[0][m]) add_into(dt, bb.dkt[0][m], bb.dkt[s][m], c.BH * c.Nk);
        if (bb.dg[0]) add_into(dt, bb.dg[0], bb.dg[s], c.BH * c.Nk);
    }
    if (per_thread)
        for (int t = 0; t < nthreads; t++) add_into(dt, pn_ptr(gb), (char *)bb.gbias_threads + es * (size_t)(t * gb_numel), gb_numel);

    /* column sums → double, then the terms' and Lorentz factors' chain rule */
    double *dkt[2] = {NULL, NULL}, *dgs = NULL;
    double gparam[PN_NPARAM][64];
    double *gp[PN_NPARAM];
    double *gp_heap = NULL;
    if (c.H > 64) {
        gp_heap = calloc((size_t)(PN_NPARAM * c.H), sizeof(double));
        if (!gp_heap) {
            st = pn_error(PN_ERR_OOM, "%s: out of memory in backward", op);
            goto done;
        }
    }
    for (int p = 0; p < PN_NPARAM; p++) {
        gp[p] = gp_heap ? gp_heap + p * c.H : gparam[p];
        memset(gp[p], 0, sizeof(double) * (size_t)c.H);
    }
    for (int m = 0; m < 2; m++) {
        if (!bb.dkt[0][m]) continue;
        dkt[m] = malloc(sizeof(double) * (size_t)nkey);
        if (!dkt[m]) continue;
        for (int64_t i = 0; i < c.BH * c.Nk; i++) dkt[m][i] = pn_ld(bb.dkt[0][m], dt, i);
    }
    if (bb.dg[0] && (dgs = malloc(sizeof(double) * (size_t)nkey)))
        for (int64_t i = 0; i < c.BH * c.Nk; i++) dgs[i] = pn_ld(bb.dg[0], dt, i);
    if ((bb.dkt[0][0] && !dkt[0]) || (bb.dkt[0][1] && !dkt[1]) || (bb.dg[0] && !dgs)) {
        st = pn_error(PN_ERR_OOM, "%s: out of memory in backward", op);
    } else {
        pn_attn_terms_backward(&c, bb.dqt, dkt, pn_ptr(dq), pn_ptr(dk), NULL, NULL);
        if (dgs) pn_attn_lorentz_backward(&c, dgs, pn_ptr(dv), gp[PN_P_curvature]);
        for (int64_t bh = 0; bh < c.BH; bh++)
            for (int64_t s = 0; s < S; s++)
                for (int p = 0; p < PN_NPARAM; p++) gp[p][bh % c.H] += bb.dparam[(bh * S + s) * PN_NPARAM + p];
    }
    free(dkt[0]);
    free(dkt[1]);
    free(dgs);
    if (st) {
        free(gp_heap);
        goto done;
    }

    for (int p = 0; p < PN_NPARAM; p++)
        if (dparam[p]) pn_attn_param_grad_into(dparam[p], gp[p], c.H);
    free(gp_heap);
done:
    bw_bufs_free(&bb, S);
    pn_release(gc);
    pn_attn_call_free(&c);
    return st;
}

PN_NOTRAP_END

/* cosine.c — Cottention (cosine attention, DESIGN §3.2), forward and analytic backward.
 *
 *   q̂ = q / sqrt(‖q‖² + ε), k̂ likewise (ε = PN_COSINE_EPS, linear.h)
 *   out_t = n_t^{−σ(m_h)} Σ_{j ∈ keys(t)} (q̂_t·k̂_j) v_j
 *
 * keys(t) = the real keys (key_mask nonzero, or all) with j ≤ t when causal, all of them
 * otherwise; n_t = |keys(t)|, counted as 1 when it is 0 (the row is then 0 anyway). So
 * without a mask n_t = t+1 (causal, 0-based t) or N — the definition under which the
 * parallel form and the recurrent state (lin_state.c) agree.
 *
 * Never an N×N matrix nor the (N, D, Dv) tensor of the naive cumsum: per (b, h) a
 * running state S = Σ k̂_j v_jᵀ (D×Dv) — built once for the bidirectional form
 * (q̂ (k̂ᵀ v), Cottention Eq. 5), grown chunk by chunk for the causal one (Eq. 7/8). The
 * causal form works on chunks of c rows (Q̂, K̂, V of the chunk, S the state entering it):
 *   out = diag(n^{−σ}) ((Q̂ K̂ᵀ ⊙ tril) V + Q̂ S),   then S += K̂ᵀ V
 * — GEMMs instead of N rank-1 updates (cosine_impl.h). Backward (Cottention §4): with
 * G_t = n_t^{−σ} g_t,
 *   g q̂_t = S_t G_t                (forward pass: (G Vᵀ ⊙ tril) K̂ + G Sᵀ per chunk)
 *   g k̂_j = R_j v_j, g v_j = R_jᵀ k̂_j   with R_j = Σ_{t: j ∈ keys(t)} q̂_t G_tᵀ (reverse pass:
 *                                   (G Vᵀ ⊙ tril)ᵀ Q̂ + V Rᵀ and (Q̂ K̂ᵀ ⊙ tril)ᵀ G + K̂ R)
 *   g m_h = σ'(m_h) Σ_t (g_t·out_t)(−ln n_t),  g_t·out_t = q̂_t·g q̂_t
 * O(N·(c·D + D·Dv)) time and O(c·D + D·Dv) extra memory per (b, h), whatever N; (b, h)
 * pairs run in parallel, each on one thread, so results do not depend on the schedule. */
#include "linear.h"

#define OP "cosine_attention"

pn_status pn_lin_check_qkv(const char *op, const pn_tensor *q, const pn_tensor *k, const pn_tensor *v) {
    if (!q || !k || !v) return pn_error(PN_ERR_ARG, "%s: q, k and v are required (got nil)", op);
    int dev;
    PN_TRY(pn_common_device(op, 3, (const pn_tensor *const[]){q, k, v}, (const char *const[]){"q", "k", "v"}, &dev));
    PN_TRY(pn_check_float(op, "q", q));
    if (k->dt != q->dt || v->dt != q->dt)
        return pn_error(PN_ERR_DTYPE, "%s: q %s %s, k %s %s and v %s %s must have the same dtype", op,
                        pn_dtype_name(q->dt), pn_shape_str(q), pn_dtype_name(k->dt), pn_shape_str(k),
                        pn_dtype_name(v->dt), pn_shape_str(v));
    if (q->nd != 4 || k->nd != 4 || v->nd != 4)
        return pn_error(PN_ERR_SHAPE, "%s: q %s, k %s and v %s must be 4-D (B, H, N, D)", op, pn_shape_str(q),
                        pn_shape_str(k), pn_shape_str(v));
    for (int d = 0; d < 3; d++)
        if (k->sizes[d] != q->sizes[d] || v->sizes[d] != q->sizes[d])
            return pn_error(PN_ERR_SHAPE, "%s: q %s, k %s and v %s differ in (B, H, N)", op, pn_shape_str(q),
                            pn_shape_str(k), pn_shape_str(v));
    if (k->sizes[3] != q->sizes[3])
        return pn_error(PN_ERR_SHAPE, "%s: q %s and k %s differ in the last dim", op, pn_shape_str(q), pn_shape_str(k));
    return PN_OK;
}

/* One call's geometry and (contiguous) data. */
typedef struct {
    int64_t B, H, N, D, Dv;
    int dt, causal;
    const void *q, *k, *v;  /* (B, H, N, D), (B, H, N, D), (B, H, N, Dv) */
    const uint8_t *mask;    /* (B, N) or NULL */
    const double *s;        /* (H): σ(m_h) */
} cos_args;

static inline bool is_key(const cos_args *a, int64_t b, int64_t j) { return !a->mask || a->mask[b * a->N + j]; }

/* n^{−s} with n counted as at least 1: count_scale (linear_math.h) */

/* Rows per chunk of the GEMM forms: big enough for efficient GEMMs, small enough that
 * the intra-chunk scores (c·c per chunk, half of them masked) cost about as much as the
 * state terms (c·D·Dv). */
#define PN_COSINE_CHUNK 64

/* ---- the chunked kernels, once per dtype (cosine_impl.h) ----------------------------------- */
#define real float
#define SFX(x) x##_f32
#define GEMM cblas_sgemm
#include "cosine_impl.h"
#undef real
#undef SFX
#undef GEMM

#define real double
#define SFX(x) x##_f64
#define GEMM cblas_dgemm
#include "cosine_impl.h"
#undef real
#undef SFX
#undef GEMM

/* out: (B, H, N, Dv). Returns false when scratch could not be allocated. */
static bool cos_forward(const cos_args *a, void *out) {
    PN_BLAS_SERIAL_BEGIN;
    bool ok = a->dt == PN_F32 ? cos_forward_f32(a, out) : cos_forward_f64(a, out);
    PN_BLAS_SERIAL_END;
    return ok;
}

/* g: (B, H, N, Dv). gq, gk: (B, H, N, D), gv: (B, H, N, Dv) or NULL when not needed;
 * gm_bh: (B·H) partial sums of Σ_t (g_t·out_t)(−ln n_t), or NULL. */
static bool cos_backward(const cos_args *a, const void *g, void *gq, void *gk, void *gv, double *gm_bh) {
    PN_BLAS_SERIAL_BEGIN;
    bool ok = a->dt == PN_F32 ? cos_backward_f32(a, g, gq, gk, gv, gm_bh) : cos_backward_f64(a, g, gq, gk, gv, gm_bh);
    PN_BLAS_SERIAL_END;
    return ok;
}

/* ---- entry points ------------------------------------------------------------------------- */
/* σ(m_h) for every head; m (H) contiguous */
static void sigmoids(const pn_tensor *m, double *s) {
    for (int64_t h = 0; h < m->sizes[0]; h++) s[h] = cos_sigmoid(pn_ld(pn_ptr(m), m->dt, h));
}

static void fill_args(cos_args *a, pn_tensor *q, pn_tensor *k, pn_tensor *v, pn_tensor *mask, int causal,
                      const double *s) {
    a->B = q->sizes[0], a->H = q->sizes[1], a->N = q->sizes[2], a->D = q->sizes[3], a->Dv = v->sizes[3];
    a->dt = q->dt, a->causal = causal != 0;
    a->q = pn_ptr(q), a->k = pn_ptr(k), a->v = pn_ptr(v);
    a->mask = mask ? (const uint8_t *)pn_ptr(mask) : NULL;
    a->s = s;
}

/* CPU kernels (kernels.def): q, k, v, m, mask, g contiguous */
pn_status pn_cpu_cosine_fwd(const pn_tensor *q, const pn_tensor *k, const pn_tensor *v, const pn_tensor *m,
                            const pn_tensor *mask, int causal, pn_tensor *out) {
    const int64_t H = q->sizes[1];
    double *s = malloc(sizeof(double) * (size_t)(H > 0 ? H : 1));
    if (!s) return pn_error(PN_ERR_OOM, OP ": out of memory");
    sigmoids(m, s);
    cos_args a;
    fill_args(&a, (pn_tensor *)q, (pn_tensor *)k, (pn_tensor *)v, (pn_tensor *)mask, causal, s);
    bool ok = cos_forward(&a, pn_ptr(out));
    free(s);
    if (!ok) return pn_error(PN_ERR_OOM, OP ": out of memory for the state of q %s, v %s", pn_shape_str(q), pn_shape_str(v));
    return PN_OK;
}

pn_status pn_cpu_cosine_bwd(const pn_tensor *q, const pn_tensor *k, const pn_tensor *v, const pn_tensor *m,
                            const pn_tensor *mask, int causal, const pn_tensor *g, pn_tensor *gq, pn_tensor *gk,
                            pn_tensor *gv, pn_tensor *gm) {
    const int64_t H = q->sizes[1];
    double *s = malloc(sizeof(double) * (size_t)(H > 0 ? H : 1)), *gm_bh = NULL;
    cos_args a;
    fill_args(&a, (pn_tensor *)q, (pn_tensor *)k, (pn_tensor *)v, (pn_tensor *)mask, causal, s);
    bool ok = s && (!gm || (gm_bh = calloc((size_t)(a.B * H > 0 ? a.B * H : 1), sizeof(double))));
    if (ok) {
        sigmoids(m, s);
        ok = cos_backward(&a, pn_ptr(g), gq ? pn_ptr(gq) : NULL, gk ? pn_ptr(gk) : NULL, gv ? pn_ptr(gv) : NULL, gm_bh);
    }
    if (ok && gm) { /* fixed-order sum over the batch: deterministic */
        for (int64_t h = 0; h < H; h++) {
            double acc = 0;
            for (int64_t b = 0; b < a.B; b++) acc += gm_bh[b * H + h];
            pn_st(pn_ptr(gm), gm->dt, h, acc * s[h] * (1 - s[h]));
        }
    }
    free(s);
    free(gm_bh);
    if (!ok) return pn_error(PN_ERR_OOM, OP ": backward out of memory for q %s, v %s", pn_shape_str(q), pn_shape_str(v));
    return PN_OK;
}

/* saved: q, k, v, m (contiguous), then key_mask when given; iv[0] = causal */
static pn_status cosine_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    pn_tensor *q = n->saved[0], *k = n->saved[1], *v = n->saved[2], *m = n->saved[3], *mask = n->saved[4];
    const int64_t H = q->sizes[1];
    pn_status st = PN_OK;
    pn_tensor *gc = pn_contig(g);
    pn_tensor *gq = NULL, *gk = NULL, *gv = NULL, *gm = NULL;
    if (!gc) goto oom;
    if (pn_ag_input_needs(n, 0) && !(gq = pn_empty_like(q))) goto oom;
    if (pn_ag_input_needs(n, 1) && !(gk = pn_empty_like(k))) goto oom;
    if (pn_ag_input_needs(n, 2) && !(gv = pn_empty_like(v))) goto oom;
    if (pn_ag_input_needs(n, 3) && !(gm = pn_empty(1, &H, m->dt, m->dev))) goto oom;
    st = PN_KCALL_ON(OP, q, cosine_bwd, q, k, v, m, mask, (int)n->iv[0], gc, gq, gk, gv, gm);
    if (st) goto cleanup;
    gin[0] = gq, gin[1] = gk, gin[2] = gv, gin[3] = gm;
    gq = gk = gv = gm = NULL;
    goto cleanup;
oom:
    st = pn_error(PN_ERR_OOM, OP ": backward out of memory for q %s, v %s", pn_shape_str(q), pn_shape_str(v));
cleanup:
    pn_release(gq), pn_release(gk), pn_release(gv), pn_release(gm), pn_release(gc);
    return st;
}

pn_tensor *pn_cosine_attention(pn_tensor *q, pn_tensor *k, pn_tensor *v, pn_tensor *m, int causal,
                               pn_tensor *key_mask) {
    if (pn_lin_check_qkv(OP, q, k, v)) return NULL;
    const int64_t B = q->sizes[0], H = q->sizes[1], N = q->sizes[2];
    if (!m) return pn_error_null(PN_ERR_ARG, OP ": m (one stabiliser per head, shape [%lld]) is required", (long long)H);
    int dev;
    const pn_kernels *kt;
    if (pn_kernels_for(OP, 5, (const pn_tensor *const[]){q, k, v, m, key_mask},
                       (const char *const[]){"q", "k", "v", "m", "key_mask"}, &dev, &kt))
        return NULL;
    if (m->dt != q->dt)
        return pn_error_null(PN_ERR_DTYPE, OP ": m %s %s must have the dtype of q (%s)", pn_dtype_name(m->dt),
                             pn_shape_str(m), pn_dtype_name(q->dt));
    if (m->nd != 1 || m->sizes[0] != H)
        return pn_error_null(PN_ERR_SHAPE, OP ": m %s must have shape [%lld] (one per head of q %s)", pn_shape_str(m),
                             (long long)H, pn_shape_str(q));
    if (key_mask) {
        if (key_mask->dt != PN_U8)
            return pn_error_null(PN_ERR_DTYPE, OP ": key_mask %s has dtype %s, expected u8", pn_shape_str(key_mask),
                                 pn_dtype_name(key_mask->dt));
        if (key_mask->nd != 2 || key_mask->sizes[0] != B || key_mask->sizes[1] != N)
            return pn_error_null(PN_ERR_SHAPE, OP ": key_mask %s must have shape [%lld,%lld] (B, N) for q %s",
                                 pn_shape_str(key_mask), (long long)B, (long long)N, pn_shape_str(q));
    }

    pn_tensor *qc = pn_contig(q), *kc = pn_contig(k), *vc = pn_contig(v), *mc = pn_contig(m);
    pn_tensor *maskc = key_mask ? pn_contig(key_mask) : NULL;
    pn_tensor *out = NULL;
    if (!qc || !kc || !vc || !mc || (key_mask && !maskc)) goto fail;
    int64_t shape[4] = {B, H, N, v->sizes[3]};
    if (!(out = pn_empty(4, shape, q->dt, dev))) goto fail;
    if (PN_KCALL(OP, kt, cosine_fwd, qc, kc, vc, mc, maskc, causal, out)) goto fail;
    pn_tensor *ins[4] = {q, k, v, m};
    if (pn_ag_needed(4, ins)) {
        pn_node *node = pn_ag_record(out, OP, cosine_bw, 4, ins);
        if (!node) goto fail;
        if (pn_ag_save(node, qc) || pn_ag_save(node, kc) || pn_ag_save(node, vc) || pn_ag_save(node, mc) ||
            (maskc && pn_ag_save(node, maskc)))
            goto fail;
        node->iv[0] = causal != 0;
    }
    goto done;
fail:
    pn_release(out);
    out = NULL;
done:
    pn_release(qc), pn_release(kc), pn_release(vc), pn_release(mc), pn_release(maskc);
    return out;
}

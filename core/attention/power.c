/* power.c — symmetric power attention (DESIGN §3.2; Buckman et al., "Improving Symmetric
 * Power Transformers with Conformal Transformations") and the embedding φᵖ, forward and
 * analytic backward.
 *
 *   B_ij = g_ij · (scale · q_i·k_j)^p      p even, so B_ij ≥ 0
 *   out_i = Σ_j B_ij v_j / Σ_j B_ij        over j ≤ i (causal) or all j
 *   g_ij = exp(Σ_{k=j+1..i} log_gate_k) = exp(L_i − L_j),  L_t = Σ_{k≤t} log_gate_k
 *
 * Without causality the gate is the same product over the positions strictly after the
 * earlier of i, j up to the later one: log g_ij = L_max(i,j) − L_min(i,j) (a symmetric decay
 * by distance, as ALiBi's bidirectional variant). A row whose scores are all zero (e.g.
 * q_i = 0) has no weights to normalise: its output is 0 (and so is its gradient), in
 * every form.
 *
 * Two parallel forms, which agree with each other and with the recurrent state
 * (lin_state.c):
 *  - quadratic (chunk = 0): row by row in log space, log B_ij = p·log|s_ij| + log g_ij,
 *    shifted by the row max before exp — no overflow for any p or gate. O(N²·D) per (b,h),
 *    O(N) scratch per row; never an N×N matrix.
 *  - chunked (chunk = c, causal only): inside a chunk the quadratic terms, across chunks
 *    the φᵖ state S = Σ_j g φ(k_j) v_jᵀ (D'×Dv) and z = Σ_j g φ(k_j) (D'), decayed by the
 *    gates; D' = C(D+p−1, p). O(N·c·D + N·D'·Dv) per (b,h), as f64 GEMMs per chunk (BLAS
 *    single-threaded inside our loop over (b,h)). Not in log space (like the recurrent
 *    state): scores (scale·q·k)^p must stay within the f64 range.
 * Both accumulate in f64 for f32 and f64 inputs. Backward is analytic for both; the
 * chunked backward recomputes the forward keeping the N/c chunk-boundary states (more
 * chunks, more memory: the usual trade-off) and then runs the state recursion in reverse. */
#include "linear.h"

#define OP "power_attention"

/* ---- φᵖ: the symmetric power embedding ------------------------------------------------- */
pn_status pn_sympow_dim(const char *op, int64_t D, int p, int64_t *out) {
    if (p < 1 || p > PN_SYMPOW_MAX_P)
        return pn_error(PN_ERR_ARG, "%s: power p = %d out of range [1, %d]", op, p, PN_SYMPOW_MAX_P);
    if (D < 1) return pn_error(PN_ERR_SHAPE, "%s: feature dim D = %lld must be at least 1", op, (long long)D);
    int64_t c = 1; /* C(D−1+i, i) for i = 1..p, exact at every step */
    for (int i = 1; i <= p; i++) {
        int64_t f = D - 1 + i;
        if (c > INT64_MAX / f || c * f / i > PN_SYMPOW_MAX_DIM)
            return pn_error(PN_ERR_ARG, "%s: the symmetric power dim C(D+p-1, p) for D = %lld, p = %d exceeds %lld", op,
                            (long long)D, p, (long long)PN_SYMPOW_MAX_DIM);
        c = c * f / i;
    }
    *out = c;
    return PN_OK;
}

void pn_sympow_table_free(pn_sympow_table *t) {
    if (!t) return;
    free(t->idx);
    free(t->w);
    free(t);
}

pn_sympow_table *pn_sympow_table_new(const char *op, int64_t D, int p) {
    int64_t Dp;
    if (pn_sympow_dim(op, D, p, &Dp)) return NULL;
    pn_sympow_table *t = calloc(1, sizeof *t);
    if (t) {
        t->idx = malloc(sizeof(int32_t) * (size_t)(Dp * p));
        t->w = malloc(sizeof(double) * (size_t)Dp);
    }
    if (!t || !t->idx || !t->w) {
        pn_sympow_table_free(t);
        return pn_error_null(PN_ERR_OOM, "%s: out of memory for the symmetric power table (D = %lld, p = %d)", op,
                             (long long)D, p);
    }
    t->D = D, t->p = p, t->Dp = Dp;
    double fact[PN_SYMPOW_MAX_P + 1];
    fact[0] = 1;
    for (int i = 1; i <= p; i++) fact[i] = fact[i - 1] * i;
    int32_t cur[PN_SYMPOW_MAX_P] = {0}; /* the multiset i_1 ≤ … ≤ i_p, lexicographic */
    for (int64_t a = 0; a < Dp; a++) {
        memcpy(t->idx + a * p, cur, sizeof(int32_t) * (size_t)p);
        double denom = 1;
        for (int r = 0, run = 1; r < p; r++, run++) { /* Π m_d! from the runs of equal indices */
            if (r + 1 == p || cur[r + 1] != cur[r]) {
                denom *= fact[run];
                run = 0;
            }
        }
        t->w[a] = sqrt(fact[p] / denom);
        int r = p - 1; /* next multiset: bump the last index below D−1, copy it rightwards */
        while (r >= 0 && cur[r] == D - 1) r--;
        if (r < 0) break;
        cur[r]++;
        for (int s = r + 1; s < p; s++) cur[s] = cur[r];
    }
    return t;
}

void pn_sympow_apply(const pn_sympow_table *t, const double *x, double *phi) {
    sympow_apply_raw(t->D, t->p, t->Dp, t->idx, t->w, x, phi);
}

void pn_sympow_grad(const pn_sympow_table *t, const double *x, const double *gphi, double *gx) {
    sympow_grad_raw(t->D, t->p, t->Dp, t->idx, t->w, x, gphi, gx);
}

/* node extra: the table; saved[0] = x (contiguous) */
static pn_status sympow_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    pn_tensor *x = n->saved[0];
    pn_tensor *gc = pn_contig(g);
    pn_tensor *gx = gc ? pn_empty_like(x) : NULL;
    pn_status st = gx ? PN_KCALL_ON("sympow_embed", x, sympow_bwd, n->extra, x, gc, gx)
                      : pn_error(PN_ERR_OOM, "sympow_embed: backward out of memory for x %s", pn_shape_str(x));
    return pn_bw_result(st, gc, gx, &gin[0]);
}

/* CPU kernels: x, out, g, gx contiguous, rows of D (x) and Dp (out, g) */
pn_status pn_cpu_sympow_bwd(const pn_sympow_table *t, const pn_tensor *x, const pn_tensor *gc, pn_tensor *gx) {
    const int64_t D = t->D, Dp = t->Dp, R = pn_numel(x) / D;
    int oom = 0;
    #pragma omp parallel if (R * Dp * t->p > PN_PAR_MIN)
    {
        double *buf = malloc(sizeof(double) * (size_t)(2 * D + Dp));
        if (!buf) {
            #pragma omp atomic write
            oom = 1;
        }
        #pragma omp for schedule(static)
        for (int64_t r = 0; r < R; r++) {
            if (!buf) continue;
            double *xr = buf, *gr = buf + D, *gp = buf + 2 * D;
            ld_row(pn_ptr(x), x->dt, r * D, D, xr);
            ld_row(pn_ptr(gc), gc->dt, r * Dp, Dp, gp);
            memset(gr, 0, sizeof(double) * (size_t)D);
            pn_sympow_grad(t, xr, gp, gr);
            st_row(pn_ptr(gx), gx->dt, r * D, D, gr);
        }
        free(buf);
    }
    if (oom) return pn_error(PN_ERR_OOM, "sympow_embed: backward out of memory");
    return PN_OK;
}

static void free_table(void *t) { pn_sympow_table_free(t); }

pn_tensor *pn_sympow_embed(pn_tensor *x, int p) {
    const char *op = "sympow_embed";
    if (!x) return pn_error_null(PN_ERR_ARG, "%s: x is nil", op);
    const pn_kernels *kt;
    if (pn_backend_for(op, x->dev, &kt) || pn_check_float(op, "x", x)) return NULL;
    if (x->nd < 1) return pn_error_null(PN_ERR_SHAPE, "%s: x %s must have at least 1 dim (…, D)", op, pn_shape_str(x));
    int64_t Dp, D = x->sizes[x->nd - 1];
    if (pn_sympow_dim(op, D, p, &Dp)) return NULL;
    int64_t shape[PN_MAX_DIMS];
    memcpy(shape, x->sizes, sizeof shape);
    shape[x->nd - 1] = Dp;
    pn_sympow_table *t = pn_sympow_table_new(op, D, p);
    pn_tensor *xc = t ? pn_contig(x) : NULL;
    pn_tensor *out = xc ? pn_empty(x->nd, shape, x->dt, x->dev) : NULL;
    if (!out || PN_KCALL(op, kt, sympow_fwd, t, xc, out)) goto fail;
    if (pn_ag_needed(1, &x)) {
        pn_node *n = pn_ag_record(out, op, sympow_bw, 1, &x);
        if (!n) goto fail;
        if (pn_ag_save(n, xc)) goto fail;
        n->extra = t;
        n->free_extra = free_table;
        t = NULL;
    }
    pn_release(xc);
    pn_sympow_table_free(t);
    return out;
fail:
    pn_release(out);
    pn_release(xc);
    pn_sympow_table_free(t);
    return NULL;
}

pn_status pn_cpu_sympow_fwd(const pn_sympow_table *t, const pn_tensor *xc, pn_tensor *out) {
    const int64_t D = t->D, Dp = t->Dp, p = t->p, R = pn_numel(xc) / D;
    int oom = 0;
    #pragma omp parallel if (R * Dp * p > PN_PAR_MIN)
    {
        double *buf = malloc(sizeof(double) * (size_t)(D + Dp));
        if (!buf) {
            #pragma omp atomic write
            oom = 1;
        }
        #pragma omp for schedule(static)
        for (int64_t r = 0; r < R; r++) {
            if (!buf) continue;
            ld_row(pn_ptr(xc), xc->dt, r * D, D, buf);
            pn_sympow_apply(t, buf, buf + D);
            st_row(pn_ptr(out), out->dt, r * Dp, Dp, buf + D);
        }
        free(buf);
    }
    if (oom) return pn_error(PN_ERR_OOM, "sympow_embed: out of memory");
    return PN_OK;
}

/* ---- power attention: shared per-(b, h) data -------------------------------------------- */
typedef struct {
    int64_t B, H, N, D, Dv, c; /* c: chunk size, 0 = quadratic */
    int dt, p, causal;
    double scale;
    const void *q, *k, *v;     /* (B, H, N, D), (B, H, N, D), (B, H, N, Dv) */
    const void *lg;            /* (B, H, N) log gates, or NULL */
    const pn_sympow_table *tab; /* chunked form only */
} pw_args;

/* One (b, h) pair loaded into f64: qs = scale·q (N, D), k (N, D), v (N, Dv), L (N) the
 * cumulative log gates (zeros without gates). */
typedef struct {
    double *qs, *k, *v, *L;
} pw_rows;

static double *pw_load(const pw_args *a, int64_t bh, pw_rows *r, size_t extra) {
    const int64_t N = a->N, D = a->D, Dv = a->Dv;
    double *buf = calloc((size_t)(2 * N * D + N * Dv + N) + extra, sizeof(double));
    if (!buf) return NULL;
    r->qs = buf, r->k = buf + N * D, r->v = r->k + N * D, r->L = r->v + N * Dv;
    ld_row(a->q, a->dt, bh * N * D, N * D, r->qs);
    for (int64_t i = 0; i < N * D; i++) r->qs[i] *= a->scale;
    ld_row(a->k, a->dt, bh * N * D, N * D, r->k);
    ld_row(a->v, a->dt, bh * N * Dv, N * Dv, r->v);
    if (a->lg) {
        ld_row(a->lg, a->dt, bh * N, N, r->L);
        for (int64_t t = 1; t < N; t++) r->L[t] += r->L[t - 1];
    }
    return buf;
}

/* log g_ij: log_gate (linear_math.h) */

/* Row i of the quadratic form: lb (N) ← log B_ij for the attended j (−inf for a zero
 * score); returns the row max (−inf when every score is zero) and *jend = last j + 1. */
static double quad_row(const pw_args *a, const pw_rows *r, int64_t i, double *lb, int64_t *jend) {
    const int64_t D = a->D, n = a->causal ? i + 1 : a->N;
    double mx = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        double s = dotd(r->qs + i * D, r->k + j * D, D);
        lb[j] = s == 0 ? -INFINITY : a->p * log(fabs(s)) + log_gate(r->L, i, j);
        if (lb[j] > mx) mx = lb[j];
    }
    *jend = n;
    return mx;
}

/* ---- quadratic form ------------------------------------------------------------------------ */
static bool quad_forward(const pw_args *a, void *out) {
    const int64_t N = a->N, Dv = a->Dv, BH = a->B * a->H;
    int oom = 0;
    #pragma omp parallel for schedule(static) if (BH * N * N * a->D > PN_PAR_MIN)
    for (int64_t bh = 0; bh < BH; bh++) {
        pw_rows r;
        double *buf = pw_load(a, bh, &r, (size_t)(N + Dv));
        if (!buf) {
            #pragma omp atomic write
            oom = 1;
            continue;
        }
        double *lb = r.L + N, *o = lb + N;
        for (int64_t i = 0; i < N; i++) {
            int64_t n;
            double mx = quad_row(a, &r, i, lb, &n);
            memset(o, 0, sizeof(double) * (size_t)Dv);
            if (mx > -INFINITY) {
                double Z = 0;
                for (int64_t j = 0; j < n; j++) {
                    double w = exp(lb[j] - mx);
                    Z += w;
                    for (int64_t e = 0; e < Dv; e++) o[e] += w * r.v[j * Dv + e];
                }
                for (int64_t e = 0; e < Dv; e++) o[e] /= Z;
            }
            st_row(out, a->dt, (bh * N + i) * Dv, Dv, o);
        }
        free(buf);
    }
    return !oom;
}

/* Gradients of one (b, h) pair, accumulated in f64 and stored at the end.
 * gq, gk (N, D), gv (N, Dv), gL (N): the slice of buf after the loaded rows. */
typedef struct {
    double *gq, *gk, *gv, *gL, *g;
} pw_grads;

static void pw_grads_init(const pw_args *a, const void *g, int64_t bh, double *at, pw_grads *G) {
    const int64_t N = a->N, D = a->D, Dv = a->Dv;
    G->gq = at, G->gk = at + N * D, G->gv = G->gk + N * D, G->gL = G->gv + N * Dv, G->g = G->gL + N;
    ld_row(g, a->dt, bh * N * Dv, N * Dv, G->g);
}
static size_t pw_grads_size(const pw_args *a) { return (size_t)(2 * a->N * a->D + 2 * a->N * a->Dv + a->N); }

/* Store the gradients of one (b, h) pair: gq = scale·g(qs); glg_k = Σ_{t ≥ k} gL_t. */
static void pw_grads_store(const pw_args *a, int64_t bh, pw_grads *G, void *gq, void *gk, void *gv, void *glg) {
    const int64_t N = a->N, D = a->D, Dv = a->Dv;
    if (gq) {
        for (int64_t i = 0; i < N * D; i++) G->gq[i] *= a->scale;
        st_row(gq, a->dt, bh * N * D, N * D, G->gq);
    }
    if (gk) st_row(gk, a->dt, bh * N * D, N * D, G->gk);
    if (gv) st_row(gv, a->dt, bh * N * Dv, N * Dv, G->gv);
    if (glg) {
        for (int64_t t = N - 2; t >= 0; t--) G->gL[t] += G->gL[t + 1];
        st_row(glg, a->dt, bh * N, N, G->gL);
    }
}

/* Per row i, with A_ij = B_ij/Σ_l B_il and out_i = Σ_j A_ij v_j:
 *   ∂log B_ij = A_ij (g_i·v_j − g_i·out_i)
 *   g v_j += A_ij g_i;   ∂s_ij = p ∂log B_ij / s_ij;   g qs_i += ∂s_ij k_j, g k_j += ∂s_ij qs_i
 *   log g_ij = L_later − L_earlier:  g L_later += ∂log B_ij, g L_earlier −= ∂log B_ij */
static bool quad_backward(const pw_args *a, const void *g, void *gq, void *gk, void *gv, void *glg) {
    const int64_t N = a->N, D = a->D, Dv = a->Dv, BH = a->B * a->H;
    int oom = 0;
    #pragma omp parallel for schedule(static) if (BH * N * N * a->D > PN_PAR_MIN)
    for (int64_t bh = 0; bh < BH; bh++) {
        pw_rows r;
        double *buf = pw_load(a, bh, &r, (size_t)(N + Dv) + pw_grads_size(a));
        if (!buf) {
            #pragma omp atomic write
            oom = 1;
            continue;
        }
        double *lb = r.L + N, *o = lb + N;
        pw_grads G;
        pw_grads_init(a, g, bh, o + Dv, &G);
        for (int64_t i = 0; i < N; i++) {
            int64_t n;
            double mx = quad_row(a, &r, i, lb, &n);
            if (mx == -INFINITY) continue; /* an all-zero row: output 0, no gradient */
            const double *gi = G.g + i * Dv, *qi = r.qs + i * D;
            double Z = 0;
            for (int64_t j = 0; j < n; j++) Z += (lb[j] = exp(lb[j] - mx));
            memset(o, 0, sizeof(double) * (size_t)Dv);
            for (int64_t j = 0; j < n; j++) {
                lb[j] /= Z; /* now A_ij */
                for (int64_t e = 0; e < Dv; e++) o[e] += lb[j] * r.v[j * Dv + e];
            }
            const double go = dotd(gi, o, Dv);
            for (int64_t j = 0; j < n; j++) {
                const double A = lb[j];
                if (A == 0) continue;
                const double *kj = r.k + j * D;
                const double dlb = A * (dotd(gi, r.v + j * Dv, Dv) - go);
                for (int64_t e = 0; e < Dv; e++) G.gv[j * Dv + e] += A * gi[e];
                const double ds = a->p * dlb / dotd(qi, kj, D); /* A ≠ 0 ⇒ s ≠ 0 */
                for (int64_t d = 0; d < D; d++) {
                    G.gq[i * D + d] += ds * kj[d];
                    G.gk[j * D + d] += ds * qi[d];
                }
                int64_t later = i >= j ? i : j, earlier = i >= j ? j : i;
                G.gL[later] += dlb;
                G.gL[earlier] -= dlb;
            }
        }
        pw_grads_store(a, bh, &G, gq, gk, gv, glg);
        free(buf);
    }
    return !oom;
}

/* ---- chunked form ---------------------------------------------------------------------------- */
/* Per chunk of c rows (qs, k, v of the chunk; S, z the state entering it), as GEMMs:
 *   T = E ⊙ (Qs Kᵀ)^p ⊙ tril, E_ij = exp(L_i − L_j)          (intra-chunk weights)
 *   Φq_e = diag(e) φ(Qs), e_i = exp(L_i − L_{s0−1})          (inter-chunk: the state)
 *   num = T V + Φq_e S,  den = T·1 + Φq_e z,  out = num / den
 *   S ← decay·S + (diag(f) φ(K))ᵀ V, z likewise, decay = exp(L_{s1−1} − L_{s0−1}),
 *   f_j = exp(L_{s1−1} − L_j).
 * Everything in f64 (the rows were loaded into f64 by pw_load). */

/* C (m, n) = A (m, k) · B, with A stored transposed (k, m) when ta, B stored (n, k) when tb */
static inline void pw_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double *A, const double *B,
                           double beta, double *Cm) {
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (blasint)m, (blasint)n,
                (blasint)k, 1.0, A, (blasint)(ta ? m : k), B, (blasint)(tb ? k : n), beta, Cm, (blasint)n);
}

/* Ph (c, D') ← w_i φ(x_i) for the c rows x (c, D) starting at row s0, with w_i = exp(L_i − Lref)
 * (sign = +1, the queries' e_i) or exp(Lref − L_i) (sign = −1, the keys' f_j) */
static void chunk_phi(const pw_args *a, const double *x, const double *L, int64_t s0, double Lref, int sign, double *Ph) {
    const int64_t c = a->c, D = a->D, Dp = a->tab->Dp;
    for (int64_t i = 0; i < c; i++) {
        double *row = Ph + i * Dp;
        pn_sympow_apply(a->tab, x + (s0 + i) * D, row);
        const double w = exp(sign * (L[s0 + i] - Lref));
        if (w != 1)
            for (int64_t d = 0; d < Dp; d++) row[d] *= w;
    }
}

/* Rows [s0, s0 + c): out (c, Dv) ← num/den (0 where den = 0), den (c) kept. S, z: the state
 * entering the chunk (ignored for the first chunk). Ph (c, D'), T (c, c) scratch. */
static void chunk_rows(const pw_args *a, const pw_rows *r, int64_t s0, const double *S, const double *z, double *Ph,
                       double *T, double *out, double *den) {
    const int64_t c = a->c, D = a->D, Dv = a->Dv, Dp = a->tab->Dp;
    const double *L = r->L;
    pw_gemm(false, true, c, c, D, r->qs + s0 * D, r->k + s0 * D, 0, T); /* s_ij */
    for (int64_t i = 0; i < c; i++) {
        double *Ti = T + i * c, sum = 0;
        for (int64_t j = 0; j <= i; j++) sum += (Ti[j] = exp(L[s0 + i] - L[s0 + j]) * ipow(Ti[j], a->p));
        for (int64_t j = i + 1; j < c; j++) Ti[j] = 0;
        den[i] = sum;
    }
    pw_gemm(false, false, c, Dv, c, T, r->v + s0 * Dv, 0, out); /* T V */
    if (s0 > 0) {
        chunk_phi(a, r->qs, L, s0, L[s0 - 1], +1, Ph);
        pw_gemm(false, false, c, Dv, Dp, Ph, S, 1, out); /* + Φq_e S */
        for (int64_t i = 0; i < c; i++) den[i] += dotd(Ph + i * Dp, z, Dp);
    }
    for (int64_t i = 0; i < c; i++) {
        const double inv = den[i] != 0 ? 1.0 / den[i] : 0;
        for (int64_t x = 0; x < Dv; x++) out[i * Dv + x] *= inv;
    }
}

/* The state after chunk [s0, s0 + c): S ← decay·S + (diag(f) φ(K))ᵀ V, z ← decay·z + Σ_j f_j φ(k_j) */
static void chunk_advance(const pw_args *a, const pw_rows *r, int64_t s0, double *S, double *z, double *Ph) {
    const int64_t c = a->c, Dv = a->Dv, Dp = a->tab->Dp;
    const double Le = r->L[s0 + c - 1], decay = exp(Le - (s0 > 0 ? r->L[s0 - 1] : 0));
    chunk_phi(a, r->k, r->L, s0, Le, -1, Ph);
    pw_gemm(true, false, Dp, Dv, c, Ph, r->v + s0 * Dv, decay, S);
    for (int64_t d = 0; d < Dp; d++) z[d] *= decay;
    for (int64_t j = 0; j < c; j++)
        for (int64_t d = 0; d < Dp; d++) z[d] += Ph[j * Dp + d];
}

static bool chunk_forward(const pw_args *a, void *out) {
    const int64_t N = a->N, Dv = a->Dv, BH = a->B * a->H, c = a->c, Dp = a->tab->Dp;
    int oom = 0;
    #pragma omp parallel for schedule(static) if (BH > 1 && BH * N * (c * a->D + Dp * Dv) > PN_PAR_MIN)
    for (int64_t bh = 0; bh < BH; bh++) {
        pw_rows r;
        double *buf = pw_load(a, bh, &r, (size_t)(Dp * Dv + Dp + c * Dp + c * c + c * Dv + c));
        if (!buf) {
            #pragma omp atomic write
            oom = 1;
            continue;
        }
        double *S = r.L + N, *z = S + Dp * Dv, *Ph = z + Dp, *T = Ph + c * Dp, *o = T + c * c, *den = o + c * Dv;
        for (int64_t s0 = 0; s0 < N; s0 += c) {
            chunk_rows(a, &r, s0, S, z, Ph, T, o, den);
            st_row(out, a->dt, (bh * N + s0) * Dv, c * Dv, o);
            if (s0 + c < N) chunk_advance(a, &r, s0, S, z, Ph);
        }
        free(buf);
    }
    return !oom;
}

/* With G_i = g_i/den_i (∂num_i) and gd_i = −g_i·out_i/den_i (∂den_i), over the chunks in
 * reverse, ∂S, ∂z the gradient wrt the state leaving the chunk:
 *  state update (S_next = decay·S + Σ_j f_j φ(k_j) v_jᵀ, z likewise):
 *    t_j = ∂S v_j + ∂z;  g φ(k_j) = f_j t_j;  ∂log f_j = f_j φ(k_j)·t_j;  g V += diag(f) φ(K) ∂S;
 *    ∂log decay = decay (∂S·S + ∂z·z);  then ∂S, ∂z ← decay·∂S, decay·∂z
 *  inter part of the rows (num_i += e_i φ(qs_i)ᵀ S, den_i += e_i φ(qs_i)·z):
 *    SG_i = S G_i + z gd_i;  g φ(qs_i) = e_i SG_i;  ∂log e_i = e_i φ(qs_i)·SG_i;
 *    ∂S += Φq_eᵀ G, ∂z += Φq_eᵀ gd
 *  intra part (T_ij = E_ij s_ij^p): dT = G Vᵀ + gd 1ᵀ;  g V += Tᵀ G;
 *    ds_ij = dT_ij E_ij p s_ij^{p−1};  g Qs += ds K, g K += dsᵀ Qs;  ∂log E_ij = dT_ij T_ij
 *  log weights are differences of L, so each ∂log w adds to g L at the later index and
 *  subtracts at the earlier one. The forward runs again first, keeping the state entering
 *  every chunk (N/c of them: more chunks, more memory). */
static bool chunk_backward(const pw_args *a, const void *g, void *gq, void *gk, void *gv, void *glg) {
    const int64_t N = a->N, D = a->D, Dv = a->Dv, BH = a->B * a->H, c = a->c, Dp = a->tab->Dp, nc = N / c;
    int oom = 0;
    #pragma omp parallel for schedule(static) if (BH > 1 && BH * N * (c * D + Dp * Dv) > PN_PAR_MIN)
    for (int64_t bh = 0; bh < BH; bh++) {
        pw_rows r;
        /* states entering each chunk (nc·(D'Dv + D')), ∂S, ∂z, den (N), out (N, Dv), Φ and g Φ
         * (c, D') each, P and A (c, c) each, grads */
        size_t extra = (size_t)(nc * (Dp * Dv + Dp) + Dp * Dv + Dp + N + N * Dv + 2 * c * Dp + 2 * c * c) +
                       pw_grads_size(a);
        double *buf = pw_load(a, bh, &r, extra);
        if (!buf) {
            #pragma omp atomic write
            oom = 1;
            continue;
        }
        double *Ss = r.L + N, *zs = Ss + nc * Dp * Dv, *dS = zs + nc * Dp, *dz = dS + Dp * Dv, *den = dz + Dp,
               *out = den + N, *Ph = out + N * Dv, *gPh = Ph + c * Dp, *P = gPh + c * Dp, *A = P + c * c;
        pw_grads G;
        pw_grads_init(a, g, bh, A + c * c, &G);
        const double *L = r.L;

        /* forward again, keeping the state entering every chunk */
        for (int64_t ci = 0; ci < nc; ci++) {
            double *S = Ss + ci * Dp * Dv, *z = zs + ci * Dp;
            if (ci > 0) {
                memcpy(S, S - Dp * Dv, sizeof(double) * (size_t)(Dp * Dv));
                memcpy(z, z - Dp, sizeof(double) * (size_t)Dp);
                chunk_advance(a, &r, (ci - 1) * c, S, z, Ph);
            }
            chunk_rows(a, &r, ci * c, S, z, Ph, P, out + ci * c * Dv, den + ci * c);
        }
        /* G_i, gd_i in place: g ← g/den, den ← −g·out/den */
        for (int64_t i = 0; i < N; i++) {
            double *gi = G.g + i * Dv;
            if (den[i] == 0) {
                memset(gi, 0, sizeof(double) * (size_t)Dv);
                continue;
            }
            const double inv = 1.0 / den[i];
            den[i] = -dotd(gi, out + i * Dv, Dv) * inv;
            for (int64_t x = 0; x < Dv; x++) gi[x] *= inv;
        }
        const double *gd = den;

        for (int64_t ci = nc - 1; ci >= 0; ci--) {
            const int64_t s0 = ci * c, s1 = s0 + c;
            const double Lp = s0 > 0 ? L[s0 - 1] : 0, Le = L[s1 - 1];
            const double *S = Ss + ci * Dp * Dv, *z = zs + ci * Dp;
            const double *Qs = r.qs + s0 * D, *Kc = r.k + s0 * D, *Vc = r.v + s0 * Dv, *Gc = G.g + s0 * Dv;
            if (ci < nc - 1) { /* the update that produced the state leaving this chunk */
                for (int64_t j = 0; j < c; j++) pn_sympow_apply(a->tab, r.k + (s0 + j) * D, Ph + j * Dp); /* φ(k_j) */
                pw_gemm(false, true, c, Dp, Dv, Vc, dS, 0, gPh); /* t = V ∂Sᵀ */
                for (int64_t j = 0; j < c; j++) {
                    double *t = gPh + j * Dp, *ph = Ph + j * Dp;
                    const double f = exp(Le - L[s0 + j]);
                    double gf = 0;
                    for (int64_t d = 0; d < Dp; d++) {
                        t[d] = f * (t[d] + dz[d]);
                        gf += ph[d] * t[d];
                        ph[d] *= f;
                    }
                    G.gL[s1 - 1] += gf;
                    G.gL[s0 + j] -= gf;
                    pn_sympow_grad(a->tab, r.k + (s0 + j) * D, t, G.gk + (s0 + j) * D);
                }
                pw_gemm(false, false, c, Dv, Dp, Ph, dS, 1, G.gv + s0 * Dv); /* g V += diag(f) φ(K) ∂S */
                const double decay = exp(Le - Lp);
                if (ci > 0) {
                    const double gdec = decay * (dotd(dS, S, Dp * Dv) + dotd(dz, z, Dp));
                    G.gL[s1 - 1] += gdec;
                    G.gL[s0 - 1] -= gdec;
                }
                for (int64_t i = 0; i < Dp * Dv; i++) dS[i] *= decay;
                for (int64_t i = 0; i < Dp; i++) dz[i] *= decay;
            }
            if (ci > 0) { /* inter-chunk: the state entering the chunk */
                chunk_phi(a, r.qs, L, s0, Lp, +1, Ph);               /* Φq_e */
                pw_gemm(false, true, c, Dp, Dv, Gc, S, 0, gPh);       /* S G_i, as rows */
                for (int64_t i = 0; i < c; i++) {
                    double *sg = gPh + i * Dp;
                    const double *ph = Ph + i * Dp;
                    const double e = exp(L[s0 + i] - Lp), gdi = gd[s0 + i];
                    double ge = 0;
                    for (int64_t d = 0; d < Dp; d++) {
                        sg[d] += z[d] * gdi;
                        ge += ph[d] * sg[d];
                        sg[d] *= e;
                        dz[d] += ph[d] * gdi;
                    }
                    G.gL[s0 + i] += ge;
                    G.gL[s0 - 1] -= ge;
                    pn_sympow_grad(a->tab, Qs + i * D, sg, G.gq + (s0 + i) * D);
                }
                pw_gemm(true, false, Dp, Dv, c, Ph, Gc, 1, dS); /* ∂S += Φq_eᵀ G */
            }
            /* intra-chunk */
            pw_gemm(false, true, c, c, D, Qs, Kc, 0, P); /* s_ij */
            pw_gemm(false, true, c, c, Dv, Gc, Vc, 0, A); /* G_i·v_j */
            for (int64_t i = 0; i < c; i++) {
                double *Pi = P + i * c, *Ai = A + i * c;
                const double gdi = gd[s0 + i];
                for (int64_t j = 0; j <= i; j++) {
                    const double E = exp(L[s0 + i] - L[s0 + j]), s = Pi[j], sp1 = ipow(s, a->p - 1);
                    const double T = E * sp1 * s, dT = Ai[j] + gdi;
                    G.gL[s0 + i] += dT * T;
                    G.gL[s0 + j] -= dT * T;
                    Pi[j] = T;
                    Ai[j] = dT * E * a->p * sp1;
                }
                for (int64_t j = i + 1; j < c; j++) Pi[j] = Ai[j] = 0;
            }
            pw_gemm(true, false, c, Dv, c, P, Gc, 1, G.gv + s0 * Dv); /* g V += Tᵀ G */
            pw_gemm(false, false, c, D, c, A, Kc, 1, G.gq + s0 * D); /* g Qs += ds K */
            pw_gemm(true, false, c, D, c, A, Qs, 1, G.gk + s0 * D);  /* g K += dsᵀ Qs */
        }
        pw_grads_store(a, bh, &G, gq, gk, gv, glg);
        free(buf);
    }
    return !oom;
}

/* ---- entry point -------------------------------------------------------------------------------- */
static void fill_args(pw_args *a, pn_tensor *q, pn_tensor *k, pn_tensor *v, pn_tensor *lg, int p, int causal,
                      int64_t chunk, double scale, const pn_sympow_table *tab) {
    a->B = q->sizes[0], a->H = q->sizes[1], a->N = q->sizes[2], a->D = q->sizes[3], a->Dv = v->sizes[3];
    a->c = chunk, a->dt = q->dt, a->p = p, a->causal = causal != 0, a->scale = scale;
    a->q = pn_ptr(q), a->k = pn_ptr(k), a->v = pn_ptr(v), a->lg = lg ? pn_ptr(lg) : NULL;
    a->tab = tab;
}

/* saved: q, k, v (contiguous), log_gate when given; iv: p, causal, chunk; sc[0] = scale;
 * extra: the φ table (chunked form) */
static pn_status power_bw(pn_node *n, pn_tensor *g, pn_tensor **gin) {
    pn_tensor *q = n->saved[0], *k = n->saved[1], *v = n->saved[2], *lg = n->saved[3];
    pn_tensor *gc = pn_contig(g), *gq = NULL, *gk = NULL, *gv = NULL, *glg = NULL;
    if (!gc) goto oom;
    if (pn_ag_input_needs(n, 0) && !(gq = pn_empty_like(q))) goto oom;
    if (pn_ag_input_needs(n, 1) && !(gk = pn_empty_like(k))) goto oom;
    if (pn_ag_input_needs(n, 2) && !(gv = pn_empty_like(v))) goto oom;
    if (lg && pn_ag_input_needs(n, 3) && !(glg = pn_empty_like(lg))) goto oom;
    pn_status st = PN_KCALL_ON(OP, q, power_bwd, q, k, v, lg, (int)n->iv[0], (int)n->iv[1], n->iv[2], n->sc[0],
                               n->extra, gc, gq, gk, gv, glg);
    pn_release(gc);
    if (st) {
        pn_release(gq), pn_release(gk), pn_release(gv), pn_release(glg);
        return st;
    }
    gin[0] = gq, gin[1] = gk, gin[2] = gv, gin[3] = glg;
    return PN_OK;
oom:
    pn_release(gc), pn_release(gq), pn_release(gk), pn_release(gv), pn_release(glg);
    return pn_error(PN_ERR_OOM, OP ": backward out of memory for q %s, v %s", pn_shape_str(q), pn_shape_str(v));
}

/* CPU kernels: q, k (B, H, N, D), v, out, g (B, H, N, Dv), lg (B, H, N) or NULL, contiguous;
 * tab the φ table of the chunked form (chunk > 0); the backward writes each of gq, gk, gv,
 * glg not NULL */
pn_status pn_cpu_power_bwd(const pn_tensor *q, const pn_tensor *k, const pn_tensor *v, const pn_tensor *lg, int p,
                           int causal, int64_t chunk, double scale, const pn_sympow_table *tab, const pn_tensor *g,
                           pn_tensor *gq, pn_tensor *gk, pn_tensor *gv, pn_tensor *glg) {
    pw_args a;
    fill_args(&a, (pn_tensor *)q, (pn_tensor *)k, (pn_tensor *)v, (pn_tensor *)lg, p, causal, chunk, scale, tab);
    void *pq = gq ? pn_ptr(gq) : NULL, *pk = gk ? pn_ptr(gk) : NULL, *pv = gv ? pn_ptr(gv) : NULL,
         *pl = glg ? pn_ptr(glg) : NULL;
    bool ok;
    if (a.c) {
        PN_BLAS_SERIAL_BEGIN;
        ok = chunk_backward(&a, pn_ptr(g), pq, pk, pv, pl);
        PN_BLAS_SERIAL_END;
    } else {
        ok = quad_backward(&a, pn_ptr(g), pq, pk, pv, pl);
    }
    if (!ok) return pn_error(PN_ERR_OOM, OP ": backward out of memory for q %s, v %s", pn_shape_str(q), pn_shape_str(v));
    return PN_OK;
}

pn_status pn_cpu_power_fwd(const pn_tensor *q, const pn_tensor *k, const pn_tensor *v, const pn_tensor *lg, int p,
                           int causal, int64_t chunk, double scale, const pn_sympow_table *tab, pn_tensor *out) {
    pw_args a;
    fill_args(&a, (pn_tensor *)q, (pn_tensor *)k, (pn_tensor *)v, (pn_tensor *)lg, p, causal, chunk, scale, tab);
    bool ok;
    if (chunk) {
        PN_BLAS_SERIAL_BEGIN;
        ok = chunk_forward(&a, pn_ptr(out));
        PN_BLAS_SERIAL_END;
    } else {
        ok = quad_forward(&a, pn_ptr(out));
    }
    if (!ok) return pn_error(PN_ERR_OOM, OP ": out of memory for q %s, v %s", pn_shape_str(q), pn_shape_str(v));
    return PN_OK;
}

pn_tensor *pn_power_attention(pn_tensor *q, pn_tensor *k, pn_tensor *v, int p, int causal, pn_tensor *log_gate,
                              int64_t chunk, double scale) {
    if (pn_lin_check_qkv(OP, q, k, v)) return NULL;
    const int64_t B = q->sizes[0], H = q->sizes[1], N = q->sizes[2];
    if (p < 2 || p % 2 || p > PN_SYMPOW_MAX_P)
        return pn_error_null(PN_ERR_ARG, OP ": p = %d must be even and in [2, %d] (q %s)", p, PN_SYMPOW_MAX_P,
                             pn_shape_str(q));
    if (isnan(scale)) scale = 1;
    if (!isfinite(scale)) return pn_error_null(PN_ERR_ARG, OP ": scale %g is not finite", scale);
    if (chunk < 0) return pn_error_null(PN_ERR_ARG, OP ": chunk = %lld must be >= 0 (0 = quadratic form)", (long long)chunk);
    if (chunk > 0 && N % chunk)
        return pn_error_null(PN_ERR_SHAPE, OP ": chunk = %lld does not divide the sequence length N = %lld of q %s",
                             (long long)chunk, (long long)N, pn_shape_str(q));
    if (chunk > 0 && !causal)
        return pn_error_null(PN_ERR_ARG, OP ": the chunked form (chunk = %lld) is causal only; use chunk = 0 with causal = false",
                             (long long)chunk);
    int dev;
    const pn_kernels *kt;
    if (pn_kernels_for(OP, 4, (const pn_tensor *const[]){q, k, v, log_gate},
                       (const char *const[]){"q", "k", "v", "log_gate"}, &dev, &kt))
        return NULL;
    if (log_gate) {
        if (log_gate->dt != q->dt)
            return pn_error_null(PN_ERR_DTYPE, OP ": log_gate %s %s must have the dtype of q (%s)",
                                 pn_dtype_name(log_gate->dt), pn_shape_str(log_gate), pn_dtype_name(q->dt));
        if (log_gate->nd != 3 || log_gate->sizes[0] != B || log_gate->sizes[1] != H || log_gate->sizes[2] != N)
            return pn_error_null(PN_ERR_SHAPE, OP ": log_gate %s must have shape [%lld,%lld,%lld] (B, H, N) for q %s",
                                 pn_shape_str(log_gate), (long long)B, (long long)H, (long long)N, pn_shape_str(q));
    }
    pn_sympow_table *tab = NULL;
    if (chunk > 0 && !(tab = pn_sympow_table_new(OP, q->sizes[3], p))) return NULL;

    pn_tensor *qc = pn_contig(q), *kc = pn_contig(k), *vc = pn_contig(v);
    pn_tensor *lgc = log_gate ? pn_contig(log_gate) : NULL;
    pn_tensor *out = NULL;
    if (!qc || !kc || !vc || (log_gate && !lgc)) goto fail;
    int64_t shape[4] = {B, H, N, v->sizes[3]};
    if (!(out = pn_empty(4, shape, q->dt, dev))) goto fail;
    if (PN_KCALL(OP, kt, power_fwd, qc, kc, vc, lgc, p, causal, chunk, scale, tab, out)) goto fail;
    pn_tensor *ins[4] = {q, k, v, log_gate};
    if (pn_ag_needed(4, ins)) {
        pn_node *n = pn_ag_record(out, OP, power_bw, 4, ins);
        if (!n) goto fail;
        if (pn_ag_save(n, qc) || pn_ag_save(n, kc) || pn_ag_save(n, vc) || (lgc && pn_ag_save(n, lgc))) goto fail;
        n->iv[0] = p, n->iv[1] = causal != 0, n->iv[2] = chunk;
        n->sc[0] = scale;
        n->extra = tab, n->free_extra = free_table;
        tab = NULL;
    }
    goto done;
fail:
    pn_release(out);
    out = NULL;
done:
    pn_release(qc), pn_release(kc), pn_release(vc), pn_release(lgc);
    pn_sympow_table_free(tab);
    return out;
}

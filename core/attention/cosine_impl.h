/* cosine_impl.h — the typed bodies of cosine.c's chunked kernels, included twice:
 *   real = float,  SFX(x) = x##_f32, GEMM = cblas_sgemm
 *   real = double, SFX(x) = x##_f64, GEMM = cblas_dgemm
 * Per (b, h) pair the sequence is cut into chunks of c = PN_COSINE_CHUNK rows (cosine.c has
 * the maths). Chunk-local products run as GEMMs in the tensor's dtype; the running sums
 * over the whole sequence (the state S, its reverse twin R) are kept in f64 and handed to
 * the GEMMs as a copy in real (for f64 that copy is S itself). Scratch is O(c·D + D·Dv)
 * per thread, whatever N.
 *
 * NaN in, NaN out only where the maths puts it. A causal chunk's product (P ⊙ tril)·X multiplies
 * the masked-out pairs by 0, and 0·NaN = NaN: a non-finite row of X would reach the rows that must
 * not see it (a NaN v_j the outputs of rows t < j, a NaN k̂_j the g q̂ of rows t < j, a NaN q̂_t the
 * g k̂ of rows j > t, a NaN g_t the g v of rows j > t); likewise a masked key's v through its
 * k̂ = 0. So every chunk scans the operand it multiplies (O(c·D), nothing beside the GEMMs' c²·D)
 * and, only when it holds a non-finite value, takes the exact path: the visible pairs alone
 * multiplied (cos_intra) and the v rows of masked keys read as 0 (cos_clean_v). */

/* One thread's scratch. */
typedef struct {
    real *q, *k, *v, *g;    /* (c, D), (c, D), (c, Dv), (c, Dv): the chunk's rows, q̂ and k̂ normalised */
    real *P;                /* (c, c) scores q̂·k̂, or (G·v) */
    real *o1, *o2;          /* (c, max(D, Dv)) GEMM results */
    real *Sr, *T;           /* (D, Dv): the state as GEMM operand, and one chunk's term (f32) */
    double *S;              /* (D, Dv): the running sum in f64 */
    double *rq, *rk;        /* (c): 1/‖row‖ of the chunk's q and k */
    double *x, *gx, *gxh;   /* (max(D, Dv)) row scratch */
    int64_t *cnt;           /* (c): n_t of the chunk's rows */
} SFX(cos_ws);

static void *SFX(cos_ws_new)(const cos_args *a, SFX(cos_ws) *w) {
    const int64_t c = PN_COSINE_CHUNK, D = a->D, Dv = a->Dv, W = D > Dv ? D : Dv;
    const size_t nr = (size_t)(2 * c * D + 2 * c * Dv + c * c + 2 * c * W + 2 * D * Dv);
    const size_t nd = (size_t)(D * Dv + 2 * c + 3 * W);
    char *p = malloc(nr * sizeof(real) + nd * sizeof(double) + (size_t)c * sizeof(int64_t));
    if (!p) return NULL;
    w->S = (double *)p, w->rq = w->S + D * Dv, w->rk = w->rq + c;
    w->x = w->rk + c, w->gx = w->x + W, w->gxh = w->gx + W;
    w->cnt = (int64_t *)(w->gxh + W);
    w->q = (real *)(w->cnt + c), w->k = w->q + c * D, w->v = w->k + c * D, w->g = w->v + c * Dv;
    w->P = w->g + c * Dv, w->o1 = w->P + c * c, w->o2 = w->o1 + c * W;
    w->Sr = w->o2 + c * W, w->T = w->Sr + D * Dv;
    if (sizeof(real) == sizeof(double)) w->Sr = (real *)w->S; /* f64: GEMMs read and write S itself */
    return p;
}

/* dst (rows, D) ← x̂ = x / sqrt(‖x‖² + ε) of src rows; r (rows) ← the factors. Rows that are
 * no key (masked) become 0 when keys = true. */
static void SFX(cos_load_norm)(const cos_args *a, int64_t b, int64_t j0, int64_t rows, const real *src, real *dst,
                               double *r, bool keys) {
    const int64_t D = a->D;
    for (int64_t i = 0; i < rows; i++) {
        const real *x = src + i * D;
        real *y = dst + i * D;
        if (keys && !is_key(a, b, j0 + i)) {
            memset(y, 0, sizeof(real) * (size_t)D);
            r[i] = 0;
            continue;
        }
        double ss = 0;
        for (int64_t d = 0; d < D; d++) ss += (double)x[d] * x[d];
        const double f = 1.0 / sqrt(ss + PN_COSINE_EPS);
        for (int64_t d = 0; d < D; d++) y[d] = (real)(x[d] * f);
        r[i] = f;
    }
}

/* S += Kcᵀ Vc (or any Xᵀ Y of rows cl): kept in f64, Sr refreshed */
static void SFX(cos_state_add)(SFX(cos_ws) *w, int64_t cl, int64_t D, int64_t Dv, const real *X, const real *Y) {
    if (sizeof(real) == sizeof(double)) {
        GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (blasint)D, (blasint)Dv, (blasint)cl, 1, X, (blasint)D, Y,
             (blasint)Dv, 1, w->Sr, (blasint)Dv);
        return;
    }
    GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (blasint)D, (blasint)Dv, (blasint)cl, 1, X, (blasint)D, Y,
         (blasint)Dv, 0, w->T, (blasint)Dv);
    for (int64_t i = 0; i < D * Dv; i++) {
        w->S[i] += w->T[i];
        w->Sr[i] = (real)w->S[i];
    }
}

static void SFX(cos_state_zero)(SFX(cos_ws) *w, int64_t D, int64_t Dv) {
    memset(w->S, 0, sizeof(double) * (size_t)(D * Dv));
    if (sizeof(real) != sizeof(double)) memset(w->Sr, 0, sizeof(real) * (size_t)(D * Dv));
}

/* P (cl, cl): zero above the diagonal (key j > query i) */
static void SFX(cos_tril)(real *P, int64_t cl) {
    for (int64_t i = 0; i < cl; i++)
        for (int64_t j = i + 1; j < cl; j++) P[i * cl + j] = 0;
}

/* true when every entry of x (n) is finite (x − x is 0 exactly then, NaN for ±inf and NaN);
 * no float sum, so the loop vectorises */
static bool SFX(cos_finite)(const real *x, int64_t n) {
    int ok = 1;
    for (int64_t i = 0; i < n; i++) ok &= x[i] - x[i] == 0;
    return ok;
}

/* The chunk's v rows [s0, s0 + cl) as the products read them: Vc itself when finite (*fin set),
 * else, with a key mask, a copy in buf (cl, Dv) whose masked keys' rows are 0 — a masked key
 * never contributes, and its k̂ = 0 times a NaN of its v would. */
static const real *SFX(cos_clean_v)(const cos_args *a, int64_t b, int64_t s0, int64_t cl, const real *Vc, real *buf,
                                    bool *fin) {
    const int64_t Dv = a->Dv;
    *fin = SFX(cos_finite)(Vc, cl * Dv);
    if (*fin || !a->mask) return Vc;
    for (int64_t i = 0; i < cl; i++) {
        if (is_key(a, b, s0 + i)) memcpy(buf + i * Dv, Vc + i * Dv, sizeof(real) * (size_t)Dv);
        else memset(buf + i * Dv, 0, sizeof(real) * (size_t)Dv);
    }
    return buf;
}

/* C (m, n) = A (m, k) · B, with B (k, n) or, transposed, B (n, k); beta 0 or 1 */
static inline void SFX(cos_gemm)(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const real *A, const real *B,
                                 real beta, real *Cm) {
    GEMM(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (blasint)m, (blasint)n,
         (blasint)k, 1, A, (blasint)(ta ? m : k), B, (blasint)(tb ? k : n), beta, Cm, (blasint)n);
}

/* The intra-chunk product of the causal form, P (cl, cl) against X (cl, n) into Cm (cl, n):
 *   trans = false: Cm_i = Σ_{j ≤ i} P_ij X_j     ((P ⊙ tril) X)
 *   trans = true:  Cm_j = Σ_{i ≥ j} P_ij X_i     ((P ⊙ tril)ᵀ X)
 * finite: X has no NaN/inf, so the masked pairs may be zeroed in P and the product be one GEMM;
 * else only the visible pairs are multiplied (rows of Cm in a fixed order), so a non-finite X_j
 * reaches exactly the rows that see j. P is changed in the GEMM case (tril). */
static void SFX(cos_intra)(bool trans, bool finite, real *P, int64_t cl, const real *X, int64_t n, real *Cm) {
    if (finite) {
        SFX(cos_tril)(P, cl);
        SFX(cos_gemm)(trans, false, cl, n, cl, P, X, 0, Cm);
        return;
    }
    memset(Cm, 0, sizeof(real) * (size_t)(cl * n));
    for (int64_t i = 0; i < cl; i++)
        for (int64_t j = 0; j <= i; j++) {
            const real p = P[i * cl + j];
            const real *x = X + (trans ? i : j) * n;
            real *c = Cm + (trans ? j : i) * n;
            for (int64_t e = 0; e < n; e++) c[e] += p * x[e];
        }
}

/* n_t for the rows [s0, s0 + cl) of the causal form, running count *cnt of real keys */
static void SFX(cos_counts)(const cos_args *a, int64_t b, int64_t s0, int64_t cl, int64_t *run, int64_t *cnt) {
    for (int64_t i = 0; i < cl; i++) {
        *run += is_key(a, b, s0 + i);
        cnt[i] = *run;
    }
}

/* ---- forward ---------------------------------------------------------------------------------- */
static bool SFX(cos_forward)(const cos_args *a, void *out_) {
    const int64_t N = a->N, D = a->D, Dv = a->Dv, BH = a->B * a->H, c = PN_COSINE_CHUNK;
    const real *Q = a->q, *K = a->k, *V = a->v;
    real *out = out_;
    int oom = 0;
    #pragma omp parallel if (BH > 1 && BH * N * D * Dv > PN_PAR_MIN)
    {
        SFX(cos_ws) w;
        void *ok = SFX(cos_ws_new)(a, &w);
        if (!ok) {
            #pragma omp atomic write
            oom = 1;
        }
        #pragma omp for schedule(static)
        for (int64_t bh = 0; bh < BH; bh++) {
            if (!ok) continue;
            const int64_t b = bh / a->H, oqk = bh * N * D, ov = bh * N * Dv;
            const double s = a->s[bh % a->H];
            SFX(cos_state_zero)(&w, D, Dv);
            int64_t run = 0;
            if (!a->causal) { /* S = Σ_j k̂_j v_jᵀ over every real key */
                for (int64_t s0 = 0; s0 < N; s0 += c) {
                    const int64_t cl = N - s0 < c ? N - s0 : c;
                    bool fin;
                    SFX(cos_load_norm)(a, b, s0, cl, K + oqk + s0 * D, w.k, w.rk, true);
                    SFX(cos_state_add)(&w, cl, D, Dv, w.k, SFX(cos_clean_v)(a, b, s0, cl, V + ov + s0 * Dv, w.v, &fin));
                    SFX(cos_counts)(a, b, s0, cl, &run, w.cnt);
                }
            }
            const double cb = count_scale(run, s);
            for (int64_t s0 = 0; s0 < N; s0 += c) {
                const int64_t cl = N - s0 < c ? N - s0 : c;
                const real *Vc = V + ov + s0 * Dv;
                SFX(cos_load_norm)(a, b, s0, cl, Q + oqk + s0 * D, w.q, w.rq, false);
                if (a->causal) {
                    bool fin;
                    Vc = SFX(cos_clean_v)(a, b, s0, cl, Vc, w.v, &fin);
                    SFX(cos_load_norm)(a, b, s0, cl, K + oqk + s0 * D, w.k, w.rk, true);
                    SFX(cos_counts)(a, b, s0, cl, &run, w.cnt);
                    SFX(cos_gemm)(false, true, cl, cl, D, w.q, w.k, 0, w.P); /* P = Q̂ K̂ᵀ */
                    SFX(cos_intra)(false, fin, w.P, cl, Vc, Dv, w.o1);         /* intra-chunk */
                    if (s0 > 0) SFX(cos_gemm)(false, false, cl, Dv, D, w.q, w.Sr, 1, w.o1); /* + Q̂ S */
                } else {
                    SFX(cos_gemm)(false, false, cl, Dv, D, w.q, w.Sr, 0, w.o1);
                }
                for (int64_t i = 0; i < cl; i++) {
                    const double f = a->causal ? count_scale(w.cnt[i], s) : cb;
                    real *dst = out + ov + (s0 + i) * Dv;
                    for (int64_t e = 0; e < Dv; e++) dst[e] = (real)(f * w.o1[i * Dv + e]);
                }
                if (a->causal && s0 + cl < N) SFX(cos_state_add)(&w, cl, D, Dv, w.k, Vc);
            }
        }
        free(ok);
    }
    return !oom;
}

/* ---- backward --------------------------------------------------------------------------------- */
/* Gc (cl, Dv) ← n_t^{−σ} g_t */
static void SFX(cos_load_g)(const real *g, real *Gc, int64_t cl, int64_t Dv, const int64_t *cnt, int64_t total,
                            bool causal, double s) {
    for (int64_t i = 0; i < cl; i++) {
        const double f = count_scale(causal ? cnt[i] : total, s);
        for (int64_t e = 0; e < Dv; e++) Gc[i * Dv + e] = (real)(f * g[i * Dv + e]);
    }
}

/* dst row ← the gradient through x̂ = x·r for gradient gxh (real) of row x (real) */
static void SFX(cos_norm_bw_row)(SFX(cos_ws) *w, const real *x, double r, const real *gxh, real *dst, int64_t D) {
    for (int64_t d = 0; d < D; d++) w->x[d] = x[d], w->gxh[d] = gxh[d];
    cos_normalize_bw(w->x, r, w->gxh, w->gx, D);
    for (int64_t d = 0; d < D; d++) dst[d] = (real)w->gx[d];
}

static bool SFX(cos_backward)(const cos_args *a, const void *g_, void *gq_, void *gk_, void *gv_, double *gm_bh) {
    const int64_t N = a->N, D = a->D, Dv = a->Dv, BH = a->B * a->H, c = PN_COSINE_CHUNK;
    const real *Q = a->q, *K = a->k, *V = a->v, *Gr = g_;
    real *gq = gq_, *gk = gk_, *gv = gv_;
    const int64_t nchunks = (N + c - 1) / c;
    int oom = 0;
    #pragma omp parallel if (BH > 1 && BH * N * D * Dv > PN_PAR_MIN)
    {
        SFX(cos_ws) w;
        void *ok = SFX(cos_ws_new)(a, &w);
        if (!ok) {
            #pragma omp atomic write
            oom = 1;
        }
        #pragma omp for schedule(static)
        for (int64_t bh = 0; bh < BH; bh++) {
            if (!ok) continue;
            const int64_t b = bh / a->H, oqk = bh * N * D, ov = bh * N * Dv;
            const double s = a->s[bh % a->H];
            int64_t total = 0;
            for (int64_t j = 0; j < N; j++) total += is_key(a, b, j);

            /* pass 1, forward over the chunks: g q̂_t = S_t G_t; g_t·out_t = q̂_t·(g q̂_t) for g m */
            if (gq || gm_bh) {
                SFX(cos_state_zero)(&w, D, Dv);
                if (!a->causal)
                    for (int64_t s0 = 0; s0 < N; s0 += c) {
                        const int64_t cl = N - s0 < c ? N - s0 : c;
                        bool fin;
                        SFX(cos_load_norm)(a, b, s0, cl, K + oqk + s0 * D, w.k, w.rk, true);
                        SFX(cos_state_add)(&w, cl, D, Dv, w.k,
                                           SFX(cos_clean_v)(a, b, s0, cl, V + ov + s0 * Dv, w.v, &fin));
                    }
                int64_t run = 0;
                double gm = 0;
                for (int64_t s0 = 0; s0 < N; s0 += c) {
                    const int64_t cl = N - s0 < c ? N - s0 : c;
                    const real *Vc = V + ov + s0 * Dv;
                    SFX(cos_counts)(a, b, s0, cl, &run, w.cnt);
                    SFX(cos_load_norm)(a, b, s0, cl, Q + oqk + s0 * D, w.q, w.rq, false);
                    SFX(cos_load_g)(Gr + ov + s0 * Dv, w.g, cl, Dv, w.cnt, total, a->causal, s);
                    real *gQ = w.o1;
                    if (a->causal) {
                        bool fin;
                        Vc = SFX(cos_clean_v)(a, b, s0, cl, Vc, w.v, &fin);
                        SFX(cos_load_norm)(a, b, s0, cl, K + oqk + s0 * D, w.k, w.rk, true);
                        SFX(cos_gemm)(false, true, cl, cl, Dv, w.g, Vc, 0, w.P); /* A_ij = G_i·v_j */
                        SFX(cos_intra)(false, SFX(cos_finite)(w.k, cl * D), w.P, cl, w.k, D, gQ);
                        if (s0 > 0) SFX(cos_gemm)(false, true, cl, D, Dv, w.g, w.Sr, 1, gQ); /* + G Sᵀ */
                    } else {
                        SFX(cos_gemm)(false, true, cl, D, Dv, w.g, w.Sr, 0, gQ);
                    }
                    for (int64_t i = 0; i < cl; i++) {
                        const int64_t n = a->causal ? w.cnt[i] : total;
                        if (gm_bh && n > 1) {
                            double o = 0;
                            for (int64_t d = 0; d < D; d++) o += (double)w.q[i * D + d] * gQ[i * D + d];
                            gm -= o * log((double)n);
                        }
                        if (gq)
                            SFX(cos_norm_bw_row)(&w, Q + oqk + (s0 + i) * D, w.rq[i], gQ + i * D, gq + oqk + (s0 + i) * D, D);
                    }
                    if (a->causal && s0 + cl < N) SFX(cos_state_add)(&w, cl, D, Dv, w.k, Vc);
                }
                if (gm_bh) gm_bh[bh] = gm;
            }

            /* pass 2, backward over the chunks: R = Σ_{t later} q̂_t G_tᵀ;
             * g k̂_j = Σ_{t≥j in chunk} (G_t·v_j) q̂_t + R v_j, g v_j = Σ_{t≥j in chunk} (q̂_t·k̂_j) G_t + Rᵀ k̂_j */
            if (gk || gv) {
                SFX(cos_state_zero)(&w, D, Dv); /* S now holds R */
                if (!a->causal)
                    for (int64_t s0 = 0; s0 < N; s0 += c) {
                        const int64_t cl = N - s0 < c ? N - s0 : c;
                        SFX(cos_load_norm)(a, b, s0, cl, Q + oqk + s0 * D, w.q, w.rq, false);
                        SFX(cos_load_g)(Gr + ov + s0 * Dv, w.g, cl, Dv, w.cnt, total, false, s);
                        SFX(cos_state_add)(&w, cl, D, Dv, w.q, w.g);
                    }
                /* the causal counts of the last chunk's rows, then walked back chunk by chunk */
                int64_t run = total;
                for (int64_t ci = nchunks - 1; ci >= 0; ci--) {
                    const int64_t s0 = ci * c, cl = N - s0 < c ? N - s0 : c;
                    const real *Vc = V + ov + s0 * Dv;
                    for (int64_t i = cl - 1; i >= 0; i--) { /* n_t = real keys at or before t */
                        w.cnt[i] = run;
                        run -= is_key(a, b, s0 + i);
                    }
                    SFX(cos_load_norm)(a, b, s0, cl, K + oqk + s0 * D, w.k, w.rk, true);
                    real *gK = w.o1, *gV = w.o2;
                    const bool later = a->causal ? ci < nchunks - 1 : true; /* R holds something */
                    if (a->causal) {
                        SFX(cos_load_norm)(a, b, s0, cl, Q + oqk + s0 * D, w.q, w.rq, false);
                        SFX(cos_load_g)(Gr + ov + s0 * Dv, w.g, cl, Dv, w.cnt, total, true, s);
                    }
                    if (gk) {
                        if (a->causal) {
                            SFX(cos_gemm)(false, true, cl, cl, Dv, w.g, Vc, 0, w.P); /* A_ij = G_i·v_j */
                            SFX(cos_intra)(true, SFX(cos_finite)(w.q, cl * D), w.P, cl, w.q, D, gK); /* Aᵀ Q̂ */
                        }
                        if (later) SFX(cos_gemm)(false, true, cl, D, Dv, Vc, w.Sr, a->causal ? 1 : 0, gK); /* + V Rᵀ */
                    }
                    if (gv) {
                        if (a->causal) {
                            SFX(cos_gemm)(false, true, cl, cl, D, w.q, w.k, 0, w.P); /* P = Q̂ K̂ᵀ */
                            SFX(cos_intra)(true, SFX(cos_finite)(w.g, cl * Dv), w.P, cl, w.g, Dv, gV); /* Pᵀ G */
                        }
                        if (later) SFX(cos_gemm)(false, false, cl, Dv, D, w.k, w.Sr, a->causal ? 1 : 0, gV); /* + K̂ R */
                    }
                    for (int64_t i = 0; i < cl; i++) {
                        const int64_t j = s0 + i;
                        const bool key = is_key(a, b, j);
                        if (gk) {
                            real *dst = gk + oqk + j * D;
                            if (!key) memset(dst, 0, sizeof(real) * (size_t)D);
                            else SFX(cos_norm_bw_row)(&w, K + oqk + j * D, w.rk[i], gK + i * D, dst, D);
                        }
                        if (gv) {
                            real *dst = gv + ov + j * Dv;
                            if (!key) memset(dst, 0, sizeof(real) * (size_t)Dv);
                            else memcpy(dst, gV + i * Dv, sizeof(real) * (size_t)Dv);
                        }
                    }
                    if (a->causal && ci > 0) SFX(cos_state_add)(&w, cl, D, Dv, w.q, w.g); /* R += Q̂ᵀ G */
                }
            }
        }
        free(ok);
    }
    return !oom;
}

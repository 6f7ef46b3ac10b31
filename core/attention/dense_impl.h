/* dense_impl.h — the typed body of the fused attention drivers, included twice by dense.c:
 *   real = float,  SFX(x) = x##_f32, GEMM = cblas_sgemm, EPI_FWD/EPI_VJP = plan.fwd32/vjp32
 *   real = double, SFX(x) = x##_f64, GEMM = cblas_dgemm, EPI_FWD/EPI_VJP = plan.fwd64/vjp64
 * (compile-time specialisation behind one runtime entry: the f32 loops vectorize in float
 * with the fast maths of fastmath.h, the f64 loops use libm and match the references to
 * 1e-10; one body keeps them from drifting apart). No include guard on purpose.
 *
 * Layout (pn_attn_call): q (BH, Nq, D), k (BH, Nk, D), v (BH, Nk, Dv), BH = B·H, head
 * h = bh % H, each row's coordinates contiguous and the rows where c->lq, lk, lv say
 * (pn_attn_at): row r of head bh of q at q + pn_attn_at(c, c->lq, bh, r), the next row lq.n
 * further; the gradients dq, dk, dv share their inputs' layouts, out has c->lo, dout its own. Work is split into query tiles of PN_TQ rows (the backward's: pn_attn_bwd_tq);
 * each tile walks the keys in tiles of PN_TK. Scores: G = Q_g·K_gᵀ (GEMM), then per row the score's epilogue, the
 * bias / ALiBi / mask / causal modifiers, and the normalisation (online softmax with a
 * running max and sum, or sigmoid); acc += P·V (GEMM). Nothing of size Nq×Nk exists. */

/* ---- terms, input checks, Lorentz factors (shared with graph.c via pn_attn_prepare) ---- */

/* out[r] (rows) = the term `kind` of row r of x (rows, D; row stride rs); a: the head's PROJ vector (D) */
static void SFX(terms_rows)(int kind, const real *x, int64_t rows, int64_t rs, int64_t D, int64_t Dg, const real *a,
                            real *out) {
    for (int64_t r = 0; r < rows; r++) {
        const real *xr = x + r * rs;
        real t = 0;
        if (kind == PN_TERM_NORM2) {
            for (int64_t d = 0; d < Dg; d++) t += xr[d] * xr[d];
        } else if (kind == PN_TERM_LAST) {
            t = xr[D - 1];
        } else if (kind == PN_TERM_PROJ) {
            for (int64_t d = 0; d < D; d++) t += a[d] * xr[d];
        }
        out[r] = t;
    }
}

/* Fill c->qt / c->kt for every (b, h). */
static void SFX(compute_terms)(pn_attn_call *c) {
    const pn_score_plan *pl = &c->st.plan;
    if (c->nm) { /* node-major (graph.c): row x = r·H + h of every array, head x % H */
        #pragma omp parallel for if (c->BH * (c->Nq + c->Nk) * c->D > PN_PAR_MIN) schedule(static)
        for (int64_t x = 0; x < c->BH * c->Nq; x++) {
            const int64_t h = x % c->H;
            for (int m = 0; m < 2; m++) {
                if (c->qt[m])
                    SFX(terms_rows)(pl->qterm[m], (const real *)c->q + x * c->D, 1, c->D, c->D, c->Dg,
                                    c->a_l ? (const real *)c->a_l + h * c->D : NULL, (real *)c->qt[m] + x);
                if (c->kt[m])
                    SFX(terms_rows)(pl->kterm[m], (const real *)c->k + x * c->D, 1, c->D, c->D, c->Dg,
                                    c->a_r ? (const real *)c->a_r + h * c->D : NULL, (real *)c->kt[m] + x);
            }
        }
        return;
    }
    #pragma omp parallel for if (c->BH * (c->Nq + c->Nk) * c->D > PN_PAR_MIN) schedule(static)
    for (int64_t bh = 0; bh < c->BH; bh++) {
        int64_t h = bh % c->H;
        for (int m = 0; m < 2; m++) {
            if (c->qt[m])
                SFX(terms_rows)(pl->qterm[m], (const real *)c->q + pn_attn_at(c, c->lq, bh, 0), c->Nq, c->lq.n, c->D, c->Dg,
                                c->a_l ? (const real *)c->a_l + h * c->D : NULL, (real *)c->qt[m] + bh * c->Nq);
            if (c->kt[m])
                SFX(terms_rows)(pl->kterm[m], (const real *)c->k + pn_attn_at(c, c->lk, bh, 0), c->Nk, c->lk.n, c->D, c->Dg,
                                c->a_r ? (const real *)c->a_r + h * c->D : NULL, (real *)c->kt[m] + bh * c->Nk);
        }
    }
}

/* First index (bh·N + row) in terms t (BH, N) that breaks the requirement, or -1. */
static int64_t SFX(find_bad)(const pn_attn_call *c, const real *t, int64_t N, unsigned req, double *val) {
    for (int64_t bh = 0; bh < c->BH; bh++) {
        double kap = c->st.hp[bh % c->H].v[PN_P_curvature];
        for (int64_t r = 0; r < N; r++) {
            double x = t[pn_attn_row(c, bh, r, N)];
            bool bad = req == PN_REQ_LAST_POS ? !(x > 0 && x < INFINITY) : !(kap * x < 1);
            if (bad) {
                *val = req == PN_REQ_LAST_POS ? x : kap * x;
                return pn_attn_row(c, bh, r, N);
            }
        }
    }
    return -1;
}

/* γ(v_j) = 1/√(1 − κ‖v_j‖²) for every (b, h, j); -1 or the first index outside the ball */
static int64_t SFX(lorentz)(pn_attn_call *c, double *val) {
    int64_t bad = -1;
    for (int64_t bh = 0; bh < c->BH && bad < 0; bh++) {
        double kap = c->st.hp[bh % c->H].v[PN_P_curvature];
        for (int64_t j = 0; j < c->Nk; j++) {
            const int64_t x = pn_attn_row(c, bh, j, c->Nk);
            const real *vr = (const real *)c->v + pn_attn_xat(c, c->lv, bh, j, c->Nk, c->Dv);
            double n2 = 0;
            for (int64_t d = 0; d < c->Dv; d++) n2 += (double)vr[d] * vr[d];
            if (!(kap * n2 < 1)) {
                *val = kap * n2;
                bad = x;
                break;
            }
            ((real *)c->g)[x] = (real)(1.0 / sqrt(1.0 - kap * n2));
        }
    }
    return bad;
}

/* ---- per-row modifiers and normalisation ---------------------------------------------------- */

/* s (tk): scores of query row i (absolute) against keys j0 … j0+tk−1 of (b, h): add the bias
 * and the ALiBi term, set masked pairs (mask == 0, or causal: j > i + off) to −inf. */
PN_INLINE void SFX(row_mods)(const pn_attn_call *c, int64_t b, int64_t h, int64_t i, int64_t j0, int64_t tk,
                                 real *s) {
    const real *br = c->bias ? (const real *)c->bias + b * c->bs[0] + h * c->bs[1] + i * c->bs[2] + j0 * c->bs[3] : NULL;
    const uint8_t *mr = c->mask ? c->mask + b * c->ms[0] + h * c->ms[1] + i * c->ms[2] + j0 * c->ms[3] : NULL;
    const int64_t first = c->causal ? i + c->off - j0 + 1 : tk; /* first causally masked column of this tile */
    if (br) {
        const int64_t st = c->bs[3];
        if (st == 1)
            for (int64_t j = 0; j < tk; j++) s[j] += br[j];
        else
            for (int64_t j = 0; j < tk; j++) s[j] += br[j * st];
    }
    if (c->alibi) {
        const real m = (real)c->alibi[h];
        const int64_t ii = i + c->off - j0;
        for (int64_t j = 0; j < tk; j++) s[j] -= m * (real)(ii - j);
    }
    if (mr) {
        const int64_t st = c->ms[3];
        for (int64_t j = 0; j < tk; j++) s[j] = mr[j * st] ? s[j] : (real)-INFINITY;
    }
    for (int64_t j = first < 0 ? 0 : first; j < tk; j++) s[j] = (real)-INFINITY;
    /* NaN in, NaN out: every pair that reads a non-finite q or k row is NaN unless the mask, the
     * causal cut or a −inf bias masks it. Masked is decided from those, not from the score: a dot
     * product is −inf exactly there (an infinite key coordinate against a negative query one),
     * and such a row used to ignore the bad key and come out finite. dense.cu's mods: the same. */
    if (c->qbad || c->kbad) {
        const int64_t bh = b * c->H + h;
        const bool qb = c->qbad && c->qbad[bh * c->Nq + i];
        const uint8_t *kb = c->kbad ? c->kbad + bh * c->Nk + j0 : NULL;
        for (int64_t j = 0; j < tk; j++) {
            if (!qb && !(kb && kb[j])) continue;
            const bool masked = j >= first || (mr && !mr[j * c->ms[3]]) || (br && br[j * c->bs[3]] == (real)-INFINITY);
            s[j] = masked ? (real)-INFINITY : (real)NAN;
        }
    }
}

/* s (tk) → p = exp(s − mnew)·g (g only when has_g, a constant at every call site), returning
 * Σ p. The sum runs in 16 lanes and a halving tree: `omp simd reduction` ended every row with 16
 * dependent scalar adds through the stack, a fifth of row_softmax's time. */
PN_INLINE real SFX(exp_sum)(real *s, int64_t tk, const real *g, const int has_g, real mnew) {
    real part[16] = {0};
    int64_t j = 0;
    for (; j + 16 <= tk; j += 16)
        for (int u = 0; u < 16; u++) {
            real p = pn_exp_nonpos(s[j + u] - mnew);
            if (has_g) p *= g[j + u];
            s[j + u] = p;
            part[u] += p;
        }
    for (; j < tk; j++) {
        real p = pn_exp_nonpos(s[j] - mnew);
        if (has_g) p *= g[j];
        part[0] += s[j] = p;
    }
    for (int w = 8; w > 0; w /= 2)
        for (int u = 0; u < w; u++) part[u] += part[u + w];
    return part[0];
}

/* Online softmax over one tile row: s → p = exp(s − m_new)·g (g may be NULL); updates the
 * running max *m and sum *l, and returns the factor the accumulated output row must be
 * rescaled by. A row masked so far keeps m = −inf and p = 0. */
PN_INLINE real SFX(row_softmax)(real *s, int64_t tk, const real *g, real *m, real *l) {
    if (*m != *m) { /* a NaN row stays NaN (its accumulator already is) */
        for (int64_t j = 0; j < tk; j++) s[j] = 0;
        return 1;
    }
    real mx = (real)-INFINITY;
    #pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < tk; j++) mx = s[j] > mx ? s[j] : mx;
    real mnew = mx > *m ? mx : *m;
    if (mnew == (real)-INFINITY) { /* masked so far — unless the scores are NaN (max skips NaN) */
        int nan = 0;
        for (int64_t j = 0; j < tk; j++) nan |= s[j] != s[j];
        if (nan) goto poison;
        for (int64_t j = 0; j < tk; j++) s[j] = 0;
        return 1;
    }
    real alpha = pn_exp_nonpos(*m - mnew); /* m <= mnew */
    /* g is tested here once, not per element: each call below gets its own loop */
    const real sum = g ? SFX(exp_sum)(s, tk, g, 1, mnew) : SFX(exp_sum)(s, tk, NULL, 0, mnew);
    if (sum != sum) goto poison; /* a NaN score, or +inf (inf − inf) */
    *l = *l * alpha + sum;
    *m = mnew;
    return alpha;
poison: /* NaN in, NaN out: NaN weights and rescale factor poison the accumulated row */
    for (int64_t j = 0; j < tk; j++) s[j] = (real)NAN;
    *m = *l = (real)NAN;
    return (real)NAN;
}

/* Sigmoid weights over one tile row: s → σ(s)·g (g may be NULL), *l += Σ. */
PN_INLINE void SFX(row_sigmoid)(real *s, int64_t tk, const real *g, real *l) {
    real sum = 0;
    #pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < tk; j++) {
        real p = 1 / (1 + pn_exp(-s[j]));
        p = g ? p * g[j] : p;
        s[j] = p;
        sum += p;
    }
    *l += sum;
}

/* C (m, n) = A (m, k) · B (n, k)ᵀ over the first k columns; ld* are row strides */
static inline void SFX(gemm_nt)(int64_t m, int64_t n, int64_t k, const real *A, int64_t lda, const real *B,
                                int64_t ldb, real beta, real *C, int64_t ldc) {
    if (k <= 0) {
        if (beta == 0)
            for (int64_t i = 0; i < m; i++) memset(C + i * ldc, 0, sizeof(real) * (size_t)n);
        return;
    }
    GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)m, (blasint)n, (blasint)k, 1, A, (blasint)lda, B,
         (blasint)ldb, beta, C, (blasint)ldc);
}
/* C (m, n) += A (m, k) · B (k, n) */
static inline void SFX(gemm_nn_acc)(int64_t m, int64_t n, int64_t k, const real *A, int64_t lda, const real *B,
                                    int64_t ldb, real *C, int64_t ldc) {
    if (k <= 0 || n <= 0) return;
    GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, 1, A, (blasint)lda, B,
         (blasint)ldb, 1, C, (blasint)ldc);
}
/* C (m, n) += A (k, m)ᵀ · B (k, n) */
static inline void SFX(gemm_tn_acc)(int64_t m, int64_t n, int64_t k, const real *A, int64_t lda, const real *B,
                                    int64_t ldb, real *C, int64_t ldc) {
    if (k <= 0 || n <= 0) return;
    GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, 1, A, (blasint)lda, B,
         (blasint)ldb, 1, C, (blasint)ldc);
}

/* Y (m, n; row stride ldy) += X (m, n; row stride ldx) */
static inline void SFX(add_rows)(int64_t m, int64_t n, const real *X, int64_t ldx, real *Y, int64_t ldy) {
    for (int64_t i = 0; i < m; i++) {
        const real *x = X + i * ldx;
        real *y = Y + i * ldy;
        #pragma omp simd
        for (int64_t j = 0; j < n; j++) y[j] += x[j];
    }
}

#if PN_DENSE_MK
/* Y (m, ncols; row stride ldy) += A · B as mk_prod: in place where the kernel's whole panels are
 * Y's own columns (ncols a multiple of nr; the same sums, each block adding its finished product
 * to Y), else into T (m, ncols rounded up to nr), then added */
static inline void SFX(mk_prod_add)(const pn_microkernel *mk, int64_t m, int64_t ncols, int64_t K, const real *A,
                                    int64_t rs, int64_t cs, const real *Bp, int64_t bstride, real *Y, int64_t ldy,
                                    real *T) {
    if (ncols % mk->nr == 0) {
        mk_prod(mk, m, ncols, K, A, rs, cs, Bp, bstride, Y, ldy, 1);
        return;
    }
    const int64_t ldt = pn_mk_round(ncols, mk->nr);
    mk_prod(mk, m, ncols, K, A, rs, cs, Bp, bstride, T, ldt, 0);
    SFX(add_rows)(m, ncols, T, ldt, Y, ldy);
}
#endif

/* keys that query tile [i0, i0+tq) may see: [0, kend) */
static inline int64_t SFX(key_end)(const pn_attn_call *c, int64_t i0, int64_t tq) {
    if (!c->causal) return c->Nk;
    int64_t e = i0 + tq + c->off; /* last row i0+tq−1 sees keys ≤ i0+tq−1+off */
    return e < 0 ? 0 : (e < c->Nk ? e : c->Nk);
}

/* ---- distance scores (plan.diff): G = −½‖q_g − k_g‖² ---------------------------------------- */
/* G (tq, ldg) = −½‖q_g − k_g‖² from the expansion with the norms qn (tq), kn (tk): recompute
 * from the coordinates' differences the pairs where ‖q−k‖² < PN_DIFF_NEAR·(‖q‖² + ‖k‖²)
 * (attention.h; the expansion cancelled there). near (tq, PN_TK) or NULL: 1 for those pairs,
 * 0 elsewhere (the backward treats them apart); returns how many. */
PN_INLINE int64_t SFX(diff_fix)(const pn_attn_call *c, int64_t tq, int64_t tk, const real *Q, const real *K,
                                const real *qn, const real *kn, real *G, int64_t ldg, uint8_t *near) {
    const int64_t qs = c->lq.n, ks = c->lk.n, Dg = c->Dg;
    const real lim = (real)PN_DIFF_NEAR;
    int64_t count = 0;
    for (int64_t i = 0; i < tq; i++) {
        real *g = G + i * ldg;
        const real *q = Q + i * qs;
        if (near) memset(near + i * PN_TK, 0, (size_t)tk);
        for (int64_t j = 0; j < tk; j++) {
            if (!(-2 * g[j] < lim * (qn[i] + kn[j]))) continue;
            const real *kr = K + j * ks;
            real s = 0;
            for (int64_t d = 0; d < Dg; d++) {
                const real e = q[d] - kr[d];
                s += e * e;
            }
            g[j] = (real)-0.5 * s;
            if (near) near[i * PN_TK + j] = 1;
            count++;
        }
    }
    return count;
}

#if !PN_DENSE_MK /* the microkernel forms the expansion in its registers (pn_microkernel.dist) */
/* G (tq, ldg) holds q_g·k_g from the GEMM; it becomes −½‖q_g − k_g‖² (diff_fix); near: as there.
 * Returns how many pairs were recomputed from the differences. */
PN_INLINE int64_t SFX(diff_tile)(const pn_attn_call *c, int64_t tq, int64_t tk, const real *Q, const real *K,
                                 const real *qn, const real *kn, real *G, int64_t ldg, uint8_t *near) {
    const real lim = (real)PN_DIFF_NEAR;
    int64_t ni = 0;
    for (int64_t i = 0; i < tq; i++) {
        real *g = G + i * ldg;
        const real qi = qn[i];
        #pragma omp simd reduction(+ : ni)
        for (int64_t j = 0; j < tk; j++) {
            const real n2 = qi + kn[j], d2 = n2 - 2 * g[j];
            ni += d2 < lim * n2; /* false for NaN: it stays NaN */
            g[j] = (real)-0.5 * d2;
        }
    }
    return ni ? SFX(diff_fix)(c, tq, tk, Q, K, qn, kn, G, ldg, near) : 0;
}
#endif

#if PN_DENSE_MK
/* A call with at most PN_FEW_ROWS query rows (an incremental decoding step: one row per head
 * against the cached keys): packing every head's K and V into the microkernel's panels would
 * cost as much as the products (each key is used by that one row), and the microkernel's MR-row
 * blocks would run mostly empty. These loops read K and V in place; the call's weights and
 * backward take them too (its other products by BLAS, as in f64), so the scores they recompute
 * are the forward's to the bit — the softmax statistics saved by one and read by the other
 * must belong to the same scores (at D = 1500 the two forms differ by ~1e-4). A distance
 * score's −½‖q − k‖² comes from the differences themselves (no expansion, so nothing to fix
 * near q = k; a sum that overflows to +inf, which takes an infinite coordinate or one beyond
 * ~1e19 in f32, is NaN).
 * G (m, ldg) = Q·Kᵀ over the first Dg coordinates, or −½‖q − k‖² (diff); Q, K row strides ldq, ldk */
static int64_t SFX(few_rows_scores)(int64_t m, int64_t n, int64_t Dg, const real *Q, int64_t ldq, const real *K,
                                    int64_t ldk, bool diff, real *G, int64_t ldg, uint8_t *near) {
    for (int64_t j = 0; j < n; j++) { /* keys outermost: each is read once, the m rows stay in L1 */
        const real *k = K + j * ldk;
        for (int64_t i = 0; i < m; i++) {
            const real *q = Q + i * ldq;
            real s = 0;
            if (diff) {
                #pragma omp simd reduction(+ : s)
                for (int64_t d = 0; d < Dg; d++) s += (q[d] - k[d]) * (q[d] - k[d]);
                /* an infinite coordinate gives +inf here, and −inf would pass for a masked pair in
                 * row_mods: NaN, as the expansion's inf − inf gives on the microkernel */
                s = s < (real)INFINITY ? (real)-0.5 * s : (real)NAN;
            } else {
                #pragma omp simd reduction(+ : s)
                for (int64_t d = 0; d < Dg; d++) s += q[d] * k[d];
            }
            G[i * ldg + j] = s;
        }
    }
    if (!diff || !near) return 0;
    /* every pair is "near" for the backward (diff_chain): its gradient from k − q as well, not
     * from the norms' share, which cancels at close points as the expansion does */
    for (int64_t i = 0; i < m; i++) memset(near + i * ldg, 1, (size_t)n);
    return m * n;
}

/* acc (m, Dv; row stride ldacc) += P (m, n; row stride ldp) · V (n, Dv; row stride ldv), V in place */
static void SFX(few_rows_pv)(int64_t m, int64_t n, int64_t Dv, const real *P, int64_t ldp, const real *V, int64_t ldv,
                             real *acc, int64_t ldacc) {
    for (int64_t j = 0; j < n; j++) { /* each value row read once, as the keys above */
        const real *v = V + j * ldv;
        for (int64_t i = 0; i < m; i++) {
            const real p = P[i * ldp + j]; /* p = 0 too: 0·NaN is NaN, as in the GEMM */
            real *a = acc + i * ldacc;
            #pragma omp simd
            for (int64_t d = 0; d < Dv; d++) a[d] += p * v[d];
        }
    }
}
#endif

/* G (m, ldg) = the scores' product of rows [0, m) of Q (qn: their norms) with keys [j0, j0+n) of
 * head bh: q_g·k_g, or −½‖q_g − k_g‖² for a distance score (diff_fix where the expansion
 * cancelled: near as there), or 0 without a product. On the microkernel (f32; pk: the packed
 * keys) the expansion happens in its registers; f32 without pk (few query rows) takes
 * few_rows_scores; f64 BLAS and diff_tile. Returns how many pairs are near (their gradients
 * from the differences). */
static int64_t SFX(tile_scores)(const pn_attn_call *c, const mk_packed *pk, int64_t bh, int64_t m, int64_t j0,
                                int64_t n, const real *Q, const real *qn, real *G, int64_t ldg, uint8_t *near) {
    const int64_t qs = c->lq.n, ks = c->lk.n, Dg = c->Dg;
    if (c->st.plan.gemm == PN_GEMM_NONE) {
        for (int64_t i = 0; i < m; i++) memset(G + i * ldg, 0, sizeof(real) * (size_t)n);
        return 0;
    }
    const real *K = (const real *)c->k + pn_attn_at(c, c->lk, bh, j0);
    const real *kn = c->st.plan.diff ? (const real *)c->kt[0] + bh * c->Nk + j0 : NULL;
#if PN_DENSE_MK
    if (!pk) /* a call with few query rows: products read K in place */
        return SFX(few_rows_scores)(m, n, Dg, Q, qs, K, ks, kn != NULL, G, ldg, near);
    const pn_microkernel *mk = pk->mk;
    const int64_t NR = mk->nr, NB = mk->nb;
    const real *Kr = pk->Kr + bh * pk->nkp * Dg + j0 * Dg;
    if (!kn) {
        mk_prod(mk, m, n, Dg, Q, qs, 1, Kr, Dg * NR, G, ldg, 0);
        return 0;
    }
    int64_t cnt = 0;
    for (int64_t c0 = 0; c0 < n; c0 += NB) /* as mk_prod: a block's panels outermost */
        for (int64_t r0 = 0; r0 < m; r0 += mk->mr)
            cnt += mk->dist(m - r0 < mk->mr ? m - r0 : mk->mr, n - c0 < NB ? n - c0 : NB, Dg, Q + r0 * qs, qs,
                            Kr + (c0 / NR) * Dg * NR, Dg * NR, qn + r0, pk->kn + bh * pk->nkp + j0 + c0,
                            (real)PN_DIFF_NEAR, G + r0 * ldg + c0, ldg);
    return cnt ? SFX(diff_fix)(c, m, n, Q, K, qn, kn, G, ldg, near) : 0;
#else
    (void)pk;
    SFX(gemm_nt)(m, n, Dg, Q, qs, K, ks, 0, G, ldg);
    return kn ? SFX(diff_tile)(c, m, n, Q, K, qn, kn, G, ldg, near) : 0;
#endif
}

/* The chain of dG (tq, PN_TK) = ∂L/∂G into q and k for a distance score, ∂G/∂q_i = k_j − q_i:
 * far pairs leave dG for the GEMMs (dQ += dG·K, dK += dGᵀ·Q) and add −½·Σ dG to the norm
 * terms' gradients (dqt (tq, 2) slot 0, dkt0 (tk)), which the terms' backward turns into
 * −q·Σ dG; near pairs add dG·(k_j − q_i) and dG·(q_i − k_j) from the differences themselves
 * and are taken out of dG. */
PN_INLINE void SFX(diff_chain)(const pn_attn_call *c, int64_t tq, int64_t tk, const real *Q, const real *K,
                               const uint8_t *near, real *dG, double (*dqt)[2], real *dkt0, real *dQ, real *dK) {
    const int64_t qs = c->lq.n, ks = c->lk.n, Dg = c->Dg;
    for (int64_t i = 0; i < tq; i++) {
        real *g = dG + i * PN_TK;
        const uint8_t *nr = near + i * PN_TK;
        const real *q = Q + i * qs;
        real *dq = dQ + i * qs;
        double rs = 0;
        for (int64_t j = 0; j < tk; j++) {
            const real gj = g[j];
            if (!nr[j]) {
                rs += gj;
                dkt0[j] += (real)-0.5 * gj;
                continue;
            }
            if (gj != 0) {
                const real *kr = K + j * ks;
                real *dk = dK + j * ks;
                for (int64_t d = 0; d < Dg; d++) {
                    const real e = gj * (kr[d] - q[d]);
                    dq[d] += e;
                    dk[d] -= e;
                }
            }
            g[j] = 0;
        }
        dqt[i][0] += -0.5 * rs;
    }
}

/* ---- forward ----------------------------------------------------------------------------------- */
/* The end of a query tile [i0, i0+tq) of head bh: out rows and their statistics from the
 * accumulated acc (tq, ld), running max m and sum l. */
static void SFX(fwd_finish)(const pn_attn_call *c, int64_t bh, int64_t i0, int64_t tq, const real *acc, int64_t ld,
                            const real *m, const real *l, real *out, real *stat) {
    const int64_t Dv = c->Dv, Nq = c->Nq;
    const bool soft = c->st.normalize == PN_NORM_SOFTMAX;
    for (int64_t i = 0; i < tq; i++) {
        real *o = out + pn_attn_at(c, c->lo, bh, i0 + i);
        const real *a = acc + i * ld;
        const real li = l[i];
        if (li != li) { /* a NaN row (not a fully masked one) */
            for (int64_t d = 0; d < Dv; d++) o[d] = (real)NAN;
        } else if (c->st.normalized) {
            const real inv = li > 0 ? 1 / li : 0; /* a fully masked row gives 0 */
            for (int64_t d = 0; d < Dv; d++) o[d] = a[d] * inv;
        } else {
            memcpy(o, a, sizeof(real) * (size_t)Dv);
        }
        if (li != li) stat[bh * Nq + i0 + i] = li;
        else if (soft) stat[bh * Nq + i0 + i] = li > 0 ? m[i] + pn_log(li) : (real)-INFINITY;
        else stat[bh * Nq + i0 + i] = li;
    }
}

/* acc (m, Dv; row stride ldacc) += P (m, n; row stride ldp) · V's keys [j0, j0+n) of head bh:
 * the microkernel on V's packed panels (f32), else BLAS */
static inline void SFX(tile_pv)(const pn_attn_call *c, const mk_packed *pk, int64_t bh, int64_t m, int64_t j0,
                                int64_t n, const real *P, int64_t ldp, real *acc, int64_t ldacc) {
#if PN_DENSE_MK
    if (!pk) {
        SFX(few_rows_pv)(m, n, c->Dv, P, ldp, (const real *)c->v + pn_attn_at(c, c->lv, bh, j0), c->lv.n, acc, ldacc);
        return;
    }
    const int64_t NR = pk->mk->nr;
    mk_prod(pk->mk, m, c->Dv, n, P, ldp, 1, pk->Vc + bh * pk->Dvp * c->Nk + j0 * NR, c->Nk * NR, acc, ldacc, 1);
#else
    (void)pk;
    SFX(gemm_nn_acc)(m, c->Dv, n, P, ldp, (const real *)c->v + pn_attn_at(c, c->lv, bh, j0), c->lv.n, acc, ldacc);
#endif
}

/* One query tile [i0, i0+tq) of head bh: out rows (tq, Dv) and their statistics. The tile walks
 * the keys in tiles of PN_MK_TK (dense_mk.h): the tile's scores S (tq, PN_MK_TK), the score's
 * epilogue, the row modifiers and the online softmax, then acc (tq, ldacc) += P·V. Keys past
 * the tile's last row's causal limit are skipped; the row modifiers mask the rest. m, l (tq):
 * the running max and sum. */
PN_VEC static void SFX(fwd_tile)(const pn_attn_call *c, const mk_packed *pk, int64_t bh, int64_t i0, int64_t tq,
                                 real *S, real *acc, int64_t ldacc, real *m, real *l, real *out, real *stat) {
    const int64_t Dv = c->Dv, Nq = c->Nq, Nk = c->Nk, b = bh / c->H, h = bh % c->H;
    const pn_score_params *pp = &c->st.hp[h];
    const EPI_FWD_T fwd = c->st.plan.EPI_FWD;
    const bool soft = c->st.normalize == PN_NORM_SOFTMAX;
    const real *Q = (const real *)c->q + pn_attn_at(c, c->lq, bh, i0);
    const real *qt0 = c->qt[0] ? (const real *)c->qt[0] + bh * Nq + i0 : NULL;
    const real *qt1 = c->qt[1] ? (const real *)c->qt[1] + bh * Nq + i0 : NULL;
    const real *kt0 = c->kt[0] ? (const real *)c->kt[0] + bh * Nk : NULL;
    const real *kt1 = c->kt[1] ? (const real *)c->kt[1] + bh * Nk : NULL;
    const real *g = c->g ? (const real *)c->g + bh * Nk : NULL;

    memset(acc, 0, sizeof(real) * (size_t)(tq * ldacc));
    for (int64_t i = 0; i < tq; i++) m[i] = (real)-INFINITY, l[i] = 0;
    const int64_t kend = SFX(key_end)(c, i0, tq);
    for (int64_t j0 = 0; j0 < kend; j0 += PN_MK_TK) {
        const int64_t n = kend - j0 < PN_MK_TK ? kend - j0 : PN_MK_TK;
        SFX(tile_scores)(c, pk, bh, tq, j0, n, Q, qt0, S, PN_MK_TK, NULL);
        fwd(pp, tq, n, PN_MK_TK, S, qt0, qt1, kt0 ? kt0 + j0 : NULL, kt1 ? kt1 + j0 : NULL, S);
        for (int64_t i = 0; i < tq; i++) {
            real *s = S + i * PN_MK_TK;
            SFX(row_mods)(c, b, h, i0 + i, j0, n, s);
            if (soft) {
                const real alpha = SFX(row_softmax)(s, n, g ? g + j0 : NULL, &m[i], &l[i]);
                if (alpha != 1) {
                    real *a = acc + i * ldacc;
                    for (int64_t d = 0; d < Dv; d++) a[d] *= alpha;
                }
            } else {
                SFX(row_sigmoid)(s, n, g ? g + j0 : NULL, &l[i]);
            }
        }
        SFX(tile_pv)(c, pk, bh, tq, j0, n, S, PN_MK_TK, acc, ldacc);
    }
    SFX(fwd_finish)(c, bh, i0, tq, acc, ldacc, m, l, out, stat);
}

/* out (BH, Nq, Dv), stat (BH, Nq): logsumexp of the scores (softmax; −inf for a fully masked
 * row) or Σ_j σ(s_ij)·g_j (sigmoid). PN_OK, or an error (memory; PENUMBRA_CPU_KERNEL). */
static pn_status SFX(forward)(const pn_attn_call *c, real *out, real *stat) {
    mk_packed *pk = NULL;
    int64_t ldacc = c->Dv > 0 ? c->Dv : 1;
#if PN_DENSE_MK
    const pn_microkernel *mk = pn_mk_get();
    if (!mk) return PN_ERR_ARG; /* PENUMBRA_CPU_KERNEL names no kernel this CPU runs: the error is set */
    mk_packed pkd;
    if (c->Nq > PN_FEW_ROWS) { /* else pk stays NULL: few_rows_scores, few_rows_pv */
        PN_TRY(mk_pack(c, mk, (c->st.plan.gemm != PN_GEMM_NONE ? MK_KR : 0) | MK_VC, &pkd));
        pk = &pkd;
        ldacc = pkd.Dvp;
    }
#endif
    const int64_t nqt = (c->Nq + PN_MK_TQ - 1) / PN_MK_TQ, items = c->BH * nqt;
    int oom = 0;
    #pragma omp parallel if (items > 1 && c->Nq * c->Nk * c->BH * (c->D + c->Dv) > PN_PAR_MIN)
    {
        real *S = malloc(sizeof(real) * (size_t)(PN_MK_TQ * PN_MK_TK + PN_MK_TQ * (ldacc + 2)));
        real *acc = S ? S + PN_MK_TQ * PN_MK_TK : NULL, *m = acc ? acc + PN_MK_TQ * ldacc : NULL;
        if (!S) {
            #pragma omp atomic write
            oom = 1;
        }
        /* dynamic: causal tiles differ in cost; each item writes only its own rows */
        #pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            if (!S) continue;
            const int64_t bh = it / nqt, i0 = (it % nqt) * PN_MK_TQ;
            const int64_t tq = c->Nq - i0 < PN_MK_TQ ? c->Nq - i0 : PN_MK_TQ;
            SFX(fwd_tile)(c, pk, bh, i0, tq, S, acc, ldacc, m, m + PN_MK_TQ, out, stat);
        }
        free(S);
    }
    if (pk) mk_free(pk);
    return oom ? pn_error(PN_ERR_OOM, "%s: out of memory for tile buffers", c->op) : PN_OK;
}

/* ---- weights ------------------------------------------------------------------------------------ */
/* W (BH, Nq, Nk): the normalised weights α_ij (no Lorentz factors); stat (BH, Nq): the row
 * statistic the forward would save (logsumexp or Σσ), which the weights' backward reads. */
static pn_status SFX(weights)(const pn_attn_call *c, real *W, real *stat) {
    const int64_t nqt = (c->Nq + PN_TQ - 1) / PN_TQ, items = c->BH * nqt, Nk = c->Nk;
    int oom = 0;
    mk_packed *pk = NULL;
#if PN_DENSE_MK
    const pn_microkernel *mk = pn_mk_get();
    if (!mk) return PN_ERR_ARG; /* PENUMBRA_CPU_KERNEL names no kernel this CPU runs: the error is set */
    mk_packed pkd;
    if (c->Nq > PN_FEW_ROWS) { /* as the forward: few rows read K in place (the same scores) */
        PN_TRY(mk_pack(c, mk, c->st.plan.gemm != PN_GEMM_NONE ? MK_KR : 0, &pkd));
        pk = &pkd;
    }
#endif
    #pragma omp parallel if (items > 1 && c->Nq * c->Nk * c->BH * c->D > PN_PAR_MIN)
    {
        real *G = malloc(sizeof(real) * PN_TQ * PN_TK);
        if (!G) {
            #pragma omp atomic write
            oom = 1;
        }
        #pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            if (!G) continue;
            const int64_t bh = it / nqt, i0 = (it % nqt) * PN_TQ;
            const int64_t tq = c->Nq - i0 < PN_TQ ? c->Nq - i0 : PN_TQ, b = bh / c->H, h = bh % c->H;
            const pn_score_params *pp = &c->st.hp[h];
            const EPI_FWD_T fwd = c->st.plan.EPI_FWD;
            const real *Q = (const real *)c->q + pn_attn_at(c, c->lq, bh, i0);
            const real *qt0 = c->qt[0] ? (const real *)c->qt[0] + bh * c->Nq + i0 : NULL;
            const real *qt1 = c->qt[1] ? (const real *)c->qt[1] + bh * c->Nq + i0 : NULL;
            const real *kt0 = c->kt[0] ? (const real *)c->kt[0] + bh * Nk : NULL;
            const real *kt1 = c->kt[1] ? (const real *)c->kt[1] + bh * Nk : NULL;
            for (int64_t j0 = 0; j0 < Nk; j0 += PN_TK) {
                const int64_t tk = Nk - j0 < PN_TK ? Nk - j0 : PN_TK;
                SFX(tile_scores)(c, pk, bh, tq, j0, tk, Q, qt0, G, PN_TK, NULL);
                fwd(pp, tq, tk, PN_TK, G, qt0, qt1, kt0 ? kt0 + j0 : NULL, kt1 ? kt1 + j0 : NULL, G);
                for (int64_t i = 0; i < tq; i++) {
                    real *s = W + (bh * c->Nq + i0 + i) * Nk + j0;
                    memcpy(s, G + i * PN_TK, sizeof(real) * (size_t)tk);
                    SFX(row_mods)(c, b, h, i0 + i, j0, tk, s);
                }
            }
            for (int64_t i = 0; i < tq; i++) {
                real *s = W + (bh * c->Nq + i0 + i) * Nk;
                if (c->st.normalize == PN_NORM_SOFTMAX) {
                    real m = (real)-INFINITY, l = 0;
                    SFX(row_softmax)(s, Nk, NULL, &m, &l);
                    real inv = l != l ? l : l > 0 ? 1 / l : 0;
                    for (int64_t j = 0; j < Nk; j++) s[j] *= inv;
                    stat[bh * c->Nq + i0 + i] = l != l ? l : l > 0 ? m + pn_log(l) : (real)-INFINITY;
                } else {
                    real l = 0;
                    SFX(row_sigmoid)(s, Nk, NULL, &l);
                    stat[bh * c->Nq + i0 + i] = l;
                    if (c->st.normalize == PN_NORM_SIGMOID_NORMALIZED) {
                        real inv = l > 0 ? 1 / l : 0;
                        for (int64_t j = 0; j < Nk; j++) s[j] *= inv;
                    }
                }
            }
        }
        free(G);
    }
    if (pk) mk_free(pk);
    return oom ? pn_error(PN_ERR_OOM, "%s: out of memory for tile buffers", c->op) : PN_OK;
}

/* ---- backward ----------------------------------------------------------------------------------- */
typedef struct {
    const real *dout, *out, *stat;  /* (BH, Nq, Dv), (BH, Nq, Dv), (BH, Nq); weights: (BH, Nq, Nk) */
    pn_attn_lay ldo, lo;            /* the layouts of dout and out */
    bool weights;                   /* the weights' backward: out = W, dout = dW, no v */
    real *dq;                       /* (BH, Nq, D) in q's layout, zeroed; rows owned by their tile */
    real *dk[PN_MAX_SPLITS], *dv[PN_MAX_SPLITS];      /* per split: (BH, Nk, D), (BH, Nk, Dv) in k's and v's layouts, zeroed */
    real *dkt[PN_MAX_SPLITS][2], *dg[PN_MAX_SPLITS];  /* per split: (BH, Nk) or NULL, zeroed */
    double *dqt[2];                 /* (BH, Nq) or NULL */
    double *dparam;                 /* (BH, S, PN_NPARAM) */
    int64_t S;                      /* splits of each head's query tiles */
    int64_t tq;                     /* query rows per tile (pn_attn_bwd_tq) */
    real *gbias;                    /* bias gradient (bias's shape) or NULL */
    int64_t gbs[4];                 /* its canonical strides */
    int64_t gbias_numel;
    bool gbias_per_thread;          /* one copy per thread (the bias is shared between items) */
    const mk_packed *pk;            /* f32: K and V packed for the microkernel (else NULL: BLAS) */
} SFX(bwd_args);

typedef struct {
    real *G, *S, *P, *dP; /* (TQ, PN_TK), TQ = the args' tq */
    real *Drow;           /* (TQ) */
    uint8_t *near;        /* (TQ, PN_TK): distance scores' pairs computed from differences */
    real *save;           /* (PN_EPI_NSAVE, TQ, PN_TK) for scores with fwd_save / vjp_saved */
    /* microkernel (a->pk): the query tile's dO and Q_g in column panels (TQ·Dvp, TQ·Dgp),
     * dQ's accumulator (TQ, Dgp) and a key tile's dK or dV rows (PN_TK, max(Dgp, Dvp)) */
    real *dOp, *Qp, *dQacc, *T;
} SFX(bwd_scratch);

/* Query tiles split, split+S, … of head bh. */
PN_VEC static void SFX(bwd_item)(const pn_attn_call *c, const SFX(bwd_args) *a, int64_t bh, int64_t split,
                          SFX(bwd_scratch) *w, real *gbias) {
    const int64_t Dv = c->Dv, Dg = c->Dg, Nq = c->Nq, Nk = c->Nk, H = c->H;
    const int64_t b = bh / H, h = bh % H;
    const pn_score_params *pp = &c->st.hp[h];
    const EPI_FWD_T fwd = c->st.plan.EPI_FWD;
    const EPI_VJP_T vjp = c->st.plan.EPI_VJP;
    /* a score that can keep per-pair values from the recomputed forward for its VJP */
    const EPI_FWDS_T fwds = w->save ? c->st.plan.EPI_FWDS : NULL;
    const EPI_VJPS_T vjps = w->save ? c->st.plan.EPI_VJPS : NULL;
    const bool gemm = c->st.plan.gemm != PN_GEMM_NONE, diff = c->st.plan.diff;
    const int norm = c->st.normalize;
    const bool normalized = c->st.normalized;
    const int64_t qs = c->lq.n, ks = c->lk.n, vs = c->lv.n, os = a->lo.n, dos = a->ldo.n; /* row strides */
    const real *K = (const real *)c->k + pn_attn_at(c, c->lk, bh, 0);
    const real *V = c->v ? (const real *)c->v + pn_attn_at(c, c->lv, bh, 0) : NULL;
    const real *kt0 = c->kt[0] ? (const real *)c->kt[0] + bh * Nk : NULL;
    const real *kt1 = c->kt[1] ? (const real *)c->kt[1] + bh * Nk : NULL;
    const real *g = c->g ? (const real *)c->g + bh * Nk : NULL;
    real *dK = a->dk[split] + pn_attn_at(c, c->lk, bh, 0);
    real *dV = a->dv[split] ? a->dv[split] + pn_attn_at(c, c->lv, bh, 0) : NULL;
    real *dkt0 = a->dkt[split][0] ? a->dkt[split][0] + bh * Nk : NULL;
    real *dkt1 = a->dkt[split][1] ? a->dkt[split][1] + bh * Nk : NULL;
    real *dg = a->dg[split] ? a->dg[split] + bh * Nk : NULL;
    double *dparam = a->dparam + (bh * a->S + split) * PN_NPARAM;
    const int64_t TQ = a->tq, nqt = (Nq + TQ - 1) / TQ;

    for (int64_t t = split; t < nqt; t += a->S) {
        const int64_t i0 = t * TQ, tq = Nq - i0 < TQ ? Nq - i0 : TQ;
        const real *Q = (const real *)c->q + pn_attn_at(c, c->lq, bh, i0);
        /* the weights' backward is the output's with V = I: O = W, dO = dW and dP = dW */
        const int64_t Do = a->weights ? Nk : Dv;
        const real *dO = a->dout + pn_attn_at(c, a->ldo, bh, i0);
        const real *O = a->out + pn_attn_at(c, a->lo, bh, i0);
        const real *stat = a->stat + bh * Nq + i0;
        const real *qt0 = c->qt[0] ? (const real *)c->qt[0] + bh * Nq + i0 : NULL;
        const real *qt1 = c->qt[1] ? (const real *)c->qt[1] + bh * Nq + i0 : NULL;
        real *dQ = a->dq + pn_attn_at(c, c->lq, bh, i0);
#if PN_DENSE_MK
        /* pk NULL (few query rows, SFX(backward)): BLAS products below, as f64 */
        const mk_packed *pk = a->pk;
        const pn_microkernel *mk = pk ? pk->mk : NULL;
        const int64_t NR = mk ? mk->nr : 1, Dgp = pk ? pk->Dgp : Dg;
        if (pk && !a->weights) pn_mk_pack_cols(tq, Dv, dO, dos, (int)NR, TQ * NR, w->dOp);
        if (pk && gemm) {
            pn_mk_pack_cols(tq, Dg, Q, qs, (int)NR, TQ * NR, w->Qp);
            memset(w->dQacc, 0, sizeof(real) * (size_t)(tq * Dgp));
        }
#else
        const void *pk = NULL;
#endif
        double dqt[PN_TQ_BWD_MAX][2];
        memset(dqt, 0, sizeof dqt);
        for (int64_t i = 0; i < tq; i++) {
            real s = 0;
            if (normalized) {
                #pragma omp simd reduction(+ : s)
                for (int64_t d = 0; d < Do; d++) s += dO[i * dos + d] * O[i * os + d];
            }
            w->Drow[i] = s;
        }
        const int64_t kend = SFX(key_end)(c, i0, tq);
        for (int64_t j0 = 0; j0 < kend; j0 += PN_TK) {
            const int64_t tk = kend - j0 < PN_TK ? kend - j0 : PN_TK;
            const int64_t nnear = SFX(tile_scores)(c, a->pk, bh, tq, j0, tk, Q, qt0, w->G, PN_TK, w->near);
            /* weights P (the forward's, recomputed from the saved statistics) */
            if (fwds && vjps)
                fwds(pp, tq, tk, PN_TK, w->G, qt0, qt1, kt0 ? kt0 + j0 : NULL, kt1 ? kt1 + j0 : NULL, w->S, w->save);
            else
                fwd(pp, tq, tk, PN_TK, w->G, qt0, qt1, kt0 ? kt0 + j0 : NULL, kt1 ? kt1 + j0 : NULL, w->S);
            for (int64_t i = 0; i < tq; i++) {
                real *s = w->S + i * PN_TK, *p = w->P + i * PN_TK;
                SFX(row_mods)(c, b, h, i0 + i, j0, tk, s);
                const real st = stat[i];
                if (norm == PN_NORM_SOFTMAX) {
                    if (st == (real)-INFINITY) {
                        for (int64_t j = 0; j < tk; j++) p[j] = 0;
                    } else if (g) {
                        for (int64_t j = 0; j < tk; j++) p[j] = pn_exp_nonpos(s[j] - st) * g[j0 + j];
                    } else {
                        for (int64_t j = 0; j < tk; j++) p[j] = pn_exp_nonpos(s[j] - st); /* st = logsumexp >= s */
                    }
                } else {
                    const real inv = normalized ? (st > 0 ? 1 / st : 0) : 1;
                    for (int64_t j = 0; j < tk; j++) {
                        real sg = 1 / (1 + pn_exp(-s[j]));
                        s[j] = sg; /* keep σ for dS */
                        p[j] = (g ? sg * g[j0 + j] : sg) * inv;
                    }
                }
            }
            if (a->weights) {
                for (int64_t i = 0; i < tq; i++) memcpy(w->dP + i * PN_TK, dO + i * dos + j0, sizeof(real) * (size_t)tk);
            } else if (Dv == 0) {
                memset(w->dP, 0, sizeof(real) * TQ * PN_TK);
            } else if (pk) {
#if PN_DENSE_MK
                SFX(mk_prod_add)(mk, tk, Dv, tq, w->P, 1, PN_TK, w->dOp, TQ * NR, dV + j0 * vs, vs, w->T); /* dV += Pᵀ·dO */
                mk_prod(mk, tq, tk, Dv, dO, dos, 1, pk->Vr + bh * pk->nkp * Dv + j0 * Dv, Dv * NR, w->dP, PN_TK,
                        0); /* dP = dO·Vᵀ */
#endif
            } else {
                SFX(gemm_tn_acc)(tk, Dv, tq, w->P, PN_TK, dO, dos, dV + j0 * vs, vs); /* dV += Pᵀ·dO */
                SFX(gemm_nt)(tq, tk, Dv, dO, dos, V + j0 * vs, vs, 0, w->dP, PN_TK);  /* dP = dO·Vᵀ */
            }
            /* dS, then the score's VJP turns it into dG (in place) */
            for (int64_t i = 0; i < tq; i++) {
                real *ds = w->dP + i * PN_TK;
                const real *p = w->P + i * PN_TK, *s = w->S + i * PN_TK;
                const real Di = w->Drow[i];
                if (norm == PN_NORM_SOFTMAX) {
                    if (dg)
                        for (int64_t j = 0; j < tk; j++) dg[j0 + j] += (ds[j] - Di) * p[j] / g[j0 + j];
                    for (int64_t j = 0; j < tk; j++) ds[j] = p[j] * (ds[j] - Di);
                } else if (normalized) {
                    if (dg)
                        for (int64_t j = 0; j < tk; j++) dg[j0 + j] += (ds[j] - Di) * p[j] / g[j0 + j];
                    for (int64_t j = 0; j < tk; j++) ds[j] = p[j] * (1 - s[j]) * (ds[j] - Di);
                } else {
                    for (int64_t j = 0; j < tk; j++) ds[j] = ds[j] * s[j] * (1 - s[j]);
                }
                if (gbias) {
                    real *gr = gbias + b * a->gbs[0] + h * a->gbs[1] + (i0 + i) * a->gbs[2] + j0 * a->gbs[3];
                    for (int64_t j = 0; j < tk; j++) gr[j * a->gbs[3]] += ds[j];
                }
            }
            if (fwds && vjps)
                vjps(pp, tq, tk, PN_TK, w->G, qt0, qt1, kt0 ? kt0 + j0 : NULL, kt1 ? kt1 + j0 : NULL, w->dP, w->dP,
                     &dqt[0][0], dkt0 ? dkt0 + j0 : NULL, dkt1 ? dkt1 + j0 : NULL, dparam, w->save);
            else
                vjp(pp, tq, tk, PN_TK, w->G, qt0, qt1, kt0 ? kt0 + j0 : NULL, kt1 ? kt1 + j0 : NULL, w->dP, w->dP,
                    &dqt[0][0], dkt0 ? dkt0 + j0 : NULL, dkt1 ? dkt1 + j0 : NULL, dparam);
            if (diff) { /* ∂G/∂q = k − q: the norms' share, and the near pairs from their differences */
                if (nnear) SFX(diff_chain)(c, tq, tk, Q, K + j0 * ks, w->near, w->dP, dqt, dkt0 + j0, dQ, dK + j0 * ks);
                else
                    for (int64_t i = 0; i < tq; i++) {
                        real rs = 0; /* as the epilogues sum their d.q0 */
                        const real *gr = w->dP + i * PN_TK;
                        real *dk0 = dkt0 + j0;
                        #pragma omp simd reduction(+ : rs)
                        for (int64_t j = 0; j < tk; j++) {
                            rs += gr[j];
                            dk0[j] += (real)-0.5 * gr[j];
                        }
                        dqt[i][0] += -0.5 * (double)rs;
                    }
            }
            if (gemm && pk) {
#if PN_DENSE_MK
                mk_prod(mk, tq, Dg, tk, w->dP, PN_TK, 1, pk->Kc + bh * Dgp * Nk + j0 * NR, Nk * NR, w->dQacc, Dgp,
                        1);                                                               /* dQ += dG·K */
                SFX(mk_prod_add)(mk, tk, Dg, tq, w->dP, 1, PN_TK, w->Qp, TQ * NR, dK + j0 * ks, ks, w->T); /* dK += dGᵀ·Q */
#endif
            } else if (gemm) {
                SFX(gemm_nn_acc)(tq, Dg, tk, w->dP, PN_TK, K + j0 * ks, ks, dQ, qs); /* dQ += dG·K */
                SFX(gemm_tn_acc)(tk, Dg, tq, w->dP, PN_TK, Q, qs, dK + j0 * ks, ks); /* dK += dGᵀ·Q */
            }
        }
#if PN_DENSE_MK
        if (gemm && pk) SFX(add_rows)(tq, Dg, w->dQacc, Dgp, dQ, qs);
#endif
        for (int m = 0; m < 2; m++)
            if (a->dqt[m])
                for (int64_t i = 0; i < tq; i++) a->dqt[m][bh * Nq + i0 + i] = dqt[i][m];
    }
}

static pn_status SFX(backward)(const pn_attn_call *c, SFX(bwd_args) *a) {
    const int64_t items = c->BH * a->S;
    int oom = 0;
#if PN_DENSE_MK
    const pn_microkernel *mk = pn_mk_get();
    if (!mk) return PN_ERR_ARG; /* PENUMBRA_CPU_KERNEL names no kernel this CPU runs: the error is set */
    mk_packed pk;
    const unsigned which = (c->st.plan.gemm != PN_GEMM_NONE ? MK_KR | MK_KC : 0) | (a->weights ? 0 : MK_VR);
    a->pk = NULL; /* few query rows: the forward's scores read K in place, so the recomputed ones must too */
    if (c->Nq > PN_FEW_ROWS) {
        PN_TRY(mk_pack(c, mk, which, &pk));
        a->pk = &pk;
    }
#endif
    #pragma omp parallel if (items > 1 && c->Nq * c->Nk * c->BH * (c->D + c->Dv) > PN_PAR_MIN)
    {
        SFX(bwd_scratch) w;
        const int nsave = c->st.plan.EPI_FWDS && c->st.plan.EPI_VJPS ? PN_EPI_NSAVE : 0;
        const int64_t TQ = a->tq;
        real *buf = malloc(sizeof(real) * (size_t)(TQ * PN_TK * (4 + nsave) + TQ));
        w.G = buf;
        w.S = buf ? buf + TQ * PN_TK : NULL;
        w.P = buf ? buf + 2 * TQ * PN_TK : NULL;
        w.dP = buf ? buf + 3 * TQ * PN_TK : NULL;
        w.Drow = buf ? buf + 4 * TQ * PN_TK : NULL;
        w.save = buf && nsave ? buf + 4 * TQ * PN_TK + TQ : NULL;
        w.near = buf ? malloc((size_t)(TQ * PN_TK)) : NULL;
        real *mkbuf = NULL;
        w.dOp = w.Qp = w.dQacc = w.T = NULL;
#if PN_DENSE_MK
        if (a->pk) {
            const int64_t Dgp = a->pk->Dgp, Dvp = a->pk->Dvp, wide = Dgp > Dvp ? Dgp : Dvp;
            mkbuf = malloc(sizeof(real) * (size_t)(TQ * (Dvp + 2 * Dgp) + PN_TK * wide + 1));
            if (mkbuf) {
                w.dOp = mkbuf, w.Qp = w.dOp + TQ * Dvp, w.dQacc = w.Qp + TQ * Dgp;
                w.T = w.dQacc + TQ * Dgp;
            } else {
                free(buf); /* reported below as buf's failure */
                buf = NULL;
            }
        }
#endif
        real *gbias = a->gbias;
        if (gbias && a->gbias_per_thread) gbias += (int64_t)omp_get_thread_num() * a->gbias_numel;
        if (!buf || !w.near) {
            #pragma omp atomic write
            oom = 1;
        }
        /* static: with a per-thread bias gradient, which thread does which item must not
         * depend on timing (determinism); items have equal cost (strided query tiles) */
        #pragma omp for schedule(static)
        for (int64_t it = 0; it < items; it++)
            if (buf && w.near) SFX(bwd_item)(c, a, it / a->S, it % a->S, &w, gbias);
        free(buf);
        free(w.near);
        free(mkbuf);
    }
#if PN_DENSE_MK
    if (a->pk) mk_free(&pk);
    a->pk = NULL;
#endif
    return oom ? pn_error(PN_ERR_OOM, "%s: out of memory for tile buffers", c->op) : PN_OK;
}

/* ---- term and Lorentz-factor backward (shared with graph.c) ---------------------------------- */
/* dx (BH, N, D) += Σ_m dt_m ∘ ∂term_m/∂x; da (H, D) += for PROJ terms. x and dx: layout l (c->lq
 * or c->lk) */
static void SFX(terms_backward)(const pn_attn_call *c, const int kind[2], const real *x, pn_attn_lay l, int64_t N,
                                double *const dt[2], const real *a, real *dx, double *da) {
    const int64_t D = c->D, Dg = c->Dg;
    #pragma omp parallel for if (c->BH * N * D > PN_PAR_MIN) schedule(static)
    for (int64_t bh = 0; bh < c->BH; bh++) {
        const int64_t h = bh % c->H;
        for (int m = 0; m < 2; m++) {
            if (!dt[m] || kind[m] == PN_TERM_NONE) continue;
            for (int64_t r = 0; r < N; r++) {
                const int64_t row = pn_attn_row(c, bh, r, N);
                const double t = dt[m][row];
                if (t == 0) continue;
                const int64_t xo = pn_attn_xat(c, l, bh, r, N, D);
                const real *xr = x + xo;
                real *gr = dx + xo;
                if (kind[m] == PN_TERM_NORM2) {
                    for (int64_t d = 0; d < Dg; d++) gr[d] += (real)(2 * t) * xr[d];
                } else if (kind[m] == PN_TERM_LAST) {
                    gr[D - 1] += (real)t;
                } else {
                    const real *ah = a + h * D;
                    for (int64_t d = 0; d < D; d++) gr[d] += (real)t * ah[d];
                }
            }
        }
    }
    if (!da) return;
    /* ∂(a·x)/∂a = x: serial over (b, rows) in a fixed order, per head */
    for (int m = 0; m < 2; m++) {
        if (!dt[m] || kind[m] != PN_TERM_PROJ) continue;
        for (int64_t bh = 0; bh < c->BH; bh++) {
            double *dah = da + (bh % c->H) * D;
            for (int64_t r = 0; r < N; r++) {
                const int64_t row = pn_attn_row(c, bh, r, N);
                const double t = dt[m][row];
                const real *xr = x + pn_attn_xat(c, l, bh, r, N, D);
                for (int64_t d = 0; d < D; d++) dah[d] += t * xr[d];
            }
        }
    }
}

/* dv (BH, Nk, Dv) += dg_j·κγ_j³·v_j; dcurv[h] += Σ dg_j·½‖v_j‖²γ_j³ (γ = 1/√(1 − κ‖v‖²)) */
static void SFX(lorentz_backward)(const pn_attn_call *c, const double *dgsum, real *dv, double *dcurv) {
    for (int64_t bh = 0; bh < c->BH; bh++) {
        const double kap = c->st.hp[bh % c->H].v[PN_P_curvature];
        double acc = 0;
        for (int64_t j = 0; j < c->Nk; j++) {
            const int64_t x = pn_attn_row(c, bh, j, c->Nk);
            const double gj = ((const real *)c->g)[x], t = dgsum[x];
            if (t == 0) continue;
            const int64_t xo = pn_attn_xat(c, c->lv, bh, j, c->Nk, c->Dv);
            const real *vr = (const real *)c->v + xo;
            real *gr = dv + xo;
            double n2 = 0;
            for (int64_t d = 0; d < c->Dv; d++) n2 += (double)vr[d] * vr[d];
            const double g3 = gj * gj * gj;
            for (int64_t d = 0; d < c->Dv; d++) gr[d] += (real)(t * kap * g3 * vr[d]);
            acc += t * 0.5 * n2 * g3;
        }
        if (dcurv) dcurv[bh % c->H] += acc;
    }
}

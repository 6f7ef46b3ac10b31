/* graph_impl.h — the typed body of the graph driver, included twice by graph.c (real = float,
 * SFX(x) = x##_f32, EPI_* = plan.*32; then double). No include guard on purpose.
 *
 * Layout: node-major throughout (pn_attn_call.nm): q, k (N, H, D), v (N, H, Dv), the terms,
 * Lorentz factors and NaN flags of pn_attn_call (N, H); dout / out (N, H, Dv) like the user's
 * tensors; per-edge arrays (E, H); stat (H, N). Destination node i attends to src[e] for e in
 * [off[i], off[i+1]). Every kernel works per node with all its heads together: one pass over
 * the node's edges reads each neighbour's row of k (or v, q, dout: H·D numbers, contiguous)
 * once for all heads, into per-node scratch laid out (H, ld) so that each head's scores are a
 * contiguous row for the score's epilogue. */

/* Per-node scratch: rows of ld numbers, head h of array A at A + h·ld. */
#define GROWS(H, ld) ((H) * (ld))
/* nodes per scheduling chunk (dynamic: degrees differ) */
#define GCHUNK 32

/* G (H, ld): q_g·k_g (or −½‖q_g − k_g‖² for a distance score, attention.h) of node i's query
 * against its deg neighbours sr[0…deg), every head; K0, K1, GV (H, ld): the keys' column
 * terms and Lorentz factors, where they exist. D, Dg: compile-time constants where the
 * caller dispatches on them (the dot products then unroll). */
PN_INLINE void SFX(ggather)(const pn_attn_call *c, const int64_t *sr, int64_t deg, int64_t i, int64_t ld, real *G,
                            real *K0, real *K1, real *GV, const int64_t H, const int64_t D, const int64_t Dg) {
    const bool gemm = c->st.plan.gemm != PN_GEMM_NONE, diff = c->st.plan.diff;
    const real *qi = (const real *)c->q + i * H * D;
    if (gemm) {
        for (int64_t e = 0; e < deg; e++) {
            const real *kj = (const real *)c->k + sr[e] * H * D;
            for (int64_t h = 0; h < H; h++) {
                const real *a = qi + h * D, *b = kj + h * D;
                real acc = 0;
                if (diff) { /* a distance score: G = −½‖q_g − k_g‖², from the differences (attention.h) */
                    for (int64_t d = 0; d < Dg; d++) {
                        const real t = a[d] - b[d];
                        acc += t * t;
                    }
                    acc *= (real)-0.5;
                } else {
                    for (int64_t d = 0; d < Dg; d++) acc += a[d] * b[d];
                }
                G[h * ld + e] = acc;
            }
        }
    } else {
        for (int64_t h = 0; h < H; h++)
            for (int64_t e = 0; e < deg; e++) G[h * ld + e] = 0;
    }
    /* the keys' terms and Lorentz factors: (N, H) rows, one per neighbour, each spread over the
     * node's (H, ld) scratch (written out per array so the head loop unrolls) */
    if (c->kt[0])
        for (int64_t e = 0; e < deg; e++)
            for (int64_t h = 0; h < H; h++) K0[h * ld + e] = ((const real *)c->kt[0])[sr[e] * H + h];
    if (c->kt[1])
        for (int64_t e = 0; e < deg; e++)
            for (int64_t h = 0; h < H; h++) K1[h * ld + e] = ((const real *)c->kt[1])[sr[e] * H + h];
    if (c->g && GV)
        for (int64_t e = 0; e < deg; e++)
            for (int64_t h = 0; h < H; h++) GV[h * ld + e] = ((const real *)c->g)[sr[e] * H + h];
}

/* S (H, ld): the scores of node i over its neighbours from G, K0, K1 (ggather), every head;
 * NaN for every edge that reads a non-finite q or k row (NaN in, NaN out). */
PN_INLINE void SFX(gscores)(const pn_attn_call *c, const int64_t *sr, int64_t deg, int64_t i, int64_t ld,
                            const real *G, const real *K0, const real *K1, real *S, const int64_t H) {
    for (int64_t h = 0; h < H; h++) {
        const real *q0 = c->qt[0] ? (const real *)c->qt[0] + i * H + h : NULL;
        const real *q1 = c->qt[1] ? (const real *)c->qt[1] + i * H + h : NULL;
        c->st.plan.EPI_FWD(&c->st.hp[h], 1, deg, deg, G + h * ld, q0, q1, c->kt[0] ? K0 + h * ld : NULL,
                           c->kt[1] ? K1 + h * ld : NULL, S + h * ld);
    }
    if (c->qbad || c->kbad)
        for (int64_t h = 0; h < H; h++) {
            const bool qb = c->qbad && c->qbad[i * H + h];
            for (int64_t e = 0; e < deg; e++)
                if (qb || (c->kbad && c->kbad[sr[e] * H + h])) S[h * ld + e] = (real)NAN;
        }
}

/* s (deg) → normalised weights w (deg), including the Lorentz factors gv (deg, or NULL) of
 * einstein; returns the statistic (logsumexp or Σσγ; −inf / 0 when the node has no neighbour). */
PN_INLINE real SFX(gweights)(const pn_attn_call *c, int64_t deg, const real *gv, const real *s, real *w) {
    if (c->st.normalize == PN_NORM_SOFTMAX) {
        real m = (real)-INFINITY;
        int nan = 0;
        #pragma omp simd reduction(max : m) reduction(| : nan)
        for (int64_t e = 0; e < deg; e++) {
            m = s[e] > m ? s[e] : m;
            nan |= s[e] != s[e];
        }
        if (nan || m == (real)INFINITY) { /* NaN in, NaN out (a +inf score too) */
            for (int64_t e = 0; e < deg; e++) w[e] = (real)NAN;
            return (real)NAN;
        }
        if (m == (real)-INFINITY) {
            for (int64_t e = 0; e < deg; e++) w[e] = 0;
            return (real)-INFINITY;
        }
        /* the exponentials vectorize; the sum keeps its order */
        if (gv)
            for (int64_t e = 0; e < deg; e++) w[e] = pn_exp_nonpos(s[e] - m) * gv[e];
        else
            for (int64_t e = 0; e < deg; e++) w[e] = pn_exp_nonpos(s[e] - m);
        real z = 0;
        for (int64_t e = 0; e < deg; e++) z += w[e];
        for (int64_t e = 0; e < deg; e++) w[e] /= z;
        return m + pn_log(z);
    }
    if (gv)
        for (int64_t e = 0; e < deg; e++) w[e] = 1 / (1 + pn_exp(-s[e])) * gv[e];
    else
        for (int64_t e = 0; e < deg; e++) w[e] = 1 / (1 + pn_exp(-s[e]));
    real z = 0;
    for (int64_t e = 0; e < deg; e++) z += w[e];
    if (c->st.normalized) {
        real inv = z != z ? z : z > 0 ? 1 / z : 0;
        for (int64_t e = 0; e < deg; e++) w[e] *= inv;
    }
    return z;
}

/* One destination node of the forward (buf: 5 (H, ld) rows of scratch). */
PN_INLINE void SFX(gnode_fwd)(const pn_attn_call *c, const int64_t *off, const int64_t *src, int64_t i, int64_t ld,
                              const real *drop, real *out, real *stat, real *wedge, real *buf, const int64_t H,
                              const int64_t D, const int64_t Dg, const int64_t Dv) {
    const int64_t N = c->Nq, e0 = off[i], deg = off[i + 1] - off[i];
    const int64_t R = GROWS(H, ld);
    real *G = buf, *K0 = G + R, *K1 = K0 + R, *GV = K1 + R, *S = GV + R;
    const int64_t *sr = src + e0;
    SFX(ggather)(c, sr, deg, i, ld, G, K0, K1, GV, H, D, Dg);
    SFX(gscores)(c, sr, deg, i, ld, G, K0, K1, S, H);
    real *W = G; /* G is read by the epilogue only: the weights take its place */
    for (int64_t h = 0; h < H; h++) {
        stat[h * N + i] = SFX(gweights)(c, deg, c->g ? GV + h * ld : NULL, S + h * ld, W + h * ld);
        if (wedge)
            for (int64_t e = 0; e < deg; e++) wedge[(e0 + e) * H + h] = W[h * ld + e];
    }
    if (!out) return;
    real *o = out + i * H * Dv;
    for (int64_t x = 0; x < H * Dv; x++) o[x] = 0;
    for (int64_t e = 0; e < deg; e++) {
        const real *vj = (const real *)c->v + sr[e] * H * Dv;
        for (int64_t h = 0; h < H; h++) {
            const real we = drop ? W[h * ld + e] * drop[(e0 + e) * H + h] : W[h * ld + e];
            if (we == 0) continue; /* a dropped or zero weight reads nothing (NaN weights do) */
            for (int64_t d = 0; d < Dv; d++) o[h * Dv + d] += we * vj[h * Dv + d];
        }
    }
}

/* The common shapes get the per-node bodies with H, D, Dg, Dv as constants (the loops over
 * a node's heads then unroll and vectorize); the rest the same bodies with runtime sizes. */
#define GDISPATCH(BODY)                                                                                             \
    do {                                                                                                            \
        const int64_t H_ = c->H, D_ = c->D, Dg_ = c->Dg, Dv_ = c->Dv;                                             \
        if (H_ == 4 && D_ == 4 && Dv_ == 4 && Dg_ == 4) BODY(4, 4, 4, 4);                                           \
        else if (H_ == 4 && D_ == 4 && Dv_ == 4 && Dg_ == 3) BODY(4, 4, 3, 4);                                      \
        else if (H_ == 4 && D_ == 4 && Dv_ == 3 && Dg_ == 3) BODY(4, 4, 3, 3); /* einstein: Klein values */        \
        else if (H_ == 8 && D_ == 8 && Dv_ == 8 && Dg_ == 8) BODY(8, 8, 8, 8);                                      \
        else if (H_ == 1) BODY(1, D_, Dg_, Dv_);                                                                    \
        else BODY(H_, D_, Dg_, Dv_);                                                                                \
    } while (0)

/* Nodes [i0, i1) of the forward, compiled for the vector ISAs (PN_VEC) */
PN_VEC static void SFX(gfwd_range)(const pn_attn_call *c, const int64_t *off, const int64_t *src, int64_t i0,
                                   int64_t i1, int64_t ld, const real *drop, real *out, real *stat, real *wedge,
                                   real *buf) {
#define GFWD_BODY(H, D, Dg, Dv)                                                                                     \
    for (int64_t i = i0; i < i1; i++) SFX(gnode_fwd)(c, off, src, i, ld, drop, out, stat, wedge, buf, H, D, Dg, Dv)
    GDISPATCH(GFWD_BODY);
#undef GFWD_BODY
}

/* out (N, H, Dv) node-major, stat (H, N); drop (E, H) scaled dropout mask or NULL.
 * pn_graph_attention_weights passes out = NULL and wedge (E, H), which receives the weights w
 * per edge in CSR order (before dropout) instead of the aggregation. */
static pn_status SFX(gforward)(const pn_attn_call *c, const int64_t *off, const int64_t *src, int64_t maxdeg,
                               const real *drop, real *out, real *stat, real *wedge) {
    const int64_t N = c->Nq, H = c->H, ld = maxdeg + 1;
    int oom = 0;
    #pragma omp parallel if (off[N] * H * (c->D + c->Dv) > PN_PAR_MIN)
    {
        real *buf = malloc(sizeof(real) * (size_t)(5 * GROWS(H, ld)));
        if (!buf) {
            #pragma omp atomic write
            oom = 1;
        }
        /* dynamic: degrees differ; each node writes only its own rows */
        #pragma omp for schedule(dynamic, 1)
        for (int64_t i0 = 0; i0 < N; i0 += GCHUNK)
            if (buf) SFX(gfwd_range)(c, off, src, i0, i0 + GCHUNK < N ? i0 + GCHUNK : N, ld, drop, out, stat, wedge, buf);
        free(buf);
    }
    return oom ? pn_error(PN_ERR_OOM, "%s: out of memory for edge buffers", c->op) : PN_OK;
}

typedef struct {
    const real *dout, *out, *stat, *drop; /* (N, H, Dv), (N, H, Dv), (H, N), (E, H) or NULL */
    bool weights;                         /* the weights' backward: dout = dW (E, H), no v */
    real *dq;                             /* (N, H, D), zeroed */
    double *dqt[2];                       /* (N, H) or NULL */
    double *dparam;                       /* (N, H, PN_NPARAM), or NULL when no parameter is learnable */
    real *eG, *ek[2], *ew, *edg;          /* per edge (E, H): dG, ∂L/∂k-terms, m·w, ∂L/∂γ(v_src) */
} SFX(gbw_args);

/* One destination node of backward pass 1 (buf: 8 (H, ld) rows of scratch). */
PN_INLINE void SFX(gnode_bw1)(const pn_attn_call *c, const int64_t *off, const int64_t *src, int64_t i, int64_t ld,
                              const SFX(gbw_args) *a, real *buf, const int64_t H, const int64_t D, const int64_t Dg,
                              const int64_t Dv) {
    const int64_t N = c->Nq, e0 = off[i], deg = off[i + 1] - off[i];
    const int norm = c->st.normalize;
    const bool normalized = c->st.normalized, gemm = c->st.plan.gemm != PN_GEMM_NONE, diff = c->st.plan.diff;
    const int64_t R = GROWS(H, ld);
    real *G = buf, *K0 = G + R, *K1 = K0 + R, *GV = K1 + R, *S = GV + R, *W = S + R, *DK0 = W + R, *DK1 = DK0 + R;
    real *DP = DK0; /* dP per edge, read before the VJP writes DK0 */
    const int64_t *sr = src + e0;
    SFX(ggather)(c, sr, deg, i, ld, G, K0, K1, GV, H, D, Dg);
    SFX(gscores)(c, sr, deg, i, ld, G, K0, K1, S, H);
    /* dP = dO_i·v_j per edge and head (or dW for the weights' backward), times the dropout mask */
    if (a->weights) {
        for (int64_t e = 0; e < deg; e++)
            for (int64_t h = 0; h < H; h++) DP[h * ld + e] = a->dout[(e0 + e) * H + h];
    } else {
        const real *dO = a->dout + i * H * Dv;
        for (int64_t e = 0; e < deg; e++) {
            const real *vj = (const real *)c->v + sr[e] * H * Dv;
            for (int64_t h = 0; h < H; h++) {
                real dp = 0;
                for (int64_t d = 0; d < Dv; d++) dp += dO[h * Dv + d] * vj[h * Dv + d];
                DP[h * ld + e] = dp;
            }
        }
    }
    for (int64_t h = 0; h < H; h++) {
        const pn_score_params *pp = &c->st.hp[h];
        const real *dO = a->weights ? NULL : a->dout + (i * H + h) * Dv;
        const real *O = a->weights ? NULL : a->out + (i * H + h) * Dv;
        const real *gv = c->g ? GV + h * ld : NULL;
        real *s = S + h * ld, *w = W + h * ld, *dpv = DP + h * ld, *dk0 = DK0 + h * ld, *dk1 = DK1 + h * ld;
        /* the forward's weights, from the saved statistic */
        const real st = a->stat[h * N + i];
        if (norm == PN_NORM_SOFTMAX) {
            if (st == (real)-INFINITY)
                for (int64_t e = 0; e < deg; e++) w[e] = 0;
            else if (gv)
                for (int64_t e = 0; e < deg; e++) w[e] = pn_exp_nonpos(s[e] - st) * gv[e];
            else
                for (int64_t e = 0; e < deg; e++) w[e] = pn_exp_nonpos(s[e] - st);
        } else {
            for (int64_t e = 0; e < deg; e++) {
                const real ge = gv ? gv[e] : 1;
                real sg = 1 / (1 + pn_exp(-s[e]));
                s[e] = sg;
                w[e] = normalized ? (st > 0 ? sg * ge / st : 0) : sg * ge;
            }
        }
        /* the weights' backward: dP = dW per edge, D_i = Σ_e dW_e·w_e, nothing reaches v */
        real Di = 0;
        if (normalized && a->weights)
            for (int64_t e = 0; e < deg; e++) Di += dpv[e] * w[e];
        else if (normalized)
            for (int64_t d = 0; d < Dv; d++) Di += dO[d] * O[d];
        for (int64_t e = 0; e < deg; e++) {
            const int64_t eh = (e0 + e) * H + h;
            const real m = a->drop ? a->drop[eh] : 1;
            const real dp = dpv[e] * m;
            a->ew[eh] = a->weights ? 0 : m * w[e];
            real ds;
            if (norm == PN_NORM_SOFTMAX) ds = w[e] * (dp - Di);
            else if (normalized) ds = w[e] * (1 - s[e]) * (dp - Di);
            else ds = dp * s[e] * (1 - s[e]);
            if (a->edg) a->edg[eh] = (dp - Di) * w[e] / gv[e];
            s[e] = ds; /* s now holds dS */
        }
        for (int64_t e = 0; e < deg; e++) dk0[e] = 0, dk1[e] = 0; /* dP is spent */
        double dqt[2] = {0, 0};
        const real *q0 = c->qt[0] ? (const real *)c->qt[0] + i * H + h : NULL;
        const real *q1 = c->qt[1] ? (const real *)c->qt[1] + i * H + h : NULL;
        c->st.plan.EPI_VJP(pp, 1, deg, deg, G + h * ld, q0, q1, c->kt[0] ? K0 + h * ld : NULL,
                           c->kt[1] ? K1 + h * ld : NULL, s, s, dqt, c->kt[0] ? dk0 : NULL, c->kt[1] ? dk1 : NULL,
                           a->dparam ? a->dparam + (i * H + h) * PN_NPARAM : NULL);
        for (int m = 0; m < 2; m++)
            if (a->dqt[m]) a->dqt[m][i * H + h] = dqt[m];
        for (int64_t e = 0; e < deg; e++) {
            const int64_t eh = (e0 + e) * H + h;
            a->eG[eh] = s[e];
            if (a->ek[0]) a->ek[0][eh] = dk0[e];
            if (a->ek[1]) a->ek[1][eh] = dk1[e];
        }
    }
    if (!gemm) return;
    /* ∂G/∂q: k, or k − q for a distance score; every head of a neighbour's row at once */
    real *dqi = a->dq + i * H * D;
    const real *qi = (const real *)c->q + i * H * D;
    for (int64_t e = 0; e < deg; e++) {
        const real *kj = (const real *)c->k + sr[e] * H * D;
        for (int64_t h = 0; h < H; h++) {
            const real dG = S[h * ld + e];
            if (dG == 0) continue;
            if (diff)
                for (int64_t d = 0; d < Dg; d++) dqi[h * D + d] += dG * (kj[h * D + d] - qi[h * D + d]);
            else
                for (int64_t d = 0; d < Dg; d++) dqi[h * D + d] += dG * kj[h * D + d];
        }
    }
}

PN_VEC static void SFX(gbw1_range)(const pn_attn_call *c, const int64_t *off, const int64_t *src, int64_t i0,
                                   int64_t i1, int64_t ld, const SFX(gbw_args) *a, real *buf) {
#define GBW1_BODY(H, D, Dg, Dv) for (int64_t i = i0; i < i1; i++) SFX(gnode_bw1)(c, off, src, i, ld, a, buf, H, D, Dg, Dv)
    GDISPATCH(GBW1_BODY);
#undef GBW1_BODY
}

/* Pass 1, per destination node: dS, the score's VJP, dQ; per-edge results for pass 2. */
static pn_status SFX(gbackward1)(const pn_attn_call *c, const int64_t *off, const int64_t *src, int64_t maxdeg,
                                 const SFX(gbw_args) *a) {
    const int64_t N = c->Nq, H = c->H, ld = maxdeg + 1;
    int oom = 0;
    #pragma omp parallel if (off[N] * H * (c->D + c->Dv) > PN_PAR_MIN)
    {
        real *buf = malloc(sizeof(real) * (size_t)(8 * GROWS(H, ld)));
        if (!buf) {
            #pragma omp atomic write
            oom = 1;
        }
        #pragma omp for schedule(dynamic, 1)
        for (int64_t i0 = 0; i0 < N; i0 += GCHUNK)
            if (buf) SFX(gbw1_range)(c, off, src, i0, i0 + GCHUNK < N ? i0 + GCHUNK : N, ld, a, buf);
        free(buf);
    }
    return oom ? pn_error(PN_ERR_OOM, "%s: out of memory for edge buffers", c->op) : PN_OK;
}

/* One source node j of pass 2: dk, dv rows (H·D, H·Dv) and the column sums over its edges. */
PN_INLINE void SFX(gnode_bw2)(const pn_attn_call *c, const int64_t *roff, const int64_t *rev, const int64_t *dst,
                              const SFX(gbw_args) *a, int64_t j, real *dk, real *dv, double *dkt[2], double *dg,
                              const int64_t H, const int64_t D, const int64_t Dg, const int64_t Dv) {
    const bool gemm = c->st.plan.gemm != PN_GEMM_NONE, diff = c->st.plan.diff;
    real *dkj = dk + j * H * D, *dvj = dv ? dv + j * H * Dv : NULL; /* no dv: the weights' backward */
    const real *kj = (const real *)c->k + j * H * D;
    for (int64_t r = roff[j]; r < roff[j + 1]; r++) {
        const int64_t e = rev[r], i = dst[e];
        const real *eG = a->eG + e * H, *ew = a->ew + e * H;
        if (gemm) { /* ∂G/∂k: q, or q − k for a distance score */
            const real *qi = (const real *)c->q + i * H * D;
            for (int64_t h = 0; h < H; h++) {
                const real dG = eG[h];
                if (dG == 0) continue;
                if (diff)
                    for (int64_t d = 0; d < Dg; d++) dkj[h * D + d] += dG * (qi[h * D + d] - kj[h * D + d]);
                else
                    for (int64_t d = 0; d < Dg; d++) dkj[h * D + d] += dG * qi[h * D + d];
            }
        }
        for (int64_t h = 0; h < H && dvj; h++) {
            const real we = ew[h];
            if (we == 0) continue;
            const real *dO = a->dout + (i * H + h) * Dv;
            for (int64_t d = 0; d < Dv; d++) dvj[h * Dv + d] += we * dO[d];
        }
        if (dkt[0])
            for (int64_t h = 0; h < H; h++) dkt[0][j * H + h] += a->ek[0][e * H + h];
        if (dkt[1])
            for (int64_t h = 0; h < H; h++) dkt[1][j * H + h] += a->ek[1][e * H + h];
        if (dg)
            for (int64_t h = 0; h < H; h++) dg[j * H + h] += a->edg[e * H + h];
    }
}

PN_VEC static void SFX(gbw2_range)(const pn_attn_call *c, const int64_t *roff, const int64_t *rev, const int64_t *dst,
                                   const SFX(gbw_args) *a, int64_t j0, int64_t j1, real *dk, real *dv, double *dkt[2],
                                   double *dg) {
#define GBW2_BODY(H, D, Dg, Dv) for (int64_t j = j0; j < j1; j++) SFX(gnode_bw2)(c, roff, rev, dst, a, j, dk, dv, dkt, dg, H, D, Dg, Dv)
    GDISPATCH(GBW2_BODY);
#undef GBW2_BODY
}

/* Pass 2, per source node j over the edges leaving it (rev: edge ids grouped by source in
 * increasing order, roff (N+1), dst (E)): dK, dV (N, H, ·) and the column sums (N, H, zeroed),
 * without races. */
static void SFX(gbackward2)(const pn_attn_call *c, const int64_t *roff, const int64_t *rev, const int64_t *dst,
                            const SFX(gbw_args) *a, real *dk, real *dv, double *dkt[2], double *dg) {
    const int64_t N = c->Nq, H = c->H;
    #pragma omp parallel for if (roff[N] * H * (c->D + c->Dv) > PN_PAR_MIN) schedule(dynamic, 1)
    for (int64_t j0 = 0; j0 < N; j0 += GCHUNK)
        SFX(gbw2_range)(c, roff, rev, dst, a, j0, j0 + GCHUNK < N ? j0 + GCHUNK : N, dk, dv, dkt, dg);
}

#undef GDISPATCH
#undef GROWS
#undef GCHUNK

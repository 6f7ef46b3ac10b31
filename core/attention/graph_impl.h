/* graph_impl.h — the typed body of the graph driver, included twice by graph.c (real = float,
 * SFX(x) = x##_f32, EPI_* = plan.*32; then double). No include guard on purpose.
 *
 * Layout: the pn_attn_call holds head-major copies q, k (H, N, D), v (H, N, Dv) (B = 1);
 * dout / out are node-major (N, H, Dv) like the user's tensors; per-edge arrays are (E, H);
 * stat is (H, N). Destination node i attends to src[e] for e in [off[i], off[i+1]). */

/* Scores of node i, head h over its neighbours: s (deg), plus the gathered inputs the VJP
 * needs again: G (deg), k0, k1 (deg). */
static void SFX(gscores)(const pn_attn_call *c, const int64_t *off, const int64_t *src, int64_t i, int64_t h,
                         real *G, real *k0, real *k1, real *s) {
    const int64_t N = c->Nq, D = c->D, Dg = c->Dg, e0 = off[i], deg = off[i + 1] - off[i];
    const real *qi = (const real *)c->q + (h * N + i) * D;
    const real *kt0 = c->kt[0] ? (const real *)c->kt[0] + h * N : NULL;
    const real *kt1 = c->kt[1] ? (const real *)c->kt[1] + h * N : NULL;
    const bool gemm = c->st.plan.gemm != PN_GEMM_NONE, diff = c->st.plan.diff;
    for (int64_t e = 0; e < deg; e++) {
        const int64_t j = src[e0 + e];
        real acc = 0;
        if (diff) { /* a distance score: G = −½‖q_g − k_g‖², from the differences (attention.h) */
            const real *kj = (const real *)c->k + (h * N + j) * D;
            for (int64_t d = 0; d < Dg; d++) {
                const real t = qi[d] - kj[d];
                acc += t * t;
            }
            acc *= (real)-0.5;
        } else if (gemm) {
            const real *kj = (const real *)c->k + (h * N + j) * D;
            for (int64_t d = 0; d < Dg; d++) acc += qi[d] * kj[d];
        }
        G[e] = acc;
        k0[e] = kt0 ? kt0[j] : 0;
        k1[e] = kt1 ? kt1[j] : 0;
    }
    const real *q0 = c->qt[0] ? (const real *)c->qt[0] + h * N + i : NULL;
    const real *q1 = c->qt[1] ? (const real *)c->qt[1] + h * N + i : NULL;
    c->st.plan.EPI_FWD(&c->st.hp[h], 1, deg, deg, G, q0, q1, kt0 ? k0 : NULL, kt1 ? k1 : NULL, s);
    /* NaN in, NaN out: every edge that reads a non-finite q or k row */
    if (c->qbad || c->kbad) {
        const bool qb = c->qbad && c->qbad[h * N + i];
        for (int64_t e = 0; e < deg; e++)
            if (qb || (c->kbad && c->kbad[h * N + src[e0 + e]])) s[e] = (real)NAN;
    }
}

/* s (deg) → normalised weights w (deg), including the Lorentz factors of einstein; returns
 * the statistic (logsumexp or Σσγ; −inf / 0 when the node has no neighbour). */
static real SFX(gweights)(const pn_attn_call *c, const int64_t *src, int64_t e0, int64_t deg, int64_t h,
                          const real *s, real *w) {
    const real *g = c->g ? (const real *)c->g + h * c->Nk : NULL;
    if (c->st.normalize == PN_NORM_SOFTMAX) {
        real m = (real)-INFINITY;
        bool nan = false;
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
        real z = 0;
        for (int64_t e = 0; e < deg; e++) {
            real p = pn_exp(s[e] - m);
            p = g ? p * g[src[e0 + e]] : p;
            w[e] = p;
            z += p;
        }
        for (int64_t e = 0; e < deg; e++) w[e] /= z;
        return m + pn_log(z);
    }
    real z = 0;
    for (int64_t e = 0; e < deg; e++) {
        real p = 1 / (1 + pn_exp(-s[e]));
        p = g ? p * g[src[e0 + e]] : p;
        w[e] = p;
        z += p;
    }
    if (c->st.normalized) {
        real inv = z != z ? z : z > 0 ? 1 / z : 0;
        for (int64_t e = 0; e < deg; e++) w[e] *= inv;
    }
    return z;
}

/* out (N, H, Dv) node-major, stat (H, N); drop (E, H) scaled dropout mask or NULL.
 * pn_graph_attention_weights passes out = NULL and wedge (E, H), which receives the weights w
 * per edge in CSR order (before dropout) instead of the aggregation. */
static pn_status SFX(gforward)(const pn_attn_call *c, const int64_t *off, const int64_t *src, int64_t maxdeg,
                               const real *drop, real *out, real *stat, real *wedge) {
    const int64_t N = c->Nq, H = c->H, Dv = c->Dv;
    int oom = 0;
    #pragma omp parallel if (N * H * (c->D + Dv) > PN_PAR_MIN / 8)
    {
        real *buf = malloc(sizeof(real) * (size_t)(5 * maxdeg + 5));
        if (!buf) {
            #pragma omp atomic write
            oom = 1;
        }
        /* dynamic: degrees differ; each node writes only its own rows */
        #pragma omp for schedule(dynamic, 16)
        for (int64_t i = 0; i < N; i++) {
            if (!buf) continue;
            real *G = buf, *k0 = buf + maxdeg + 1, *k1 = k0 + maxdeg + 1, *s = k1 + maxdeg + 1, *w = s + maxdeg + 1;
            const int64_t e0 = off[i], deg = off[i + 1] - off[i];
            for (int64_t h = 0; h < H; h++) {
                SFX(gscores)(c, off, src, i, h, G, k0, k1, s);
                const real st = SFX(gweights)(c, src, e0, deg, h, s, w);
                if (wedge)
                    for (int64_t e = 0; e < deg; e++) wedge[(e0 + e) * H + h] = w[e];
                stat[h * N + i] = st;
                if (!out) continue;
                real *o = out + (i * H + h) * Dv;
                memset(o, 0, sizeof(real) * (size_t)Dv);
                for (int64_t e = 0; e < deg; e++) {
                    real we = drop ? w[e] * drop[(e0 + e) * H + h] : w[e];
                    if (we == 0) continue; /* a dropped or zero weight reads nothing (NaN weights do) */
                    const real *vj = (const real *)c->v + (h * N + src[e0 + e]) * Dv;
                    for (int64_t d = 0; d < Dv; d++) o[d] += we * vj[d];
                }
            }
        }
        free(buf);
    }
    return oom ? pn_error(PN_ERR_OOM, "%s: out of memory for edge buffers", c->op) : PN_OK;
}

typedef struct {
    const real *dout, *out, *stat, *drop; /* (N, H, Dv), (N, H, Dv), (H, N), (E, H) or NULL */
    bool weights;                         /* the weights' backward: dout = dW (E, H), no v */
    real *dq;                             /* (H, N, D) head-major, zeroed */
    double *dqt[2];                       /* (H, N) or NULL */
    double *dparam;                       /* (N, H, PN_NPARAM) */
    real *eG, *ek[2], *ew, *edg;          /* per edge (E, H): dG, ∂L/∂k-terms, m·w, ∂L/∂γ(v_src) */
} SFX(gbw_args);

/* Pass 1, per destination node: dS, the score's VJP, dQ; per-edge results for pass 2. */
static pn_status SFX(gbackward1)(const pn_attn_call *c, const int64_t *off, const int64_t *src, int64_t maxdeg,
                                 const SFX(gbw_args) *a) {
    const int64_t N = c->Nq, H = c->H, D = c->D, Dv = c->Dv, Dg = c->Dg;
    const int norm = c->st.normalize;
    const bool normalized = c->st.normalized, gemm = c->st.plan.gemm != PN_GEMM_NONE, diff = c->st.plan.diff;
    int oom = 0;
    #pragma omp parallel if (N * H * (D + Dv) > PN_PAR_MIN / 8)
    {
        real *buf = malloc(sizeof(real) * (size_t)(7 * maxdeg + 7));
        if (!buf) {
            #pragma omp atomic write
            oom = 1;
        }
        #pragma omp for schedule(dynamic, 16)
        for (int64_t i = 0; i < N; i++) {
            if (!buf) continue;
            real *G = buf, *k0 = G + maxdeg + 1, *k1 = k0 + maxdeg + 1, *s = k1 + maxdeg + 1, *w = s + maxdeg + 1;
            real *dk0 = w + maxdeg + 1, *dk1 = dk0 + maxdeg + 1;
            const int64_t e0 = off[i], deg = off[i + 1] - off[i];
            for (int64_t h = 0; h < H; h++) {
                const pn_score_params *pp = &c->st.hp[h];
                const real *dO = a->weights ? NULL : a->dout + (i * H + h) * Dv;
                const real *O = a->weights ? NULL : a->out + (i * H + h) * Dv;
                const real *g = c->g ? (const real *)c->g + h * N : NULL;
                SFX(gscores)(c, off, src, i, h, G, k0, k1, s);
                /* the forward's weights, from the saved statistic */
                const real st = a->stat[h * N + i];
                for (int64_t e = 0; e < deg; e++) {
                    const real ge = g ? g[src[e0 + e]] : 1;
                    if (norm == PN_NORM_SOFTMAX) {
                        w[e] = st == (real)-INFINITY ? 0 : pn_exp(s[e] - st) * ge;
                    } else {
                        real sg = 1 / (1 + pn_exp(-s[e]));
                        s[e] = sg;
                        w[e] = normalized ? (st > 0 ? sg * ge / st : 0) : sg * ge;
                    }
                }
                /* the weights' backward: dP = dW per edge, D_i = Σ_e dW_e·w_e, nothing reaches v */
                const real *dW = a->weights ? a->dout + e0 * H + h : NULL;
                real Di = 0;
                if (normalized && dW)
                    for (int64_t e = 0; e < deg; e++) Di += dW[e * H] * w[e];
                else if (normalized)
                    for (int64_t d = 0; d < Dv; d++) Di += dO[d] * O[d];
                for (int64_t e = 0; e < deg; e++) {
                    const int64_t j = src[e0 + e], eh = (e0 + e) * H + h;
                    const real m = a->drop ? a->drop[eh] : 1;
                    real dp = 0;
                    if (dW) {
                        dp = dW[e * H];
                    } else {
                        const real *vj = (const real *)c->v + (h * N + j) * Dv;
                        for (int64_t d = 0; d < Dv; d++) dp += dO[d] * vj[d];
                    }
                    dp *= m;
                    a->ew[eh] = dW ? 0 : m * w[e];
                    real ds;
                    if (norm == PN_NORM_SOFTMAX) ds = w[e] * (dp - Di);
                    else if (normalized) ds = w[e] * (1 - s[e]) * (dp - Di);
                    else ds = dp * s[e] * (1 - s[e]);
                    if (a->edg) a->edg[eh] = (dp - Di) * w[e] / g[j];
                    s[e] = ds; /* s now holds dS */
                    dk0[e] = 0;
                    dk1[e] = 0;
                }
                double dqt[2] = {0, 0};
                const real *q0 = c->qt[0] ? (const real *)c->qt[0] + h * N + i : NULL;
                const real *q1 = c->qt[1] ? (const real *)c->qt[1] + h * N + i : NULL;
                c->st.plan.EPI_VJP(pp, 1, deg, deg, G, q0, q1, c->kt[0] ? k0 : NULL, c->kt[1] ? k1 : NULL, s, s, dqt,
                                   c->kt[0] ? dk0 : NULL, c->kt[1] ? dk1 : NULL, a->dparam + (i * H + h) * PN_NPARAM);
                for (int m = 0; m < 2; m++)
                    if (a->dqt[m]) a->dqt[m][h * N + i] = dqt[m];
                real *dqi = a->dq + (h * N + i) * D;
                const real *qi0 = (const real *)c->q + (h * N + i) * D;
                for (int64_t e = 0; e < deg; e++) {
                    const int64_t eh = (e0 + e) * H + h;
                    a->eG[eh] = s[e];
                    if (a->ek[0]) a->ek[0][eh] = dk0[e];
                    if (a->ek[1]) a->ek[1][eh] = dk1[e];
                    if (gemm && s[e] != 0) { /* ∂G/∂q: k, or k − q for a distance score */
                        const real *kj = (const real *)c->k + (h * N + src[e0 + e]) * D;
                        if (diff)
                            for (int64_t d = 0; d < Dg; d++) dqi[d] += s[e] * (kj[d] - qi0[d]);
                        else
                            for (int64_t d = 0; d < Dg; d++) dqi[d] += s[e] * kj[d];
                    }
                }
            }
        }
        free(buf);
    }
    return oom ? pn_error(PN_ERR_OOM, "%s: out of memory for edge buffers", c->op) : PN_OK;
}

/* Pass 2, per source node j over the edges leaving it (rev: edge ids grouped by source in
 * increasing order, roff (N+1), dst (E)): dK, dV and the column sums, without races. */
static void SFX(gbackward2)(const pn_attn_call *c, const int64_t *roff, const int64_t *rev, const int64_t *dst,
                            const SFX(gbw_args) *a, real *dk, real *dv, double *dkt[2], double *dg) {
    const int64_t N = c->Nq, H = c->H, D = c->D, Dv = c->Dv, Dg = c->Dg;
    const bool gemm = c->st.plan.gemm != PN_GEMM_NONE, diff = c->st.plan.diff;
    #pragma omp parallel for if (N * H * (D + Dv) > PN_PAR_MIN / 8) schedule(dynamic, 16)
    for (int64_t j = 0; j < N; j++) {
        for (int64_t h = 0; h < H; h++) {
            real *dkj = dk + (h * N + j) * D, *dvj = dv + (h * N + j) * Dv;
            double t0 = 0, t1 = 0, tg = 0;
            for (int64_t r = roff[j]; r < roff[j + 1]; r++) {
                const int64_t e = rev[r], i = dst[e], eh = e * H + h;
                const real dG = a->eG[eh], we = a->ew[eh];
                if (gemm && dG != 0) { /* ∂G/∂k: q, or q − k for a distance score */
                    const real *qi = (const real *)c->q + (h * N + i) * D;
                    if (diff) {
                        const real *kj = (const real *)c->k + (h * N + j) * D;
                        for (int64_t d = 0; d < Dg; d++) dkj[d] += dG * (qi[d] - kj[d]);
                    } else {
                        for (int64_t d = 0; d < Dg; d++) dkj[d] += dG * qi[d];
                    }
                }
                if (we != 0) {
                    const real *dO = a->dout + (i * H + h) * Dv;
                    for (int64_t d = 0; d < Dv; d++) dvj[d] += we * dO[d];
                }
                if (a->ek[0]) t0 += a->ek[0][eh];
                if (a->ek[1]) t1 += a->ek[1][eh];
                if (a->edg) tg += a->edg[eh];
            }
            if (dkt[0]) dkt[0][h * N + j] = t0;
            if (dkt[1]) dkt[1][h * N + j] = t1;
            if (dg) dg[h * N + j] = tg;
        }
    }
}

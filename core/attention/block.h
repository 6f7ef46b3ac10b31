/* block.h — THE CPU block loop of the score epilogues (typed: real, EPI(), PN_EPI_EPS; included
 * by epi_impl.h once per precision, before the score headers).
 *
 * A score's header holds its maths as per-pair functions (PN_HD: host and device, so a CUDA
 * tile kernel calls the same source) and instantiates this loop once:
 *
 *   PN_EPI_BLOCKS(X, TERMS, NKX, P0, P1, P2)
 *
 * generates the block epilogues of attention.h — EPI(X_fwd), EPI(X_vjp) and the pair
 * EPI(X_fwd_save) / EPI(X_vjp_saved) — from the score's
 *   EPI(X_h)                      its per-head constants (a struct), made by
 *   EPI(X_head)(p)                from the resolved parameters;
 *   EPI(X_key)(&h, k0, k1)        per-key values (an EPI(x4)), computed once per block of keys
 *                                 (NKX = 1; NKX = 0: the score has none and it is not called);
 *   EPI(X_row)(&h, q0, q1)        per-row values (an EPI(x4)), once per query row;
 *   EPI(X_pair)(&h, r, k, G, q0, q1, k0, k1)
 *                                 one pair: its score s and sv0, sv1, values its VJP may reuse
 *                                 (stored by fwd_save, handed back to vjp_saved) — EPI(spair);
 *   EPI(X_pair_vjp)(&h, r, k, G, q0, q1, k0, k1, ds, sv0, sv1, keep, want)
 *                                 one pair's partials for ds = ∂L/∂s — EPI(dpair): through G,
 *                                 the four terms and the parameters P0, P1, P2 (PN_P_* ids, −1
 *                                 for none); keep: sv0, sv1 are the forward's; want: the
 *                                 parameters are learnable (else p0…p2 may be left 0).
 * Results come back by value, never through pointers: an address-taken local inside an omp simd
 * loop becomes a per-lane array in memory and the loop stops vectorizing.
 * TERMS says which terms exist (PN_T_Q0 | PN_T_Q1 | PN_T_K0 | PN_T_K1): absent ones are passed
 * as 0 and their pointers never read. Everything is inlined into the loop, so the unused values
 * and branches fold away and the pair loop vectorizes (omp simd) as a hand-written one would. */
#ifndef PN_EPI_PLAN

typedef struct { real a, b, c, d; } EPI(x4);                  /* per-row / per-key values */
typedef struct { real s, sv0, sv1; } EPI(spair);               /* one pair's score and saved values */
typedef struct { real g, q0, q1, k0, k1, p0, p1, p2; } EPI(dpair); /* one pair's partials: G, terms, parameters */

/* a score without per-key or per-row values (NKX = 0 / nothing per row); also wanted where the
 * block loops are not (cuda/attention/graph.cu defines PN_EPI_BLOCKS empty) */
#ifndef PN_EPI_NO_KEY
#define PN_EPI_NO_KEY(X)                                                                       \
    PN_HD static inline EPI(x4) EPI(X##_key)(const EPI(X##_h) * h, real k0, real k1) {         \
        (void)h, (void)k0, (void)k1;                                                           \
        EPI(x4) r = {0, 0, 0, 0};                                                              \
        return r;                                                                              \
    }
#define PN_EPI_NO_ROW(X)                                                                       \
    PN_HD static inline EPI(x4) EPI(X##_row)(const EPI(X##_h) * h, real q0, real q1) {         \
        (void)h, (void)q0, (void)q1;                                                           \
        EPI(x4) r = {0, 0, 0, 0};                                                              \
        return r;                                                                              \
    }
#endif

#ifndef PN_EPI_BLOCKS
enum { PN_T_Q0 = 1, PN_T_Q1 = 2, PN_T_K0 = 4, PN_T_K1 = 8 };

#define PN_EPI_BLOCKS(X, TERMS, NKX, P0, P1, P2)                                                              \
    PN_INLINE void EPI(X##_keys)(const EPI(X##_h) * hd, int64_t nb, const real *k0, const real *k1, real *KA,    \
                                 real *KB, real *KC, real *KD) {                                                 \
        for (int64_t j = 0; j < nb; j++) {                                                                        \
            EPI(x4) t = EPI(X##_key)(hd, ((TERMS) & PN_T_K0) ? k0[j] : 0, ((TERMS) & PN_T_K1) ? k1[j] : 0);     \
            KA[j] = t.a, KB[j] = t.b, KC[j] = t.c, KD[j] = t.d;                                                  \
        }                                                                                                         \
    }                                                                                                             \
    PN_INLINE void EPI(X##_fwd_body)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const real *G, \
                                     const real *q0, const real *q1, const real *k0, const real *k1, real *s,     \
                                     real *save, const int keep) {                                                \
        const EPI(X##_h) hd = EPI(X##_head)(p);                                                                   \
        real KA[(NKX) ? PN_EPI_CHUNK : 1], KB[(NKX) ? PN_EPI_CHUNK : 1], KC[(NKX) ? PN_EPI_CHUNK : 1],             \
            KD[(NKX) ? PN_EPI_CHUNK : 1];                                                                         \
        for (int64_t j0 = 0; j0 < n; j0 += PN_EPI_CHUNK) {                                                        \
            const int64_t nb = n - j0 < PN_EPI_CHUNK ? n - j0 : PN_EPI_CHUNK;                                     \
            const real *kk0 = ((TERMS) & PN_T_K0) ? k0 + j0 : NULL, *kk1 = ((TERMS) & PN_T_K1) ? k1 + j0 : NULL; \
            if (NKX) EPI(X##_keys)(&hd, nb, kk0, kk1, KA, KB, KC, KD);                                            \
            for (int64_t i = 0; i < rows; i++) {                                                                  \
                const real qa = ((TERMS) & PN_T_Q0) ? q0[i] : 0, qb = ((TERMS) & PN_T_Q1) ? q1[i] : 0;           \
                const EPI(x4) rx = EPI(X##_row)(&hd, qa, qb);                                                     \
                const real *g = G + i * ld + j0;                                                                  \
                real *o = s + i * ld + j0;                                                                        \
                real *s0 = keep ? save + i * ld + j0 : NULL, *s1 = keep ? save + (rows + i) * ld + j0 : NULL;    \
                /* o may alias g: the same pair only */                                                           \
                _Pragma("omp simd") for (int64_t j = 0; j < nb; j++) {                                            \
                    const EPI(x4) kx = {(NKX) ? KA[j] : 0, (NKX) ? KB[j] : 0, (NKX) ? KC[j] : 0, (NKX) ? KD[j] : 0}; \
                    const EPI(spair) sp = EPI(X##_pair)(&hd, rx, kx, g[j], qa, qb, ((TERMS) & PN_T_K0) ? kk0[j] : 0, \
                                                        ((TERMS) & PN_T_K1) ? kk1[j] : 0);                        \
                    o[j] = sp.s;                                                                                  \
                    if (keep) s0[j] = sp.sv0, s1[j] = sp.sv1;                                                     \
                }                                                                                                 \
            }                                                                                                     \
        }                                                                                                         \
    }                                                                                                             \
    PN_INLINE void EPI(X##_vjp_body)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld, const real *G, \
                                     const real *q0, const real *q1, const real *k0, const real *k1,              \
                                     const real *ds, real *dG, double *dq, real *dk0, real *dk1, double *dparam,  \
                                     const real *save, const int keep, const int want) {                          \
        const EPI(X##_h) hd = EPI(X##_head)(p);                                                                   \
        real KA[(NKX) ? PN_EPI_CHUNK : 1], KB[(NKX) ? PN_EPI_CHUNK : 1], KC[(NKX) ? PN_EPI_CHUNK : 1],             \
            KD[(NKX) ? PN_EPI_CHUNK : 1];                                                                         \
        double sp0_all = 0, sp1_all = 0, sp2_all = 0;                                                             \
        for (int64_t j0 = 0; j0 < n; j0 += PN_EPI_CHUNK) {                                                        \
            const int64_t nb = n - j0 < PN_EPI_CHUNK ? n - j0 : PN_EPI_CHUNK;                                     \
            const real *kk0 = ((TERMS) & PN_T_K0) ? k0 + j0 : NULL, *kk1 = ((TERMS) & PN_T_K1) ? k1 + j0 : NULL; \
            real *dkk0 = ((TERMS) & PN_T_K0) ? dk0 + j0 : NULL, *dkk1 = ((TERMS) & PN_T_K1) ? dk1 + j0 : NULL;  \
            if (NKX) EPI(X##_keys)(&hd, nb, kk0, kk1, KA, KB, KC, KD);                                            \
            for (int64_t i = 0; i < rows; i++) {                                                                  \
                const real qa = ((TERMS) & PN_T_Q0) ? q0[i] : 0, qb = ((TERMS) & PN_T_Q1) ? q1[i] : 0;           \
                const EPI(x4) rx = EPI(X##_row)(&hd, qa, qb);                                                     \
                const real *gg = G + i * ld + j0, *dsi = ds + i * ld + j0;                                        \
                const real *s0 = keep ? save + i * ld + j0 : NULL, *s1 = keep ? save + (rows + i) * ld + j0 : NULL; \
                real *o = dG + i * ld + j0;                                                                       \
                real a0 = 0, a1 = 0, b0 = 0, b1 = 0, b2 = 0;                                                      \
                _Pragma("omp simd reduction(+ : a0, a1, b0, b1, b2)") for (int64_t j = 0; j < nb; j++) {          \
                    const EPI(x4) kx = {(NKX) ? KA[j] : 0, (NKX) ? KB[j] : 0, (NKX) ? KC[j] : 0, (NKX) ? KD[j] : 0}; \
                    /* dG may alias ds: the pair reads its ds before its dG is written */                         \
                    const EPI(dpair) d = EPI(X##_pair_vjp)(&hd, rx, kx, gg[j], qa, qb,                             \
                                                           ((TERMS) & PN_T_K0) ? kk0[j] : 0,                       \
                                                           ((TERMS) & PN_T_K1) ? kk1[j] : 0, dsi[j],               \
                                                           keep ? s0[j] : 0, keep ? s1[j] : 0, keep, want);        \
                    o[j] = d.g;                                                                                   \
                    a0 += d.q0;                                                                                   \
                    a1 += d.q1;                                                                                   \
                    if ((TERMS) & PN_T_K0) dkk0[j] += d.k0;                                                       \
                    if ((TERMS) & PN_T_K1) dkk1[j] += d.k1;                                                       \
                    if (want) b0 += d.p0, b1 += d.p1, b2 += d.p2;                                                 \
                }                                                                                                 \
                if ((TERMS) & PN_T_Q0) dq[2 * i] += a0;                                                           \
                if ((TERMS) & PN_T_Q1) dq[2 * i + 1] += a1;                                                       \
                sp0_all += b0, sp1_all += b1, sp2_all += b2;                                                      \
            }                                                                                                     \
        }                                                                                                         \
        if (want && (P0) >= 0) dparam[(P0) >= 0 ? (P0) : 0] += sp0_all;                                          \
        if (want && (P1) >= 0) dparam[(P1) >= 0 ? (P1) : 0] += sp1_all;                                           \
        if (want && (P2) >= 0) dparam[(P2) >= 0 ? (P2) : 0] += sp2_all;                                           \
    }                                                                                                             \
    PN_VEC PN_HIDDEN void EPI(X##_fwd)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld,             \
                                       const real *G, const real *q0, const real *q1, const real *k0,             \
                                       const real *k1, real *s) {                                                 \
        EPI(X##_fwd_body)(p, rows, n, ld, G, q0, q1, k0, k1, s, NULL, 0);                                         \
    }                                                                                                             \
    PN_VEC PN_MAYBE_UNUSED static void EPI(X##_fwd_save)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld,        \
                                            const real *G, const real *q0, const real *q1, const real *k0,        \
                                            const real *k1, real *s, real *save) {                                \
        EPI(X##_fwd_body)(p, rows, n, ld, G, q0, q1, k0, k1, s, save, 1);                                         \
    }                                                                                                             \
    /* want: the learnable parameters need their gradients (else their maths is compiled out) */                 \
    PN_VEC PN_HIDDEN void EPI(X##_vjp)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld,             \
                                       const real *G, const real *q0, const real *q1, const real *k0,             \
                                       const real *k1, const real *ds, real *dG, double *dq, real *dk0,           \
                                       real *dk1, double *dparam) {                                               \
        PN_BOOL_SWITCH(p->learn & pn_epi_pbits(P0, P1, P2), want,                                                 \
                       EPI(X##_vjp_body)(p, rows, n, ld, G, q0, q1, k0, k1, ds, dG, dq, dk0, dk1, dparam, NULL, 0, \
                                         want));                                                                  \
    }                                                                                                             \
    PN_VEC PN_MAYBE_UNUSED static void EPI(X##_vjp_saved)(const pn_score_params *p, int64_t rows, int64_t n, int64_t ld,       \
                                             const real *G, const real *q0, const real *q1, const real *k0,       \
                                             const real *k1, const real *ds, real *dG, double *dq, real *dk0,     \
                                             real *dk1, double *dparam, const real *save) {                       \
        PN_BOOL_SWITCH(p->learn & pn_epi_pbits(P0, P1, P2), want,                                                 \
                       EPI(X##_vjp_body)(p, rows, n, ld, G, q0, q1, k0, k1, ds, dG, dq, dk0, dk1, dparam, save,   \
                                         1, want));                                                               \
    }

/* the save-pair is referenced only by the plans of scores that use it */
#if defined(__GNUC__)
#define PN_MAYBE_UNUSED __attribute__((unused))
#else
#define PN_MAYBE_UNUSED
#endif

/* the PN_PBIT mask of up to three parameter ids (−1: none) */
static inline unsigned pn_epi_pbits(int p0, int p1, int p2) {
    return (p0 >= 0 ? PN_PBIT(p0) : 0u) | (p1 >= 0 ? PN_PBIT(p1) : 0u) | (p2 >= 0 ? PN_PBIT(p2) : 0u);
}
#endif /* PN_EPI_BLOCKS */

#endif /* !PN_EPI_PLAN */

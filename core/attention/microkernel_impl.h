/* microkernel_impl.h — the body of the f32 GEMM block (microkernel.h), compiled once per
 * instruction set by microkernel.c, which defines before including it:
 *   MK(name)     the function's name for this set (name##_avx2 …)
 *   MR, VW       rows of the register block, floats per vector (NR = 2·VW columns: a panel)
 *   NP           (optional, default 1) panels a block spans: the block is MR × NP·NR
 *   vec, V_ZERO(), V_LOAD(p), V_STORE(p, x), V_SET1(x), V_FMA(a, b, c) (= a·b + c),
 *   V_COUNT_LT(a, b) (how many lanes have a < b), V_MAX(x, m) (lanewise x > m ? x : m: m where x is NaN)
 * and gets them #undef'd again at the end, ready for the next set.
 * No include guard on purpose. */
#define NR (2 * VW)
#ifndef NP
#define NP 1
#endif

/* the register block: acc (MR × np·NR, panel p in acc[i][2p] | acc[i][2p + 1]) =
 * Σ_k a[i][k·cs] · b's panels [0, np) (bstride apart) at row k; np (1 … NP) is a constant
 * wherever this is inlined, so the loops over it unroll away */
static inline __attribute__((always_inline)) void MK(block)(const float *const a[MR], const float *b, int64_t bstride,
                                                            const int np, int64_t K, int64_t cs, vec acc[MR][2 * NP]) {
    _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {
        _Pragma("GCC unroll 4") for (int v = 0; v < 2 * np; v++) acc[i][v] = V_ZERO();
    }
    int64_t ko = 0;
    for (int64_t k = 0; k < K; k++, b += NR, ko += cs) {
        vec bv[2 * NP];
        _Pragma("GCC unroll 2") for (int p = 0; p < np; p++) {
            bv[2 * p] = V_LOAD(b + p * bstride);
            bv[2 * p + 1] = V_LOAD(b + p * bstride + VW);
        }
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {
            const vec x = V_SET1(a[i][ko]);
            _Pragma("GCC unroll 4") for (int v = 0; v < 2 * np; v++) acc[i][v] = V_FMA(x, bv[v], acc[i][v]);
        }
    }
}

/* A's row pointers; rows ≥ mr read row 0 again (their results are dropped): the block stays full */
#define MK_ROWS(a, A, mr, rs)                                                                  \
    const float *a[MR];                                                                        \
    _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) a[i] = (A) + (i < (mr) ? i : 0) * (rs)

/* acc for the panels from c0 on: NP of them where that many remain in ncols, else 1 (the tail
 * panel of an odd count; with NP = 1 always 1) */
#define MK_BLOCK(a, Bp, bstride, c0, ncols, K, cs, acc, np)                                    \
    const int np = NP > 1 && (ncols) - (c0) > NR ? NP : 1;                                     \
    if (np == NP) MK(block)(a, (Bp) + ((c0) / NR) * (bstride), bstride, NP, K, cs, acc);       \
    else MK(block)(a, (Bp) + ((c0) / NR) * (bstride), bstride, 1, K, cs, acc)

/* C (mr, ncols) (+)= A (mr, K; strides rs, cs) · B (K, ncols; panels of NR, stride bstride) */
static void MK(gemm)(int64_t mr, int64_t ncols, int64_t K, const float *A, int64_t rs, int64_t cs,
                     const float *Bp, int64_t bstride, float *C, int64_t ldc, int accumulate) {
    MK_ROWS(a, A, mr, rs);
    for (int64_t c0 = 0; c0 < ncols; c0 += NP * NR) {
        vec acc[MR][2 * NP];
        MK_BLOCK(a, Bp, bstride, c0, ncols, K, cs, acc, np);
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {
            if (i >= mr) break;
            float *c = C + i * ldc + c0;
            _Pragma("GCC unroll 4") for (int v = 0; v < 2 * np; v++) {
                if (accumulate) V_STORE(c + v * VW, V_LOAD(c + v * VW) + acc[i][v]);
                else V_STORE(c + v * VW, acc[i][v]);
            }
        }
    }
}

/* C (mr, ncols) = −½‖a_i − b_c‖² = a_i·b_c − (½rn[i] + ½cn[c]) from the product and the squared
 * norms rn (mr), cn (ncols rounded up to NR; 0 beyond the real columns) — halving is exact, so
 * this equals −½(rn + cn − 2a·b) bit for bit; returns nonzero when some pair (the padding
 * columns never) has ‖a − b‖² < lim·(rn + cn), i.e. C + ½lim·(rn + cn) > 0 — there the
 * expansion lost its digits and the caller recomputes them from the differences. The test
 * keeps a running maximum (one FMA and one max a vector) instead of counting lanes: the
 * caller only asks whether there are any, and at D = 64 the count cost 12 % of the product. */
static int64_t MK(dist)(int64_t mr, int64_t ncols, int64_t K, const float *A, int64_t rs, const float *Bp,
                        int64_t bstride, const float *rn, const float *cn, float lim, float *C, int64_t ldc) {
    MK_ROWS(a, A, mr, rs);
    const vec half = V_SET1(0.5f), vlim = V_SET1(lim);
    vec worst = V_SET1(-1.0f); /* max over the tile of C + lim·(½rn + ½cn); NaN pairs never raise it */
    for (int64_t c0 = 0; c0 < ncols; c0 += NP * NR) {
        vec acc[MR][2 * NP];
        MK_BLOCK(a, Bp, bstride, c0, ncols, K, 1, acc, np);
        vec kc[2 * NP];
        _Pragma("GCC unroll 4") for (int v = 0; v < 2 * np; v++) kc[v] = half * V_LOAD(cn + c0 + v * VW);
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {
            if (i >= mr) break;
            float *c = C + i * ldc + c0;
            const vec r = V_SET1(0.5f * rn[i]);
            _Pragma("GCC unroll 4") for (int v = 0; v < 2 * np; v++) {
                const vec n = r + kc[v], g = acc[i][v] - n;
                worst = V_MAX(V_FMA(vlim, n, g), worst);
                V_STORE(c + v * VW, g);
            }
        }
    }
    return V_COUNT_LT(V_ZERO(), worst);
}

#undef MK_ROWS
#undef MK_BLOCK
#undef NP
#undef NR
#undef MK
#undef MR
#undef VW
#undef vec
#undef V_ZERO
#undef V_LOAD
#undef V_STORE
#undef V_SET1
#undef V_FMA
#undef V_COUNT_LT
#undef V_MAX

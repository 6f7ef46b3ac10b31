/* microkernel_impl.h — the body of the f32 GEMM block (microkernel.h), compiled once per
 * instruction set by microkernel.c, which defines before including it:
 *   MK(name)     the function's name for this set (name##_avx2 …)
 *   MR, VW       rows of the register block, floats per vector (NR = 2·VW columns)
 *   vec, V_ZERO(), V_LOAD(p), V_STORE(p, x), V_SET1(x), V_FMA(a, b, c) (= a·b + c),
 *   V_COUNT_LT(a, b) (how many lanes have a < b), V_MAX(x, m) (lanewise x > m ? x : m: m where x is NaN)
 * and gets them #undef'd again at the end, ready for the next set.
 * No include guard on purpose. */
#define NR (2 * VW)

/* the register block: acc (MR × NR, as acc0 | acc1) = Σ_k a[i][k·cs] · b[k·NR …] */
static inline __attribute__((always_inline)) void MK(block)(const float *const a[MR], const float *b, int64_t K,
                                                            int64_t cs, vec acc0[MR], vec acc1[MR]) {
    _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) acc0[i] = V_ZERO(), acc1[i] = V_ZERO();
    int64_t ko = 0;
    for (int64_t k = 0; k < K; k++, b += NR, ko += cs) {
        const vec b0 = V_LOAD(b), b1 = V_LOAD(b + VW);
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {
            const vec x = V_SET1(a[i][ko]);
            acc0[i] = V_FMA(x, b0, acc0[i]);
            acc1[i] = V_FMA(x, b1, acc1[i]);
        }
    }
}

/* A's row pointers; rows ≥ mr read row 0 again (their results are dropped): the block stays full */
#define MK_ROWS(a, A, mr, rs)                                                                  \
    const float *a[MR];                                                                        \
    _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) a[i] = (A) + (i < (mr) ? i : 0) * (rs)

/* C (mr, ncols) (+)= A (mr, K; strides rs, cs) · B (K, ncols; panels of NR, stride bstride) */
static void MK(gemm)(int64_t mr, int64_t ncols, int64_t K, const float *A, int64_t rs, int64_t cs,
                     const float *Bp, int64_t bstride, float *C, int64_t ldc, int accumulate) {
    MK_ROWS(a, A, mr, rs);
    for (int64_t c0 = 0; c0 < ncols; c0 += NR) {
        vec acc0[MR], acc1[MR];
        MK(block)(a, Bp + (c0 / NR) * bstride, K, cs, acc0, acc1);
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {
            if (i >= mr) break;
            float *c = C + i * ldc + c0;
            if (accumulate) {
                V_STORE(c, V_LOAD(c) + acc0[i]);
                V_STORE(c + VW, V_LOAD(c + VW) + acc1[i]);
            } else {
                V_STORE(c, acc0[i]);
                V_STORE(c + VW, acc1[i]);
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
    for (int64_t c0 = 0; c0 < ncols; c0 += NR) {
        vec acc0[MR], acc1[MR];
        MK(block)(a, Bp + (c0 / NR) * bstride, K, 1, acc0, acc1);
        const vec k0 = half * V_LOAD(cn + c0), k1 = half * V_LOAD(cn + c0 + VW);
        _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) {
            if (i >= mr) break;
            float *c = C + i * ldc + c0;
            const vec r = V_SET1(0.5f * rn[i]), n0 = r + k0, n1 = r + k1;
            const vec g0 = acc0[i] - n0, g1 = acc1[i] - n1;
            worst = V_MAX(V_FMA(vlim, n0, g0), worst);
            worst = V_MAX(V_FMA(vlim, n1, g1), worst);
            V_STORE(c, g0);
            V_STORE(c + VW, g1);
        }
    }
    return V_COUNT_LT(V_ZERO(), worst);
}

#undef MK_ROWS
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

/* microkernel_impl.h — the body of the f32 GEMM block (microkernel.h), compiled once per
 * instruction set by microkernel.c, which defines before including it:
 *   MK(name)     the function's name for this set (name##_avx2 …)
 *   MR, VW       rows of the register block, floats per vector (NR = 2·VW columns)
 *   vec, V_ZERO(), V_LOAD(p), V_STORE(p, x), V_SET1(x), V_FMA(a, b, c) (= a·b + c)
 * No include guard on purpose. */
#define NR (2 * VW)

/* C (mr, ncols) (+)= A (mr, K; strides rs, cs) · B (K, ncols; panels of NR, stride bstride) */
static void MK(gemm)(int64_t mr, int64_t ncols, int64_t K, const float *A, int64_t rs, int64_t cs,
                     const float *Bp, int64_t bstride, float *C, int64_t ldc, int accumulate) {
    /* rows ≥ mr read row 0 again (their results are dropped): the block stays full */
    const float *a[MR];
    _Pragma("GCC unroll 16") for (int i = 0; i < MR; i++) a[i] = A + (i < mr ? i : 0) * rs;
    for (int64_t c0 = 0; c0 < ncols; c0 += NR) {
        const float *b = Bp + (c0 / NR) * bstride;
        vec acc0[MR], acc1[MR];
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

#undef NR

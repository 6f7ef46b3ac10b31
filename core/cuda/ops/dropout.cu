/* dropout.cu — the CUDA twins of ops/dropout.c. One thread per 8-element block b, Philox counter
 * base + b, through dropout.h's block function: the CPU's mask for the same seed, bit for bit. */
#include "../cuda.cuh"
#include "../../ops/dropout.h"

// x, y: (n) contiguous T; keep: (n) u8 or NULL
template <class T>
__global__ void dropout_fwd_kernel(int64_t n, const T *x, T *y, uint8_t *keep, T scale, uint64_t seed, uint64_t base,
                                   uint32_t thresh) {
    PN_CU_LOOP(b, (n + 7) / 8) {
        int64_t i0 = 8 * b;
        int len = n - i0 < 8 ? (int)(n - i0) : 8;
        if (sizeof(T) == 4)
            pn_dropout_block_f32((const float *)x + i0, (float *)y + i0, keep ? keep + i0 : NULL, len, (float)scale,
                                 seed, base + (uint64_t)b, thresh);
        else
            pn_dropout_block_f64((const double *)x + i0, (double *)y + i0, keep ? keep + i0 : NULL, len,
                                 (double)scale, seed, base + (uint64_t)b, thresh);
    }
}

pn_status pn_cuda_dropout_fwd(const pn_tensor *x, double p, uint64_t seed, uint64_t base, pn_tensor *y,
                              pn_tensor *keep) {
    int64_t n = pn_numel(x);
    if (!n) return PN_OK;
    uint32_t thresh = pn_dropout_thresh(p);
    double scale = 1.0 / (1.0 - p);
    uint8_t *pk = keep ? (uint8_t *)pn_ptr(keep) : NULL;
    cudaError_t e;
    PN_CU_FLOAT_SWITCH(x->dt, T, {
        auto k = dropout_fwd_kernel<T>;
        e = PN_LAUNCH(k, pn_cu_blocks((n + 7) / 8), PN_CU_THREADS, 0, pn_cu_stream(), n, (const T *)pn_ptr(x),
                      (T *)pn_ptr(y), pk, (T)scale, seed, base, thresh);
    });
    return pn_cu_check("dropout", e);
}

// g, gx: (n) contiguous T; keep: (n) u8
template <class T> __global__ void dropout_bwd_kernel(int64_t n, const T *g, const uint8_t *keep, T scale, T *gx) {
    PN_CU_LOOP(i, n) gx[i] = g[i] * ((T)keep[i] * scale);
}

pn_status pn_cuda_dropout_bwd(const pn_tensor *g, const pn_tensor *keep, double scale, pn_tensor *gx) {
    int64_t n = pn_numel(keep);
    if (!n) return PN_OK;
    cudaError_t e;
    PN_CU_FLOAT_SWITCH(g->dt, T, {
        auto k = dropout_bwd_kernel<T>;
        e = PN_LAUNCH(k, pn_cu_blocks(n), PN_CU_THREADS, 0, pn_cu_stream(), n, (const T *)pn_ptr(g),
                      (const uint8_t *)pn_ptr(keep), (T)scale, (T *)pn_ptr(gx));
    });
    return pn_cu_check("dropout", e);
}

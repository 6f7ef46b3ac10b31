/* norm.cu — the CUDA twins of ops/norm.c: layer normalisation over the last dim.
 *
 * One block per row (grid-stride over rows): its threads stride over the D columns and combine
 * by a fixed shared-memory tree, in double like the CPU (two passes: mean, then the centred sum
 * of squares). The weight and bias gradients sum over rows in two fixed stages (row chunks, then
 * the chunks in order) — deterministic, no float atomics. */
#include "../cuda.cuh"

enum { LN_MAX_THREADS = 128, LN_CHUNKS = 128 };

/* threads per row block: a power of two in [32, 128] covering D once where it can */
static int ln_threads(int64_t D) {
    int t = 32;
    while (t < LN_MAX_THREADS && t < D) t *= 2;
    return t;
}

/* The block's sum of v (blockDim.x a power of two) by a fixed tree over red (blockDim.x
 * doubles); every thread gets it. red is free again on return. */
__device__ static double block_sum(double v, double *red) {
    red[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }
    double r = red[0];
    __syncthreads(); /* red is rewritten by the next call */
    return r;
}

// x, y: (rows, D) contiguous T; w, b: (D) or NULL; stats: (rows, 2) f64 = (mean, rstd)
template <class T>
__global__ void ln_fwd_kernel(int64_t rows, int64_t D, const T *x, const T *w, const T *b, double eps, T *y,
                              double *stats) {
    PN_SHARED(double, red, LN_MAX_THREADS);
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *xr = x + r * D;
        double s = 0;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) s += (double)xr[j];
        double mean = block_sum(s, red) / (double)D;
        double q = 0;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
            double c = (double)xr[j] - mean;
            q += c * c;
        }
        double rstd = 1.0 / sqrt(block_sum(q, red) / (double)D + eps);
        if (threadIdx.x == 0) {
            stats[2 * r] = mean;
            stats[2 * r + 1] = rstd;
        }
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
            double v = ((double)xr[j] - mean) * rstd;
            if (w) v *= (double)w[j];
            if (b) v += (double)b[j];
            y[r * D + j] = (T)v;
        }
    }
}

pn_status pn_cuda_layer_norm_fwd(const pn_tensor *x, const pn_tensor *w, const pn_tensor *b, double eps, pn_tensor *y,
                                 pn_tensor *stats) {
    int64_t D = x->sizes[x->nd - 1], rows = D ? pn_numel(x) / D : 0;
    if (!rows) return PN_OK;
    cudaError_t e;
    PN_CU_FLOAT_SWITCH(x->dt, T, {
        auto k = ln_fwd_kernel<T>;
        e = PN_LAUNCH(k, pn_cu_blocks(rows, 1), ln_threads(D), 0, pn_cu_stream(), rows, D, (const T *)pn_ptr(x),
                      w ? (const T *)pn_ptr(w) : (const T *)NULL, b ? (const T *)pn_ptr(b) : (const T *)NULL, eps,
                      (T *)pn_ptr(y), (double *)pn_ptr(stats));
    });
    return pn_cu_check("layer_norm", e);
}

// gx = rstd · (dxhat − mean(dxhat) − xhat · mean(dxhat · xhat)), dxhat = g · w; all (rows, D)
template <class T>
__global__ void ln_bwd_x_kernel(int64_t rows, int64_t D, const T *x, const double *stats, const T *w, const T *g,
                                T *gx) {
    PN_SHARED(double, red, LN_MAX_THREADS);
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        double mean = stats[2 * r], rstd = stats[2 * r + 1], a = 0, bb = 0;
        int64_t o = r * D;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
            double dxh = (double)g[o + j] * (w ? (double)w[j] : 1.0);
            a += dxh;
            bb += dxh * ((double)x[o + j] - mean) * rstd;
        }
        a = block_sum(a, red) / (double)D;
        bb = block_sum(bb, red) / (double)D;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
            double dxh = (double)g[o + j] * (w ? (double)w[j] : 1.0);
            double xh = ((double)x[o + j] - mean) * rstd;
            gx[o + j] = (T)(rstd * (dxh - a - xh * bb));
        }
    }
}

// part: (nchunks, 2, D) f64, chunk k's sums over rows [k·bs, (k+1)·bs) of g·xhat and g
template <class T>
__global__ void ln_bwd_wb_part_kernel(int64_t rows, int64_t D, int64_t bs, int64_t nchunks, const T *x,
                                      const double *stats, const T *g, double *part) {
    PN_CU_LOOP(t, nchunks * D) {
        int64_t k = t / D, j = t - k * D, r1 = (k + 1) * bs < rows ? (k + 1) * bs : rows;
        double sw = 0, sb = 0;
        for (int64_t r = k * bs; r < r1; r++) {
            double gv = (double)g[r * D + j];
            sw += gv * ((double)x[r * D + j] - stats[2 * r]) * stats[2 * r + 1];
            sb += gv;
        }
        part[k * 2 * D + j] = sw;
        part[k * 2 * D + D + j] = sb;
    }
}

// gw, gb: (D) or NULL = the chunks' sums in chunk order
template <class T>
__global__ void ln_bwd_wb_sum_kernel(int64_t D, int64_t nchunks, const double *part, T *gw, T *gb) {
    PN_CU_LOOP(j, D) {
        double sw = 0, sb = 0;
        for (int64_t k = 0; k < nchunks; k++) {
            sw += part[k * 2 * D + j];
            sb += part[k * 2 * D + D + j];
        }
        if (gw) gw[j] = (T)sw;
        if (gb) gb[j] = (T)sb;
    }
}

pn_status pn_cuda_layer_norm_bwd(const pn_tensor *x, const pn_tensor *stats, const pn_tensor *w, const pn_tensor *g,
                                 pn_tensor *gx, pn_tensor *gw, pn_tensor *gb) {
    int64_t D = x->sizes[x->nd - 1], rows = D ? pn_numel(x) / D : 0;
    if (!D) return PN_OK;
    if (gx && rows) {
        cudaError_t e;
        PN_CU_FLOAT_SWITCH(x->dt, T, {
            auto k = ln_bwd_x_kernel<T>;
            e = PN_LAUNCH(k, pn_cu_blocks(rows, 1), ln_threads(D), 0, pn_cu_stream(), rows, D, (const T *)pn_ptr(x),
                          (const double *)pn_ptr(stats), w ? (const T *)pn_ptr(w) : (const T *)NULL,
                          (const T *)pn_ptr(g), (T *)pn_ptr(gx));
        });
        PN_CU_TRY("layer_norm", e);
    }
    if (!gw && !gb) return PN_OK;
    if (!rows) { /* sums over no rows */
        if (gw) PN_TRY(pn_cuda_fill(gw, 0));
        if (gb) PN_TRY(pn_cuda_fill(gb, 0));
        return PN_OK;
    }
    int64_t bs = (rows + LN_CHUNKS - 1) / LN_CHUNKS, nchunks = (rows + bs - 1) / bs;
    int64_t psh[3] = {nchunks, 2, D};
    pn_tensor *part = pn_empty(3, psh, PN_F64, PN_CUDA);
    if (!part) return PN_ERR_OOM;
    cudaError_t e;
    PN_CU_FLOAT_SWITCH(x->dt, T, {
        auto k1 = ln_bwd_wb_part_kernel<T>;
        e = PN_LAUNCH(k1, pn_cu_blocks(nchunks * D), PN_CU_THREADS, 0, pn_cu_stream(), rows, D, bs, nchunks,
                      (const T *)pn_ptr(x), (const double *)pn_ptr(stats), (const T *)pn_ptr(g),
                      (double *)pn_ptr(part));
        if (e == cudaSuccess) {
            auto k2 = ln_bwd_wb_sum_kernel<T>;
            e = PN_LAUNCH(k2, pn_cu_blocks(D), PN_CU_THREADS, 0, pn_cu_stream(), D, nchunks,
                          (const double *)pn_ptr(part), gw ? (T *)pn_ptr(gw) : (T *)NULL,
                          gb ? (T *)pn_ptr(gb) : (T *)NULL);
        }
    });
    pn_release(part); /* the caching allocator reuses it only after the queued kernels */
    return pn_cu_check("layer_norm", e);
}

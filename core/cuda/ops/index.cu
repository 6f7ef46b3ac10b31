/* index.cu — the CUDA twins of ops/index.c: the index validations that answer to the host
 * (index_scan, offsets_scan), row select / add, scatter_add, gather and the CSR segment ops.
 *
 * Determinism (as the CPU): no float atomics anywhere. Each output element is owned by one
 * thread that adds its contributions in index order (add_rows: a block per destination row
 * scanning idx in order; scatter_add: a thread per line along dim; segment_sum: a thread per
 * (segment, column) adding its rows in order), so the sums are the CPU's, operation for
 * operation. The validations reduce (first position, count) by fixed trees in two launches
 * and copy the few result bytes back with pn_cuda_download. */
#include "../cuda.cuh"

enum { SCAN_THREADS = 256, SCAN_MAX_BLOCKS = 256, ROW_MAX_THREADS = 128 };

static int row_threads(int64_t inner) {
    int t = 32;
    while (t < ROW_MAX_THREADS && t < inner) t *= 2;
    return t;
}

/* The block's (min of mn, sum of cnt) by a fixed tree (blockDim.x a power of two); valid in
 * thread 0. smin, ssum: blockDim.x entries each. */
__device__ static void block_min_sum(int64_t mn, int64_t cnt, int64_t *smin, int64_t *ssum) {
    int tid = threadIdx.x;
    smin[tid] = mn;
    ssum[tid] = cnt;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s) {
            smin[tid] = smin[tid + s] < smin[tid] ? smin[tid + s] : smin[tid];
            ssum[tid] += ssum[tid + s];
        }
        __syncthreads();
    }
}

/* ---- index_scan ------------------------------------------------------------------------- */
// idx: any shape and strides (sh, a), i32/i64; part: (2, gridDim.x) i64 = each block's first bad
// row-major position (INT64_MAX: none) and its count of values not equal to skip
__global__ void index_scan_part_kernel(pn_cu_shape sh, pn_cu_arg a, int64_t n, int64_t limit, int64_t skip,
                                       int64_t *part) {
    PN_SHARED(int64_t, smin, SCAN_THREADS);
    PN_SHARED(int64_t, ssum, SCAN_THREADS);
    int64_t mn = INT64_MAX, cnt = 0;
    PN_CU_LOOP(i, n) {
        int64_t v = pn_ldi(a.p, a.dt, pn_cu_off(sh, a, i));
        if (v == skip) continue;
        cnt++;
        if ((v < 0 || v >= limit) && i < mn) mn = i;
    }
    block_min_sum(mn, cnt, smin, ssum);
    if (threadIdx.x == 0) {
        part[blockIdx.x] = smin[0];
        part[gridDim.x + blockIdx.x] = ssum[0];
    }
}

// res: (3) i64 = first bad position (-1: none), its value, the count; from nb blocks' part
__global__ void index_scan_done_kernel(pn_cu_shape sh, pn_cu_arg a, const int64_t *part, int nb, int64_t *res) {
    PN_SHARED(int64_t, smin, SCAN_THREADS);
    PN_SHARED(int64_t, ssum, SCAN_THREADS);
    int64_t mn = INT64_MAX, cnt = 0;
    for (int b = threadIdx.x; b < nb; b += blockDim.x) {
        mn = part[b] < mn ? part[b] : mn;
        cnt += part[nb + b];
    }
    block_min_sum(mn, cnt, smin, ssum);
    if (threadIdx.x == 0) {
        int64_t p = smin[0];
        res[0] = p == INT64_MAX ? -1 : p;
        res[1] = p == INT64_MAX ? 0 : pn_ldi(a.p, a.dt, pn_cu_off(sh, a, p));
        res[2] = ssum[0];
    }
}

pn_status pn_cuda_index_scan(const pn_tensor *idx, int64_t limit, int64_t skip, int64_t *first_bad,
                             int64_t *bad_value, int64_t *kept) {
    int64_t n = pn_numel(idx);
    *first_bad = -1;
    *kept = 0;
    if (!n) return PN_OK;
    pn_cu_shape sh = pn_cu_shape_of(idx->nd, idx->sizes);
    pn_cu_arg a = pn_cu_arg_of(idx, sh);
    unsigned nb = pn_cu_blocks(n, SCAN_THREADS);
    if (nb > SCAN_MAX_BLOCKS) nb = SCAN_MAX_BLOCKS;
    int64_t psh[1] = {2 * (int64_t)nb + 3};
    pn_tensor *scratch = pn_empty(1, psh, PN_I64, PN_CUDA);
    if (!scratch) return PN_ERR_OOM;
    int64_t *part = (int64_t *)pn_ptr(scratch), *res = part + 2 * nb, h[3];
    pn_status st = pn_cu_check("index", PN_LAUNCH(index_scan_part_kernel, nb, SCAN_THREADS, 0, pn_cu_stream(), sh, a,
                                                  n, limit, skip, part));
    if (!st)
        st = pn_cu_check("index", PN_LAUNCH(index_scan_done_kernel, 1, SCAN_THREADS, 0, pn_cu_stream(), sh, a,
                                            (const int64_t *)part, (int)nb, res));
    if (!st) st = pn_cuda_download(h, res, sizeof h);
    pn_release(scratch);
    if (st) return st;
    *first_bad = h[0];
    if (h[0] >= 0) *bad_value = h[1];
    *kept = h[2];
    return PN_OK;
}

/* ---- offsets_scan ----------------------------------------------------------------------- */
// off: (S+1) i64 contiguous; part: (gridDim.x) the block's first i in [1, S] with off[i] < off[i-1]
__global__ void offsets_scan_part_kernel(const int64_t *off, int64_t S, int64_t *part) {
    PN_SHARED(int64_t, smin, SCAN_THREADS);
    PN_SHARED(int64_t, ssum, SCAN_THREADS);
    int64_t mn = INT64_MAX;
    PN_CU_LOOP(k, S) {
        int64_t i = k + 1;
        if (off[i] < off[i - 1] && i < mn) mn = i;
    }
    block_min_sum(mn, 0, smin, ssum);
    if (threadIdx.x == 0) part[blockIdx.x] = smin[0];
}

// res: (5) i64 = off[0], off[S], the first drop (-1: none), off[drop-1], off[drop]
__global__ void offsets_scan_done_kernel(const int64_t *off, int64_t S, const int64_t *part, int nb, int64_t *res) {
    PN_SHARED(int64_t, smin, SCAN_THREADS);
    PN_SHARED(int64_t, ssum, SCAN_THREADS);
    int64_t mn = INT64_MAX;
    for (int b = threadIdx.x; b < nb; b += blockDim.x) mn = part[b] < mn ? part[b] : mn;
    block_min_sum(mn, 0, smin, ssum);
    if (threadIdx.x == 0) {
        int64_t p = smin[0];
        res[0] = off[0];
        res[1] = off[S];
        res[2] = p == INT64_MAX ? -1 : p;
        res[3] = p == INT64_MAX ? 0 : off[p - 1];
        res[4] = p == INT64_MAX ? 0 : off[p];
    }
}

pn_status pn_cuda_offsets_scan(const pn_tensor *offt, int64_t *ends, int64_t *first_drop, int64_t *drop) {
    int64_t S = offt->sizes[0] - 1;
    unsigned nb = pn_cu_blocks(S, SCAN_THREADS);
    if (nb > SCAN_MAX_BLOCKS) nb = SCAN_MAX_BLOCKS;
    int64_t psh[1] = {(int64_t)nb + 5};
    pn_tensor *scratch = pn_empty(1, psh, PN_I64, PN_CUDA);
    if (!scratch) return PN_ERR_OOM;
    int64_t *part = (int64_t *)pn_ptr(scratch), *res = part + nb, h[5];
    const int64_t *off = (const int64_t *)pn_ptr(offt);
    pn_status st = pn_cu_check("segment", PN_LAUNCH(offsets_scan_part_kernel, nb, SCAN_THREADS, 0, pn_cu_stream(), off,
                                                    S, part));
    if (!st)
        st = pn_cu_check("segment", PN_LAUNCH(offsets_scan_done_kernel, 1, SCAN_THREADS, 0, pn_cu_stream(), off, S,
                                              (const int64_t *)part, (int)nb, res));
    if (!st) st = pn_cuda_download(h, res, sizeof h);
    pn_release(scratch);
    if (st) return st;
    ends[0] = h[0], ends[1] = h[1], *first_drop = h[2];
    if (h[2] >= 0) drop[0] = h[3], drop[1] = h[4];
    return PN_OK;
}

/* ---- select_rows / add_rows --------------------------------------------------------------- */
// out (outer, n, inner) = x (outer, V, inner)[:, idx, :]; E an unsigned type of the element size
template <class E>
__global__ void select_rows_kernel(const E *x, const void *idx, int idt, int64_t V, int64_t n, int64_t inner,
                                   int64_t total, E *out) {
    PN_CU_LOOP(t, total) {
        int64_t row = t / inner, c = t - row * inner, o = row / n, j = row - o * n;
        out[t] = x[(o * V + pn_ldi(idx, idt, j)) * inner + c];
    }
}

pn_status pn_cuda_select_rows(const pn_tensor *x, const pn_tensor *idx, int64_t outer, int64_t V, int64_t n,
                              int64_t inner, pn_tensor *out) {
    int64_t total = outer * n * inner;
    if (!total) return PN_OK;
    const void *ip = pn_ptr(idx);
    cudaError_t e;
    switch (pn_elsize(x->dt)) {
    case 8: {
        auto k = select_rows_kernel<uint64_t>;
        e = PN_LAUNCH(k, pn_cu_blocks(total), PN_CU_THREADS, 0, pn_cu_stream(), (const uint64_t *)pn_ptr(x), ip,
                      idx->dt, V, n, inner, total, (uint64_t *)pn_ptr(out));
        break;
    }
    case 4: {
        auto k = select_rows_kernel<uint32_t>;
        e = PN_LAUNCH(k, pn_cu_blocks(total), PN_CU_THREADS, 0, pn_cu_stream(), (const uint32_t *)pn_ptr(x), ip,
                      idx->dt, V, n, inner, total, (uint32_t *)pn_ptr(out));
        break;
    }
    default: {
        auto k = select_rows_kernel<uint8_t>;
        e = PN_LAUNCH(k, pn_cu_blocks(total), PN_CU_THREADS, 0, pn_cu_stream(), (const uint8_t *)pn_ptr(x), ip,
                      idx->dt, V, n, inner, total, (uint8_t *)pn_ptr(out));
        break;
    }
    }
    return pn_cu_check("index_select", e);
}

/* dst[d] += src[s] in dtype dt (f32/f64 exactly as the CPU's +=; others through double) */
__device__ static inline void add_elem(char *dst, const char *src, int dt, int64_t d, int64_t s) {
    if (dt == PN_F32) ((float *)dst)[d] += ((const float *)src)[s];
    else if (dt == PN_F64) ((double *)dst)[d] += ((const double *)src)[s];
    else pn_st(dst, dt, d, pn_ld(dst, dt, d) + pn_ld(src, dt, s));
}

// dst (outer, V, inner) += src (outer, n, inner) by idx (n): a block owns destination row (o, v),
// reads idx in chunks through shared memory and adds the matching source rows in index order
// (its threads over the columns)
__global__ void add_rows_kernel(char *dst, const char *src, int dt, const void *idx, int idt, int64_t outer, int64_t V,
                                int64_t n, int64_t inner) {
    PN_SHARED(int64_t, chunk, ROW_MAX_THREADS);
    for (int64_t row = blockIdx.x; row < outer * V; row += gridDim.x) {
        int64_t o = row / V, v = row - o * V;
        for (int64_t j0 = 0; j0 < n; j0 += blockDim.x) {
            int64_t m = n - j0 < (int64_t)blockDim.x ? n - j0 : (int64_t)blockDim.x;
            if ((int64_t)threadIdx.x < m) chunk[threadIdx.x] = pn_ldi(idx, idt, j0 + threadIdx.x);
            __syncthreads();
            for (int64_t jj = 0; jj < m; jj++) {
                if (chunk[jj] != v) continue;
                int64_t d = row * inner, s = (o * n + j0 + jj) * inner;
                for (int64_t c = threadIdx.x; c < inner; c += blockDim.x) add_elem(dst, src, dt, d + c, s + c);
            }
            __syncthreads(); /* chunk is rewritten next */
        }
    }
}

pn_status pn_cuda_add_rows(pn_tensor *dst, const pn_tensor *src, const pn_tensor *idx, int64_t outer, int64_t V,
                           int64_t n, int64_t inner) {
    if (!outer || !V || !n || !inner) return PN_OK;
    return pn_cu_check("index_add", PN_LAUNCH(add_rows_kernel, pn_cu_blocks(outer * V, 1), row_threads(inner), 0,
                                              pn_cu_stream(), pn_ptr(dst), (const char *)pn_ptr(src), dst->dt,
                                              (const void *)pn_ptr(idx), idx->dt, outer, V, n, inner));
}

/* ---- scatter_add / gather ------------------------------------------------------------------- */
// dst[… idx[p] along dim …] += src[p]: a thread per line (the coordinates other than dim, shape
// sh over idx's other dims; dst, idx, src strides ad, ai, as there) adding along dim in order
__global__ void scatter_add_kernel(pn_cu_shape sh, int64_t lines, int64_t K, pn_cu_arg ad, int64_t dsd, pn_cu_arg ai,
                                   int64_t isd, pn_cu_arg as, int64_t ssd) {
    PN_CU_LOOP(r, lines) {
        int64_t od = pn_cu_off(sh, ad, r), oi = pn_cu_off(sh, ai, r), os = pn_cu_off(sh, as, r);
        for (int64_t k = 0; k < K; k++) {
            int64_t d = od + pn_ldi(ai.p, ai.dt, oi + k * isd) * dsd;
            add_elem(ad.p, as.p, ad.dt, d, os + k * ssd);
        }
    }
}

pn_status pn_cuda_scatter_add(pn_tensor *dst, int dim, const pn_tensor *idx, const pn_tensor *src) {
    int nd = idx->nd, k = 0;
    if (!pn_numel(idx)) return PN_OK;
    int64_t osz[PN_MAX_DIMS];
    pn_cu_arg ad = {}, ai = {}, as = {};
    ad.p = pn_ptr(dst), ad.dt = dst->dt;
    ai.p = pn_ptr(idx), ai.dt = idx->dt;
    as.p = pn_ptr(src), as.dt = src->dt;
    for (int d = 0; d < nd; d++) {
        if (d == dim) continue;
        osz[k] = idx->sizes[d];
        ad.stride[k] = dst->strides[d];
        ai.stride[k] = idx->strides[d];
        as.stride[k] = src->strides[d];
        k++;
    }
    pn_cu_shape sh = pn_cu_shape_of(k, osz);
    int64_t lines = pn_shape_numel(k, osz);
    return pn_cu_check("scatter_add", PN_LAUNCH(scatter_add_kernel, pn_cu_blocks(lines), PN_CU_THREADS, 0,
                                                pn_cu_stream(), sh, lines, idx->sizes[dim], ad, dst->strides[dim],
                                                ai, idx->strides[dim], as, src->strides[dim]));
}

// out (idx's shape) = x at idx's coordinates, idx's value along dim (ax's stride there 0, xsd its
// real stride); E an unsigned type of the element size
template <class E>
__global__ void gather_kernel(pn_cu_shape sh, int64_t n, pn_cu_arg ao, pn_cu_arg ai, pn_cu_arg ax, int64_t xsd) {
    PN_CU_LOOP(i, n) {
        int64_t s = pn_cu_off(sh, ax, i) + pn_ldi(ai.p, ai.dt, pn_cu_off(sh, ai, i)) * xsd;
        ((E *)ao.p)[pn_cu_off(sh, ao, i)] = ((const E *)ax.p)[s];
    }
}

pn_status pn_cuda_gather(pn_tensor *out, int dim, const pn_tensor *idx, const pn_tensor *x) {
    int64_t n = pn_numel(idx);
    if (!n) return PN_OK;
    pn_cu_shape sh = pn_cu_shape_of(idx->nd, idx->sizes);
    pn_cu_arg ao = pn_cu_arg_of(out, sh), ai = pn_cu_arg_of(idx, sh), ax = {};
    ax.p = pn_ptr(x), ax.dt = x->dt;
    for (int d = 0; d < x->nd; d++) ax.stride[d] = d == dim ? 0 : x->strides[d];
    int64_t xsd = x->strides[dim];
    cudaError_t e;
    switch (pn_elsize(x->dt)) {
    case 8: {
        auto k = gather_kernel<uint64_t>;
        e = PN_LAUNCH(k, pn_cu_blocks(n), PN_CU_THREADS, 0, pn_cu_stream(), sh, n, ao, ai, ax, xsd);
        break;
    }
    case 4: {
        auto k = gather_kernel<uint32_t>;
        e = PN_LAUNCH(k, pn_cu_blocks(n), PN_CU_THREADS, 0, pn_cu_stream(), sh, n, ao, ai, ax, xsd);
        break;
    }
    default: {
        auto k = gather_kernel<uint8_t>;
        e = PN_LAUNCH(k, pn_cu_blocks(n), PN_CU_THREADS, 0, pn_cu_stream(), sh, n, ao, ai, ax, xsd);
        break;
    }
    }
    return pn_cu_check("gather", e);
}

/* ---- segments (CSR offsets (S+1) i64, validated by the front end) ------------------------------ */
static int64_t inner_of(const pn_tensor *t) {
    int64_t n = 1;
    for (int d = 1; d < t->nd; d++) n *= t->sizes[d];
    return n;
}

// out (S, inner) zeroed += the rows of x (E, inner) segment by segment: a thread per (s, c),
// rows in order
__global__ void segment_sum_kernel(char *out, const char *x, int dt, const int64_t *off, int64_t S, int64_t inner) {
    PN_CU_LOOP(t, S * inner) {
        int64_t s = t / inner, c = t - s * inner;
        for (int64_t e = off[s]; e < off[s + 1]; e++) add_elem(out, x, dt, t, e * inner + c);
    }
}

pn_status pn_cuda_segment_sum(pn_tensor *out, const pn_tensor *x, const pn_tensor *offsets) {
    int64_t S = offsets->sizes[0] - 1, inner = inner_of(x);
    if (!S || !inner) return PN_OK;
    return pn_cu_check("segment_sum", PN_LAUNCH(segment_sum_kernel, pn_cu_blocks(S * inner), PN_CU_THREADS, 0,
                                                pn_cu_stream(), pn_ptr(out), (const char *)pn_ptr(x), x->dt,
                                                (const int64_t *)pn_ptr(offsets), S, inner));
}

/* the segment s of row e: the last s with off[s] <= e (off[0] = 0 <= e < off[S]) */
__device__ static inline int64_t segment_of(const int64_t *off, int64_t S, int64_t e) {
    int64_t lo = 0, hi = S;
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if (off[mid] <= e) lo = mid;
        else hi = mid;
    }
    return lo;
}

// gx (E, inner) row e = g (S, inner) row of e's segment; E an unsigned type of the element size
template <class El>
__global__ void segment_sum_bwd_kernel(El *gx, const El *g, const int64_t *off, int64_t S, int64_t E, int64_t inner) {
    PN_CU_LOOP(t, E * inner) {
        int64_t e = t / inner, c = t - e * inner;
        gx[t] = g[segment_of(off, S, e) * inner + c];
    }
}

pn_status pn_cuda_segment_sum_bwd(pn_tensor *gx, const pn_tensor *g, const pn_tensor *offsets) {
    int64_t S = offsets->sizes[0] - 1, E = gx->sizes[0], inner = inner_of(gx);
    if (!S || !E || !inner) return PN_OK;
    const int64_t *off = (const int64_t *)pn_ptr(offsets);
    cudaError_t e;
    switch (pn_elsize(g->dt)) {
    case 8: {
        auto k = segment_sum_bwd_kernel<uint64_t>;
        e = PN_LAUNCH(k, pn_cu_blocks(E * inner), PN_CU_THREADS, 0, pn_cu_stream(), (uint64_t *)pn_ptr(gx),
                      (const uint64_t *)pn_ptr(g), off, S, E, inner);
        break;
    }
    case 4: {
        auto k = segment_sum_bwd_kernel<uint32_t>;
        e = PN_LAUNCH(k, pn_cu_blocks(E * inner), PN_CU_THREADS, 0, pn_cu_stream(), (uint32_t *)pn_ptr(gx),
                      (const uint32_t *)pn_ptr(g), off, S, E, inner);
        break;
    }
    default: {
        auto k = segment_sum_bwd_kernel<uint8_t>;
        e = PN_LAUNCH(k, pn_cu_blocks(E * inner), PN_CU_THREADS, 0, pn_cu_stream(), (uint8_t *)pn_ptr(gx),
                      (const uint8_t *)pn_ptr(g), off, S, E, inner);
        break;
    }
    }
    return pn_cu_check("segment_sum", e);
}

__device__ static inline float seg_exp(float v) { return expf(v); }
__device__ static inline double seg_exp(double v) { return exp(v); }

// y (E, inner) = softmax of x over each segment's rows, per column: a thread per (s, i) walking
// the rows as the CPU does (max, exp and sum in double, scale); all −inf → zeros
template <class T>
__global__ void segment_softmax_kernel(T *y, const T *x, const int64_t *off, int64_t S, int64_t inner) {
    PN_CU_LOOP(t, S * inner) {
        int64_t s = t / inner, i = t - s * inner, e0 = off[s], e1 = off[s + 1];
        T m = -INFINITY;
        for (int64_t e = e0; e < e1; e++) m = x[e * inner + i] > m ? x[e * inner + i] : m;
        if (m == -INFINITY) {
            for (int64_t e = e0; e < e1; e++) y[e * inner + i] = 0;
            continue;
        }
        double sum = 0;
        for (int64_t e = e0; e < e1; e++) {
            T v = seg_exp(x[e * inner + i] - m);
            y[e * inner + i] = v;
            sum += v;
        }
        T inv = (T)(1.0 / sum);
        for (int64_t e = e0; e < e1; e++) y[e * inner + i] *= inv;
    }
}

pn_status pn_cuda_segment_softmax(pn_tensor *y, const pn_tensor *x, const pn_tensor *offsets) {
    int64_t S = offsets->sizes[0] - 1, inner = inner_of(x);
    if (!S || !inner) return PN_OK;
    cudaError_t e;
    PN_CU_FLOAT_SWITCH(x->dt, T, {
        auto k = segment_softmax_kernel<T>;
        e = PN_LAUNCH(k, pn_cu_blocks(S * inner), PN_CU_THREADS, 0, pn_cu_stream(), (T *)pn_ptr(y),
                      (const T *)pn_ptr(x), (const int64_t *)pn_ptr(offsets), S, inner);
    });
    return pn_cu_check("segment_softmax", e);
}

// dx = y ⊙ (g − Σ_segment y·g), per (segment, column)
template <class T>
__global__ void segment_softmax_bwd_kernel(T *dx, const T *y, const T *g, const int64_t *off, int64_t S,
                                           int64_t inner) {
    PN_CU_LOOP(t, S * inner) {
        int64_t s = t / inner, i = t - s * inner, e0 = off[s], e1 = off[s + 1];
        double dot = 0;
        for (int64_t e = e0; e < e1; e++) dot += (double)y[e * inner + i] * g[e * inner + i];
        for (int64_t e = e0; e < e1; e++) dx[e * inner + i] = (T)(y[e * inner + i] * (g[e * inner + i] - dot));
    }
}

pn_status pn_cuda_segment_softmax_bwd(pn_tensor *gx, const pn_tensor *y, const pn_tensor *g,
                                      const pn_tensor *offsets) {
    int64_t S = offsets->sizes[0] - 1, inner = inner_of(y);
    if (!S || !inner) return PN_OK;
    cudaError_t e;
    PN_CU_FLOAT_SWITCH(y->dt, T, {
        auto k = segment_softmax_bwd_kernel<T>;
        e = PN_LAUNCH(k, pn_cu_blocks(S * inner), PN_CU_THREADS, 0, pn_cu_stream(), (T *)pn_ptr(gx),
                      (const T *)pn_ptr(y), (const T *)pn_ptr(g), (const int64_t *)pn_ptr(offsets), S, inner);
    });
    return pn_cu_check("segment_softmax", e);
}

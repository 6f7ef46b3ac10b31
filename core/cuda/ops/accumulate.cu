/* accumulate.cu — the CUDA twins of ops/accumulate.c: acc += g, and sum_to (a broadcast's
 * gradient summed back to the input's shape). */
#include "../cuda.cuh"

__global__ void accumulate_kernel(pn_cu_shape sh, int64_t n, pn_cu_arg acc, pn_cu_arg g) {
    PN_CU_LOOP(i, n) {
        int64_t oa = pn_cu_off(sh, acc, i), og = pn_cu_off(sh, g, i);
        if (acc.dt == PN_F32) ((float *)acc.p)[oa] += ((const float *)g.p)[og];
        else if (acc.dt == PN_F64) ((double *)acc.p)[oa] += ((const double *)g.p)[og];
        else pn_st(acc.p, acc.dt, oa, pn_ld(acc.p, acc.dt, oa) + pn_ld(g.p, g.dt, og));
    }
}

pn_status pn_cuda_accumulate(pn_tensor *acc, const pn_tensor *g) {
    int64_t n = pn_numel(acc);
    if (!n) return PN_OK;
    pn_cu_shape sh = pn_cu_shape_of(acc->nd, acc->sizes);
    return pn_cu_check("backward", PN_LAUNCH(accumulate_kernel, pn_cu_blocks(n), PN_CU_THREADS, 0, pn_cu_stream(),
                                             sh, n, pn_cu_arg_of(acc, sh), pn_cu_arg_of(g, sh)));
}

/* One block per output element: its threads stride over the reduced positions r (g's dims where
 * out is broadcast) in a fixed order and combine by a fixed tree, so the sum is deterministic.
 * keep: g's dims that out keeps (out contiguous over them); red: the dims summed. */
enum { SUM_TO_THREADS = 128 };
__global__ void sum_to_kernel(pn_cu_shape keep, pn_cu_arg gk, int64_t nout, pn_cu_shape red, pn_cu_arg gr,
                              int64_t nred, void *out, int dt) {
    PN_SHARED(double, part, SUM_TO_THREADS);
    for (int64_t j = blockIdx.x; j < nout; j += gridDim.x) {
        const char *base = gk.p + pn_cu_off(keep, gk, j) * (int64_t)(dt == PN_F32 ? 4 : 8);
        double acc = 0;
        for (int64_t r = threadIdx.x; r < nred; r += blockDim.x) acc += pn_ld(base, dt, pn_cu_off(red, gr, r));
        part[threadIdx.x] = acc;
        __syncthreads();
        for (int s = blockDim.x / 2; s > 0; s >>= 1) {
            if ((int)threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
            __syncthreads();
        }
        if (threadIdx.x == 0) pn_st(out, dt, j, part[0]);
        __syncthreads(); /* part is rewritten for the next j */
    }
}

pn_status pn_cuda_sum_to(pn_tensor *out, const pn_tensor *g) {
    int64_t n = pn_numel(out);
    if (!n) return PN_OK;
    if (!pn_numel(g)) return pn_cuda_fill(out, 0);
    /* out viewed at g's shape: broadcast dims (stride 0) are summed, the others kept */
    int64_t ost[PN_MAX_DIMS];
    pn_broadcast_strides(out, g->nd, g->sizes, ost);
    int64_t ksize[PN_MAX_DIMS], kst[PN_MAX_DIMS], rsize[PN_MAX_DIMS], rst[PN_MAX_DIMS];
    int nk = 0, nr = 0;
    for (int d = 0; d < g->nd; d++) {
        if (ost[d] == 0 && g->sizes[d] != 1) {
            rsize[nr] = g->sizes[d];
            rst[nr++] = g->strides[d];
        } else {
            ksize[nk] = g->sizes[d];
            kst[nk++] = g->strides[d];
        }
    }
    pn_cu_shape keep = pn_cu_shape_of(nk, ksize), red = pn_cu_shape_of(nr, rsize);
    pn_cu_arg gk = {}, gr = {};
    gk.p = gr.p = pn_ptr(g);
    gk.dt = gr.dt = g->dt;
    for (int d = 0; d < nk; d++) gk.stride[d] = kst[d];
    for (int d = 0; d < nr; d++) gr.stride[d] = rst[d];
    int64_t nred = pn_shape_numel(nr, rsize);
    return pn_cu_check("sum_to_shape", PN_LAUNCH(sum_to_kernel, pn_cu_blocks(n, 1), SUM_TO_THREADS, 0,
                                                 pn_cu_stream(), keep, gk, n, red, gr, nred, (void *)pn_ptr(out),
                                                 out->dt));
}

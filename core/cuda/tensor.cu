/* tensor.cu — the CUDA twins of core/tensor.c's kernels: copy (cast + broadcast, any strides),
 * fill, axpy, scale, arange; and the strided-view helpers of cuda.cuh. */
#include "cuda.cuh"

pn_cu_shape pn_cu_shape_of(int nd, const int64_t *size) {
    pn_cu_shape s;
    s.nd = nd;
    for (int i = 0; i < PN_MAX_DIMS; i++) s.size[i] = i < nd ? size[i] : 1;
    return s;
}

pn_cu_arg pn_cu_arg_of(const pn_tensor *t, const pn_cu_shape &sh) {
    pn_cu_arg a;
    a.p = pn_ptr(t);
    a.dt = t->dt;
    for (int i = 0; i < PN_MAX_DIMS; i++) a.stride[i] = 0;
    pn_broadcast_strides(t, sh.nd, sh.size, a.stride);
    return a;
}

/* dst (shape) = cast(src broadcast) */
__global__ void copy_kernel(pn_cu_shape sh, int64_t n, pn_cu_arg dst, pn_cu_arg src) {
    PN_CU_LOOP(i, n) {
        int64_t od = pn_cu_off(sh, dst, i), os = pn_cu_off(sh, src, i);
        if (dst.dt == src.dt) {
            switch (dst.dt) {
            case PN_F32: ((float *)dst.p)[od] = ((const float *)src.p)[os]; break;
            case PN_F64: ((double *)dst.p)[od] = ((const double *)src.p)[os]; break;
            case PN_I32: ((int32_t *)dst.p)[od] = ((const int32_t *)src.p)[os]; break;
            case PN_I64: ((int64_t *)dst.p)[od] = ((const int64_t *)src.p)[os]; break;
            default: ((uint8_t *)dst.p)[od] = ((const uint8_t *)src.p)[os]; break;
            }
        } else if (dst.dt == PN_I64 && src.dt == PN_I32) { /* exact, no trip through double */
            ((int64_t *)dst.p)[od] = ((const int32_t *)src.p)[os];
        } else {
            pn_st(dst.p, dst.dt, od, pn_ld(src.p, src.dt, os));
        }
    }
}

pn_status pn_cuda_copy(pn_tensor *dst, const pn_tensor *src) {
    int64_t n = pn_numel(dst);
    if (!n) return PN_OK;
    if (dst->dt == src->dt && pn_is_contiguous(dst) && pn_is_contiguous(src) && pn_numel(src) == n)
        return pn_cu_check("copy_", cudaMemcpyAsync(pn_ptr(dst), pn_ptr(src), (size_t)n * pn_elsize(dst->dt),
                                                    cudaMemcpyDeviceToDevice, pn_cu_stream()));
    pn_cu_shape sh = pn_cu_shape_of(dst->nd, dst->sizes);
    return pn_cu_check("copy_", PN_LAUNCH(copy_kernel, pn_cu_blocks(n), PN_CU_THREADS, 0, pn_cu_stream(), sh, n,
                                          pn_cu_arg_of(dst, sh), pn_cu_arg_of(src, sh)));
}

__global__ void fill_kernel(pn_cu_shape sh, int64_t n, pn_cu_arg t, double v) {
    PN_CU_LOOP(i, n) {
        int64_t o = pn_cu_off(sh, t, i);
        if (t.dt == PN_F32) ((float *)t.p)[o] = (float)v;
        else pn_st(t.p, t.dt, o, v);
    }
}

pn_status pn_cuda_fill(pn_tensor *t, double v) {
    int64_t n = pn_numel(t);
    if (!n) return PN_OK;
    if (v == 0 && !signbit(v) && pn_is_contiguous(t)) /* all-zero bits for every dtype */
        return pn_cu_check("fill_", cudaMemsetAsync(pn_ptr(t), 0, (size_t)n * pn_elsize(t->dt), pn_cu_stream()));
    pn_cu_shape sh = pn_cu_shape_of(t->nd, t->sizes);
    return pn_cu_check("fill_", PN_LAUNCH(fill_kernel, pn_cu_blocks(n), PN_CU_THREADS, 0, pn_cu_stream(), sh, n,
                                          pn_cu_arg_of(t, sh), v));
}

/* y = y·a + alpha·x (a = 1: axpy; alpha = 0 and no x: scale) */
__global__ void axpby_kernel(pn_cu_shape sh, int64_t n, pn_cu_arg y, double a, double alpha, pn_cu_arg x, int has_x) {
    PN_CU_LOOP(i, n) {
        int64_t oy = pn_cu_off(sh, y, i);
        if (y.dt == PN_F32) {
            float *py = (float *)y.p + oy;
            float r = has_x ? *py + (float)alpha * ((const float *)x.p)[pn_cu_off(sh, x, i)] : *py * (float)a;
            *py = r;
        } else if (y.dt == PN_F64) {
            double *py = (double *)y.p + oy;
            *py = has_x ? *py + alpha * ((const double *)x.p)[pn_cu_off(sh, x, i)] : *py * a;
        } else {
            double cur = pn_ld(y.p, y.dt, oy);
            pn_st(y.p, y.dt, oy, has_x ? cur + alpha * pn_ld(x.p, x.dt, pn_cu_off(sh, x, i)) : cur * a);
        }
    }
}

pn_status pn_cuda_axpy(pn_tensor *y, double alpha, const pn_tensor *x) {
    int64_t n = pn_numel(y);
    if (!n) return PN_OK;
    pn_cu_shape sh = pn_cu_shape_of(y->nd, y->sizes);
    return pn_cu_check("axpy_", PN_LAUNCH(axpby_kernel, pn_cu_blocks(n), PN_CU_THREADS, 0, pn_cu_stream(), sh, n,
                                          pn_cu_arg_of(y, sh), 1.0, alpha, pn_cu_arg_of(x, sh), 1));
}

pn_status pn_cuda_scale(pn_tensor *y, double alpha) {
    int64_t n = pn_numel(y);
    if (!n) return PN_OK;
    pn_cu_shape sh = pn_cu_shape_of(y->nd, y->sizes);
    pn_cu_arg ya = pn_cu_arg_of(y, sh);
    return pn_cu_check("scale_", PN_LAUNCH(axpby_kernel, pn_cu_blocks(n), PN_CU_THREADS, 0, pn_cu_stream(), sh, n,
                                           ya, alpha, 0.0, ya, 0));
}

__global__ void arange_kernel(void *p, int dt, int64_t n, double start, double step) {
    PN_CU_LOOP(i, n) pn_st(p, dt, i, start + (double)i * step);
}

pn_status pn_cuda_arange(pn_tensor *out, double start, double step) {
    int64_t n = pn_numel(out);
    if (!n) return PN_OK;
    return pn_cu_check("arange", PN_LAUNCH(arange_kernel, pn_cu_blocks(n), PN_CU_THREADS, 0, pn_cu_stream(),
                                           (void *)pn_ptr(out), out->dt, n, start, step));
}

/* mma_check.cu — pn_cuda_mma_check: one warp runs pn_mma_16816 (mma_ptx.cuh) on matrices given
 * row-major, each lane packing its registers by the documented layout, so comparing d with
 * a·b + c checks that layout: in the interpreter against its model, on a GPU against the
 * hardware (spec/cuda_mma_spec.lua). */
#include "mma_ptx.cuh"

namespace {

template <class H> __device__ H cvt16(float x);
template <> __device__ __nv_bfloat16 cvt16<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __half cvt16<__half>(float x) { return __float2half_rn(x); }

/* a (16, 16), b (16, 8: k × n), c (16, 8) row-major f32, rounded to H here; d (16, 8) */
template <class H> __global__ void mma_check_kernel(const float *a, const float *b, const float *c, float *d) {
    const int l = threadIdx.x, g = l / 4, t = l % 4;
    uint32_t ra[4], rb[2];
    float rc[4], rd[4];
    ra[0] = pn_pack16(cvt16<H>(a[g * 16 + 2 * t]), cvt16<H>(a[g * 16 + 2 * t + 1]));
    ra[1] = pn_pack16(cvt16<H>(a[(g + 8) * 16 + 2 * t]), cvt16<H>(a[(g + 8) * 16 + 2 * t + 1]));
    ra[2] = pn_pack16(cvt16<H>(a[g * 16 + 2 * t + 8]), cvt16<H>(a[g * 16 + 2 * t + 9]));
    ra[3] = pn_pack16(cvt16<H>(a[(g + 8) * 16 + 2 * t + 8]), cvt16<H>(a[(g + 8) * 16 + 2 * t + 9]));
    rb[0] = pn_pack16(cvt16<H>(b[(2 * t) * 8 + g]), cvt16<H>(b[(2 * t + 1) * 8 + g]));
    rb[1] = pn_pack16(cvt16<H>(b[(2 * t + 8) * 8 + g]), cvt16<H>(b[(2 * t + 9) * 8 + g]));
    rc[0] = c[g * 8 + 2 * t], rc[1] = c[g * 8 + 2 * t + 1];
    rc[2] = c[(g + 8) * 8 + 2 * t], rc[3] = c[(g + 8) * 8 + 2 * t + 1];
    pn_mma_16816<H>(rd, ra, rb, rc);
    d[g * 8 + 2 * t] = rd[0], d[g * 8 + 2 * t + 1] = rd[1];
    d[(g + 8) * 8 + 2 * t] = rd[2], d[(g + 8) * 8 + 2 * t + 1] = rd[3];
}

} // namespace

extern "C" pn_status pn_cuda_mma_check(int half, const float *a, const float *b, const float *c, float *d) {
    const char *op = "cuda.mma_check";
    if (!pn_cuda_available()) return pn_error(PN_ERR_DEVICE, "%s: no CUDA device", op);
    if (!a || !b || !c || !d) return pn_error(PN_ERR_ARG, "%s: a, b, c and d must be given", op);
    const int64_t n = 16 * 16 + 16 * 8 * 3;
    pn_tensor *buf = pn_empty(1, &n, PN_F32, PN_CUDA);
    if (!buf) return PN_ERR_OOM;
    float *p = (float *)pn_ptr(buf);
    pn_status s = pn_cuda_upload(p, a, 256 * sizeof(float));
    if (!s) s = pn_cuda_upload(p + 256, b, 128 * sizeof(float));
    if (!s) s = pn_cuda_upload(p + 384, c, 128 * sizeof(float));
    if (!s) {
        auto kb = mma_check_kernel<__nv_bfloat16>;
        auto kh = mma_check_kernel<__half>;
        s = pn_cu_check(op, half ? PN_LAUNCH(kh, 1, 32, 0, pn_cu_stream(), p, p + 256, p + 384, p + 512)
                                 : PN_LAUNCH(kb, 1, 32, 0, pn_cu_stream(), p, p + 256, p + 384, p + 512));
    }
    if (!s) s = pn_cuda_download(d, p + 512, 128 * sizeof(float));
    pn_release(buf);
    return s;
}

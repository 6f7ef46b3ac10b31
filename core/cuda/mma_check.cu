/* mma_check.cu — pn_cuda_mma_check: one warp runs pn_mma_16816 (mma_ptx.cuh) on matrices given
 * row-major, its registers either packed by each lane by the documented layout or loaded from
 * shared memory by pn_ldmatrix_x4 (A) and _x2 (Bᵀ), so comparing d with a·b + c checks that
 * layout and ldmatrix's: in the interpreter against its model, on a GPU against the hardware
 * (spec/cuda_mma_spec.lua). */
#include "mma_ptx.cuh"

namespace {

template <class H> __device__ H cvt16(float x);
template <> __device__ __nv_bfloat16 cvt16<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __half cvt16<__half>(float x) { return __float2half_rn(x); }

enum { LDS = 24 }; /* the shared tiles' row stride in halves: 48 bytes, 16-byte aligned rows */
struct alignas(16) check_tiles {
    uint16_t a[16 * LDS], bt[8 * LDS]; /* A (16 × 16) and Bᵀ (8 × 16) as 16-bit values */
};

/* a (16, 16), b (16, 8: k × n), c (16, 8) row-major f32, rounded to H here; d (16, 8).
 * ldm: A from a shared copy by one ldmatrix.x4, B from Bᵀ (8 rows of k) by one .x2 */
template <class H> __global__ void mma_check_kernel(const float *a, const float *b, const float *c, float *d, int ldm) {
    PN_SHARED(check_tiles, sh, 1);
    H *as = (H *)sh->a, *bt = (H *)sh->bt;
    const int l = threadIdx.x, g = l / 4, t = l % 4;
    uint32_t ra[4], rb[2];
    float rc[4], rd[4];
    if (ldm) {
        for (int e = l; e < 16 * 16; e += 32) as[(e / 16) * LDS + e % 16] = cvt16<H>(a[e]);
        for (int e = l; e < 16 * 8; e += 32) bt[(e % 8) * LDS + e / 8] = cvt16<H>(b[e]); /* b[k][n] → bt[n][k] */
        __syncwarp();
        const int m = l / 8, r = l % 8; /* the lane's row: row r of matrix m */
        pn_ldmatrix_x4(ra, as + (r + 8 * (m % 2)) * LDS + 8 * (m / 2));
        pn_ldmatrix_x2(rb, bt + r * LDS + 8 * (m % 2));
    } else {
        ra[0] = pn_pack16(cvt16<H>(a[g * 16 + 2 * t]), cvt16<H>(a[g * 16 + 2 * t + 1]));
        ra[1] = pn_pack16(cvt16<H>(a[(g + 8) * 16 + 2 * t]), cvt16<H>(a[(g + 8) * 16 + 2 * t + 1]));
        ra[2] = pn_pack16(cvt16<H>(a[g * 16 + 2 * t + 8]), cvt16<H>(a[g * 16 + 2 * t + 9]));
        ra[3] = pn_pack16(cvt16<H>(a[(g + 8) * 16 + 2 * t + 8]), cvt16<H>(a[(g + 8) * 16 + 2 * t + 9]));
        rb[0] = pn_pack16(cvt16<H>(b[(2 * t) * 8 + g]), cvt16<H>(b[(2 * t + 1) * 8 + g]));
        rb[1] = pn_pack16(cvt16<H>(b[(2 * t + 8) * 8 + g]), cvt16<H>(b[(2 * t + 9) * 8 + g]));
    }
    rc[0] = c[g * 8 + 2 * t], rc[1] = c[g * 8 + 2 * t + 1];
    rc[2] = c[(g + 8) * 8 + 2 * t], rc[3] = c[(g + 8) * 8 + 2 * t + 1];
    pn_mma_16816<H>(rd, ra, rb, rc);
    d[g * 8 + 2 * t] = rd[0], d[g * 8 + 2 * t + 1] = rd[1];
    d[(g + 8) * 8 + 2 * t] = rd[2], d[(g + 8) * 8 + 2 * t + 1] = rd[3];
}

/* a (8, 4), b (4, 8), c (8, 8) row-major f64 → d (8, 8): pn_dmma_884's layout, each lane packing
 * its registers from global memory */
__global__ void dmma_check_kernel(const double *a, const double *b, const double *c, double *d) {
    const int l = threadIdx.x, g = l / 4, t = l % 4;
    double rc[2] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1]}, rd[2];
    pn_dmma_884(rd, a[g * 4 + t], b[t * 8 + g], rc);
    d[g * 8 + 2 * t] = rd[0], d[g * 8 + 2 * t + 1] = rd[1];
}

} // namespace

extern "C" pn_status pn_cuda_dmma_check(const double *a, const double *b, const double *c, double *d) {
    const char *op = "cuda.dmma_check";
    if (!pn_cuda_available()) return pn_error(PN_ERR_DEVICE, "%s: no CUDA device", op);
    if (!a || !b || !c || !d) return pn_error(PN_ERR_ARG, "%s: a, b, c and d must be given", op);
    const int64_t n = 32 + 32 + 64 + 64;
    pn_tensor *buf = pn_empty(1, &n, PN_F64, PN_CUDA);
    if (!buf) return PN_ERR_OOM;
    double *p = (double *)pn_ptr(buf);
    pn_status s = pn_cuda_upload(p, a, 32 * sizeof(double));
    if (!s) s = pn_cuda_upload(p + 32, b, 32 * sizeof(double));
    if (!s) s = pn_cuda_upload(p + 64, c, 64 * sizeof(double));
    if (!s) s = pn_cu_check(op, PN_LAUNCH(dmma_check_kernel, 1, 32, 0, pn_cu_stream(), p, p + 32, p + 64, p + 128));
    if (!s) s = pn_cuda_download(d, p + 128, 64 * sizeof(double));
    pn_release(buf);
    return s;
}

extern "C" pn_status pn_cuda_mma_check(int half, int ldmatrix, const float *a, const float *b, const float *c, float *d) {
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
        const int ldm = ldmatrix != 0;
        s = pn_cu_check(op, half ? PN_LAUNCH(kh, 1, 32, 0, pn_cu_stream(), p, p + 256, p + 384, p + 512, ldm)
                                 : PN_LAUNCH(kb, 1, 32, 0, pn_cu_stream(), p, p + 256, p + 384, p + 512, ldm));
    }
    if (!s) s = pn_cuda_download(d, p + 512, 128 * sizeof(float));
    pn_release(buf);
    return s;
}

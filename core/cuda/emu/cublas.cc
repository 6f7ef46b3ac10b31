/* cublas.cc — the interpreter's cuBLAS subset on OpenBLAS (see cublas.h). Every gemm goes
 * through gemm(): cuBLAS's argument checks, device-memory checks of every matrix's whole
 * extent, then a queued item that converts inputs (TF32 rounding, half/bfloat16) when
 * needed and calls cblas_sgemm / cblas_dgemm per batch. */
#include "cublas.h"
#include "half.h"

#include <cblas.h>
#include <vector>

struct cublasContext {
    cudaStream_t stream = nullptr;
    cublasMath_t mode = CUBLAS_DEFAULT_MATH;
};

namespace {

/* the 16-bit conversions are half.h's (shared with the kernels' __half / __nv_bfloat16) */
using pn_emu_impl::bf16_bits_to_float;
using pn_emu_impl::float_to_bf16_bits;
using pn_emu_impl::float_to_half_bits;
using pn_emu_impl::half_bits_to_float;

float tf32_round(float f) { /* keep 10 mantissa bits, round to nearest even */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000) != 0x7f800000) u = (u + 0xfff + ((u >> 13) & 1)) & 0xffffe000u;
    memcpy(&f, &u, 4);
    return f;
}

size_t elem_size(cudaDataType t) { return t == CUDA_R_64F ? 8 : t == CUDA_R_32F ? 4 : 2; }

float load_f(const void *p, cudaDataType t, size_t i) {
    switch (t) {
    case CUDA_R_32F: return ((const float *)p)[i];
    case CUDA_R_16F: return half_bits_to_float(((const uint16_t *)p)[i]);
    case CUDA_R_16BF: return bf16_bits_to_float(((const uint16_t *)p)[i]);
    default: return (float)((const double *)p)[i];
    }
}

void store_f(void *p, cudaDataType t, size_t i, float v) {
    switch (t) {
    case CUDA_R_32F: ((float *)p)[i] = v; break;
    case CUDA_R_16F: ((uint16_t *)p)[i] = float_to_half_bits(v); break;
    case CUDA_R_16BF: ((uint16_t *)p)[i] = float_to_bf16_bits(v); break;
    default: ((double *)p)[i] = v; break;
    }
}

/* elements spanned by a column-major rows × cols matrix with leading dimension ld */
size_t extent(int rows, int cols, int ld) { return rows && cols ? (size_t)ld * (cols - 1) + rows : 0; }

struct Gemm {
    CBLAS_TRANSPOSE ta, tb;
    int m, n, k, lda, ldb, ldc, batch;
    long long sA, sB, sC;
    const void *A, *B;
    void *C;
    cudaDataType at, ct;
    double alpha, beta;
    bool f64, tf32;
};

void run_gemm(const Gemm &g) {
    int ar = g.ta == CblasNoTrans ? g.m : g.k, ac = g.ta == CblasNoTrans ? g.k : g.m;
    int br = g.tb == CblasNoTrans ? g.k : g.n, bc = g.tb == CblasNoTrans ? g.n : g.k;
    size_t na = extent(ar, ac, g.lda), nb = extent(br, bc, g.ldb);
    std::vector<float> a, b, c;
    for (int i = 0; i < g.batch; i++) {
        if (g.f64) {
            const double *A = (const double *)g.A + g.sA * i, *B = (const double *)g.B + g.sB * i;
            double *C = (double *)g.C + g.sC * i;
            if (g.beta == 0) /* cuBLAS does not read C then (it may hold NaN) */
                for (int j = 0; j < g.n; j++) memset(C + (size_t)j * g.ldc, 0, sizeof(double) * g.m);
            cblas_dgemm(CblasColMajor, g.ta, g.tb, g.m, g.n, g.k, g.alpha, A, g.lda, B, g.ldb, g.beta, C, g.ldc);
            continue;
        }
        const char *A = (const char *)g.A + g.sA * i * elem_size(g.at), *B = (const char *)g.B + g.sB * i * elem_size(g.at);
        char *C = (char *)g.C + g.sC * i * elem_size(g.ct);
        const float *pa = (const float *)A, *pb = (const float *)B;
        if (g.at != CUDA_R_32F || g.tf32) { /* converted copies of the inputs */
            a.resize(na), b.resize(nb);
            for (size_t j = 0; j < na; j++) a[j] = g.tf32 ? tf32_round(load_f(A, g.at, j)) : load_f(A, g.at, j);
            for (size_t j = 0; j < nb; j++) b[j] = g.tf32 ? tf32_round(load_f(B, g.at, j)) : load_f(B, g.at, j);
            pa = a.data(), pb = b.data();
        }
        float *pc = (float *)C;
        int ldc = g.ldc;
        if (g.ct != CUDA_R_32F) { /* C in float, m × n dense */
            c.assign((size_t)g.m * g.n, 0.0f);
            if (g.beta != 0)
                for (int j = 0; j < g.n; j++)
                    for (int r = 0; r < g.m; r++) c[(size_t)j * g.m + r] = load_f(C, g.ct, (size_t)j * g.ldc + r);
            pc = c.data(), ldc = g.m;
        } else if (g.beta == 0)
            for (int j = 0; j < g.n; j++) memset(pc + (size_t)j * ldc, 0, sizeof(float) * g.m);
        cblas_sgemm(CblasColMajor, g.ta, g.tb, g.m, g.n, g.k, (float)g.alpha, pa, g.lda, pb, g.ldb, (float)g.beta, pc, ldc);
        if (g.ct != CUDA_R_32F)
            for (int j = 0; j < g.n; j++)
                for (int r = 0; r < g.m; r++) store_f(C, g.ct, (size_t)j * g.ldc + r, c[(size_t)j * g.m + r]);
    }
}

cublasStatus_t invalid(const char *api, const char *why) {
    pn_emu_set_detail("%s: %s", api, why);
    return CUBLAS_STATUS_INVALID_VALUE;
}

/* The one gemm: checks as cuBLAS does, then queues run_gemm on the handle's stream. */
cublasStatus_t gemm(const char *api, cublasHandle_t h, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                    int k, const void *alpha, const void *A, cudaDataType at, int lda, long long sA, const void *B,
                    cudaDataType bt, int ldb, long long sB, const void *beta, void *C, cudaDataType ct, int ldc,
                    long long sC, int batch, cublasComputeType_t compute) {
    if (!h) {
        pn_emu_set_detail("%s: NULL handle (cublasCreate not called?)", api);
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    if ((transa != CUBLAS_OP_N && transa != CUBLAS_OP_T && transa != CUBLAS_OP_C) ||
        (transb != CUBLAS_OP_N && transb != CUBLAS_OP_T && transb != CUBLAS_OP_C))
        return invalid(api, "bad cublasOperation_t");
    if (m < 0 || n < 0 || k < 0 || batch < 0) return invalid(api, "m, n, k and batchCount must be ≥ 0");
    int ar = transa == CUBLAS_OP_N ? m : k, ac = transa == CUBLAS_OP_N ? k : m;
    int br = transb == CUBLAS_OP_N ? k : n, bc = transb == CUBLAS_OP_N ? n : k;
    if (lda < (ar > 1 ? ar : 1)) return invalid(api, "lda < max(1, rows of A as stored)");
    if (ldb < (br > 1 ? br : 1)) return invalid(api, "ldb < max(1, rows of B as stored)");
    if (ldc < (m > 1 ? m : 1)) return invalid(api, "ldc < max(1, m)");
    bool f64 = at == CUDA_R_64F;
    bool types_ok = at == bt && (f64 ? ct == CUDA_R_64F && compute == CUBLAS_COMPUTE_64F
                                     : (at == CUDA_R_32F || at == CUDA_R_16F || at == CUDA_R_16BF) &&
                                           (ct == at || ct == CUDA_R_32F) &&
                                           (compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_FAST_TF32 ||
                                            compute == CUBLAS_COMPUTE_32F_FAST_16F || compute == CUBLAS_COMPUTE_32F_FAST_16BF));
    if (!types_ok) {
        pn_emu_set_detail("%s: type combination A %d, B %d, C %d, compute %d not supported by the interpreter", api, at,
                          bt, ct, compute);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
    if (!alpha || !beta) return invalid(api, "alpha and beta must be host pointers, not NULL");
    /* every matrix (all batches) inside one device allocation */
    struct {
        const char *name;
        const void *p;
        size_t es, n;
        long long stride;
    } mats[3] = {{"A", A, elem_size(at), extent(ar, ac, lda), sA},
                 {"B", B, elem_size(bt), extent(br, bc, ldb), sB},
                 {"C", C, elem_size(ct), extent(m, n, ldc), sC}};
    for (auto &x : mats) {
        if (!x.n) continue; /* k == 0: A and B are not read */
        size_t last = x.stride > 0 ? (size_t)x.stride * (batch - 1) : 0;
        if (x.stride < 0 || !x.p || !pn_emu_is_device(x.p, (last + x.n) * x.es)) {
            pn_emu_set_detail("%s: matrix %s at %p (%zu B over %d batch(es)) is not inside one device allocation", api,
                              x.name, x.p, (last + x.n) * x.es, batch);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    }
    Gemm g;
    g.ta = transa == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
    g.tb = transb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
    g.m = m, g.n = n, g.k = k, g.lda = lda, g.ldb = ldb, g.ldc = ldc, g.batch = batch;
    g.sA = sA, g.sB = sB, g.sC = sC, g.A = A, g.B = B, g.C = C, g.at = at, g.ct = ct;
    g.f64 = f64;
    g.alpha = f64 ? *(const double *)alpha : *(const float *)alpha; /* host pointer mode: read now */
    g.beta = f64 ? *(const double *)beta : *(const float *)beta;
    g.tf32 = at == CUDA_R_32F && (compute == CUBLAS_COMPUTE_32F_FAST_TF32 ||
                                  (compute == CUBLAS_COMPUTE_32F && h->mode == CUBLAS_TF32_TENSOR_OP_MATH));
    if (pn_emu_enqueue(h->stream, [g] { run_gemm(g); }) != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
    return CUBLAS_STATUS_SUCCESS;
}

} // namespace

cublasStatus_t cublasCreate(cublasHandle_t *handle) {
    if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
    *handle = new cublasContext;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t h) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGetStream(cublasHandle_t h, cudaStream_t *s) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!s) return CUBLAS_STATUS_INVALID_VALUE;
    *s = h->stream;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGetMathMode(cublasHandle_t h, cublasMath_t *mode) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!mode) return CUBLAS_STATUS_INVALID_VALUE;
    *mode = h->mode;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusName(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_UNKNOWN";
    }
}
const char *cublasGetStatusString(cublasStatus_t s) { return cublasGetStatusName(s); }

cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta,
                           float *C, int ldc) {
    return gemm("cublasSgemm", h, ta, tb, m, n, k, alpha, A, CUDA_R_32F, lda, 0, B, CUDA_R_32F, ldb, 0, beta, C,
                CUDA_R_32F, ldc, 0, 1, CUBLAS_COMPUTE_32F);
}
cublasStatus_t cublasDgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const double *alpha, const double *A, int lda, const double *B, int ldb, const double *beta,
                           double *C, int ldc) {
    return gemm("cublasDgemm", h, ta, tb, m, n, k, alpha, A, CUDA_R_64F, lda, 0, B, CUDA_R_64F, ldb, 0, beta, C,
                CUDA_R_64F, ldc, 0, 1, CUBLAS_COMPUTE_64F);
}
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                         int k, const float *alpha, const float *A, int lda, long long sA,
                                         const float *B, int ldb, long long sB, const float *beta, float *C, int ldc,
                                         long long sC, int batch) {
    return gemm("cublasSgemmStridedBatched", h, ta, tb, m, n, k, alpha, A, CUDA_R_32F, lda, sA, B, CUDA_R_32F, ldb, sB,
                beta, C, CUDA_R_32F, ldc, sC, batch, CUBLAS_COMPUTE_32F);
}
cublasStatus_t cublasDgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                         int k, const double *alpha, const double *A, int lda, long long sA,
                                         const double *B, int ldb, long long sB, const double *beta, double *C,
                                         int ldc, long long sC, int batch) {
    return gemm("cublasDgemmStridedBatched", h, ta, tb, m, n, k, alpha, A, CUDA_R_64F, lda, sA, B, CUDA_R_64F, ldb, sB,
                beta, C, CUDA_R_64F, ldc, sC, batch, CUBLAS_COMPUTE_64F);
}
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType at, int lda, const void *B, cudaDataType bt,
                            int ldb, const void *beta, void *C, cudaDataType ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo) {
    (void)algo;
    return gemm("cublasGemmEx", h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta, C, ct, ldc, 0, 1, compute);
}
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void *alpha, const void *A, cudaDataType at, int lda,
                                          long long sA, const void *B, cudaDataType bt, int ldb, long long sB,
                                          const void *beta, void *C, cudaDataType ct, int ldc, long long sC, int batch,
                                          cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    (void)algo;
    return gemm("cublasGemmStridedBatchedEx", h, ta, tb, m, n, k, alpha, A, at, lda, sA, B, bt, ldb, sB, beta, C, ct,
                ldc, sC, batch, compute);
}

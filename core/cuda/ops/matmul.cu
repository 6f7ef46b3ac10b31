/* matmul.cu — the CUDA twin of ops/matmul.c's kernel: c (batch…, m, n) contiguous = a @ b on
 * cuBLAS.
 *
 * cuBLAS is column-major; a row-major (m, n) matrix is the column-major (n, m) matrix of its
 * transpose, so C = A·B (row-major) is computed as Cᵀ = Bᵀ·Aᵀ (column-major): the cuBLAS call
 * gets B as its first operand and A as its second, and m/n swap. The front end hands over
 * operands a BLAS reads as they are: row-major (stride 1 along the columns: NoTrans in row-major
 * terms, i.e. a column-major matrix of the transpose, CUBLAS_OP_N here) or a transposed
 * row-major matrix (stride 1 along the rows: CUBLAS_OP_T here), with the same leading-dimension
 * rules as matmul.c (matmul_plan.h's pn_gemm_layout_of).
 *
 * Batches: when a's and b's batch offsets are each an affine function of the flat batch index
 * (one stride per operand over the whole flattened batch, 0 where broadcast) the batch is ONE
 * cublas{S,D}gemmStridedBatched; otherwise one GEMM per batch, queued on the stream in order.
 * b shared by every batch with a's rows evenly strided folds into one tall GEMM, as on the CPU.
 *
 * Precision: f32 is exact f32 (CUBLAS_COMPUTE_32F through cublasGemmEx) unless the user opted
 * into TF32 (pn_cuda_set_tf32, pn.cuda.allow_tf32: CUBLAS_COMPUTE_32F_FAST_TF32, tensor cores,
 * ~1e-3 relative); the specs compare exact f32 with the CPU to 1e-5. f64 is cublasDgemm. */
#include "../cuda.cuh"
#include "../../ops/matmul_plan.h"

#include <limits.h>

namespace {

/* C (m, n) row-major, ldc = n, = (or += with acc: beta 1) A (m, k) · B (k, n), as the
 * column-major Cᵀ = Bᵀ·Aᵀ. Batched when count > 1 (strides in elements). */
pn_status gemm(int dt, int64_t m, int64_t n, int64_t k, const char *a, pn_gemm_layout la, int64_t sa, const char *b,
               pn_gemm_layout lb, int64_t sb, char *c, int64_t sc, int64_t count, int acc) {
    cublasHandle_t h = pn_cu_blas();
    /* column-major view: first operand Bᵀ (n, k): B row-major (trans 0) is exactly that matrix
     * (OP_N, ld); B transposed row-major is Bᵀ stored transposed (OP_T, ld). Same for Aᵀ. */
    cublasOperation_t ob = lb.trans ? CUBLAS_OP_T : CUBLAS_OP_N, oa = la.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
    int M = (int)n, N = (int)m, K = (int)k, ldb = (int)lb.ld, lda = (int)la.ld, ldc = (int)n;
    cublasStatus_t s;
    if (dt == PN_F32) {
        const float one = 1.0f, beta = acc ? 1.0f : 0.0f;
        const cublasComputeType_t ct = pn_cu_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
        if (count == 1)
            s = cublasGemmEx(h, ob, oa, M, N, K, &one, b, CUDA_R_32F, ldb, a, CUDA_R_32F, lda, &beta, c, CUDA_R_32F,
                             ldc, ct, CUBLAS_GEMM_DEFAULT);
        else
            s = cublasGemmStridedBatchedEx(h, ob, oa, M, N, K, &one, b, CUDA_R_32F, ldb, (long long)sb, a, CUDA_R_32F,
                                           lda, (long long)sa, &beta, c, CUDA_R_32F, ldc, (long long)sc, (int)count,
                                           ct, CUBLAS_GEMM_DEFAULT);
    } else {
        const double one = 1.0, beta = acc ? 1.0 : 0.0;
        if (count == 1)
            s = cublasDgemm(h, ob, oa, M, N, K, &one, (const double *)b, ldb, (const double *)a, lda, &beta,
                            (double *)c, ldc);
        else
            s = cublasDgemmStridedBatched(h, ob, oa, M, N, K, &one, (const double *)b, ldb, (long long)sb,
                                          (const double *)a, lda, (long long)sa, &beta, (double *)c, ldc,
                                          (long long)sc, (int)count);
    }
    return pn_cu_blas_check("matmul", s);
}

} // namespace

pn_status pn_cuda_matmul(int bnd, const int64_t *bshape, int64_t m, int64_t n, int64_t k, const pn_tensor *a,
                         const int64_t *sa, int64_t a_sm, int64_t a_sk, const pn_tensor *b, const int64_t *sb,
                         int64_t b_sk, int64_t b_sn, pn_tensor *c, int acc) {
    const int dt = c->dt;
    const int64_t nbatch = pn_shape_numel(bnd, bshape);
    const size_t es = pn_elsize(dt);
    char *pc = pn_ptr(c);
    if (nbatch == 0 || m == 0 || n == 0) return PN_OK;
    if (k == 0) /* empty sum */
        return acc ? PN_OK : pn_cu_check("matmul", cudaMemsetAsync(pc, 0, (size_t)(nbatch * m * n) * es, pn_cu_stream()));
    pn_gemm_layout la = pn_gemm_layout_of(m, k, a_sm, a_sk), lb = pn_gemm_layout_of(k, n, b_sk, b_sn);
    if (!la.ok || !lb.ok)
        return pn_error(PN_ERR_ARG, "matmul: an operand's strides are not a BLAS layout (the front end copies those)");
    const char *pa = pn_ptr(a), *pb = pn_ptr(b);

    /* b shared by every batch and a's rows evenly strided: one tall GEMM */
    int64_t rs = pn_matmul_tall_stride(bnd, bshape, nbatch, sa, sb, m, k, a_sm, a_sk);
    if (rs >= 0 && nbatch * m <= INT_MAX) {
        pn_gemm_layout tall = {0, rs, true};
        return gemm(dt, nbatch * m, n, k, pa, tall, 0, pb, lb, 0, pc, 0, 1, acc);
    }
    /* one strided batched call when each operand's batch offsets are uniform: offset(i) = i·st
     * over the flat batch index (st 0 where broadcast) — the batch as a run of rows of one */
    int64_t ua = pn_matmul_merged_row_stride(bnd, bshape, sa, 1, 0);
    int64_t ub = pn_matmul_merged_row_stride(bnd, bshape, sb, 1, 0);
    if (nbatch <= INT_MAX && ua >= 0 && ub >= 0) return gemm(dt, m, n, k, pa, la, ua, pb, lb, ub, pc, m * n, nbatch, acc);
    /* otherwise one GEMM per batch, in order on the stream */
    for (int64_t i = 0; i < nbatch; i++) {
        int64_t oa, ob;
        pn_matmul_batch_offsets(bnd, bshape, sa, sb, i, &oa, &ob);
        PN_TRY(gemm(dt, m, n, k, pa + (size_t)oa * es, la, 0, pb + (size_t)ob * es, lb, 0,
                    pc + (size_t)(i * m * n) * es, 0, 1, acc));
    }
    return PN_OK;
}

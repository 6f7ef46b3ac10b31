/* matmul.cu — the CUDA twin of ops/matmul.c's kernel: c (batch…, m, n) contiguous = a @ b on
 * cuBLAS.
 *
 * cuBLAS is column-major; a row-major (m, n) matrix is the column-major (n, m) matrix of its
 * transpose, so C = A·B (row-major) is computed as Cᵀ = Bᵀ·Aᵀ (column-major): the cuBLAS call
 * gets B as its first operand and A as its second, and m/n swap. The front end hands over
 * operands a BLAS reads as they are: row-major (stride 1 along the columns: NoTrans in row-major
 * terms, i.e. a column-major matrix of the transpose, CUBLAS_OP_N here) or a transposed
 * row-major matrix (stride 1 along the rows: CUBLAS_OP_T here), with the same leading-dimension
 * rules as matmul.c's layout_of.
 *
 * Batches: when a's and b's batch offsets are each an affine function of the flat batch index
 * (one stride per operand over the whole flattened batch, 0 where broadcast) the batch is ONE
 * cublas{S,D}gemmStridedBatched; otherwise one GEMM per batch, queued on the stream in order.
 * b shared by every batch with a's rows evenly strided folds into one tall GEMM, as on the CPU.
 *
 * Precision: f32 is exact f32 (CUBLAS_COMPUTE_32F through cublasGemmEx, never TF32): penumbra
 * has no TF32 opt-in (neither matmul.c nor penumbra.h offers one), and the specs compare f32
 * CUDA results with the CPU to 1e-5 relative. f64 is cublasDgemm. */
#include "../cuda.cuh"

#include <limits.h>

namespace {

/* How BLAS reads a (rows, cols) row-major view with element strides (srow, scol): trans 0 =
 * row-major with leading dimension ld, 1 = transposed row-major (column-major) with ld. The
 * front end made sure one of the two holds (matmul.c's layout_of, same rules). */
struct layout {
    int trans;
    int64_t ld;
    bool ok;
};

layout layout_of(int64_t rows, int64_t cols, int64_t srow, int64_t scol) {
    int64_t r1 = rows > 1 ? rows : 1, c1 = cols > 1 ? cols : 1;
    if (scol == 1 || cols <= 1) {
        int64_t ld = rows <= 1 ? c1 : srow;
        if (ld >= c1) return {0, ld, true};
    }
    if (srow == 1 || rows <= 1) {
        int64_t ld = cols <= 1 ? r1 : scol;
        if (ld >= r1) return {1, ld, true};
    }
    return {0, 0, false};
}

/* Row stride when a's batch dims and its row dim form one evenly strided run of rows; -1
 * otherwise (matmul.c's merged_row_stride). */
int64_t merged_row_stride(int bnd, const int64_t *bshape, const int64_t *sa, int64_t m, int64_t srow) {
    int64_t base = -1, span = 1;
    if (m > 1) {
        base = srow;
        span = m;
    }
    for (int d = bnd - 1; d >= 0; d--) {
        if (bshape[d] == 1) continue;
        if (base < 0) base = sa[d];
        else if (sa[d] != base * span) return -1;
        span *= bshape[d];
    }
    return base < 0 ? 0 : base;
}

/* One stride st with offset(i) = i·st for every flat batch index i over bshape, when the
 * operand's batch strides s allow it: true and *st. A broadcast operand has st = 0. */
bool uniform_stride(int bnd, const int64_t *bshape, const int64_t *s, int64_t *st) {
    int64_t base = -1, span = 1; /* stride of one step of the flat index so far, batches covered */
    bool zero = true;
    for (int d = 0; d < bnd; d++)
        if (bshape[d] > 1 && s[d] != 0) zero = false;
    if (zero) {
        *st = 0;
        return true;
    }
    for (int d = bnd - 1; d >= 0; d--) {
        if (bshape[d] == 1) continue;
        if (base < 0) base = s[d];
        else if (s[d] != base * span) return false;
        span *= bshape[d];
    }
    *st = base < 0 ? 0 : base;
    return true;
}

/* C (m, n) row-major, ldc = n, = A (m, k) · B (k, n), as the column-major Cᵀ = Bᵀ·Aᵀ. Batched
 * when count > 1 (strides in elements). */
pn_status gemm(int dt, int64_t m, int64_t n, int64_t k, const char *a, layout la, int64_t sa, const char *b,
               layout lb, int64_t sb, char *c, int64_t sc, int64_t count) {
    cublasHandle_t h = pn_cu_blas();
    /* column-major view: first operand Bᵀ (n, k): B row-major (trans 0) is exactly that matrix
     * (OP_N, ld); B transposed row-major is Bᵀ stored transposed (OP_T, ld). Same for Aᵀ. */
    cublasOperation_t ob = lb.trans ? CUBLAS_OP_T : CUBLAS_OP_N, oa = la.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
    int M = (int)n, N = (int)m, K = (int)k, ldb = (int)lb.ld, lda = (int)la.ld, ldc = (int)n;
    cublasStatus_t s;
    if (dt == PN_F32) {
        const float one = 1.0f, zero = 0.0f;
        if (count == 1)
            s = cublasGemmEx(h, ob, oa, M, N, K, &one, b, CUDA_R_32F, ldb, a, CUDA_R_32F, lda, &zero, c, CUDA_R_32F,
                             ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        else
            s = cublasGemmStridedBatchedEx(h, ob, oa, M, N, K, &one, b, CUDA_R_32F, ldb, (long long)sb, a, CUDA_R_32F,
                                           lda, (long long)sa, &zero, c, CUDA_R_32F, ldc, (long long)sc, (int)count,
                                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    } else {
        const double one = 1.0, zero = 0.0;
        if (count == 1)
            s = cublasDgemm(h, ob, oa, M, N, K, &one, (const double *)b, ldb, (const double *)a, lda, &zero,
                            (double *)c, ldc);
        else
            s = cublasDgemmStridedBatched(h, ob, oa, M, N, K, &one, (const double *)b, ldb, (long long)sb,
                                          (const double *)a, lda, (long long)sa, &zero, (double *)c, ldc,
                                          (long long)sc, (int)count);
    }
    return pn_cu_blas_check("matmul", s);
}

} // namespace

pn_status pn_cuda_matmul(int bnd, const int64_t *bshape, int64_t m, int64_t n, int64_t k, const pn_tensor *a,
                         const int64_t *sa, int64_t a_sm, int64_t a_sk, const pn_tensor *b, const int64_t *sb,
                         int64_t b_sk, int64_t b_sn, pn_tensor *c) {
    const int dt = c->dt;
    const int64_t nbatch = pn_shape_numel(bnd, bshape);
    const size_t es = pn_elsize(dt);
    char *pc = pn_ptr(c);
    if (nbatch == 0 || m == 0 || n == 0) return PN_OK;
    if (k == 0) /* empty sum */
        return pn_cu_check("matmul", cudaMemsetAsync(pc, 0, (size_t)(nbatch * m * n) * es, pn_cu_stream()));
    layout la = layout_of(m, k, a_sm, a_sk), lb = layout_of(k, n, b_sk, b_sn);
    if (!la.ok || !lb.ok)
        return pn_error(PN_ERR_ARG, "matmul: an operand's strides are not a BLAS layout (the front end copies those)");
    const char *pa = pn_ptr(a), *pb = pn_ptr(b);

    /* b shared by every batch and a's rows evenly strided: one tall GEMM */
    bool b_shared = true;
    for (int d = 0; d < bnd; d++)
        if (bshape[d] > 1 && sb[d] != 0) b_shared = false;
    if (nbatch > 1 && b_shared && (a_sk == 1 || k == 1)) {
        int64_t rs = merged_row_stride(bnd, bshape, sa, m, a_sm);
        int64_t mm = nbatch * m;
        if (rs >= (k > 1 ? k : 1) && mm <= INT_MAX)
            return gemm(dt, mm, n, k, pa, layout{0, rs, true}, 0, pb, lb, 0, pc, 0, 1);
    }
    /* one strided batched call when each operand's batch offsets are uniform */
    int64_t ua, ub;
    if (nbatch <= INT_MAX && uniform_stride(bnd, bshape, sa, &ua) && uniform_stride(bnd, bshape, sb, &ub))
        return gemm(dt, m, n, k, pa, la, ua, pb, lb, ub, pc, m * n, nbatch);
    /* otherwise one GEMM per batch, in order on the stream */
    for (int64_t i = 0; i < nbatch; i++) {
        int64_t oa = 0, ob = 0, r = i;
        for (int d = bnd - 1; d >= 0; d--) {
            int64_t j = r % bshape[d];
            r /= bshape[d];
            oa += j * sa[d];
            ob += j * sb[d];
        }
        PN_TRY(gemm(dt, m, n, k, pa + (size_t)oa * es, la, 0, pb + (size_t)ob * es, lb, 0,
                    pc + (size_t)(i * m * n) * es, 0, 1));
    }
    return PN_OK;
}

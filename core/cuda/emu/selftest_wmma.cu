/* selftest_wmma.cu — the interpreter's cases for the 16-bit types and nvcuda::wmma (emu build
 * only; dispatched from pn_cuda_emu_selftest in selftest.cu). Correct kernels, which must give
 * the exact answer under every schedule and fragment map, beside planted bugs:
 *
 *   half_convert        floats (special values, ties, random exponents) through __half and
 *                       __nv_bfloat16 in device memory and back: [n, x[n], half[n], bf16[n]]
 *   wmma_gemm_bf16      D = alpha·(A·B + C0), 64×64×48, A/B tiles staged in shared memory,
 *   wmma_gemm_half      4 warps per block, each a fragment-sized sub-tile; the four cases
 *   wmma_gemm_bf16_32x8 cover both element types, the three shapes, both A/B layouts and
 *   wmma_gemm_half_8x32 both accumulator memory layouts:
 *                       [M, N, K, alpha, A (M×K), B (K×N), C0 (M×N), D (M×N)], row-major,
 *                       A and B as their rounded 16-bit values
 *   wmma_tile           one warp, one 16×16×16 bf16 tile: [A (256), B (256), D (256)] — the control
 *   wmma_assume_acc_map the bug: the accumulator written out as sm_80's mma registers hold it
 *   wmma_assume_a_map   the bug: bf16 A's x[] filled as sm_80's registers hold it (wrong answer)
 *   wmma_assume_a_map_half  the same with __half, whose elements have two copies: reported
 *   wmma_skip_mma       lane 5 skips mma_sync (and meets the others at store): reported
 *   wmma_missing_lane   lane 31 returns before the loads: reported
 *   wmma_partial_warp   48 threads: the second warp has 16 lanes: reported
 *   wmma_misaligned     A loaded from 16 bytes past an aligned address: reported
 *   wmma_bad_ldm        A loaded with ldm 20 (not a multiple of 8): reported
 *   wmma_out_of_range   B's tile runs past its allocation: reported
 *   wmma_uninit_acc     mma_sync on an accumulator never filled: D is NaN
 *   ldmatrix_misaligned PTX ldmatrix (mma_ptx.cuh) with row addresses 8 bytes off: reported
 *   ldmatrix_global     ldmatrix from device memory instead of shared: reported
 *   dmma_divergent      mma.sync m8n8k4 .f64 (pn_dmma_884) called by lanes 0–15 only, as a tile
 *                       product inside a lane-dependent branch would: reported
 * (ldmatrix's values: spec/cuda_mma_spec.lua, through pn_cuda_mma_check)
 */
#include "selftest.h"
#include "../mma_ptx.cuh"

#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

using namespace pn_selftest;
namespace wm = nvcuda::wmma;

/* deterministic inputs with full f32 mantissas: a hash of (i, salt) onto [lo, hi) */
float input(uint32_t i, uint32_t salt, float lo, float hi) {
    uint32_t h = i * 0x9E3779B1u ^ (salt + 1) * 0x85EBCA77u;
    h ^= h >> 15, h *= 0x2C1B3C6Du, h ^= h >> 12, h *= 0x297A2D39u, h ^= h >> 15;
    return lo + (hi - lo) * (float)(h >> 8) * (1.0f / 16777216.0f);
}

template <class T> __host__ __device__ inline T to16(float f);
template <> __host__ __device__ inline __half to16<__half>(float f) { return __float2half(f); }
template <> __host__ __device__ inline __nv_bfloat16 to16<__nv_bfloat16>(float f) { return __float2bfloat16(f); }
__host__ __device__ inline float from16(__half h) { return __half2float(h); }
__host__ __device__ inline float from16(__nv_bfloat16 h) { return __bfloat162float(h); }

/* ---- conversions ------------------------------------------------------------------------- */
__global__ void convert_kernel(float *hf, float *bf, __half *h, __nv_bfloat16 *b, const float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    h[i] = i % 2 ? __float2half_rn(x[i]) : __float2half(x[i]); /* both names, through device memory */
    b[i] = i % 2 ? __float2bfloat16_rn(x[i]) : __float2bfloat16(x[i]);
    hf[i] = __half2float(h[i]);
    bf[i] = __bfloat162float(b[i]);
}

pn_status convert_case(double *out, int64_t n) {
    std::vector<float> x = {0.0f, -0.0f, 1.0f, -2.5f, 0.1f, 1.0f / 3, 3.14159265f, INFINITY, -INFINITY, NAN, -NAN,
                            65504.0f, 65519.0f, 65520.0f, -65520.0f, 65536.0f, 1e10f, 3.4028235e38f, 1.1754944e-38f,
                            1e-45f, 0x1p-24f, 0x1p-25f, 0x3p-25f, 0x5p-26f, 0x1p-14f, 0x1.ffcp-15f, 0x1.ffep-15f,
                            1.0f + 0x1p-11f, 1.0f + 0x3p-11f, 1.0f + 0x1p-8f, 1.0f + 0x3p-8f, -(1.0f + 0x3p-8f),
                            0x1.fep127f, 0x1.ff8p127f};
    for (uint32_t i = 0; i < 300; i++) { /* random mantissas over the exponents of both formats */
        float m = input(i, 7, 1.0f, 2.0f);
        int e = i < 200 ? (int)(i % 50) - 30 : (int)(i % 100) * 3 - 140;
        x.push_back((i % 3 ? 1.0f : -1.0f) * ldexpf(m, e));
    }
    int cnt = (int)x.size();
    Dev dx, dhf, dbf, dh, db;
    CK(cudaMalloc(&dx.p, sizeof(float) * cnt));
    CK(cudaMalloc(&dhf.p, sizeof(float) * cnt));
    CK(cudaMalloc(&dbf.p, sizeof(float) * cnt));
    CK(cudaMalloc(&dh.p, sizeof(__half) * cnt));
    CK(cudaMalloc(&db.p, sizeof(__nv_bfloat16) * cnt));
    CK(cudaMemcpy(dx.p, x.data(), sizeof(float) * cnt, cudaMemcpyHostToDevice));
    CK(PN_LAUNCH(convert_kernel, (cnt + 127) / 128, 128, 0, 0, (float *)dhf.p, (float *)dbf.p, (__half *)dh.p,
                 (__nv_bfloat16 *)db.p, (const float *)dx.p, cnt));
    put(out, n, 0, cnt);
    for (int i = 0; i < cnt; i++) put(out, n, 1 + i, x[i]);
    pn_status st = copy_out(out, n, (const float *)dhf.p, cnt, 1 + cnt);
    return st != PN_OK ? st : copy_out(out, n, (const float *)dbf.p, cnt, 1 + 2 * (int64_t)cnt);
}

/* ---- the GEMM ------------------------------------------------------------------------------ */
const int GM = 64, GN = 64, GK = 48; /* every shape's block tile (2 × 2 warps) divides them */
const float ALPHA = 0.5f;

/* D = alpha·(A·B + C0); A (M×K), B (K×N) row-major in global memory; C0 and D (M×N) row-major,
 * or column-major when col_c. A block of 4 warps owns a (2·WM)×(2·WN) tile of D; per K step it
 * stages A's and B's slices in shared memory in the fragments' layouts, and warp (wy, wx)
 * multiplies its WM×16 and 16×WN fragments into its accumulator. */
template <class T, int WM, int WN, class LA, class LB>
__global__ void gemm_kernel(float *D, const T *A, const T *B, const float *C0, float alpha, int M, int N, int K,
                            int col_c) {
    const int WK = 16, BM = 2 * WM, BN = 2 * WN;
    const bool a_col = std::is_same<LA, wm::col_major>::value, b_col = std::is_same<LB, wm::col_major>::value;
    PN_SHARED(T, As, BM * WK); /* row-major ldm WK, or column-major ldm BM */
    PN_SHARED(T, Bs, WK * BN); /* row-major ldm BN, or column-major ldm WK */
    int tid = threadIdx.x, warp = tid / 32, wy = warp / 2, wx = warp % 2;
    int r0 = blockIdx.y * BM + wy * WM, c0 = blockIdx.x * BN + wx * WN; /* this warp's sub-tile */
    size_t at = col_c ? (size_t)c0 * M + r0 : (size_t)r0 * N + c0;
    unsigned ldc = col_c ? M : N;
    wm::layout_t lc = col_c ? wm::mem_col_major : wm::mem_row_major;
    wm::fragment<wm::accumulator, WM, WN, WK, float> acc;
    wm::fragment<wm::matrix_a, WM, WN, WK, T, LA> a;
    wm::fragment<wm::matrix_b, WM, WN, WK, T, LB> b;
    wm::load_matrix_sync(acc, C0 + at, ldc, lc);
    for (int k0 = 0; k0 < K; k0 += WK) {
        for (int i = tid; i < BM * WK; i += blockDim.x) {
            int r = i / WK, kk = i % WK;
            As[a_col ? kk * BM + r : r * WK + kk] = A[(size_t)(blockIdx.y * BM + r) * K + k0 + kk];
        }
        for (int i = tid; i < WK * BN; i += blockDim.x) {
            int kk = i / BN, c = i % BN;
            Bs[b_col ? c * WK + kk : kk * BN + c] = B[(size_t)(k0 + kk) * N + blockIdx.x * BN + c];
        }
        __syncthreads();
        wm::load_matrix_sync(a, a_col ? As + wy * WM : As + wy * WM * WK, a_col ? BM : WK);
        wm::load_matrix_sync(b, b_col ? Bs + wx * WN * WK : Bs + wx * WN, b_col ? WK : BN);
        wm::mma_sync(acc, a, b, acc);
        __syncthreads(); /* the next step overwrites the tiles */
    }
    for (int i = 0; i < acc.num_elements; i++) acc.x[i] *= alpha; /* element-wise: right under any map */
    wm::store_matrix_sync(D + at, acc, ldc, lc);
}

template <class T, int WM, int WN, class LA, class LB> pn_status gemm_case(double *out, int64_t n, int col_c) {
    const int M = GM, N = GN, K = GK;
    std::vector<T> A(M * K), B(K * N);
    std::vector<float> C0(M * N), C0m(M * N), D(M * N);
    for (int i = 0; i < M * K; i++) A[i] = to16<T>(input(i, 1, -2.0f, 2.0f));
    for (int i = 0; i < K * N; i++) B[i] = to16<T>(input(i, 2, -2.0f, 2.0f));
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++) {
            C0[r * N + c] = input(r * N + c, 3, -1.0f, 1.0f);
            C0m[col_c ? c * M + r : r * N + c] = C0[r * N + c];
        }
    Dev dA, dB, dC, dD;
    CK(cudaMalloc(&dA.p, sizeof(T) * M * K));
    CK(cudaMalloc(&dB.p, sizeof(T) * K * N));
    CK(cudaMalloc(&dC.p, sizeof(float) * M * N));
    CK(cudaMalloc(&dD.p, sizeof(float) * M * N));
    CK(cudaMemcpy(dA.p, A.data(), sizeof(T) * M * K, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dB.p, B.data(), sizeof(T) * K * N, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dC.p, C0m.data(), sizeof(float) * M * N, cudaMemcpyHostToDevice));
    auto wmma_gemm = gemm_kernel<T, WM, WN, LA, LB>;
    CK(PN_LAUNCH(wmma_gemm, dim3(N / (2 * WN), M / (2 * WM)), 128, 0, 0, (float *)dD.p, (const T *)dA.p, (const T *)dB.p,
                 (const float *)dC.p, ALPHA, M, N, K, col_c));
    CK(cudaMemcpy(D.data(), dD.p, sizeof(float) * M * N, cudaMemcpyDeviceToHost));
    int64_t o = 0;
    put(out, n, o++, M), put(out, n, o++, N), put(out, n, o++, K), put(out, n, o++, ALPHA);
    for (int i = 0; i < M * K; i++) put(out, n, o++, from16(A[i]));
    for (int i = 0; i < K * N; i++) put(out, n, o++, from16(B[i]));
    for (int i = 0; i < M * N; i++) put(out, n, o++, C0[i]);
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++) put(out, n, o++, D[col_c ? c * M + r : r * N + c]);
    return PN_OK;
}

/* ---- one tile, and the planted bugs -------------------------------------------------------- */
enum TileBug { TB_NONE, TB_ASSUME_ACC, TB_ASSUME_A, TB_SKIP_MMA, TB_MISSING_LANE, TB_PARTIAL, TB_MISALIGNED, TB_BAD_LDM,
               TB_OUT_OF_RANGE, TB_UNINIT };
const int SLACK = 64; /* elements after A's tile, so a shifted or widened read of A stays inside it */

/* where sm_80's mma.m16n8k16 registers hold element i (of 8) of lane: a 16×16 tile as two
 * 16×8 halves — what code written against the real hardware (and wrong here) assumes */
__device__ inline int hw_row(int lane, int i) { return lane / 4 + 8 * ((i / 2) % 2); }
__device__ inline int hw_col(int lane, int i) { return (lane % 4) * 2 + i % 2 + 8 * (i / 4); }

/* D (16×16 row-major) = A · B, one warp per tile (every warp the same tile) */
template <class T> __global__ void tile_kernel(float *D, const T *A, const T *B, int bug) {
    int lane = threadIdx.x % 32;
    if (bug == TB_MISSING_LANE && lane == 31) return; /* the bug: the others load without it */
    wm::fragment<wm::matrix_a, 16, 16, 16, T, wm::row_major> a;
    wm::fragment<wm::matrix_b, 16, 16, 16, T, wm::row_major> b;
    wm::fragment<wm::accumulator, 16, 16, 16, float> acc;
    if (bug != TB_UNINIT) wm::fill_fragment(acc, 0.0f);
    if (bug == TB_ASSUME_A) {
        for (int i = 0; i < a.num_elements; i++) a.x[i] = A[hw_row(lane, i % 8) * 16 + hw_col(lane, i % 8)];
    } else {
        wm::load_matrix_sync(a, bug == TB_MISALIGNED ? A + 8 : A, bug == TB_BAD_LDM ? 20 : 16);
    }
    wm::load_matrix_sync(b, bug == TB_OUT_OF_RANGE ? B + 16 : B, 16);
    if (!(bug == TB_SKIP_MMA && lane == 5)) wm::mma_sync(acc, a, b, acc);
    if (bug == TB_ASSUME_ACC) {
        for (int i = 0; i < acc.num_elements; i++) D[hw_row(lane, i) * 16 + hw_col(lane, i)] = acc.x[i];
    } else {
        wm::store_matrix_sync(D, acc, 16, wm::mem_row_major);
    }
}

template <class T> pn_status tile_case(double *out, int64_t n, int bug) {
    std::vector<T> A(256 + SLACK), B(256);
    for (int i = 0; i < 256 + SLACK; i++) A[i] = to16<T>(input(i, 4, -2.0f, 2.0f));
    for (int i = 0; i < 256; i++) B[i] = to16<T>(input(i, 5, -2.0f, 2.0f));
    Dev dA, dB, dD;
    CK(cudaMalloc(&dA.p, sizeof(T) * A.size()));
    CK(cudaMalloc(&dB.p, sizeof(T) * B.size()));
    CK(cudaMalloc(&dD.p, sizeof(float) * 256));
    CK(cudaMemcpy(dA.p, A.data(), sizeof(T) * A.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dB.p, B.data(), sizeof(T) * B.size(), cudaMemcpyHostToDevice));
    auto wmma_tile = tile_kernel<T>;
    CK(PN_LAUNCH(wmma_tile, 1, bug == TB_PARTIAL ? 48 : 32, 0, 0, (float *)dD.p, (const T *)dA.p, (const T *)dB.p, bug));
    CK(cudaDeviceSynchronize());
    for (int i = 0; i < 256; i++) put(out, n, i, from16(A[i])), put(out, n, 256 + i, from16(B[i]));
    return copy_out(out, n, (const float *)dD.p, 256, 512);
}

/* ---- ldmatrix's planted bugs ------------------------------------------------------------------- */
enum LdBug { LB_MISALIGNED, LB_GLOBAL };
struct alignas(16) ld_tile {
    uint16_t v[32 * 8]; /* four 8 × 8 matrices, row r of matrix i at row 8i + r */
};

/* out[4·lane + i] = the lane's register i of one ldmatrix.x4 over the 32 rows, with the bug */
__global__ void ldmatrix_kernel(uint32_t *out, const uint16_t *g, int bug) {
    PN_SHARED(ld_tile, sh, 1);
    const int l = threadIdx.x;
    for (int e = l; e < 32 * 8; e += 32) sh->v[e] = g[e];
    __syncwarp();
    const uint16_t *row = bug == LB_GLOBAL ? g + 8 * l : sh->v + 8 * l + (bug == LB_MISALIGNED ? 4 : 0);
    uint32_t r[4];
    pn_ldmatrix_x4(r, row);
    for (int i = 0; i < 4; i++) out[4 * l + i] = r[i];
}

pn_status ldmatrix_case(double *out, int64_t n, int bug) {
    std::vector<uint16_t> v(32 * 8);
    for (int i = 0; i < 32 * 8; i++) v[i] = (uint16_t)i;
    Dev dg, dout;
    CK(cudaMalloc(&dg.p, sizeof(uint16_t) * v.size()));
    CK(cudaMalloc(&dout.p, sizeof(uint32_t) * 128));
    CK(cudaMemcpy(dg.p, v.data(), sizeof(uint16_t) * v.size(), cudaMemcpyHostToDevice));
    CK(PN_LAUNCH(ldmatrix_kernel, 1, 32, 0, 0, (uint32_t *)dout.p, (const uint16_t *)dg.p, bug));
    CK(cudaDeviceSynchronize());
    std::vector<uint32_t> r(128);
    CK(cudaMemcpy(r.data(), dout.p, sizeof(uint32_t) * 128, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 128; i++) put(out, n, i, r[i]);
    return PN_OK;
}

/* ---- the f64 mma in a divergent branch ------------------------------------------------------ */
__global__ void dmma_divergent_kernel(double *out) {
    const int l = threadIdx.x;
    double c[2] = {0, 0}, d[2] = {0, 0};
    if (l < 16) pn_dmma_884(d, l, 1.0, c); /* the bug: a warp collective under a lane's branch */
    out[2 * l] = d[0], out[2 * l + 1] = d[1];
}

pn_status dmma_divergent_case(double *out, int64_t n) {
    Dev dout;
    CK(cudaMalloc(&dout.p, sizeof(double) * 64));
    CK(PN_LAUNCH(dmma_divergent_kernel, 1, 32, 0, 0, (double *)dout.p));
    CK(cudaDeviceSynchronize());
    std::vector<double> r(64);
    CK(cudaMemcpy(r.data(), dout.p, sizeof(double) * 64, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 64; i++) put(out, n, i, r[i]);
    return PN_OK;
}

typedef __nv_bfloat16 bf16;
typedef wm::row_major row;
typedef wm::col_major col;

struct Case {
    const char *name;
    pn_status (*run)(double *, int64_t);
};

const Case cases[] = {
    {"half_convert", convert_case},
    {"wmma_gemm_bf16", [](double *o, int64_t n) { return gemm_case<bf16, 16, 16, row, row>(o, n, 0); }},
    {"wmma_gemm_half", [](double *o, int64_t n) { return gemm_case<__half, 16, 16, col, col>(o, n, 1); }},
    {"wmma_gemm_bf16_32x8", [](double *o, int64_t n) { return gemm_case<bf16, 32, 8, row, col>(o, n, 0); }},
    {"wmma_gemm_half_8x32", [](double *o, int64_t n) { return gemm_case<__half, 8, 32, row, row>(o, n, 1); }},
    {"wmma_tile", [](double *o, int64_t n) { return tile_case<bf16>(o, n, TB_NONE); }},
    {"wmma_assume_acc_map", [](double *o, int64_t n) { return tile_case<bf16>(o, n, TB_ASSUME_ACC); }},
    {"wmma_assume_a_map", [](double *o, int64_t n) { return tile_case<bf16>(o, n, TB_ASSUME_A); }},
    {"wmma_assume_a_map_half", [](double *o, int64_t n) { return tile_case<__half>(o, n, TB_ASSUME_A); }},
    {"wmma_skip_mma", [](double *o, int64_t n) { return tile_case<bf16>(o, n, TB_SKIP_MMA); }},
    {"wmma_missing_lane", [](double *o, int64_t n) { return tile_case<bf16>(o, n, TB_MISSING_LANE); }},
    {"wmma_partial_warp", [](double *o, int64_t n) { return tile_case<bf16>(o, n, TB_PARTIAL); }},
    {"wmma_misaligned", [](double *o, int64_t n) { return tile_case<__half>(o, n, TB_MISALIGNED); }},
    {"wmma_bad_ldm", [](double *o, int64_t n) { return tile_case<__half>(o, n, TB_BAD_LDM); }},
    {"wmma_out_of_range", [](double *o, int64_t n) { return tile_case<bf16>(o, n, TB_OUT_OF_RANGE); }},
    {"wmma_uninit_acc", [](double *o, int64_t n) { return tile_case<bf16>(o, n, TB_UNINIT); }},
    {"ldmatrix_misaligned", [](double *o, int64_t n) { return ldmatrix_case(o, n, LB_MISALIGNED); }},
    {"ldmatrix_global", [](double *o, int64_t n) { return ldmatrix_case(o, n, LB_GLOBAL); }},
    {"dmma_divergent", dmma_divergent_case},
};

} // namespace

namespace pn_selftest {

const char *wmma_case_name(size_t i) { return i < sizeof cases / sizeof cases[0] ? cases[i].name : nullptr; }

bool run_wmma_case(const char *name, double *out, int64_t n, pn_status *st) {
    for (const Case &c : cases)
        if (!strcmp(name, c.name)) {
            *st = c.run(out, n);
            return true;
        }
    return false;
}

} // namespace pn_selftest

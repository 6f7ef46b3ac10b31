/* mma_ptx.cuh — one warp's D = A·B + C on tensor cores through PTX's
 * mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32, whose register layout PTX
 * documents ("Matrix Fragments for mma.m16n8k16 with floating point type") — unlike wmma's
 * fragment map, which CUDA leaves unspecified. A kernel that knows which row each accumulator
 * element holds can rescale rows in registers (an online softmax on the accumulators, as
 * FlashAttention-2 does), which wmma cannot do without a trip through shared memory.
 *
 * Layout, g = lane / 4, t = lane % 4; a 16-bit pair packs its lower column (for B its lower k) in
 * the low half:
 *   a[0] = A[g][2t, 2t+1]      a[1] = A[g+8][2t, 2t+1]   a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][2t+8, 2t+9]
 *   b[0] = B[2t, 2t+1][g]      b[1] = B[2t+8, 2t+9][g]               (A 16 × 16 row-major, B 16 × 8)
 *   c[0], c[1] = C[g][2t, 2t+1]      c[2], c[3] = C[g+8][2t, 2t+1]     (C, D 16 × 8, f32)
 * Every lane of the warp calls it (a warp collective: in the interpreter a lane missing is an
 * error, as for wmma). d may be c. nvcc: the instruction itself (sm_80+); the interpreter:
 * emu/mma.h's pn_emu_mma_16816, the same arithmetic in f32 with k in order.
 *
 * The fragments come from shared memory by ldmatrix (pn_ldmatrix_x4 / _x2 below), whose result
 * is this layout for an 8 × 8 block stored row by row: one instruction for four registers,
 * instead of a 32-bit load each.
 *
 * Checked by spec/cuda_mma_spec.lua (D against A·B + C on the CPU for a pattern where every
 * element differs, so a wrong register or half shows; the operands packed by the lanes or loaded
 * by ldmatrix): in the interpreter against its model, on an H100 (2026-11-27: the packed form)
 * against the hardware. Used by dense.cu's mfwd, mbwq and mbwk kernels. Below also the f64 shape,
 * pn_dmma_884, for power.cu. */
#ifndef PN_MMA_PTX_CUH
#define PN_MMA_PTX_CUH

#include "cuda.cuh"

#include <stdint.h>

#ifdef PN_CUDA_EMU
template <class H>
inline void pn_mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4],
                         const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    pn_emu_mma_16816<H>(d, a, b, c, file, line);
}
#else
/* the instruction for input type T ("bf16", "f16") */
#define PN_MMA_16816_ASM(T)                                                                                     \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." T "." T ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, " \
                 "{%8, %9}, {%10, %11, %12, %13};\n"                                                             \
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])                                               \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),     \
                   "f"(c[2]), "f"(c[3]))
template <class H> __device__ inline void pn_mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]);
template <>
__device__ inline void pn_mma_16816<__nv_bfloat16>(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
    PN_MMA_16816_ASM("bf16");
}
template <>
__device__ inline void pn_mma_16816<__half>(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
    PN_MMA_16816_ASM("f16");
}
#endif

/* ldmatrix.sync.aligned.m8n8.x4 / .x2 .shared.b16: a warp collective. Lane 8i + r passes row, the
 * address of row r of 8 × 8 matrix i (8 consecutive 16-bit values, 16-byte aligned, in shared
 * memory; lanes 16–31 of .x2 pass any address). r_out[i] of lane l = matrix i's row l / 4,
 * columns 2·(l % 4) and + 1 — mma's fragment layout above, so A's 16 × 16 block is one .x4
 * (matrices: rows 0–7 and 8–15 of columns 0–7, then of columns 8–15) and B's 16 × 8 one .x2 over
 * Bᵀ's rows. Rows whose addresses differ by 16 mod 128 bytes read the 32 banks without conflict:
 * hence the kernels' row strides of width + 8 halves. */
#ifdef PN_CUDA_EMU
inline void pn_ldmatrix_x4(uint32_t r_out[4], const void *row, const char *file = __builtin_FILE(),
                           int line = __builtin_LINE()) {
    pn_emu_ldmatrix(r_out, 4, row, file, line);
}
inline void pn_ldmatrix_x2(uint32_t r_out[2], const void *row, const char *file = __builtin_FILE(),
                           int line = __builtin_LINE()) {
    pn_emu_ldmatrix(r_out, 2, row, file, line);
}
#else
/* volatile: the same address holds another tile after the next barrier, so the load must not be
 * merged with an earlier one or moved (CUTLASS's SM75_U32x4_LDSM_N is written the same way) */
__device__ inline void pn_ldmatrix_x4(uint32_t r_out[4], const void *row) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r_out[0]), "=r"(r_out[1]), "=r"(r_out[2]), "=r"(r_out[3])
                 : "r"(s));
}
__device__ inline void pn_ldmatrix_x2(uint32_t r_out[2], const void *row) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r_out[0]), "=r"(r_out[1]) : "r"(s));
}
#endif

/* mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 (sm_80+): one warp's D (8 × 8) = A (8 × 4) ·
 * B (4 × 8) + C on the f64 tensor cores, twice the f64 FMA units' rate on an A100 or H100. PTX's
 * layout ("Matrix Fragments for mma.m8n8k4 with .f64"), g = lane / 4, t = lane % 4:
 *   a = A[g][t]      b = B[t][g]      c[0], c[1] = C[g][2t, 2t+1]      (d likewise)
 * A warp collective, every lane calling; d may be c. The interpreter: emu/mma.h's
 * pn_emu_dmma_884, C plus the products in k order by fused multiply-adds. Checked by
 * cuda.dmma_check (spec/cuda_mma_spec.lua). Used by power.cu's tile products. */
#ifdef PN_CUDA_EMU
inline void pn_dmma_884(double d[2], double a, double b, const double c[2], const char *file = __builtin_FILE(),
                        int line = __builtin_LINE()) {
    pn_emu_dmma_884(d, a, b, c, file, line);
}
#else
__device__ inline void pn_dmma_884(double d[2], double a, double b, const double c[2]) {
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%4, %5};\n"
                 : "=d"(d[0]), "=d"(d[1])
                 : "d"(a), "d"(b), "d"(c[0]), "d"(c[1]));
}
#endif

/* two 16-bit values packed as mma's registers hold them: lo in the low half */
template <class H> __device__ inline uint32_t pn_pack16(H lo, H hi) {
    uint16_t l, h;
    memcpy(&l, &lo, 2);
    memcpy(&h, &hi, 2);
    return (uint32_t)l | ((uint32_t)h << 16);
}

#endif

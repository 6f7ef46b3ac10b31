/* cuda.cuh — what every core/cuda/ .cu file includes (DESIGN §8).
 *
 * The same source compiles two ways: by nvcc for sm_80/sm_90, and (PN_CUDA_EMU) by g++ as C++
 * against penumbra's kernel interpreter (core/cuda/emu/), which runs each block's threads as
 * fibers on the CPU. So kernels use only what the interpreter models, through these macros:
 *
 *   PN_LAUNCH(kernel, grid, block, dyn_shmem, stream, args...)  → cudaError_t of the launch
 *       (a kernel template instance goes through a pointer first: auto k = f<float>;)
 *   PN_SHARED(T, name, n)      a block's static shared array T name[n] (a pointer in the
 *                              interpreter: never take sizeof(name))
 *   PN_SHARED_DYN(T, name)     the block's dynamic shared memory as T *name
 *
 * Tensor cores through nvcuda::wmma (<mma.h>) with __half / __nv_bfloat16 (<cuda_fp16.h>,
 * <cuda_bf16.h>) in both builds; the interpreter's subset and its fragment map: emu/mma.h.
 *
 * Host side: pn_cu_stream() is the stream every op queues on, pn_cu_blas() the cuBLAS handle
 * bound to it; PN_CU_TRY(op, call) turns a cudaError_t into a pn_status whose message names
 * op (and, in the interpreter, what it caught: a divergent barrier, a host pointer …). */
#ifndef PN_CUDA_CUH
#define PN_CUDA_CUH

#ifdef PN_CUDA_EMU
#include "emu/emu.h"
#include "emu/cublas.h"
#include "emu/mma.h" /* nvcuda::wmma, __half, __nv_bfloat16 (emu/half.h) */
#define PN_LAUNCH(k, grid, block, shmem, stream, ...) pn_emu_launch(#k, k, grid, block, shmem, stream, ##__VA_ARGS__)
#define PN_SHARED(T, name, n) T *name = (T *)pn_emu_shared(sizeof(T) * (n), alignof(T), #name, __FILE__, __LINE__)
#define PN_SHARED_DYN(T, name) T *name = (T *)pn_emu_dyn_shared()
#else
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h> /* nvcuda::wmma */
#define PN_LAUNCH(k, grid, block, shmem, stream, ...) \
    (k<<<(grid), (block), (shmem), (stream)>>>(__VA_ARGS__), cudaGetLastError())
#define PN_SHARED(T, name, n) __shared__ T name[n]
#define PN_SHARED_DYN(T, name)                             \
    extern __shared__ __align__(16) unsigned char pn_dyn_smem_[]; \
    T *name = (T *)pn_dyn_smem_
#endif

#include "../backend.h" /* C linkage inside */

#include <stdint.h>

/* every CUDA kernel of kernels.def (a .cu file may call another's, e.g. pn_cuda_fill) */
#define PN_KERNEL(name, args) pn_status pn_cuda_##name args;
extern "C" {
#include "../kernels.def"
}

/* ---- host side (core/cuda/device.cu) ---- */
cudaStream_t pn_cu_stream(void);
cublasHandle_t pn_cu_blas(void);
int pn_cu_tf32(void); /* pn_cuda_set_tf32: f32 GEMMs in TF32 */
size_t pn_cu_smem_optin(void); /* bytes of shared memory a block may opt in to (0 without a device) */
/* PN_OK for cudaSuccess; else an error "op: CUDA error name: text" (+ the interpreter's detail) */
pn_status pn_cu_check(const char *op, cudaError_t e);
pn_status pn_cu_blas_check(const char *op, cublasStatus_t s);
#define PN_CU_TRY(op, call) PN_TRY(pn_cu_check((op), (call)))

/* Scratch device tensors one kernel call owns (from the caching allocator), released together
 * by pn_cu_scratch_free, also on error paths. A launcher's per-call state derives from it. */
struct pn_cu_scratch {
    pn_tensor *t[48];
    int nt;
    const char *op; /* for the error when it is full */
};
/* owned t kept in s, returned (NULL passes through; an error when s is full) */
pn_tensor *pn_cu_keep(pn_cu_scratch *s, pn_tensor *t);
/* n (at least 1) elements of dt on the device, zeroed when asked, kept in s; NULL + error */
pn_tensor *pn_cu_scratch_new(pn_cu_scratch *s, int64_t n, int dt, bool zero);
void pn_cu_scratch_free(pn_cu_scratch *s);

/* Threads per block of the elementwise kernels, and the blocks for n elements: enough to cover
 * n once, capped (the kernels loop grid-stride over the rest). */
enum { PN_CU_THREADS = 256 };
static inline unsigned pn_cu_blocks(int64_t n, int threads = PN_CU_THREADS) {
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}
#define PN_CU_LOOP(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)blockDim.x * gridDim.x)

/* The dynamic shared memory's first 128-byte boundary (p: the PN_SHARED_DYN array). By pointer
 * arithmetic, not through an integer: a pointer rebuilt from an integer has lost its state space,
 * so every access through it compiles to a generic LD / ST with its own address check, where
 * one derived from the array stays LDS / STS. */
__device__ static inline unsigned char *pn_cu_align128(unsigned char *p) {
    return p + ((128u - (unsigned)((uintptr_t)p & 127u)) & 127u);
}

/* Asynchronous 16-, 8- or 4-byte copies, global → shared (PTX cp.async, sm_80+), for tiles loaded while
 * the previous one is computed on (double buffering): issue the copies, commit them as a group,
 * and before reading the destinations wait until at most `pending` of this thread's newest groups
 * are in flight — then a barrier, since the other threads read what this one copied. Both
 * addresses aligned to the size. The interpreter lands each copy at its issue or at the wait,
 * chosen by the schedule, so a missing wait or barrier shows there (emu.h). */
#ifdef PN_CUDA_EMU
__device__ static inline void pn_cu_cp_async16(void *dst, const void *src, const char *file = __builtin_FILE(),
                                               int line = __builtin_LINE()) {
    pn_emu_cp_async(dst, src, 16, file, line);
}
__device__ static inline void pn_cu_cp_async8(void *dst, const void *src, const char *file = __builtin_FILE(),
                                              int line = __builtin_LINE()) {
    pn_emu_cp_async(dst, src, 8, file, line);
}
__device__ static inline void pn_cu_cp_async4(void *dst, const void *src, const char *file = __builtin_FILE(),
                                              int line = __builtin_LINE()) {
    pn_emu_cp_async(dst, src, 4, file, line);
}
__device__ static inline void pn_cu_cp_async_commit() { pn_emu_cp_async_commit(); }
template <int pending> __device__ static inline void pn_cu_cp_async_wait() { pn_emu_cp_async_wait(pending); }
#else
__device__ static inline void pn_cu_cp_async16(void *dst, const void *src) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src) : "memory");
}
/* 8 bytes (one double; .ca: .cg takes 16 only), both addresses 8-byte aligned */
__device__ static inline void pn_cu_cp_async8(void *dst, const void *src) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(s), "l"(src) : "memory");
}
/* 4 bytes (a float or an int), both addresses 4-byte aligned */
__device__ static inline void pn_cu_cp_async4(void *dst, const void *src) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(src) : "memory");
}
__device__ static inline void pn_cu_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int pending> __device__ static inline void pn_cu_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory");
}
#endif

/* max(a, b), NaN if either is NaN (PTX max.NaN.f32, sm_80 on; fmaxf drops a NaN): a running max
 * that carries a NaN score to the row's flag with no separate test per element */
#ifdef PN_CUDA_EMU
__device__ static inline float pn_cu_fmax_nan(float a, float b) { return a != a || b != b ? NAN : fmaxf(a, b); }
#else
__device__ static inline float pn_cu_fmax_nan(float a, float b) {
    float y;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(y) : "f"(a), "f"(b));
    return y;
}
#endif

/* 2^x on the special function unit (PTX ex2.approx.ftz.f32: a few ulp; a result below FLT_MIN is
 * +0, −inf gives +0, NaN stays NaN), and e^x = 2^(x·log₂e) on it. For the softmax of the
 * tensor-core kernels, whose operands are rounded to bf16 / f16 before the scores exist:
 * fastmath.h's polynomial, which the CPU and the f32 kernels use, is ~20 instructions an element
 * where this is one or two. The interpreter: libm's exp2f with the same flush. */
#define PN_LOG2E_F 1.44269504088896341f
#ifdef PN_CUDA_EMU
__device__ static inline float pn_cu_exp2_sfu(float x) {
    const float y = exp2f(x);
    return y < 1.17549435e-38f ? 0.0f : y; /* ftz (NaN compares false and stays) */
}
#else
__device__ static inline float pn_cu_exp2_sfu(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
#endif
__device__ static inline float pn_cu_exp_sfu(float x) { return pn_cu_exp2_sfu(x * PN_LOG2E_F); }
/* 1/x on the special function unit (PTX rcp.approx.ftz.f32: about 1 ulp, subnormals flushed; ±inf
 * gives ±0, NaN stays NaN), for the same kernels' sigmoid: an IEEE division is a Newton step and a
 * slow-path call per element. The interpreter: the division, with the same flush. */
#ifdef PN_CUDA_EMU
__device__ static inline float pn_cu_rcp_sfu(float x) {
    const float y = 1.0f / (fabsf(x) < 1.17549435e-38f ? copysignf(0.0f, x) : x);
    return fabsf(y) < 1.17549435e-38f ? copysignf(0.0f, y) : y;
}
#else
__device__ static inline float pn_cu_rcp_sfu(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
#endif
/* σ(x) = 1 / (1 + e^−x) on the SFU: x = −inf gives 0, +inf 1, NaN NaN */
__device__ static inline float pn_cu_sigm_sfu(float x) { return pn_cu_rcp_sfu(1.0f + pn_cu_exp_sfu(-x)); }

/* ---- strided element access (device) ----
 * A tensor's view as kernels see it: element pointer, dtype, and its strides over an iteration
 * shape (0 where broadcast). Passed by value. */
typedef struct pn_cu_shape {
    int nd;
    int64_t size[PN_MAX_DIMS];
} pn_cu_shape;
typedef struct pn_cu_arg {
    char *p; /* element 0 */
    int dt;
    int64_t stride[PN_MAX_DIMS]; /* over the iteration shape, in elements */
} pn_cu_arg;

/* the iteration shape of t, and t viewed over shape (nd, size) with broadcast strides */
pn_cu_shape pn_cu_shape_of(int nd, const int64_t *size);
pn_cu_arg pn_cu_arg_of(const pn_tensor *t, const pn_cu_shape &sh);

/* offset (elements) of linear index i of the iteration shape in a */
__host__ __device__ static inline int64_t pn_cu_off(const pn_cu_shape &sh, const pn_cu_arg &a, int64_t i) {
    int64_t off = 0;
    for (int d = sh.nd - 1; d >= 0; d--) {
        int64_t s = sh.size[d], q = i / s;
        off += (i - q * s) * a.stride[d];
        i = q;
    }
    return off;
}

/* Run body with `typedef <C type of dt> T;` for the float dtypes (f32, f64): the fast paths. */
#define PN_CU_FLOAT_SWITCH(dt, T, ...)         \
    do {                                       \
        if ((dt) == PN_F32) {                  \
            typedef float T;                   \
            __VA_ARGS__;                       \
        } else {                               \
            typedef double T;                  \
            __VA_ARGS__;                       \
        }                                      \
    } while (0)

#endif /* PN_CUDA_CUH */

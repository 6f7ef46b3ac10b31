/* emu.h — penumbra's CUDA kernel interpreter: the CUDA language and runtime subset that
 * core/cuda/ uses, run on the CPU (DESIGN §8). Included by core/cuda/cuda.cuh instead of
 * <cuda_runtime.h> when the build has PN_CUDA_EMU; every .cu is then plain C++17.
 *
 * How it runs. Device memory is host memory from a registry (cudaMalloc). Launches, async
 * copies and memsets are queued on their stream and run only at a synchronisation point
 * (strict: a host read without one sees the 0xFF "NaN" fill). Blocks run one after another
 * on the calling OS thread; a block's threads are fibers (emu_sched.cc). A thread runs until
 * it blocks at __syncthreads, __syncwarp or a warp primitive, or exits; the order in which
 * the runnable threads are resumed between those points is the schedule (PN_CUDA_EMU_SCHED
 * = fwd | rev | rand:SEED, or pn_emu_set_schedule). Running specs under several schedules is
 * what turns a missing barrier into a visible wrong answer. Under rand a round also leaves out
 * whole warps, each with the probability of its pace (0, ¼, ½ or ¾, drawn per block and launch),
 * so warps drift apart between barriers by many warp operations, as on a GPU; under fwd and rev
 * every warp advances one warp operation per round.
 *
 * What it catches (reported as cudaErrorLaunchFailure at the next sync, text in
 * pn_emu_detail()): a missing barrier, when some schedule changes the answer or shows the
 * NaN fill; reads of uninitialised device or shared memory (NaN fill); __syncthreads at
 * different call sites (divergent barrier); deadlock (threads waiting for each other);
 * warp primitives whose mask names an exited lane, lanes at different warp operations, or
 * not the calling lane; writes just past a shared array (canary); launch configurations
 * the driver rejects; host pointers passed as kernel arguments or to cudaMemcpy/cuBLAS;
 * copies that run past an allocation; use of results before the stream that writes them
 * was synchronised (event/stream ordering bugs). Tensor cores (nvcuda::wmma, mma.h, with
 * __half / __nv_bfloat16 from half.h): load/store/mma_sync are warp rendezvous, so a lane that
 * exited or waits at another call, or a partial warp, is reported; so are an ldm that is not a
 * multiple of 16 bytes, a tile pointer not 32-byte aligned, a tile outside one device
 * allocation or shared array, and an mma whose A/B copies of one element disagree. The
 * fragment map (which element each lane's x[i] holds) is drawn per launch from the schedule
 * (natural under fwd, another fixed one under rev, random under rand:SEED), so code that
 * assumes a map gets a wrong answer under some schedule. Built with -fsanitize=address, ASan also
 * sees out-of-bounds device memory (each cudaMalloc is its own heap block) and shared
 * arrays (each its own heap block).
 *
 * What it cannot see: timing, occupancy, register pressure, coalescing, bank conflicts,
 * the hardware memory model beyond barriers (races between blocks, missing
 * __threadfence, volatile tricks: blocks never run concurrently, and a thread's plain
 * stores are visible at once to every later-running thread), races among threads that no
 * schedule here exposes (between two sync points each thread runs to its next one
 * uninterrupted), out-of-bounds global accesses without ASan, and a stack overflow of a
 * fiber (64 KiB default, env PN_CUDA_EMU_STACK in KiB) which hits the guard page and
 * crashes instead of being reported; the real hardware's fragment map (code written against it
 * fails here, as it should) and its mma rounding (here exact products summed in f32 in k
 * order); where nvcc places a shared array (every shared array here starts 32-byte aligned,
 * so the wmma alignment check judges only the offset inside it; under nvcc a PN_SHARED array
 * is aligned only to its element type). Lanes of a partial last warp that do not exist are
 * ignored in masks; a shuffle that reads a lane outside its mask gets the 0xFF pattern.
 */
#ifndef PN_CUDA_EMU_H
#define PN_CUDA_EMU_H

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

/* ---- language: qualifiers ----------------------------------------------------------- */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#ifndef __restrict__
#define __restrict__ __restrict
#endif
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __constant__ static

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{x, y, z}; }
};

/* The current fiber's builtins (set by the scheduler before it resumes a thread). */
struct pn_emu_builtins {
    uint3 tid, bid, bdim, gdim;
};
extern thread_local pn_emu_builtins pn_emu_bi;
#define threadIdx (static_cast<const uint3 &>(pn_emu_bi.tid))
#define blockIdx (static_cast<const uint3 &>(pn_emu_bi.bid))
#define blockDim (static_cast<const uint3 &>(pn_emu_bi.bdim))
#define gridDim (static_cast<const uint3 &>(pn_emu_bi.gdim))
static constexpr int warpSize = 32;

/* ---- barriers and warp primitives (rendezvous of fibers, emu.cc) ----------------------- */
enum { PN_EMU_SYNC_PLAIN, PN_EMU_SYNC_COUNT, PN_EMU_SYNC_AND, PN_EMU_SYNC_OR };
int pn_emu_syncthreads(int kind, int pred, const char *file, int line);
#define __syncthreads() ((void)pn_emu_syncthreads(PN_EMU_SYNC_PLAIN, 0, __FILE__, __LINE__))
#define __syncthreads_count(p) pn_emu_syncthreads(PN_EMU_SYNC_COUNT, !!(p), __FILE__, __LINE__)
#define __syncthreads_and(p) pn_emu_syncthreads(PN_EMU_SYNC_AND, !!(p), __FILE__, __LINE__)
#define __syncthreads_or(p) pn_emu_syncthreads(PN_EMU_SYNC_OR, !!(p), __FILE__, __LINE__)

enum pn_emu_warp_op {
    PN_EMU_SYNCWARP, PN_EMU_SHFL, PN_EMU_SHFL_XOR, PN_EMU_SHFL_DOWN, PN_EMU_SHFL_UP, PN_EMU_BALLOT,
    PN_EMU_WMMA_LOAD, PN_EMU_WMMA_STORE, PN_EMU_WMMA_MMA, /* value: a pn_emu_wmma::call * (mma.h) */
    PN_EMU_MMA_16816, /* PTX mma.sync m16n8k16 (core/cuda/mma_ptx.cuh), value: a call * too */
    PN_EMU_LDMATRIX,  /* PTX ldmatrix m8n8 .b16 (mma_ptx.cuh), value: a call * too */
    PN_EMU_DMMA_884   /* PTX mma.sync m8n8k4 .f64 (mma_ptx.cuh), value: a call * too */
};
/* Deposit value, wait for the lanes of mask, return the result for this lane. */
uint64_t pn_emu_warp(int op, unsigned mask, uint64_t value, int arg, int width, const char *file, int line);
unsigned pn_emu_activemask(void);

inline void __syncwarp(unsigned mask = 0xffffffffu, const char *f = __builtin_FILE(), int l = __builtin_LINE()) {
    pn_emu_warp(PN_EMU_SYNCWARP, mask, 0, 0, 32, f, l);
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

namespace pn_emu_impl {
template <class T> inline T shfl(int op, unsigned mask, T v, int arg, int width, const char *f, int l) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "warp shuffle of an unsupported type");
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    bits = pn_emu_warp(op, mask, bits, arg, width, f, l);
    T r;
    std::memcpy(&r, &bits, sizeof(T));
    return r;
}
} // namespace pn_emu_impl

template <class T>
inline T __shfl_sync(unsigned mask, T v, int srcLane, int width = 32, const char *f = __builtin_FILE(),
                     int l = __builtin_LINE()) {
    return pn_emu_impl::shfl(PN_EMU_SHFL, mask, v, srcLane, width, f, l);
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int laneMask, int width = 32, const char *f = __builtin_FILE(),
                         int l = __builtin_LINE()) {
    return pn_emu_impl::shfl(PN_EMU_SHFL_XOR, mask, v, laneMask, width, f, l);
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32, const char *f = __builtin_FILE(),
                          int l = __builtin_LINE()) {
    return pn_emu_impl::shfl(PN_EMU_SHFL_DOWN, mask, v, (int)delta, width, f, l);
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32, const char *f = __builtin_FILE(),
                        int l = __builtin_LINE()) {
    return pn_emu_impl::shfl(PN_EMU_SHFL_UP, mask, v, (int)delta, width, f, l);
}
inline unsigned __ballot_sync(unsigned mask, int pred, const char *f = __builtin_FILE(), int l = __builtin_LINE()) {
    return (unsigned)pn_emu_warp(PN_EMU_BALLOT, mask, pred != 0, 0, 32, f, l);
}
inline int __any_sync(unsigned mask, int pred, const char *f = __builtin_FILE(), int l = __builtin_LINE()) {
    return __ballot_sync(mask, pred, f, l) != 0;
}
inline int __all_sync(unsigned mask, int pred, const char *f = __builtin_FILE(), int l = __builtin_LINE()) {
    return (__ballot_sync(mask, pred, f, l) & mask) == (mask & pn_emu_activemask());
}
inline unsigned __activemask() { return pn_emu_activemask(); }

/* ---- shared memory ------------------------------------------------------------------ */
/* Per block and call site: every thread of the block gets the same (0xFF-filled) array. */
void *pn_emu_shared(size_t bytes, size_t align, const char *name, const char *file, int line);
/* The block's dynamic shared memory (exactly the launch's dyn_shmem bytes). */
void *pn_emu_dyn_shared(void);

/* ---- asynchronous copies, global → shared (PTX cp.async; cuda.cuh's pn_cu_cp_async*) ----
 * A thread issues copies of n = 4, 8 or 16 bytes (n-aligned), commits them as a group, and waits until at most `pending` of
 * its groups are in flight. A copy may land anywhere between its issue and that wait: here it
 * lands at the wait under the fwd schedule, at the issue under rev, and at one of the two drawn
 * per copy under rand:SEED. So a read before the wait (or before the barrier that follows
 * everyone's wait) sees the 0xFF fill or an older tile under fwd, and a refill of a buffer that
 * other threads may still be reading (no barrier between their reads and the issue) shows under
 * rev. A misaligned copy, a destination outside shared memory or a source outside device memory
 * fails the launch. Copies never waited for are dropped when the thread exits. */
void pn_emu_cp_async(void *dst, const void *src, int n, const char *file, int line);
void pn_emu_cp_async_commit(void);
void pn_emu_cp_async_wait(int pending);

/* ---- atomics (real atomics; float/double through CAS loops) --------------------------- */
namespace pn_emu_impl {
template <class T, class F> inline T cas_loop(T *p, F f) {
    using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
    U *q = reinterpret_cast<U *>(p);
    U old = __atomic_load_n(q, __ATOMIC_RELAXED), nw;
    T o;
    do {
        std::memcpy(&o, &old, sizeof o);
        T n = f(o);
        std::memcpy(&nw, &n, sizeof nw);
    } while (!__atomic_compare_exchange_n(q, &old, nw, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
    return o;
}
} // namespace pn_emu_impl
#define PN_EMU_ATOMIC_FETCH(fn, builtin, T) \
    inline T fn(T *p, T v) { return builtin(p, v, __ATOMIC_SEQ_CST); }
PN_EMU_ATOMIC_FETCH(atomicAdd, __atomic_fetch_add, int)
PN_EMU_ATOMIC_FETCH(atomicAdd, __atomic_fetch_add, unsigned)
PN_EMU_ATOMIC_FETCH(atomicAdd, __atomic_fetch_add, unsigned long long)
PN_EMU_ATOMIC_FETCH(atomicSub, __atomic_fetch_sub, int)
PN_EMU_ATOMIC_FETCH(atomicSub, __atomic_fetch_sub, unsigned)
PN_EMU_ATOMIC_FETCH(atomicAnd, __atomic_fetch_and, int)
PN_EMU_ATOMIC_FETCH(atomicAnd, __atomic_fetch_and, unsigned)
PN_EMU_ATOMIC_FETCH(atomicAnd, __atomic_fetch_and, unsigned long long)
PN_EMU_ATOMIC_FETCH(atomicOr, __atomic_fetch_or, int)
PN_EMU_ATOMIC_FETCH(atomicOr, __atomic_fetch_or, unsigned)
PN_EMU_ATOMIC_FETCH(atomicOr, __atomic_fetch_or, unsigned long long)
PN_EMU_ATOMIC_FETCH(atomicXor, __atomic_fetch_xor, int)
PN_EMU_ATOMIC_FETCH(atomicXor, __atomic_fetch_xor, unsigned)
PN_EMU_ATOMIC_FETCH(atomicXor, __atomic_fetch_xor, unsigned long long)
PN_EMU_ATOMIC_FETCH(atomicExch, __atomic_exchange_n, int)
PN_EMU_ATOMIC_FETCH(atomicExch, __atomic_exchange_n, unsigned)
PN_EMU_ATOMIC_FETCH(atomicExch, __atomic_exchange_n, unsigned long long)
#undef PN_EMU_ATOMIC_FETCH
inline float atomicAdd(float *p, float v) { return pn_emu_impl::cas_loop(p, [v](float o) { return o + v; }); }
inline double atomicAdd(double *p, double v) { return pn_emu_impl::cas_loop(p, [v](double o) { return o + v; }); }
inline float atomicExch(float *p, float v) { return pn_emu_impl::cas_loop(p, [v](float) { return v; }); }
#define PN_EMU_ATOMIC_MINMAX(T)                                                                 \
    inline T atomicMax(T *p, T v) { return pn_emu_impl::cas_loop(p, [v](T o) { return o < v ? v : o; }); } \
    inline T atomicMin(T *p, T v) { return pn_emu_impl::cas_loop(p, [v](T o) { return v < o ? v : o; }); }
PN_EMU_ATOMIC_MINMAX(int)
PN_EMU_ATOMIC_MINMAX(unsigned)
PN_EMU_ATOMIC_MINMAX(long long)
PN_EMU_ATOMIC_MINMAX(unsigned long long)
#undef PN_EMU_ATOMIC_MINMAX
template <class T> inline T pn_emu_atomic_cas(T *p, T compare, T val) {
    __atomic_compare_exchange_n(p, &compare, val, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return compare; /* the old value either way */
}
inline int atomicCAS(int *p, int c, int v) { return pn_emu_atomic_cas(p, c, v); }
inline unsigned atomicCAS(unsigned *p, unsigned c, unsigned v) { return pn_emu_atomic_cas(p, c, v); }
inline unsigned long long atomicCAS(unsigned long long *p, unsigned long long c, unsigned long long v) {
    return pn_emu_atomic_cas(p, c, v);
}

/* ---- intrinsics ------------------------------------------------------------------- */
inline int __float_as_int(float x) { int r; std::memcpy(&r, &x, 4); return r; }
inline float __int_as_float(int x) { float r; std::memcpy(&r, &x, 4); return r; }
inline unsigned __float_as_uint(float x) { unsigned r; std::memcpy(&r, &x, 4); return r; }
inline float __uint_as_float(unsigned x) { float r; std::memcpy(&r, &x, 4); return r; }
inline long long __double_as_longlong(double x) { long long r; std::memcpy(&r, &x, 8); return r; }
inline double __longlong_as_double(long long x) { double r; std::memcpy(&r, &x, 8); return r; }
template <class T> inline T __ldg(const T *p) { return *p; }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
inline int __float2int_rz(float x) { return (int)x; }
inline float __int2float_rn(int x) { return (float)x; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __saturatef(float x) { return x != x ? 0.0f : x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}

/* min/max as CUDA has them in the global namespace. Same-type overloads are non-templates
 * (they beat std::min/std::max under `using namespace std`); mixed types go through the
 * template (int with unsigned → unsigned, float with double → double, as CUDA does). */
#define PN_EMU_MINMAX(T)                                   \
    inline T min(T a, T b) { return b < a ? b : a; }       \
    inline T max(T a, T b) { return a < b ? b : a; }
PN_EMU_MINMAX(int)
PN_EMU_MINMAX(unsigned)
PN_EMU_MINMAX(long)
PN_EMU_MINMAX(unsigned long)
PN_EMU_MINMAX(long long)
PN_EMU_MINMAX(unsigned long long)
#undef PN_EMU_MINMAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
template <class A, class B, class = std::enable_if_t<std::is_arithmetic<A>::value && std::is_arithmetic<B>::value>>
inline std::common_type_t<A, B> min(A a, B b) {
    return min((std::common_type_t<A, B>)a, (std::common_type_t<A, B>)b);
}
template <class A, class B, class = std::enable_if_t<std::is_arithmetic<A>::value && std::is_arithmetic<B>::value>>
inline std::common_type_t<A, B> max(A a, B b) {
    return max((std::common_type_t<A, B>)a, (std::common_type_t<A, B>)b);
}

/* ---- runtime API ------------------------------------------------------------------- */
enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorMisalignedAddress = 716,
    cudaErrorLaunchFailure = 719,
    cudaErrorNotSupported = 801,
    cudaErrorUnknown = 999
};
typedef cudaError_t cudaError;
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};
enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
    cudaFuncAttributePreferredSharedMemoryCarveout = 9
};
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem, sharedMemPerBlock;
    int regsPerBlock, warpSize;
    size_t memPitch;
    int maxThreadsPerBlock, maxThreadsDim[3], maxGridSize[3];
    size_t totalConstMem;
    int major, minor;
    size_t textureAlignment;
    int multiProcessorCount, integrated, canMapHostMemory, concurrentKernels, ECCEnabled;
    int pciBusID, pciDeviceID, pciDomainID, asyncEngineCount, unifiedAddressing;
    int memoryBusWidth, l2CacheSize, persistingL2CacheMaxSize, maxThreadsPerMultiProcessor;
    size_t sharedMemPerMultiprocessor;
    int regsPerMultiprocessor, managedMemory, isMultiGpuBoard, cooperativeLaunch;
    size_t sharedMemPerBlockOptin, reservedSharedMemPerBlock;
    int maxBlocksPerMultiProcessor;
};

const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaGetDevice(int *dev);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaMalloc(void **p, size_t bytes);
template <class T> inline cudaError_t cudaMalloc(T **p, size_t bytes) { return cudaMalloc((void **)p, bytes); }
cudaError_t cudaFree(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s = 0);
cudaError_t cudaMemset(void *p, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s = 0);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s); /* runs the queue, as cudaStreamSynchronize */
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end); /* always 0: no timing */
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t pn_emu_func_set_attribute(const void *func, cudaFuncAttribute attr, int value);
template <class F> inline cudaError_t cudaFuncSetAttribute(F *func, cudaFuncAttribute attr, int value) {
    return pn_emu_func_set_attribute(reinterpret_cast<const void *>(func), attr, value);
}

extern "C" {
const char *pn_emu_detail(void);                   /* last error message (thread-local) */
int pn_emu_set_schedule(const char *spec);         /* fwd | rev | rand:SEED; NULL/"" = fwd; 0 ok, -1 bad */
const char *pn_emu_schedule(void);                 /* the current spec */
long long pn_emu_malloc_calls(void);               /* cumulative cudaMalloc calls */
long long pn_emu_launches(void);                   /* cumulative queued launches */
/* the device memory the interpreter reports and lets cudaMalloc hand out, in bytes (0: the
 * default 80 GiB; < 0: unchanged); returns the previous size and, in *used, what cudaMalloc has
 * handed out — a small size makes out-of-memory paths testable */
long long pn_emu_set_device_memory(long long bytes, long long *used);
}

/* ---- launches and other queued work ---------------------------------------------- */
/* Is [p, p+bytes) inside one live cudaMalloc allocation (p == base+size allowed when bytes 0)? */
bool pn_emu_is_device(const void *p, size_t bytes);
/* Queue fn on stream s (0 = default); it runs at the next synchronisation covering s. */
cudaError_t pn_emu_enqueue(cudaStream_t s, std::function<void()> fn);
/* Set the error of the work item now running (a launch failure at the next sync). */
void pn_emu_fail(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Set pn_emu_detail only (e.g. the reason for a cuBLAS status). */
void pn_emu_set_detail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Return e with pn_emu_detail set to the message, and remember it for cudaGetLastError. */
cudaError_t pn_emu_error(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Driver-like validation of grid, block and dynamic shared memory. */
cudaError_t pn_emu_check_launch(const char *name, const void *func, dim3 grid, dim3 block, size_t dyn_shmem,
                                cudaStream_t s);
/* Queue body (one kernel thread: calls the kernel with its arguments) for every thread. */
cudaError_t pn_emu_enqueue_launch(const char *name, dim3 grid, dim3 block, size_t dyn_shmem, cudaStream_t s,
                                  std::function<void()> body);

namespace pn_emu_impl {
template <class Tup, size_t... I> inline cudaError_t check_args(const char *name, const Tup &t, std::index_sequence<I...>) {
    cudaError_t e = cudaSuccess;
    auto one = [&](size_t i, auto v) {
        using V = decltype(v);
        if constexpr (std::is_pointer<V>::value && !std::is_function<std::remove_pointer_t<V>>::value) {
            if (e == cudaSuccess && v && !pn_emu_is_device((const void *)v, 0))
                e = pn_emu_error(cudaErrorInvalidValue, "kernel '%s': argument %zu (%p) is not device memory (a host pointer?)",
                                 name, i + 1, (const void *)v);
        }
    };
    (one(I, std::get<I>(t)), ...);
    return e;
}
} // namespace pn_emu_impl

template <class... P, class... A>
cudaError_t pn_emu_launch(const char *name, void (*kernel)(P...), dim3 grid, dim3 block, size_t dyn_shmem,
                          cudaStream_t stream, A &&...args) {
    static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong number of arguments");
    cudaError_t e = pn_emu_check_launch(name, reinterpret_cast<const void *>(kernel), grid, block, dyn_shmem, stream);
    if (e != cudaSuccess) return e;
    /* the arguments converted to the parameter types, captured by value */
    auto args_p = std::make_shared<std::tuple<std::decay_t<P>...>>(std::forward<A>(args)...);
    e = pn_emu_impl::check_args(name, *args_p, std::index_sequence_for<P...>{});
    if (e != cudaSuccess) return e;
    return pn_emu_enqueue_launch(name, grid, block, dyn_shmem, stream,
                                 [kernel, args_p]() { std::apply(kernel, *args_p); });
}

#endif /* PN_CUDA_EMU_H */

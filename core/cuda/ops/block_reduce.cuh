/* block_reduce.cuh — a block's threads combining one value each into one result that every
 * thread gets (reduce.cu, softmax.cu). Deterministic: the combination order depends only on
 * the block size (a butterfly of warp shuffles, then the warps' results in warp order), never
 * on timing, so a float sum comes out bit-identical from run to run.
 *
 * The block size must be a multiple of 32 and at most 256 (pn_cu_line_threads gives one);
 * every thread of the block must call, the same number of times (the barriers inside). */
#ifndef PN_CUDA_BLOCK_REDUCE_CUH
#define PN_CUDA_BLOCK_REDUCE_CUH

#include "../cuda.cuh"

enum { PN_CU_MAX_WARPS = 8 }; /* 256 threads */

/* Threads for a block that walks n elements of one line: a power of two in [32, 256]. */
static inline int pn_cu_line_threads(int64_t n) {
    int t = 32;
    while (t < n && t < 256) t *= 2;
    return t;
}

/* warp shuffles of the value types the reductions combine */
__device__ __forceinline__ double pn_cu_shfl_xor(double v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
__device__ __forceinline__ float pn_cu_shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
__device__ __forceinline__ long long pn_cu_shfl_xor(long long v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }

/* the sum / max / or of v over the L neighbouring lanes of a group (L a power of two ≤ 32, every
 * lane of the warp calling): butterflies, so every lane ends with the same, order-independent
 * value (a + b = b + a bit for bit) */
template <int L, typename T> __device__ T pn_cu_lanes_sum(T v) {
    for (int o = 1; o < L; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
template <int L, typename T> __device__ T pn_cu_lanes_max(T v) {
    for (int o = 1; o < L; o <<= 1) {
        const T w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}
template <int L> __device__ int pn_cu_lanes_or(int v) {
    for (int o = 1; o < L; o <<= 1) v |= __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Every thread's v combined by op (a functor: V op(V u, V v), u the lower-numbered part);
 * sh: PN_CU_MAX_WARPS values of shared memory, free again when this returns. */
template <class V, class Op> __device__ V pn_cu_block_reduce(V v, V *sh, const Op &op) {
    for (int m = 16; m > 0; m >>= 1) {
        V o = pn_cu_shfl_xor(v, m);
        v = ((int)threadIdx.x & m) ? op(o, v) : op(v, o); /* keep lower lanes on the left */
    }
    int w = (int)threadIdx.x >> 5, nw = (int)blockDim.x >> 5;
    if ((threadIdx.x & 31) == 0) sh[w] = v;
    __syncthreads();
    V r = sh[0];
    for (int i = 1; i < nw; i++) r = op(r, sh[i]);
    __syncthreads(); /* sh is rewritten by the next reduction */
    return r;
}

/* the usual combiners */
struct pn_cu_sum_op {
    template <class V> __device__ V operator()(V a, V b) const { return a + b; }
};
/* max ignoring NaN (a NaN element poisons the sum that follows instead), as the CPU's lines */
struct pn_cu_max_op {
    template <class V> __device__ V operator()(V a, V b) const { return b > a ? b : a; }
};

#endif /* PN_CUDA_BLOCK_REDUCE_CUH */

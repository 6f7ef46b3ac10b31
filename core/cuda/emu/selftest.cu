/* selftest.cu — planted bugs for the kernel interpreter (emu build only). Each buggy case has
 * a correct control next to it, so a spec can show that the detection is real:
 *
 *   missing_sync / missing_sync_fixed     reverse through shared memory without / with the barrier
 *   shared_overflow / shared_ok           one element past a PN_SHARED array / in bounds
 *   divergent_barrier                     __syncthreads at two call sites
 *   host_pointer                          a malloc'd pointer as a kernel argument
 *   stale_read / stale_read_fixed         copy on stream B of what stream A writes, without / with an event
 *   shuffle_reduce                        warp-shuffle sums of 0..31 and 32..63 (496, 1520)
 *   shuffle_missing_lane                  lane 31 exits, the others shuffle with the full mask
 *   atomic_sum                            64 blocks × 256 threads atomicAdd into int, float, u64 counters
 *   cp_async / cp_async_no_wait /          tiles through two shared buffers by cp.async, each thread
 *     cp_async_no_barrier                  summing a word another thread copied: correct / without
 *                                          the wait before the barrier / refilling a buffer with no
 *                                          barrier after its last readers
 *   cp_async_misaligned / cp_async_to_global   a copy 4 bytes off alignment / into device memory
 *   cp_async8 / cp_async8_misaligned       the tiles by 8-byte copies / one 4 bytes off
 *   cp_async4 / cp_async4_misaligned       the tiles by 4-byte copies / one 2 bytes off
 *   half_convert, wmma_*                  the 16-bit types and nvcuda::wmma: selftest_wmma.cu
 *
 * pn_cuda_emu_selftest(name, out, n) runs one case, writes up to n results to out and returns
 * PN_OK, or PN_ERR_DEVICE with the interpreter's message.
 */
#include "selftest.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using namespace pn_selftest;

const int N = 64; /* threads of the one-block cases: two warps */

/* ---- kernels -------------------------------------------------------------------------- */
__global__ void reverse_kernel(float *out, const float *in, int with_sync) {
    PN_SHARED(float, tile, N);
    int t = threadIdx.x;
    tile[t] = in[t];
    if (with_sync) __syncthreads(); /* the bug: without it a thread may read before the write */
    out[t] = tile[N - 1 - t];
}

__global__ void shared_write_kernel(float *out, int past_end) {
    PN_SHARED(float, tile, N);
    int t = threadIdx.x;
    tile[t] = (float)t;
    if (past_end && t == N - 1) tile[N] = -1.0f; /* the bug: one element past the end */
    __syncthreads();
    out[t] = tile[t];
}

__global__ void divergent_kernel(float *out) {
    int t = threadIdx.x;
    if (t < N / 2) {
        __syncthreads(); /* the bug: two different barriers */
    } else {
        __syncthreads();
    }
    out[t] = (float)t;
}

__global__ void fill_kernel(float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 2.0f * (float)i;
}

__global__ void shuffle_kernel(float *out, int drop_lane31) {
    int t = threadIdx.x, lane = t % warpSize;
    if (drop_lane31 && lane == 31) return; /* the bug: the full mask names an exited lane */
    float v = (float)t;
    for (int off = warpSize / 2; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    if (lane == 0) out[t / warpSize] = v;
}

__global__ void atomic_kernel(int *count, float *fsum, unsigned long long *isum) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    atomicAdd(count, 1);
    atomicAdd(fsum, 1.0f);
    atomicAdd(isum, (unsigned long long)i);
}

/* Tiles of 4N floats (each thread copies one 16-byte word) through two shared buffers by
 * cp.async, the next tile's copies in flight while the current one is read; thread t adds word
 * N − 1 − t's second float of every tile (a word another thread copied). bug 1: no wait before
 * the barrier; bug 2: no barrier between the last reads of a buffer and its refill; 6: no bug, each
 * word as two 8-byte copies; 8: no bug, as four 4-byte copies. */
enum { CP_TILES = 5 };
__global__ void cp_async_kernel(float *out, const float *in, int bug) {
    PN_SHARED(float, buf, 2 * 4 * N + 1);
    const int t = threadIdx.x;
    float acc = 0;
    auto copy = [&](float *d, const float *s) {
        if (bug == 8) {
            for (int k = 0; k < 4; k++) pn_cu_cp_async4(d + k, s + k);
            return;
        }
        if (bug != 6) return pn_cu_cp_async16(d, s);
        pn_cu_cp_async8(d, s);
        pn_cu_cp_async8(d + 2, s + 2);
    };
    if (bug == 3) pn_cu_cp_async16(buf + 1 + 4 * t, in + 4 * t); /* 4 bytes off */
    if (bug == 4) pn_cu_cp_async16(out + 4 * (t % (N / 4)), in + 4 * t); /* a device destination */
    if (bug == 5) pn_cu_cp_async8(buf + 1 + 4 * t, in + 4 * t); /* 4 bytes off an 8-byte copy */
    if (bug == 7) pn_cu_cp_async4((char *)(buf + 4 * t) + 2, in + 4 * t); /* 2 bytes off a 4-byte copy */
    copy(buf + 4 * t, in + 4 * t);
    pn_cu_cp_async_commit();
    for (int k = 0; k < CP_TILES; k++) {
        float *cur = buf + (k & 1) * 4 * N, *next = buf + (~k & 1) * 4 * N;
        if (bug != 2) __syncthreads(); /* the readers of `next` (tile k − 1) are done */
        if (k + 1 < CP_TILES) copy(next + 4 * t, in + (k + 1) * 4 * N + 4 * t);
        pn_cu_cp_async_commit();
        if (bug != 1) pn_cu_cp_async_wait<1>();
        __syncthreads();
        acc += cur[4 * (N - 1 - t) + 1];
    }
    out[t] = acc;
}

/* ---- cases --------------------------------------------------------------------------------- */
pn_status reverse_case(double *out, int64_t n, int with_sync) {
    Dev in, res;
    CK(cudaMalloc(&in.p, sizeof(float) * N));
    CK(cudaMalloc(&res.p, sizeof(float) * N));
    float h[N];
    for (int i = 0; i < N; i++) h[i] = (float)i;
    CK(cudaMemcpy(in.p, h, sizeof h, cudaMemcpyHostToDevice));
    CK(PN_LAUNCH(reverse_kernel, 1, N, 0, 0, (float *)res.p, (const float *)in.p, with_sync));
    CK(cudaDeviceSynchronize());
    return copy_out(out, n, (float *)res.p, N);
}

pn_status shared_case(double *out, int64_t n, int past_end) {
    Dev res;
    CK(cudaMalloc(&res.p, sizeof(float) * N));
    CK(PN_LAUNCH(shared_write_kernel, 1, N, 0, 0, (float *)res.p, past_end));
    CK(cudaDeviceSynchronize());
    return copy_out(out, n, (float *)res.p, N);
}

pn_status divergent_case(double *out, int64_t n) {
    Dev res;
    CK(cudaMalloc(&res.p, sizeof(float) * N));
    CK(PN_LAUNCH(divergent_kernel, 1, N, 0, 0, (float *)res.p));
    CK(cudaDeviceSynchronize());
    return copy_out(out, n, (float *)res.p, N);
}

pn_status host_pointer_case(double *out, int64_t n) {
    std::vector<float> host(N);
    CK(PN_LAUNCH(fill_kernel, 1, N, 0, 0, host.data(), N)); /* the bug: host memory */
    CK(cudaDeviceSynchronize());
    for (int i = 0; i < N; i++) put(out, n, i, host[i]);
    return PN_OK;
}

pn_status stale_case(double *out, int64_t n, int with_event) {
    const int len = 256;
    Dev buf;
    cudaStream_t a = nullptr, b = nullptr;
    cudaEvent_t done = nullptr;
    std::vector<float> host(len, 0.0f);
    CK(cudaMalloc(&buf.p, sizeof(float) * len));
    CK(cudaStreamCreate(&a));
    CK(cudaStreamCreate(&b));
    CK(cudaEventCreate(&done));
    cudaError_t e = PN_LAUNCH(fill_kernel, len / 128, 128, 0, a, (float *)buf.p, len);
    if (e == cudaSuccess) e = cudaEventRecord(done, a);
    if (e == cudaSuccess && with_event) e = cudaStreamWaitEvent(b, done, 0); /* the fix */
    if (e == cudaSuccess) e = cudaMemcpyAsync(host.data(), buf.p, sizeof(float) * len, cudaMemcpyDeviceToHost, b);
    if (e == cudaSuccess) e = cudaStreamSynchronize(b); /* the bug: B never waited for A */
    cudaError_t e2 = cudaDeviceSynchronize();            /* let A finish before freeing */
    if (e == cudaSuccess) e = e2;
    cudaEventDestroy(done);
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
    CK(e);
    for (int i = 0; i < len; i++) put(out, n, i, host[i]);
    return PN_OK;
}

pn_status shuffle_case(double *out, int64_t n, int drop_lane31) {
    Dev res;
    CK(cudaMalloc(&res.p, sizeof(float) * 2));
    CK(PN_LAUNCH(shuffle_kernel, 1, N, 0, 0, (float *)res.p, drop_lane31));
    CK(cudaDeviceSynchronize());
    return copy_out(out, n, (float *)res.p, 2);
}

pn_status atomic_case(double *out, int64_t n) {
    Dev count, fsum, isum;
    CK(cudaMalloc(&count.p, sizeof(int)));
    CK(cudaMalloc(&fsum.p, sizeof(float)));
    CK(cudaMalloc(&isum.p, sizeof(unsigned long long)));
    CK(cudaMemset(count.p, 0, sizeof(int)));
    CK(cudaMemset(fsum.p, 0, sizeof(float)));
    CK(cudaMemset(isum.p, 0, sizeof(unsigned long long)));
    CK(PN_LAUNCH(atomic_kernel, 64, 256, 0, 0, (int *)count.p, (float *)fsum.p, (unsigned long long *)isum.p));
    int c = 0;
    float f = 0;
    unsigned long long s = 0;
    CK(cudaMemcpy(&c, count.p, sizeof c, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&f, fsum.p, sizeof f, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&s, isum.p, sizeof s, cudaMemcpyDeviceToHost));
    put(out, n, 0, c);     /* 16384 */
    put(out, n, 1, f);     /* 16384 (exact: integers below 2^24) */
    put(out, n, 2, (double)s); /* 0 + 1 + … + 16383 = 134209536 */
    return PN_OK;
}

pn_status cp_async_case(double *out, int64_t n, int bug) {
    Dev in, res;
    const int len = CP_TILES * 4 * N;
    CK(cudaMalloc(&in.p, sizeof(float) * len));
    CK(cudaMalloc(&res.p, sizeof(float) * N));
    std::vector<float> h(len);
    for (int i = 0; i < len; i++) h[i] = (float)i; /* tile k, float e: 4Nk + e */
    CK(cudaMemcpy(in.p, h.data(), sizeof(float) * len, cudaMemcpyHostToDevice));
    CK(PN_LAUNCH(cp_async_kernel, 1, N, 0, 0, (float *)res.p, (const float *)in.p, bug));
    CK(cudaDeviceSynchronize());
    return copy_out(out, n, (float *)res.p, N);
}

struct Case {
    const char *name;
    pn_status (*run)(double *, int64_t);
};

const Case cases[] = {
    {"missing_sync", [](double *o, int64_t n) { return reverse_case(o, n, 0); }},
    {"missing_sync_fixed", [](double *o, int64_t n) { return reverse_case(o, n, 1); }},
    {"shared_overflow", [](double *o, int64_t n) { return shared_case(o, n, 1); }},
    {"shared_ok", [](double *o, int64_t n) { return shared_case(o, n, 0); }},
    {"divergent_barrier", divergent_case},
    {"host_pointer", host_pointer_case},
    {"stale_read", [](double *o, int64_t n) { return stale_case(o, n, 0); }},
    {"stale_read_fixed", [](double *o, int64_t n) { return stale_case(o, n, 1); }},
    {"shuffle_reduce", [](double *o, int64_t n) { return shuffle_case(o, n, 0); }},
    {"shuffle_missing_lane", [](double *o, int64_t n) { return shuffle_case(o, n, 1); }},
    {"atomic_sum", atomic_case},
    {"cp_async", [](double *o, int64_t n) { return cp_async_case(o, n, 0); }},
    {"cp_async_no_wait", [](double *o, int64_t n) { return cp_async_case(o, n, 1); }},
    {"cp_async_no_barrier", [](double *o, int64_t n) { return cp_async_case(o, n, 2); }},
    {"cp_async_misaligned", [](double *o, int64_t n) { return cp_async_case(o, n, 3); }},
    {"cp_async_to_global", [](double *o, int64_t n) { return cp_async_case(o, n, 4); }},
    {"cp_async8_misaligned", [](double *o, int64_t n) { return cp_async_case(o, n, 5); }},
    {"cp_async8", [](double *o, int64_t n) { return cp_async_case(o, n, 6); }},
    {"cp_async4_misaligned", [](double *o, int64_t n) { return cp_async_case(o, n, 7); }},
    {"cp_async4", [](double *o, int64_t n) { return cp_async_case(o, n, 8); }},
};

} // namespace

extern "C" pn_status pn_cuda_emu_selftest(const char *name, double *out, int64_t n) {
    pn_status st = PN_OK;
    bool found = false;
    for (const Case &c : cases)
        if (name && !strcmp(name, c.name)) {
            st = c.run(out, n);
            found = true;
        }
    if (!found && name) found = run_wmma_case(name, out, n, &st);
    if (found) {
        /* the fill pattern's NaNs (all ones) are not LuaJIT's canonical NaN: hand over NAN */
        for (int64_t i = 0; out && i < n; i++)
            if (out[i] != out[i]) out[i] = NAN;
        return st;
    }
    std::string names;
    for (const Case &c : cases) names += std::string(names.empty() ? "" : ", ") + c.name;
    for (size_t i = 0; wmma_case_name(i); i++) names += std::string(", ") + wmma_case_name(i);
    return pn_error(PN_ERR_ARG, "pn_cuda_emu_selftest: unknown case '%s' (valid: %s)", name ? name : "(null)",
                    names.c_str());
}

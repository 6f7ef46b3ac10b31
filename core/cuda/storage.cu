/* storage.cu — device memory: the caching allocator behind the mem_alloc / mem_free kernels,
 * and the host ↔ device copies (upload / download).
 *
 * cudaMalloc and cudaFree synchronise the device and cost tens of microseconds, and a training
 * step frees and reallocates the same sizes every time. So freed blocks are parked by size
 * class and handed to the next request of that class: in steady state there is no cudaMalloc
 * at all (memory_stats().malloc_calls counts them; the GAT benchmark checks it per epoch).
 * Classes: multiples of 512 B up to 1 MiB, above that multiples of 1/8 of the next power of
 * two (≤ 12.5 % slack). A cudaMalloc that fails empties the cache and tries once more.
 * One stream, so a block freed by the host can be reused by the next kernel queued on it. */
#include "cuda.cuh"

#include <stdio.h>

#include <map>
#include <mutex>
#include <vector>

static std::mutex g_lock;
/* class bytes → parked blocks; never destroyed (the cache is held until exit, and a static
 * destructor would run before LeakSanitizer looks) */
static std::map<size_t, std::vector<void *>> &g_free = *new std::map<size_t, std::vector<void *>>;
static pn_cuda_memory_stats g_stats;

static size_t size_class(size_t n) {
    if (n <= ((size_t)1 << 20)) return n < 512 ? 512 : (n + 511) & ~(size_t)511;
    size_t p2 = (size_t)1 << (64 - __builtin_clzll(n - 1)); /* next power of two */
    size_t step = p2 / 8;
    return (n + step - 1) / step * step;
}

static void release_cached(void) { /* g_lock held */
    for (auto &kv : g_free)
        for (void *p : kv.second) {
            cudaFree(p);
            g_stats.free_calls++;
            g_stats.reserved -= (int64_t)kv.first;
        }
    g_free.clear();
}

pn_status pn_cuda_mem_alloc(size_t nbytes, void **out) {
    size_t c = size_class(nbytes);
    std::lock_guard<std::mutex> guard(g_lock);
    auto it = g_free.find(c);
    if (it != g_free.end() && !it->second.empty()) {
        *out = it->second.back();
        it->second.pop_back();
#ifdef PN_CUDA_EMU
        /* as fresh memory: the NaN pattern, so a kernel reading what nobody wrote shows it */
        cudaMemsetAsync(*out, 0xFF, c, pn_cu_stream());
#endif
    } else {
        cudaError_t e = cudaMalloc(out, c);
        if (e == cudaErrorMemoryAllocation) {
            cudaGetLastError();
            cudaStreamSynchronize(pn_cu_stream());
            release_cached();
            e = cudaMalloc(out, c);
        }
        if (e != cudaSuccess) {
            *out = NULL;
            pn_status st = pn_cu_check("cudaMalloc", e);
            char why[512]; /* pn_last_error's buffer is the one pn_error writes next */
            snprintf(why, sizeof why, "%s", pn_last_error());
            return pn_error(st, "cuda: out of device memory allocating %zu bytes (%lld allocated, %lld reserved; %s)",
                            nbytes, (long long)g_stats.allocated, (long long)g_stats.reserved, why);
        }
        g_stats.malloc_calls++;
        g_stats.reserved += (int64_t)c;
    }
    g_stats.allocated += (int64_t)nbytes;
    g_stats.blocks++;
    if (g_stats.allocated > g_stats.peak) g_stats.peak = g_stats.allocated;
    pn_count_bytes((int64_t)nbytes);
    return PN_OK;
}

pn_status pn_cuda_mem_free(void *p, size_t nbytes) {
    if (!p) return PN_OK;
    std::lock_guard<std::mutex> guard(g_lock);
    g_free[size_class(nbytes)].push_back(p);
    g_stats.allocated -= (int64_t)nbytes;
    g_stats.blocks--;
    pn_count_bytes(-(int64_t)nbytes);
    return PN_OK;
}

pn_status pn_cuda_upload(void *dst, const void *host_src, size_t nbytes) {
    /* queued behind the kernels that may still read dst's previous contents, then waited for:
     * the caller may reuse host_src at once */
    PN_CU_TRY("upload", cudaMemcpyAsync(dst, host_src, nbytes, cudaMemcpyHostToDevice, pn_cu_stream()));
    return pn_cu_check("upload", cudaStreamSynchronize(pn_cu_stream()));
}

pn_status pn_cuda_download(void *host_dst, const void *src, size_t nbytes) {
    PN_CU_TRY("download", cudaMemcpyAsync(host_dst, src, nbytes, cudaMemcpyDeviceToHost, pn_cu_stream()));
    return pn_cu_check("download", cudaStreamSynchronize(pn_cu_stream()));
}

/* ---- penumbra.h ---- */
pn_status pn_cuda_memory_stats_get(pn_cuda_memory_stats *out) {
    std::lock_guard<std::mutex> guard(g_lock);
    *out = g_stats;
    return PN_OK;
}

pn_status pn_cuda_reset_peak(void) {
    std::lock_guard<std::mutex> guard(g_lock);
    g_stats.peak = g_stats.allocated;
    return PN_OK;
}

pn_status pn_cuda_empty_cache(void) {
    if (!pn_cuda_available()) return PN_OK; /* nothing was ever cached */
    PN_CU_TRY("cuda.empty_cache", cudaStreamSynchronize(pn_cu_stream()));
    std::lock_guard<std::mutex> guard(g_lock);
    release_cached();
    return PN_OK;
}

/* ---- scratch sets (cuda.cuh) ---- */
pn_tensor *pn_cu_keep(pn_cu_scratch *s, pn_tensor *t) {
    if (t && s->nt == (int)(sizeof s->t / sizeof s->t[0])) {
        pn_release(t);
        return (pn_tensor *)pn_error_null(PN_ERR_OOM, "%s: too many scratch tensors", s->op ? s->op : "cuda");
    }
    if (t) s->t[s->nt++] = t;
    return t;
}

pn_tensor *pn_cu_scratch_new(pn_cu_scratch *s, int64_t n, int dt, bool zero) {
    int64_t sh[1] = {n > 0 ? n : 1};
    return pn_cu_keep(s, zero ? pn_zeros(1, sh, dt, PN_CUDA) : pn_empty(1, sh, dt, PN_CUDA));
}

void pn_cu_scratch_free(pn_cu_scratch *s) {
    for (int i = 0; i < s->nt; i++) pn_release(s->t[i]);
    s->nt = 0;
}

/* emu.cc — the kernel interpreter's runtime API: device memory registry, streams and events
 * (strict: queued work runs only at a synchronisation), errors, launch validation.
 * The block runner (fibers, barriers, warp ops, shared memory) is emu_sched.cc. */
#include "emu.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <vector>

bool pn_emu_run_grid(const char *name, dim3 grid, dim3 block, size_t dyn_shmem, const std::function<void()> &body);

struct CUstream_st {
    std::deque<std::function<void()>> q;
    long long enq = 0, done = 0; /* items queued / run so far */
    bool dead = false;
};
struct CUevent_st {
    CUstream_st *s = nullptr; /* recorded on; nullptr = never recorded */
    long long seq = 0;        /* complete when s->done >= seq */
};

namespace {

const size_t DEFAULT_MEM = 80ull << 30; /* an H100's */
size_t g_total_mem = DEFAULT_MEM; /* pn_emu_set_device_memory */

std::recursive_mutex g_mu;                 /* one lock over all runtime state */
/* base → bytes; never destroyed, so device memory alive at exit stays reachable for
 * LeakSanitizer (static destructors run before its check) */
std::map<uintptr_t, size_t> &g_allocs = *new std::map<uintptr_t, size_t>;
size_t g_alloc_bytes = 0;
long long g_malloc_calls = 0, g_launches = 0;
CUstream_st g_default;
std::vector<CUstream_st *> g_streams;      /* live created streams, creation order */
std::vector<CUstream_st *> &g_dead = *new std::vector<CUstream_st *>; /* destroyed (see cudaStreamDestroy) */
std::set<CUevent_st *> g_events;
std::map<const void *, int> g_dyn_limit;   /* kernel → cudaFuncAttributeMaxDynamicSharedMemorySize */
cudaError_t g_last = cudaSuccess;          /* for cudaGetLastError */
cudaError_t g_pending = cudaSuccess;       /* failure of queued work, for the next sync */
thread_local char g_detail[1024];

using Lock = std::lock_guard<std::recursive_mutex>;

void set_detail(const char *fmt, va_list ap) { vsnprintf(g_detail, sizeof g_detail, fmt, ap); }

/* the allocation containing p (base <= p < base+size, or p == base), or end() */
std::map<uintptr_t, size_t>::iterator find_alloc(const void *p) {
    uintptr_t u = (uintptr_t)p;
    auto it = g_allocs.upper_bound(u);
    if (it == g_allocs.begin()) return g_allocs.end();
    --it;
    return (u < it->first + it->second || u == it->first) ? it : g_allocs.end();
}

CUstream_st *stream_of(cudaStream_t s) {
    /* 0, cudaStreamLegacy (1) and cudaStreamPerThread (2) are all the default stream here */
    if ((uintptr_t)s <= 2) return &g_default;
    for (CUstream_st *x : g_streams)
        if (x == s) return x;
    return nullptr;
}

/* Run s's queue until `upto` items have run. Items are popped before they run, so an item
 * may itself run other streams (cudaStreamWaitEvent). */
void run_upto(CUstream_st *s, long long upto) {
    while (s->done < upto && !s->q.empty()) {
        std::function<void()> f = std::move(s->q.front());
        s->q.pop_front();
        s->done++;
        f();
    }
}

void run_all() {
    run_upto(&g_default, g_default.enq);
    for (size_t i = 0; i < g_streams.size(); i++) run_upto(g_streams[i], g_streams[i]->enq);
}

/* a synchronising call's result: the failure of queued work, reported once */
cudaError_t take_pending() {
    cudaError_t e = g_pending;
    g_pending = cudaSuccess;
    if (e != cudaSuccess && g_last == e) g_last = cudaSuccess;
    return e;
}

const char *kind_name(cudaMemcpyKind k) {
    switch (k) {
    case cudaMemcpyHostToHost: return "HostToHost";
    case cudaMemcpyHostToDevice: return "HostToDevice";
    case cudaMemcpyDeviceToHost: return "DeviceToHost";
    case cudaMemcpyDeviceToDevice: return "DeviceToDevice";
    case cudaMemcpyDefault: return "Default";
    }
    return "?";
}

/* The driver's checks of one side of a copy: device = must lie in one allocation. */
cudaError_t check_side(const char *api, cudaMemcpyKind k, const char *side, const void *p, size_t n, bool device) {
    if (device && !pn_emu_is_device(p, n))
        return pn_emu_error(cudaErrorInvalidValue, "%s %s: %s %p (%zu bytes) is not inside one device allocation", api,
                            kind_name(k), side, p, n);
    if (!device && find_alloc(p) != g_allocs.end())
        return pn_emu_error(cudaErrorInvalidValue, "%s %s: %s %p is device memory, expected host memory (wrong direction?)",
                            api, kind_name(k), side, p);
    return cudaSuccess;
}

cudaError_t check_copy(const char *api, void *dst, const void *src, size_t n, cudaMemcpyKind k) {
    if (!dst || !src) return pn_emu_error(cudaErrorInvalidValue, "%s: NULL pointer (dst %p, src %p)", api, dst, src);
    bool dd, sd;
    switch (k) {
    case cudaMemcpyHostToHost: dd = false, sd = false; break;
    case cudaMemcpyHostToDevice: dd = true, sd = false; break;
    case cudaMemcpyDeviceToHost: dd = false, sd = true; break;
    case cudaMemcpyDeviceToDevice: dd = true, sd = true; break;
    case cudaMemcpyDefault:
        dd = find_alloc(dst) != g_allocs.end(), sd = find_alloc(src) != g_allocs.end();
        break;
    default: return pn_emu_error(cudaErrorInvalidMemcpyDirection, "%s: bad cudaMemcpyKind %d", api, (int)k);
    }
    cudaError_t e = check_side(api, k, "destination", dst, n, dd);
    return e != cudaSuccess ? e : check_side(api, k, "source", src, n, sd);
}

} // namespace

/* ---- errors --------------------------------------------------------------------------- */
extern "C" const char *pn_emu_detail(void) { return g_detail; }

void pn_emu_set_detail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    set_detail(fmt, ap);
    va_end(ap);
}

cudaError_t pn_emu_error(cudaError_t e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    set_detail(fmt, ap);
    va_end(ap);
    Lock l(g_mu);
    g_last = e;
    return e;
}

void pn_emu_fail(cudaError_t e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    set_detail(fmt, ap);
    va_end(ap);
    Lock l(g_mu);
    if (g_pending == cudaSuccess) g_pending = e;
    g_last = e;
}

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
#define N(x) case x: return #x;
        N(cudaSuccess) N(cudaErrorInvalidValue) N(cudaErrorMemoryAllocation) N(cudaErrorInitializationError)
        N(cudaErrorInvalidConfiguration) N(cudaErrorInvalidDevicePointer) N(cudaErrorInvalidMemcpyDirection)
        N(cudaErrorNoDevice) N(cudaErrorInvalidDevice) N(cudaErrorInvalidResourceHandle) N(cudaErrorNotReady)
        N(cudaErrorIllegalAddress) N(cudaErrorMisalignedAddress) N(cudaErrorLaunchFailure) N(cudaErrorNotSupported) N(cudaErrorUnknown)
#undef N
    }
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorMisalignedAddress: return "misaligned address";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotSupported: return "operation not supported";
    default: return "unknown error";
    }
}

cudaError_t cudaGetLastError(void) {
    Lock l(g_mu);
    cudaError_t e = g_last;
    g_last = cudaSuccess;
    if (e != cudaSuccess && g_pending == e) g_pending = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) {
    Lock l(g_mu);
    return g_last;
}

/* ---- device ----------------------------------------------------------------------------- */
cudaError_t cudaGetDeviceCount(int *n) {
    if (!n) return pn_emu_error(cudaErrorInvalidValue, "cudaGetDeviceCount: NULL");
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int dev) {
    return dev == 0 ? cudaSuccess : pn_emu_error(cudaErrorInvalidDevice, "cudaSetDevice(%d): the interpreter has device 0 only", dev);
}
cudaError_t cudaGetDevice(int *dev) {
    if (!dev) return pn_emu_error(cudaErrorInvalidValue, "cudaGetDevice: NULL");
    *dev = 0;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev) {
    if (!p) return pn_emu_error(cudaErrorInvalidValue, "cudaGetDeviceProperties: NULL");
    if (dev != 0) return pn_emu_error(cudaErrorInvalidDevice, "cudaGetDeviceProperties: no device %d", dev);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "penumbra kernel interpreter");
    p->totalGlobalMem = g_total_mem;
    p->sharedMemPerBlock = 49152;
    p->sharedMemPerBlockOptin = 232448;
    p->sharedMemPerMultiprocessor = 233472;
    p->reservedSharedMemPerBlock = 1024;
    p->regsPerBlock = p->regsPerMultiprocessor = 65536;
    p->warpSize = 32;
    p->memPitch = 2147483647;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024, p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647, p->maxGridSize[1] = 65535, p->maxGridSize[2] = 65535;
    p->totalConstMem = 65536;
    p->major = 9, p->minor = 0;
    p->textureAlignment = 512;
    p->multiProcessorCount = 132;
    p->concurrentKernels = 1, p->unifiedAddressing = 1, p->managedMemory = 1, p->cooperativeLaunch = 1;
    p->asyncEngineCount = 2;
    p->memoryBusWidth = 5120, p->l2CacheSize = 52428800;
    p->maxThreadsPerMultiProcessor = 2048, p->maxBlocksPerMultiProcessor = 32;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    Lock l(g_mu);
    if (free_bytes) *free_bytes = g_alloc_bytes < g_total_mem ? g_total_mem - g_alloc_bytes : 0;
    if (total_bytes) *total_bytes = g_total_mem;
    return cudaSuccess;
}

/* ---- memory --------------------------------------------------------------------------- */
bool pn_emu_is_device(const void *p, size_t bytes) {
    Lock l(g_mu);
    auto it = find_alloc(p);
    if (it == g_allocs.end()) {
        /* one past the end of an allocation is a valid (empty) device range too */
        uintptr_t u = (uintptr_t)p;
        auto j = g_allocs.lower_bound(u);
        if (j == g_allocs.begin()) return false;
        --j;
        return bytes == 0 && u == j->first + j->second;
    }
    return (uintptr_t)p + bytes <= it->first + it->second;
}

extern "C" long long pn_emu_set_device_memory(long long bytes, long long *used) {
    Lock l(g_mu);
    const long long prev = (long long)g_total_mem;
    if (bytes >= 0) g_total_mem = bytes > 0 ? (size_t)bytes : DEFAULT_MEM;
    if (used) *used = (long long)g_alloc_bytes;
    return prev;
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
    Lock l(g_mu);
    g_malloc_calls++;
    if (!p) return pn_emu_error(cudaErrorInvalidValue, "cudaMalloc: NULL result pointer");
    *p = nullptr;
    if (g_alloc_bytes > g_total_mem || bytes > g_total_mem - g_alloc_bytes) /* the size may have been lowered */
        return pn_emu_error(cudaErrorMemoryAllocation, "cudaMalloc(%zu): over the %zu bytes the interpreter reports (%zu in use)",
                            bytes, g_total_mem, g_alloc_bytes);
    void *m = nullptr;
    /* own heap block per allocation (exact size, so ASan sees overruns); 256-aligned like the driver */
    if (posix_memalign(&m, 256, bytes ? bytes : 1))
        return pn_emu_error(cudaErrorMemoryAllocation, "cudaMalloc(%zu): out of host memory", bytes);
    memset(m, 0xFF, bytes); /* NaN pattern: uninitialised reads show */
    g_allocs[(uintptr_t)m] = bytes;
    g_alloc_bytes += bytes;
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    Lock l(g_mu);
    if (!p) return cudaSuccess;
    auto it = g_allocs.find((uintptr_t)p);
    if (it == g_allocs.end())
        return pn_emu_error(cudaErrorInvalidValue, "cudaFree(%p): not the start of a live cudaMalloc allocation", p);
    run_all(); /* cudaFree synchronises the device */
    g_alloc_bytes -= it->second;
    g_allocs.erase(it);
    free(p);
    return take_pending();
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind k) {
    Lock l(g_mu);
    if (n == 0) {
        run_all();
        return take_pending();
    }
    if (cudaError_t e = check_copy("cudaMemcpy", dst, src, n, k)) return e;
    run_all(); /* legacy default stream: waits for all earlier work */
    if (cudaError_t e = take_pending()) return e;
    memmove(dst, src, n);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k, cudaStream_t s) {
    Lock l(g_mu);
    if (!stream_of(s)) return pn_emu_error(cudaErrorInvalidResourceHandle, "cudaMemcpyAsync: unknown stream %p", (void *)s);
    if (n == 0) return cudaSuccess;
    if (cudaError_t e = check_copy("cudaMemcpyAsync", dst, src, n, k)) return e;
    return pn_emu_enqueue(s, [dst, src, n] { memmove(dst, src, n); });
}

static cudaError_t check_set(const char *api, void *p, size_t n) {
    if (!p || !pn_emu_is_device(p, n))
        return pn_emu_error(cudaErrorInvalidValue, "%s: %p (%zu bytes) is not inside one device allocation", api, p, n);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int value, size_t n) {
    Lock l(g_mu);
    if (n && check_set("cudaMemset", p, n)) return cudaErrorInvalidValue;
    run_all();
    if (cudaError_t e = take_pending()) return e;
    if (n) memset(p, value, n);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s) {
    Lock l(g_mu);
    if (!stream_of(s)) return pn_emu_error(cudaErrorInvalidResourceHandle, "cudaMemsetAsync: unknown stream %p", (void *)s);
    if (n == 0) return cudaSuccess;
    if (check_set("cudaMemsetAsync", p, n)) return cudaErrorInvalidValue;
    return pn_emu_enqueue(s, [p, value, n] { memset(p, value, n); });
}

extern "C" long long pn_emu_malloc_calls(void) {
    Lock l(g_mu);
    return g_malloc_calls;
}
extern "C" long long pn_emu_launches(void) {
    Lock l(g_mu);
    return g_launches;
}

/* ---- streams and events ------------------------------------------------------------------ */
cudaError_t pn_emu_enqueue(cudaStream_t s, std::function<void()> fn) {
    Lock l(g_mu);
    CUstream_st *st = stream_of(s);
    if (!st) return pn_emu_error(cudaErrorInvalidResourceHandle, "unknown stream %p", (void *)s);
    st->q.push_back(std::move(fn));
    st->enq++;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    if (!s || flags > cudaStreamNonBlocking) return pn_emu_error(cudaErrorInvalidValue, "cudaStreamCreateWithFlags: bad arguments");
    Lock l(g_mu);
    *s = new CUstream_st;
    g_streams.push_back(*s);
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    Lock l(g_mu);
    CUstream_st *st = stream_of(s);
    if (!st || st == &g_default) return pn_emu_error(cudaErrorInvalidResourceHandle, "cudaStreamDestroy: unknown stream %p", (void *)s);
    run_upto(st, st->enq); /* its work still completes */
    for (size_t i = 0; i < g_streams.size(); i++)
        if (g_streams[i] == st) g_streams.erase(g_streams.begin() + (long)i);
    st->dead = true; /* kept (not freed): events recorded on it may still be waited for */
    g_dead.push_back(st);
    return cudaSuccess;
}

/* runs stream s's queue; call names the API function in the error */
static cudaError_t drain(cudaStream_t s, const char *call) {
    Lock l(g_mu);
    CUstream_st *st = stream_of(s);
    if (!st) return pn_emu_error(cudaErrorInvalidResourceHandle, "%s: unknown stream %p", call, (void *)s);
    run_upto(st, st->enq);
    return take_pending();
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) { return drain(s, "cudaStreamSynchronize"); }

/* the interpreter runs a stream's queue when asked about it: done at once (nothing stays pending) */
cudaError_t cudaStreamQuery(cudaStream_t s) { return drain(s, "cudaStreamQuery"); }

cudaError_t cudaDeviceSynchronize(void) {
    Lock l(g_mu);
    run_all();
    return take_pending();
}

cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    if (!e || flags > 7) return pn_emu_error(cudaErrorInvalidValue, "cudaEventCreateWithFlags: bad arguments");
    Lock l(g_mu);
    *e = new CUevent_st;
    g_events.insert(*e);
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
    Lock l(g_mu);
    if (!g_events.erase(e)) return pn_emu_error(cudaErrorInvalidResourceHandle, "cudaEventDestroy: unknown event %p", (void *)e);
    delete e;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    Lock l(g_mu);
    CUstream_st *st = stream_of(s);
    if (!g_events.count(e) || !st)
        return pn_emu_error(cudaErrorInvalidResourceHandle, "cudaEventRecord: unknown event %p or stream %p", (void *)e, (void *)s);
    e->s = st;
    e->seq = st->enq; /* complete once everything queued on s so far has run */
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    Lock l(g_mu);
    if (!g_events.count(e)) return pn_emu_error(cudaErrorInvalidResourceHandle, "cudaEventSynchronize: unknown event %p", (void *)e);
    if (e->s) run_upto(e->s, e->seq);
    return take_pending();
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    Lock l(g_mu);
    if (!ms || !g_events.count(a) || !g_events.count(b))
        return pn_emu_error(cudaErrorInvalidValue, "cudaEventElapsedTime: bad arguments");
    *ms = 0.0f;
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
    Lock l(g_mu);
    (void)flags;
    if (!g_events.count(e) || !stream_of(s))
        return pn_emu_error(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: unknown event %p or stream %p", (void *)e, (void *)s);
    if (!e->s) return cudaSuccess; /* never recorded: nothing to wait for */
    CUstream_st *es = e->s;
    long long seq = e->seq; /* the event as recorded now */
    return pn_emu_enqueue(s, [es, seq] { run_upto(es, seq); });
}

/* ---- launches -------------------------------------------------------------------------- */
cudaError_t pn_emu_func_set_attribute(const void *func, cudaFuncAttribute attr, int value) {
    Lock l(g_mu);
    if (!func) return pn_emu_error(cudaErrorInvalidValue, "cudaFuncSetAttribute: NULL function");
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || value > 232448)
            return pn_emu_error(cudaErrorInvalidValue, "cudaFuncSetAttribute: max dynamic shared memory %d B outside 0..232448",
                                value);
        g_dyn_limit[func] = value;
        return cudaSuccess;
    }
    if (attr == cudaFuncAttributePreferredSharedMemoryCarveout) return cudaSuccess;
    return pn_emu_error(cudaErrorInvalidValue, "cudaFuncSetAttribute: attribute %d not supported", (int)attr);
}

cudaError_t pn_emu_check_launch(const char *name, const void *func, dim3 g, dim3 b, size_t dyn, cudaStream_t s) {
    Lock l(g_mu);
    unsigned long long threads = (unsigned long long)b.x * b.y * b.z;
    if (b.x == 0 || b.y == 0 || b.z == 0 || b.x > 1024 || b.y > 1024 || b.z > 64 || threads > 1024)
        return pn_emu_error(cudaErrorInvalidConfiguration,
                            "kernel '%s': block (%u,%u,%u) invalid (each ≥ 1, x,y ≤ 1024, z ≤ 64, x·y·z ≤ 1024)", name, b.x,
                            b.y, b.z);
    if (g.x == 0 || g.y == 0 || g.z == 0 || g.x > 2147483647u || g.y > 65535 || g.z > 65535)
        return pn_emu_error(cudaErrorInvalidConfiguration, "kernel '%s': grid (%u,%u,%u) invalid (each ≥ 1, x < 2^31, y,z ≤ 65535)",
                            name, g.x, g.y, g.z);
    if (dyn > 49152) {
        auto it = g_dyn_limit.find(func);
        size_t limit = it == g_dyn_limit.end() ? 49152 : (size_t)it->second;
        if (dyn > limit)
            return pn_emu_error(cudaErrorInvalidValue,
                                "kernel '%s': %zu B dynamic shared memory over its limit of %zu B (raise it with "
                                "cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize); at most 232448)",
                                name, dyn, limit);
    }
    if (!stream_of(s)) return pn_emu_error(cudaErrorInvalidResourceHandle, "kernel '%s': unknown stream %p", name, (void *)s);
    return cudaSuccess;
}

cudaError_t pn_emu_enqueue_launch(const char *name, dim3 grid, dim3 block, size_t dyn, cudaStream_t s,
                                  std::function<void()> body) {
    Lock l(g_mu);
    cudaError_t e = pn_emu_enqueue(s, [name, grid, block, dyn, body] { pn_emu_run_grid(name, grid, block, dyn, body); });
    if (e == cudaSuccess) g_launches++;
    return e;
}

/* device.cu — the CUDA device as penumbra sees it: whether there is one, the stream every op
 * queues on, the cuBLAS handle, error translation, and the pn_cuda_* queries of penumbra.h.
 * One device (0), one stream: ops run in the order they were called, and host reads
 * (downloads, the index checks) synchronise. */
#include "cuda.cuh"

#include <stdio.h>
#include <stdlib.h>

static int g_state = -1; /* -1 not probed, 0 no device, 1 ready */
static int g_device = 0;  /* PENUMBRA_CUDA_DEVICE (default 0; CUDA_VISIBLE_DEVICES applies first) */
static char g_why[256];   /* why there is no device, for the errors */
static cudaStream_t g_stream;
static cublasHandle_t g_blas;
static char g_name[256];
static size_t g_smem_optin; /* the shared memory a block may opt in to (cudaFuncSetAttribute) */

static void probe(void) {
    if (g_state >= 0) return;
    int n = 0;
    g_state = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1) {
        snprintf(g_why, sizeof g_why, "no GPU (cudaGetDeviceCount: %s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        cudaGetLastError(); /* clear "no device" so it does not surface in a later check */
        return;
    }
    const char *want = getenv("PENUMBRA_CUDA_DEVICE");
    if (want && *want) {
        char *end;
        long d = strtol(want, &end, 10);
        if (*end || d < 0 || d >= n) {
            snprintf(g_why, sizeof g_why, "PENUMBRA_CUDA_DEVICE='%s' is not a device number in [0, %d)", want, n);
            return;
        }
        g_device = (int)d;
    } else {
        /* several ranks on one machine (./bench -n): rank i of the machine takes its device i (mod
         * the count), as NCCL needs one device per rank */
        const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
        if (!lr) lr = getenv("MPI_LOCALRANKID");
        if (lr && *lr) g_device = (int)(strtol(lr, NULL, 10) % n);
    }
    cudaDeviceProp prop;
    if (cudaSetDevice(g_device) != cudaSuccess || cudaGetDeviceProperties(&prop, g_device) != cudaSuccess ||
        cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) != cudaSuccess) {
        snprintf(g_why, sizeof g_why, "device %d could not be set up (%s)", g_device,
                 cudaGetErrorString(cudaGetLastError()));
        return;
    }
    if (cublasCreate(&g_blas) != CUBLAS_STATUS_SUCCESS || cublasSetStream(g_blas, g_stream) != CUBLAS_STATUS_SUCCESS) {
        snprintf(g_why, sizeof g_why, "cuBLAS could not be initialised on device %d", g_device);
        return;
    }
    snprintf(g_name, sizeof g_name, "%s (device %d, sm_%d%d)", prop.name, g_device, prop.major, prop.minor);
    g_smem_optin = prop.sharedMemPerBlockOptin;
    g_state = 1;
}

int pn_cuda_available(void) {
    probe();
    return g_state == 1;
}

int pn_cuda_interpreted(void) {
#ifdef PN_CUDA_EMU
    return pn_cuda_available();
#else
    return 0;
#endif
}

size_t pn_cu_smem_optin(void) { return pn_cuda_available() ? g_smem_optin : 0; }

const char *pn_cuda_device_name(void) { return pn_cuda_available() ? g_name : ""; }

/* why pn_cuda_available() is false ("" when it is true), for backend.c's error */
extern "C" const char *pn_cuda_unavailable_reason(void) {
    probe();
    return g_state == 1 ? "" : g_why;
}

cudaStream_t pn_cu_stream(void) { return g_stream; }

static int g_tf32 = 0;
int pn_cuda_set_tf32(int on) {
    int prev = g_tf32;
    g_tf32 = on != 0;
    return prev;
}
int pn_cu_tf32(void) { return g_tf32; }
cublasHandle_t pn_cu_blas(void) { return g_blas; }

pn_status pn_cu_check(const char *op, cudaError_t e) {
    if (e == cudaSuccess) return PN_OK;
    cudaGetLastError(); /* a launch error is not sticky: clear it for the next op */
#ifdef PN_CUDA_EMU
    const char *detail = pn_emu_detail();
    if (detail && detail[0])
        return pn_error(PN_ERR_DEVICE, "%s: CUDA error %s: %s (kernel interpreter: %s)", op, cudaGetErrorName(e),
                        cudaGetErrorString(e), detail);
#endif
    return pn_error(e == cudaErrorMemoryAllocation ? PN_ERR_OOM : PN_ERR_DEVICE, "%s: CUDA error %s: %s", op,
                    cudaGetErrorName(e), cudaGetErrorString(e));
}

pn_status pn_cu_blas_check(const char *op, cublasStatus_t s) {
    if (s == CUBLAS_STATUS_SUCCESS) return PN_OK;
#ifdef PN_CUDA_EMU
    const char *detail = pn_emu_detail();
    if (detail && detail[0]) return pn_error(PN_ERR_DEVICE, "%s: cuBLAS status %d (kernel interpreter: %s)", op, (int)s, detail);
#endif
    return pn_error(PN_ERR_DEVICE, "%s: cuBLAS status %d", op, (int)s);
}

/* the entry points below need a device */
static pn_status need_device(const char *op) {
    if (pn_cuda_available()) return PN_OK;
    return pn_error(PN_ERR_DEVICE, "%s: device cuda is not available: %s", op, g_why);
}

pn_status pn_cuda_synchronize(void) {
    PN_TRY(need_device("cuda.synchronize"));
    return pn_cu_check("cuda.synchronize", cudaStreamSynchronize(g_stream));
}

pn_status pn_cuda_emu_schedule(const char *spec) {
#ifdef PN_CUDA_EMU
    if (pn_emu_set_schedule(spec) != 0)
        return pn_error(PN_ERR_ARG, "cuda.emu_schedule: unknown schedule '%s' (fwd, rev, rand:SEED)", spec);
    return PN_OK;
#else
    return pn_error(PN_ERR_DEVICE, "cuda.emu_schedule: this build runs CUDA on %s, not the kernel interpreter",
                    pn_cuda_available() ? "a GPU" : "no device");
#endif
}

pn_status pn_cuda_emu_device_memory(int64_t bytes, int64_t *prev, int64_t *used) {
#ifdef PN_CUDA_EMU
    long long u = 0;
    const long long p = pn_emu_set_device_memory((long long)bytes, &u);
    if (prev) *prev = (int64_t)p;
    if (used) *used = (int64_t)u;
    return PN_OK;
#else
    (void)bytes, (void)prev, (void)used;
    return pn_error(PN_ERR_DEVICE, "cuda.emu_device_memory: this build runs CUDA on %s, not the kernel interpreter",
                    pn_cuda_available() ? "a GPU" : "no device");
#endif
}

const char *pn_cuda_emu_schedule_name(void) {
#ifdef PN_CUDA_EMU
    return pn_emu_schedule();
#else
    return "";
#endif
}

#ifndef PN_CUDA_EMU
pn_status pn_cuda_emu_selftest(const char *name, double *out, int64_t n) {
    return pn_error(PN_ERR_DEVICE, "cuda.emu_selftest: this build has no kernel interpreter (-DPN_CUDA_EMU=ON)");
}
#endif

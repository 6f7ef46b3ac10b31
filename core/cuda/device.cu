/* device.cu — the CUDA device as penumbra sees it: whether there is one, the stream every op
 * queues on, the cuBLAS handle, error translation, and the pn_cuda_* queries of penumbra.h.
 * One device (0), one stream: ops run in the order they were called, and host reads
 * (downloads, the index checks) synchronise. */
#include "cuda.cuh"

#include <stdio.h>

static int g_state = -1; /* -1 not probed, 0 no device, 1 ready */
static cudaStream_t g_stream;
static cublasHandle_t g_blas;
static char g_name[256];

static void probe(void) {
    if (g_state >= 0) return;
    int n = 0;
    g_state = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        cudaGetLastError(); /* clear "no device" so it does not surface in a later check */
        return;
    }
    cudaDeviceProp prop;
    if (cudaSetDevice(0) != cudaSuccess || cudaGetDeviceProperties(&prop, 0) != cudaSuccess ||
        cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    if (cublasCreate(&g_blas) != CUBLAS_STATUS_SUCCESS || cublasSetStream(g_blas, g_stream) != CUBLAS_STATUS_SUCCESS)
        return;
    snprintf(g_name, sizeof g_name, "%s (sm_%d%d)", prop.name, prop.major, prop.minor);
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

const char *pn_cuda_device_name(void) { return pn_cuda_available() ? g_name : ""; }

cudaStream_t pn_cu_stream(void) { return g_stream; }
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
    return pn_error(PN_ERR_DEVICE, "%s: no CUDA device is available (cudaGetDeviceCount found none)", op);
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

/* device.c — the CUDA queries of penumbra.h in a build without CUDA: nothing is available and
 * every call that needs a device says so. A CUDA build (nvcc or the kernel interpreter) defines
 * them in core/cuda/device.cu instead. */
#include "internal.h"

#ifndef PN_HAVE_CUDA
static pn_status no_cuda(const char *op) {
    return pn_error(PN_ERR_DEVICE, "%s: this build of penumbra has no CUDA backend (nvcc was not found or "
                                   "-DPN_CUDA=OFF; the interpreter needs -DPN_CUDA_EMU=ON)", op);
}

int pn_cuda_available(void) { return 0; }
int pn_cuda_interpreted(void) { return 0; }
const char *pn_cuda_device_name(void) { return ""; }
pn_status pn_cuda_memory_stats_get(pn_cuda_memory_stats *out) {
    memset(out, 0, sizeof *out);
    return no_cuda("cuda.memory_stats");
}
pn_status pn_cuda_reset_peak(void) { return no_cuda("cuda.reset_peak"); }
pn_status pn_cuda_empty_cache(void) { return no_cuda("cuda.empty_cache"); }
pn_status pn_cuda_synchronize(void) { return no_cuda("cuda.synchronize"); }
int pn_cuda_set_tf32(int on) { return 0; } /* nothing to switch: no CUDA matmul here */
pn_status pn_cuda_emu_schedule(const char *spec) { return no_cuda("cuda.emu_schedule"); }
const char *pn_cuda_emu_schedule_name(void) { return ""; }
pn_status pn_cuda_emu_device_memory(int64_t bytes, int64_t *prev, int64_t *used) {
    return no_cuda("cuda.emu_device_memory");
}
pn_status pn_cuda_emu_selftest(const char *name, double *out, int64_t n) { return no_cuda("cuda.emu_selftest"); }
pn_status pn_cuda_mma_check(int half, int ldmatrix, const float *a, const float *b, const float *c, float *d) {
    return no_cuda("cuda.mma_check");
}
pn_status pn_cuda_dmma_check(const double *a, const double *b, const double *c, double *d) {
    return no_cuda("cuda.dmma_check");
}
#endif

/* backend.c — the kernel tables by device (backend.h). The CPU table has every kernel of
 * kernels.def; a CUDA build links its own table (core/cuda/backend.cu, pn_cuda_kernels). */
#include "backend.h"

static const pn_kernels cpu_kernels = {
    .device = "cpu",
#define PN_KERNEL(name, args) .name = pn_cpu_##name,
#include "kernels.def"
};

#ifdef PN_HAVE_CUDA
extern const pn_kernels pn_cuda_kernels;
#endif

const pn_kernels *pn_backend(int dev) {
    if (dev == PN_CPU) return &cpu_kernels;
#ifdef PN_HAVE_CUDA
    if (dev == PN_CUDA) return pn_cuda_available() ? &pn_cuda_kernels : NULL; /* a GPU, or the interpreter */
#endif
    return NULL;
}

const char *pn_device_name(int dev) { return dev == PN_CPU ? "cpu" : dev == PN_CUDA ? "cuda" : "unknown"; }

pn_status pn_backend_for(const char *op, int dev, const pn_kernels **out) {
    *out = pn_backend(dev);
    if (*out) return PN_OK;
#ifdef PN_HAVE_CUDA
    if (dev == PN_CUDA) {
        extern const char *pn_cuda_unavailable_reason(void); /* core/cuda/device.cu */
        return pn_error(PN_ERR_DEVICE, "%s: device cuda is not available: %s", op, pn_cuda_unavailable_reason());
    }
#endif
    return pn_error(PN_ERR_DEVICE, "%s: this build of penumbra has no %s backend (built without CUDA)", op,
                    pn_device_name(dev));
}

pn_status pn_kernel_missing(const char *op, const pn_kernels *k, const char *kernel) {
    return pn_error(PN_ERR_DEVICE, "%s: no %s kernel '%s' yet (move the tensors to the cpu with :to('cpu'))", op,
                    k->device, kernel);
}

pn_status pn_common_device(const char *op, int n, const pn_tensor *const *ts, const char *const *names, int *dev) {
    int first = -1;
    for (int i = 0; i < n; i++) {
        if (!ts[i]) continue;
        if (first < 0) {
            first = i;
            *dev = ts[i]->dev;
        } else if (ts[i]->dev != *dev) {
            return pn_error(PN_ERR_DEVICE, "%s: %s %s is on %s but %s %s is on %s", op, names[first],
                            pn_shape_str(ts[first]), pn_device_name(*dev), names[i], pn_shape_str(ts[i]),
                            pn_device_name(ts[i]->dev));
        }
    }
    if (first < 0) *dev = PN_CPU;
    return PN_OK;
}

pn_status pn_kernels_for(const char *op, int n, const pn_tensor *const *ts, const char *const *names, int *dev,
                         const pn_kernels **k) {
    PN_TRY(pn_common_device(op, n, ts, names, dev));
    return pn_backend_for(op, *dev, k);
}

/* ---- introspection (penumbra.h) ---- */
static const char *const kernel_names[] = {
#define PN_KERNEL(name, args) #name,
#include "kernels.def"
};
enum { N_KERNELS = sizeof kernel_names / sizeof kernel_names[0] };

int pn_kernel_count(void) { return N_KERNELS; }

const char *pn_kernel_name(int i) { return i >= 0 && i < N_KERNELS ? kernel_names[i] : NULL; }

int pn_kernel_present(int dev, int i) {
    const pn_kernels *k = pn_backend(dev);
    if (!k) return -1;
    if (i < 0 || i >= N_KERNELS) return 0;
    int j = 0; /* kernels.def order, as the names above */
#define PN_KERNEL(name, args) if (j++ == i) return k->name != NULL;
#include "kernels.def"
    return 0;
}

/* storage.c — refcounted data buffers shared by views. */
#include "internal.h"

pn_storage *pn_storage_new(size_t nbytes, int dev) {
    if (dev != PN_CPU)
        return pn_error_null(PN_ERR_DEVICE, "storage: device %d is not available in this build", dev);
    pn_storage *s = malloc(sizeof *s);
    if (!s) return pn_error_null(PN_ERR_OOM, "storage: out of memory");
    s->data = pn_alloc(nbytes);
    if (!s->data) {
        free(s);
        return NULL;
    }
    s->nbytes = nbytes;
    s->refcount = 1;
    s->dev = dev;
    return s;
}

void pn_storage_retain(pn_storage *s) { __atomic_add_fetch(&s->refcount, 1, __ATOMIC_RELAXED); }

void pn_storage_release(pn_storage *s) {
    if (!s) return;
    if (__atomic_sub_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL) == 0) {
        pn_free(s->data, s->nbytes);
        free(s);
    }
}

int pn_cuda_available(void) {
#ifdef PN_HAVE_CUDA
    return 1; /* refined by core/cuda once kernels land */
#else
    return 0;
#endif
}

/* storage.c — refcounted data buffers shared by views, allocated and freed by their device's
 * mem_alloc / mem_free kernels (counted in pn_live_bytes on every device). */
#include "backend.h"

/* the CPU's (kernels.def): pn_alloc / pn_free, counted */
pn_status pn_cpu_mem_alloc(size_t nbytes, void **out) {
    *out = pn_alloc(nbytes);
    return *out ? PN_OK : PN_ERR_OOM; /* pn_alloc set the error */
}

pn_status pn_cpu_mem_free(void *p, size_t nbytes) {
    pn_free(p, nbytes);
    return PN_OK;
}

/* host memory is the CPU's memory: both directions are a copy */
pn_status pn_cpu_upload(void *dst, const void *host_src, size_t nbytes) {
    if (nbytes) memcpy(dst, host_src, nbytes);
    return PN_OK;
}

pn_status pn_cpu_download(void *host_dst, const void *src, size_t nbytes) {
    if (nbytes) memcpy(host_dst, src, nbytes);
    return PN_OK;
}

pn_storage *pn_storage_new(size_t nbytes, int dev) {
    const pn_kernels *k;
    if (pn_backend_for("storage", dev, &k)) return NULL;
    pn_storage *s = malloc(sizeof *s);
    if (!s) return pn_error_null(PN_ERR_OOM, "storage: out of memory");
    s->data = NULL;
    if (PN_KCALL("storage", k, mem_alloc, nbytes, &s->data)) {
        free(s);
        return NULL;
    }
    s->nbytes = nbytes;
    s->refcount = 1;
    s->version = 0;
    s->dev = dev;
    return s;
}

void pn_storage_retain(pn_storage *s) { __atomic_add_fetch(&s->refcount, 1, __ATOMIC_RELAXED); }

void pn_storage_release(pn_storage *s) {
    if (!s) return;
    if (__atomic_sub_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL) == 0) {
        const pn_kernels *k = pn_backend(s->dev); /* present: the storage was allocated through it */
        if (k && k->mem_free) k->mem_free(s->data, s->nbytes);
        free(s);
    }
}

/* backend.h — the device seam under every op (DESIGN §1, §8).
 *
 * An op is a front end and a kernel. The front end (core/ops/, core/attention/)
 * checks the arguments, computes the output shape, allocates the output on the inputs'
 * device and records autograd; then it calls the kernel of that device through the table
 * below. core/cuda/ only adds kernels: it never repeats a front end.
 *
 *     const pn_kernels *k;
 *     PN_TRY(pn_backend_for(op, x->dev, &k));           // device compiled in?
 *     PN_TRY(PN_KCALL(op, k, accumulate, acc, g));      // kernel present on it?
 */
#ifndef PN_BACKEND_H
#define PN_BACKEND_H

#include "internal.h"

#if defined(__cplusplus) && !defined(PN_FFI)
extern "C" { /* C linkage for core/cuda/ and core/text/spm.cc */
#endif

/* host-built tables some kernels read (their launchers upload them): attention/linear.h */
typedef struct pn_sympow_table pn_sympow_table;
typedef struct pn_rowmap pn_rowmap; /* attention/rowmap.h: a map's row kernels and sizes */

typedef struct pn_kernels {
    const char *device; /* "cpu", "cuda" */
#define PN_KERNEL(name, args) pn_status(*name) args;
#include "kernels.def"
} pn_kernels;

/* the CPU kernels (each next to its op's front end) */
#define PN_KERNEL(name, args) pn_status pn_cpu_##name args;
#include "kernels.def"

/* The kernel table of device dev; error naming op when this build has no such backend. */
pn_status pn_backend_for(const char *op, int dev, const pn_kernels **out);
/* The table itself, or NULL when this build has none for dev (no error set). */
const pn_kernels *pn_backend(int dev);
/* "cpu", "cuda" (for messages) */
const char *pn_device_name(int dev);
/* Error for a kernel the device's table does not have (yet). */
pn_status pn_kernel_missing(const char *op, const pn_kernels *k, const char *kernel);

/* Call kernel `name` of table k, or fail with pn_kernel_missing naming op. */
#define PN_KCALL(op, k, name, ...) ((k)->name ? (k)->name(__VA_ARGS__) : pn_kernel_missing((op), (k), #name))

/* Kernel `name` of the device tensor t is on (a front end has already checked that every
 * tensor of the op is there): the table lookup and the call in one expression. */
#define PN_KCALL_ON(op, t, name, ...)                                                                   \
    (pn_backend((t)->dev) ? PN_KCALL(op, pn_backend((t)->dev), name, __VA_ARGS__)                       \
                          : pn_backend_for((op), (t)->dev, &(const pn_kernels *){NULL}))

/* The end of a backward that computed one gradient: releases the scratch tmp (may be NULL); on
 * success the gradient goes to *slot, on failure it is released and st returned. */
static inline pn_status pn_bw_result(pn_status st, pn_tensor *tmp, pn_tensor *grad, pn_tensor **slot) {
    pn_release(tmp);
    if (st) {
        pn_release(grad);
        return st;
    }
    *slot = grad;
    return PN_OK;
}

/* Every tensor in ts (NULL entries skipped) on one device: *dev gets it; the error names op,
 * the arguments (names[i]) and their shapes and devices. */
pn_status pn_common_device(const char *op, int n, const pn_tensor *const *ts, const char *const *names, int *dev);

/* The front end's device step in one call: every tensor of ts on one device (pn_common_device),
 * *dev gets it and *k its kernel table (pn_backend_for). */
pn_status pn_kernels_for(const char *op, int n, const pn_tensor *const *ts, const char *const *names, int *dev,
                         const pn_kernels **k);
#if defined(__cplusplus) && !defined(PN_FFI)
}
#endif
#endif /* PN_BACKEND_H */

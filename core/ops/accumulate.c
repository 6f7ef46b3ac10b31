/* accumulate.c — the two CPU kernels autograd runs on every backward (kernels.def):
 * accumulate (acc += g, gradients arriving at one tensor from several consumers) and
 * sum_to (a broadcast's gradient summed back to the input's shape). autograd.c calls
 * them through the device table, so gradients stay on the device that made them. */
#include "../backend.h"

#include <omp.h>

#define ACC_CHUNK 8192 /* elements per parallel work unit along a long row */

pn_status pn_cpu_accumulate(pn_tensor *acc, const pn_tensor *g) {
    pn_iter it;
    pn_iter_init(&it, acc->nd, acc->sizes, 2, (pn_tensor *const[]){acc, (pn_tensor *)g}, NULL);
    char *o = pn_ptr(acc);
    const char *x = pn_ptr(g);
    const int dt = acc->dt;
    /* work units: rows cut into chunks, so that two contiguous tensors (one row after the
     * iterator merges their dims) still spread over the threads */
    const int64_t nch = (it.inner + ACC_CHUNK - 1) / ACC_CHUNK, units = it.rows * nch;
    #pragma omp parallel for schedule(static) if (it.numel >= PN_PAR_MIN)
    for (int64_t u = 0; u < units; u++) {
        const int64_t r = u / nch, i0 = (u % nch) * ACC_CHUNK;
        const int64_t len = it.inner - i0 < ACC_CHUNK ? it.inner - i0 : ACC_CHUNK;
        int64_t off[PN_ITER_MAX_OPS];
        pn_iter_row(&it, r, off);
        const int64_t so = it.istride[0], sx = it.istride[1];
        const int64_t o0 = off[0] + i0 * so, x0 = off[1] + i0 * sx;
        if (dt == PN_F32) {
            float *po = (float *)o + o0;
            const float *px = (const float *)x + x0;
            for (int64_t i = 0; i < len; i++) po[i * so] += px[i * sx];
        } else if (dt == PN_F64) {
            double *po = (double *)o + o0;
            const double *px = (const double *)x + x0;
            for (int64_t i = 0; i < len; i++) po[i * so] += px[i * sx];
        } else {
            for (int64_t i = 0; i < len; i++) {
                int64_t a = o0 + i * so;
                pn_st(o, dt, a, pn_ld(o, dt, a) + pn_ld(x, dt, x0 + i * sx));
            }
        }
    }
    return PN_OK;
}

/* Each output element sums its inputs in one fixed order (the general path is serial: the
 * output is usually small, a bias). */
pn_status pn_cpu_sum_to(pn_tensor *out, const pn_tensor *g) {
    memset(pn_ptr(out), 0, (size_t)pn_numel(out) * pn_elsize(out->dt));
    /* the common case (a bias gradient): g contiguous (R, …C) summed over its leading dims into
     * out (…C) — one pass of unit-stride rows, the same additions in the same order as below;
     * threads take spans of columns, so the order does not depend on their number */
    if (g->dt == PN_F32 && pn_is_contiguous(g)) {
        const int64_t C = pn_suffix_numel(out, g);
        if (C > 0) {
            const int64_t R = pn_numel(g) / C;
            float *po = (float *)pn_ptr(out);
            const float *px = (const float *)pn_ptr(g);
            #pragma omp parallel if (R * C >= PN_PAR_MIN && C >= 32)
            {
                /* one pass over the rows per thread, each on its own span of columns (a
                 * multiple of 16) */
                const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
                const int64_t span = ((C + nt - 1) / nt + 15) / 16 * 16;
                const int64_t i0 = t * span < C ? t * span : C, i1 = i0 + span < C ? i0 + span : C;
                for (int64_t r = 0; r < R; r++)
                    for (int64_t i = i0; i < i1; i++) po[i] += px[r * C + i];
            }
            return PN_OK;
        }
    }
    int64_t st[PN_ITER_MAX_OPS][PN_MAX_DIMS];
    pn_broadcast_strides(out, g->nd, g->sizes, st[0]);
    memcpy(st[1], g->strides, sizeof st[1]);
    pn_iter it;
    pn_iter_init(&it, g->nd, g->sizes, 2, (pn_tensor *const[]){out, (pn_tensor *)g}, st);
    char *o = pn_ptr(out);
    const char *x = pn_ptr(g);
    for (int64_t r = 0; r < it.rows; r++) {
        int64_t off[PN_ITER_MAX_OPS];
        pn_iter_row(&it, r, off);
        if (g->dt == PN_F32) {
            float *po = (float *)o + off[0];
            const float *px = (const float *)x + off[1];
            if (it.istride[0] == 0) {
                float acc = 0;
                for (int64_t i = 0; i < it.inner; i++) acc += px[i * it.istride[1]];
                po[0] += acc;
            } else {
                for (int64_t i = 0; i < it.inner; i++) po[i * it.istride[0]] += px[i * it.istride[1]];
            }
        } else {
            for (int64_t i = 0; i < it.inner; i++) {
                int64_t a = off[0] + i * it.istride[0];
                pn_st(o, g->dt, a, pn_ld(o, g->dt, a) + pn_ld(x, g->dt, off[1] + i * it.istride[1]));
            }
        }
    }
    return PN_OK;
}

/* blas.h — OpenBLAS and our OpenMP loops sharing the cores.
 *
 * Two thread pools on the same cores fight: OpenBLAS's workers spin (sched_yield) for a
 * while after each threaded GEMM, stealing the cores from the OpenMP loop that follows.
 * So wherever our own OpenMP threads call BLAS, or a GEMM is too skinny for OpenBLAS's
 * threading to pay, OpenBLAS's threads are switched off around the region and restored
 * afterwards (a no-op with a BLAS that has no such switch). */
#ifndef PN_BLAS_H
#define PN_BLAS_H

#include <cblas.h>

#ifdef OPENBLAS_VERSION
#define PN_BLAS_SERIAL_BEGIN int pn_blas_prev_ = openblas_get_num_threads(); openblas_set_num_threads(1)
#define PN_BLAS_SERIAL_END openblas_set_num_threads(pn_blas_prev_)
#else
#define PN_BLAS_SERIAL_BEGIN (void)0
#define PN_BLAS_SERIAL_END (void)0
#endif

#endif

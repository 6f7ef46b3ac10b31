/* dist.h — the engine seam under pn_dist_* (core/dist/dist.c): what one communication engine
 * provides, on contiguous buffers. mpi.c is the MPI engine, on host buffers (a stub naming the
 * apt-get line when the build found no MPI); nccl.cu the NCCL engine, on device buffers, with MPI
 * only to exchange the NCCL id and for dist.c's agreement (in the kernel-interpreter build the
 * same nccl.cu runs on core/cuda/emu/nccl.h, the NCCL subset over MPI on host memory). dist.c
 * checks every argument and does the single-process path before calling here, so an engine sees
 * valid buffers, dtypes and ranks only. Counts are elements (int64): an engine splits what its
 * library cannot count in one call. */
#ifndef PN_DIST_H
#define PN_DIST_H

#include "internal.h"

#ifdef __cplusplus
extern "C" { /* nccl.cu */
#endif

/* what to run where MPI is missing (error messages, README) */
#define PN_MPI_APT_LINE "apt-get update && apt-get install -y openmpi-bin libopenmpi-dev"

int pn_mpi_built(void);                         /* 1 when this build links MPI */
/* MPI_Init_thread (unless the process already did it), errors returned rather than fatal,
 * MPI_Finalize registered with atexit, the ranks' pids swapped (which ones this process can see
 * die); this process's rank and the number of ranks. The collectives below wait at most
 * pn_dist_timeout() and may give up sooner (mpi.c's top comment); op names the call in messages. */
pn_status pn_mpi_init(int *rank, int *size);
pn_status pn_mpi_barrier(const char *op);
/* in place over every rank; op PN_SUM, PN_MAX or PN_MIN (max/min of floats propagate NaN) */
pn_status pn_mpi_all_reduce(const char *op, void *p, int64_t n, int dtype, int red);
/* inout = in (op) inout, n elements here (no communication): dist.c's small all-reduces */
pn_status pn_mpi_reduce_local(const char *op, const void *in, void *inout, int64_t n, int dtype, int red);
/* pn_mpi_all_reduce started and left running (*req: its request, NULL when it already completed);
 * pn_mpi_test moves it on and sets *req NULL once complete; pn_mpi_wait waits as the call above */
pn_status pn_mpi_all_reduce_start(const char *op, void *p, int64_t n, int dtype, int red, void **req);
pn_status pn_mpi_test(const char *op, void **req);
pn_status pn_mpi_wait(const char *op, void **req, size_t bytes);
pn_status pn_mpi_broadcast(const char *op, void *p, int64_t n, int dtype, int root);
/* out (size · n elements) gets rank r's n elements of in at r · n */
pn_status pn_mpi_all_gather(const char *op, const void *in, void *out, int64_t n, int dtype);
void pn_mpi_abort(int code);                    /* does not return */
/* After a collective gave up (a rank gone, a stop signal, the timeout, an MPI error: mpi.c's top
 * comment), why (PN_DIST_*; 0 while the ranks can exchange) and, for PN_DIST_PEER_GONE, the rank
 * found gone (else −1). From then on every call above fails at once, and the buffers of the
 * call that gave up must stay allocated: MPI may still write into them. */
int pn_mpi_failure(void);
int pn_mpi_lost_rank(void);

/* For another engine's waits (nccl.cu): the checks of an MPI wait, run every few milliseconds —
 * a rank on this machine gone, a stop signal past its grace, pn_dist_timeout() since the start.
 * PN_OK while the wait may go on; else the failure, recorded as an MPI wait's would be (every
 * later call refuses, naming it). pn_mpi_fail records one the engine found itself. */
typedef struct { double t0, watch, signalled; } pn_mpi_watch_t;
void pn_mpi_watch_start(pn_mpi_watch_t *w);
pn_status pn_mpi_watch(const char *op, pn_mpi_watch_t *w);
pn_status pn_mpi_fail(int why, const char *msg);
/* a short pause of a polling wait (after its first spin): 50 … 200 µs, doubling (*nap_ns: 0 first) */
void pn_mpi_nap(long *nap_ns);

/* ---- device buffers: the NCCL engine (nccl.cu) --------------------------------------------- */
int pn_nccl_built(void); /* 1 when this build has it (CUDA with NCCL, or the interpreter's subset) */
/* as the pn_mpi_* calls above, on device pointers, queued on the CUDA stream and waited for (the
 * watch above; a failure aborts the NCCL communicator); red PN_SUM, PN_MAX or PN_MIN — NaN in
 * max / min is dist.c's (NCCL does not promise to propagate it) */
pn_status pn_nccl_all_reduce(const char *op, void *p, int64_t n, int dtype, int red);
/* started on the engine's own stream after what the compute stream has queued so far (the
 * bucket's copies), left running; pn_nccl_wait_started waits for every started one and orders
 * the compute stream after them */
pn_status pn_nccl_all_reduce_start(const char *op, void *p, int64_t n, int dtype, int red);
pn_status pn_nccl_wait_started(const char *op);
pn_status pn_nccl_broadcast(const char *op, void *p, int64_t n, int dtype, int root);
pn_status pn_nccl_all_gather(const char *op, const void *in, void *out, int64_t n, int dtype);

#ifdef __cplusplus
}
#endif

#endif

/* nccl.cu — the NCCL engine of pn_dist_* for device tensors (dist.h). dist.c has agreed on the
 * call over MPI (every rank is in it, with the same dtype, shape and op) before calling here.
 *
 * The communicator is made at the first device collective: rank 0's ncclGetUniqueId goes to the
 * others by an MPI broadcast, then ncclCommInitRankConfig, non-blocking, so that its wait is
 * watched like every other (dist.h: pn_mpi_watch — a rank gone, a stop signal, the timeout).
 * Each collective is queued on penumbra's one CUDA stream (after the ops that made its input,
 * before the ops that read its output) and waited for by polling cudaStreamQuery and the
 * communicator's asynchronous error; a wait that gives up aborts the communicator
 * (ncclCommAbort: the kernels in flight return), records the failure as an MPI wait would,
 * and every later call refuses. Device per rank: core/cuda/device.cu picks the rank's local
 * index on its machine (PENUMBRA_CUDA_DEVICE overrides), as NCCL needs one GPU per rank.
 *
 * The same file runs in the kernel-interpreter build on emu/nccl.h: the NCCL subset over MPI on
 * host memory (the interpreter's device memory), so the device path of data parallelism runs
 * in CI. */
#include "../cuda/cuda.cuh"
#include "dist.h"

#ifdef PN_CUDA_EMU
#include "../cuda/emu/nccl.h"
#else
#include <nccl.h>
#endif

#include <stdio.h>
#include <string.h>

static ncclComm_t g_comm;
static int g_ready; /* g_comm made */

extern "C" int pn_nccl_built(void) { return 1; }

static ncclDataType_t nccl_type(int dt) {
    switch (dt) {
    case PN_F32: return ncclFloat32;
    case PN_F64: return ncclFloat64;
    case PN_I32: return ncclInt32;
    case PN_I64: return ncclInt64;
    default: return ncclUint8;
    }
}

static ncclRedOp_t nccl_op(int red) { return red == PN_MAX ? ncclMax : red == PN_MIN ? ncclMin : ncclSum; }

/* a wait that gave up: the communicator is aborted (the kernels in flight return) and gone */
static void abort_comm(void) {
    if (g_ready) ncclCommAbort(g_comm);
    g_ready = 0;
}

/* after an error of NCCL itself: recorded as the engine's failure (dist.h) */
static pn_status nccl_failed(const char *op, const char *call, ncclResult_t r) {
    if (pn_mpi_failure()) return PN_ERR_STATE; /* the interpreter's MPI underneath gave up: its message stands */
    char msg[512];
    snprintf(msg, sizeof msg, "%s: %s failed: %s", op, call, ncclGetErrorString(r));
    abort_comm();
    return pn_mpi_fail(PN_DIST_MPI_ERROR, msg);
}

/* the reducer's started all-reduces run on a stream of their own, so the backward's kernels go on
 * beside them; made with the communicator */
static cudaStream_t g_side;
static cudaEvent_t g_queued, g_sent;

/* the communicator's pending state settled (init) or stream s drained (a collective; NULL: init) */
static pn_status wait_nccl(const char *op, cudaStream_t s) {
    pn_mpi_watch_t w;
    pn_mpi_watch_start(&w);
    long nap = 0;
    for (int spins = 0;; spins++) {
        ncclResult_t ar = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(g_comm, &ar);
        if (r != ncclSuccess) return nccl_failed(op, "ncclCommGetAsyncError", r);
        if (ar != ncclSuccess && ar != ncclInProgress) return nccl_failed(op, "the collective", ar);
        int done = ar == ncclSuccess;
        if (done && s) {
            cudaError_t e = cudaStreamQuery(s);
            if (e != cudaSuccess && e != cudaErrorNotReady) {
                pn_cu_check(op, e); /* its message, then recorded as the engine's failure */
                abort_comm();
                return pn_mpi_fail(PN_DIST_MPI_ERROR, pn_last_error());
            }
            done = e == cudaSuccess;
        }
        if (done) return PN_OK;
        pn_status st = pn_mpi_watch(op, &w);
        if (st) {
            abort_comm();
            return st;
        }
        if (spins > 1000) pn_mpi_nap(&nap);
    }
}

/* the communicator, made at the first device collective (after a failure dist.c's agreement has
 * refused already: no call gets here) */
static pn_status ready(const char *op) {
    if (g_ready) return PN_OK;
    int rank = pn_dist_rank(), size = pn_dist_size();
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess) return nccl_failed(op, "ncclGetUniqueId", r);
    }
    PN_TRY(pn_mpi_broadcast(op, &id, (int64_t)sizeof id, PN_U8, 0));
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* init returns at once; wait_nccl watches it */
    ncclResult_t r = ncclCommInitRankConfig(&g_comm, size, id, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) return nccl_failed(op, "ncclCommInitRankConfig", r);
    g_ready = 1;
    if (!g_side) {
        cudaError_t e = cudaStreamCreateWithFlags(&g_side, cudaStreamNonBlocking);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&g_queued, cudaEventDisableTiming);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&g_sent, cudaEventDisableTiming);
        if (e != cudaSuccess) return pn_cu_check(op, e);
    }
    return wait_nccl(op, NULL);
}

/* NCCL counts in size_t; one call each (no split needed) */
extern "C" pn_status pn_nccl_all_reduce(const char *op, void *p, int64_t n, int dtype, int red) {
    PN_TRY(ready(op));
    ncclResult_t r = ncclAllReduce(p, p, (size_t)n, nccl_type(dtype), nccl_op(red), g_comm, pn_cu_stream());
    if (r != ncclSuccess && r != ncclInProgress) return nccl_failed(op, "ncclAllReduce", r);
    return wait_nccl(op, pn_cu_stream());
}

extern "C" pn_status pn_nccl_broadcast(const char *op, void *p, int64_t n, int dtype, int root) {
    PN_TRY(ready(op));
    ncclResult_t r = ncclBroadcast(p, p, (size_t)n, nccl_type(dtype), root, g_comm, pn_cu_stream());
    if (r != ncclSuccess && r != ncclInProgress) return nccl_failed(op, "ncclBroadcast", r);
    return wait_nccl(op, pn_cu_stream());
}

extern "C" pn_status pn_nccl_all_gather(const char *op, const void *in, void *out, int64_t n, int dtype) {
    PN_TRY(ready(op));
    ncclResult_t r = ncclAllGather(in, out, (size_t)n, nccl_type(dtype), g_comm, pn_cu_stream());
    if (r != ncclSuccess && r != ncclInProgress) return nccl_failed(op, "ncclAllGather", r);
    return wait_nccl(op, pn_cu_stream());
}

/* the started form (dist.h): the side stream waits for what the compute stream queued (the
 * bucket's copies), then NCCL runs there while the compute stream goes on */
extern "C" pn_status pn_nccl_all_reduce_start(const char *op, void *p, int64_t n, int dtype, int red) {
    PN_TRY(ready(op));
    cudaError_t e = cudaEventRecord(g_queued, pn_cu_stream());
    if (e == cudaSuccess) e = cudaStreamWaitEvent(g_side, g_queued, 0);
    if (e != cudaSuccess) return pn_cu_check(op, e);
    ncclResult_t r = ncclAllReduce(p, p, (size_t)n, nccl_type(dtype), nccl_op(red), g_comm, g_side);
    if (r != ncclSuccess && r != ncclInProgress) return nccl_failed(op, "ncclAllReduce", r);
    return PN_OK;
}

/* every started one done (watched, as a collective's wait), and the compute stream after them */
extern "C" pn_status pn_nccl_wait_started(const char *op) {
    PN_TRY(ready(op));
    PN_TRY(wait_nccl(op, g_side));
    cudaError_t e = cudaEventRecord(g_sent, g_side);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(pn_cu_stream(), g_sent, 0);
    return e == cudaSuccess ? PN_OK : pn_cu_check(op, e);
}

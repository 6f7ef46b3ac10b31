/* nccl.h — the NCCL subset core/dist/nccl.cu uses, for the kernel-interpreter build: the same
 * calls over MPI (core/dist/mpi.c) on host memory, which is what the interpreter's device memory
 * is. A collective first runs the stream's queue (the kernels that made its input), then makes
 * the MPI call — the same polled, watched wait as a host tensor's — so it is complete when it
 * returns, and cudaStreamQuery after it sees an empty stream. Enum values as NCCL 2's. What it
 * cannot show: NCCL's own transports, kernels and asynchrony (emu.h lists the interpreter's
 * limits). */
#ifndef PN_EMU_NCCL_H
#define PN_EMU_NCCL_H

#include <stdlib.h>
#include <string.h>

typedef enum { ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2, ncclInternalError = 3,
               ncclInvalidArgument = 4, ncclInvalidUsage = 5, ncclRemoteError = 6, ncclInProgress = 7 } ncclResult_t;
typedef enum { ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4, ncclUint64 = 5,
               ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9 } ncclDataType_t;
typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef struct { int blocking; } ncclConfig_t;
#define NCCL_CONFIG_INITIALIZER { 1 }
struct pn_emu_nccl_comm { int rank, size; };
typedef pn_emu_nccl_comm *ncclComm_t;

static inline const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclSystemError: return "system error (the interpreter's MPI underneath failed)";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInProgress: return "operation in progress";
    default: return "error (the interpreter's NCCL subset)";
    }
}

static inline ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    memset(id, 0, sizeof *id);
    strcpy(id->internal, "penumbra interpreter: NCCL over MPI");
    return ncclSuccess;
}

static inline ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int size, ncclUniqueId id, int rank,
                                                  ncclConfig_t *cfg) {
    (void)cfg;
    if (size < 1 || rank < 0 || rank >= size || strcmp(id.internal, "penumbra interpreter: NCCL over MPI") != 0)
        return ncclInvalidArgument; /* an id that did not come from rank 0's ncclGetUniqueId */
    *comm = (ncclComm_t)malloc(sizeof **comm);
    if (!*comm) return ncclSystemError;
    (*comm)->rank = rank;
    (*comm)->size = size;
    return ncclSuccess;
}

static inline ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *r) {
    *r = comm ? ncclSuccess : ncclInvalidArgument;
    return ncclSuccess;
}

static inline ncclResult_t ncclCommAbort(ncclComm_t comm) {
    free(comm);
    return ncclSuccess;
}

static inline int pn_emu_nccl_dtype(ncclDataType_t t) {
    return t == ncclFloat32 ? PN_F32 : t == ncclFloat64 ? PN_F64 : t == ncclInt32 ? PN_I32 : t == ncclInt64 ? PN_I64 : PN_U8;
}
static inline size_t pn_emu_nccl_size(ncclDataType_t t) {
    return t == ncclFloat64 || t == ncclInt64 || t == ncclUint64 ? 8 : t == ncclInt32 || t == ncclFloat32 || t == ncclUint32 ? 4
           : t == ncclFloat16 || t == ncclBfloat16 ? 2 : 1;
}

/* the stream's queue first: the kernels that wrote the input */
static inline ncclResult_t pn_emu_nccl_sync(cudaStream_t s) {
    return cudaStreamSynchronize(s) == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
}

static inline ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t dt, ncclRedOp_t op,
                                         ncclComm_t comm, cudaStream_t s) {
    if (!comm || (op != ncclSum && op != ncclMax && op != ncclMin)) return ncclInvalidArgument;
    ncclResult_t r = pn_emu_nccl_sync(s);
    if (r != ncclSuccess) return r;
    if (send != recv) memmove(recv, send, count * pn_emu_nccl_size(dt));
    int red = op == ncclMax ? PN_MAX : op == ncclMin ? PN_MIN : PN_SUM;
    return pn_mpi_all_reduce("ncclAllReduce (the interpreter's, over MPI)", recv, (int64_t)count,
                             pn_emu_nccl_dtype(dt), red) ? ncclSystemError : ncclSuccess;
}

static inline ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t dt, int root,
                                         ncclComm_t comm, cudaStream_t s) {
    if (!comm || root < 0 || root >= comm->size) return ncclInvalidArgument;
    ncclResult_t r = pn_emu_nccl_sync(s);
    if (r != ncclSuccess) return r;
    if (comm->rank == root && send != recv) memmove(recv, send, count * pn_emu_nccl_size(dt));
    return pn_mpi_broadcast("ncclBroadcast (the interpreter's, over MPI)", recv, (int64_t)count, pn_emu_nccl_dtype(dt),
                            root) ? ncclSystemError : ncclSuccess;
}

static inline ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t dt, ncclComm_t comm,
                                         cudaStream_t s) {
    if (!comm) return ncclInvalidArgument;
    ncclResult_t r = pn_emu_nccl_sync(s);
    if (r != ncclSuccess) return r;
    return pn_mpi_all_gather("ncclAllGather (the interpreter's, over MPI)", send, recv, (int64_t)count,
                             pn_emu_nccl_dtype(dt)) ? ncclSystemError : ncclSuccess;
}

#endif

/* mpi.c — the MPI engine of pn_dist_* (Open MPI: Debian openmpi-bin, libopenmpi-dev).
 *
 * Built with MPI when CMake finds it (PN_HAVE_MPI); otherwise every entry point is a stub whose
 * error names the apt-get line. dist.c has checked the arguments; here are only the MPI calls,
 * on a private duplicate of MPI_COMM_WORLD whose error handler returns errors (translated to
 * pn_error messages) instead of killing the job. */
#include "dist/dist.h"

#ifdef PN_HAVE_MPI

#include <limits.h>
#include <mpi.h>
#include <stdio.h>

static MPI_Comm comm = MPI_COMM_NULL;
static int we_initialised; /* MPI_Finalize is ours to call only when MPI_Init was */
static MPI_Op op_fmax = MPI_OP_NULL, op_fmin = MPI_OP_NULL;

/* MPI counts are int: bigger buffers go in pieces of at most `chunk` elements (2^30; the
 * environment's PENUMBRA_DIST_CHUNK, read once, makes them small so specs run this path) */
static int64_t chunk = (int64_t)1 << 30;
static void read_chunk(void) {
    const char *e = getenv("PENUMBRA_DIST_CHUNK");
    long long v = e ? atoll(e) : 0;
    if (v >= 1 && v <= INT_MAX) chunk = v;
}

int pn_mpi_built(void) { return 1; }

static pn_status mpi_error(const char *op, const char *call, int rc) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "error code %d", rc);
    return pn_error(PN_ERR_STATE, "%s: %s failed: %s", op, call, s);
}
#define MPI_TRY(op, call, expr)                             \
    do {                                                    \
        int mpi_rc_ = (expr);                               \
        if (mpi_rc_ != MPI_SUCCESS) return mpi_error(op, call, mpi_rc_); \
    } while (0)

static MPI_Datatype mpi_type(int dt) {
    switch (dt) {
    case PN_F32: return MPI_FLOAT;
    case PN_F64: return MPI_DOUBLE;
    case PN_I32: return MPI_INT32_T;
    case PN_I64: return MPI_INT64_T;
    default: return MPI_UINT8_T;
    }
}

/* MPI_MAX/MIN on floats keep whichever operand the comparison picks, so a NaN survives or not
 * depending on the rank order; these make NaN win on every rank (NaN in → NaN out). */
#define NAN_OP(name, T, better)                                                      \
    static void name##_##T(const T *in, T *io, int n) {                              \
        for (int i = 0; i < n; i++) {                                                \
            T a = in[i], b = io[i];                                                  \
            io[i] = a != a ? a : b != b ? b : (a better b ? a : b);                  \
        }                                                                            \
    }
NAN_OP(fmax, float, >)
NAN_OP(fmax, double, >)
NAN_OP(fmin, float, <)
NAN_OP(fmin, double, <)
static void fmax_fn(void *in, void *io, int *n, MPI_Datatype *t) {
    if (*t == MPI_FLOAT) fmax_float(in, io, *n);
    else fmax_double(in, io, *n);
}
static void fmin_fn(void *in, void *io, int *n, MPI_Datatype *t) {
    if (*t == MPI_FLOAT) fmin_float(in, io, *n);
    else fmin_double(in, io, *n);
}

static void finalize_at_exit(void) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin) return;
    if (op_fmax != MPI_OP_NULL) MPI_Op_free(&op_fmax);
    if (op_fmin != MPI_OP_NULL) MPI_Op_free(&op_fmin);
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
    if (we_initialised) MPI_Finalize();
}

pn_status pn_mpi_init(int *rank, int *size) {
    const char *op = "dist.init";
    int inited = 0, fin = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (fin) return pn_error(PN_ERR_STATE, "%s: MPI has already been finalized in this process", op);
    if (!inited) {
        /* FUNNELED: OpenMP threads compute, only the main thread calls MPI */
        int provided = 0;
        MPI_TRY(op, "MPI_Init_thread", MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided));
        we_initialised = 1;
    }
    read_chunk();
    static int registered;
    if (!registered && atexit(finalize_at_exit) != 0)
        return pn_error(PN_ERR_STATE, "%s: cannot register MPI_Finalize to run at exit", op);
    registered = 1;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (comm == MPI_COMM_NULL) {
        MPI_TRY(op, "MPI_Comm_dup", MPI_Comm_dup(MPI_COMM_WORLD, &comm));
        MPI_TRY(op, "MPI_Comm_set_errhandler", MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
    }
    if (op_fmax == MPI_OP_NULL) MPI_TRY(op, "MPI_Op_create", MPI_Op_create(fmax_fn, 1, &op_fmax));
    if (op_fmin == MPI_OP_NULL) MPI_TRY(op, "MPI_Op_create", MPI_Op_create(fmin_fn, 1, &op_fmin));
    MPI_TRY(op, "MPI_Comm_rank", MPI_Comm_rank(comm, rank));
    MPI_TRY(op, "MPI_Comm_size", MPI_Comm_size(comm, size));
    return PN_OK;
}

pn_status pn_mpi_barrier(const char *op) {
    MPI_TRY(op, "MPI_Barrier", MPI_Barrier(comm));
    return PN_OK;
}

pn_status pn_mpi_all_reduce(const char *op, void *p, int64_t n, int dtype, int red) {
    MPI_Op mop = red == PN_SUM ? MPI_SUM : red == PN_MAX ? MPI_MAX : MPI_MIN;
    if (pn_is_float(dtype) && red == PN_MAX) mop = op_fmax;
    if (pn_is_float(dtype) && red == PN_MIN) mop = op_fmin;
    size_t es = pn_elsize(dtype);
    for (int64_t at = 0; at < n; at += chunk) {
        int cnt = (int)(n - at < chunk ? n - at : chunk);
        MPI_TRY(op, "MPI_Allreduce",
                MPI_Allreduce(MPI_IN_PLACE, (char *)p + (size_t)at * es, cnt, mpi_type(dtype), mop, comm));
    }
    return PN_OK;
}

pn_status pn_mpi_broadcast(const char *op, void *p, int64_t n, int dtype, int root) {
    size_t es = pn_elsize(dtype);
    for (int64_t at = 0; at < n; at += chunk) {
        int cnt = (int)(n - at < chunk ? n - at : chunk);
        MPI_TRY(op, "MPI_Bcast", MPI_Bcast((char *)p + (size_t)at * es, cnt, mpi_type(dtype), root, comm));
    }
    return PN_OK;
}

pn_status pn_mpi_all_gather(const char *op, const void *in, void *out, int64_t n, int dtype) {
    int size = 1, rank = 0;
    MPI_TRY(op, "MPI_Comm_size", MPI_Comm_size(comm, &size));
    MPI_TRY(op, "MPI_Comm_rank", MPI_Comm_rank(comm, &rank));
    size_t es = pn_elsize(dtype);
    if (n <= chunk / size) { /* the usual case: one call */
        MPI_TRY(op, "MPI_Allgather",
                MPI_Allgather(in, (int)n, mpi_type(dtype), out, (int)n, mpi_type(dtype), comm));
        return PN_OK;
    }
    /* beyond int counts (MPI_Allgather's counts and the offsets r · count are int): each rank's
     * block in turn, broadcast from its rank in pieces */
    memcpy((char *)out + (size_t)rank * (size_t)n * es, in, (size_t)n * es);
    for (int r = 0; r < size; r++)
        PN_TRY(pn_mpi_broadcast(op, (char *)out + (size_t)r * (size_t)n * es, n, dtype, r));
    return PN_OK;
}

void pn_mpi_abort(int code) {
    MPI_Abort(comm != MPI_COMM_NULL ? comm : MPI_COMM_WORLD, code);
    _Exit(code); /* MPI_Abort does not return; should it, the process still ends */
}

#else /* no MPI in this build: dist.c runs single processes without calling here */

static pn_status no_mpi(void) {
    return pn_error(PN_ERR_STATE,
                    "dist: this process was started by an MPI launcher (mpirun) but libpenumbra was built "
                    "without MPI; run: %s, then rebuild (remove the build folder; ./bench rebuilds)",
                    PN_MPI_APT_LINE);
}
int pn_mpi_built(void) { return 0; }
pn_status pn_mpi_init(int *rank, int *size) { return no_mpi(); }
pn_status pn_mpi_barrier(const char *op) { return no_mpi(); }
pn_status pn_mpi_all_reduce(const char *op, void *p, int64_t n, int dtype, int red) { return no_mpi(); }
pn_status pn_mpi_broadcast(const char *op, void *p, int64_t n, int dtype, int root) { return no_mpi(); }
pn_status pn_mpi_all_gather(const char *op, const void *in, void *out, int64_t n, int dtype) { return no_mpi(); }
void pn_mpi_abort(int code) { _Exit(code); }

#endif

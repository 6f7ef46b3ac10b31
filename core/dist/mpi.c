/* mpi.c — the MPI engine of pn_dist_* (Open MPI: Debian openmpi-bin, libopenmpi-dev).
 *
 * Built with MPI when CMake finds it (PN_HAVE_MPI); otherwise every entry point is a stub whose
 * error names the apt-get line. dist.c has checked the arguments; here are only the MPI calls,
 * on a private duplicate of MPI_COMM_WORLD whose error handler returns errors (translated to
 * pn_error messages) instead of killing the job.
 *
 * Waiting. A blocking collective cannot be left: a rank whose peer died (SIGKILL, a crash in C)
 * or hangs would wait in it until mpirun kills it, its run file still open. So every collective
 * is started in its non-blocking form (MPI_Iallreduce, MPI_Ibcast, MPI_Iallgather, MPI_Ibarrier)
 * and wait_for() polls it with MPI_Test, which also lets the wait end with an error:
 *  - a rank on this machine is gone (its pid no longer exists: kill(pid, 0) — the ranks swap
 *    pids at init, with the machine's boot id and pid namespace, so a pid is only checked where
 *    it means the same process). mpirun sees a dead rank too, but tells the others only by a
 *    SIGTERM a second later (SIGCONT at once, SIGTERM 1 s later, SIGKILL 1 s after that — the
 *    second of Open MPI's odls_base_sigkill_timeout);
 *  - a stop signal arrived (pn_interrupted: the runner's handler for SIGINT/SIGTERM/SIGHUP; mpirun
 *    sends SIGTERM to every rank when one dies, on Ctrl-C and on its own SIGTERM, alike) and the
 *    collective has not completed SIGNAL_GRACE_S later — the grace lets ranks that are all
 *    stopping finish the exchange they are in, so they agree on the interrupt (penumbra/ddp.lua);
 *  - the timeout (pn_dist_timeout: PENUMBRA_DIST_TIMEOUT, pn_dist_set_timeout; 0 = none) passed;
 *  - MPI returned an error.
 * MPI cannot cancel a collective, so the request given up stays pending, and a later collective
 * could pair with the wrong messages: after a failure every call here fails at once with the first
 * message (pn_mpi_failure says why; dist.c keeps the abandoned buffers allocated, since a late
 * peer could still write into them), and MPI_Finalize is skipped at exit (it would wait for the
 * lost rank; mpirun ends the others when a rank exits without it).
 *
 * Open MPI's libnbc (the non-blocking collectives) picks a binomial tree for every in-place
 * Iallreduce and for any on fewer than 4 ranks: a reduce to rank 0 then a broadcast, twice the
 * traffic through one rank — measured on 2 ranks, about 2× the time of the blocking MPI_Allreduce
 * at 16 MB. Its choice is a control variable (coll_libnbc_iallreduce_algorithm) that MPI_T can
 * set at run time, so unless the user set it (OMPI_MCA_… in the environment) each all-reduce asks
 * for recursive doubling below ALG_SWITCH_BYTES (one exchange round: the lowest latency) and for
 * Rabenseifner's reduce-scatter + all-gather from there (bandwidth-optimal; libnbc falls back to
 * a ring where it does not apply). Every rank switches alike: the sizes were agreed (dist.c).
 * Measured with these on 2 ranks, the non-blocking path matches the blocking one at 64 KB, is
 * faster at 16 MB, and costs about 1 µs more per call at 1–4 KB (dist.c carries the smallest
 * all-reduces with its agreement instead: README "Several processes (MPI)"). */
#define _POSIX_C_SOURCE 200809L
#include "dist/dist.h"

#ifdef PN_HAVE_MPI

#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static MPI_Comm comm = MPI_COMM_NULL;
static int we_initialised; /* MPI_Finalize is ours to call only when MPI_Init was */
static MPI_Op op_fmax = MPI_OP_NULL, op_fmin = MPI_OP_NULL;
static int my_rank, n_ranks = 1;

/* the ranks this process can watch: pid per rank (0: itself, or one it cannot see) */
static pid_t *peer_pid;
static int remote_peers; /* ranks it cannot watch (another machine or pid namespace) */

/* the first failure of a wait (PN_DIST_*; 0 = none): every later call repeats it */
static int failure;
static int lost_rank = -1;
static char failure_msg[1024];

/* The wait: MPI_Test for SPIN_S + bytes · SPIN_PER_BYTE (while the data could still be moving
 * at ~1 GB/s, progress calls are what move it: a large message's rendezvous and pipeline steps
 * each need one, and naps there slowed a 1 MB all-reduce 2×), then naps of NAP_MIN_NS doubling
 * to NAP_MAX_NS — past that the wait is for a late rank, and the core is better left to the
 * ranks that compute. The peers, the signal flag and the clock are looked at every WATCH_S, the
 * first time WATCH_S in (a kill() per peer in every call would cost the small collectives ~1 µs). */
#define SPIN_S 200e-6
#define SPIN_PER_BYTE 1e-9
#define NAP_MIN_NS 50000L
#define NAP_MAX_NS 200000L
#define WATCH_S 0.01
#define SIGNAL_GRACE_S 0.25

/* libnbc's Iallreduce algorithm (top of the file): its MPI_T handle, or none where this MPI has
 * no such variable or the user chose; the value last written */
#define ALG_SWITCH_BYTES 4096
enum { ALG_RABENSEIFNER = 3, ALG_RECURSIVE_DOUBLING = 4 }; /* libnbc's numbers */
static MPI_T_cvar_handle alg_handle;
static int alg_set, alg_now = -1, mpit_started;

static void alg_init(void) {
    int provided = 0, idx = 0, count = 0;
    if (getenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm")) return; /* the user's choice */
    if (MPI_T_init_thread(MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) return;
    mpit_started = 1;
    if (MPI_T_cvar_get_index("coll_libnbc_iallreduce_algorithm", &idx) != MPI_SUCCESS) return;
    if (MPI_T_cvar_handle_alloc(idx, NULL, &alg_handle, &count) != MPI_SUCCESS || count != 1) return;
    alg_set = 1;
}

static void alg_for(size_t bytes) {
    int want = bytes < ALG_SWITCH_BYTES ? ALG_RECURSIVE_DOUBLING : ALG_RABENSEIFNER;
    if (!alg_set || want == alg_now) return;
    if (MPI_T_cvar_write(alg_handle, &want) == MPI_SUCCESS) alg_now = want;
}

/* MPI counts are int: bigger buffers go in pieces of at most `chunk` elements (2^30; the
 * environment's PENUMBRA_DIST_CHUNK, read once, makes them small so specs run this path) */
static int64_t chunk = (int64_t)1 << 30;
static void read_chunk(void) {
    const char *e = getenv("PENUMBRA_DIST_CHUNK");
    long long v = e ? atoll(e) : 0;
    if (v >= 1 && v <= INT_MAX) chunk = v;
}

int pn_mpi_built(void) { return 1; }
int pn_mpi_failure(void) { return failure; }
int pn_mpi_lost_rank(void) { return lost_rank; }

/* records the failure (the first one's message stays) and returns it as the error */
static pn_status give_up(int why, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static pn_status give_up(int why, const char *fmt, ...) {
    if (!failure) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(failure_msg, sizeof failure_msg, fmt, ap);
        va_end(ap);
        failure = why;
    }
    return pn_error(PN_ERR_STATE, "%s", failure_msg);
}

static pn_status mpi_error(const char *op, const char *call, int rc) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "error code %d", rc);
    return give_up(PN_DIST_MPI_ERROR, "%s: %s failed: %s", op, call, s);
}
#define MPI_TRY(op, call, expr)                             \
    do {                                                    \
        int mpi_rc_ = (expr);                               \
        if (mpi_rc_ != MPI_SUCCESS) return mpi_error(op, call, mpi_rc_); \
    } while (0)

/* after a failure: refuse, naming the first one */
static pn_status refuse(const char *op) {
    return pn_error(PN_ERR_STATE, "%s: the ranks can no longer exchange data in this process: an earlier collective "
                    "gave up (%s)", op, failure_msg);
}
#define CHECK_USABLE(op)                 \
    do {                                 \
        if (failure) return refuse(op);  \
    } while (0)

static double mono_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static const char *signal_name(int sig) {
    static char other[32];
    switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: snprintf(other, sizeof other, "signal %d", sig); return other;
    }
}

/* a watched rank whose process no longer exists, or −1 (EPERM: it exists, owned by another user) */
static int gone_peer(void) {
    if (!peer_pid) return -1;
    for (int r = 0; r < n_ranks; r++)
        if (peer_pid[r] > 0 && kill(peer_pid[r], 0) != 0 && errno == ESRCH) return r;
    return -1;
}

void pn_mpi_watch_start(pn_mpi_watch_t *w) {
    w->t0 = mono_now();
    w->watch = w->t0 + WATCH_S;
    w->signalled = -1;
}

/* the checks of a wait (top of the file), every WATCH_S: PN_OK while it may go on */
pn_status pn_mpi_watch(const char *op, pn_mpi_watch_t *w) {
    double t = mono_now(), limit = pn_dist_timeout();
    if (t < w->watch) return PN_OK;
    w->watch = t + WATCH_S;
    int r = gone_peer();
    if (r >= 0) {
        lost_rank = r;
        return give_up(PN_DIST_PEER_GONE, "%s: rank %d of %d (pid %ld, on this machine) is gone: it ended while "
                       "this rank waited for it; its own output says why", op, r, n_ranks, (long)peer_pid[r]);
    }
    int sig = pn_interrupted();
    if (sig && w->signalled < 0) w->signalled = t;
    if (sig && t - w->signalled >= SIGNAL_GRACE_S)
        return give_up(PN_DIST_SIGNAL, "%s: interrupted (%s) while waiting for the other ranks — %s", op,
                       signal_name(sig), remote_peers ?
                       "the job was stopped, or a rank on another machine died (its own output says)" :
                       "the job was stopped (every other rank runs on this machine and is still there)");
    if (limit > 0 && t - w->t0 >= limit)
        return give_up(PN_DIST_TIMEOUT, "%s: no reply from the other ranks in %g s — a rank hangs, is far "
                       "behind, or called another collective; PENUMBRA_DIST_TIMEOUT or pn.dist.set_timeout(s) "
                       "sets the limit (0: none)", op, limit);
    return PN_OK;
}

pn_status pn_mpi_fail(int why, const char *msg) { return give_up(why, "%s", msg); }

void pn_mpi_nap(long *nap_ns) {
    if (*nap_ns < NAP_MIN_NS) *nap_ns = NAP_MIN_NS;
    struct timespec ts = { 0, *nap_ns };
    nanosleep(&ts, NULL);
    if (*nap_ns < NAP_MAX_NS) *nap_ns *= 2;
}

/* Waits for req (a collective moving `bytes` bytes from this rank), see the top of the file; op
 * names the call in the messages (dist.c: "dist.all_reduce (24 bytes)"). */
static pn_status wait_for(const char *op, MPI_Request *req, size_t bytes) {
    pn_mpi_watch_t w;
    pn_mpi_watch_start(&w);
    const double spin = SPIN_S + SPIN_PER_BYTE * (double)bytes;
    long nap = 0;
    for (;;) {
        int done = 0, rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_error(op, "MPI_Test", rc);
        if (done) return PN_OK;
        PN_TRY(pn_mpi_watch(op, &w));
        if (mono_now() - w.t0 >= spin) pn_mpi_nap(&nap);
    }
}

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

/* What makes a pid here mean the same process there: the kernel (its boot id) and the pid
 * namespace; "" where /proc cannot say (then no rank is watched). */
#define PEER_ID 112
static void machine_id(char *out) {
    char boot[64] = "", ns[48] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) boot[0] = 0;
        fclose(f);
    }
    boot[strcspn(boot, "\n")] = 0;
    ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
    ns[n > 0 ? n : 0] = 0;
    memset(out, 0, PEER_ID);
    if (boot[0] && ns[0]) snprintf(out, PEER_ID, "%s %s", boot, ns);
}

/* every rank's pid and machine: which ranks this one can watch */
static pn_status learn_peers(const char *op) {
    enum { REC = 8 + PEER_ID };
    char *all = malloc((size_t)n_ranks * REC), mine[REC];
    if (!all) return pn_error(PN_ERR_OOM, "%s: out of memory for %d ranks' pids", op, n_ranks);
    int64_t pid = (int64_t)getpid();
    memcpy(mine, &pid, 8);
    machine_id(mine + 8);
    MPI_Request req;
    int rc = MPI_Iallgather(mine, REC, MPI_BYTE, all, REC, MPI_BYTE, comm, &req);
    pn_status st = rc != MPI_SUCCESS ? mpi_error(op, "MPI_Iallgather", rc) : wait_for(op, &req, REC);
    if (st) return st; /* `all` stays: the request may still write into it */
    peer_pid = calloc((size_t)n_ranks, sizeof *peer_pid);
    if (!peer_pid) {
        free(all);
        return pn_error(PN_ERR_OOM, "%s: out of memory for %d ranks' pids", op, n_ranks);
    }
    for (int r = 0; r < n_ranks; r++) {
        const char *rec = all + (size_t)r * REC;
        if (r == my_rank) continue;
        if (mine[8] && memcmp(rec + 8, mine + 8, PEER_ID) == 0) {
            int64_t p;
            memcpy(&p, rec, 8);
            peer_pid[r] = (pid_t)p;
        } else {
            remote_peers++;
        }
    }
    free(all);
    return PN_OK;
}

static void finalize_at_exit(void) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin || failure) return; /* after a failure MPI_Finalize would wait for the lost rank */
    if (op_fmax != MPI_OP_NULL) MPI_Op_free(&op_fmax);
    if (op_fmin != MPI_OP_NULL) MPI_Op_free(&op_fmin);
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
    if (alg_set) MPI_T_cvar_handle_free(&alg_handle);
    if (mpit_started) MPI_T_finalize();
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
    if (!mpit_started) alg_init();
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
    MPI_TRY(op, "MPI_Comm_rank", MPI_Comm_rank(comm, &my_rank));
    MPI_TRY(op, "MPI_Comm_size", MPI_Comm_size(comm, &n_ranks));
    if (!peer_pid && n_ranks > 1) PN_TRY(learn_peers(op));
    *rank = my_rank;
    *size = n_ranks;
    return PN_OK;
}

pn_status pn_mpi_barrier(const char *op) {
    CHECK_USABLE(op);
    MPI_Request req;
    MPI_TRY(op, "MPI_Ibarrier", MPI_Ibarrier(comm, &req));
    return wait_for(op, &req, 0);
}

static MPI_Op mpi_op(int dtype, int red) {
    if (pn_is_float(dtype) && red == PN_MAX) return op_fmax;
    if (pn_is_float(dtype) && red == PN_MIN) return op_fmin;
    return red == PN_SUM ? MPI_SUM : red == PN_MAX ? MPI_MAX : MPI_MIN;
}

pn_status pn_mpi_reduce_local(const char *op, const void *in, void *inout, int64_t n, int dtype, int red) {
    size_t es = pn_elsize(dtype);
    for (int64_t at = 0; at < n; at += chunk) {
        int cnt = (int)(n - at < chunk ? n - at : chunk);
        MPI_TRY(op, "MPI_Reduce_local", MPI_Reduce_local((const char *)in + (size_t)at * es,
                                                         (char *)inout + (size_t)at * es, cnt, mpi_type(dtype),
                                                         mpi_op(dtype, red)));
    }
    return PN_OK;
}

pn_status pn_mpi_all_reduce(const char *op, void *p, int64_t n, int dtype, int red) {
    CHECK_USABLE(op);
    MPI_Op mop = mpi_op(dtype, red);
    size_t es = pn_elsize(dtype);
    for (int64_t at = 0; at < n; at += chunk) {
        int cnt = (int)(n - at < chunk ? n - at : chunk);
        MPI_Request req;
        alg_for((size_t)cnt * es);
        MPI_TRY(op, "MPI_Iallreduce",
                MPI_Iallreduce(MPI_IN_PLACE, (char *)p + (size_t)at * es, cnt, mpi_type(dtype), mop, comm, &req));
        PN_TRY(wait_for(op, &req, (size_t)cnt * es));
    }
    return PN_OK;
}

/* The started form (core/dist/reducer.c: a bucket sent while the backward goes on). One MPI
 * request when n fits an MPI count; a larger buffer goes the blocking way above and *req is NULL
 * (complete). The request lives in a malloc'd MPI_Request until pn_mpi_test or pn_mpi_wait sees
 * it complete; one given up is kept (MPI may still write into p, and into the request). */
pn_status pn_mpi_all_reduce_start(const char *op, void *p, int64_t n, int dtype, int red, void **req) {
    *req = NULL;
    CHECK_USABLE(op);
    if (n > chunk) return pn_mpi_all_reduce(op, p, n, dtype, red);
    MPI_Request *r = malloc(sizeof *r);
    if (!r) return pn_error(PN_ERR_OOM, "%s: out of memory for an MPI request", op);
    alg_for((size_t)n * pn_elsize(dtype));
    int rc = MPI_Iallreduce(MPI_IN_PLACE, p, (int)n, mpi_type(dtype), mpi_op(dtype, red), comm, r);
    if (rc != MPI_SUCCESS) {
        free(r);
        return mpi_error(op, "MPI_Iallreduce", rc);
    }
    *req = r;
    return PN_OK;
}

/* one MPI_Test: moves every started collective on (libnbc progresses them all); *req NULL once done */
pn_status pn_mpi_test(const char *op, void **req) {
    if (!*req) return PN_OK;
    CHECK_USABLE(op);
    int done = 0, rc = MPI_Test((MPI_Request *)*req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_error(op, "MPI_Test", rc);
    if (done) {
        free(*req);
        *req = NULL;
    }
    return PN_OK;
}

pn_status pn_mpi_wait(const char *op, void **req, size_t bytes) {
    if (!*req) return PN_OK;
    CHECK_USABLE(op);
    PN_TRY(wait_for(op, (MPI_Request *)*req, bytes));
    free(*req);
    *req = NULL;
    return PN_OK;
}

pn_status pn_mpi_broadcast(const char *op, void *p, int64_t n, int dtype, int root) {
    CHECK_USABLE(op);
    size_t es = pn_elsize(dtype);
    for (int64_t at = 0; at < n; at += chunk) {
        int cnt = (int)(n - at < chunk ? n - at : chunk);
        MPI_Request req;
        MPI_TRY(op, "MPI_Ibcast", MPI_Ibcast((char *)p + (size_t)at * es, cnt, mpi_type(dtype), root, comm, &req));
        PN_TRY(wait_for(op, &req, (size_t)cnt * es));
    }
    return PN_OK;
}

pn_status pn_mpi_all_gather(const char *op, const void *in, void *out, int64_t n, int dtype) {
    CHECK_USABLE(op);
    size_t es = pn_elsize(dtype);
    if (n <= chunk / n_ranks) { /* the usual case: one call */
        MPI_Request req;
        MPI_TRY(op, "MPI_Iallgather",
                MPI_Iallgather(in, (int)n, mpi_type(dtype), out, (int)n, mpi_type(dtype), comm, &req));
        return wait_for(op, &req, (size_t)n * es * (size_t)n_ranks);
    }
    /* beyond int counts (MPI_Allgather's counts and the offsets r · count are int): each rank's
     * block in turn, broadcast from its rank in pieces */
    memcpy((char *)out + (size_t)my_rank * (size_t)n * es, in, (size_t)n * es);
    for (int r = 0; r < n_ranks; r++)
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
int pn_mpi_failure(void) { return 0; }
int pn_mpi_lost_rank(void) { return -1; }
pn_status pn_mpi_init(int *rank, int *size) { return no_mpi(); }
pn_status pn_mpi_barrier(const char *op) { return no_mpi(); }
pn_status pn_mpi_all_reduce(const char *op, void *p, int64_t n, int dtype, int red) { return no_mpi(); }
pn_status pn_mpi_broadcast(const char *op, void *p, int64_t n, int dtype, int root) { return no_mpi(); }
pn_status pn_mpi_all_reduce_start(const char *op, void *p, int64_t n, int dtype, int red, void **req) {
    *req = NULL;
    return no_mpi();
}
pn_status pn_mpi_test(const char *op, void **req) { return PN_OK; }
pn_status pn_mpi_wait(const char *op, void **req, size_t bytes) { return PN_OK; }
pn_status pn_mpi_reduce_local(const char *op, const void *in, void *inout, int64_t n, int dtype, int red) {
    return no_mpi();
}
pn_status pn_mpi_all_gather(const char *op, const void *in, void *out, int64_t n, int dtype) { return no_mpi(); }
void pn_mpi_abort(int code) { _Exit(code); }
void pn_mpi_watch_start(pn_mpi_watch_t *w) { w->t0 = w->watch = 0, w->signalled = -1; }
pn_status pn_mpi_watch(const char *op, pn_mpi_watch_t *w) { return PN_OK; }
pn_status pn_mpi_fail(int why, const char *msg) { return pn_error(PN_ERR_STATE, "%s", msg); }
void pn_mpi_nap(long *nap_ns) {}

#endif

/* penumbra.h — THE public interface of libpenumbra.
 *
 * This header is also the FFI contract: the build preprocesses it with -DPN_FFI
 * (gcc -E -P) and bindings/ feeds the result to ffi.cdef. So: plain C declarations
 * only, no inline code, no system includes outside the #ifndef PN_FFI block.
 *
 * Conventions (DESIGN §2):
 *  - a function returning pn_tensor * hands the caller ONE reference (release it
 *    with pn_release); NULL means error, and pn_last_error() says why.
 *  - a function returning pn_status returns PN_OK or an error code, same message.
 *  - dims are 0-based here; negative dims count from the end (-1 = last).
 *    The Lua layer converts its 1-based dims before calling.
 *  - arguments marked "borrowed" are not consumed: the caller keeps its reference.
 */
#ifndef PENUMBRA_H
#define PENUMBRA_H

#ifndef PN_FFI
#include <stddef.h>
#include <stdint.h>
#endif

#define PN_MAX_DIMS 8

#if defined(__cplusplus) && !defined(PN_FFI)
extern "C" { /* C linkage for core/cuda/ and core/text/spm.cc */
#endif

typedef enum { PN_F32 = 0, PN_F64 = 1, PN_I32 = 2, PN_I64 = 3, PN_U8 = 4 } pn_dtype;
typedef enum { PN_CPU = 0, PN_CUDA = 1 } pn_device;

typedef enum {
    PN_OK = 0,
    PN_ERR_ARG = 1,    /* bad argument value */
    PN_ERR_SHAPE = 2,  /* shapes do not fit */
    PN_ERR_DTYPE = 3,  /* wrong dtype */
    PN_ERR_INDEX = 4,  /* index out of range */
    PN_ERR_OOM = 5,    /* allocation failed */
    PN_ERR_IO = 6,     /* file / HDF5 problem */
    PN_ERR_STATE = 7,  /* e.g. backward through a freed graph */
    PN_ERR_DEVICE = 8  /* device not available / mismatch */
} pn_status;

typedef struct pn_storage pn_storage;
typedef struct pn_node pn_node;

/* A strided view of a refcounted storage. Fields are public so the FFI reads
 * them without calls; only the core writes them. Field names deliberately
 * differ from the Lua method names (t:shape(), t:dtype(), t.grad …). */
typedef struct pn_tensor {
    int64_t sizes[PN_MAX_DIMS];   /* shape, nd entries used */
    int64_t strides[PN_MAX_DIMS]; /* in elements */
    int64_t offset;               /* in elements, into storage */
    int32_t nd;                   /* number of dims, 0 = scalar */
    int32_t dt;                   /* pn_dtype */
    int32_t dev;                  /* pn_device */
    int32_t req_grad;             /* leaf asks for a gradient */
    int64_t refcount;
    pn_storage *storage;
    struct pn_tensor *gradt;      /* accumulated gradient of a leaf, or NULL */
    pn_node *fn;                  /* autograd node that produced this tensor, or NULL */
} pn_tensor;

/* ---- errors, memory accounting, threads ------------------------------------ */
const char *pn_last_error(void);
void pn_clear_error(void);
int64_t pn_live_tensors(void);       /* tensor structs alive */
int64_t pn_live_bytes(void);         /* storage bytes alive (all devices) */
int64_t pn_live_nodes(void);         /* autograd nodes alive */
int pn_num_threads(void);
void pn_set_num_threads(int n);
/* Flush subnormal floats to zero (x86 MXCSR FTZ + DAZ) on the calling thread and every CPU
 * thread of the pool, or restore IEEE subnormals (core/fpmode.c says why and what it changes).
 * Returns 1, or 0 where the CPU has no such mode (nothing changes). pn_flush_denormal: the
 * calling thread's mode (1: flushing). */
int pn_set_flush_denormal(int on);
int pn_flush_denormal(void);
const char *pn_version(void);
/* The CPU attention kernels' register-blocked f32 GEMM (core/attention/microkernel.h): "avx512",
 * "avx2" or "portable" — the widest this CPU runs unless PENUMBRA_CPU_KERNEL or
 * pn_set_cpu_kernel chose ("auto" = the widest); "" with the error set when the environment
 * variable names an unknown kernel or one the CPU cannot run. */
const char *pn_cpu_kernel(void);
pn_status pn_set_cpu_kernel(const char *name);
/* Stopping long runs: after pn_interrupt_install a first SIGINT, SIGTERM or SIGHUP only sets a
 * flag that the experiment loop polls (pn_interrupted returns the signal number, 0 when none)
 * and writes one line to stderr saying so; a second one (of any of the three) terminates as
 * usual. */
void pn_interrupt_install(void);
int pn_interrupted(void);
void pn_interrupt_clear(void);
/* ---- CUDA (core/cuda; DESIGN §8) ------------------------------------------------
 * available: a CUDA device can run penumbra's kernels (a GPU, or the kernel interpreter of a
 * -DPN_CUDA_EMU=ON build); interpreted: it is the interpreter. The rest fail with a
 * PN_ERR_DEVICE message where there is no device. */
int pn_cuda_available(void);
int pn_cuda_interpreted(void);
const char *pn_cuda_device_name(void);          /* "" where there is none */
typedef struct pn_cuda_memory_stats {
    int64_t allocated;    /* bytes held by live tensors (as asked for) */
    int64_t reserved;     /* bytes obtained from cudaMalloc and not returned (cache included) */
    int64_t peak;         /* the most `allocated` has been since start or the last reset */
    int64_t malloc_calls; /* cudaMalloc calls since start */
    int64_t free_calls;   /* cudaFree calls since start */
    int64_t blocks;       /* live allocations */
} pn_cuda_memory_stats;
pn_status pn_cuda_memory_stats_get(pn_cuda_memory_stats *out);
pn_status pn_cuda_reset_peak(void);
pn_status pn_cuda_empty_cache(void);            /* cudaFree every cached (unused) block */
pn_status pn_cuda_synchronize(void);            /* wait for queued work; reports kernel errors */
/* f32 matmul on CUDA in TF32 (10-bit mantissa inputs, f32 accumulation: tensor cores, ~1e-3
 * relative error) when on; off (exact f32) by default. Returns the previous setting. */
int pn_cuda_set_tf32(int on);
/* The interpreter's thread order between barriers: "fwd", "rev" or "rand:SEED" (NULL or ""
 * = fwd); pn_cuda_emu_schedule_name says which is in force. */
pn_status pn_cuda_emu_schedule(const char *spec);
const char *pn_cuda_emu_schedule_name(void);
/* The device memory the interpreter reports and lets cudaMalloc hand out, in bytes (0: its
 * default, 80 GiB; < 0: unchanged); *prev gets the size before and *used what cudaMalloc has
 * handed out (either may be NULL). An error on a GPU. */
pn_status pn_cuda_emu_device_memory(int64_t bytes, int64_t *prev, int64_t *used);
/* The interpreter's planted-bug cases (core/cuda/emu/selftest.cu): runs case name, writes up
 * to n result values to out; the interpreter's report as the error when it caught one. */
pn_status pn_cuda_emu_selftest(const char *name, double *out, int64_t n);
/* One warp's PTX mma.sync m16n8k16 (core/cuda/mma_ptx.cuh) on a (16 × 16), b (16 × 8: k × n)
 * and c (16 × 8), row-major f32 rounded to bf16 (half = 0) or f16 (half = 1), the registers
 * packed by each lane as the documented layout says (ldmatrix = 0) or loaded from shared memory
 * by ldmatrix (1): d (16 × 8) = a·b + c — the check of that layout. */
pn_status pn_cuda_mma_check(int half, int ldmatrix, const float *a, const float *b, const float *c, float *d);
/* One warp's PTX mma.sync m8n8k4 .f64 (mma_ptx.cuh's pn_dmma_884) on a (8 × 4), b (4 × 8) and
 * c (8 × 8), row-major f64: d (8 × 8) = a·b + c — the check of that layout. */
pn_status pn_cuda_dmma_check(const double *a, const double *b, const double *c, double *d);
/* The device kernels (core/kernels.def), for listing what a backend has: their number, the name
 * of kernel i (0-based; NULL out of range), and whether device dev has it (1), lacks it (0) or
 * is not built in (-1). */
int pn_kernel_count(void);
const char *pn_kernel_name(int i);
int pn_kernel_present(int dev, int i);
/* ---- several processes (dist/dist.c over dist/mpi.c; README "Several processes (MPI)") ------
 * Ranks count from 0. A process an MPI launcher started (`./bench -n N`, mpirun) joins MPI on
 * the first call (MPI_Init_thread; MPI_Finalize runs at exit); any other process is rank 0 of 1
 * and never touches MPI (all_reduce and broadcast leave t as it is). Collectives: every rank
 * calls them in the same order with the same shape, dtype, op and root — they compare these
 * first, and a mismatch, or an argument one rank refused, is an error on every rank naming the
 * rank (not a hang). CPU tensors, and cuda tensors where the build has NCCL; any strides; nothing is
 * recorded by autograd. Without MPI in the build, a launched process gets an error naming the
 * apt-get line. */
int pn_dist_built(void);        /* 1 when this libpenumbra links MPI */
int pn_dist_nccl_built(void);   /* 1 when it has the NCCL engine: the collectives take cuda tensors too */
int pn_dist_launched(void);     /* 1 when an MPI launcher started this process (its environment says so) */
pn_status pn_dist_init(void);   /* idempotent; the calls below run it first */
int pn_dist_active(void);       /* joined MPI with more than one rank (does not initialise) */
int pn_dist_rank(void);         /* −1 on error */
int pn_dist_size(void);         /* −1 on error */
pn_status pn_dist_barrier(void);
/* in place over every rank; op (pn_reduce_op) PN_SUM, PN_MEAN (f32/f64), PN_MAX, PN_MIN (NaN wins);
 * integer sums are not checked for overflow */
pn_status pn_dist_all_reduce(pn_tensor *t, int op);
pn_status pn_dist_broadcast(pn_tensor *t, int root);   /* in place: root's values on every rank */
pn_tensor *pn_dist_all_gather(pn_tensor *t);           /* (…) → (size, …): rank r's t at [r] */
/* Prints "penumbra: rank R of N: msg" on stderr and ends every rank (MPI_Abort; exit status
 * code, 1 when 0). Returns an error, and does nothing else, when not active. */
pn_status pn_dist_abort(const char *msg, int code);
/* A rank waits in a collective for the others at most pn_dist_timeout() seconds (default 300;
 * PENUMBRA_DIST_TIMEOUT, read at the first call, or pn_dist_set_timeout; 0 = forever). The wait
 * also ends, with an error naming the collective, when a rank on this machine is gone (its
 * process ended), when a stop signal arrived (pn_interrupt_install: mpirun sends SIGTERM to every
 * rank when one dies and when the job is stopped) and the collective has not completed 0.25 s
 * later, or when MPI reports an error. After that the ranks cannot exchange any more: every later
 * collective fails at once; pn_dist_failure says why (PN_DIST_OK while they can) and
 * pn_dist_lost_rank which rank was found gone (−1 unless PN_DIST_PEER_GONE). */
typedef enum { PN_DIST_OK = 0, PN_DIST_SIGNAL = 1, PN_DIST_TIMEOUT = 2, PN_DIST_PEER_GONE = 3,
               PN_DIST_MPI_ERROR = 4 } pn_dist_failure_kind;
pn_status pn_dist_set_timeout(double seconds);
double pn_dist_timeout(void);
int pn_dist_failure(void);
int pn_dist_lost_rank(void);
/* The gradients' buckets of data parallelism (core/dist/reducer.c; penumbra/ddp.lua drives it).
 * A reducer holds n parameters (leaves of one device, retained) and flat buffers of one dtype and
 * at most cap_bytes each (the first first_cap_bytes; a larger parameter alone), filled in reverse
 * parameter order and sent
 * in that fixed order. Every rank makes it with the same parameters' shapes and dtypes (checked:
 * an error naming the rank that differs) and calls the rest in the same order. arm(r, w): the next
 * pn_backward sends each bucket — w · this rank's gradients, summed over the ranks — as soon as
 * its parameters' gradients are final, while the backward goes on; finish sends what is left,
 * waits, and writes the sums into the parameters' .grad (a parameter with no gradient on any rank
 * stays without; one with a gradient on some ranks counts zeros for the others). sync(r, w) is
 * arm + finish after the backward (no overlap). broadcast(r, root): root's parameter values to
 * every rank. stats (since made, this process): [0] buckets sent, [1] of them while a backward
 * ran, [2] seconds waiting for them in finish/sync, [3] bytes sent. In one process nothing is
 * exchanged (the sums are this rank's w · gradients). */
typedef struct pn_reducer pn_reducer;
pn_reducer *pn_reducer_new(pn_tensor *const *params, int n, double first_cap_bytes, double cap_bytes);
pn_status pn_reducer_arm(pn_reducer *r, double weight);
pn_status pn_reducer_finish(pn_reducer *r);
pn_status pn_reducer_sync(pn_reducer *r, double weight);
pn_status pn_reducer_broadcast(pn_reducer *r, int root);
int pn_reducer_buckets(const pn_reducer *r);
void pn_reducer_stats(const pn_reducer *r, double *out4);
void pn_reducer_free(pn_reducer *r);

/* ---- lifetime ---------------------------------------------------------------- */
void pn_retain(pn_tensor *t);
void pn_release(pn_tensor *t);
const char *pn_dtype_name(int dtype);
int pn_dtype_size(int dtype);

/* ---- creation ---------------------------------------------------------------- */
pn_tensor *pn_empty(int nd, const int64_t *shape, int dtype, int device);
pn_tensor *pn_zeros(int nd, const int64_t *shape, int dtype, int device);
pn_tensor *pn_full(int nd, const int64_t *shape, double value, int dtype, int device);
pn_tensor *pn_arange(double start, double end, double step, int dtype, int device);
/* copies nbytes = numel*elsize from data (row-major) */
pn_tensor *pn_from_buffer(int nd, const int64_t *shape, int dtype, const void *data);
/* copies t (any strides) row-major into dst, which holds nbytes */
pn_status pn_to_buffer(const pn_tensor *t, void *dst, size_t nbytes);
void *pn_data_ptr(const pn_tensor *t);     /* address of element 0 of the view (CPU) */
int64_t pn_numel(const pn_tensor *t);
int pn_is_contiguous(const pn_tensor *t);
pn_status pn_item(const pn_tensor *t, double *out);      /* one-element tensor → number */
pn_status pn_get(const pn_tensor *t, const int64_t *index, double *out); /* element at index */

/* ---- random (counter-based Philox 4x32-10; same stream for a given seed) ---- */
void pn_manual_seed(uint64_t seed);
uint64_t pn_seed(void);
/* the stream's position (seed, and the counter blocks drawn so far): saved with a run's
 * resume state and set back, so a resumed run draws what the uninterrupted one would have */
void pn_rng_state(uint64_t *seed, uint64_t *offset);
void pn_set_rng_state(uint64_t seed, uint64_t offset);
pn_tensor *pn_rand(int nd, const int64_t *shape, int dtype, int device);   /* U[0,1) */
pn_tensor *pn_randn(int nd, const int64_t *shape, int dtype, int device);  /* N(0,1) */

/* ---- views (share storage; differentiable) ------------------------------------ */
pn_tensor *pn_view(pn_tensor *t, int nd, const int64_t *shape);     /* -1 infers; needs compatible strides */
pn_tensor *pn_reshape(pn_tensor *t, int nd, const int64_t *shape);  /* view when possible, else copy */
pn_tensor *pn_permute(pn_tensor *t, int nd, const int64_t *perm);
pn_tensor *pn_transpose(pn_tensor *t, int dim0, int dim1);
pn_tensor *pn_narrow(pn_tensor *t, int dim, int64_t start, int64_t length);
pn_tensor *pn_select(pn_tensor *t, int dim, int64_t index);        /* drops dim */
pn_tensor *pn_squeeze(pn_tensor *t, int dim);                       /* dim = PN_ALL_DIMS: every size-1 dim */
pn_tensor *pn_unsqueeze(pn_tensor *t, int dim);
pn_tensor *pn_expand(pn_tensor *t, int nd, const int64_t *shape);   /* -1 keeps a size */
pn_tensor *pn_contiguous(pn_tensor *t);   /* new reference to t itself when already contiguous */
pn_tensor *pn_clone(pn_tensor *t);        /* always a fresh contiguous copy (differentiable) */
pn_tensor *pn_to_dtype(pn_tensor *t, int dtype);  /* cast; differentiable between f32/f64 */
pn_tensor *pn_to_device(pn_tensor *t, int device); /* copy to device (t itself when there); differentiable */
enum { PN_ALL_DIMS = 127 }; /* squeeze: every size-1 dim */

/* ---- in-place, never recorded by autograd (optimisers, init) ------------------ */
pn_status pn_copy_(pn_tensor *dst, const pn_tensor *src);      /* src broadcast to dst, cast */
pn_status pn_fill_(pn_tensor *dst, double value);
pn_status pn_axpy_(pn_tensor *y, double alpha, const pn_tensor *x);  /* y += alpha*x (same shape) */
pn_status pn_scale_(pn_tensor *y, double alpha);                     /* y *= alpha */

/* ---- elementwise (ops/elementwise.c) ------------------------------------------- */
typedef enum {
    PN_NEG, PN_ABS, PN_EXP, PN_LOG, PN_LOG1P, PN_SQRT, PN_RSQRT, PN_SIN, PN_COS, PN_TANH,
    PN_SIGMOID, PN_LOGSIGMOID, PN_RELU, PN_ELU, PN_LEAKY_RELU, PN_GELU, PN_SOFTPLUS,
    PN_SINH, PN_COSH, PN_ASINH, PN_ACOSH, PN_ATANH, PN_CLAMP, PN_POW_SCALAR,
    PN_UNARY_COUNT
} pn_unary_op;
/* a, b: ELU alpha; leaky slope; clamp (min, max) with ±inf for none; pow exponent */
pn_tensor *pn_unary(int op, pn_tensor *x, double a, double b);
const char *pn_unary_name(int op);

typedef enum { PN_ADD, PN_SUB, PN_MUL, PN_DIV, PN_POW, PN_MAXIMUM, PN_MINIMUM, PN_BINARY_COUNT } pn_binary_op;
pn_tensor *pn_binary(int op, pn_tensor *a, pn_tensor *b);   /* NumPy broadcasting, same dtype */

typedef enum { PN_EQ, PN_NE, PN_LT, PN_LE, PN_GT, PN_GE } pn_compare_op;
pn_tensor *pn_compare(int op, pn_tensor *a, pn_tensor *b);  /* → u8 */
pn_tensor *pn_where(pn_tensor *cond, pn_tensor *a, pn_tensor *b); /* cond u8, broadcast */

/* ---- reductions (ops/reduce.c; pn_sum_to_shape: autograd.c) ------------------ */
typedef enum { PN_SUM, PN_MEAN, PN_MAX, PN_MIN, PN_LOGSUMEXP, PN_PROD } pn_reduce_op;
/* ndims == 0 reduces over every dim */
pn_tensor *pn_reduce(int op, pn_tensor *x, int ndims, const int64_t *dims, int keepdim);
pn_tensor *pn_argmax(pn_tensor *x, int dim, int keepdim);   /* → i64; dim PN_ALL_DIMS: flat row-major position */
pn_tensor *pn_argmin(pn_tensor *x, int dim, int keepdim);   /* → i64 */
pn_tensor *pn_norm(pn_tensor *x, double p, int ndims, const int64_t *dims, int keepdim);
/* gradient of a broadcast: sums g down to shape (used by every broadcasting backward) */
pn_tensor *pn_sum_to_shape(pn_tensor *g, int nd, const int64_t *shape);

/* ---- linear algebra (ops/matmul.c) ---------------------------------------------- */
/* torch.matmul semantics: 1-D/2-D/N-D with batch broadcasting; OpenBLAS GEMM */
pn_tensor *pn_matmul(pn_tensor *a, pn_tensor *b);
/* torch.nn.functional.linear: x (…, in) @ wᵀ + b with w (out, in), b (out) or NULL → (…, out).
 * The bias is written into the output and the GEMM adds onto it (BLAS's beta = 1), one pass
 * over the output fewer than matmul then add. */
pn_tensor *pn_linear(pn_tensor *x, pn_tensor *w, pn_tensor *b);
/* a (M, K) · b (K, N) for an `a` that is mostly zeros (bag-of-words features: Cora 1.3%
 * dense): work ∝ nonzeros of a instead of M·K. Same values and gradients as pn_matmul. */
pn_tensor *pn_matmul_sparse_lhs(pn_tensor *a, pn_tensor *b);

/* ---- softmax, norms (ops/softmax.c, ops/norm.c) ----------------------------------- */
pn_tensor *pn_softmax(pn_tensor *x, int dim);
pn_tensor *pn_log_softmax(pn_tensor *x, int dim);
/* normalises over the last dim; weight, bias (D) or NULL */
pn_tensor *pn_layer_norm(pn_tensor *x, pn_tensor *weight, pn_tensor *bias, double eps);
/* inverted dropout with the global Philox stream; p = 0 or !train returns x */
pn_tensor *pn_dropout(pn_tensor *x, double p, int train);

/* ---- indexing, graphs (ops/index.c) ---------------------------------------------- */
pn_tensor *pn_embedding(pn_tensor *weight, pn_tensor *idx);         /* weight (V, D), idx any shape i32/i64 */
pn_tensor *pn_index_select(pn_tensor *x, int dim, pn_tensor *idx);   /* idx 1-D */
pn_tensor *pn_gather(pn_tensor *x, int dim, pn_tensor *idx);          /* torch.gather */
pn_tensor *pn_scatter_add(pn_tensor *x, int dim, pn_tensor *idx, pn_tensor *src); /* out-of-place */
pn_tensor *pn_index_add(pn_tensor *x, int dim, pn_tensor *idx, pn_tensor *src);   /* out-of-place */
/* rows of x (dim 0) grouped by CSR offsets (S+1, i32/i64, offsets[0]=0, offsets[S]=rows) */
pn_tensor *pn_segment_sum(pn_tensor *x, pn_tensor *offsets);      /* (E, …) → (S, …) */
pn_tensor *pn_segment_softmax(pn_tensor *x, pn_tensor *offsets);  /* (E, …) → (E, …) */

/* ---- joining (ops/shape.c) ---------------------------------------------------------- */
pn_tensor *pn_cat(int n, pn_tensor **ts, int dim);
pn_tensor *pn_stack(int n, pn_tensor **ts, int dim);

/* ---- losses (ops/loss.c); reduction: 0 none, 1 mean, 2 sum ------------------------ */
typedef enum { PN_REDUCE_NONE = 0, PN_REDUCE_MEAN = 1, PN_REDUCE_SUM = 2 } pn_reduction;
/* logits (N, C), target (N) i32/i64; mean is over non-ignored rows */
pn_tensor *pn_cross_entropy(pn_tensor *logits, pn_tensor *target, double label_smoothing,
                            int64_t ignore_index, int reduction);
pn_tensor *pn_nll_loss(pn_tensor *logp, pn_tensor *target, int64_t ignore_index, int reduction);
pn_tensor *pn_bce_with_logits(pn_tensor *x, pn_tensor *y, int reduction);
pn_tensor *pn_mse_loss(pn_tensor *x, pn_tensor *y, int reduction);

/* ---- optimiser steps (ops/optim.c): in place, not recorded; p, g, state same shape/dtype ---- */
/* Adam (decoupled = 0: L2 weight decay added to g) / AdamW (decoupled = 1); step counts from 1 */
pn_status pn_adam_step_(pn_tensor *p, const pn_tensor *g, pn_tensor *m, pn_tensor *v, double lr, double beta1,
                        double beta2, double eps, double weight_decay, int decoupled, int64_t step);
/* SGD with optional momentum buffer (NULL when momentum = 0), dampening, nesterov, L2 decay */
pn_status pn_sgd_step_(pn_tensor *p, const pn_tensor *g, pn_tensor *buf, double lr, double momentum,
                       double dampening, double weight_decay, int nesterov, int first_step);

/* ---- autograd (autograd.c) ---------------------------------------------------------- */
int pn_grad_enabled(void);
int pn_set_grad_enabled(int enabled);           /* returns the previous mode */
pn_status pn_set_requires_grad(pn_tensor *t, int flag);   /* leaves only */
int pn_requires_grad(const pn_tensor *t);       /* leaf flag or produced by a recorded op */
pn_tensor *pn_grad(pn_tensor *t);               /* new reference to t's .grad, or NULL (no error) */
pn_status pn_set_grad(pn_tensor *t, pn_tensor *g);  /* g borrowed (NULL clears) */
pn_tensor *pn_detach(pn_tensor *t);             /* same storage, no history */
/* grad NULL means ones (t must have one element); retain != 0 keeps the graph */
pn_status pn_backward(pn_tensor *t, pn_tensor *grad, int retain_graph);
const char *pn_grad_fn_name(const pn_tensor *t);   /* "" for leaves */

/* ---- HDF5 (io/h5.c) ------------------------------------------------------------------- */
typedef struct pn_h5 pn_h5;
pn_h5 *pn_h5_open(const char *path, const char *mode);   /* "r", "w" (truncate), "a" (create or append) */
void pn_h5_close(pn_h5 *f);
/* name may contain groups ("params/layer1/w"); missing groups are created. level 0..9 gzip, 0 = none */
pn_status pn_h5_write(pn_h5 *f, const char *name, const pn_tensor *t, int gzip_level);
pn_tensor *pn_h5_read(pn_h5 *f, const char *name);
int pn_h5_exists(pn_h5 *f, const char *name);
/* newline-separated names of datasets under group (recursively), written into buf; returns
 * the length needed (call again with a bigger buffer when it exceeds size), -1 on error */
int64_t pn_h5_list(pn_h5 *f, const char *group, char *buf, int64_t size);
/* attributes of an object ("/" for the root): kind 0 missing, 1 string, 2 numeric */
int pn_h5_attr_kind(pn_h5 *f, const char *obj, const char *attr);
int64_t pn_h5_attr_names(pn_h5 *f, const char *obj, char *buf, int64_t size);
int64_t pn_h5_attr_string(pn_h5 *f, const char *obj, const char *attr, char *buf, int64_t size);
pn_tensor *pn_h5_attr_tensor(pn_h5 *f, const char *obj, const char *attr);
pn_status pn_h5_set_attr_string(pn_h5 *f, const char *obj, const char *attr, const char *value);
pn_status pn_h5_set_attr_tensor(pn_h5 *f, const char *obj, const char *attr, const pn_tensor *t);
pn_status pn_h5_flush(pn_h5 *f);
/* Append t along dim 0 of an extendable (chunked, unlimited) dataset, creating it from t on
 * first use; the other dims and the dtype must match. Run-file metrics grow this way. */
pn_status pn_h5_append(pn_h5 *f, const char *name, const pn_tensor *t);
pn_status pn_h5_delete(pn_h5 *f, const char *name);                 /* unlink a dataset or group */
pn_status pn_h5_move(pn_h5 *f, const char *from, const char *to);   /* rename (checkpoints) */

/* ---- NumPy .npy files (io/npy.c) ----
 * Load: format 1.0/2.0/3.0, either byte order, C or Fortran order; f2/f4 → f32, f8 → f64,
 * i1/i2/i4/u2 → i32, i8/u4 → i64, u8 → i64 (an error above 2^63 − 1), u1/b1 → u8; other dtypes,
 * truncated files and trailing bytes are errors naming the file. Save: format 1.0, little-endian,
 * C order, any dtype of ours (a CPU tensor, any strides). */
pn_tensor *pn_npy_load(const char *path);
pn_status pn_npy_save(const char *path, const pn_tensor *t);

/* ---- manifold maps (attention/maps.c) and the hyperbolic toolkit (attention/hyperbolic.c) ----
 * All differentiable; x (…, D), the last dim holds the coordinates. Coneheads/Gulcehre
 * names (DESIGN §3.1). Points are rows of the last dim. */
typedef enum { PN_MODEL_HYPERBOLOID = 0, PN_MODEL_HALFSPACE = 1, PN_MODEL_POINCARE = 2, PN_MODEL_KLEIN = 3 } pn_hyp_model;
pn_tensor *pn_map_psi(pn_tensor *x);                 /* Coneheads Eq. 10: (x₋·e^{x_d}, e^{x_d}) */
pn_tensor *pn_map_xi(pn_tensor *x, double h);        /* Coneheads Eq. 11: (x₋·h σ(x_d), h σ(x_d)) */
pn_tensor *pn_map_pseudopolar(pn_tensor *x);         /* Gulcehre §4.1 → hyperboloid (…, D) */
/* Coneheads Eq. 9 at O = (0,…,0,1); h: clamp of the height (NaN = none); scale_last: the
 * authors' code scales x_d by 1/d first (0 = paper) */
pn_tensor *pn_map_exp0(pn_tensor *x, double h, int scale_last);
pn_tensor *pn_hyp_expmap0(pn_tensor *x, double c);   /* Poincaré ball of curvature −c */
pn_tensor *pn_hyp_logmap0(pn_tensor *x, double c);
pn_tensor *pn_hyp_mobius_add(pn_tensor *x, pn_tensor *y, double c);
pn_tensor *pn_hyp_dist(pn_tensor *x, pn_tensor *y, double c);   /* (…, D) → (…) */
pn_tensor *pn_hyp_project(pn_tensor *x, double c);   /* into the ball, float32-safe boundary eps */
pn_tensor *pn_hyp_to_klein(pn_tensor *x, int from_model, double c);  /* hyperboloid (D+1) or Poincaré (D) → Klein (D) */
pn_tensor *pn_hyp_from_klein(pn_tensor *x, int to_model, double c);

/* ---- graphs (graph/csr.c) ---------------------------------------------------------------- */
/* edges (E, 2) i32/i64 rows (src, dst): dst attends to src. Builds CSR by destination:
 * *offsets (N+1) i64 and *src (E') i64 sorted by (dst, src), duplicates kept, self loops
 * added for every node lacking one when self_loops != 0. Both outputs are new references. */
pn_status pn_graph_csr(pn_tensor *edges, int64_t num_nodes, int self_loops, pn_tensor **offsets, pn_tensor **src);

/* ---- scale-free graphs (graph/hyperbolic.c, graph/algo.c): host algorithms, CPU tensors ---- */
/* Random hyperbolic graph: n points, radii of density α·sinh(αr)/(cosh αR − 1), angles uniform;
 * T = 0: an edge when the distance <= threshold; 0 < T < 1: with probability
 * 1/(1 + e^{(d − threshold)/(2T)}) (n <= 20000). R NaN: solved so the expected average degree is
 * `degree`; threshold NaN: R. Out: edges (2E, 2) i64 (E pairs, then reversed), r, phi (n) f64, *R. */
typedef struct {
    int64_t n;
    double degree, alpha, T, R, threshold;
    uint64_t seed;
} pn_hypgen_opts;
pn_status pn_graph_hyperbolic(const pn_hypgen_opts *o, pn_tensor **edges, pn_tensor **r, pn_tensor **phi, double *R);
/* the model's expected average degree (threshold NaN: R); NaN for impossible parameters */
double pn_graph_hyperbolic_degree(int64_t n, double alpha, double R, double threshold, double T);
/* On a CSR (offsets (N+1), src (E) i64 from pn_graph_csr): hop distances from each source,
 * (S, N) i32, −1 when unreachable or farther than max (max < 0: no cap); of pairs (P, 2) i64,
 * (P) i32; component labels (N) i64 (the smallest node id of each) and their count. */
pn_status pn_graph_bfs(pn_tensor *offsets, pn_tensor *src, pn_tensor *sources, int64_t max, pn_tensor **dist);
pn_status pn_graph_pair_dist(pn_tensor *offsets, pn_tensor *src, pn_tensor *pairs, int64_t max, pn_tensor **dist);
pn_status pn_graph_components(pn_tensor *offsets, pn_tensor *src, pn_tensor **labels, int64_t *count);
/* the subgraph induced by keep (N) u8: its edges renumbered (E', 2) i64 and the kept ids (M) i64 */
pn_status pn_graph_induced(pn_tensor *edges, pn_tensor *keep, pn_tensor **edges_out, pn_tensor **ids);
/* edges (E, 2) i64 → the same undirected graph as (E', 2) i64: both directions, no self-loops,
 * no duplicates, sorted by (src, dst); ids must be in [0, num_nodes) */
pn_status pn_graph_canonical(pn_tensor *edges, int64_t num_nodes, pn_tensor **edges_out);

/* ---- fused attention (attention/dense.c, attention/graph.c, one file per score family) ----
 * DESIGN §3.1. Options are a plain struct: fill it with pn_attn_opts_init (the defaults),
 * then set fields. Scores are looked up by name in the registry (attention/variants.def). */
typedef enum { PN_NORM_SOFTMAX = 0, PN_NORM_SIGMOID = 1, PN_NORM_SIGMOID_NORMALIZED = 2 } pn_attn_norm;
typedef enum { PN_AGG_SUM = 0, PN_AGG_EINSTEIN = 1 } pn_attn_agg;
/* the inputs of dense attention's products on CUDA tensor cores: the tensors' own dtype, or f32
 * tensors rounded to bfloat16 / half for Q·Kᵀ and P·V with f32 accumulation (README CUDA) */
typedef enum { PN_PREC_NATIVE = 0, PN_PREC_BF16 = 1, PN_PREC_F16 = 2 } pn_attn_prec;
#define PN_ATTN_MAX_PARAMS 16
typedef struct pn_attn_opts {
    int score;            /* registry index (pn_attention_variant_find) */
    int normalize;        /* pn_attn_norm */
    int aggregate;        /* pn_attn_agg */
    int model;            /* pn_hyp_model, for score 'hyperbolic' */
    int causal;
    int squared;          /* penumbral: −γ·height² (the authors' code) */
    int alibi;            /* causal softmax dot: ALiBi slopes per head */
    int precision;        /* pn_attn_prec (dense attention on CUDA) */
    /* the scores' parameters by id (pn_attention_param_find: gamma, r, …, from variants.def):
     * param[id] a number, NaN → the score's default; param_t[id] a learnable 0-dim or (H)
     * tensor that overrides it and gets a gradient, or NULL */
    double param[PN_ATTN_MAX_PARAMS];
    pn_tensor *param_t[PN_ATTN_MAX_PARAMS];
    pn_tensor *mask;      /* u8 broadcastable to (B, H, Nq, Nk), nonzero = may attend; or NULL */
    pn_tensor *bias;      /* float broadcastable to (B, H, Nq, Nk), added to scores; or NULL */
    pn_tensor *a_l, *a_r; /* gat: (H, D) */
    double dropout;       /* graph attention: dropout on the weights when train */
    int train;
} pn_attn_opts;
void pn_attn_opts_init(pn_attn_opts *o);
int pn_attention_variant_count(void);
const char *pn_attention_variant_name(int i);
int pn_attention_variant_find(const char *name);   /* −1 when unknown */
int pn_attention_variant_graph_only(int i);         /* 1: graph attention only (gat) */
/* A variant's variants.def row: flags (PN_VF_*), default map ("psi", …, "none"), domain
 * (text), and its parameters j = 0 … nparams−1: the id (return value; −1 when out of range),
 * the default (NaN: 1/√D) and whether it must be > 0. */
enum { PN_VF_GRAPH_ONLY = 1, PN_VF_TEST = 2 };
unsigned pn_attention_variant_flags(int i);
const char *pn_attention_variant_map(int i);
const char *pn_attention_variant_domain(int i);
int pn_attention_variant_nparams(int i);
int pn_attention_variant_param(int i, int j, double *dflt, int *positive);
/* the parameter ids: 0 … count−1, by name (−1 when unknown) */
int pn_attention_param_count(void);
const char *pn_attention_param_name(int id);
const char *pn_attention_param_about(int id);
int pn_attention_param_find(const char *name);
/* q, k (B, H, N, D) | (B, N, D) | (N, D); v (…, Nk, Dv) → (…, Nq, Dv) */
pn_tensor *pn_attention(pn_tensor *q, pn_tensor *k, pn_tensor *v, const pn_attn_opts *o);
/* (…, Nq, Nk); recorded for autograd (the backward is attention's with v = I, V never built) */
pn_tensor *pn_attention_weights(pn_tensor *q, pn_tensor *k, const pn_attn_opts *o);
/* node-major: q, k (N, H, D) or (N, D); v (N, H, Dv) or (N, Dv); CSR from pn_graph_csr */
pn_tensor *pn_graph_attention(pn_tensor *q, pn_tensor *k, pn_tensor *v, pn_tensor *offsets, pn_tensor *src,
                              const pn_attn_opts *o);
/* per-edge attention weights α (E, H), or (E) for (N, D) q: edge e in CSR order (no dropout,
 * aggregate ignored — einstein's Lorentz factors belong to v; recorded for autograd) */
pn_tensor *pn_graph_attention_weights(pn_tensor *q, pn_tensor *k, pn_tensor *offsets, pn_tensor *src,
                                      const pn_attn_opts *o);

/* ---- linear attention (attention/cosine.c, attention/power.c, attention/rope.c) ---------
 * DESIGN §3.2. q, k: (B, H, N, D); v: (B, H, N, Dv). */
/* m: (H) per-head stabiliser; key_mask: (B, N) u8 (nonzero = real key) or NULL; n_t counts the real keys row t sees */
pn_tensor *pn_cosine_attention(pn_tensor *q, pn_tensor *k, pn_tensor *v, pn_tensor *m, int causal,
                               pn_tensor *key_mask);
/* p even >= 2; log_gate (B, H, N) or NULL; chunk 0 = quadratic form, else the chunked form
 * (chunk must divide N); scale multiplies q·k before the power (NaN = 1) */
pn_tensor *pn_power_attention(pn_tensor *q, pn_tensor *k, pn_tensor *v, int p, int causal, pn_tensor *log_gate,
                              int64_t chunk, double scale);
pn_tensor *pn_sympow_embed(pn_tensor *x, int p);     /* (…, D) → (…, C(D+p−1, p)), φ(q)·φ(k) = (q·k)^p */
/* x (B, H, N, D), D even; theta (D/2) or NULL for base^(−2i/D); rate broadcastable to (B, H, N)
 * or NULL (μ_t = t); with a rate μ_t = Σ_{s≤t} rate_s */
pn_tensor *pn_rope(pn_tensor *x, double base, pn_tensor *theta, pn_tensor *rate);
/* Recurrent inference states, memory constant in sequence length. */
typedef struct pn_lin_state pn_lin_state;
pn_lin_state *pn_cosine_state_new(int64_t B, int64_t H, int64_t D, int64_t Dv, pn_tensor *m, int dtype);
pn_lin_state *pn_power_state_new(int64_t B, int64_t H, int64_t D, int64_t Dv, int p, double scale, int dtype);
/* q, k (B, H, D), v (B, H, Dv), log_gate (B, H) or NULL → output (B, H, Dv) for this position */
pn_tensor *pn_lin_state_step(pn_lin_state *s, pn_tensor *q, pn_tensor *k, pn_tensor *v, pn_tensor *log_gate);
void pn_lin_state_reset(pn_lin_state *s);
pn_status pn_lin_state_reorder(pn_lin_state *s, pn_tensor *idx); /* keep rows idx (1-D, 0-based) */
int64_t pn_lin_state_bytes(const pn_lin_state *s);
void pn_lin_state_free(pn_lin_state *s);

/* ---- text: sentencepiece BPE (text/spm.cc, a C++ shim over libsentencepiece) -------------
 * Lua: lua/penumbra/text/bpe.lua (pn.text.bpe). Ids are 0-based; models trained here have
 * pad 0, unk 1, bos 2, eos 3. Texts are UTF-8 with an explicit byte length (not validated
 * text is an error naming the line and byte). Variable-size results (ids, strings) are
 * malloc'd and owned by the caller: release them with pn_spm_buf_free; NULL means error,
 * an empty result is non-NULL with length 0. */
typedef struct pn_spm pn_spm;
/* Trains a BPE model on text files (one sentence per line, every line, in order) and writes
 * <model_prefix>.model and <model_prefix>.vocab; num_threads <= 0: pn_num_threads(). */
pn_status pn_spm_train(const char *const *inputs, int ninputs, const char *model_prefix, int vocab_size,
                       double character_coverage, int num_threads);
pn_spm *pn_spm_load(const char *path);   /* owned: free with pn_spm_free */
void pn_spm_free(pn_spm *s);
void pn_spm_buf_free(void *p);           /* a result of pn_spm_encode*, pn_spm_decode */
int pn_spm_piece_size(const pn_spm *s);  /* the vocabulary size */
int pn_spm_unk_id(const pn_spm *s);
int pn_spm_bos_id(const pn_spm *s);      /* −1 when the model has none (bos, eos, pad) */
int pn_spm_eos_id(const pn_spm *s);
int pn_spm_pad_id(const pn_spm *s);
const char *pn_spm_id_to_piece(const pn_spm *s, int id);       /* borrowed, lives as long as s */
int pn_spm_piece_to_id(const pn_spm *s, const char *piece);    /* the unk id when unknown */
/* n texts → one array of ids (no bos/eos added); line i's are ids[offsets[i] .. offsets[i+1]) (offsets: n+1,
 * caller-sized); OpenMP over lines, num_threads <= 0: pn_num_threads() */
int32_t *pn_spm_encode_batch(const pn_spm *s, const char *const *lines, const int64_t *lens, int64_t n,
                             int64_t *offsets, int num_threads);
/* one text → its subword pieces ('▁' marks a word start), separated by NUL bytes; *len bytes */
char *pn_spm_encode_pieces(const pn_spm *s, const char *text, int64_t len, int64_t *out_len);
/* ids → detokenised UTF-8 (*len bytes); pad/bos/eos ids are skipped, others out of range are errors */
char *pn_spm_decode(const pn_spm *s, const int32_t *ids, int64_t n, int64_t *out_len);
/* SHA-256 as 64 lowercase hex digits + NUL into out[65] (tokenizer cache keys) */
pn_status pn_sha256_hex(const void *data, int64_t len, char *out);
pn_status pn_sha256_file(const char *path, char *out);
const char *pn_spm_version(void);        /* the sentencepiece version built against ("0.1.97") */

/* ---- text: BLEU / chrF (text/bleu.c) --------------------------------------------------------
 * Corpus scores exactly as sacreBLEU 2.x computes them with its defaults (`sacrebleu REF -i HYP`,
 * BLEU().corpus_score / CHRF().corpus_score). BLEU: tokenizer 13a, cased, n-grams 1..4, 'exp'
 * smoothing, no effective order, brevity penalty. chrF: chrF2 (character n-grams 1..6 with the
 * whitespace removed, no word n-grams, beta 2, sacreBLEU's default averaging over the orders
 * seen). Inputs: n_hyp UTF-8 strings and n_streams reference streams ref[r] of n_ref[r] strings
 * each (one stream = one reference per segment; with several, BLEU clips by the largest count
 * over the references and takes the closest reference length, chrF takes the best reference).
 * Errors (no output written): counts that differ, a NULL string, invalid UTF-8 — each naming the
 * line (from 1). n_hyp = 0 gives zero scores (bp 1). */
#define PN_BLEU_MAX_ORDER 4
#define PN_CHRF_CHAR_ORDER 6
typedef struct pn_bleu_score {
    double score;                          /* 0..100 */
    double precisions[PN_BLEU_MAX_ORDER];  /* percent, smoothed as sacreBLEU does */
    int64_t counts[PN_BLEU_MAX_ORDER];     /* clipped matching n-grams per order */
    int64_t totals[PN_BLEU_MAX_ORDER];     /* hypothesis n-grams per order */
    int64_t sys_len, ref_len;              /* tokens; ref_len sums the closest reference lengths */
    double bp, ratio;                      /* brevity penalty; sys_len / ref_len (0 when ref_len = 0) */
    char line[192];                        /* sacreBLEU's text: "BLEU = 35.12 67.1/43.0/30.2/21.5 (BP = …)" */
} pn_bleu_score;
typedef struct pn_chrf_score {
    double score;                          /* 0..100 */
    int64_t hyp[PN_CHRF_CHAR_ORDER];       /* corpus statistics per character n-gram order */
    int64_t ref[PN_CHRF_CHAR_ORDER];
    int64_t match[PN_CHRF_CHAR_ORDER];
    int32_t char_order, word_order, beta;  /* 6, 0, 2 */
    char line[64];                         /* "chrF2 = 52.34" */
} pn_chrf_score;
pn_status pn_bleu(const char *const *hyp, int64_t n_hyp, const char *const *const *ref, const int64_t *n_ref,
                  int32_t n_streams, pn_bleu_score *out);
pn_status pn_chrf(const char *const *hyp, int64_t n_hyp, const char *const *const *ref, const int64_t *n_ref,
                  int32_t n_streams, pn_chrf_score *out);
/* The 13a tokenisation of one line (sacreBLEU's rstrip + Tokenizer13a): tokens joined by single
 * spaces. Buffer protocol of pn_h5_list: returns the full length (no NUL), writes at most size−1
 * bytes and a NUL; -1 on error (NULL line, invalid UTF-8). */
int64_t pn_bleu_tokenize_13a(const char *line, char *buf, int64_t size);

#if defined(__cplusplus) && !defined(PN_FFI)
}
#endif
#endif /* PENUMBRA_H */

/* power.cu — the CUDA twin of attention/power.c: the symmetric power embedding φᵖ and power
 * attention (forward and backward), in f64 for both dtypes as the CPU.
 *
 * φᵖ: one thread per row, through sympow_apply_raw / sympow_grad_raw (linear_math.h, the very
 * functions the CPU runs) on f64 copies of the row; the table's arrays (p > 2) are uploaded for
 * the call (linear.cuh).
 *
 * Quadratic form (chunk = 0; causal or not): log space, as power.c's, with L the cumulative log
 * gates (pw_scan: a block per (b, h)):
 *   row pass     one thread per query i: the row max of log B_ij, Z_i = Σ_j exp(log B_ij − max),
 *                out_i (and for the backward o_i and g_i·o_i kept in f64 scratch)
 *   row grads    one thread per query i: g q_i = scale Σ_j ∂s_ij k_j, and the gate terms where i is
 *                the later index (+∂log B_ij) or the earlier one (−)
 *   column grads one thread per key j: g k_j = Σ_i ∂s_ij qs_i, g v_j = Σ_i A_ij g_i and j's gate terms
 *   gates        pw_scan, a block per (b, h): g log_gate = the reverse running sum of g L.
 *
 * Chunked form (chunk = c > 0, causal, c divides N: power.c checks), power.c's chunk_forward /
 * chunk_backward with the same maths and f64 sums (section "chunked form"): v gets a column of
 * ones, ṽ = [v, 1], so the normaliser z rides along as the last column of the φᵖ state S̃ = [S, z]
 * (Dφ × (Dv + 1)), and every product is a tile product through shared memory (tiles of ct = 16 or
 * 32 rows, keys and φ features: pwc_lay_pick) on the f64 tensor cores, each output element summed
 * in order (bmm):
 *   states    a block per (b, h, chunk, ct features): Σ_j f_j φ(k_j) ṽ_jᵀ over the chunk's keys
 *             (f_j = exp(L_end − L_j)); then a scan over the chunks in order, one thread per
 *             (b, h, state element): S̃ entering chunk m+1 = decay_m·S̃ entering m + chunk m's sum
 *   rows      a block per (b, h, chunk, ct query rows): the gated quadratic form inside the chunk
 *             (T_ij = exp(L_i − L_j)(qs_i·k_j)^p, j ≤ i, through key tiles) plus e_i φ(qs_i)ᵀ S̃
 *             through feature tiles (the state's tiles double-buffered by cp.async:
 *             pwc_state_tiles); out = num/den (0 where den = 0); in the backward the rows'
 *             G_i = g_i/den_i and gd_i = −g_i·out_i/den_i instead
 *   backward  the state products again with the queries (Σ_i e_i φ(qs_i) [G_i, gd_i]ᵀ), a reverse
 *             scan (the gradient of each chunk boundary's state), then a query-side block per
 *             (b, h, chunk, ct rows): g q (intra ds·K, inter J_φᵀ: for p = 2 a warp per row and a
 *             lane per coordinate, lin_phi2_grad_warp; else a thread per row, lin_phi_grad_part) and
 *             the rows' gate terms; a key-side block per (b, h, chunk, ct keys): g k, g v (intra
 *             and the state update's) and the keys' gate terms; a block per (b, h, chunk) for
 *             each decay's term (a fixed reduction tree); one thread per row for g L, then pw_scan for
 *             g log_gate.
 * Memory: the chunk-boundary states, their gradients (backward) and per-row arrays: O(N/c·Dφ·Dv
 * + N·Dv) per (b, h), no N² term. Every sum has one owner and a fixed order: deterministic, no
 * atomics. Overflow: like power.c's chunked form (and its recurrent state) this one is not in log
 * space: where (scale·q·k)^p or φ(scale·q) overflows f64, the CPU neither falls back nor raises; it
 * returns the non-finite values its arithmetic gives, and so does the device (the quadratic form
 * stays finite there). Tiles too wide for the device's shared memory (D or Dv in the hundreds) run
 * the quadratic kernels, which compute the same function. */
#include "../mma_ptx.cuh" /* pn_dmma_884 */
#include "../ops/block_reduce.cuh" /* pn_cu_lanes_sum */
#include "linear.cuh"

#include <stdlib.h> /* getenv: PENUMBRA_CUDA_POWER_TILE */

namespace {

/* ---- φᵖ ------------------------------------------------------------------------------------- */
// x (R, D) → out (R, Dp); scratch (R, D + Dp)
template <class T>
__global__ void sympow_fwd_k(lin_tab t, int64_t R, const T *x, T *out, double *scratch) {
    const int64_t D = t.D, Dp = t.Dp;
    PN_CU_LOOP(r, R) {
        double *xs = scratch + r * (D + Dp), *ph = xs + D;
        for (int64_t d = 0; d < D; d++) xs[d] = x[r * D + d];
        lin_phi(t, xs, ph);
        for (int64_t a = 0; a < Dp; a++) out[r * Dp + a] = (T)ph[a];
    }
}

// x (R, D), g (R, Dp) → gx (R, D); scratch (R, 2D + Dp)
template <class T>
__global__ void sympow_bwd_k(lin_tab t, int64_t R, const T *x, const T *g, T *gx, double *scratch) {
    const int64_t D = t.D, Dp = t.Dp;
    PN_CU_LOOP(r, R) {
        double *xs = scratch + r * (2 * D + Dp), *gr = xs + D, *gp = gr + D;
        for (int64_t d = 0; d < D; d++) xs[d] = x[r * D + d], gr[d] = 0;
        for (int64_t a = 0; a < Dp; a++) gp[a] = g[r * Dp + a];
        lin_phi_grad(t, xs, gp, gr);
        for (int64_t d = 0; d < D; d++) gx[r * D + d] = (T)gr[d];
    }
}

/* ---- power attention ---------------------------------------------------------------------- */
struct pw_geo {
    int64_t B, H, N, D, Dv;
    int p, causal;
    double scale;
    const double *L; /* (BH, N) cumulative log gates (0 without gates) */
};

/* Running sums along rows: out (R, n) ← Σ_{s ≤ t} (x + x2)_s (reverse: Σ_{s ≥ t}); x NULL reads
 * zeros, x2 NULL adds nothing. A block per row (grid-stride over rows), PW_SCAN threads: each thread
 * sums a contiguous run of the row in order, one thread adds the runs' totals in order, and each run
 * is summed again from its carry. The gates' scans were one thread per (b, h) walking the whole row,
 * N dependent steps each (N = 65536 in the benchmark). Deterministic for the fixed block size; the
 * association differs from power.c's one sequential sum by rounding only. */
enum { PW_SCAN = 256 };
template <class X, class O>
__global__ void pw_row_scan(int64_t R, int64_t n, const X *x, const double *x2, O *out, int reverse) {
    PN_SHARED(double, tot, PW_SCAN);
    const int64_t len = (n + PW_SCAN - 1) / PW_SCAN, t0 = threadIdx.x * len, t1 = t0 + len < n ? t0 + len : n;
    for (int64_t row = blockIdx.x; row < R; row += gridDim.x) {
        const X *xr = x ? x + row * n : NULL;
        const double *yr = x2 ? x2 + row * n : NULL;
        O *o = out + row * n;
        double acc = 0;
        for (int64_t u = t0; u < t1; u++) acc += (xr ? (double)xr[u] : 0.0) + (yr ? yr[u] : 0.0);
        tot[threadIdx.x] = acc;
        __syncthreads();
        if (threadIdx.x == 0) { /* the runs' carries, exclusive, in the scan's direction */
            double c = 0;
            for (int r = 0; r < PW_SCAN; r++) {
                const int w = reverse ? PW_SCAN - 1 - r : r;
                const double v = tot[w];
                tot[w] = c;
                c += v;
            }
        }
        __syncthreads();
        acc = tot[threadIdx.x];
        for (int64_t k = 0; k < t1 - t0; k++) {
            const int64_t u = reverse ? t1 - 1 - k : t0 + k;
            o[u] = (O)(acc += (xr ? (double)xr[u] : 0.0) + (yr ? yr[u] : 0.0));
        }
        __syncthreads(); /* tot is rewritten for the next row */
    }
}

/* the launch of pw_row_scan over R rows of n */
template <class X, class O>
pn_status pw_scan(const char *op, int64_t R, int64_t n, const X *x, const double *x2, O *out, int reverse) {
    if (R < 1 || n < 1) return PN_OK;
    auto kn = pw_row_scan<X, O>;
    const unsigned grid = (unsigned)(R < 65535 ? R : 65535);
    return pn_cu_check(op, PN_LAUNCH(kn, grid, PW_SCAN, 0, pn_cu_stream(), R, n, x, x2, out, reverse));
}

/* s_ij = (scale·q_i)·k_j in the CPU's order, and log B_ij (−inf for s = 0) */
template <class T>
__device__ inline double pw_score(const pw_geo &a, const T *Q, const T *K, const double *L, int64_t i, int64_t j,
                                  double *lb) {
    double s = 0;
    for (int64_t d = 0; d < a.D; d++) s += ((double)Q[i * a.D + d] * a.scale) * (double)K[j * a.D + d];
    *lb = s == 0 ? -INFINITY : a.p * log(fabs(s)) + log_gate(L, i, j);
    return s;
}

/* One thread per query row (b, h, i). Forward (g = NULL): out_i = Σ_j w_ij v_j / Σ_j w_ij
 * (power.c's quad_forward) into out, o64 the f64 row. Backward statistics (g given): mx, Z and
 * o_i = Σ_j (w_ij/Z) v_j (quad_backward's order) and go_i = g_i·o_i. */
template <class T>
__global__ void pw_rows(pw_geo a, const T *q, const T *k, const T *v, const T *g, T *out, double *o64, double *mx_,
                        double *Z_, double *go_) {
    const int64_t N = a.N, D = a.D, Dv = a.Dv;
    PN_CU_LOOP(row, a.B * a.H * N) {
        const int64_t bh = row / N, i = row % N, n = a.causal ? i + 1 : N;
        const T *Q = q + bh * N * D, *K = k + bh * N * D, *V = v + bh * N * Dv;
        const double *L = a.L + bh * N;
        double *o = o64 + row * Dv, lb, mx = -INFINITY, Z = 0;
        for (int64_t j = 0; j < n; j++) {
            pw_score(a, Q, K, L, i, j, &lb);
            if (lb > mx) mx = lb;
        }
        for (int64_t e = 0; e < Dv; e++) o[e] = 0;
        if (mx > -INFINITY) {
            for (int64_t j = 0; j < n; j++) {
                pw_score(a, Q, K, L, i, j, &lb);
                Z += exp(lb - mx);
            }
            for (int64_t j = 0; j < n; j++) {
                pw_score(a, Q, K, L, i, j, &lb);
                double w = exp(lb - mx);
                if (g) w /= Z;
                for (int64_t e = 0; e < Dv; e++) o[e] += w * (double)V[j * Dv + e];
            }
            if (!g)
                for (int64_t e = 0; e < Dv; e++) o[e] /= Z;
        }
        if (!g) {
            for (int64_t e = 0; e < Dv; e++) out[row * Dv + e] = (T)o[e];
            continue;
        }
        double go = 0;
        for (int64_t e = 0; e < Dv; e++) go += (double)g[row * Dv + e] * o[e];
        mx_[row] = mx, Z_[row] = Z, go_[row] = go;
    }
}

/* A_ij and ∂log B_ij of the pair (i, j) from row i's statistics; false when A_ij = 0 (no gradient) */
template <class T>
__device__ inline bool pw_pair(const pw_geo &a, const T *Q, const T *K, const T *V, const T *G, const double *L,
                               double mx, double Z, double go, int64_t i, int64_t j, double *A, double *dlb,
                               double *s) {
    double lb;
    *s = pw_score(a, Q, K, L, i, j, &lb);
    *A = exp(lb - mx) / Z;
    if (*A == 0) return false;
    double gv = 0;
    for (int64_t e = 0; e < a.Dv; e++) gv += (double)G[i * a.Dv + e] * (double)V[j * a.Dv + e];
    *dlb = *A * (gv - go);
    return true;
}

/* One thread per query row i: gq_i (T) and gLr_i, i's share of g L */
template <class T>
__global__ void pw_row_grads(pw_geo a, const T *q, const T *k, const T *v, const T *g, const double *mx_,
                             const double *Z_, const double *go_, T *gq, double *gq64, double *gLr) {
    const int64_t N = a.N, D = a.D, Dv = a.Dv;
    PN_CU_LOOP(row, a.B * a.H * N) {
        const int64_t bh = row / N, i = row % N, n = a.causal ? i + 1 : N;
        const T *Q = q + bh * N * D, *K = k + bh * N * D, *V = v + bh * N * Dv, *G = g + bh * N * Dv;
        double *acc = gq64 + row * D, gl = 0;
        for (int64_t d = 0; d < D; d++) acc[d] = 0;
        if (mx_[row] > -INFINITY) {
            for (int64_t j = 0; j < n; j++) {
                double A, dlb, s;
                if (!pw_pair(a, Q, K, V, G, a.L + bh * N, mx_[row], Z_[row], go_[row], i, j, &A, &dlb, &s)) continue;
                const double ds = a.p * dlb / s; /* A ≠ 0 ⇒ s ≠ 0 */
                for (int64_t d = 0; d < D; d++) acc[d] += ds * (double)K[j * D + d];
                gl += i >= j ? dlb : -dlb;
            }
        }
        if (gq)
            for (int64_t d = 0; d < D; d++) gq[row * D + d] = (T)(acc[d] * a.scale);
        gLr[row] = gl;
    }
}

/* One thread per key row j: gk_j, gv_j (T) and gLc_j, j's share of g L */
template <class T>
__global__ void pw_col_grads(pw_geo a, const T *q, const T *k, const T *v, const T *g, const double *mx_,
                             const double *Z_, const double *go_, T *gk, T *gv, double *gk64, double *gv64,
                             double *gLc) {
    const int64_t N = a.N, D = a.D, Dv = a.Dv;
    PN_CU_LOOP(row, a.B * a.H * N) {
        const int64_t bh = row / N, j = row % N;
        const T *Q = q + bh * N * D, *K = k + bh * N * D, *V = v + bh * N * Dv, *G = g + bh * N * Dv;
        double *ak = gk64 + row * D, *av = gv64 + row * Dv, gl = 0;
        for (int64_t d = 0; d < D; d++) ak[d] = 0;
        for (int64_t e = 0; e < Dv; e++) av[e] = 0;
        for (int64_t i = a.causal ? j : 0; i < N; i++) {
            const int64_t ri = bh * N + i;
            if (!(mx_[ri] > -INFINITY)) continue;
            double A, dlb, s;
            if (!pw_pair(a, Q, K, V, G, a.L + bh * N, mx_[ri], Z_[ri], go_[ri], i, j, &A, &dlb, &s)) continue;
            for (int64_t e = 0; e < Dv; e++) av[e] += A * (double)G[i * Dv + e];
            const double ds = a.p * dlb / s;
            for (int64_t d = 0; d < D; d++) ak[d] += ds * ((double)Q[i * D + d] * a.scale);
            gl += i >= j ? -dlb : dlb;
        }
        if (gk)
            for (int64_t d = 0; d < D; d++) gk[row * D + d] = (T)ak[d];
        if (gv)
            for (int64_t e = 0; e < Dv; e++) gv[row * Dv + e] = (T)av[e];
        gLc[row] = gl;
    }
}

pn_status pw_setup(const char *op, const pn_tensor *q, const pn_tensor *v, const pn_tensor *lg, int p, int causal,
                   double scale, lin_scratch &s, pw_geo *a) {
    a->B = q->sizes[0], a->H = q->sizes[1], a->N = q->sizes[2], a->D = q->sizes[3], a->Dv = v->sizes[3];
    a->p = p, a->causal = causal != 0, a->scale = scale;
    double *L = (double *)lin_alloc(s, a->B * a->H * a->N, PN_F64);
    if (!L) return pn_error(PN_ERR_OOM, "%s: out of device memory for q %s", op, pn_shape_str(q));
    a->L = L;
    PN_CU_FLOAT_SWITCH(q->dt, T, {
        PN_TRY(pw_scan(op, a->B * a->H, a->N, lg ? (const T *)pn_ptr(lg) : (const T *)NULL, (const double *)NULL, L, 0));
    });
    return PN_OK;
}

enum { PW_THREADS = 64 }; /* rows per block: each thread walks a whole row */

/* ---- chunked form ----------------------------------------------------------------------------
 * power.c's chunk_forward / chunk_backward on the device, f64 throughout. Per (b, h): chunks of
 * c rows, ṽ_j = [v_j, 1] (Dw = Dv + 1 columns, the last one carries the normaliser), and the
 * augmented state S̃ = [S, z] (Dp × Dw). Slots m = 0 … nc − 2 of the state buffers hold one
 * matrix per chunk boundary: St[m] is the state entering chunk m + 1, Dt[m] its gradient.
 * Le_m = L at the last row of chunk m; decay_m = exp(Le_m − Le_{m−1}) (Le_{−1} = 0).
 *
 * Work in shared-memory tiles of ct rows (or keys, or φ features; ct = 16 or 32 per kernel, its
 * layout's: pwc_lay_pick), products through bmm (f64 mma.sync, each output element summed in k
 * order: deterministic).
 * A block runs one (b, h, chunk, tile). */
constexpr int CTH = 128; /* pwc_gdec's threads (a power of two: its tree) */
/* threads per block of a kernel with ct-wide tiles: 8 warps at 32 (a 32 × 64 product is then one
 * 8 × 16 block of bmm's per warp), 4 at 16; whole warps (bmm's mma) */
__host__ __device__ constexpr int pwc_threads(int ct) { return ct == 32 ? 256 : 128; }

/* The named shared slabs of one kernel, ct rows each × a leading dimension (pwc_ld: the mma
 * operands' loads without bank conflicts); offsets in doubles, -1 =
 * unused. X query rows scale·q (K_STATE: its x rows), K key rows, V ṽ rows (K_STATE: its Y rows),
 * G G̃ rows, P P2 P3 (query, key) pair tiles, PH φ features of rows, T a second feature tile, ACC a
 * Dw-wide and ACCD a D-wide accumulator, ST ST2 two tiles of a state's rows (one computed on while
 * the next is copied in: pwc_state_tiles), LQ LK L of the rows and keys,
 * R1 R2 R3 per-row scalars, EQ the rows' e_i = e^(L_i − L at the previous chunk's end). */
enum { S_X, S_K, S_V, S_G, S_P, S_P2, S_P3, S_PH, S_T, S_ACC, S_ACCD, S_ST, S_ST2, S_LQ, S_LK, S_R1, S_R2, S_R3, S_EQ, S_N };
enum { K_STATE, K_FWD, K_BWQ, K_BWK };
struct pwc_lay {
    int ct; /* the tile width: rows, keys and φ features a tile */
    int ldD, ldW, ldT;
    int64_t off[S_N];
    int64_t total; /* doubles */
};

/* a slab's leading dimension for rows of w doubles: the least ld ≥ w with ld ≡ 4 (mod 8). A
 * 64-bit shared load is served a half-warp at a time, 16 eight-byte slots a wavefront; bmm's mma
 * operands put lane (g, t) (g = lane / 4, t = lane % 4) at g·ld + t or t·ld + g, which for ld ≡ 4
 * (mod 8) are 16 distinct slots in each half-warp, one wavefront each, in either orientation. The
 * odd widths before (for the thread-per-element tiles' column-parallel reads) put up to four
 * lanes of a half-warp on one slot. */
inline int pwc_ld(int64_t w) { return (int)(w + ((4 - w % 8) + 8) % 8); }

#define PWC_B(s) (1u << (s))
/* the slabs each kernel uses (see the kernels) and their widths */
inline pwc_lay pwc_lay_of(int kind, int64_t D, int64_t Dw, int ct) {
    const unsigned tiles = PWC_B(S_X) | PWC_B(S_K) | PWC_B(S_V) | PWC_B(S_P) | PWC_B(S_PH) | PWC_B(S_ST) |
                           PWC_B(S_ST2) | PWC_B(S_LQ) | PWC_B(S_LK) | PWC_B(S_EQ);
    const unsigned bw = tiles | PWC_B(S_G) | PWC_B(S_P2) | PWC_B(S_T) | PWC_B(S_ACCD) | PWC_B(S_R1) | PWC_B(S_R2);
    const unsigned use[] = {
        /* K_STATE */ PWC_B(S_X) | PWC_B(S_V) | PWC_B(S_PH) | PWC_B(S_ACC) | PWC_B(S_LQ),
        /* K_FWD   */ tiles | PWC_B(S_ACC),
        /* K_BWQ   */ bw,
        /* K_BWK   */ bw | PWC_B(S_P3) | PWC_B(S_ACC) | PWC_B(S_R3)};
    pwc_lay L;
    L.ct = ct, L.ldD = pwc_ld(D), L.ldW = pwc_ld(Dw), L.ldT = pwc_ld(ct);
    L.total = 0;
    for (int s = 0; s < S_N; s++) {
        L.off[s] = -1;
        if (!(use[kind] & PWC_B(s))) continue;
        const int64_t w = s == S_X || s == S_K || s == S_ACCD               ? L.ldD
                          : s == S_V || s == S_G || s == S_ACC || s == S_ST || s == S_ST2 ? L.ldW
                          : s >= S_LQ                                       ? 1
                                                                            : L.ldT;
        L.off[s] = L.total;
        L.total += ct * w;
    }
    return L;
}
#undef PWC_B

/* One kernel's layout: 32-wide tiles (and 8 warps: pwc_threads) where they fit in the shared memory
 * a block may opt in to (optin), else 16-wide (4 warps). Twice the rows per block halve what the
 * inter-chunk products read of the states per multiply-add (from L2: 8 bytes per 16 of them at 16
 * rows, near its bandwidth at the f64 rate) and the barriers per tile's work, and give the
 * feature-tile products more of bmm's blocks; fewer blocks fit an SM (at D = Dv = 64 the
 * backward passes one of 8 warps instead of three or four of 4). Untimed: PENUMBRA_CUDA_POWER_TILE=16
 * or 32 forces a width (32 only where it fits), so a card can time both and the specs run both. */
inline pwc_lay pwc_lay_pick(int kind, int64_t D, int64_t Dw, size_t optin) {
    const char *e = getenv("PENUMBRA_CUDA_POWER_TILE");
    const pwc_lay wide = pwc_lay_of(kind, D, Dw, 32);
    const bool fits = (size_t)wide.total * sizeof(double) <= optin && !(e && atoi(e) == 16);
    return fits ? wide : pwc_lay_of(kind, D, Dw, 16);
}

struct pwc_geo {
    int64_t BH, N, D, Dv, Dw, Dp, c, nc;
    int p;
    double scale;
    const double *L;   /* (BH, N) cumulative log gates */
    const double *dec; /* (BH, nc) decay_m = exp(Le_m − Le_{m−1}), once a call (pwc_decays) */
    lin_tab tab;       /* lin_tab_upload_full */
};

/* tiles of ct rows per chunk */
__host__ __device__ inline int64_t pwc_nt(const pwc_geo &a, const pwc_lay &y) { return (a.c + y.ct - 1) / y.ct; }

/* L at the last row of chunk m of one (b, h) row of L; 0 before the first chunk */
__device__ inline double pwc_le(const pwc_geo &a, const double *L, int64_t m) { return m >= 0 ? L[m * a.c + a.c - 1] : 0; }

/* C (m × n, row stride ldc) = (acc ? C : 0) + Σ_{l<kk} A(i, l)·B(l, j), A(i, l) = A[i·ai + l·al],
 * B(l, j) = B[l·bl + j·bj]: the strides give the transposes. On the f64 tensor cores (pn_dmma_884,
 * mma.sync m8n8k4: twice the f64 FMA units' rate on an A100 or H100): each warp takes blocks of 8
 * rows × 8·NJ columns of C in turn, NJ accumulators side by side so that NJ mma chains overlap, and
 * walks k four at a time, each lane loading one value of A (shared by the NJ products) and NJ of B.
 * Each element of C is summed in l order, as the CPU sums it. Rows, columns and k past m, n, kk
 * are zeros in the operands and not stored. The thread-per-element tiles before took 0.75–1.5
 * shared-memory loads per multiply-add and the f64 FMA units; this takes (1 + NJ) / (8·NJ).
 * Every thread of the block calls (a warp collective inside), none may have returned. */
template <int NJ>
__device__ inline void bmm_dmma(double *C, int ldc, const double *A, int ai, int al, const double *B, int bl, int bj,
                                int m, int n, int kk, bool acc) {
    const int lane = (int)threadIdx.x & 31, g = lane >> 2, t = lane & 3, nw = (int)blockDim.x >> 5;
    const int nbj = (n + 8 * NJ - 1) / (8 * NJ), items = (m + 7) / 8 * nbj;
    for (int it = (int)threadIdx.x >> 5; it < items; it += nw) {
        const int i = it / nbj * 8 + g, j0 = it % nbj * 8 * NJ; /* the lane's row of A and C */
        double c[NJ][2];
#pragma unroll
        for (int u = 0; u < NJ; u++)
#pragma unroll
            for (int x = 0; x < 2; x++) {
                const int j = j0 + 8 * u + 2 * t + x;
                c[u][x] = acc && i < m && j < n ? C[i * ldc + j] : 0;
            }
        for (int l0 = 0; l0 < kk; l0 += 4) {
            const int l = l0 + t;
            const double av = i < m && l < kk ? A[i * ai + l * al] : 0;
#pragma unroll
            for (int u = 0; u < NJ; u++) {
                const int jb = j0 + 8 * u + g; /* the lane's column of B */
                pn_dmma_884(c[u], av, jb < n && l < kk ? B[l * bl + jb * bj] : 0, c[u]);
            }
        }
#pragma unroll
        for (int u = 0; u < NJ; u++)
#pragma unroll
            for (int x = 0; x < 2; x++) {
                const int j = j0 + 8 * u + 2 * t + x;
                if (i < m && j < n) C[i * ldc + j] = c[u][x];
            }
    }
}

/* 8 × 16 blocks (two chains a warp) where they still give every warp one, else 8 × 8 */
__device__ inline void bmm(double *C, int ldc, const double *A, int ai, int al, const double *B, int bl, int bj, int m,
                           int n, int kk, bool acc) {
    if (n > 8 && (m + 7) / 8 * ((n + 15) / 16) >= (int)blockDim.x / 32)
        bmm_dmma<2>(C, ldc, A, ai, al, B, bl, bj, m, n, kk, acc);
    else bmm_dmma<1>(C, ldc, A, ai, al, B, bl, bj, m, n, kk, acc);
}

/* The p = 2 chain rule after a feature tile's product, for n rows (or keys) of X with cotangents Gc
 * (n × nf, leading dimension ldT): a warp per row; lane f < nf runs step(r, f), which scales Gc's
 * element in place and returns the row's gate term for f, the terms summed into sum[r]; then the
 * lanes add the row's J_φᵀ Gc_r into Gx's row by coordinate (lin_phi2_grad_warp). One thread per row
 * before: one warp of the block busy. Every thread of the block calls. */
template <class Step>
__device__ inline void pwc_phi2_chain(const lin_tab &tab, const pwc_lay &y, int n, int nf, int64_t a0, const double *X,
                                      double *Gc, double *Gx, double *sum, Step step) {
    const int lane = (int)threadIdx.x & 31;
    for (int r = (int)threadIdx.x >> 5; r < n; r += (int)blockDim.x >> 5) {
        const double v = pn_cu_lanes_sum<32>(lane < nf ? step(r, lane) : 0);
        __syncwarp(); /* the row's scaled cotangents, read across the warp below */
        if (lane == 0) sum[r] += v;
        lin_phi2_grad_warp(tab, X + r * y.ldD, Gc + r * y.ldT, a0, nf, Gx + r * y.ldD, lane);
    }
}

/* s[r] += Σ_{c<n} M[r·rs + c·cs] for r < m, n ≤ 32: a warp per r, a lane per c, the lanes' values
 * summed by a butterfly (pn_cu_lanes_sum). One thread per r walked n dependent adds while the block's
 * other warps waited at the next barrier. Every thread of the block calls. */
__device__ inline void pwc_line_sums(double *s, const double *M, int rs, int cs, int m, int n) {
    const int lane = (int)threadIdx.x & 31;
    for (int r = (int)threadIdx.x >> 5; r < m; r += (int)blockDim.x >> 5) {
        const double v = pn_cu_lanes_sum<32>(lane < n ? M[r * rs + lane * cs] : 0);
        if (lane == 0) s[r] += v;
    }
}

/* rows [r0, r0 + n) of src (rows of w values, contiguous) times mul into dst (leading dim ld);
 * with ones, a last column of 1 (ṽ = [v, 1]). Rows ≥ n stay unwritten and are never read. */
template <class T>
__device__ inline void ld_rows(double *dst, int ld, const T *src, int64_t w, int64_t r0, int n, double mul, bool ones) {
    const int W = (int)w + (ones ? 1 : 0); /* 32-bit: a 64-bit division per element dominates a tile */
    for (int e = threadIdx.x; e < n * W; e += blockDim.x) {
        const int r = e / W, d = e - r * W;
        dst[r * ld + d] = d < w ? (double)src[(r0 + r) * w + d] * mul : 1.0;
    }
}

__device__ inline void ld_L(double *dst, const double *L, int64_t r0, int n) {
    for (int r = threadIdx.x; r < n; r += blockDim.x) dst[r] = L[r0 + r];
}

/* eq (nq) ← e^(L_r − Lp) of the nq rows whose L is in Lq: the factor of each row's inter-chunk terms,
 * once a block instead of once per φ feature */
__device__ inline void ld_eq(double *eq, const double *Lq, double Lp, int nq) {
    for (int r = threadIdx.x; r < nq; r += blockDim.x) eq[r] = exp(Lq[r] - Lp);
}

/* Ph (nr, nf) = φ(x_r)_a·mul_r for the nr rows of X and φ features [a0, a0 + nf) (mul NULL: 1) */
__device__ inline void phi_rows(const pwc_geo &a, const pwc_lay &y, const double *X, const double *mul, int64_t a0,
                                int nr, int nf, double *Ph) {
    for (int e = threadIdx.x; e < nr * nf; e += blockDim.x) {
        const int r = e / nf, f = e - r * nf;
        const double v = lin_phi_one(a.tab, X + r * y.ldD, a0 + f);
        Ph[r * y.ldT + f] = mul ? v * mul[r] : v;
    }
}

/* The inter-chunk loop over the φ features' tiles of one state S (Dp, Dw), which is read from
 * global memory (L2 or HBM) a tile at a time: tile t's rows land in buffer t % 2 (the layout's ST
 * and ST2) by cp.async, issued while tile t − 1 is computed on, so the loads' latency overlaps the
 * products instead of preceding each one. For the tile of features [a0, a0 + nf): body.prepare(a0,
 * nf) runs while its copies may still be in flight (after a barrier that ended the reads of the
 * tile before, so Ph and that tile's buffer may be refilled), body.run(a0, nf, Sx) after a barrier
 * past which every thread's copies have landed in Sx (nf, Dw; leading dimension ldW). */
template <class F>
__device__ inline void pwc_state_tiles(const pwc_geo &a, const pwc_lay &y, double *sm, const double *S, F body) {
    double *buf[2] = {sm + y.off[S_ST], sm + y.off[S_ST2]};
    const int Dw = (int)a.Dw;
    auto issue = [&](int64_t a0, double *dst) {
        const int nf = (int)(a.Dp - a0 < y.ct ? a.Dp - a0 : y.ct);
        for (int e = threadIdx.x; e < nf * Dw; e += blockDim.x) {
            const int r = e / Dw, w = e - r * Dw;
            pn_cu_cp_async8(dst + r * y.ldW + w, S + (a0 + r) * a.Dw + w);
        }
    };
    issue(0, buf[0]);
    pn_cu_cp_async_commit();
    for (int64_t t = 0, a0 = 0; a0 < a.Dp; t++, a0 += y.ct) {
        const int nf = (int)(a.Dp - a0 < y.ct ? a.Dp - a0 : y.ct);
        __syncthreads(); /* tile t − 1's readers are done: its buffer and Ph may be refilled */
        if (a0 + y.ct < a.Dp) issue(a0 + y.ct, buf[(t + 1) & 1]);
        pn_cu_cp_async_commit(); /* maybe empty: every iteration leaves one group in flight */
        body.prepare(a0, nf);
        pn_cu_cp_async_wait<1>(); /* this thread's copies of tile t … */
        __syncthreads();          /* … and everyone's */
        body.run(a0, nf, buf[t & 1]);
    }
}

/* the tile's pairs (query row r of X, key cc of K): s = qs·k into P (and with g, G̃·ṽ into P2) */
__device__ inline void pwc_pairs(const pwc_geo &a, const pwc_lay &y, double *sm, int nq, int nk, bool g) {
    bmm(sm + y.off[S_P], y.ldT, sm + y.off[S_X], y.ldD, 1, sm + y.off[S_K], 1, y.ldD, nq, nk, (int)a.D, false);
    if (g) bmm(sm + y.off[S_P2], y.ldT, sm + y.off[S_G], y.ldW, 1, sm + y.off[S_V], 1, y.ldW, nq, nk, (int)a.Dw, false);
}

/* State products. keys (x = k, Y = ṽ): St[m] ← Σ_{j ∈ chunk m} f_j φ(k_j) ṽ_jᵀ, f_j = exp(Le_m − L_j),
 * m < nc − 1 (the scan then adds the decayed earlier states). queries (x = scale·q, Y = G̃ = [G, gd]
 * from Gw): Dt[m] ← Σ_{i ∈ chunk m+1} e_i φ(qs_i) G̃_iᵀ, e_i = exp(L_i − Le_m) (∂ of the rows of
 * chunk m + 1 wrt the state entering it). A block per (bh, m, ct features); out (BH, nc−1, Dp, Dw). */
template <class T>
__global__ void pwc_state(pwc_geo a, pwc_lay y, int queries, const T *x, const T *v, const double *Gw, double *out) {
    PN_SHARED_DYN(double, sm);
    const int64_t nft = (a.Dp + y.ct - 1) / y.ct, ns = a.nc - 1, nblk = a.BH * ns * nft;
    double *X = sm + y.off[S_X], *Y = sm + y.off[S_V], *Ph = sm + y.off[S_PH], *Acc = sm + y.off[S_ACC],
           *W = sm + y.off[S_LQ];
    for (int64_t blk = blockIdx.x; blk < nblk; blk += gridDim.x) {
        const int64_t bh = blk / (ns * nft), m = blk / nft % ns, a0 = blk % nft * y.ct, s0 = (m + queries) * a.c;
        const int nf = (int)(a.Dp - a0 < y.ct ? a.Dp - a0 : y.ct);
        const double *L = a.L + bh * a.N, Lref = pwc_le(a, L, m);
        for (int64_t r0 = s0; r0 < s0 + a.c; r0 += y.ct) {
            const int n = (int)(s0 + a.c - r0 < y.ct ? s0 + a.c - r0 : y.ct);
            __syncthreads(); /* the previous tile's readers are done */
            ld_rows(X, y.ldD, x + bh * a.N * a.D, a.D, r0, n, queries ? a.scale : 1.0, false);
            if (queries) ld_rows(Y, y.ldW, Gw + bh * a.N * a.Dw, a.Dw, r0, n, 1.0, false);
            else ld_rows(Y, y.ldW, v + bh * a.N * a.Dv, a.Dv, r0, n, 1.0, true);
            for (int r = threadIdx.x; r < n; r += blockDim.x) /* power.c's chunk_phi weights */
                W[r] = queries ? exp(L[r0 + r] - Lref) : exp(-(L[r0 + r] - Lref));
            __syncthreads();
            for (int e = threadIdx.x; e < n * nf; e += blockDim.x) {
                const int r = e / nf, f = e - r * nf;
                Ph[r * y.ldT + f] = lin_phi_one(a.tab, X + r * y.ldD, a0 + f) * W[r];
            }
            __syncthreads();
            bmm(Acc, y.ldW, Ph, 1, y.ldT, Y, y.ldW, 1, nf, (int)a.Dw, n, r0 > s0); /* Acc += Phᵀ Y */
        }
        __syncthreads();
        double *o = out + ((bh * ns + m) * a.Dp + a0) * a.Dw;
        const int Dw = (int)a.Dw;
        for (int e = threadIdx.x; e < nf * Dw; e += blockDim.x) {
            const int f = e / Dw, w = e - f * Dw;
            o[e] = Acc[f * y.ldW + w];
        }
    }
}

/* dec (BH, nc) ← decay_m = exp(Le_m − Le_{m−1}): once a call, not once per state element and chunk
 * in the scans (135,200 exps per (b, h) and chunk at D = Dv = 64) */
__global__ void pwc_decays(pwc_geo a, double *dec) {
    PN_CU_LOOP(it, a.BH * a.nc) {
        const int64_t bh = it / a.nc, m = it - bh * a.nc;
        const double *L = a.L + bh * a.N;
        dec[it] = exp(pwc_le(a, L, m) - pwc_le(a, L, m - 1));
    }
}

/* The scan over chunk boundaries, one thread per (bh, element of Dp × Dw), in chunk order.
 * Forward: St[m] += decay_m St[m−1] (m = 1 … nc−2): the chunk products become the states entering
 * the chunks. Reverse: Dt[m] += decay_{m+1} Dt[m+1] (m = nc−3 … 0): the gradient of the state
 * entering chunk m + 1 collects the later chunks' rows through the decays. */
__global__ void pwc_scan(pwc_geo a, double *S, int reverse) {
    const int64_t E = a.Dp * a.Dw, ns = a.nc - 1;
    PN_CU_LOOP(it, a.BH * E) {
        const int64_t bh = it / E;
        double *s = S + bh * ns * E + (it - bh * E);
        const double *dec = a.dec + bh * a.nc;
        if (!reverse)
            for (int64_t m = 1; m < ns; m++) s[m * E] += dec[m] * s[(m - 1) * E];
        else
            for (int64_t m = ns - 2; m >= 0; m--) s[m * E] += dec[m + 1] * s[(m + 1) * E];
    }
}

/* the elementwise step of the intra-chunk tile: pairs j ≤ i of query rows [i0, i0+nq), keys [j0, j0+nk).
 * Forward (bw = false): P ← T_ij = E_ij s_ij^p (0 off the causal triangle), chunk_rows's maths.
 * Backward: with dT_ij = G̃_i·ṽ_j in P2, chunk_backward's maths: P ← ds_ij = dT E p s^{p−1},
 * P2 ← T_ij = E s^{p−1} s, and (keys side, P3 given) P3 ← dT·T; the query side (P3 NULL) keeps
 * dT·T in P2 instead of T. */
__device__ inline void pwc_tri(const pwc_geo &a, const pwc_lay &y, double *sm, int64_t i0, int nq, int64_t j0, int nk,
                               bool bw, bool keys) {
    double *P = sm + y.off[S_P], *P2 = sm + y.off[S_P2], *P3 = keys ? sm + y.off[S_P3] : NULL;
    const double *Lq = sm + y.off[S_LQ], *Lk = sm + y.off[S_LK];
    for (int e = threadIdx.x; e < nq * nk; e += blockDim.x) {
        const int r = e / nk, cc = e - r * nk;
        const int x = r * y.ldT + cc;
        if (j0 + cc > i0 + r) {
            P[x] = 0;
            if (bw) P2[x] = 0;
            if (P3) P3[x] = 0;
            continue;
        }
        const double E = exp(Lq[r] - Lk[cc]), s = P[x];
        if (!bw) {
            P[x] = E * ipow(s, a.p);
            continue;
        }
        const double sp1 = ipow(s, a.p - 1), Tv = E * sp1 * s, dT = P2[x];
        P[x] = dT * E * a.p * sp1;
        if (P3) P2[x] = Tv, P3[x] = dT * Tv;
        else P2[x] = dT * Tv;
    }
}

/* Rows of one (bh, chunk, y.ct query rows): num_i, den_i = Σ_{j ≤ i in the chunk} T_ij ṽ_j + e_i φ(qs_i)ᵀ
 * S̃ (the state entering the chunk, none for the first), out_i = num_i/den_i (0 where den_i = 0).
 * With g (the backward): Gw_i ← [g_i/den_i, −g_i·out_i/den_i] instead of out (chunk_backward's G, gd). */
template <class T>
__global__ void pwc_fwd(pwc_geo a, pwc_lay y, const T *q, const T *k, const T *v, const double *St, const T *g, T *out,
                        double *Gw) {
    PN_SHARED_DYN(double, sm);
    const int64_t nt = pwc_nt(a, y), nblk = a.BH * a.nc * nt, ns = a.nc - 1;
    double *X = sm + y.off[S_X], *K = sm + y.off[S_K], *V = sm + y.off[S_V], *P = sm + y.off[S_P],
           *Acc = sm + y.off[S_ACC], *Ph = sm + y.off[S_PH], *Lq = sm + y.off[S_LQ],
           *Lk = sm + y.off[S_LK], *Eq = sm + y.off[S_EQ];
    for (int64_t blk = blockIdx.x; blk < nblk; blk += gridDim.x) {
        const int64_t bh = blk / (a.nc * nt), ci = blk / nt % a.nc, s0 = ci * a.c, s1 = s0 + a.c,
                      i0 = s0 + blk % nt * y.ct;
        const int nq = (int)(s1 - i0 < y.ct ? s1 - i0 : y.ct);
        const double *L = a.L + bh * a.N;
        __syncthreads(); /* the previous block's readers are done */
        ld_rows(X, y.ldD, q + bh * a.N * a.D, a.D, i0, nq, a.scale, false);
        ld_L(Lq, L, i0, nq);
        for (int e = threadIdx.x; e < nq * a.Dw; e += blockDim.x) Acc[e / a.Dw * y.ldW + e % a.Dw] = 0;
        for (int64_t j0 = s0; j0 < i0 + nq; j0 += y.ct) { /* intra-chunk, keys up to the tile's last row */
            const int nk = (int)(s1 - j0 < y.ct ? s1 - j0 : y.ct);
            __syncthreads();
            ld_rows(K, y.ldD, k + bh * a.N * a.D, a.D, j0, nk, 1.0, false);
            ld_rows(V, y.ldW, v + bh * a.N * a.Dv, a.Dv, j0, nk, 1.0, true);
            ld_L(Lk, L, j0, nk);
            __syncthreads();
            pwc_pairs(a, y, sm, nq, nk, false);
            __syncthreads();
            pwc_tri(a, y, sm, i0, nq, j0, nk, false, false);
            __syncthreads();
            bmm(Acc, y.ldW, P, y.ldT, 1, V, y.ldW, 1, nq, (int)a.Dw, nk, true); /* += T Ṽ */
        }
        if (ci > 0) { /* inter-chunk: the state entering the chunk */
            const double Lp = pwc_le(a, L, ci - 1), *S = St + (bh * ns + ci - 1) * a.Dp * a.Dw;
            ld_eq(Eq, Lq, Lp, nq); /* read after the loop's first barrier */
            struct {
                const pwc_geo &a;
                const pwc_lay &y;
                const double *X, *Eq;
                double *Ph, *Acc;
                int nq;
                __device__ void prepare(int64_t a0, int nf) { phi_rows(a, y, X, Eq, a0, nq, nf, Ph); }
                __device__ void run(int64_t, int nf, const double *Sx) {
                    bmm(Acc, y.ldW, Ph, y.ldT, 1, Sx, y.ldW, 1, nq, (int)a.Dw, nf, true); /* += Φq_e S̃ */
                }
            } body{a, y, X, Eq, Ph, Acc, nq};
            pwc_state_tiles(a, y, sm, S, body);
        }
        __syncthreads();
        const int64_t Dv = a.Dv;
        if (!g) {
            for (int e = threadIdx.x; e < nq * Dv; e += blockDim.x) {
                const int r = (int)(e / Dv), x = (int)(e - r * Dv);
                const double den = Acc[r * y.ldW + Dv], inv = den != 0 ? 1.0 / den : 0;
                out[(bh * a.N + i0 + r) * Dv + x] = (T)(Acc[r * y.ldW + x] * inv);
            }
            continue;
        }
        for (int r = threadIdx.x; r < nq; r += blockDim.x) { /* one thread per row: the row's g·out */
            const int64_t row = bh * a.N + i0 + r;
            const double den = Acc[r * y.ldW + Dv], *nr = Acc + r * y.ldW;
            double *G = Gw + row * a.Dw;
            if (den == 0) {
                for (int64_t x = 0; x <= Dv; x++) G[x] = 0;
                continue;
            }
            const double inv = 1.0 / den;
            double go = 0;
            for (int64_t x = 0; x < Dv; x++) go += (double)g[row * Dv + x] * (nr[x] * inv);
            for (int64_t x = 0; x < Dv; x++) G[x] = (double)g[row * Dv + x] * inv;
            G[Dv] = -go * inv;
        }
    }
}

/* The query side of the backward, one (bh, chunk, y.ct query rows) per block:
 *   intra   g qs_i = Σ_j ds_ij k_j;  gLr_i += Σ_j dT_ij T_ij  (i the later index of E_ij)
 *   inter   SG_i = S̃ G̃_i;  g qs_i += J_φ(qs_i)ᵀ (e_i SG_i);  ge_i = e_i φ(qs_i)·SG_i, added to gLr_i
 *           (and subtracted at the previous chunk's last row by pwc_gates)
 * gq = scale·g qs. */
template <class T>
__global__ void pwc_bwq(pwc_geo a, pwc_lay y, const T *q, const T *k, const T *v, const double *Gw, const double *St,
                        T *gq, double *gLr, double *ge) {
    PN_SHARED_DYN(double, sm);
    const int64_t nt = pwc_nt(a, y), nblk = a.BH * a.nc * nt, ns = a.nc - 1, D = a.D;
    double *X = sm + y.off[S_X], *K = sm + y.off[S_K], *V = sm + y.off[S_V], *G = sm + y.off[S_G],
           *P = sm + y.off[S_P], *P2 = sm + y.off[S_P2], *Ph = sm + y.off[S_PH], *SG = sm + y.off[S_T],
           *Gq = sm + y.off[S_ACCD], *Lq = sm + y.off[S_LQ], *Lk = sm + y.off[S_LK],
           *gl = sm + y.off[S_R1], *gev = sm + y.off[S_R2], *Eq = sm + y.off[S_EQ];
    for (int64_t blk = blockIdx.x; blk < nblk; blk += gridDim.x) {
        const int64_t bh = blk / (a.nc * nt), ci = blk / nt % a.nc, s0 = ci * a.c, s1 = s0 + a.c,
                      i0 = s0 + blk % nt * y.ct;
        const int nq = (int)(s1 - i0 < y.ct ? s1 - i0 : y.ct);
        const double *L = a.L + bh * a.N;
        __syncthreads();
        ld_rows(X, y.ldD, q + bh * a.N * D, D, i0, nq, a.scale, false);
        ld_rows(G, y.ldW, Gw + bh * a.N * a.Dw, a.Dw, i0, nq, 1.0, false);
        ld_L(Lq, L, i0, nq);
        for (int e = threadIdx.x; e < nq * D; e += blockDim.x) Gq[e / D * y.ldD + e % D] = 0;
        for (int r = threadIdx.x; r < nq; r += blockDim.x) gl[r] = gev[r] = 0;
        for (int64_t j0 = s0; j0 < i0 + nq; j0 += y.ct) {
            const int nk = (int)(s1 - j0 < y.ct ? s1 - j0 : y.ct);
            __syncthreads();
            ld_rows(K, y.ldD, k + bh * a.N * D, D, j0, nk, 1.0, false);
            ld_rows(V, y.ldW, v + bh * a.N * a.Dv, a.Dv, j0, nk, 1.0, true);
            ld_L(Lk, L, j0, nk);
            __syncthreads();
            pwc_pairs(a, y, sm, nq, nk, true);
            __syncthreads();
            pwc_tri(a, y, sm, i0, nq, j0, nk, true, false);
            __syncthreads();
            bmm(Gq, y.ldD, P, y.ldT, 1, K, y.ldD, 1, nq, (int)D, nk, true); /* += ds K */
            pwc_line_sums(gl, P2, y.ldT, 1, nq, nk); /* the rows' Σ_j dT_ij T_ij */
        }
        if (ci > 0) {
            const double Lp = pwc_le(a, L, ci - 1), *S = St + (bh * ns + ci - 1) * a.Dp * a.Dw;
            ld_eq(Eq, Lq, Lp, nq); /* read after the loop's first barrier */
            struct {
                const pwc_geo &a;
                const pwc_lay &y;
                const double *X, *G, *Eq;
                double *Ph, *SG, *Gq, *gev;
                int nq;
                __device__ void prepare(int64_t a0, int nf) { phi_rows(a, y, X, Eq, a0, nq, nf, Ph); }
                __device__ void run(int64_t a0, int nf, const double *Sx) {
                    bmm(SG, y.ldT, G, y.ldW, 1, Sx, 1, y.ldW, nq, nf, (int)a.Dw, false); /* G̃ S̃ᵀ */
                    __syncthreads();
                    if (a.tab.p == 2)
                        pwc_phi2_chain(a.tab, y, nq, nf, a0, X, SG, Gq, gev, [&](int r, int f) {
                            const double v = Ph[r * y.ldT + f] * SG[r * y.ldT + f]; /* before e_r */
                            SG[r * y.ldT + f] *= Eq[r];
                            return v;
                        });
                    else
                        for (int r = threadIdx.x; r < nq; r += blockDim.x) { /* one thread per row: φ's chain rule */
                            double *sg = SG + r * y.ldT;
                            const double *ph = Ph + r * y.ldT, e = Eq[r];
                            double acc = gev[r];
                            for (int f = 0; f < nf; f++) {
                                acc += ph[f] * sg[f];
                                sg[f] *= e;
                            }
                            gev[r] = acc;
                            lin_phi_grad_part(a.tab, X + r * y.ldD, sg, a0, nf, Gq + r * y.ldD);
                        }
                }
            } body{a, y, X, G, Eq, Ph, SG, Gq, gev, nq};
            pwc_state_tiles(a, y, sm, S, body);
        }
        __syncthreads();
        if (gq)
            for (int e = threadIdx.x; e < nq * D; e += blockDim.x) {
                const int r = (int)(e / D), d = (int)(e - r * D);
                gq[(bh * a.N + i0 + r) * D + d] = (T)(Gq[r * y.ldD + d] * a.scale);
            }
        for (int r = threadIdx.x; r < nq; r += blockDim.x) {
            gLr[bh * a.N + i0 + r] = gl[r] + gev[r];
            ge[bh * a.N + i0 + r] = gev[r];
        }
    }
}

/* The key side of the backward, one (bh, chunk, y.ct keys) per block:
 *   intra   g k_j = Σ_i ds_ij qs_i;  g v_j = Σ_i T_ij G_i;  gLc_j −= Σ_i dT_ij T_ij  (j the earlier index)
 *   state   (not the last chunk; D̃ = Dt[chunk], the gradient of the state leaving it)
 *           t_j = f_j D̃ ṽ_j;  g k_j += J_φ(k_j)ᵀ t_j;  gf_j = φ(k_j)·t_j, subtracted from gLc_j (and
 *           added at the chunk's last row by pwc_gates);  g v_j += f_j φ(k_j)ᵀ D̃[:, :Dv] */
template <class T>
__global__ void pwc_bwk(pwc_geo a, pwc_lay y, const T *q, const T *k, const T *v, const double *Gw, const double *Dt,
                        T *gk, T *gv, double *gLc, double *gf) {
    PN_SHARED_DYN(double, sm);
    const int64_t nt = pwc_nt(a, y), nblk = a.BH * a.nc * nt, ns = a.nc - 1, D = a.D, Dv = a.Dv;
    double *X = sm + y.off[S_X], *K = sm + y.off[S_K], *V = sm + y.off[S_V], *G = sm + y.off[S_G],
           *P = sm + y.off[S_P], *P2 = sm + y.off[S_P2], *P3 = sm + y.off[S_P3], *Ph = sm + y.off[S_PH],
           *Tt = sm + y.off[S_T], *Gv = sm + y.off[S_ACC], *Gk = sm + y.off[S_ACCD],
           *Lq = sm + y.off[S_LQ], *Lk = sm + y.off[S_LK], *gl = sm + y.off[S_R1], *gfv = sm + y.off[S_R2],
           *fk = sm + y.off[S_R3];
    for (int64_t blk = blockIdx.x; blk < nblk; blk += gridDim.x) {
        const int64_t bh = blk / (a.nc * nt), ci = blk / nt % a.nc, s0 = ci * a.c, s1 = s0 + a.c,
                      j0 = s0 + blk % nt * y.ct;
        const int nk = (int)(s1 - j0 < y.ct ? s1 - j0 : y.ct);
        const double *L = a.L + bh * a.N;
        __syncthreads();
        ld_rows(K, y.ldD, k + bh * a.N * D, D, j0, nk, 1.0, false);
        ld_rows(V, y.ldW, v + bh * a.N * Dv, Dv, j0, nk, 1.0, true);
        ld_L(Lk, L, j0, nk);
        for (int e = threadIdx.x; e < nk * D; e += blockDim.x) Gk[e / D * y.ldD + e % D] = 0;
        for (int e = threadIdx.x; e < nk * Dv; e += blockDim.x) Gv[e / Dv * y.ldW + e % Dv] = 0;
        for (int r = threadIdx.x; r < nk; r += blockDim.x) gl[r] = gfv[r] = 0;
        for (int64_t i0 = j0; i0 < s1; i0 += y.ct) { /* the chunk's queries at or after the tile's first key */
            const int nq = (int)(s1 - i0 < y.ct ? s1 - i0 : y.ct);
            __syncthreads();
            ld_rows(X, y.ldD, q + bh * a.N * D, D, i0, nq, a.scale, false);
            ld_rows(G, y.ldW, Gw + bh * a.N * a.Dw, a.Dw, i0, nq, 1.0, false);
            ld_L(Lq, L, i0, nq);
            __syncthreads();
            pwc_pairs(a, y, sm, nq, nk, true);
            __syncthreads();
            pwc_tri(a, y, sm, i0, nq, j0, nk, true, true);
            __syncthreads();
            bmm(Gk, y.ldD, P, 1, y.ldT, X, y.ldD, 1, nk, (int)D, nq, true);  /* += dsᵀ Qs */
            bmm(Gv, y.ldW, P2, 1, y.ldT, G, y.ldW, 1, nk, (int)Dv, nq, true); /* += Tᵀ G */
            pwc_line_sums(gl, P3, 1, y.ldT, nk, nq); /* the keys' Σ_i dT_ij T_ij */
        }
        if (ci < ns) { /* the update that produced the state leaving this chunk */
            const double Le = pwc_le(a, L, ci), *Ds = Dt + (bh * ns + ci) * a.Dp * a.Dw;
            for (int cc = threadIdx.x; cc < nk; cc += blockDim.x) fk[cc] = exp(Le - Lk[cc]); /* read after
                                                                                       the loop's first barrier */
            struct {
                const pwc_geo &a;
                const pwc_lay &y;
                const double *K, *V, *fk;
                double *Ph, *Tt, *Gk, *Gv, *gfv;
                int nk;
                __device__ void prepare(int64_t a0, int nf) { phi_rows(a, y, K, NULL, a0, nk, nf, Ph); }
                __device__ void run(int64_t a0, int nf, const double *Dx) {
                    bmm(Tt, y.ldT, V, y.ldW, 1, Dx, 1, y.ldW, nk, nf, (int)a.Dw, false); /* Ṽ D̃ᵀ */
                    __syncthreads();
                    if (a.tab.p == 2)
                        pwc_phi2_chain(a.tab, y, nk, nf, a0, K, Tt, Gk, gfv, [&](int cc, int f) {
                            double *t = Tt + cc * y.ldT + f, *ph = Ph + cc * y.ldT + f;
                            *t *= fk[cc];
                            const double v = *ph * *t; /* after f_j */
                            *ph *= fk[cc];
                            return v;
                        });
                    else
                        for (int cc = threadIdx.x; cc < nk; cc += blockDim.x) { /* one thread per key */
                            double *t = Tt + cc * y.ldT, *ph = Ph + cc * y.ldT, acc = gfv[cc];
                            for (int f = 0; f < nf; f++) {
                                t[f] *= fk[cc];
                                acc += ph[f] * t[f];
                                ph[f] *= fk[cc];
                            }
                            gfv[cc] = acc;
                            lin_phi_grad_part(a.tab, K + cc * y.ldD, t, a0, nf, Gk + cc * y.ldD);
                        }
                    __syncthreads();
                    bmm(Gv, y.ldW, Ph, y.ldT, 1, Dx, y.ldW, 1, nk, (int)a.Dv, nf, true); /* += diag(f) φ(K) D̃ */
                }
            } body{a, y, K, V, fk, Ph, Tt, Gk, Gv, gfv, nk};
            pwc_state_tiles(a, y, sm, Ds, body);
        }
        __syncthreads();
        for (int e = threadIdx.x; e < nk * D; e += blockDim.x) {
            const int r = (int)(e / D), d = (int)(e - r * D);
            if (gk) gk[(bh * a.N + j0 + r) * D + d] = (T)Gk[r * y.ldD + d];
        }
        for (int e = threadIdx.x; e < nk * Dv; e += blockDim.x) {
            const int r = (int)(e / Dv), x = (int)(e - r * Dv);
            if (gv) gv[(bh * a.N + j0 + r) * Dv + x] = (T)Gv[r * y.ldW + x];
        }
        for (int r = threadIdx.x; r < nk; r += blockDim.x) {
            gLc[bh * a.N + j0 + r] = -gl[r] - gfv[r];
            gf[bh * a.N + j0 + r] = gfv[r];
        }
    }
}

/* gdec (BH, nc): chunk ci's decay term decay_ci ⟨D̃ leaving ci, S̃ entering ci⟩ for 0 < ci < nc − 1,
 * else 0; a block per (bh, ci), the dot product reduced by a fixed tree */
__global__ void pwc_gdec(pwc_geo a, const double *St, const double *Dt, double *gdec) {
    PN_SHARED(double, red, CTH);
    const int64_t ns = a.nc - 1, E = a.Dp * a.Dw;
    for (int64_t blk = blockIdx.x; blk < a.BH * a.nc; blk += gridDim.x) {
        const int64_t bh = blk / a.nc, ci = blk % a.nc;
        const bool live = ci >= 1 && ci < ns;
        double s = 0;
        if (live) {
            const double *Dx = Dt + (bh * ns + ci) * E, *Sx = St + (bh * ns + ci - 1) * E;
            for (int64_t x = threadIdx.x; x < E; x += blockDim.x) s += Dx[x] * Sx[x];
        }
        red[threadIdx.x] = s;
        __syncthreads();
        for (unsigned w = blockDim.x / 2; w > 0; w >>= 1) {
            if (threadIdx.x < w) red[threadIdx.x] += red[threadIdx.x + w];
            __syncthreads();
        }
        if (threadIdx.x == 0) gdec[blk] = live ? a.dec[bh * a.nc + ci] * red[0] : 0;
        __syncthreads(); /* red is rewritten for the next block */
    }
}

/* gL_t = gLr_t + gLc_t and, at the last row t of chunk m < nc − 1, the boundary terms: + Σ_{j ∈ m} gf_j
 * + gdec_m (added at the later index) − Σ_{i ∈ m+1} ge_i − gdec_{m+1} (subtracted at the earlier one),
 * in power.c's order, into gLr (in place: a thread reads its own t's gLr and gLc, and gf, ge). One
 * thread per (b, h, t); pw_scan then runs the reverse sum, g log_gate. */
__global__ void pwc_gate_terms(pwc_geo a, double *gLr, const double *gLc, const double *ge, const double *gf,
                               const double *gdec) {
    PN_CU_LOOP(it, a.BH * a.N) {
        const int64_t bh = it / a.N, o = bh * a.N, t = it - o, c = a.c, m = t / c;
        double x = gLr[it] + gLc[it];
        if (t == m * c + c - 1 && m + 1 < a.nc) {
            double sf = 0, se = 0;
            for (int64_t j = m * c; j <= t; j++) sf += gf[o + j];
            for (int64_t i = t + 1; i <= t + c; i++) se += ge[o + i];
            x += sf + gdec[bh * a.nc + m] - se - gdec[bh * a.nc + m + 1];
        }
        gLr[it] = x;
    }
}

/* ---- chunked form: the host side ---- */
struct pwc_plan {
    pwc_geo a;
    pwc_lay ls, lf, lq, lk; /* K_STATE, K_FWD, K_BWQ, K_BWK */
};

/* Launch kf over nblk blocks (a grid capped at INT32_MAX; the kernels loop over the rest) of y's
 * threads with y's dynamic shared memory, asking for more than the default 48 KiB when needed. */
template <typename K, typename... A>
pn_status pwc_launch(const char *op, K kf, int64_t nblk, const pwc_lay &y, A... args) {
    if (nblk < 1) return PN_OK;
    const size_t bytes = (size_t)y.total * sizeof(double);
    if (bytes > 48 * 1024)
        PN_CU_TRY(op, cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    const unsigned grid = (unsigned)(nblk < INT32_MAX ? nblk : INT32_MAX);
    return pn_cu_check(op, PN_LAUNCH(kf, grid, pwc_threads(y.ct), bytes, pn_cu_stream(), args...));
}

/* The plan of a chunked call: *use false (nothing allocated) when its 16-wide tiles do not fit the
 * device's shared memory (D or Dv in the hundreds in f64), and the caller runs the quadratic kernels,
 * which compute the same function. Else each kernel's layout (pwc_lay_pick), L, the φ table on the
 * device, the geometry; the state buffers' sizes checked for overflow. */
pn_status pwc_plan_of(const char *op, const pn_tensor *q, const pn_tensor *v, const pn_tensor *lg, int p, int64_t chunk,
                      double scale, const pn_sympow_table *tab, bool bw, lin_scratch &s, pwc_plan *P, bool *use) {
    const int64_t D = q->sizes[3], Dw = v->sizes[3] + 1;
    *use = D < INT32_MAX / 2 && Dw < INT32_MAX / 2;
    if (!*use) return PN_OK;
    const size_t optin = pn_cu_smem_optin();
    int64_t need = pwc_lay_of(K_STATE, D, Dw, 16).total, fw = pwc_lay_of(K_FWD, D, Dw, 16).total;
    need = fw > need ? fw : need;
    if (bw) { /* K_BWK holds every slab of K_BWQ */
        const int64_t bk = pwc_lay_of(K_BWK, D, Dw, 16).total;
        need = bk > need ? bk : need;
    }
    *use = (size_t)need * sizeof(double) <= optin;
    if (!*use) return PN_OK;
    P->ls = pwc_lay_pick(K_STATE, D, Dw, optin), P->lf = pwc_lay_pick(K_FWD, D, Dw, optin);
    P->lq = pwc_lay_pick(K_BWQ, D, Dw, optin), P->lk = pwc_lay_pick(K_BWK, D, Dw, optin);
    pwc_geo &a = P->a;
    a.BH = q->sizes[0] * q->sizes[1], a.N = q->sizes[2], a.D = D, a.Dv = Dw - 1, a.Dw = Dw, a.Dp = tab->Dp;
    a.c = chunk, a.nc = a.N / chunk, a.p = p, a.scale = scale;
    const int64_t st[4] = {a.BH, a.nc > 1 ? a.nc - 1 : 1, a.Dp, Dw}, rows[3] = {a.BH, a.N, Dw};
    PN_TRY(pn_check_shape(op, 4, st, PN_F64));   /* the state buffers (BH, nc − 1, Dp, Dw) */
    PN_TRY(pn_check_shape(op, 3, rows, PN_F64)); /* G̃ (BH, N, Dw) */
    pw_geo g;
    PN_TRY(pw_setup(op, q, v, lg, p, 1, scale, s, &g));
    a.L = g.L;
    double *dec = (double *)lin_alloc(s, a.BH * a.nc, PN_F64); /* at most L's size */
    if (!dec) return pn_error(PN_ERR_OOM, "%s: out of device memory for q %s", op, pn_shape_str(q));
    a.dec = dec;
    if (a.BH * a.nc > 0)
        PN_CU_TRY(op, PN_LAUNCH(pwc_decays, pn_cu_blocks(a.BH * a.nc), PN_CU_THREADS, 0, pn_cu_stream(), a, dec));
    return lin_tab_upload_full(op, tab, s, &a.tab);
}

/* St (BH, nc − 1, Dp, Dw) ← the state entering each chunk after the first */
template <class T> pn_status pwc_states(const char *op, const pwc_plan &P, const T *k, const T *v, double *St) {
    const pwc_geo &a = P.a;
    const int64_t nft = (a.Dp + P.ls.ct - 1) / P.ls.ct, E = a.Dp * a.Dw;
    auto ks = pwc_state<T>;
    PN_TRY(pwc_launch(op, ks, a.BH * (a.nc - 1) * nft, P.ls, a, P.ls, 0, k, v, (const double *)NULL, St));
    if (a.nc > 2) PN_CU_TRY(op, PN_LAUNCH(pwc_scan, pn_cu_blocks(a.BH * E), PN_CU_THREADS, 0, pn_cu_stream(), a, St, 0));
    return PN_OK;
}

/* out (T) or, with g, Gw (BH, N, Dw) = [G, gd] */
template <class T>
pn_status pwc_forward(const char *op, const pn_tensor *q, const pn_tensor *k, const pn_tensor *v, const pn_tensor *g,
                      const pwc_plan &P, lin_scratch &s, pn_tensor *out, double **Gw, double **St) {
    const pwc_geo &a = P.a;
    *St = (double *)lin_alloc(s, a.BH * (a.nc - 1) * a.Dp * a.Dw, PN_F64);
    if (g) *Gw = (double *)lin_alloc(s, a.BH * a.N * a.Dw, PN_F64);
    if (!*St || (g && !*Gw))
        return pn_error(PN_ERR_OOM, "%s: out of device memory for the chunk states of q %s, v %s", op, pn_shape_str(q),
                        pn_shape_str(v));
    const T *K = (const T *)pn_ptr(k), *V = (const T *)pn_ptr(v);
    PN_TRY(pwc_states<T>(op, P, K, V, *St));
    auto kf = pwc_fwd<T>;
    return pwc_launch(op, kf, a.BH * a.nc * pwc_nt(a, P.lf), P.lf, a, P.lf, (const T *)pn_ptr(q), K, V, (const double *)*St,
                      g ? (const T *)pn_ptr(g) : (const T *)NULL, out ? (T *)pn_ptr(out) : (T *)NULL,
                      g ? *Gw : (double *)NULL);
}

template <class T>
pn_status pwc_backward(const char *op, const pn_tensor *q, const pn_tensor *k, const pn_tensor *v, const pn_tensor *g,
                       const pwc_plan &P, lin_scratch &s, pn_tensor *gq, pn_tensor *gk, pn_tensor *gv, pn_tensor *glg) {
    const pwc_geo &a = P.a;
    double *Gw = NULL, *St = NULL;
    PN_TRY(pwc_forward<T>(op, q, k, v, g, P, s, NULL, &Gw, &St));
    const int64_t rows = a.BH * a.N, nft = (a.Dp + P.ls.ct - 1) / P.ls.ct, E = a.Dp * a.Dw;
    double *Dt = (double *)lin_alloc(s, a.BH * (a.nc - 1) * E, PN_F64), *r4 = (double *)lin_alloc(s, 4 * rows, PN_F64),
           *gdec = (double *)lin_alloc(s, a.BH * a.nc, PN_F64);
    if (!Dt || !r4 || !gdec)
        return pn_error(PN_ERR_OOM, "%s: backward out of device memory for the chunk states of q %s, v %s", op,
                        pn_shape_str(q), pn_shape_str(v));
    double *gLr = r4, *gLc = r4 + rows, *ge = gLc + rows, *gf = ge + rows;
    const T *Q = (const T *)pn_ptr(q), *K = (const T *)pn_ptr(k), *V = (const T *)pn_ptr(v);
    auto ks = pwc_state<T>; /* the gradient of each chunk boundary's state: its rows, then the later ones */
    PN_TRY(pwc_launch(op, ks, a.BH * (a.nc - 1) * nft, P.ls, a, P.ls, 1, Q, V, (const double *)Gw, Dt));
    if (a.nc > 2) PN_CU_TRY(op, PN_LAUNCH(pwc_scan, pn_cu_blocks(a.BH * E), PN_CU_THREADS, 0, pn_cu_stream(), a, Dt, 1));
    if (gq || glg) {
        auto kq = pwc_bwq<T>;
        PN_TRY(pwc_launch(op, kq, a.BH * a.nc * pwc_nt(a, P.lq), P.lq, a, P.lq, Q, K, V, (const double *)Gw, (const double *)St,
                          gq ? (T *)pn_ptr(gq) : (T *)NULL, gLr, ge));
    }
    if (gk || gv || glg) {
        auto kk = pwc_bwk<T>;
        PN_TRY(pwc_launch(op, kk, a.BH * a.nc * pwc_nt(a, P.lk), P.lk, a, P.lk, Q, K, V, (const double *)Gw, (const double *)Dt,
                          gk ? (T *)pn_ptr(gk) : (T *)NULL, gv ? (T *)pn_ptr(gv) : (T *)NULL, gLc, gf));
    }
    if (!glg) return PN_OK;
    const unsigned nb = (unsigned)(a.BH * a.nc < 65535 ? a.BH * a.nc : 65535);
    PN_CU_TRY(op, PN_LAUNCH(pwc_gdec, nb, CTH, 0, pn_cu_stream(), a, (const double *)St, (const double *)Dt, gdec));
    PN_CU_TRY(op, PN_LAUNCH(pwc_gate_terms, pn_cu_blocks(rows), PN_CU_THREADS, 0, pn_cu_stream(), a, gLr,
                            (const double *)gLc, (const double *)ge, (const double *)gf, (const double *)gdec));
    return pw_scan(op, a.BH, a.N, (const double *)gLr, (const double *)NULL, (T *)pn_ptr(glg), 1);
}

} // namespace

/* x (…, D), out (…, Dp) contiguous */
pn_status pn_cuda_sympow_fwd(const pn_sympow_table *t, const pn_tensor *x, pn_tensor *out) {
    const char *op = "sympow_embed";
    const int64_t R = pn_numel(x) / t->D;
    if (R == 0) return PN_OK;
    lin_scratch s = {};
    lin_tab tab;
    pn_status st = lin_tab_upload(op, t, s, &tab);
    double *scr = st ? NULL : (double *)lin_alloc(s, R * (t->D + t->Dp), PN_F64);
    if (!st && !scr) st = pn_error(PN_ERR_OOM, "%s: out of device memory for x %s", op, pn_shape_str(x));
    if (!st)
        PN_CU_FLOAT_SWITCH(x->dt, T, {
            auto kn = sympow_fwd_k<T>;
            st = pn_cu_check(op, PN_LAUNCH(kn, pn_cu_blocks(R, PW_THREADS), PW_THREADS, 0, pn_cu_stream(), tab, R,
                                           (const T *)pn_ptr(x), (T *)pn_ptr(out), scr));
        });
    lin_free(s);
    return st;
}

pn_status pn_cuda_sympow_bwd(const pn_sympow_table *t, const pn_tensor *x, const pn_tensor *g, pn_tensor *gx) {
    const char *op = "sympow_embed";
    const int64_t R = pn_numel(x) / t->D;
    if (R == 0) return PN_OK;
    lin_scratch s = {};
    lin_tab tab;
    pn_status st = lin_tab_upload(op, t, s, &tab);
    double *scr = st ? NULL : (double *)lin_alloc(s, R * (2 * t->D + t->Dp), PN_F64);
    if (!st && !scr) st = pn_error(PN_ERR_OOM, "%s: backward out of device memory for x %s", op, pn_shape_str(x));
    if (!st)
        PN_CU_FLOAT_SWITCH(x->dt, T, {
            auto kn = sympow_bwd_k<T>;
            st = pn_cu_check(op, PN_LAUNCH(kn, pn_cu_blocks(R, PW_THREADS), PW_THREADS, 0, pn_cu_stream(), tab, R,
                                           (const T *)pn_ptr(x), (const T *)pn_ptr(g), (T *)pn_ptr(gx), scr));
        });
    lin_free(s);
    return st;
}

/* q, k (B, H, N, D), v, out (B, H, N, Dv), lg (B, H, N) or NULL, contiguous; chunk > 0 (causal,
 * dividing N: power.c checks) with tab its φ table runs the chunked kernels, chunk = 0 (or tiles
 * too wide for the device's shared memory) the quadratic ones */
pn_status pn_cuda_power_fwd(const pn_tensor *q, const pn_tensor *k, const pn_tensor *v, const pn_tensor *lg, int p,
                            int causal, int64_t chunk, double scale, const pn_sympow_table *tab, pn_tensor *out) {
    const char *op = "power_attention";
    if (pn_numel(out) == 0) return PN_OK;
    lin_scratch s = {};
    if (chunk > 0 && causal && tab) {
        pwc_plan P;
        bool use;
        pn_status st = pwc_plan_of(op, q, v, lg, p, chunk, scale, tab, false, s, &P, &use);
        if (!st && use) {
            double *Gw, *St;
            PN_CU_FLOAT_SWITCH(q->dt, T, { st = pwc_forward<T>(op, q, k, v, NULL, P, s, out, &Gw, &St); });
        }
        if (st || use) {
            lin_free(s);
            return st;
        }
    }
    pw_geo a;
    pn_status st = pw_setup(op, q, v, lg, p, causal, scale, s, &a);
    const int64_t rows = a.B * a.H * a.N;
    double *o64 = st ? NULL : (double *)lin_alloc(s, rows * a.Dv, PN_F64);
    if (!st && !o64) st = pn_error(PN_ERR_OOM, "%s: out of device memory for q %s", op, pn_shape_str(q));
    if (!st)
        PN_CU_FLOAT_SWITCH(q->dt, T, {
            auto kn = pw_rows<T>;
            st = pn_cu_check(op, PN_LAUNCH(kn, pn_cu_blocks(rows, PW_THREADS), PW_THREADS, 0, pn_cu_stream(), a,
                                           (const T *)pn_ptr(q), (const T *)pn_ptr(k), (const T *)pn_ptr(v),
                                           (const T *)NULL, (T *)pn_ptr(out), o64, (double *)NULL, (double *)NULL,
                                           (double *)NULL));
        });
    lin_free(s);
    return st;
}

pn_status pn_cuda_power_bwd(const pn_tensor *q, const pn_tensor *k, const pn_tensor *v, const pn_tensor *lg, int p,
                            int causal, int64_t chunk, double scale, const pn_sympow_table *tab, const pn_tensor *g,
                            pn_tensor *gq, pn_tensor *gk, pn_tensor *gv, pn_tensor *glg) {
    const char *op = "power_attention";
    lin_scratch s = {};
    if (q->sizes[0] * q->sizes[1] * q->sizes[2] == 0) return PN_OK; /* no rows: every gradient is empty */
    if (chunk > 0 && causal && tab) {
        pwc_plan P;
        bool use;
        pn_status st = pwc_plan_of(op, q, v, lg, p, chunk, scale, tab, true, s, &P, &use);
        if (!st && use) PN_CU_FLOAT_SWITCH(q->dt, T, { st = pwc_backward<T>(op, q, k, v, g, P, s, gq, gk, gv, glg); });
        if (st || use) {
            lin_free(s);
            return st;
        }
    }
    pw_geo a;
    pn_status st = pw_setup(op, q, v, lg, p, causal, scale, s, &a);
    if (st) {
        lin_free(s);
        return st;
    }
    const int64_t rows = a.B * a.H * a.N, W = a.D > a.Dv ? a.D : a.Dv;
    double *stats = (double *)lin_alloc(s, 5 * rows, PN_F64); /* mx, Z, go, gLr, gLc */
    double *o64 = (double *)lin_alloc(s, rows * W, PN_F64), *a64 = (double *)lin_alloc(s, rows * a.D, PN_F64),
           *b64 = (double *)lin_alloc(s, rows * a.Dv, PN_F64);
    if (!stats || !o64 || !a64 || !b64) {
        lin_free(s);
        return pn_error(PN_ERR_OOM, "%s: backward out of device memory for q %s, v %s", op, pn_shape_str(q),
                        pn_shape_str(v));
    }
    double *mx = stats, *Z = mx + rows, *go = Z + rows, *gLr = go + rows, *gLc = gLr + rows;
    const unsigned nb = pn_cu_blocks(rows, PW_THREADS);
    PN_CU_FLOAT_SWITCH(q->dt, T, {
        const T *Q = (const T *)pn_ptr(q), *K = (const T *)pn_ptr(k), *V = (const T *)pn_ptr(v),
                *G = (const T *)pn_ptr(g);
        auto k1 = pw_rows<T>;
        st = pn_cu_check(op, PN_LAUNCH(k1, nb, PW_THREADS, 0, pn_cu_stream(), a, Q, K, V, G, (T *)NULL, o64, mx, Z, go));
        auto k2 = pw_row_grads<T>;
        if (!st)
            st = pn_cu_check(op, PN_LAUNCH(k2, nb, PW_THREADS, 0, pn_cu_stream(), a, Q, K, V, G, (const double *)mx,
                                           (const double *)Z, (const double *)go, gq ? (T *)pn_ptr(gq) : (T *)NULL,
                                           o64, gLr));
        auto k3 = pw_col_grads<T>;
        if (!st)
            st = pn_cu_check(op, PN_LAUNCH(k3, nb, PW_THREADS, 0, pn_cu_stream(), a, Q, K, V, G, (const double *)mx,
                                           (const double *)Z, (const double *)go, gk ? (T *)pn_ptr(gk) : (T *)NULL,
                                           gv ? (T *)pn_ptr(gv) : (T *)NULL, a64, b64, gLc));
        if (!st && glg) /* g log_gate = the reverse running sum of g L */
            st = pw_scan(op, a.B * a.H, a.N, (const double *)gLr, (const double *)gLc, (T *)pn_ptr(glg), 1);
    });
    lin_free(s);
    return st;
}

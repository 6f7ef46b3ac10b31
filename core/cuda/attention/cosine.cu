/* cosine.cu — the CUDA twin of attention/cosine.c (Cottention, forward and backward), chunked.
 *
 * The sequence of each (b, h) is cut into chunks of CC = 64 rows (the CPU's chunk size; the
 * sums are the CPU's, in another fixed order). With q̂, k̂ the normalised rows (a masked key's
 * k̂ and v read as 0) and G_t = n_t^{−σ(m_h)} g_t:
 *   S_c = Σ_{j in chunks before c} k̂_j v_jᵀ (D × Dv)     R_c = Σ_{t in chunks after c} q̂_t G_tᵀ
 *   out   = diag(n^{−σ}) ((Q̂ K̂ᵀ ⊙ tril) V + Q̂ S_c)
 *   g q̂   = (G Vᵀ ⊙ tril) K̂ + G S_cᵀ
 *   g k̂   = (G Vᵀ ⊙ tril)ᵀ Q̂ + V R_cᵀ,   g v = (Q̂ K̂ᵀ ⊙ tril)ᵀ G + K̂ R_c   (0 for masked keys)
 * Bidirectional: no intra-chunk part and every chunk reads the total (S = all of K̂ᵀ V, R = all
 * of Q̂ᵀ G). The kernels, in launch order:
 *   cos_counts   n_t (running count of real keys) per batch row
 *   cos_prep     one thread per row: 1/‖row‖, q̂ and k̂ in T (masked keys 0), n_t^{−σ}
 *   cos_term     one block per (b, h, chunk, 64 × 64 tile of the state): the chunk's K̂ᵀ V (or
 *                Q̂ᵀ G) — every chunk in parallel
 *   cos_scan     one thread per (b, h, state element): the terms → the state each chunk reads,
 *                an f64 prefix sum over the chunks in order (reverse for R; the total when
 *                bidirectional), stored in T: deterministic, no atomics
 *   cos_fwd_chunk  one block per (b, h, chunk, 64 output columns): P = Q̂ K̂ᵀ (64 × 64) into
 *                shared memory, then P's lower triangle against V and Q̂ against S_c
 *   cos_bwd_chunk  one block per (b, h, chunk): A = G Vᵀ into shared memory for g q̂ and g k̂ tile
 *                by tile of D, then P = Q̂ K̂ᵀ for g v tile by tile of Dv; raw g q̂ / g k̂ (before
 *                the normalisation) into gq / gk
 *   cos_rows_bw  one thread per row: the normalisation's backward in place, the row's term of g m
 *   cos_gm       one thread per head: g m summed over (b, t) in the CPU's order
 * Every product is one block-level tile routine, 256 threads each owning 4 × 4 outputs of a 64 × 64
 * tile, with CUDA-core FMAs in T over operands staged through shared memory KT columns at a time
 * (mm: both operands streamed; mm_tri: the 64 × 64 P or A resident): these are the calls that
 * become wmma fragments once a 16-bit dtype exists. Sums run in a fixed order in T (f32 / f64),
 * the states' prefix sums in f64, as cosine.c does; no float atomics. Shared memory is fixed
 * (33 KB for f32, 41 KB for f64) whatever D and Dv: nothing falls back. Device memory besides the
 * results: q̂ and k̂ (2·B·H·N·D in T), the chunk states (B·H·⌈N/64⌉·D·Dv in T; two in the
 * backward, none for a causal single chunk) and a few f64 per row.
 * NaN in, NaN out where the maths puts it: the triangular products multiply only the visible
 * pairs (k ≤ m, or k ≥ m), never 0·NaN, so a NaN in v_j, k_j, q_t or g_t reaches exactly the rows
 * that depend on it (cosine_impl.h's exact path gives the same). */
#include "linear.cuh"

namespace {

constexpr int CC = 64;  /* rows per chunk */
constexpr int TW = 64;  /* a tile's columns (its rows: CC) */
constexpr int CT = 256; /* threads per block: a 16 × 16 grid, thread (ty, tx) owns rows ty + 16r, columns tx + 16c */
static_assert(CC == TW && CT == 256, "the tile routines assume 64 × 64 tiles over 16 × 16 threads");

/* The shared slabs: KT columns of the product's inner dimension at a time (fewer for f64 so that
 * P + slabs stay under 48 KB); leading dimensions odd, so that the staging writes with the other
 * index fastest fall in different banks. */
template <class T> struct ck {
    static constexpr int KT = sizeof(T) == 4 ? 32 : 8;
    static constexpr int LDA = KT + 1, LDB = TW + 1;
};

/* one call's geometry and per-row data (device pointers) */
struct cos_geo {
    int64_t B, H, N, D, Dv;
    int64_t nch;         /* chunks per (b, h) */
    int causal;
    const uint8_t *mask; /* (B, N) or NULL */
    const int64_t *cnt;  /* (B, N): real keys at or before t */
    const double *rq, *rk; /* (BH, N): 1/sqrt(‖row‖² + ε); rk 0 for a masked key */
    const double *rs;    /* (BH, N): n_t^{−σ(m_h)} (n_N for every row when bidirectional) */
    const void *m;       /* (H) the stabilisers */
    int mdt;
};

__device__ inline bool is_key(const cos_geo &a, int64_t b, int64_t j) { return !a.mask || a.mask[b * a.N + j]; }

/* ---- the tile routines ----------------------------------------------------------------------- */
enum { FULL, LOWER, UPPER }; /* the k a row m sums: all, k ≤ m, k ≥ m */

/* acc += Σ_{kk < kn} A(m, kk) B(kk, n) for the thread's rows m and columns n, A(m, kk) =
 * A[m·sam + kk·sak] and B(kk, n) = B[kk·LDB + n] in shared memory; k0 is the absolute k of kk = 0,
 * which the bounds compare with m. Excluded pairs are skipped, not multiplied by 0. */
template <class T, int BOUND>
__device__ __forceinline__ void mk(T (&acc)[4][4], const T *A, int sam, int sak, const T *B, int kn, int k0) {
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
    for (int kk = 0; kk < kn; kk++) {
        const int k = k0 + kk;
        T a[4], b[4];
        for (int r = 0; r < 4; r++) a[r] = A[(ty + 16 * r) * sam + kk * sak];
        for (int c = 0; c < 4; c++) b[c] = B[kk * ck<T>::LDB + tx + 16 * c];
        for (int r = 0; r < 4; r++) {
            const int m = ty + 16 * r;
            if ((BOUND == LOWER && k > m) || (BOUND == UPPER && k < m)) continue;
            for (int c = 0; c < 4; c++) acc[r][c] += a[r] * b[c];
        }
    }
}

/* dst (R × Cn, leading dimension ld) ← f(r, c), the block's threads walking the slab with c fastest
 * (CFAST: f reads global memory contiguously in c) or r fastest — coalesced either way */
template <class T, bool CFAST, class F>
__device__ __forceinline__ void stage(T *dst, int ld, int R, int Cn, F f) {
    for (int e = threadIdx.x; e < R * Cn; e += blockDim.x) {
        const int r = CFAST ? e / Cn : e % R, c = CFAST ? e % Cn : e / R;
        dst[r * ld + c] = f(r, c);
    }
}

/* acc += A·B over k in [0, K): A(m, k) = fa(m, k) for the tile's 64 rows, B(k, n) = fb(k, n) for
 * its 64 columns, both streamed from global memory through the slabs As (CC × KT) and Bs (KT × TW).
 * AK: fa is contiguous in k (else in m); BN: fb is contiguous in n (else in k). fa and fb return 0
 * outside their operands, so the padding of a partial tile adds 0·0. */
template <class T, bool AK, bool BN, class FA, class FB>
__device__ __forceinline__ void mm(T (&acc)[4][4], T *As, T *Bs, int64_t K, FA fa, FB fb) {
    const int KT = ck<T>::KT;
    for (int64_t k0 = 0; k0 < K; k0 += KT) {
        const int kn = K - k0 < KT ? (int)(K - k0) : KT;
        __syncthreads(); /* the previous slab's readers are done */
        stage<T, AK>(As, ck<T>::LDA, CC, kn, [&](int m, int kk) -> T { return fa(m, k0 + kk); });
        stage<T, BN>(Bs, ck<T>::LDB, kn, TW, [&](int kk, int n) -> T { return fb(k0 + kk, n); });
        __syncthreads();
        mk<T, FULL>(acc, As, ck<T>::LDA, 1, Bs, kn, 0);
    }
}

/* acc += the intra-chunk product of P (CC × CC, shared) with the chunk's rows X_k = fx(k, ·),
 * k in [0, cl), streamed through Bs (fx contiguous in n):
 *   UP = false: row m sums P(m, k) X_k over k ≤ m      ((P ⊙ tril) X)
 *   UP = true:  row m sums P(k, m) X_k over k ≥ m      ((P ⊙ tril)ᵀ X) */
template <class T, bool UP, class FX>
__device__ __forceinline__ void mm_tri(T (&acc)[4][4], const T *P, T *Bs, int cl, FX fx) {
    const int KT = ck<T>::KT;
    for (int k0 = 0; k0 < cl; k0 += KT) {
        const int kn = cl - k0 < KT ? cl - k0 : KT;
        __syncthreads(); /* P written, and the previous slab's readers done */
        stage<T, true>(Bs, ck<T>::LDB, kn, TW, [&](int kk, int n) -> T { return fx(k0 + kk, n); });
        __syncthreads();
        if (UP) mk<T, UPPER>(acc, P + k0 * CC, 1, CC, Bs, kn, k0);
        else mk<T, LOWER>(acc, P + k0, CC, 1, Bs, kn, k0);
    }
}

/* P (CC × CC, shared) ← the thread's outputs; the caller has a barrier between P's last readers
 * and this, and mm_tri has one before its first read */
template <class T> __device__ __forceinline__ void to_shared(T *P, const T (&acc)[4][4]) {
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 4; c++) P[(ty + 16 * r) * CC + tx + 16 * c] = acc[r][c];
}

/* f(m, n, value) for the thread's outputs inside rows × cols */
template <class T, class F> __device__ __forceinline__ void each_out(const T (&acc)[4][4], int rows, int cols, F f) {
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 4; c++) {
            const int m = ty + 16 * r, n = tx + 16 * c;
            if (m < rows && n < cols) f(m, n, acc[r][c]);
        }
}

/* ---- per-row kernels ------------------------------------------------------------------------- */
// cnt (B, N) ← running count of real keys
__global__ void cos_counts(int64_t B, int64_t N, const uint8_t *mask, int64_t *cnt) {
    PN_CU_LOOP(b, B) {
        int64_t run = 0;
        for (int64_t t = 0; t < N; t++) cnt[b * N + t] = (run += (!mask || mask[b * N + t]));
    }
}

// q, k (BH·N, D) → qh, kh (BH·N, D): x̂ = x·r as cosine.c's cos_load_norm rounds it (masked keys 0);
// rq, rk, rs (BH·N): r (0 for a masked key) and n_t^{−σ(m_h)}
template <class T>
__global__ void cos_prep(cos_geo a, const T *q, const T *k, T *qh, T *kh, double *rq, double *rk, double *rs) {
    const int64_t N = a.N, D = a.D;
    PN_CU_LOOP(row, a.B * a.H * N) {
        const int64_t bh = row / N, t = row % N, b = bh / a.H, h = bh % a.H;
        const T *x = q + row * D;
        double ss = 0;
        for (int64_t d = 0; d < D; d++) ss += (double)x[d] * x[d];
        double r = 1.0 / sqrt(ss + PN_COSINE_EPS);
        rq[row] = r;
        for (int64_t d = 0; d < D; d++) qh[row * D + d] = (T)(x[d] * r);
        x = k + row * D;
        if (is_key(a, b, t)) {
            ss = 0;
            for (int64_t d = 0; d < D; d++) ss += (double)x[d] * x[d];
            r = 1.0 / sqrt(ss + PN_COSINE_EPS);
            for (int64_t d = 0; d < D; d++) kh[row * D + d] = (T)(x[d] * r);
        } else {
            r = 0;
            for (int64_t d = 0; d < D; d++) kh[row * D + d] = 0;
        }
        rk[row] = r;
        rs[row] = count_scale(a.cnt[b * N + (a.causal ? t : N - 1)], cos_sigmoid(pn_ld(a.m, a.mdt, h)));
    }
}

/* ---- the chunk states -------------------------------------------------------------------------- */
enum { SUM_S, SUM_R };

/* One block per (bh, chunk, D tile, Dv tile): the chunk's term Σ_{j in chunk} x_j y_jᵀ of a state
 * into terms (BH, nch, D, Dv); the chunk's rows are the product's k.
 *   SUM_S: x = k̂ (masked keys 0), y = v (masked keys read as 0: a NaN there must not count)
 *   SUM_R: x = q̂, y = G = n^{−σ} g */
template <class T, int KIND>
__global__ void __launch_bounds__(CT) cos_term(cos_geo a, const T *x, const T *y, T *terms) {
    PN_SHARED(T, As, CC * ck<T>::LDA);
    PN_SHARED(T, Bs, ck<T>::KT * ck<T>::LDB);
    const int64_t N = a.N, D = a.D, Dv = a.Dv, nd = (D + TW - 1) / TW, ne = (Dv + TW - 1) / TW;
    int64_t blk = blockIdx.x;
    const int64_t et = blk % ne, dt = blk / ne % nd, c = blk / ne / nd % a.nch, bh = blk / ne / nd / a.nch;
    const int64_t i0 = c * CC, d0 = dt * TW, e0 = et * TW, b = bh / a.H;
    const int cl = (int)(N - i0 < CC ? N - i0 : CC), dn = (int)(D - d0 < TW ? D - d0 : TW),
              en = (int)(Dv - e0 < TW ? Dv - e0 : TW);
    const T *X = x + (bh * N + i0) * D, *Y = y + (bh * N + i0) * Dv;
    const double *rs = a.rs + bh * N + i0;
    T acc[4][4] = {};
    mm<T, false, true>(
        acc, As, Bs, cl, [&](int m, int64_t j) -> T { return m < dn ? X[j * D + d0 + m] : (T)0; },
        [&](int64_t j, int n) -> T {
            if (n >= en) return (T)0;
            if (KIND == SUM_S) return is_key(a, b, i0 + j) ? Y[j * Dv + e0 + n] : (T)0;
            return (T)(rs[j] * Y[j * Dv + e0 + n]);
        });
    T *o = terms + (bh * a.nch + c) * D * Dv;
    each_out(acc, dn, en, [&](int m, int n, T v) { o[(d0 + m) * Dv + e0 + n] = v; });
}

enum { SCAN_FWD, SCAN_REV, SCAN_TOTAL };

/* One thread per (bh, state element): the chunk terms (BH, nch, DD) → in place the state each
 * chunk reads, summed in f64 over the chunks in order: FWD S_c = Σ_{c' < c}, REV R_c = Σ_{c' > c},
 * TOTAL the whole sum into chunk 0's slot. */
template <class T> __global__ void cos_scan(int64_t BH, int64_t nch, int64_t DD, int mode, T *st) {
    PN_CU_LOOP(it, BH * DD) {
        T *p = st + it / DD * nch * DD + it % DD;
        double acc = 0;
        for (int64_t i = 0; i < nch; i++) {
            const int64_t c = mode == SCAN_REV ? nch - 1 - i : i;
            const double t = p[c * DD];
            if (mode != SCAN_TOTAL) p[c * DD] = (T)acc;
            acc += t;
        }
        if (mode == SCAN_TOTAL) p[0] = (T)acc;
    }
}

/* ---- forward ------------------------------------------------------------------------------------- */
/* One block per (bh, chunk, 64 columns of Dv): out (BH, N, Dv) for the chunk's rows; st (BH, nch,
 * D, Dv) the scanned states (chunk 0's slot the total when bidirectional) */
template <class T>
__global__ void __launch_bounds__(CT) cos_fwd_chunk(cos_geo a, const T *qh, const T *kh, const T *v, const T *st,
                                                    T *out) {
    PN_SHARED(T, P, CC * CC);
    PN_SHARED(T, As, CC * ck<T>::LDA);
    PN_SHARED(T, Bs, ck<T>::KT * ck<T>::LDB);
    const int64_t N = a.N, D = a.D, Dv = a.Dv, ne = (Dv + TW - 1) / TW;
    const int64_t et = blockIdx.x % ne, c = blockIdx.x / ne % a.nch, bh = blockIdx.x / ne / a.nch;
    const int64_t i0 = c * CC, e0 = et * TW, b = bh / a.H;
    const int cl = (int)(N - i0 < CC ? N - i0 : CC), en = (int)(Dv - e0 < TW ? Dv - e0 : TW);
    const T *Q = qh + (bh * N + i0) * D, *K = kh + (bh * N + i0) * D, *V = v + (bh * N + i0) * Dv;
    auto fq = [&](int m, int64_t d) -> T { return m < cl ? Q[m * D + d] : (T)0; };
    T acc[4][4] = {};
    if (a.causal) {
        T p[4][4] = {};
        mm<T, true, false>(p, As, Bs, D, fq, [&](int64_t d, int n) -> T { return n < cl ? K[n * D + d] : (T)0; });
        to_shared(P, p);
        mm_tri<T, false>(acc, P, Bs, cl, [&](int j, int n) -> T {
            return n < en && is_key(a, b, i0 + j) ? V[j * Dv + e0 + n] : (T)0;
        });
    }
    if (!a.causal || c > 0) {
        const T *S = st + (bh * a.nch + (a.causal ? c : 0)) * D * Dv;
        mm<T, true, true>(acc, As, Bs, D, fq, [&](int64_t d, int n) -> T { return n < en ? S[d * Dv + e0 + n] : (T)0; });
    }
    const double *rs = a.rs + bh * N + i0;
    T *o = out + (bh * N + i0) * Dv + e0;
    each_out(acc, cl, en, [&](int m, int n, T x) { o[m * Dv + n] = (T)(rs[m] * x); });
}

/* ---- backward ------------------------------------------------------------------------------------ */
/* One block per (bh, chunk). S, R (BH, nch, D, Dv): the scanned states, or NULL when no chunk reads
 * them; gqr, gkr (BH, N, D): the raw g q̂ / g k̂ (cos_rows_bw takes them through the normalisation),
 * gv (BH, N, Dv); each NULL when not wanted. */
template <class T>
__global__ void __launch_bounds__(CT) cos_bwd_chunk(cos_geo a, const T *qh, const T *kh, const T *v, const T *g,
                                                    const T *S, const T *R, T *gqr, T *gkr, T *gv) {
    PN_SHARED(T, P, CC * CC);
    PN_SHARED(T, As, CC * ck<T>::LDA);
    PN_SHARED(T, Bs, ck<T>::KT * ck<T>::LDB);
    const int64_t N = a.N, D = a.D, Dv = a.Dv, c = blockIdx.x % a.nch, bh = blockIdx.x / a.nch;
    const int64_t i0 = c * CC, b = bh / a.H;
    const int cl = (int)(N - i0 < CC ? N - i0 : CC);
    const T *Q = qh + (bh * N + i0) * D, *K = kh + (bh * N + i0) * D, *V = v + (bh * N + i0) * Dv,
            *Gr = g + (bh * N + i0) * Dv;
    const double *rs = a.rs + bh * N + i0;
    const int64_t slot = (bh * a.nch + (a.causal ? c : 0)) * D * Dv;
    const bool use_s = !a.causal || c > 0, use_r = !a.causal || c < a.nch - 1; /* the states hold something */
    auto fG = [&](int m, int64_t e) -> T { return m < cl ? (T)(rs[m] * Gr[m * Dv + e]) : (T)0; }; /* G = n^{−σ} g */
    auto fq = [&](int m, int64_t d) -> T { return m < cl ? Q[m * D + d] : (T)0; };
    auto fk = [&](int m, int64_t d) -> T { return m < cl ? K[m * D + d] : (T)0; };
    if (a.causal && (gqr || gkr)) { /* P ← A = G Vᵀ (masked keys' v read as 0) */
        T p[4][4] = {};
        mm<T, true, false>(p, As, Bs, Dv, fG, [&](int64_t e, int n) -> T {
            return n < cl && is_key(a, b, i0 + n) ? V[n * Dv + e] : (T)0;
        });
        to_shared(P, p);
    }
    for (int64_t d0 = 0; gqr && d0 < D; d0 += TW) { /* g q̂ = (A ⊙ tril) K̂ + G Sᵀ */
        const int dn = (int)(D - d0 < TW ? D - d0 : TW);
        T acc[4][4] = {};
        if (a.causal) mm_tri<T, false>(acc, P, Bs, cl, [&](int j, int n) -> T { return n < dn ? K[j * D + d0 + n] : (T)0; });
        if (use_s)
            mm<T, true, false>(acc, As, Bs, Dv, fG, [&](int64_t e, int n) -> T {
                return n < dn ? S[slot + (d0 + n) * Dv + e] : (T)0;
            });
        each_out(acc, cl, dn, [&](int m, int n, T x) { gqr[(bh * N + i0 + m) * D + d0 + n] = x; });
    }
    for (int64_t d0 = 0; gkr && d0 < D; d0 += TW) { /* g k̂ = (A ⊙ tril)ᵀ Q̂ + V Rᵀ */
        const int dn = (int)(D - d0 < TW ? D - d0 : TW);
        T acc[4][4] = {};
        if (a.causal) mm_tri<T, true>(acc, P, Bs, cl, [&](int t, int n) -> T { return n < dn ? Q[t * D + d0 + n] : (T)0; });
        if (use_r)
            mm<T, true, false>(acc, As, Bs, Dv, [&](int m, int64_t e) -> T { return m < cl ? V[m * Dv + e] : (T)0; },
                               [&](int64_t e, int n) -> T { return n < dn ? R[slot + (d0 + n) * Dv + e] : (T)0; });
        each_out(acc, cl, dn, [&](int m, int n, T x) { gkr[(bh * N + i0 + m) * D + d0 + n] = x; });
    }
    if (!gv) return;
    if (a.causal) { /* P ← Q̂ K̂ᵀ */
        T p[4][4] = {};
        mm<T, true, false>(p, As, Bs, D, fq, [&](int64_t d, int n) -> T { return n < cl ? K[n * D + d] : (T)0; });
        __syncthreads(); /* A's last readers (g q̂, g k̂) are done */
        to_shared(P, p);
    }
    for (int64_t e0 = 0; e0 < Dv; e0 += TW) { /* g v = (P ⊙ tril)ᵀ G + K̂ R */
        const int en = (int)(Dv - e0 < TW ? Dv - e0 : TW);
        T acc[4][4] = {};
        if (a.causal) mm_tri<T, true>(acc, P, Bs, cl, [&](int t, int n) -> T { return n < en ? fG(t, e0 + n) : (T)0; });
        if (use_r)
            mm<T, true, true>(acc, As, Bs, D, fk, [&](int64_t d, int n) -> T {
                return n < en ? R[slot + d * Dv + e0 + n] : (T)0;
            });
        each_out(acc, cl, en, [&](int m, int n, T x) {
            gv[(bh * N + i0 + m) * Dv + e0 + n] = is_key(a, b, i0 + m) ? x : (T)0;
        });
    }
}

/* One thread per row (bh, t) of q (keys = 0) or k (keys = 1): raw (BH, N, D) holds the row's g x̂;
 * gx (may be raw itself, or NULL) ← the gradient through x̂ = x·r — cos_normalize_bw's arithmetic
 * (linear_math.h) on T rows, in place — and 0 for a masked key. With gmt (BH, N), the query row's
 * term of g m as cosine.c forms it: (x̂_t·g x̂_t)·ln n_t, 0 when n_t ≤ 1. */
template <class T>
__global__ void cos_rows_bw(cos_geo a, const T *x, const T *xh, const T *raw, T *gx, double *gmt, int keys) {
    const int64_t N = a.N, D = a.D;
    PN_CU_LOOP(row, a.B * a.H * N) {
        const int64_t bh = row / N, t = row % N, b = bh / a.H;
        const T *xr = x + row * D, *gr = raw + row * D;
        if (gmt) {
            const int64_t n = a.cnt[b * N + (a.causal ? t : N - 1)];
            double o = 0;
            for (int64_t d = 0; d < D; d++) o += (double)xh[row * D + d] * gr[d];
            gmt[row] = n > 1 ? o * log((double)n) : 0;
        }
        if (!gx) continue;
        T *dst = gx + row * D;
        if (keys && !is_key(a, b, t)) {
            for (int64_t d = 0; d < D; d++) dst[d] = 0;
            continue;
        }
        const double r = keys ? a.rk[row] : a.rq[row];
        double dot = 0;
        for (int64_t d = 0; d < D; d++) dot += (double)xr[d] * (double)gr[d];
        const double cr = r * r * r * dot;
        for (int64_t d = 0; d < D; d++) dst[d] = (T)(r * (double)gr[d] - cr * (double)xr[d]); /* gr[d] read first */
    }
}

/* gm (H) ← σ'(m_h) Σ_b (−Σ_t gmt), sums in the CPU's order */
template <class T> __global__ void cos_gm(cos_geo a, const double *gmt, T *gm) {
    PN_CU_LOOP(h, a.H) {
        double acc = 0;
        for (int64_t b = 0; b < a.B; b++) {
            double s = 0;
            for (int64_t t = 0; t < a.N; t++) s -= gmt[(b * a.H + h) * a.N + t];
            acc += s;
        }
        const double sg = cos_sigmoid(pn_ld(a.m, a.mdt, h));
        gm[h] = (T)(acc * sg * (1 - sg));
    }
}

/* ---- host side ----------------------------------------------------------------------------------- */
/* kf over nblk blocks of CT threads (nothing when nblk is 0); an error naming q when the grid is
 * larger than CUDA's 2³¹ − 1 blocks */
template <typename K, typename... A>
pn_status chunk_launch(const char *op, const pn_tensor *q, int64_t nblk, K kf, A... args) {
    if (nblk <= 0) return PN_OK;
    if (nblk > INT32_MAX)
        return pn_error(PN_ERR_ARG, "%s: q %s needs %lld blocks of %d-row chunks, more than a CUDA grid holds", op,
                        pn_shape_str(q), (long long)nblk, (int)CC);
    return pn_cu_check(op, PN_LAUNCH(kf, (unsigned)nblk, CT, 0, pn_cu_stream(), args...));
}

/* the counts, norms, q̂, k̂ and row scales every pass needs; fills a, *qh, *kh */
template <class T>
pn_status cos_setup(const char *op, const pn_tensor *q, const pn_tensor *k, const pn_tensor *v, const pn_tensor *m,
                    const pn_tensor *mask, int causal, lin_scratch &s, cos_geo *a, T **qh, T **kh) {
    a->B = q->sizes[0], a->H = q->sizes[1], a->N = q->sizes[2], a->D = q->sizes[3], a->Dv = v->sizes[3];
    a->nch = (a->N + CC - 1) / CC;
    a->causal = causal != 0;
    a->mask = mask ? (const uint8_t *)pn_ptr(mask) : NULL;
    a->m = pn_ptr(m), a->mdt = m->dt;
    const int64_t rows = a->B * a->H * a->N; /* q's shape is checked: rows·D cannot overflow */
    double *rq = (double *)lin_alloc(s, rows, PN_F64), *rk = (double *)lin_alloc(s, rows, PN_F64),
           *rs = (double *)lin_alloc(s, rows, PN_F64);
    int64_t *cnt = (int64_t *)lin_alloc(s, a->B * a->N, PN_I64);
    *qh = (T *)lin_alloc(s, rows * a->D, q->dt), *kh = (T *)lin_alloc(s, rows * a->D, q->dt);
    if (!rq || !rk || !rs || !cnt || !*qh || !*kh)
        return pn_error(PN_ERR_OOM, "%s: out of device memory for q %s", op, pn_shape_str(q));
    a->rq = rq, a->rk = rk, a->rs = rs, a->cnt = cnt;
    PN_CU_TRY(op, PN_LAUNCH(cos_counts, pn_cu_blocks(a->B), PN_CU_THREADS, 0, pn_cu_stream(), a->B, a->N, a->mask, cnt));
    auto kp = cos_prep<T>;
    PN_CU_TRY(op, PN_LAUNCH(kp, pn_cu_blocks(rows), PN_CU_THREADS, 0, pn_cu_stream(), *a, (const T *)pn_ptr(q),
                            (const T *)pn_ptr(k), *qh, *kh, rq, rk, rs));
    return PN_OK;
}

/* A state (BH, nch, D, Dv) for the chunks to read: the terms of x, y (SUM_S / SUM_R) scanned with
 * mode; *out NULL when no chunk reads one (no rows, or causal with a single chunk). */
template <class T, int KIND>
pn_status cos_state(const char *op, const pn_tensor *q, const pn_tensor *v, const cos_geo &a, lin_scratch &s,
                    const T *x, const T *y, int mode, T **out) {
    *out = NULL;
    if (a.nch == 0 || (a.causal && a.nch == 1)) return PN_OK;
    const int64_t BH = a.B * a.H, dims[4] = {BH, a.nch, a.D, a.Dv};
    if (pn_check_shape(op, 4, dims, q->dt))
        return pn_error(PN_ERR_ARG, "%s: the chunk states [%lld,%lld,%lld,%lld] (B·H, chunks of %d rows, D, Dv) of q %s, "
                        "v %s are too large", op, (long long)BH, (long long)a.nch, (long long)a.D, (long long)a.Dv,
                        (int)CC, pn_shape_str(q), pn_shape_str(v));
    T *st = (T *)lin_alloc(s, BH * a.nch * a.D * a.Dv, q->dt);
    if (!st)
        return pn_error(PN_ERR_OOM, "%s: out of device memory for the chunk states [%lld,%lld,%lld,%lld] of q %s", op,
                        (long long)BH, (long long)a.nch, (long long)a.D, (long long)a.Dv, pn_shape_str(q));
    const int64_t tiles = ((a.D + TW - 1) / TW) * ((a.Dv + TW - 1) / TW);
    auto kt = cos_term<T, KIND>;
    PN_TRY(chunk_launch(op, q, BH * a.nch * tiles, kt, a, x, y, st));
    auto ks = cos_scan<T>;
    const int64_t DD = a.D * a.Dv;
    PN_CU_TRY(op, PN_LAUNCH(ks, pn_cu_blocks(BH * DD), PN_CU_THREADS, 0, pn_cu_stream(), BH, a.nch, DD, mode, st));
    *out = st;
    return PN_OK;
}

template <class T>
pn_status cos_forward(const char *op, const pn_tensor *q, const pn_tensor *k, const pn_tensor *v, const pn_tensor *m,
                      const pn_tensor *mask, int causal, pn_tensor *out, lin_scratch &s) {
    cos_geo a;
    T *qh, *kh, *st;
    PN_TRY(cos_setup<T>(op, q, k, v, m, mask, causal, s, &a, &qh, &kh));
    PN_TRY((cos_state<T, SUM_S>(op, q, v, a, s, kh, (const T *)pn_ptr(v), causal ? SCAN_FWD : SCAN_TOTAL, &st)));
    auto kf = cos_fwd_chunk<T>;
    return chunk_launch(op, q, a.B * a.H * a.nch * ((a.Dv + TW - 1) / TW), kf, a, (const T *)qh, (const T *)kh,
                        (const T *)pn_ptr(v), (const T *)(st ? st : qh), (T *)pn_ptr(out));
}

template <class T>
pn_status cos_backward(const char *op, const pn_tensor *q, const pn_tensor *k, const pn_tensor *v, const pn_tensor *m,
                       const pn_tensor *mask, int causal, const pn_tensor *g, pn_tensor *gq, pn_tensor *gk,
                       pn_tensor *gv, pn_tensor *gm, lin_scratch &s) {
    cos_geo a;
    T *qh, *kh, *S = NULL, *R = NULL;
    PN_TRY(cos_setup<T>(op, q, k, v, m, mask, causal, s, &a, &qh, &kh));
    const int64_t rows = a.B * a.H * a.N;
    /* the raw g q̂ lands in gq, or in scratch when only g m needs it */
    T *gqr = gq ? (T *)pn_ptr(gq) : gm ? (T *)lin_alloc(s, rows * a.D, q->dt) : NULL;
    double *gmt = gm ? (double *)lin_alloc(s, rows, PN_F64) : NULL;
    if (gm && (!gqr || !gmt))
        return pn_error(PN_ERR_OOM, "%s: backward out of device memory for q %s", op, pn_shape_str(q));
    const T *G = (const T *)pn_ptr(g);
    if (gqr) PN_TRY((cos_state<T, SUM_S>(op, q, v, a, s, kh, (const T *)pn_ptr(v), causal ? SCAN_FWD : SCAN_TOTAL, &S)));
    if (gk || gv) PN_TRY((cos_state<T, SUM_R>(op, q, v, a, s, qh, G, causal ? SCAN_REV : SCAN_TOTAL, &R)));
    auto kb = cos_bwd_chunk<T>;
    PN_TRY(chunk_launch(op, q, a.B * a.H * a.nch, kb, a, (const T *)qh, (const T *)kh, (const T *)pn_ptr(v), G,
                        (const T *)S, (const T *)R, gqr, gk ? (T *)pn_ptr(gk) : (T *)NULL,
                        gv ? (T *)pn_ptr(gv) : (T *)NULL));
    const unsigned nb = pn_cu_blocks(rows);
    auto kr = cos_rows_bw<T>;
    if (gqr)
        PN_CU_TRY(op, PN_LAUNCH(kr, nb, PN_CU_THREADS, 0, pn_cu_stream(), a, (const T *)pn_ptr(q), (const T *)qh,
                                (const T *)gqr, gq ? gqr : (T *)NULL, gmt, 0));
    if (gk)
        PN_CU_TRY(op, PN_LAUNCH(kr, nb, PN_CU_THREADS, 0, pn_cu_stream(), a, (const T *)pn_ptr(k), (const T *)kh,
                                (const T *)pn_ptr(gk), (T *)pn_ptr(gk), (double *)NULL, 1));
    if (gm) {
        auto kg = cos_gm<T>;
        PN_CU_TRY(op, PN_LAUNCH(kg, pn_cu_blocks(a.H), PN_CU_THREADS, 0, pn_cu_stream(), a, (const double *)gmt,
                                (T *)pn_ptr(gm)));
    }
    return PN_OK;
}

} // namespace

/* q, k (B, H, N, D), v, out (B, H, N, Dv), m (H), mask (B, N) u8 or NULL, all contiguous */
pn_status pn_cuda_cosine_fwd(const pn_tensor *q, const pn_tensor *k, const pn_tensor *v, const pn_tensor *m,
                             const pn_tensor *mask, int causal, pn_tensor *out) {
    const char *op = "cosine_attention";
    if (pn_numel(out) == 0) return PN_OK;
    lin_scratch s = {};
    pn_status st;
    PN_CU_FLOAT_SWITCH(q->dt, T, st = cos_forward<T>(op, q, k, v, m, mask, causal, out, s));
    lin_free(s);
    return st;
}

pn_status pn_cuda_cosine_bwd(const pn_tensor *q, const pn_tensor *k, const pn_tensor *v, const pn_tensor *m,
                             const pn_tensor *mask, int causal, const pn_tensor *g, pn_tensor *gq, pn_tensor *gk,
                             pn_tensor *gv, pn_tensor *gm) {
    const char *op = "cosine_attention";
    lin_scratch s = {};
    pn_status st;
    PN_CU_FLOAT_SWITCH(q->dt, T, st = cos_backward<T>(op, q, k, v, m, mask, causal, g, gq, gk, gv, gm, s));
    lin_free(s);
    return st;
}

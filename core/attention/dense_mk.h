/* dense_mk.h — what the f32 dense driver needs for the register-blocked microkernel
 * (microkernel.h): the packed K and V of every head and the product over row strips. Included
 * by dense.c once, before the typed bodies; dense_impl.h's f32 body (PN_DENSE_MK) uses it in
 * its forward and backward. No include guard.
 *
 * Forward blocking (dense_impl.h; f64 walks the same tiles with BLAS products). K (its first
 * Dg columns) and V are packed once per call for every head (O(N·D) copies against O(N²·D)
 * work). A work item is PN_MK_TQ query rows of one head; it walks the keys in tiles of
 * PN_MK_TK: the tile's scores S (PN_MK_TQ, PN_MK_TK) with Q read in place, the score's
 * epilogue over all its rows at once (its per-key values computed once a tile), the row
 * modifiers and the online softmax per row, then acc (PN_MK_TQ, Dv) += P·V. Both products walk
 * the packed panels outermost and the MR-row strips inside (mk_prod): one block's panels (nb
 * columns: NR, or two panels in AVX-512) of keys (Q·Kᵀ, nb·D floats) or of value columns (P·V,
 * PN_MK_TK·nb floats) stay in L1 (or, for P·V in AVX-512, L2) while every strip of the tile
 * uses them. Strips outermost streamed every panel from L2
 * once per strip: at D = 128 the microkernel ran at ~70 % of sgemm's rate that way. Panels
 * outermost and 96 rows a tile instead of 48 took the dot forward at N = 4096 from 671 to
 * 599–618 ms at D = 128 and from 363–389 to 355–374 ms at D = 64 (one thread, Xeon with
 * AVX-512, alternating runs; 192 rows, or 128- or 512-key tiles, were slower). Causal rows
 * compute the tile's keys up to the tile's last row and mask the rest (row_mods): at most
 * PN_MK_TQ − 1 keys a row, on the diagonal tile only.
 * Backward: the tile loop of dense_impl.h (PN_TQ × PN_TK) with its five products on the
 * microkernel — K and V packed per head, the query tile's Q and dO packed per tile. */

#define PN_MK_TQ 96   /* forward (f32 and f64): query rows per item, a multiple of every kernel's MR (4, 6) */
#define PN_MK_TK 256  /* forward (f32 and f64): keys per tile, a multiple of every kernel's nb (8, 16, 64) */
#ifndef PN_FEW_ROWS
#define PN_FEW_ROWS 8 /* f32: calls with at most this many query rows skip the packing (few_rows_scores) */
#endif

/* every head's K and V in the microkernel's panels; NULL where the pass does not need one */
typedef struct {
    const pn_microkernel *mk;
    float *Kr, *Vr;   /* row panels (pn_mk_pack_rows): K's first Dg columns, V — B of Q·Kᵀ, dO·Vᵀ */
    float *Kc, *Vc;   /* column panels (pn_mk_pack_cols), panel stride Nk·NR: B of dG·K, P·V */
    float *kn;        /* distance scores: ‖k_g‖² (the key term of slot 0), nkp per head, 0 beyond Nk */
    int64_t nkp, Dgp, Dvp; /* Nk, Dg, Dv rounded up to NR */
} mk_packed;

enum { MK_KR = 1, MK_VR = 2, MK_KC = 4, MK_VC = 8 }; /* MK_KR brings the key norms of a distance score */

static void mk_free(mk_packed *pk) {
    free(pk->Kr);
    free(pk->Vr);
    free(pk->Kc);
    free(pk->Vc);
    free(pk->kn);
}

/* Pack the panels `which` (MK_*) of every head of c (f32). */
static pn_status mk_pack(const pn_attn_call *c, const pn_microkernel *mk, unsigned which, mk_packed *pk) {
    const int64_t NR = mk->nr, BH = c->BH, Nk = c->Nk, D = c->D, Dv = c->Dv, Dg = c->Dg;
    memset(pk, 0, sizeof *pk);
    pk->mk = mk;
    pk->nkp = pn_mk_round(Nk, NR), pk->Dgp = pn_mk_round(Dg, NR), pk->Dvp = pn_mk_round(Dv, NR);
    /* sizes: BH·Nk·D and BH·Nk·Dv exist as tensors; rounding adds less than NR to one factor */
    const int64_t nkr = pk->nkp * Dg, nvr = pk->nkp * Dv, nkc = pk->Dgp * Nk, nvc = pk->Dvp * Nk;
    bool oom = false;
    if (which & MK_KR) oom |= !(pk->Kr = malloc(sizeof(float) * (size_t)(BH * nkr + 1)));
    if (which & MK_VR) oom |= !(pk->Vr = malloc(sizeof(float) * (size_t)(BH * nvr + 1)));
    if (which & MK_KC) oom |= !(pk->Kc = malloc(sizeof(float) * (size_t)(BH * nkc + 1)));
    if (which & MK_VC) oom |= !(pk->Vc = malloc(sizeof(float) * (size_t)(BH * nvc + 1)));
    const bool kn = (which & MK_KR) && c->st.plan.diff;
    if (kn) oom |= !(pk->kn = malloc(sizeof(float) * (size_t)(BH * pk->nkp + 1)));
    if (oom) {
        mk_free(pk);
        return pn_error(PN_ERR_OOM, "%s: out of memory packing k and v (%lld heads × %lld keys)", c->op,
                        (long long)BH, (long long)Nk);
    }
    #pragma omp parallel for if (BH * Nk * (D + Dv) > PN_PAR_MIN) schedule(static)
    for (int64_t bh = 0; bh < BH; bh++) {
        const float *K = (const float *)c->k + pn_attn_at(c, c->lk, bh, 0);
        const float *V = c->v ? (const float *)c->v + pn_attn_at(c, c->lv, bh, 0) : NULL;
        const int64_t ks = c->lk.n, vs = c->lv.n;
        if (pk->Kr) pn_mk_pack_rows(Nk, Dg, K, ks, (int)NR, pk->Kr + bh * nkr);
        if (pk->Vr && V) pn_mk_pack_rows(Nk, Dv, V, vs, (int)NR, pk->Vr + bh * nvr);
        if (pk->Kc) pn_mk_pack_cols(Nk, Dg, K, ks, (int)NR, Nk * NR, pk->Kc + bh * nkc);
        if (pk->Vc && V) pn_mk_pack_cols(Nk, Dv, V, vs, (int)NR, Nk * NR, pk->Vc + bh * nvc);
        if (kn) {
            float *dst = pk->kn + bh * pk->nkp;
            memcpy(dst, (const float *)c->kt[0] + bh * Nk, sizeof(float) * (size_t)Nk);
            for (int64_t j = Nk; j < pk->nkp; j++) dst[j] = 0;
        }
    }
    return PN_OK;
}

/* C (m, ncols) (+)= A (m, K; strides rs, cs) · B (packed, microkernel.h), any m: blocks of nb
 * columns outermost, strips of MR inside, so a block's panels are read by every strip (see above) */
static inline void mk_prod(const pn_microkernel *mk, int64_t m, int64_t ncols, int64_t K, const float *A,
                           int64_t rs, int64_t cs, const float *Bp, int64_t bstride, float *C, int64_t ldc,
                           int accumulate) {
    if (ncols <= 0) return;
    const int64_t nr = mk->nr, nb = mk->nb;
    for (int64_t c0 = 0; c0 < ncols; c0 += nb)
        for (int64_t r0 = 0; r0 < m; r0 += mk->mr)
            mk->gemm(m - r0 < mk->mr ? m - r0 : mk->mr, ncols - c0 < nb ? ncols - c0 : nb, K, A + r0 * rs, rs, cs,
                     Bp + (c0 / nr) * bstride, bstride, C + r0 * ldc + c0, ldc, accumulate);
}

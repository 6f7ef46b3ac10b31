/* dropout.h — dropout's per-block mask and apply, compiled by C (ops/dropout.c) and by CUDA
 * (cuda/ops/dropout.cu) from this one source, so a seed gives the same mask on every device.
 *
 * Block b covers elements 8b … 8b+7 with Philox counter base + b: its 4 words give eight
 * 16-bit half-words, element j kept when half-word j >= thresh = round(p·2¹⁶). */
#ifndef PN_OPS_DROPOUT_H
#define PN_OPS_DROPOUT_H

#include "../internal.h"

/* the keep threshold of drop probability p in [0, 1) (at most 65536) */
static inline uint32_t pn_dropout_thresh(double p) { return (uint32_t)lround(p * 65536.0); }

/* keep flag of element j (< 8) of a block, from the block's Philox word w[j >> 1] */
PN_HD static inline uint8_t pn_dropout_keep(uint32_t word, int j, uint32_t thresh) {
    return ((word >> ((j & 1) * 16)) & 0xFFFFu) >= thresh;
}

/* keep flags k[0..8) of the block with counter ctr */
PN_HD static inline void pn_dropout_mask8(uint64_t seed, uint64_t ctr, uint32_t thresh, uint8_t k[8]) {
    uint32_t w[4];
    pn_philox4x32(seed, ctr, w);
    for (int j = 0; j < 8; j++) k[j] = pn_dropout_keep(w[j >> 1], j, thresh);
}

/* One block: ys[j] = xs[j] · keep_j · s for j < len (≤ 8), keep written when not NULL. When no
 * mask is kept, a block of zeros stays zero whatever its mask and skips Philox (sparse inputs
 * such as bag-of-words features are mostly such blocks). Branch-free multiply: keep is a coin
 * flip, a branch on it mispredicts half the time. */
#define PN_DROPOUT_BLOCK(T, NAME)                                                                        \
    PN_HD static inline void NAME(const T *xs, T *ys, uint8_t *keep, int len, T s, uint64_t seed,        \
                                  uint64_t ctr, uint32_t thresh) {                                       \
        if (!keep) {                                                                                     \
            bool any = false;                                                                            \
            if (len == 8) /* a whole block: a fixed count the compiler unrolls and vectorises */         \
                for (int j = 0; j < 8; j++) any |= xs[j] != 0;                                           \
            else                                                                                         \
                for (int j = 0; j < len; j++) any |= xs[j] != 0;                                         \
            if (!any) {                                                                                  \
                for (int j = 0; j < len; j++) ys[j] = 0;                                                 \
                return;                                                                                  \
            }                                                                                            \
        }                                                                                                \
        uint8_t k[8];                                                                                    \
        pn_dropout_mask8(seed, ctr, thresh, k);                                                          \
        for (int j = 0; j < len; j++) {                                                                  \
            if (keep) keep[j] = k[j];                                                                    \
            ys[j] = xs[j] * ((T)k[j] * s);                                                               \
        }                                                                                                \
    }
PN_DROPOUT_BLOCK(float, pn_dropout_block_f32)
PN_DROPOUT_BLOCK(double, pn_dropout_block_f64)
#undef PN_DROPOUT_BLOCK

#endif /* PN_OPS_DROPOUT_H */

/* static_switch.h — compile-time specialisation behind one runtime entry (flash-attention's
 * static_switch.h, DESIGN §9). The score headers that use it also mark their per-pair
 * functions PN_HD (internal.h's host+device marker), so a CUDA kernel instantiates the very
 * maths the CPU block loop does.
 *
 * PN_BOOL_SWITCH(cond, NAME, body) runs body with `const int NAME` = 1 when cond holds, else
 * with NAME = 0. body is compiled twice and NAME is a constant in each copy, so a branch on
 * it inside an always-inlined callee folds away: e.g. the VJP of a score compiles the
 * gradients of its parameters only in the copy that needs them (NAME = want), instead of
 * testing per pair.
 *
 *     PN_BOOL_SWITCH(p->learn != 0, want, vjp_body(..., want));  */
#ifndef PN_STATIC_SWITCH_H
#define PN_STATIC_SWITCH_H

#include "../internal.h" /* PN_HD */

#define PN_BOOL_SWITCH(cond, NAME, ...)   \
    do {                                  \
        if (cond) {                       \
            const int NAME = 1;           \
            __VA_ARGS__;                  \
        } else {                          \
            const int NAME = 0;           \
            __VA_ARGS__;                  \
        }                                 \
    } while (0)

#endif /* PN_STATIC_SWITCH_H */

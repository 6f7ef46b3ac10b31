/* epilogues.c — the CPU instantiation of every score's maths (the headers listed in
 * epi_impl.h): once for float, once for double, then the plans that the registry
 * (registry.c, from variants.def) hands to the dense and graph drivers.
 *
 * One source per score: a header holds its maths once, in terms of `real` (the f32 path is
 * the fast one, with the vectorizing float maths of fastmath.h; the f64 path uses libm and is
 * the exact one the gradchecks use) — the compile-time specialisation the drivers use too
 * (dense_impl.h), without a file that includes itself. */
#include "attention.h"
#include "fastmath.h"
#include "static_switch.h"

/* the epilogues' float selects vectorize (ops/fast_math.h) */
PN_NOTRAP_BEGIN

#define real float
#define EPI(name) pn_epi_##name##_f32
#define PN_EPI_EPS 1e-6f /* relative floor below which a squared distance is rounding noise */
#include "epi_impl.h"
#undef real
#undef EPI
#undef PN_EPI_EPS

#define real double
#define EPI(name) pn_epi_##name##_f64
#define PN_EPI_EPS 1e-14
#include "epi_impl.h"
#undef real
#undef EPI
#undef PN_EPI_EPS

PN_NOTRAP_END

/* GCC 12 mistakes the address of a target_clones function (its ifunc dispatcher) for the
 * address of a local when a plan stores it: a false positive, silenced for the plans. */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic ignored "-Wdangling-pointer"
#endif

#define PN_EPI_PLAN
#include "epi_impl.h"
#undef PN_EPI_PLAN

/* epilogue_twice.h — compile a score file's row functions for float and for double.
 *
 * A score file writes its epilogues once, in terms of `real` and named EPI(name), between
 *     #ifndef PN_EPI_PASS   (descriptor part)   #else   (typed part)   #endif
 * and includes this header with PN_EPI_FILE set to its own name. This header re-includes
 * the file twice with PN_EPI_PASS defined: real = float, EPI(x) = x##_f32, then real =
 * double, EPI(x) = x##_f64. So one file per score holds both precisions (the f32 path is
 * the fast one, the f64 path the exact one) without a second copy of the maths — the same
 * compile-time specialisation the dense driver uses (dense_impl.h). Math through the
 * type-generic pn_sqrt/pn_exp/pn_log/pn_acosh (fastmath.h). */
#define PN_EPI_PASS 1
PN_NOTRAP_BEGIN

#define real float
#define EPI(name) pn_epi_##name##_f32
#define PN_EPI_EPS 1e-6f /* relative floor below which a squared distance is rounding noise */
#include PN_EPI_FILE
#undef real
#undef EPI
#undef PN_EPI_EPS

#define real double
#define EPI(name) pn_epi_##name##_f64
#define PN_EPI_EPS 1e-14
#include PN_EPI_FILE
#undef real
#undef EPI
#undef PN_EPI_EPS

#undef PN_EPI_PASS
PN_NOTRAP_END

/* GCC 12 mistakes the address of a target_clones function (its ifunc dispatcher) for the
 * address of a local when a plan stores it: a false positive, silenced for the plans. */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic ignored "-Wdangling-pointer"
#endif

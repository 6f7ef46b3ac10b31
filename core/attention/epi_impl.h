/* epi_impl.h — the score headers, one include line each (variants.def names the rows).
 * epilogues.c includes this list three times: with real = float, then real = double (the
 * typed part of every header: its epilogues EPI(<name>_fwd), EPI(<name>_vjp) for that
 * precision), then with PN_EPI_PLAN defined (each header's plan pn_score_plan_<name>, which
 * points at both precisions). No include guard on purpose. */
#include "block.h"
#include "dot.h"
#include "laplacian.h"
#include "cone.h"
#include "hyperdist.h"
#include "gat.h"
#include "sqdist.h"

/* csr.c — CSR neighbourhoods for graph attention (DESIGN §3.1, "graph attention runs the
 * same epilogues over a CSR neighbourhood").
 *
 * edges (E, 2) i32/i64, rows (src, dst): node dst attends to node src. The CSR is by
 * destination: the sources of node v are src[offsets[v] .. offsets[v+1]), sorted
 * ascending, so the whole src array is sorted by (dst, src). Duplicate edges are kept
 * (they weigh twice in a softmax, as in the edge list). With self_loops, an edge (v, v) is
 * added for every node that has none — the usual GAT preprocessing — and takes its
 * sorted place like any other edge.
 *
 * Two stable counting sorts (by src, then by dst): O(E + N) time and memory, and the
 * result does not depend on the input order of the edges. */
#include "../backend.h"

#include <stdint.h>

pn_status pn_graph_csr(pn_tensor *edges, int64_t num_nodes, int self_loops, pn_tensor **offsets, pn_tensor **src) {
    const char *op = "graph_csr";
    if (!offsets || !src) return pn_error(PN_ERR_ARG, "%s: the output pointers offsets and src must not be NULL", op);
    *offsets = NULL;
    *src = NULL;
    if (!edges) return pn_error(PN_ERR_ARG, "%s: edges is nil", op);
    if (!pn_is_index(edges->dt))
        return pn_error(PN_ERR_DTYPE, "%s: edges %s has dtype %s, expected i32 or i64 node ids", op,
                        pn_shape_str(edges), pn_dtype_name(edges->dt));
    if (edges->nd != 2 || edges->sizes[1] != 2)
        return pn_error(PN_ERR_SHAPE, "%s: edges %s must have shape (E, 2), rows (src, dst)", op, pn_shape_str(edges));
    if (num_nodes < 0)
        return pn_error(PN_ERR_ARG, "%s: edges %s: num_nodes = %lld must be >= 0", op, pn_shape_str(edges),
                        (long long)num_nodes);
    return PN_KCALL_ON(op, edges, graph_csr, edges, num_nodes, self_loops, offsets, src);
}

/* CPU kernel: validates the node ids (the error names the row), then builds the CSR; offsets
 * (N+1) and src (E') i64, allocated on the cpu */
pn_status pn_cpu_graph_csr(const pn_tensor *edges, int64_t num_nodes, int self_loops, pn_tensor **offsets,
                           pn_tensor **src) {
    const char *op = "graph_csr";
    const int64_t E = edges->sizes[0], N = num_nodes;
    const char *eb = pn_ptr(edges);
    const int64_t s0 = edges->strides[0], s1 = edges->strides[1];
    for (int64_t r = 0; r < E; r++) {
        int64_t a = pn_ldi(eb, edges->dt, r * s0), b = pn_ldi(eb, edges->dt, r * s0 + s1);
        if (a < 0 || a >= N || b < 0 || b >= N)
            return pn_error(PN_ERR_INDEX, "%s: edges %s row %lld is (src %lld, dst %lld): node ids must be "
                            "in [0, %lld) for num_nodes = %lld", op, pn_shape_str(edges), (long long)r + 1, (long long)a,
                            (long long)b, (long long)N, (long long)N);
    }

    pn_status st = PN_OK;
    uint8_t *has_self = calloc((size_t)(N > 0 ? N : 1), 1);
    int64_t *count = calloc((size_t)N + 1, sizeof *count);
    int64_t *ts = NULL, *td = NULL; /* the edges ordered by src */
    pn_tensor *off = NULL, *out = NULL;
    if (!has_self || !count) goto oom;
    for (int64_t r = 0; r < E; r++) {
        int64_t a = pn_ldi(eb, edges->dt, r * s0), b = pn_ldi(eb, edges->dt, r * s0 + s1);
        if (a == b) has_self[a] = 1;
    }
    int64_t added = 0;
    if (self_loops)
        for (int64_t v = 0; v < N; v++) added += !has_self[v];
    const int64_t Ep = E + added;
    /* edge i of the extended list: the input rows, then the added loops in node order */
#define EDGE_AT(i, A, B)                                                               \
    do {                                                                               \
        if ((i) < E) {                                                                 \
            A = pn_ldi(eb, edges->dt, (i) * s0);                                       \
            B = pn_ldi(eb, edges->dt, (i) * s0 + s1);                                  \
        } else {                                                                       \
            A = B = loops[(i) - E];                                                    \
        }                                                                              \
    } while (0)
    int64_t *loops = malloc(sizeof *loops * (size_t)(added > 0 ? added : 1));
    ts = malloc(sizeof *ts * (size_t)(Ep > 0 ? Ep : 1));
    td = malloc(sizeof *td * (size_t)(Ep > 0 ? Ep : 1));
    if (!loops || !ts || !td) {
        free(loops);
        goto oom;
    }
    for (int64_t v = 0, k = 0; self_loops && v < N; v++)
        if (!has_self[v]) loops[k++] = v;

    /* pass 1: stable counting sort by src */
    for (int64_t i = 0; i < Ep; i++) {
        int64_t a, b;
        EDGE_AT(i, a, b);
        count[a + 1]++;
    }
    for (int64_t v = 0; v < N; v++) count[v + 1] += count[v];
    for (int64_t i = 0; i < Ep; i++) {
        int64_t a, b;
        EDGE_AT(i, a, b);
        int64_t p = count[a]++;
        ts[p] = a;
        td[p] = b;
    }
    free(loops);
#undef EDGE_AT

    /* pass 2: stable counting sort by dst → offsets and the sorted sources */
    int64_t oshape[1] = {N + 1}, sshape[1] = {Ep};
    off = pn_zeros(1, oshape, PN_I64, PN_CPU);
    out = pn_empty(1, sshape, PN_I64, PN_CPU);
    if (!off || !out) {
        st = PN_ERR_OOM; /* pn_zeros/pn_empty set the message */
        goto done;
    }
    int64_t *o = (int64_t *)pn_ptr(off), *s = (int64_t *)pn_ptr(out);
    for (int64_t i = 0; i < Ep; i++) o[td[i] + 1]++;
    for (int64_t v = 0; v < N; v++) o[v + 1] += o[v];
    memcpy(count, o, sizeof *count * (size_t)N); /* next free slot per destination */
    for (int64_t i = 0; i < Ep; i++) s[count[td[i]]++] = ts[i];
    *offsets = off;
    *src = out;
    off = out = NULL;
    goto done;

oom:
    st = pn_error(PN_ERR_OOM, "%s: out of memory for %lld edges and %lld nodes", op, (long long)E, (long long)N);
done:
    pn_release(off);
    pn_release(out);
    free(has_self);
    free(count);
    free(ts);
    free(td);
    return st;
}

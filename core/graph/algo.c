/* algo.c — graph algorithms on a CSR (offsets (N+1), nbr (E) i64, as pn_graph_csr builds it:
 * the neighbours of v are nbr[offsets[v] .. offsets[v+1])): breadth-first distances, the
 * distances of sampled pairs, connected components, induced subgraphs. Host algorithms: CPU
 * tensors in and out (like the generator in hyperbolic.c). Every loop is bounded by the
 * graph's size; nothing samples or retries here. */
#include "../backend.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define PV(t) ((void *)pn_ptr(t)) /* typed access to a tensor's data */

/* Checks a CSR: i64, CPU, contiguous, offsets nondecreasing from 0 to E, ids in [0, N). */
static pn_status csr_in(const char *op, const pn_tensor *offsets, const pn_tensor *nbr, int64_t *N, const int64_t **off,
                        const int64_t **adj) {
    if (!offsets || !nbr) return pn_error(PN_ERR_ARG, "%s: the graph's offsets and src must not be nil", op);
    if (offsets->dt != PN_I64 || nbr->dt != PN_I64 || offsets->nd != 1 || nbr->nd != 1 || offsets->sizes[0] < 1)
        return pn_error(PN_ERR_SHAPE, "%s: offsets %s %s and src %s %s must be 1-D i64 (a CSR from pn.graph)", op,
                        pn_dtype_name(offsets->dt), pn_shape_str(offsets), pn_dtype_name(nbr->dt), pn_shape_str(nbr));
    if (offsets->dev != PN_CPU || nbr->dev != PN_CPU)
        return pn_error(PN_ERR_DEVICE, "%s: graph algorithms run on the cpu; the graph is on %s", op,
                        pn_device_name(offsets->dev != PN_CPU ? offsets->dev : nbr->dev));
    if (!pn_is_contiguous(offsets) || !pn_is_contiguous(nbr))
        return pn_error(PN_ERR_ARG, "%s: offsets and src must be contiguous", op);
    const int64_t n = offsets->sizes[0] - 1, E = nbr->sizes[0];
    const int64_t *o = PV(offsets), *a = PV(nbr);
    if (o[0] != 0 || o[n] != E)
        return pn_error(PN_ERR_ARG, "%s: offsets %s must run from 0 to the edge count %lld", op, pn_shape_str(offsets),
                        (long long)E);
    for (int64_t v = 0; v < n; v++)
        if (o[v + 1] < o[v]) return pn_error(PN_ERR_ARG, "%s: offsets decrease at node %lld", op, (long long)v + 1);
    for (int64_t e = 0; e < E; e++)
        if (a[e] < 0 || a[e] >= n)
            return pn_error(PN_ERR_INDEX, "%s: src holds node %lld at edge %lld, outside [0, %lld)", op, (long long)a[e],
                            (long long)e + 1, (long long)n);
    *N = n, *off = o, *adj = a;
    return PN_OK;
}

/* distances from s into d (N), −1 beyond max hops (max < 0: no cap) or unreachable; queue (N) */
static void bfs_one(int64_t n, const int64_t *off, const int64_t *adj, int64_t s, int64_t max, int32_t *d,
                    int64_t *queue) {
    for (int64_t v = 0; v < n; v++) d[v] = -1;
    int64_t head = 0, tail = 0;
    d[s] = 0;
    queue[tail++] = s;
    while (head < tail) {
        int64_t u = queue[head++];
        if (max >= 0 && d[u] >= max) continue;
        for (int64_t e = off[u]; e < off[u + 1]; e++) {
            int64_t w = adj[e];
            if (d[w] < 0) {
                d[w] = d[u] + 1;
                queue[tail++] = w;
            }
        }
    }
}

pn_status pn_graph_bfs(pn_tensor *offsets, pn_tensor *nbr, pn_tensor *sources, int64_t max, pn_tensor **dist) {
    const char *op = "graph.bfs";
    if (!dist) return pn_error(PN_ERR_ARG, "%s: NULL output", op);
    *dist = NULL;
    int64_t n;
    const int64_t *off = NULL, *adj = NULL;
    PN_TRY(csr_in(op, offsets, nbr, &n, &off, &adj));
    if (!sources || sources->dt != PN_I64 || sources->nd != 1 || sources->dev != PN_CPU || !pn_is_contiguous(sources))
        return pn_error(PN_ERR_ARG, "%s: sources must be a contiguous 1-D i64 cpu tensor of node ids", op);
    const int64_t S = sources->sizes[0], *src = PV(sources);
    for (int64_t i = 0; i < S; i++)
        if (src[i] < 0 || src[i] >= n)
            return pn_error(PN_ERR_INDEX, "%s: source %lld is node %lld, outside [0, %lld)", op, (long long)i + 1,
                            (long long)src[i], (long long)n);
    int64_t shape[2] = {S, n};
    PN_TRY(pn_check_shape(op, 2, shape, PN_I32));
    pn_tensor *out = pn_empty(2, shape, PN_I32, PN_CPU);
    if (!out) return PN_ERR_OOM;
    int32_t *d = PV(out);
    int oom = 0;
    #pragma omp parallel if (S > 1)
    {
        int64_t *queue = malloc(sizeof(int64_t) * (size_t)(n + 1));
        if (!queue) {
            #pragma omp atomic write
            oom = 1;
        }
        #pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < S; i++)
            if (queue) bfs_one(n, off, adj, src[i], max, d + i * n, queue);
        free(queue);
    }
    if (oom) {
        pn_release(out);
        return pn_error(PN_ERR_OOM, "%s: out of memory", op);
    }
    *dist = out;
    return PN_OK;
}

pn_status pn_graph_pair_dist(pn_tensor *offsets, pn_tensor *nbr, pn_tensor *pairs, int64_t max, pn_tensor **dist) {
    const char *op = "graph.distances";
    if (!dist) return pn_error(PN_ERR_ARG, "%s: NULL output", op);
    *dist = NULL;
    int64_t n;
    const int64_t *off = NULL, *adj = NULL;
    PN_TRY(csr_in(op, offsets, nbr, &n, &off, &adj));
    if (!pairs || pairs->dt != PN_I64 || pairs->nd != 2 || pairs->sizes[1] != 2 || pairs->dev != PN_CPU ||
        !pn_is_contiguous(pairs))
        return pn_error(PN_ERR_ARG, "%s: pairs must be a contiguous (P, 2) i64 cpu tensor of node ids", op);
    const int64_t P = pairs->sizes[0], *pr = PV(pairs);
    for (int64_t i = 0; i < 2 * P; i++)
        if (pr[i] < 0 || pr[i] >= n)
            return pn_error(PN_ERR_INDEX, "%s: pair %lld holds node %lld, outside [0, %lld)", op, (long long)i / 2 + 1,
                            (long long)pr[i], (long long)n);
    pn_tensor *out = pn_empty(1, &P, PN_I32, PN_CPU);
    if (!out) return PN_ERR_OOM;
    int32_t *res = PV(out);
    int oom = 0;
    #pragma omp parallel if (P > 1)
    {
        int32_t *d = malloc(sizeof(int32_t) * (size_t)(n + 1));
        int64_t *queue = malloc(sizeof(int64_t) * (size_t)(n + 1));
        if (!d || !queue) {
            #pragma omp atomic write
            oom = 1;
        }
        #pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < P; i++) {
            if (!d || !queue) continue;
            bfs_one(n, off, adj, pr[2 * i], max, d, queue);
            res[i] = d[pr[2 * i + 1]];
        }
        free(d);
        free(queue);
    }
    if (oom) {
        pn_release(out);
        return pn_error(PN_ERR_OOM, "%s: out of memory", op);
    }
    *dist = out;
    return PN_OK;
}

/* union–find with path halving; the label of a component is its smallest node id */
static int64_t find(int64_t *p, int64_t x) {
    while (p[x] != x) {
        p[x] = p[p[x]];
        x = p[x];
    }
    return x;
}

pn_status pn_graph_components(pn_tensor *offsets, pn_tensor *nbr, pn_tensor **labels, int64_t *count) {
    const char *op = "graph.components";
    if (!labels || !count) return pn_error(PN_ERR_ARG, "%s: NULL output", op);
    *labels = NULL;
    int64_t n;
    const int64_t *off = NULL, *adj = NULL;
    PN_TRY(csr_in(op, offsets, nbr, &n, &off, &adj));
    pn_tensor *out = pn_empty(1, &n, PN_I64, PN_CPU);
    if (!out) return PN_ERR_OOM;
    int64_t *p = PV(out);
    for (int64_t v = 0; v < n; v++) p[v] = v;
    for (int64_t v = 0; v < n; v++)
        for (int64_t e = off[v]; e < off[v + 1]; e++) {
            int64_t a = find(p, v), b = find(p, adj[e]);
            if (a != b) { /* the smaller id becomes the root */
                if (a < b) p[b] = a;
                else p[a] = b;
            }
        }
    int64_t c = 0;
    for (int64_t v = 0; v < n; v++) {
        p[v] = find(p, v);
        c += p[v] == v;
    }
    *labels = out;
    *count = c;
    return PN_OK;
}

pn_status pn_graph_induced(pn_tensor *edges, pn_tensor *keep, pn_tensor **edges_out, pn_tensor **ids) {
    const char *op = "graph.induced";
    if (!edges_out || !ids) return pn_error(PN_ERR_ARG, "%s: NULL output", op);
    *edges_out = *ids = NULL;
    if (!edges || edges->dt != PN_I64 || edges->nd != 2 || edges->sizes[1] != 2 || edges->dev != PN_CPU ||
        !pn_is_contiguous(edges))
        return pn_error(PN_ERR_ARG, "%s: edges must be a contiguous (E, 2) i64 cpu tensor", op);
    if (!keep || keep->dt != PN_U8 || keep->nd != 1 || keep->dev != PN_CPU || !pn_is_contiguous(keep))
        return pn_error(PN_ERR_ARG, "%s: keep must be a contiguous (N) u8 cpu tensor", op);
    const int64_t n = keep->sizes[0], E = edges->sizes[0], *ev = PV(edges);
    const uint8_t *k = PV(keep);
    int64_t *map = malloc(sizeof(int64_t) * (size_t)(n + 1));
    if (!map) return pn_error(PN_ERR_OOM, "%s: out of memory", op);
    int64_t m = 0;
    for (int64_t v = 0; v < n; v++) map[v] = k[v] ? m++ : -1;
    int64_t Ek = 0;
    for (int64_t e = 0; e < E; e++) {
        int64_t a = ev[2 * e], b = ev[2 * e + 1];
        if (a < 0 || a >= n || b < 0 || b >= n) {
            free(map);
            return pn_error(PN_ERR_INDEX, "%s: edges row %lld is (%lld, %lld): node ids must be in [0, %lld)", op,
                            (long long)e + 1, (long long)a, (long long)b, (long long)n);
        }
        Ek += map[a] >= 0 && map[b] >= 0;
    }
    int64_t es[2] = {Ek, 2};
    pn_tensor *eo = pn_empty(2, es, PN_I64, PN_CPU), *io = eo ? pn_empty(1, &m, PN_I64, PN_CPU) : NULL;
    if (!io) {
        pn_release(eo);
        free(map);
        return PN_ERR_OOM;
    }
    int64_t *o = PV(eo), *iv = PV(io), j = 0;
    for (int64_t e = 0; e < E; e++) {
        int64_t a = map[ev[2 * e]], b = map[ev[2 * e + 1]];
        if (a >= 0 && b >= 0) o[2 * j] = a, o[2 * j + 1] = b, j++;
    }
    for (int64_t v = 0; v < n; v++)
        if (map[v] >= 0) iv[map[v]] = v;
    free(map);
    *edges_out = eo, *ids = io;
    return PN_OK;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

pn_status pn_graph_canonical(pn_tensor *edges, int64_t n, pn_tensor **edges_out) {
    const char *op = "graph.canonical";
    if (!edges_out) return pn_error(PN_ERR_ARG, "%s: NULL output", op);
    *edges_out = NULL;
    if (!edges || edges->dt != PN_I64 || edges->nd != 2 || edges->sizes[1] != 2 || edges->dev != PN_CPU ||
        !pn_is_contiguous(edges))
        return pn_error(PN_ERR_ARG, "%s: edges must be a contiguous (E, 2) i64 cpu tensor", op);
    if (n < 0 || n > ((int64_t)1 << 31))
        return pn_error(PN_ERR_ARG, "%s: num_nodes = %lld must be in [0, 2^31]", op, (long long)n);
    const int64_t E = edges->sizes[0], *ev = PV(edges);
    if (E > (INT64_MAX / 2) / (int64_t)sizeof(int64_t))
        return pn_error(PN_ERR_ARG, "%s: %lld edges are too many", op, (long long)E);
    /* both directions of every non-loop edge as one key a·n + b (< 2^62), sorted, deduplicated */
    int64_t *key = malloc(sizeof(int64_t) * (size_t)(2 * E + 1)), m = 0;
    if (!key) return pn_error(PN_ERR_OOM, "%s: out of memory for %lld edges", op, (long long)E);
    for (int64_t e = 0; e < E; e++) {
        int64_t a = ev[2 * e], b = ev[2 * e + 1];
        if (a < 0 || a >= n || b < 0 || b >= n) {
            free(key);
            return pn_error(PN_ERR_INDEX, "%s: edges row %lld is (%lld, %lld): node ids must be in [0, %lld)", op,
                            (long long)e + 1, (long long)a, (long long)b, (long long)n);
        }
        if (a == b) continue;
        key[m++] = a * n + b;
        key[m++] = b * n + a;
    }
    qsort(key, (size_t)m, sizeof(int64_t), cmp_i64);
    int64_t u = 0;
    for (int64_t i = 0; i < m; i++)
        if (i == 0 || key[i] != key[i - 1]) key[u++] = key[i];
    int64_t es[2] = {u, 2};
    pn_tensor *eo = pn_empty(2, es, PN_I64, PN_CPU);
    if (!eo) {
        free(key);
        return PN_ERR_OOM;
    }
    int64_t *o = PV(eo);
    for (int64_t i = 0; i < u; i++) o[2 * i] = key[i] / n, o[2 * i + 1] = key[i] % n;
    free(key);
    *edges_out = eo;
    return PN_OK;
}

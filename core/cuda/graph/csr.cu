/* csr.cu — the CUDA twin of graph/csr.c's kernel: the CSR by destination of an edge list.
 *
 * A one-time build (a graph's CSR is made once and reused by every attention call), so it runs
 * the CPU kernel itself on a host copy of the edges — the same validation, messages and
 * (dst, src) order by construction — and uploads offsets and src into device tensors. */
#include "../cuda.cuh"

pn_status pn_cuda_graph_csr(const pn_tensor *edges, int64_t num_nodes, int self_loops, pn_tensor **offsets,
                            pn_tensor **src) {
    *offsets = *src = NULL;
    /* host copy of edges (any strides: pn_copy_ moves it over, no autograd on index tensors) */
    pn_tensor *he = pn_empty(edges->nd, edges->sizes, edges->dt, PN_CPU);
    if (!he) return PN_ERR_OOM;
    pn_status st = pn_copy_(he, edges);
    pn_tensor *ho = NULL, *hs = NULL, *dof = NULL, *dsr = NULL;
    if (!st) st = pn_cpu_graph_csr(he, num_nodes, self_loops, &ho, &hs);
    if (!st) {
        dof = pn_empty(ho->nd, ho->sizes, PN_I64, PN_CUDA);
        dsr = pn_empty(hs->nd, hs->sizes, PN_I64, PN_CUDA);
        if (!dof || !dsr) st = PN_ERR_OOM;
    }
    if (!st && pn_numel(ho)) st = pn_cuda_upload(pn_ptr(dof), pn_ptr(ho), (size_t)pn_numel(ho) * sizeof(int64_t));
    if (!st && pn_numel(hs)) st = pn_cuda_upload(pn_ptr(dsr), pn_ptr(hs), (size_t)pn_numel(hs) * sizeof(int64_t));
    pn_release(he), pn_release(ho), pn_release(hs);
    if (st) {
        pn_release(dof), pn_release(dsr);
        return st;
    }
    *offsets = dof;
    *src = dsr;
    return PN_OK;
}

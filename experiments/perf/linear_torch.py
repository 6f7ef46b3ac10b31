#!/usr/bin/python3
"""linear_torch.py — the PyTorch (CPU) peer for experiments/perf/linear_cpu.lua.

Chunked causal linear attention written the usual way in PyTorch (per chunk of c rows:
the masked intra-chunk scores (Q Kᵀ ⊙ tril) V plus the inter-chunk state read Q S, then the
state update S += Kᵀ V), forward + backward by autograd, f32, the same thread count as the
Lua side. Prints `torch <version> threads <n>`, `median_ms <value>` and, when --data is
given, `max_abs_diff <value>` between its output and the one penumbra wrote.

    cosine (Cottention, causal):  out_t = n_t^(−σ(m_h)) Σ_{j≤t} (q̂_t·k̂_j) v_j, n_t = t+1
    power  (sympow p = 2, gated): out_i = Σ_{j≤i} g_ij (q_i·k_j)² v_j / Σ_{j≤i} g_ij (q_i·k_j)²,
           the inter-chunk state over φ(x) = the D(D+1)/2 symmetric monomials x_a x_b
           (a ≤ b, weight √2 off the diagonal), so φ(q)·φ(k) = (q·k)².

    /usr/bin/python3 experiments/perf/linear_torch.py --kind cosine --threads 2 \
        --heads 8 --n 2048 --dim 64 --chunk 64 --warmup 2 --reps 7 [--data /tmp/x.bin]
"""
import argparse
import statistics
import time

import numpy as np
import torch


def cosine_chunked(q, k, v, m, c):
    # q, k (B, H, N, D), v (B, H, N, Dv), m (H)
    B, H, N, D = q.shape
    qn = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-12)
    kn = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-12)
    S = q.new_zeros(B, H, D, v.shape[-1])
    tril = torch.ones(c, c, dtype=q.dtype).tril()
    outs = []
    for s0 in range(0, N, c):
        qc, kc, vc = qn[:, :, s0:s0 + c], kn[:, :, s0:s0 + c], v[:, :, s0:s0 + c]
        outs.append(((qc @ kc.transpose(-1, -2)) * tril) @ vc + qc @ S)
        S = S + kc.transpose(-1, -2) @ vc
    out = torch.cat(outs, 2)
    logn = torch.log(torch.arange(1, N + 1, dtype=q.dtype))
    scale = torch.exp(-torch.sigmoid(m)[:, None] * logn[None, :])  # (H, N)
    return out * scale[None, :, :, None]


def sympow2(x, ia, ib, w):
    # x (..., D) -> (..., D(D+1)/2)
    return x[..., ia] * x[..., ib] * w


def power_chunked(q, k, v, log_gate, c):
    # q, k (B, H, N, D), v (B, H, N, Dv), log_gate (B, H, N); p = 2
    B, H, N, D = q.shape
    ia, ib = torch.triu_indices(D, D)
    w = torch.where(ia == ib, torch.tensor(1.0), torch.tensor(2.0).sqrt()).to(q.dtype)
    Dp = ia.numel()
    S = q.new_zeros(B, H, Dp, v.shape[-1])
    z = q.new_zeros(B, H, Dp)
    tril = torch.ones(c, c, dtype=torch.bool).tril()
    outs = []
    for s0 in range(0, N, c):
        qc, kc, vc = q[:, :, s0:s0 + c], k[:, :, s0:s0 + c], v[:, :, s0:s0 + c]
        L = torch.cumsum(log_gate[:, :, s0:s0 + c], -1)  # (B, H, c), relative to the chunk start
        dec = (L[..., :, None] - L[..., None, :]).masked_fill(~tril, float("-inf")).exp()
        T = (qc @ kc.transpose(-1, -2)) ** 2 * dec
        pq = sympow2(qc, ia, ib, w) * L.exp()[..., None]
        num = T @ vc + pq @ S
        den = T.sum(-1) + (pq @ z[..., None]).squeeze(-1)
        outs.append(num / den[..., None])
        f = (L[..., -1:] - L).exp()  # (B, H, c)
        pk = sympow2(kc, ia, ib, w) * f[..., None]
        decay = L[..., -1].exp()
        S = S * decay[..., None, None] + pk.transpose(-1, -2) @ vc
        z = z * decay[..., None] + pk.sum(-2)
    return torch.cat(outs, 2)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kind", default="cosine", choices=["cosine", "power"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--data", default=None, help="raw f32 q, k, v, (log_gate), out written by the Lua side")
    a = p.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    H, N, D = a.heads, a.n, a.dim
    shape = (1, H, N, D)
    if a.data:
        raw = np.fromfile(a.data, dtype=np.float32)
        parts, off = [], 0
        sizes = [H * N * D] * 3 + ([H * N] if a.kind == "power" else []) + [H * N * D]
        for s in sizes:
            parts.append(torch.from_numpy(raw[off:off + s].copy()))
            off += s
        q, k, v = (t.view(shape) for t in parts[:3])
        lg = parts[3].view(1, H, N) if a.kind == "power" else None
        ref = parts[-1].view(shape)
    else:
        q, k, v = torch.randn(shape), torch.randn(shape), torch.randn(shape)
        lg = -torch.rand(1, H, N) * 0.1 if a.kind == "power" else None
        ref = None
    m = torch.full((H,), 0.5)
    q, k, v, m = (t.clone().requires_grad_() for t in (q, k, v, m))
    if lg is not None:
        lg = lg.clone().requires_grad_()
    g = torch.randn(shape)

    def fwd():
        if a.kind == "cosine":
            return cosine_chunked(q, k, v, m, a.chunk)
        return power_chunked(q, k, v, lg, a.chunk)

    def step():
        out = fwd()
        out.backward(g)
        for t in (q, k, v, m, lg):
            if t is not None:
                t.grad = None

    for _ in range(a.warmup):
        step()
    times = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    print(f"torch {torch.__version__} threads {torch.get_num_threads()}")
    print(f"median_ms {statistics.median(times):.4f}")
    if ref is not None:
        with torch.no_grad():
            print(f"max_abs_diff {(fwd() - ref).abs().max().item():.3g}")


if __name__ == "__main__":
    main()

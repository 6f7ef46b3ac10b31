#!/usr/bin/python3
"""attention_cpu_torch.py — the PyTorch (CPU) peer for experiments/perf/attention_cpu.lua.

Two implementations, both f32, B = 1, H = 8 by default, the Lua side's input recipes:
  sdpa   PyTorch 2's fused torch.nn.functional.scaled_dot_product_attention (on the CPU its
         flash-attention kernel): dot only, causal or not — what a researcher with a CPU uses
  naive  the attention every paper's reference code writes: the full (B, H, N, N) score matrix,
         softmax over it, then @ v; the distance scores from the same formulas as penumbra's
         (core/attention/*.h), their parameters at the registry's defaults, written with torch
         ops; causal masks the scores with −inf
Inputs: q, k = randn·0.3 and v = randn; the cones and hyperbolic get q and k through the score's
default map as penumbra's nn layers apply it (umbral ψ, penumbral ξ with h = r = 1, hyperbolic
the pseudo-polar map onto the hyperboloid, time-like coordinate last; core/attention/maps.c).

  info mode:  --info prints `info <key> <value>` lines: torch's version, the CPU capability
              its kernels dispatch to, the thread count, the SDPA backend it picks per (D, causal,
              grad)
  time mode:  prints `time <impl> <score> <N> <D> <causal> <pass> <median_ms> <min_ms> <ms,ms,…>`
              (every timed call, so the caller can pool them over its rounds)
  peak mode:  --peak impl:score:pass:causal — one call in this fresh process; prints
              `peak <bytes>`, the growth of the resident high-water mark over the inputs

    python experiments/perf/attention_cpu_torch.py --info --d 64,128
    python experiments/perf/attention_cpu_torch.py --threads 2 --n 1024 --d 64 --reps 5
    python experiments/perf/attention_cpu_torch.py --n 1024 --naive umbral,penumbral --causal 0
    python experiments/perf/attention_cpu_torch.py --n 4096 --peak sdpa:dot:fwd:0
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F


# ---- inputs ------------------------------------------------------------------------------------
def psi(x):  # Coneheads Eq. 10: (x₋·e^{x_d}, e^{x_d})
    h = x[..., -1:].exp()
    return torch.cat([x[..., :-1] * h, h], -1)


def xi(x, h=1.0):  # Coneheads Eq. 11: (x₋·hσ(x_d), hσ(x_d))
    s = h * torch.sigmoid(x[..., -1:])
    return torch.cat([x[..., :-1] * s, s], -1)


def pseudopolar(x):  # Gulcehre §4.1: (sinh(x_d)·x₋/‖x₋‖, cosh(x_d)); ‖x₋‖ floored at 1e-6 (f32)
    head, t = x[..., :-1], x[..., -1:]
    n = head.norm(dim=-1, keepdim=True).clamp_min(1e-6)
    return torch.cat([torch.sinh(t) * head / n, torch.cosh(t)], -1)


MAPS = {"umbral": psi, "penumbral": xi, "hyperbolic": pseudopolar}


def inputs(score, B, H, N, D):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(B, H, N, D, generator=g) * 0.3
    k = torch.randn(B, H, N, D, generator=g) * 0.3
    v = torch.randn(B, H, N, D, generator=g)
    if score in MAPS:
        q, k = MAPS[score](q), MAPS[score](k)
    return q.contiguous(), k.contiguous(), v


# ---- the naive scores (registry defaults: umbral r = 0.1, penumbral r = 1, γ = β = 1, c = 0) ----
def scores(score, q, k):
    D = q.shape[-1]
    if score == "dot":
        return q @ k.transpose(-1, -2) / math.sqrt(D)
    if score == "laplacian":
        return -torch.cdist(q, k)
    qd, kd = q[..., -1:], k[..., -1:].transpose(-1, -2)   # (…, N, 1), (…, 1, N)
    if score == "hyperbolic":  # hyperboloid: arcosh(−⟨q,k⟩_M)
        mink = q[..., :-1] @ k[..., :-1].transpose(-1, -2) - qd * kd
        return -torch.acosh((-mink).clamp_min(1 + 1e-7))
    dist = torch.cdist(q[..., :-1], k[..., :-1])
    if score == "umbral":
        r = 0.1
        z = dist / (2 * math.sinh(r)) + (qd + kd) / 2
        return -torch.maximum(torch.maximum(qd, kd), z)
    if score == "penumbral":
        r = 1.0
        A = (r * r - qd * qd).clamp_min(0).sqrt()
        Bk = (r * r - kd * kd).clamp_min(0).sqrt()
        inside = ((dist - A) ** 2 + kd * kd < r * r) | (dist <= A)
        m = (A + Bk - dist) / 2
        h_in = torch.maximum(torch.maximum(qd, kd), (r * r - m * m).clamp_min(0).sqrt())
        safe = dist.clamp_min(1e-12)
        x = (dist * dist + qd * qd - kd * kd) / (2 * safe)
        h_out = (x * x + kd * kd).sqrt()
        return -torch.where(inside, h_in, h_out)
    raise ValueError(score)


def attention(impl, score, q, k, v, causal):
    if impl == "sdpa":
        assert score == "dot", "sdpa times the dot score only"
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    s = scores(score, q, k)
    if causal:
        N = s.shape[-1]
        s = s.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


def rss():
    vals = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "VmHWM")):
                name, kb = line.split()[:2]
                vals[name.rstrip(":")] = int(kb) * 1024
    return vals


def sdpa_backend(B, H, N, D, causal, grad):
    """The backend SDPA dispatches these inputs to (torch._fused_sdp_choice; '?' if absent)."""
    choose = getattr(torch, "_fused_sdp_choice", None)
    if choose is None:
        return "?"
    q = torch.zeros(B, H, N, D, requires_grad=grad)
    c = choose(q, q, q, is_causal=causal)
    try:
        from torch.nn.attention import SDPBackend
        return SDPBackend(c).name
    except Exception:  # older torch: the enum's integer
        return str(c)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--b", type=int, default=1)
    p.add_argument("--h", type=int, default=8)
    p.add_argument("--d", default="64", help="head dims, comma-separated (each times a group)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--causal", default="0,1")
    p.add_argument("--passes", default="fwd,fwd+bwd")
    p.add_argument("--sdpa", type=int, default=1, help="time SDPA's dot")
    p.add_argument("--naive", default="", help="scores to time the naive way, comma-separated")
    p.add_argument("--info", action="store_true")
    p.add_argument("--peak", default=None, help="impl:score:pass:causal — the peak memory of one call")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    Ds = [int(d) for d in a.d.split(",") if d]
    causals = [c == "1" for c in a.causal.split(",") if c]
    passes = [s for s in a.passes.split(",") if s]

    if a.info:
        print("info torch %s" % torch.__version__)
        cap = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
        print("info cpu_capability %s" % (cap() if cap else "?"))
        print("info threads %d" % torch.get_num_threads())
        for D in Ds:
            for c in causals:
                print("info sdpa_backend D=%d causal=%d fwd=%s fwd+bwd=%s" % (
                    D, c, sdpa_backend(a.b, a.h, a.n, D, c, False), sdpa_backend(a.b, a.h, a.n, D, c, True)))
        return

    if a.peak:
        impl, score, pas, causal = a.peak.split(":")
        q, k, v = inputs(score, a.b, a.h, a.n, Ds[0])
        if pas == "fwd+bwd":
            q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
        base = rss()["VmRSS"]
        with open("/proc/self/clear_refs", "w") as f:  # reset the high-water mark
            f.write("5")
        if pas == "fwd":
            with torch.no_grad():
                o = attention(impl, score, q, k, v, causal == "1")
        else:
            o = attention(impl, score, q, k, v, causal == "1")
            o.backward(torch.ones_like(o))
        print("peak %d" % (rss()["VmHWM"] - base))
        return

    runs = ([("sdpa", "dot")] if a.sdpa else []) + [("naive", s) for s in a.naive.split(",") if s]
    for D in Ds:
        for impl, score in runs:
            q, k, v = inputs(score, a.b, a.h, a.n, D)
            for causal in causals:
                for pas in passes:
                    qq, kk, vv = q, k, v
                    if pas == "fwd+bwd":
                        qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
                    ts = []
                    for r in range(a.warmup + a.reps):
                        t0 = time.perf_counter()
                        if pas == "fwd":
                            with torch.no_grad():
                                o = attention(impl, score, qq, kk, vv, causal)
                        else:
                            o = attention(impl, score, qq, kk, vv, causal)
                            o.backward(torch.ones_like(o))
                            qq.grad = kk.grad = vv.grad = None
                        dt = time.perf_counter() - t0
                        if r >= a.warmup:
                            ts.append(dt)
                        del o
                    print("time %s %s %d %d %d %s %.3f %.3f %s" % (impl, score, a.n, D, causal, pas,
                          statistics.median(ts) * 1e3, min(ts) * 1e3, ",".join("%.3f" % (t * 1e3) for t in ts)),
                          flush=True)


if __name__ == "__main__":
    main()

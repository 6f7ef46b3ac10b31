#!/usr/bin/python3
"""attention_cpu_torch.py — the PyTorch (CPU) peer for experiments/perf/attention_cpu.lua.

The straightforward attention every paper's reference code writes: the full (B, H, N, N)
score matrix, softmax over it, then @ v; the distance scores from the same formulas as
penumbra's (core/attention/*.c) written with torch ops. Same shapes, dtype f32, same
input recipes (the cone scores and the half-space need positive heights, the hyperboloid
points on the sheet).

  time mode:  prints `time <score> <N> <pass> <median_ms> <min_ms>` per score and pass
  peak mode:  one (score, N, pass) in this fresh process; prints `peak <bytes>` — the growth
              of the resident set's high-water mark over the inputs (/proc/self/status)

    /usr/bin/python3 experiments/perf/attention_cpu_torch.py --threads 2 --n 1024 --reps 5
    /usr/bin/python3 experiments/perf/attention_cpu_torch.py --threads 2 --n 4096 --peak dot:fwd
"""
import argparse
import math
import statistics
import time

import torch


def inputs(score, B, H, N, D):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(B, H, N, D, generator=g) * 0.3
    k = torch.randn(B, H, N, D, generator=g) * 0.3
    v = torch.randn(B, H, N, D, generator=g)
    if score in ("umbral", "penumbral", "hyperbolic"):
        q, k = q.abs() + 0.1, k.abs() + 0.1
    if score == "hyperbolic":  # on the hyperboloid, time-like coordinate last
        q = torch.cat([q[..., :-1], (1 + (q[..., :-1] ** 2).sum(-1, keepdim=True)).sqrt()], -1)
        k = torch.cat([k[..., :-1], (1 + (k[..., :-1] ** 2).sum(-1, keepdim=True)).sqrt()], -1)
    return q, k, v


def scores(score, q, k):
    D = q.shape[-1]
    if score == "dot":
        return q @ k.transpose(-1, -2) / math.sqrt(D)
    if score == "laplacian":
        return -torch.cdist(q, k)
    qd, kd = q[..., -1:], k[..., -1:].transpose(-1, -2)   # (…, N, 1), (…, 1, N)
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
    if score == "hyperbolic":  # hyperboloid: arcosh(−⟨q,k⟩_M), β = 1, c = 0
        mink = q[..., :-1] @ k[..., :-1].transpose(-1, -2) - qd * kd
        return -torch.acosh((-mink).clamp_min(1 + 1e-7))
    raise ValueError(score)


def attention(score, q, k, v):
    return torch.softmax(scores(score, q, k), -1) @ v


def rss():
    vals = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "VmHWM")):
                name, kb = line.split()[:2]
                vals[name.rstrip(":")] = int(kb) * 1024
    return vals


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--b", type=int, default=1)
    p.add_argument("--h", type=int, default=8)
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--scores", default="dot,laplacian,umbral,penumbral,hyperbolic")
    p.add_argument("--peak", default=None, help="score:pass — measure the peak memory of one call")
    a = p.parse_args()
    torch.set_num_threads(a.threads)

    if a.peak:
        score, pas = a.peak.split(":")
        q, k, v = inputs(score, a.b, a.h, a.n, a.d)
        if pas == "fwd+bwd":
            q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
        base = rss()["VmRSS"]
        with open("/proc/self/clear_refs", "w") as f:  # reset the high-water mark
            f.write("5")
        o = attention(score, q, k, v)
        if pas == "fwd+bwd":
            o.backward(torch.ones_like(o))
        print("peak %d" % (rss()["VmHWM"] - base))
        return

    for score in a.scores.split(","):
        q, k, v = inputs(score, a.b, a.h, a.n, a.d)
        for pas in ("fwd", "fwd+bwd"):
            qq, kk, vv = q, k, v
            if pas == "fwd+bwd":
                qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
            ts = []
            for r in range(a.warmup + a.reps):
                t0 = time.perf_counter()
                if pas == "fwd":
                    with torch.no_grad():
                        o = attention(score, qq, kk, vv)
                else:
                    o = attention(score, qq, kk, vv)
                    o.backward(torch.ones_like(o))
                    qq.grad = kk.grad = vv.grad = None
                dt = time.perf_counter() - t0
                if r >= a.warmup:
                    ts.append(dt)
                del o
            print("time %s %d %s %.3f %.3f" % (score, a.n, pas, statistics.median(ts) * 1e3, min(ts) * 1e3), flush=True)


if __name__ == "__main__":
    main()

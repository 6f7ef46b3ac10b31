#!/usr/bin/python3
"""attention_gpu_torch.py — the PyTorch peers of experiments/perf/attention_gpu.lua on the GPU:
  sdpa   torch.nn.functional.scaled_dot_product_attention restricted to the FlashAttention
         backend (bf16: flash needs 16-bit inputs), causal or not;
  cone   the authors' straightforward PyTorch cone attention (full scores, softmax, @ v;
         attention_cpu_torch.py's `scores`) under torch.compile, f32, for umbral/penumbral.
Same shapes as ours (B, H, N, D), forward and forward+backward (backward of sum(out)),
warm-up then timed calls, each synchronised. Prints `torch <version> <device>` and
`time <peer> <score> <N> <pass> <median ms>`.

    python attention_gpu_torch.py --n 4096 --b 4 --h 32 --d 64 --causal 0 --reps 10
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_cpu_torch import scores  # noqa: E402  the same score formulas as the CPU peer


def timed(fn, reps, warmup):
    ts = []
    for it in range(warmup + reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        if it >= warmup:
            ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--b", type=int, required=True)
    p.add_argument("--h", type=int, required=True)
    p.add_argument("--d", type=int, required=True)
    p.add_argument("--causal", type=int, default=0)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--cones", default="umbral,penumbral")
    a = p.parse_args()
    dev = torch.device("cuda")
    print("torch %s %s" % (torch.__version__, torch.cuda.get_device_name(0)), flush=True)
    shape = (a.b, a.h, a.n, a.d)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (torch.randn(shape, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        f = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=bool(a.causal))
        print("time sdpa dot %d fwd %.4f" % (a.n, timed(lambda: f().detach(), a.reps, a.warmup)), flush=True)
        print("time sdpa dot %d fwd+bwd %.4f" % (a.n, timed(lambda: f().sum().backward(), a.reps, a.warmup)),
              flush=True)
    for cone in filter(None, a.cones.split(",")):
        qc = (torch.rand(shape, device=dev) + 0.1).requires_grad_()
        kc = (torch.rand(shape, device=dev) + 0.1).requires_grad_()
        vc = torch.randn(shape, device=dev, requires_grad=True)
        att = torch.compile(lambda q_, k_, v_: torch.softmax(scores(cone, q_, k_), -1) @ v_)
        try:
            print("time compiled %s %d fwd %.4f" % (cone, a.n, timed(lambda: att(qc, kc, vc).detach(), a.reps,
                                                                       a.warmup)), flush=True)
            print("time compiled %s %d fwd+bwd %.4f" % (cone, a.n, timed(lambda: att(qc, kc, vc).sum().backward(),
                                                                           a.reps, a.warmup)), flush=True)
        except torch.cuda.OutOfMemoryError:  # the N² score matrix
            print("oom compiled %s %d" % (cone, a.n), flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

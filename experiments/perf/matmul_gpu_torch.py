#!/usr/bin/python3
"""matmul_gpu_torch.py — the PyTorch peer of gat_gpu.lua's matmul row: torch.matmul of two
n × n f32 matrices on the GPU (TF32 off, as ours), warm-up then timed calls, each synchronised.
Prints `torch <version> <device name>` and `time <ms> <ms> …`.

    python experiments/perf/matmul_gpu_torch.py --n 4096 --reps 10 --warmup 3
"""
import argparse
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    print("torch %s %s" % (torch.__version__, torch.cuda.get_device_name(0)), flush=True)
    x = torch.rand(a.n, a.n, device=dev)
    y = torch.rand(a.n, a.n, device=dev)
    ts = []
    for it in range(a.warmup + a.reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        torch.matmul(x, y)
        torch.cuda.synchronize()
        if it >= a.warmup:
            ts.append(time.perf_counter() - t0)
    print("time %s" % " ".join("%.4f" % (t * 1e3) for t in ts), flush=True)


if __name__ == "__main__":
    main()

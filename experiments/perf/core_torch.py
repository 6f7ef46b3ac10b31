#!/usr/bin/python3
"""core_torch.py — the PyTorch (CPU) peer for experiments/perf/core.lua.

Times one MLP training step (forward + backward, no optimiser update) with the same
shapes as the Lua side and prints one line: `median_ms <value>`.

    /usr/bin/python3 experiments/perf/core_torch.py --threads 2 --batch 64 \
        --sizes 784,512,512,10 --warmup 5 --reps 20
"""
import argparse
import statistics
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--sizes", default="784,512,512,10")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--reps", type=int, default=20)
    a = p.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    sizes = [int(s) for s in a.sizes.split(",")]
    params = []
    for din, dout in zip(sizes[:-1], sizes[1:]):
        w = (torch.randn(din, dout) / din ** 0.5).requires_grad_()
        b = torch.zeros(dout).requires_grad_()
        params += [w, b]
    x = torch.randn(a.batch, sizes[0])
    y = torch.randint(0, sizes[-1], (a.batch,))

    def step():
        h = x
        for i in range(0, len(params), 2):
            h = h.matmul(params[i]) + params[i + 1]
            if i + 2 < len(params):
                h = torch.relu(h)
        loss = torch.nn.functional.cross_entropy(h, y)
        loss.backward()
        for q in params:
            q.grad = None
        return loss

    for _ in range(a.warmup):
        step()
    times = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    print(f"torch {torch.__version__} threads {torch.get_num_threads()}")
    print(f"median_ms {statistics.median(times):.4f}")


if __name__ == "__main__":
    main()

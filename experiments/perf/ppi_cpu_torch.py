#!/usr/bin/python3
"""ppi_cpu_torch.py — the PyTorch (CPU) peer for experiments/perf/ppi_cpu.lua.

The inductive GAT of the PPI recipe (layers of gat_cpu_torch.py's scatter-based GATConv:
heads 4-4-6, `hidden` units per head, ELU, the middle layer adds its input, the output layer
averages its heads; no dropout), trained with binary cross-entropy with logits and Adam
(lr 0.005) over the batches ppi_cpu.lua wrote (batch<i>/{x, y, offsets, src}: our CSR by
destination with self loops) with the weights it wrote (<score>/param/<name>).
Prints `torch <version> …`, then per score `check <score> <max|Δ logits|> <max|logits|>
<max rel grad err> <worst param>` (with --check 1: eval mode, the first batch, against
<score>/logits and <score>/grad/<name>), `time <score> <ms> …` (one figure per timed epoch)
and `peak <score> <bytes>` (growth of VmHWM over the timed epochs).

    /usr/bin/python3 experiments/perf/ppi_cpu_torch.py --data /tmp/x_ppi_cpu.h5 --threads 2
"""
import argparse
import os
import sys
import time
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gat_cpu_torch import GATConv  # noqa: E402  the one scatter GAT layer of the benchmarks

try:
    import h5py
except ImportError:
    sys.exit("ppi_cpu_torch.py: h5py is missing: apt-get install python3-h5py")


def status():
    r = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k.startswith("Vm"):
                r[k] = int(v.split()[0]) * 1024
    return r


def reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


class InductiveGAT(torch.nn.Module):
    def __init__(self, P, score, heads, hidden, classes):
        super().__init__()
        self.layers = torch.nn.ModuleList()
        self.residual = []
        width = None
        for i, h in enumerate(heads):
            last = i == len(heads) - 1
            fout = classes if last else hidden
            self.layers.append(GATConv(P, "layer%d." % (i + 1), score, h, fout, fout, not last, 0.0, 0.0))
            self.residual.append(i > 0 and not last and width == h * hidden)
            width = h * hidden
        self.ours = {}
        for layer in self.layers:
            self.ours.update(layer.ours)

    def forward(self, x, src, dst):
        h = x
        for layer, res in zip(self.layers[:-1], self.residual):
            out = layer(h, src, dst)
            h = F.elu(out + h if res else out)
        return self.layers[-1](h, src, dst)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--scores", default="gat,dot")
    p.add_argument("--batches", type=int, required=True)
    p.add_argument("--check", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    warnings.filterwarnings("ignore", message="scatter_reduce")  # "in beta" (1.13)
    print("torch %s: %d threads (intra-op), %d inter-op" % (torch.__version__, torch.get_num_threads(),
                                                           torch.get_num_interop_threads()), flush=True)
    f = h5py.File(a.data, "r")
    batches = []
    for i in range(1, a.batches + 1):
        g = f["batch%d" % i]
        offsets = torch.from_numpy(g["offsets"][()]).long()
        src = torch.from_numpy(g["src"][()]).long()
        x = torch.from_numpy(g["x"][()])
        dst = torch.repeat_interleave(torch.arange(x.shape[0]), offsets[1:] - offsets[:-1])
        batches.append((x, torch.from_numpy(g["y"][()]).float(), src, dst))
    for score in a.scores.split(","):
        P = {k: torch.from_numpy(v[()]) for k, v in f[score]["param"].items()}
        hidden = P["layer1.bias"].shape[0] // 4
        classes = P["layer3.bias"].shape[0]
        model = InductiveGAT(P, score, [4, 4, 6], hidden, classes)
        if a.check:
            model.eval()
            x, y, src, dst = batches[0]
            logits = model(x, src, dst)
            F.binary_cross_entropy_with_logits(logits, y).backward()
            ref = torch.from_numpy(f[score]["logits"][()])
            dl = (logits.detach() - ref).abs().max().item()
            worst, wname = 0.0, "-"
            for name, og in f[score]["grad"].items():
                ours, theirs = torch.from_numpy(og[()]), model.ours[name].grad
                rel = ((ours - theirs).abs().max() / theirs.abs().max().clamp_min(1e-30)).item()
                if not rel <= worst:
                    worst, wname = rel, name
            print("check %s %.6g %.6g %.6g %s" % (score, dl, ref.abs().max().item(), worst, wname), flush=True)
            model.zero_grad(set_to_none=True)
        model.train()
        opt = torch.optim.Adam(model.parameters(), lr=0.005)

        def epoch():
            for x, y, src, dst in batches:
                opt.zero_grad(set_to_none=True)
                loss = F.binary_cross_entropy_with_logits(model(x, src, dst), y)
                loss.backward()
                opt.step()
                del loss

        for _ in range(a.warmup):
            epoch()
        reset_peak()
        base = status()["VmRSS"]
        ts = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            epoch()
            ts.append(time.perf_counter() - t0)
        print("time %s %s" % (score, " ".join("%.3f" % (t * 1e3) for t in ts)), flush=True)
        print("peak %s %d" % (score, status()["VmHWM"] - base), flush=True)
    f.close()


if __name__ == "__main__":
    main()

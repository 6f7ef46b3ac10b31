#!/usr/bin/python3
"""rt_cpu_torch.py — the PyTorch (CPU) peer for experiments/perf/rt_cpu.lua.

The Recursive Transformer of lua/penumbra/nn/recursive.lua (HAN App. A.5) written the
straightforward PyTorch way over graph neighbourhoods: edges (src → dst) from our CSR (self
loops included), q_dst and k_src gathered per edge with index_select, the score per edge,
a segment softmax by destination (scatter_reduce 'amax' on the detached scores, exp,
index_add_ of the denominators) or sigmoid weights, aggregation with index_add_.

  score        per edge e = (j → i), per head; q, k (N, H, d) after the map
  dot          q_i·k_j / √d
  hyperbolic   −acosh(1 + t), t = ½(‖q₋ − k₋‖² − (q_d − k_d)²) after the pseudopolar map
               (the hyperboloid distance in its difference form); sigmoid weights; values:
               pseudopolar → Klein, Einstein midpoint Σ w γ(v) v / Σ w γ(v), back to the
               hyperboloid

Input: the HDF5 file rt_cpu.lua writes (x, y, pairs, offsets, src, and per score
<score>/param/<name>, <score>/logits, <score>/grad/<name> of the first step's loss).
Prints `torch <version> threads <t>`, per score `check <score> <max |Δ logits|> <max |logits|>
<max rel grad err> <worst param>` (with --check 1) and `time <score> <ms> <ms> …` (one
figure per timed training step: forward, backward, Adam step).

    /usr/bin/python3 experiments/perf/rt_cpu_torch.py --data /tmp/x_rt.h5 --threads 2
"""
import argparse
import math
import time

import h5py
import torch

ap = argparse.ArgumentParser()
ap.add_argument('--data', required=True)
ap.add_argument('--threads', type=int, default=2)
ap.add_argument('--reps', type=int, default=5)
ap.add_argument('--warmup', type=int, default=1)
ap.add_argument('--scores', default='dot,hyperbolic')
ap.add_argument('--check', type=int, default=1)
ap.add_argument('--heads', type=int, default=4)
ap.add_argument('--head-dim', type=int, default=4)
ap.add_argument('--depth', type=int, default=3)
ap.add_argument('--lr', type=float, default=0.003)
a = ap.parse_args()
torch.set_num_threads(a.threads)
print('torch', torch.__version__, 'threads', torch.get_num_threads(), flush=True)

f = h5py.File(a.data, 'r')
x = torch.tensor(f['x'][()])
y = torch.tensor(f['y'][()]).long()
pairs = torch.tensor(f['pairs'][()]).long()
offsets = torch.tensor(f['offsets'][()]).long()
src = torch.tensor(f['src'][()]).long()
N = x.shape[0]
dst = torch.repeat_interleave(torch.arange(N), offsets[1:] - offsets[:-1])
H, dh = a.heads, a.head_dim
EPS_NORM = 1e-6  # our pseudopolar floor on ‖x₋‖ (f32)


def pseudopolar(t):  # (…, d) → (sinh(x_d)·x₋/‖x₋‖, cosh(x_d))
    head, xd = t[..., :-1], t[..., -1:]
    n = head.norm(dim=-1, keepdim=True).clamp_min(EPS_NORM)
    return torch.cat([torch.sinh(xd) * head / n, torch.cosh(xd)], -1)


def to_klein(h):  # hyperboloid (…, d) → Klein (…, d−1)
    return h[..., :-1] / h[..., -1:]


def from_klein(k):  # Klein (…, d) → hyperboloid (…, d+1)
    g = 1 / torch.sqrt(1 - (k * k).sum(-1, keepdim=True))
    return torch.cat([g * k, g], -1)


class RT(torch.nn.Module):
    def __init__(self, params, score):
        super().__init__()
        self.score = score
        self.p = torch.nn.ParameterDict({k.replace('.', '_'): torch.nn.Parameter(v.clone()) for k, v in params.items()})

    def lin(self, name, t):
        return t @ self.p[name + '_weight'].t() + self.p[name + '_bias']

    def ln(self, name, t):
        return torch.nn.functional.layer_norm(t, t.shape[-1:], self.p[name + '_weight'], self.p[name + '_bias'], 1e-5)

    def attend(self, q, k, v):
        qe, ke, ve = q.index_select(0, dst), k.index_select(0, src), v.index_select(0, src)  # (E, H, ·)
        if self.score == 'dot':
            s = (qe * ke).sum(-1) / math.sqrt(dh)
            m = torch.full((N, H), -math.inf).scatter_reduce(0, dst[:, None].expand(-1, H), s.detach(), 'amax')
            w = torch.exp(s - m.index_select(0, dst))
            z = torch.zeros(N, H).index_add_(0, dst, w)
            w = w / z.index_select(0, dst)
            return torch.zeros(N, H, ve.shape[-1]).index_add_(0, dst, w[..., None] * ve)
        # hyperbolic: sigmoid weights, Einstein midpoint in the Klein model
        d2 = ((qe[..., :-1] - ke[..., :-1]) ** 2).sum(-1)
        dt = qe[..., -1] - ke[..., -1]
        t = (0.5 * (d2 - dt * dt)).clamp_min(0)
        s = -torch.acosh(1 + t)
        w = torch.sigmoid(s)
        g = 1 / torch.sqrt(1 - (ve * ve).sum(-1))
        wg = w * g
        num = torch.zeros(N, H, ve.shape[-1]).index_add_(0, dst, wg[..., None] * ve)
        den = torch.zeros(N, H).index_add_(0, dst, wg)
        return num / den[..., None]

    def block(self, h):
        q = self.lin('q_proj', h).view(N, H, dh)
        k = self.lin('k_proj', h).view(N, H, dh)
        v = self.lin('v_proj', h).view(N, H, dh)
        if self.score == 'hyperbolic':
            q, k, v = pseudopolar(q), pseudopolar(k), to_klein(pseudopolar(v))
        o = self.attend(q, k, v)
        if self.score == 'hyperbolic':
            o = from_klein(o)
        h = self.ln('norm1', h + self.lin('out_proj', o.reshape(N, H * dh)))
        return self.ln('norm2', h + self.lin('ff2', torch.relu(self.lin('ff1', h))))

    def forward(self, x, pairs):
        h = torch.relu(self.lin('encoder', x))
        for _ in range(a.depth):
            h = self.block(h)
        ha, hb = h.index_select(0, pairs[:, 0]), h.index_select(0, pairs[:, 1])
        z = torch.cat([ha, hb, ha * hb, (ha - hb).abs()], 1)
        return self.lin('read2', torch.relu(self.lin('read1', z)))


for score in a.scores.split(','):
    params = {k: torch.tensor(f[score]['param'][k][()]) for k in f[score]['param'].keys()}
    # h5 groups nest on '/': names were written with '.' → '/' by the Lua side
    model = RT(params, score)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    if a.check:
        logits = model(x, pairs)
        loss = torch.nn.functional.cross_entropy(logits, y)
        loss.backward()
        ref = torch.tensor(f[score]['logits'][()])
        worst, wname = 0.0, ''
        refs = {k: torch.tensor(f[score]['grad'][k][()]) for k in f[score]['grad'].keys()}
        # relative to the tensor's own largest gradient, floored at 1e-3 of the largest of
        # all: a gradient that is zero in exact arithmetic (dot's key bias) is rounding noise
        floor = 1e-3 * max(g.abs().max().item() for g in refs.values())
        for k, g_ref in refs.items():
            g = model.p[k.replace('.', '_')].grad
            err = ((g - g_ref).abs().max() / max(g_ref.abs().max().item(), floor)).item()
            if err > worst:
                worst, wname = err, k
        print('check %s %.3g %.3g %.3g %s' % (score, (logits - ref).abs().max().item(), ref.abs().max().item(), worst,
                                               wname), flush=True)
        opt.zero_grad()
    times = []
    for rep in range(a.warmup + a.reps):
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x, pairs), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if rep >= a.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    print('time %s %s' % (score, ' '.join('%.2f' % t for t in times)), flush=True)

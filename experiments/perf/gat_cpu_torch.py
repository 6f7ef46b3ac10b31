#!/usr/bin/python3
"""gat_cpu_torch.py — the PyTorch peer for experiments/perf/gat_cpu.lua (CPU) and, with
--device cuda, for experiments/perf/gat_gpu.lua (timings then synchronise the GPU).

The two-layer GAT of the recipe written the straightforward scatter-based way: edge lists
(src, dst) from our CSR (self loops included), q_i, k_j gathered per edge with
index_select, the score per edge with torch ops as the papers define it, a segment
softmax by destination (max by scatter_reduce 'amax' on the detached scores, exp,
index_add_ of the denominators), dropout on the weights and the values, aggregation with index_add.

  score        per edge e = (j → i), per head; q, k (N, H, d) after the map
  dot          q_i·k_j / √d
  laplacian    −γ‖q_i − k_j‖
  umbral       −γ·max(q_d, k_d, ‖q₋ − k₋‖/(2 sinh r) + (q_d + k_d)/2)     after ψ, r = 0.1
  penumbral    −γ·height, Coneheads Def. 1 (both branches)               after ξ (h = r = 1)
  hyperbolic   −β·arcosh(−⟨q, k⟩_M)                                      after pseudopolar
  gat          LeakyReLU_0.2(a_l·Wh_i + a_r·Wh_j)                        (per node, then gathered)

Input: the HDF5 file gat_cpu.lua writes (x, y, train_idx, offsets, src, and per score
<score>/param/<name>, with --check also <score>/<tag>/logits and <score>/<tag>/grad/<name>
for tag init (the initial weights) and scaled (proj weights × --check-scale), eval mode).
With --pyg 1 also score `pyg`: PyTorch Geometric's GATConv (PygGAT) on the gat score's weights,
checked against our gat and timed the same way.
Prints `torch <version> …`, then per score `check <score> <tag> <max|Δ logits|> <max|logits|>
<max rel grad err> <worst param>` (with --check 1), `time <score> <ms> <ms> …` (one
figure per timed epoch) and `phase <score> <fwd>,<bwd>,<step> …` (ms, per timed epoch; step
includes zero_grad).

    /usr/bin/python3 experiments/perf/gat_cpu_torch.py --data /tmp/x_gat_cpu.h5 --threads 2
"""
import argparse
import math
import sys
import time
import warnings

import torch

try:
    import h5py
except ImportError:
    sys.exit("gat_cpu_torch.py: h5py is missing: apt-get install python3-h5py")
import torch.nn.functional as F

DEFAULT_R = {"umbral": 0.1, "penumbral": 1.0}


# ---- maps onto the score's manifold (x (…, d): x₋ = x[..., :-1], x_d = x[..., -1]) ----------
def psi(x):  # Coneheads Eq. 10: (x₋ e^{x_d}, e^{x_d})
    e = x[..., -1:].exp()
    return torch.cat([x[..., :-1] * e, e], -1)


def xi(x, h):  # Coneheads Eq. 11: (x₋ hσ(x_d), hσ(x_d))
    s = h * torch.sigmoid(x[..., -1:])
    return torch.cat([x[..., :-1] * s, s], -1)


def pseudopolar(x):  # Gulcehre §4.1: (sinh(x_d) x₋/‖x₋‖, cosh(x_d)), time-like last
    u, r = x[..., :-1], x[..., -1:]
    nu = u.norm(dim=-1, keepdim=True).clamp_min(1e-6)
    return torch.cat([torch.sinh(r) * u / nu, torch.cosh(r)], -1)


# ---- scores per edge: qi, kj (E, H, d) → (E, H) ------------------------------------------------------
def edge_scores(score, qi, kj, gamma, r):
    d = qi.shape[-1]
    if score == "dot":
        return (qi * kj).sum(-1) / math.sqrt(d)
    if score == "laplacian":
        return -gamma * (qi - kj).norm(dim=-1)
    qd, kd = qi[..., -1], kj[..., -1]
    dist = (qi[..., :-1] - kj[..., :-1]).norm(dim=-1)  # Δ = ‖q₋ − k₋‖
    if score == "umbral":  # Def. 2, Eq. 8
        z = dist / (2 * math.sinh(r)) + (qd + kd) / 2
        return -gamma * torch.maximum(torch.maximum(qd, kd), z)
    if score == "penumbral":  # Def. 1: Eq. 5 inside the cone (Eq. 23), Eq. 6 outside
        A = (r * r - qd * qd).clamp_min(0).sqrt()
        Bk = (r * r - kd * kd).clamp_min(0).sqrt()
        inside = ((dist - A) ** 2 + kd * kd < r * r) | (dist <= A)
        m = (A + Bk - dist) / 2
        h_in = torch.maximum(torch.maximum(qd, kd), (r * r - m * m).clamp_min(0).sqrt())
        x = (dist * dist + qd * qd - kd * kd) / (2 * dist.clamp_min(1e-12))
        h_out = (x * x + kd * kd).sqrt()
        return -gamma * torch.where(inside, h_in, h_out)
    if score == "hyperbolic":  # hyperboloid, β = 1, c = 0
        # the usual clamp of the arcosh argument at 1 + eps (at init the points sit near the
        # origin and X rounds to ≤ 1 on some edges: a clamp at exactly 1 gives inf·0 = NaN
        # gradients; ours takes the subgradient 0 within rounding of the kink instead)
        mink = (qi[..., :-1] * kj[..., :-1]).sum(-1) - qd * kd
        return -torch.acosh((-mink).clamp_min(1 + 1e-7))
    raise ValueError(score)


class GATConv(torch.nn.Module):
    """x (N, fin) → (N, H·fout) when concat, else the mean over heads (N, fout)."""

    def __init__(self, P, prefix, score, heads, fout, qk_dim, concat, dropout, attn_dropout, gamma=1.0):
        super().__init__()
        self.score, self.H, self.fout, self.qk = score, heads, fout, qk_dim
        self.concat, self.dropout, self.attn_dropout, self.gamma = concat, dropout, attn_dropout, gamma
        self.r = DEFAULT_R.get(score)
        self.weight = torch.nn.Parameter(P[prefix + "proj.weight"].clone())  # (out, in)
        self.bias = torch.nn.Parameter(P[prefix + "bias"].clone())
        self.ours = {prefix + "proj.weight": self.weight, prefix + "bias": self.bias}  # our names
        if score == "gat":
            self.a_l = torch.nn.Parameter(P[prefix + "a_l"].clone())  # (H, fout)
            self.a_r = torch.nn.Parameter(P[prefix + "a_r"].clone())
            self.ours.update({prefix + "a_l": self.a_l, prefix + "a_r": self.a_r})

    def mapped(self, t):
        if self.score == "umbral":
            return psi(t)
        if self.score == "penumbral":
            return xi(t, self.r)
        if self.score == "hyperbolic":
            return pseudopolar(t)
        return t

    def forward(self, x, src, dst):
        N, H, fo = x.shape[0], self.H, self.fout
        h = F.dropout(x, self.dropout, self.training)
        allp = F.linear(h, self.weight)
        if self.score == "gat":
            v = allp.view(N, H, fo)
            el = (v * self.a_l).sum(-1)  # (N, H): a_l·Wh_i
            er = (v * self.a_r).sum(-1)  # a_r·Wh_j
            s = F.leaky_relu(el.index_select(0, dst) + er.index_select(0, src), 0.2)
        else:
            wv, wq = H * fo, H * self.qk
            v = allp[:, :wv].reshape(N, H, fo)
            q = self.mapped(allp[:, wv:wv + wq].reshape(N, H, self.qk))
            k = self.mapped(allp[:, wv + wq:].reshape(N, H, self.qk))
            s = edge_scores(self.score, q.index_select(0, dst), k.index_select(0, src), self.gamma, self.r)
        # segment softmax over the edges into each destination
        E = s.shape[0]
        m = torch.full((N, H), -math.inf, device=x.device).scatter_reduce(0, dst.view(E, 1).expand(E, H), s.detach(), "amax",
                                                          include_self=True)
        ex = (s - m.index_select(0, dst)).exp()
        z = torch.zeros(N, H, device=x.device).index_add(0, dst, ex)
        w = ex / z.index_select(0, dst)
        w = F.dropout(w, self.attn_dropout, self.training)
        v = F.dropout(v, self.dropout, self.training)  # projection dropout (the recipe's proj_dropout)
        out = torch.zeros(N, H, fo, device=x.device).index_add(0, dst, w.unsqueeze(-1) * v.index_select(0, src))
        out = out.reshape(N, H * fo) if self.concat else out.mean(1)
        return out + self.bias


class PygGAT(torch.nn.Module):
    """The same two-layer GAT as a PyTorch Geometric user writes it (PyG's examples/gat.py):
    torch_geometric.nn.GATConv (its attention dropout), dropout on each layer's input, ELU between;
    our CSR's self loops given as edges (add_self_loops=False). Our gat weights copied in: proj →
    lin, a_l (the destination's term) → att_dst, a_r (the source's) → att_src, bias. PyG has no
    dropout on the projected values (ours has), so in training mode it draws one mask fewer."""

    def __init__(self, P, classes, a):
        super().__init__()
        from torch_geometric.nn import GATConv as PGATConv
        self.dropout = a.dropout
        self.conv1 = PGATConv(P["layer1.proj.weight"].shape[1], a.hidden, heads=a.heads, dropout=a.dropout,
                              add_self_loops=False)
        self.conv2 = PGATConv(a.hidden * a.heads, classes, heads=1, concat=False, dropout=a.dropout,
                              add_self_loops=False)
        self.ours = {}
        for prefix, conv in (("layer1.", self.conv1), ("layer2.", self.conv2)):
            lin = conv.lin if getattr(conv, "lin", None) is not None else conv.lin_src
            self.ours.update({prefix + "proj.weight": lin.weight, prefix + "a_l": conv.att_dst,
                              prefix + "a_r": conv.att_src, prefix + "bias": conv.bias})

    def forward(self, x, edge_index):
        h = F.dropout(x, self.dropout, self.training)
        h = F.elu(self.conv1(h, edge_index))
        h = F.dropout(h, self.dropout, self.training)
        return self.conv2(h, edge_index)


class GAT(torch.nn.Module):
    def __init__(self, P, score, classes, a):
        super().__init__()
        self.layer1 = GATConv(P, "layer1.", score, a.heads, a.hidden, a.qk_dim, True, a.dropout, a.dropout)
        self.layer2 = GATConv(P, "layer2.", score, 1, classes, a.qk_dim, False, a.dropout, a.dropout)

    def forward(self, x, src, dst):
        return self.layer2(F.elu(self.layer1(x, src, dst)), src, dst)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--scores", default="dot,laplacian,umbral,penumbral,hyperbolic,gat")
    p.add_argument("--check", type=int, default=1)
    p.add_argument("--check-scale", dest="check_scale", type=float, default=5.0)
    p.add_argument("--hidden", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--qk-dim", dest="qk_dim", type=int, default=8)
    p.add_argument("--dropout", type=float, default=0.6)
    p.add_argument("--lr", type=float, default=0.005)
    p.add_argument("--weight-decay", dest="weight_decay", type=float, default=5e-4)
    p.add_argument("--device", default="cpu")
    p.add_argument("--pyg", type=int, default=0)  # also PyG's GATConv on the gat weights (score 'pyg')
    a = p.parse_args()
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    torch.set_num_threads(a.threads)
    warnings.filterwarnings("ignore", message="scatter_reduce")  # "in beta" (1.13)
    print("torch %s: %d threads (intra-op), %d inter-op" % (torch.__version__, torch.get_num_threads(),
                                                           torch.get_num_interop_threads()), flush=True)

    f = h5py.File(a.data, "r")
    x = torch.from_numpy(f["x"][()]).to(dev)
    y = torch.from_numpy(f["y"][()]).long().to(dev)
    train_idx = torch.from_numpy(f["train_idx"][()]).long().to(dev)
    offsets = torch.from_numpy(f["offsets"][()]).long().to(dev)
    src = torch.from_numpy(f["src"][()]).long().to(dev)
    N = x.shape[0]
    dst = torch.repeat_interleave(torch.arange(N, device=dev), offsets[1:] - offsets[:-1])  # CSR by destination
    classes = int(y.max()) + 1
    ytr = y.index_select(0, train_idx)

    scores = a.scores.split(",")
    if a.pyg:
        try:
            import torch_geometric
            print("pyg %s (torch_geometric.nn.GATConv)" % torch_geometric.__version__, flush=True)
            scores.append("pyg")
        except ImportError:
            print("pyg missing: build/venv-peers/bin/pip install torch_geometric", flush=True)
    edge_index = torch.stack([src, dst])  # PyG: messages from row 0 (source) to row 1 (destination)
    for score in scores:
        P = {k: torch.from_numpy(v[()]).to(dev) for k, v in f["gat" if score == "pyg" else score]["param"].items()}
        if score == "pyg":
            model = PygGAT(P, classes, a).to(dev)
            params = model.ours
            run = lambda: model(x, edge_index)
        else:
            model = GAT(P, score, classes, a)
            params = dict(model.layer1.ours, **model.layer2.ours)  # our parameter names → tensors
            run = lambda: model(x, src, dst)
        if a.check:  # eval mode, initial and scaled weights (as gat_cpu.lua did)
            model.eval()
            for tag, mul in (("init", 1.0), ("scaled", a.check_scale)):
                with torch.no_grad():
                    for name, t in params.items():
                        t.copy_((P[name] * mul if name.endswith("proj.weight") else P[name]).view(t.shape))
                logits = run()
                F.cross_entropy(logits.index_select(0, train_idx), ytr).backward()
                g = f["gat" if score == "pyg" else score][tag]
                ref = torch.from_numpy(g["logits"][()]).to(dev)
                dl = (logits.detach() - ref).abs().max().item()
                worst, wname = 0.0, "-"
                for name, og in g["grad"].items():
                    ours, theirs = torch.from_numpy(og[()]).to(dev), params[name].grad.reshape(og.shape)
                    rel = ((ours - theirs).abs().max() / theirs.abs().max().clamp_min(1e-30)).item()
                    if not rel <= worst:  # NaN counts as worst
                        worst, wname = rel, name
                print("check %s %s %.6g %.6g %.6g %s" % (score, tag, dl, ref.abs().max().item(), worst, wname),
                      flush=True)
                model.zero_grad(set_to_none=True)
            with torch.no_grad():
                for name, t in params.items():
                    t.copy_(P[name].view(t.shape))
        model.train()
        opt = torch.optim.Adam(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
        ts, ph = [], []
        for it in range(a.warmup + a.reps):
            sync()
            t0 = time.perf_counter()
            loss = F.cross_entropy(run().index_select(0, train_idx), ytr)
            sync()
            t1 = time.perf_counter()
            loss.backward()
            sync()
            t2 = time.perf_counter()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
            t3 = time.perf_counter()
            del loss
            if it >= a.warmup:
                ts.append(t3 - t0)
                ph.append((t1 - t0, t2 - t1, t3 - t2))
        print("time %s %s" % (score, " ".join("%.3f" % (t * 1e3) for t in ts)), flush=True)
        print("phase %s %s" % (score, " ".join("%.3f,%.3f,%.3f" % tuple(x * 1e3 for x in p) for p in ph)), flush=True)
    f.close()


if __name__ == "__main__":
    main()

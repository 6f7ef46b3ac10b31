"""nmt_cpu_torch.py — the PyTorch (CPU) peer of experiments/perf/nmt_cpu.lua.

The NMT Transformer of lua/penumbra/nn/transformer.lua written the way a researcher writes it
with PyTorch 2: post-norm encoder/decoder layers LN(x + dropout(sublayer(x))), nn.Linear q/k/v/out
projections with bias, F.scaled_dot_product_attention (a boolean key-padding mask (B, 1, 1, S);
is_causal for the decoder's self-attention), FFN Linear → ReLU → Linear, one embedding matrix for
source, target and the output projection (logits = y·Eᵀ), embeddings × √d plus sinusoidal
positions, dropout on the embeddings and on each sub-layer's output. Training step:
F.cross_entropy(label_smoothing=0.1, ignore_index=0, reduction='sum') / ntokens, backward,
clip_grad_norm_(1.0), torch.optim.Adam(betas=(0.9, 0.98), eps=1e-8, weight_decay=1e-4), zero_grad.
Beam search: batched over sentences, B·beam rows, an incremental key/value cache per decoder
layer (cross-attention keys/values computed once), fairseq's rules (2·beam candidates, an eos
among the first beam finishes a hypothesis, a sentence is done with beam finished hypotheses or
at 1.5·source length + 10 tokens where eos is forced; pad and bos never chosen; finished
sentences leave the batch).

Driven by nmt_cpu.lua: it reads the batches and our weights from --dir (.npy files), takes one
command per line on stdin and answers one line on the FIFO --reply:
  (start)        → "torch <version> …threads…" once the weights and batches are loaded
  check <loss>   → "check <loss> <max|Δ logits|> <max|logits|> <worst grad rel err> <param> <n params>
                   <largest |key bias grad| / largest |grad|>"
                   (eval mode, batch 1, against dir/ref_logits.npy and dir/g/<name>.npy)
  warm <n>       → "ok"                      n untimed training steps
  train <n>      → "time <ms> <ms> …"        n timed steps (batches 1, 2, … cycling)
  load <sub>     → "ok"                      weights ← dir/<sub>/<name>.npy
  decode <n>     → "decode <seconds>"        beam search over dir/d<i>_src.npy, i = 1..n; the
                                             hypotheses go to dir/peer_hyps.txt ("score\tids")
  quit           → "bye"
Any failure answers "error <message>" (the traceback goes to stderr).
"""
import argparse
import os
import sys

ap = argparse.ArgumentParser()
ap.add_argument('--dir', required=True)
ap.add_argument('--reply', required=True)
ap.add_argument('--threads', type=int, default=2)
ap.add_argument('--batches', type=int, required=True)
ap.add_argument('--vocab', type=int, default=8000)
ap.add_argument('--d-model', type=int, default=256)
ap.add_argument('--heads', type=int, default=4)
ap.add_argument('--ff', type=int, default=1024)
ap.add_argument('--enc-layers', type=int, default=3)
ap.add_argument('--dec-layers', type=int, default=3)
ap.add_argument('--qk-dim', type=int, default=0)
ap.add_argument('--dropout', type=float, default=0.2)
ap.add_argument('--lr', type=float, default=5e-4)
ap.add_argument('--max-positions', type=int, default=258)
ap.add_argument('--beam', type=int, default=5)
ap.add_argument('--flush-denormal', type=int, default=0)
a = ap.parse_args()
reply = open(a.reply, 'w', buffering=1)  # first: the driver waits for this end of the FIFO


def say(line):
    reply.write(line + '\n')
    reply.flush()


try:
    import math
    import time
    import traceback

    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except BaseException as e:  # noqa: BLE001 — reported to the driver, which stops
    say('error import: %r' % (e,))
    sys.exit(1)

PAD, BOS, EOS = 0, 2, 3
torch.set_num_threads(a.threads)
# the same floating-point mode as our side (nmt_cpu.lua flush_denormal=)
flush_ok = torch.set_flush_denormal(bool(a.flush_denormal))
torch.manual_seed(0)


def load(name):
    return torch.from_numpy(np.load(os.path.join(a.dir, name)))


def sinusoids(n, d):
    pe = np.zeros((n, d), dtype=np.float64)
    for i in range(d):
        e = 2 * (i // 2) / d
        ang = np.arange(n, dtype=np.float64) / 10000 ** e
        pe[:, i] = np.sin(ang) if i % 2 == 0 else np.cos(ang)
    return torch.from_numpy(pe.astype(np.float32))


class MultiheadAttention(nn.Module):
    def __init__(self, d, h, dk):
        super().__init__()
        self.h, self.dk, self.dv = h, dk, d // h
        self.q_proj = nn.Linear(d, h * dk)
        self.k_proj = nn.Linear(d, h * dk)
        self.v_proj = nn.Linear(d, d)
        self.out_proj = nn.Linear(d, d)

    def split(self, x, w):  # (B, N, h·w) → (B, h, N, w)
        return x.view(x.shape[0], x.shape[1], self.h, w).transpose(1, 2)

    def keys_values(self, x):
        return self.split(self.k_proj(x), self.dk), self.split(self.v_proj(x), self.dv)

    def attend(self, x, k, v, mask=None, causal=False):
        q = self.split(self.q_proj(x), self.dk)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        return self.out_proj(o.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1))


class FeedForward(nn.Module):
    def __init__(self, d, ff):
        super().__init__()
        self.fc1 = nn.Linear(d, ff)
        self.fc2 = nn.Linear(ff, d)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class EncoderLayer(nn.Module):
    def __init__(self, d, h, ff, dk, p):
        super().__init__()
        self.self_attn = MultiheadAttention(d, h, dk)
        self.norm1 = nn.LayerNorm(d)
        self.ffn = FeedForward(d, ff)
        self.norm2 = nn.LayerNorm(d)
        self.drop = nn.Dropout(p)

    def forward(self, x, mask):
        k, v = self.self_attn.keys_values(x)
        x = self.norm1(x + self.drop(self.self_attn.attend(x, k, v, mask)))
        return self.norm2(x + self.drop(self.ffn(x)))


class DecoderLayer(nn.Module):
    def __init__(self, d, h, ff, dk, p):
        super().__init__()
        self.self_attn = MultiheadAttention(d, h, dk)
        self.norm1 = nn.LayerNorm(d)
        self.cross_attn = MultiheadAttention(d, h, dk)
        self.norm2 = nn.LayerNorm(d)
        self.ffn = FeedForward(d, ff)
        self.norm3 = nn.LayerNorm(d)
        self.drop = nn.Dropout(p)

    def forward(self, y, mem_k, mem_v, mask, cache=None):
        k, v = self.self_attn.keys_values(y)
        causal = True
        if cache is not None:  # one new position against every earlier one: no mask needed
            if 'k' in cache:
                k, v = torch.cat([cache['k'], k], 2), torch.cat([cache['v'], v], 2)
            cache['k'], cache['v'] = k, v
            causal = False
        y = self.norm1(y + self.drop(self.self_attn.attend(y, k, v, causal=causal)))
        y = self.norm2(y + self.drop(self.cross_attn.attend(y, mem_k, mem_v, mask)))
        return self.norm3(y + self.drop(self.ffn(y)))


class Transformer(nn.Module):
    def __init__(self, vocab, d, h, ff, n_enc, n_dec, dk, p, max_positions):
        super().__init__()
        self.d = d
        self.embed = nn.Embedding(vocab, d, padding_idx=PAD)
        self.register_buffer('pe', sinusoids(max_positions, d), persistent=False)
        self.drop = nn.Dropout(p)
        self.enc, self.dec = [], []  # plain lists; the layers are registered as enc1, …, dec1, … (ours' names)
        for i in range(n_enc):
            self.enc.append(EncoderLayer(d, h, ff, dk, p))
            self.add_module('enc%d' % (i + 1), self.enc[-1])
        for i in range(n_dec):
            self.dec.append(DecoderLayer(d, h, ff, dk, p))
            self.add_module('dec%d' % (i + 1), self.dec[-1])

    def embed_tokens(self, tokens, first=0):
        n = tokens.shape[1]
        return self.drop(self.embed(tokens) * math.sqrt(self.d) + self.pe[first:first + n])

    def encode(self, src, mask):
        x = self.embed_tokens(src)
        for layer in self.enc:
            x = layer(x, mask)
        return x

    def forward(self, src, tgt_in, mask):
        mem = self.encode(src, mask)
        y = self.embed_tokens(tgt_in)
        for layer in self.dec:
            mk, mv = layer.cross_attn.keys_values(mem)
            y = layer(y, mk, mv, mask)
        return F.linear(y, self.embed.weight)  # tied output projection

    # ---- incremental decoding ----
    def begin_decode(self, mem, mask):
        return [{'mk': mk, 'mv': mv} for mk, mv in (l.cross_attn.keys_values(mem) for l in self.dec)], mask

    def decode_step(self, state, tokens, t):
        caches, mask = state
        y = self.embed_tokens(tokens[:, None], t)
        for layer, c in zip(self.dec, caches):
            y = layer(y, c['mk'], c['mv'], mask, cache=c)
        return F.linear(y[:, 0], self.embed.weight)

    @staticmethod
    def reorder(state, idx):
        caches, mask = state
        for c in caches:
            for key in c:
                c[key] = c[key].index_select(0, idx)
        return caches, mask.index_select(0, idx)


@torch.no_grad()
def beam_search(model, src, mask, K, lenpen=1.0, max_len_a=1.5, max_len_b=10):
    B = src.shape[0]
    V = model.embed.weight.shape[0]
    n_src = (src != PAD).sum(1).tolist()
    maxlen = torch.tensor([min(int(math.floor(max_len_a * n + max_len_b)), a.max_positions - 1) for n in n_src])
    rows = torch.arange(B).repeat_interleave(K)
    state = model.begin_decode(model.encode(src, mask)[rows], mask[rows])
    sent = torch.arange(B)                   # the sentence of each active group of K rows
    hist = torch.zeros(B * K, 0, dtype=torch.long)
    scores = torch.zeros(B, K)
    last = torch.full((B * K,), BOS, dtype=torch.long)
    finished = [[] for _ in range(B)]
    pos = torch.arange(2 * K)
    t = 0
    while sent.numel() > 0:
        nb = sent.numel()
        lp = F.log_softmax(model.decode_step(state, last, t), -1)
        lp[:, PAD] = -math.inf
        lp[:, BOS] = -math.inf
        forced = maxlen[sent] <= t
        lp = lp.view(nb, K, V)
        if forced.any():
            eos_lp = lp[forced][:, :, EOS].clone()
            lp[forced] = -math.inf
            lp[forced, :, EOS] = eos_lp
        cand = scores[:, :, None] + lp
        if t == 0:
            cand[:, 1:] = -math.inf          # every beam is the same hypothesis at the start
        top, ti = cand.view(nb, K * V).topk(2 * K, dim=1)
        beam_of, word = ti // V, ti % V
        is_eos = word == EOS
        # an eos among the first K candidates finishes a hypothesis
        sl = sent.tolist()
        for r, j in (is_eos[:, :K] & (top[:, :K] > -math.inf)).nonzero().tolist():
            fin = finished[sl[r]]
            if len(fin) < K:
                s = top[r, j].item()
                fin.append((hist[r * K + beam_of[r, j]].tolist(), s, s / (t + 1) ** lenpen))
        # the first K candidates that are not eos stay live
        _, sel = (is_eos.long() * 2 * K + pos).topk(K, dim=1, largest=False, sorted=True)
        new_scores, new_beam, new_word = top.gather(1, sel), beam_of.gather(1, sel), word.gather(1, sel)
        done = torch.tensor([len(finished[s]) >= K for s in sl]) | forced
        keep = (~done).nonzero()[:, 0]
        if keep.numel() == 0:
            break
        parents = (keep[:, None] * K + new_beam[keep]).reshape(-1)
        hist = torch.cat([hist[parents], new_word[keep].reshape(-1, 1)], 1)
        state = model.reorder(state, parents)
        scores, sent, last = new_scores[keep], sent[keep], new_word[keep].reshape(-1)
        t += 1
    out = []
    for fin in finished:
        best = None
        for h in fin:
            if best is None or h[2] > best[2]:
                best = h
        out.append(best if best is not None else ([], -math.inf, -math.inf))
    return out


def main():
    model = Transformer(a.vocab, a.d_model, a.heads, a.ff, a.enc_layers, a.dec_layers,
                        a.qk_dim or a.d_model // a.heads, a.dropout, a.max_positions)

    def load_weights(sub):
        model.load_state_dict({name: load(os.path.join(sub, name + '.npy')) for name in model.state_dict()})

    load_weights('w')
    batches = []
    for i in range(1, a.batches + 1):
        b = {k: load('b%d_%s.npy' % (i, k)) for k in ('src', 'tgt_in', 'tgt_out', 'mask')}
        b['mask'] = b['mask'].bool()
        b['ntokens'] = int((b['tgt_out'] != PAD).sum())
        batches.append(b)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr, betas=(0.9, 0.98), eps=1e-8, weight_decay=1e-4)
    params = list(model.named_parameters())

    say('torch %s, threads %d (interop %d), OMP_WAIT_POLICY=%s, OPENBLAS_CORETYPE=%s, mkldnn %s, flush_denormal %s' % (
        torch.__version__, torch.get_num_threads(), torch.get_num_interop_threads(),
        os.environ.get('OMP_WAIT_POLICY', '(unset)'), os.environ.get('OPENBLAS_CORETYPE', '(unset)'),
        torch.backends.mkldnn.is_available(), bool(a.flush_denormal) and flush_ok))

    def loss_of(b):
        logits = model(b['src'], b['tgt_in'], b['mask'])
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), b['tgt_out'].view(-1), ignore_index=PAD,
                               label_smoothing=0.1, reduction='sum') / b['ntokens']
        return loss, logits

    def step(b):
        loss, _ = loss_of(b)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()

    nstep = 0
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == 'check':
            model.eval()
            loss, logits = loss_of(batches[0])
            loss.backward()
            ref = load('ref_logits.npy')
            refs = {n: load(os.path.join('g', n + '.npy')) for n, _ in params}
            # relative to the tensor's own largest gradient, floored at 1e-3 of the largest of all;
            # the key projections' biases are apart: their gradient is zero in exact arithmetic
            # (softmax ignores a shift shared by all keys), so both sides hold rounding noise there,
            # reported as the largest |g| of either side over the largest gradient of all
            top = max(g.abs().max().item() for g in refs.values())
            floor = 1e-3 * top
            worst, wname, kb = 0.0, '', 0.0
            for n, p in params:
                if n.endswith('k_proj.bias'):
                    kb = max(kb, p.grad.abs().max().item() / top, refs[n].abs().max().item() / top)
                    continue
                err = ((p.grad - refs[n]).abs().max() / max(refs[n].abs().max().item(), floor)).item()
                if err > worst or not wname:
                    worst, wname = err, n
            say('check %.9g %.4g %.4g %.4g %s %d %.3g' % (loss.item(), (logits.detach() - ref).abs().max().item(),
                                                           ref.abs().max().item(), worst, wname, len(params), kb))
            opt.zero_grad()
            model.train()
            del logits, ref
        elif cmd[0] in ('warm', 'train'):
            model.train()
            times = []
            for _ in range(int(cmd[1])):
                b = batches[nstep % len(batches)]
                nstep += 1
                t0 = time.perf_counter()
                step(b)
                times.append((time.perf_counter() - t0) * 1e3)
            say('ok' if cmd[0] == 'warm' else 'time ' + ' '.join('%.3f' % x for x in times))
        elif cmd[0] == 'load':
            load_weights(cmd[1])
            say('ok')
        elif cmd[0] == 'decode':
            model.eval()
            data = [(load('d%d_src.npy' % i), load('d%d_mask.npy' % i).bool()) for i in range(1, int(cmd[1]) + 1)]
            t0 = time.perf_counter()
            hyps = []
            for src, mask in data:
                hyps += beam_search(model, src, mask, a.beam)
            secs = time.perf_counter() - t0
            model.train()
            with open(os.path.join(a.dir, 'peer_hyps.txt'), 'w') as f:
                for ids, s, _ in hyps:
                    f.write('%.9g\t%s\n' % (s, ' '.join(map(str, ids))))
            say('decode %.6f' % secs)
        elif cmd[0] == 'quit':
            say('bye')
            return
        else:
            say('error unknown command %r' % line)


try:
    main()
except BaseException as e:  # noqa: BLE001
    traceback.print_exc()
    say('error %s: %s' % (type(e).__name__, str(e).replace('\n', ' ')[:500]))
    sys.exit(1)

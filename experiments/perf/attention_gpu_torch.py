#!/usr/bin/python3
"""attention_gpu_torch.py — the PyTorch peer of experiments/perf/attention_gpu.lua (issue 17).

Two implementations, on the same device and shapes as ours:
  sdpa      torch.nn.functional.scaled_dot_product_attention restricted to the FlashAttention
            backend (torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION)), bf16 (flash
            takes 16-bit inputs only), dot score, causal or not
  compiled  the straightforward PyTorch cone attention the Coneheads authors describe (§7.5:
            PyTorch 2 with torch.compile): the full (B, H, N, N) pairwise score tensor
            (attention_cpu_torch.scores: torch.cdist over the first D−1 coordinates, the cone
            formulas as whole-tensor ops), a −inf mask when causal, softmax, @ v — the whole
            function under torch.compile (default mode; --compile dynamic: one graph for every N,
            static: graphs dropped and recompiled for each shape, as a fixed-length training run
            compiles them); bf16 like SDPA (f32 with --dtype f32, or where bf16 fails to run:
            the reply's note says so)
Inputs: attention_cpu_torch.inputs (q, k = randn·0.3, v = randn; the cones and hyperbolic
through their score's map), cast to the dtype on the device. fwd+bwd is out.backward(ones).
Timing as ours (penumbra exposes no CUDA events): torch.cuda.synchronize() before and after
each call, wall clock (time.perf_counter). Peak memory: torch.cuda.max_memory_allocated() over
what was allocated before the call, after reset_peak_memory_stats().

Without CUDA (--device cpu: the kernel interpreter's dry run) everything runs on the CPU: the
flash backend if this CPU build has it, else the math backend, torch.compile with the backend
the driver asks for (aot_eager there: inductor's C++ builds take minutes on 2 cores), and every
reply says "dry run, not a measurement". torch.cdist's direct kernel has no bf16 (it serves
small N; larger N go through a matmul, which has): the dry run's N = 16 cones run in f32.

Driven by attention_gpu.lua: one process for the whole run; one command a line on stdin, one
reply line a command on the FIFO --reply:
  (start)                                   → "torch <version> device=<name> cuda=<version> …"
  case <B> <H> <N> <D>                      → "ok"   (new inputs; --compile static: graphs reset)
  time <impl> <score> <causal 0|1> <fwd|fwd+bwd> <warmup> <reps> <peak 0|1>
                                            → "time backend=<…> dtype=<…> peak=<bytes|-1> ms=<ms,ms,…> note=<text>"
                                              (peak −1: no CUDA; note: a fallback, the dry run, or empty)
                                              or "skip <why>" (out of memory, flash unavailable)
  quit                                      → "bye"
Any other failure answers "error <message>" (the traceback goes to stderr).

    python experiments/perf/attention_gpu_torch.py --reply /tmp/fifo --device cuda < commands
"""
import argparse
import os
import sys
import time
import traceback

ap = argparse.ArgumentParser()
ap.add_argument("--reply", required=True)
ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"], help="the compiled cones' dtype")
ap.add_argument("--threads", type=int, default=0, help="CPU threads (the dry run); 0 keeps torch's default")
ap.add_argument("--compile", default="dynamic", choices=["dynamic", "static"],
                help="dynamic: one compile for every N; static: recompiled per case (static-shape kernels)")
ap.add_argument("--compile-backend", default="inductor",
                help="torch.compile's backend: inductor (what a researcher gets); the dry run passes aot_eager, "
                     "which traces the same graphs (dynamo, AOTAutograd) without inductor's minutes of C++ builds")
a = ap.parse_args()
reply = open(a.reply, "w", buffering=1)  # first: the driver waits for this end of the FIFO


def say(line):
    reply.write(line + "\n")
    reply.flush()


try:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from attention_cpu_torch import inputs, scores  # noqa: E402  the CPU peer's recipes and formulas
except Exception as e:  # noqa: BLE001  the driver shows the reason and runs without the peer
    traceback.print_exc()
    say("error cannot start the peer: %s" % str(e).replace("\n", " "))
    sys.exit(1)

CUDA = a.device == "cuda"
DEV = torch.device(a.device)
DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}
DRY = "" if CUDA else "(dry run, not a measurement)"
if a.threads > 0:
    torch.set_num_threads(a.threads)
# One compiled function serves every (score, causal, grad mode) of a case: each is a guard of its
# own, so allow more than dynamo's default of 8 entries per code object (renamed across versions).
for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
    if hasattr(torch._dynamo.config, name):
        setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))


def sync():
    if CUDA:
        torch.cuda.synchronize()


def cone_attention(score, q, k, v, causal):
    """What a researcher writes: pairwise scores, mask, softmax, @ v."""
    s = scores(score, q, k)
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


compiled_attention = torch.compile(cone_attention, backend=a.compile_backend, dynamic=a.compile == "dynamic")

# SDPA's backend: flash, or on a CPU build without it the math backend (dry run only)
sdpa_backend = [SDPBackend.FLASH_ATTENTION, "FLASH_ATTENTION"]


def sdpa(q, k, v, causal):
    with sdpa_kernel(sdpa_backend[0]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


state = {"shape": None, "data": {}, "dtype": {}}


def data(score, dtype):
    """q, k, v (leaves requiring grad) and the backward seed for `score` in `dtype` on the device."""
    key = (score, dtype)
    if key not in state["data"]:
        B, H, N, D = state["shape"]
        q, k, v = inputs(score, B, H, N, D)
        q, k, v = (x.to(DEV, dtype).requires_grad_() for x in (q, k, v))
        state["data"][key] = (q, k, v, torch.ones(B, H, N, D, device=DEV, dtype=dtype))
    return state["data"][key]


def measure(fn, score, dtype, causal, pas, warmup, reps, want_peak):
    """warmup untimed calls, one for the peak memory (CUDA, want_peak), then reps timed ones."""
    q, k, v, g = data(score, dtype)

    def call():
        if pas == "fwd":
            with torch.no_grad():
                fn(q, k, v, causal)
        else:
            fn(q, k, v, causal).backward(g)
            q.grad = k.grad = v.grad = None

    for _ in range(warmup):
        call()
    peak = -1
    if want_peak and CUDA:
        sync()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        call()
        sync()
        peak = torch.cuda.max_memory_allocated() - base
    ts = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        call()
        sync()
        ts.append((time.perf_counter() - t0) * 1e3)
    return peak, ts


def first_line(e):
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def run_case(impl, score, causal, pas, warmup, reps, want_peak):
    if impl == "sdpa":
        if score != "dot":
            return "skip sdpa times the dot score only"
        dtype, fn = torch.bfloat16, sdpa
    elif impl == "compiled":
        dtype = state["dtype"].get(score, DTYPES[a.dtype])
        fn = lambda q, k, v, c: compiled_attention(score, q, k, v, c)  # noqa: E731
    else:
        return "error unknown impl %s" % impl
    try:
        peak, ts = measure(fn, score, dtype, causal, pas, warmup, reps, want_peak)
    except torch.cuda.OutOfMemoryError:
        state["data"].pop((score, dtype), None)
        if CUDA:
            torch.cuda.empty_cache()
        return "skip out of memory (%s %s N=%d: the (B, H, N, N) score tensors)" % (impl, score, state["shape"][2])
    except Exception as e:  # noqa: BLE001  flash refused, or a dtype without a kernel
        if impl == "sdpa" and sdpa_backend[0] == SDPBackend.FLASH_ATTENTION and not CUDA:
            sdpa_backend[:] = [SDPBackend.MATH, "MATH (flash unavailable on this CPU: %s)" % first_line(e)]
            return run_case(impl, score, causal, pas, warmup, reps, want_peak)
        if impl == "sdpa":
            return "skip SDPA's flash backend refused these inputs: %s" % first_line(e)
        if dtype == torch.float32:
            return "skip compiled %s failed: %s%s" % (score, first_line(e),
                                                      " (compile=static may help)" if a.compile == "dynamic" else "")
        # torch.cdist's direct kernel has no bf16 (N <= 25 on the CPU): this case's cones run in f32
        state["dtype"][score] = torch.float32
        state["data"].pop((score, dtype), None)
        state["note_" + score] = "f32 because bf16 failed: %s" % first_line(e)
        return run_case(impl, score, causal, pas, max(1, warmup), reps, want_peak)
    backend = sdpa_backend[1] if impl == "sdpa" else "torch.compile(%s)" % a.compile_backend
    note = state.get("note_" + score, "") if impl == "compiled" else ""
    return "time backend=%s dtype=%s peak=%d ms=%s note=%s" % (
        backend.split(" ")[0], str(dtype).replace("torch.", ""), peak, ",".join("%.4f" % t for t in ts),
        " ".join(x for x in (backend.partition(" ")[2], note, DRY) if x))


def main():
    name = torch.cuda.get_device_name(0) if CUDA else "CPU"
    say("torch %s device=%s cuda=%s threads=%d %s" % (torch.__version__, name.replace(" ", "_"), torch.version.cuda,
        torch.get_num_threads(), DRY))
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        try:
            if cmd[0] == "case":
                shape = tuple(int(x) for x in cmd[1:5])
                if shape != state["shape"]:
                    state.clear()
                    state.update(shape=shape, data={}, dtype={})
                    if a.compile == "static":
                        torch._dynamo.reset()  # this case's graphs only
                    if CUDA:
                        torch.cuda.empty_cache()
                say("ok")
            elif cmd[0] == "time":
                impl, score, causal, pas, warmup, reps, want_peak = cmd[1:8]
                say(run_case(impl, score, causal == "1", pas, int(warmup), int(reps), want_peak == "1"))
            elif cmd[0] == "quit":
                say("bye")
                return
            else:
                say("error unknown command %s" % cmd[0])
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            say("error %s: %s" % (type(e).__name__, str(e).replace("\n", " ")[:500]))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""graph_gen_networkit.py — the NetworKit peer for experiments/perf/graph_gen.lua.

NetworKit's HyperbolicGenerator (von Looz et al.), threshold model (T = 0), the same n,
average degree and power-law exponent as ours. Times generate() only (the process start and
the import are outside the figure) after one untimed warm-up at a small n, and prints
`networkit <version> threads <t>` and then `time <ms> edges <E undirected>`.

    build/venv-peers/bin/python experiments/perf/graph_gen_networkit.py --n 1000000 --degree 10 \
        --exponent 3 --threads 2
NetworKit comes from PyPI (`networkit`) in a venv under build/, never a project dependency.
"""
import argparse
import time

import networkit as nk

ap = argparse.ArgumentParser()
ap.add_argument('--n', type=int, required=True)
ap.add_argument('--degree', type=float, required=True)
ap.add_argument('--exponent', type=float, default=3.0)
ap.add_argument('--threads', type=int, default=2)
a = ap.parse_args()

nk.setNumberOfThreads(a.threads)
nk.engineering.setSeed(1, True)
print('networkit', nk.__version__, 'threads', nk.getMaxNumberOfThreads(), flush=True)
nk.generators.HyperbolicGenerator(1000, k=a.degree, gamma=a.exponent, T=0).generate()  # warm-up
gen = nk.generators.HyperbolicGenerator(a.n, k=a.degree, gamma=a.exponent, T=0)
t0 = time.perf_counter()
g = gen.generate()
ms = (time.perf_counter() - t0) * 1e3
print('time %.3f edges %d' % (ms, g.numberOfEdges()), flush=True)

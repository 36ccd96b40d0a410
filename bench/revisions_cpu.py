"""Two revisions of nnforge timed against each other in one interleaved run: the cells of ``bench/cells_cpu.py``
(an LSTM layer at its three shapes, a layer-norm LSTM and a Cho GRU at the first), inference and a training step
(forward + backward to the weights), float32, plus the compile time of a 5-layer LSTM stack at T = 2000; with
``--basecaller`` also the inference of ``bench/basecaller_cpu.py``'s encoder at full length and its training step
(forward, CTC, backward, Adam; N = 16, 2,500 samples); with ``--transformer`` also a transformer encoder layer
(d = 256, 4 heads, feed-forward 1024, eval mode) on a [T, 16, 256] sequence (T = 5000 / ``--t-div``), its
inference and the gradient of a loss on its output with respect to its input, and the inference of the layer with
a GELU feed-forward; with ``--torch`` also training steps
through torch autograd (the LSTM, layer-norm LSTM and GRU cells at the first shape, and the transformer layer with
``--transformer``, each compiled function called with torch tensors that require grad, then ``backward``).

Each revision is checked out in a git worktree and served by a worker process of its own that imports nnforge from
there (its own empty shared-object cache). Every round times each cell once in each worker, the order A, B / B, A
alternating by round, so the machine's drift cancels in the per-round ratio B / A (each turn's figure is the median
of its calls). Printed per cell: the median ratio over rounds and the middle half of the rounds. Compile time:
trace + passes + schedule + C generation, and the C compiler's run, both revisions in fresh caches.

    .venv/bin/python bench/revisions_cpu.py REV_A REV_B [--rounds 7] [--calls 5] [--t-div 10] [--only TEXT]
        [--basecaller] [--transformer] [--torch]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = r"""
import json, os, sys, time
sys.path.insert(0, "bench")
import numpy as np
import nnforge as nf
from cells_cpu import SHAPES, nf_gru_cho, nf_ln_lstm
from lstm_cpu import lstm
from nnforge.codegen import BACKENDS
try:
    from nnforge.codegen.c import lower, prepare
except ImportError:  # revisions before the scheduler named the pass pipeline ``schedule``
    from nnforge.codegen.c import lower, schedule as prepare

T_DIV = int(sys.argv[1])
BASECALLER = sys.argv[2] == "1"
TRANSFORMER = sys.argv[3] == "1"
TORCH = sys.argv[4] == "1"
rng = np.random.default_rng(0)

def a(*s):
    return (rng.standard_normal(s) * 0.3).astype(np.float32)

def training(fn, argnums):
    def loss(*x):
        return (fn(*x)[0] ** 2).sum()
    return nf.grad(loss, argnums=argnums)

def through_torch(fn, argnums):  # a training step of the compiled fn inside torch autograd
    import torch
    def step(*arrays):
        ts = [torch.from_numpy(x).requires_grad_(i in argnums) for i, x in enumerate(arrays)]
        (fn(*ts)[0] ** 2).sum().backward()
    return step

cells = {}
for k, (T, N, I, H) in enumerate(SHAPES):
    T = max(T // T_DIV, 2)
    la = [a(T, N, I), a(N, H), a(N, H), a(4 * H, I), a(4 * H, H), a(4 * H)]
    shape = f"{T},{N},{I},{H}"
    cells[f"lstm {shape} inference"] = (nf.compile(lstm, backend="cpu"), la)
    cells[f"lstm {shape} training"] = (nf.compile(training(lstm, (3, 4, 5)), backend="cpu"), la)
    if k == 0:
        cells[f"ln-lstm {shape} inference"] = (nf.compile(nf_ln_lstm, backend="cpu"), la)
        cells[f"ln-lstm {shape} training"] = (nf.compile(training(nf_ln_lstm, (3, 4, 5)), backend="cpu"), la)
        ga = [a(T, N, I), a(N, H), a(3 * H, I), a(2 * H, H), a(H, H), a(3 * H)]
        cells[f"gru {shape} inference"] = (nf.compile(nf_gru_cho, backend="cpu"), ga)
        cells[f"gru {shape} training"] = (nf.compile(training(nf_gru_cho, (2, 3, 4, 5)), backend="cpu"), ga)
        if TORCH:
            for name, f, fa, argnums in (("lstm", lstm, la, (0, 3, 4, 5)),
                                         ("ln-lstm", nf_ln_lstm, la, (0, 3, 4, 5)),
                                         ("gru", nf_gru_cho, ga, (0, 2, 3, 4, 5))):
                cells[f"{name} {shape} torch autograd"] = (through_torch(nf.compile(f, backend="cpu"), argnums), fa)

if BASECALLER:  # the Bonito-fast-like encoder of bench/basecaller_cpu.py, a full chunk: T = 2,000 LSTM steps
    from basecaller_cpu import Encoder
    model = Encoder(96)
    for n in (16, 64):
        cells[f"basecaller F=96 N={n} inference"] = (nf.compile(lambda x: model(x), backend="cpu"),
                                                     [a(n, 1, 10_000)])
    from nnforge.demo import compiled_step
    from nnforge.nn import optim
    trained = Encoder(96)
    step = compiled_step(trained, optim.Adam(trained.parameters(), lr=1e-4), "cpu")
    cells["basecaller F=96 N=16 training step"] = (step, [a(16, 1, 2_500), rng.integers(1, 5, (16, 50)),
                                                          np.full(16, 500), np.full(16, 50)])

if TRANSFORMER:
    from nnforge.nn import TransformerEncoderLayer
    nf.manual_seed(0)
    layer = TransformerEncoderLayer(256, 4, 1024)
    layer.eval()
    tx = [a(max(5000 // T_DIV, 2), 16, 256)]
    cells["transformer layer d=256 inference"] = (nf.compile(lambda x: layer(x), backend="cpu"), tx)
    cells["transformer layer d=256 input gradient"] = (
        nf.compile(nf.grad(lambda x: (layer(x) ** 2).sum()), backend="cpu"), tx)
    gelu = TransformerEncoderLayer(256, 4, 1024, activation="gelu")
    gelu.eval()
    cells["transformer layer d=256 GELU inference"] = (nf.compile(lambda x: gelu(x), backend="cpu"), tx)
    if TORCH:
        cells["transformer layer d=256 torch autograd"] = (
            through_torch(nf.compile(lambda x: (layer(x),), backend="cpu"), (0,)), tx)

def stack_compile():
    T, N, H, L = 2000, 8, 64, 5
    def stack(x, *ws):
        for k in range(L):
            w_ih, w_hh, b = ws[3 * k: 3 * k + 3]
            h0 = nf.zeros((x.shape[1], H))
            def cell(carry, x_t, w_ih=w_ih, w_hh=w_hh, b=b):
                h, c = carry
                i, f, g, o = (x_t @ w_ih.T + h @ w_hh.T + b).chunk(4, axis=-1)
                c = nf.sigmoid(f) * c + nf.sigmoid(i) * nf.tanh(g)
                return (nf.sigmoid(o) * nf.tanh(c), c), nf.sigmoid(o) * nf.tanh(c)
            _, x = nf.scan(cell, (h0, h0), x)
        return x
    ws = [w for _ in range(L) for w in (a(4 * H, H) * 0.3, a(4 * H, H) * 0.3, a(4 * H))]
    x = a(T, N, H)
    fn = nf.compile(stack, backend="cpu")
    t0 = time.perf_counter(); g = fn.trace(x, *ws); trace_s = time.perf_counter() - t0
    t0 = time.perf_counter(); lower(prepare(g)); gen_s = time.perf_counter() - t0
    fn(x, *ws)  # builds the shared object (cold cache)
    cc_s = BACKENDS["cpu"].toolchain.last_compile_s
    return {"compile_s": trace_s + gen_s + cc_s, "python_s": trace_s + gen_s, "cc_s": cc_s}

print(json.dumps({"cells": list(cells), **stack_compile()}), flush=True)
for name, (fn, args) in cells.items():
    fn(*args)  # compile and warm up before any timing
print("ready", flush=True)
for line in sys.stdin:
    name, calls = line.rstrip("\n").rsplit(" ", 1)
    fn, args = cells[name]
    times = []
    for _ in range(int(calls)):
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    print(sorted(times)[len(times) // 2], flush=True)  # the median call: a call another process slowed is dropped
"""


def worktree(repo: Path, rev: str, where: Path) -> Path:
    path = where / rev.replace("/", "_")
    subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", "-f", str(path), rev], check=True,
                   capture_output=True)
    return path


def start(path: Path, t_div: int, cache: Path, basecaller: bool, transformer: bool, torch: bool
          ) -> tuple[subprocess.Popen, dict]:
    env = {**os.environ, "PYTHONPATH": str(path), "NNFORGE_CACHE_DIR": str(cache)}
    p = subprocess.Popen([sys.executable, "-c", WORKER, str(t_div), str(int(basecaller)), str(int(transformer)),
                          str(int(torch))],
                         cwd=path, env=env, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    head = json.loads(p.stdout.readline())
    return p, head


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rev_a")
    ap.add_argument("rev_b")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--t-div", type=int, default=10)
    ap.add_argument("--only", default="", help="time only the cells whose name contains this")
    ap.add_argument("--basecaller", action="store_true",
                    help="also the basecaller encoder's inference at batch 16 and 64 (10,000 samples, full length) "
                         "and its training step")
    ap.add_argument("--transformer", action="store_true", help="also a transformer encoder layer's inference and "
                    "input gradient")
    ap.add_argument("--torch", action="store_true", help="also training steps through torch autograd: the compiled "
                    "cells (and the transformer layer) called with torch tensors that require grad, then backward")
    args = ap.parse_args()
    repo = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        paths = [worktree(repo, rev, tmp_path) for rev in (args.rev_a, args.rev_b)]
        try:
            workers, heads = [], []
            for k, path in enumerate(paths):  # one after the other: each compiles alone
                w, head = start(path, args.t_div, tmp_path / f"cache{k}", args.basecaller, args.transformer, args.torch)
                assert w.stdout.readline().strip() == "ready"
                workers.append(w)
                heads.append(head)
            for rev, head in zip((args.rev_a, args.rev_b), heads):
                print(f"{rev}: 5-layer stack T=2000 compile {head['compile_s']:.2f} s = trace, passes, schedule and C "
                      f"generation {head['python_s']:.3f} s + C compiler {head['cc_s']:.2f} s")
            cells = [c for c in heads[0]["cells"] if args.only in c]
            ratios: dict[str, list[float]] = {c: [] for c in cells}
            for r in range(args.rounds):
                for c in cells:
                    t = [0.0, 0.0]
                    for k in ((0, 1) if r % 2 == 0 else (1, 0)):
                        workers[k].stdin.write(f"{c} {args.calls}\n")
                        workers[k].stdin.flush()
                        t[k] = float(workers[k].stdout.readline())
                    ratios[c].append(t[1] / t[0])
            print(f"\n{'cell':40s} {'B / A median':>12s}  middle half of {args.rounds} rounds")
            for c in cells:
                q = statistics.quantiles(ratios[c], n=4)
                print(f"{c:40s} {statistics.median(ratios[c]):12.3f}  {q[0]:.3f} .. {q[2]:.3f}")
            for w in workers:
                w.stdin.close()
                w.wait(timeout=60)
        finally:
            for path in paths:
                subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(path)],
                               capture_output=True)


if __name__ == "__main__":
    main()

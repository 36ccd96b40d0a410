"""Compile time of a 5-layer LSTM stack, cold cache, T = 100 vs T = 10,000 (issue 3: <= 2 s either way); also
a stack whose five layers all have different widths (nothing for the generated C to share); and a Bonito-fast-like
basecaller (three convs, the last with stride 5, five LSTM layers of alternating direction, a linear head) at
widths 96 and 384, inference and a training step (CTC, Adam): goals <= 2 s and <= 10 s.

Each T runs in a fresh process with an empty ``NNFORGE_CACHE_DIR``, so nothing is reused between them. Printed
per T: compile = trace + passes and C generation (Python side) + the C compiler run; the first and a steady call
(the first call also touches the workspace pages for the first time); and the C compiler's own start-up (an empty
file through the same flags), measured separately.
Usage: ``python bench/compile_time.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, sys, time
import numpy as np
import nnforge as nf
from nnforge.codegen import BACKENDS
from nnforge.codegen.c import lower, prepare

T, N, H, L = int(sys.argv[1]), 8, 64, 5
DISTINCT = sys.argv[2] == "distinct"  # layer k has width 64 + 8k: no two scans share a C function
WIDTH = [H + 8 * k if DISTINCT else H for k in range(L)]

def stack(x, *ws):
    for k in range(L):
        w_ih, w_hh, b = ws[3 * k: 3 * k + 3]
        h0 = nf.zeros((x.shape[1], WIDTH[k]))
        def cell(carry, x_t, w_ih=w_ih, w_hh=w_hh, b=b):
            h, c = carry
            i, f, g, o = (x_t @ w_ih.T + h @ w_hh.T + b).chunk(4, axis=-1)
            c = nf.sigmoid(f) * c + nf.sigmoid(i) * nf.tanh(g)
            h = nf.sigmoid(o) * nf.tanh(c)
            return (h, c), h
        _, x = nf.scan(cell, (h0, h0), x)
    return x

rng = np.random.default_rng(0)
ws = []
for k in range(L):
    Hk, Ik = WIDTH[k], (H if k == 0 else WIDTH[k - 1])
    ws += [rng.standard_normal((4 * Hk, Ik)).astype(np.float32) * 0.1,
           rng.standard_normal((4 * Hk, Hk)).astype(np.float32) * 0.1, np.zeros(4 * Hk, np.float32)]
x = rng.standard_normal((T, N, H)).astype(np.float32)
fn = nf.compile(stack, backend="cpu")
t0 = time.perf_counter(); g = fn.trace(x, *ws); t_trace = time.perf_counter() - t0
t0 = time.perf_counter(); low = lower(prepare(g)); t_gen = time.perf_counter() - t0
t0 = time.perf_counter(); fn(x, *ws); first = time.perf_counter() - t0
t0 = time.perf_counter(); fn(x, *ws); steady = time.perf_counter() - t0
tc = BACKENDS["cpu"].toolchain
print(json.dumps({"T": T, "distinct": DISTINCT, "trace_s": t_trace, "passes_codegen_s": t_gen,
                  "cc_s": tc.last_compile_s,
                  "compiles": tc.compiles, "first_call_s": first, "steady_call_s": steady,
                  "compile_s": t_trace + t_gen + tc.last_compile_s, "c_lines": low.text.count("\n")}))
"""


BASECALLER = r"""
import json, resource, sys, time
import numpy as np
import nnforge as nf
import nnforge.nn as nn
from nnforge.codegen import BACKENDS
from nnforge.nn import optim

H, TRAIN = int(sys.argv[1]), sys.argv[2] == "train"

class Basecaller(nn.Module):
    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList([nn.Conv1d(1, 4, 5, padding=2), nn.Conv1d(4, 16, 5, padding=2),
                                    nn.Conv1d(16, H, 19, stride=5, padding=9)])
        self.rnn = nn.LSTM(H, H, num_layers=5, reverse=[True, False, True, False, True])
        self.head = nn.Linear(H, 5)

    def forward(self, x):
        for conv in self.convs:
            x = nf.silu(conv(x))
        return self.head(self.rnn(x.permute(2, 0, 1))[0]).log_softmax(-1)

model = Basecaller()
opt = optim.Adam(model.parameters(), lr=1e-3)
rng = np.random.default_rng(0)
N, T, S = 4, 500, 20
x = rng.standard_normal((N, 1, T)).astype(np.float32)
tg, il, tl = rng.integers(1, 5, (N, S)), np.full(N, T // 5), np.full(N, S)

def step(x, tg, il, tl):
    if not TRAIN:
        return model(x)
    opt.zero_grad()
    loss = nn.functional.ctc_loss(model(x), tg, il, tl)
    loss.backward()
    opt.step()
    return loss

fn = nf.compile(step, backend="cpu")
cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
t0 = time.perf_counter(); fn(x, tg, il, tl); first = time.perf_counter() - t0
cc_cpu = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - cpu0
t0 = time.perf_counter(); fn(x, tg, il, tl); steady = time.perf_counter() - t0
tc = BACKENDS["cpu"].toolchain
print(json.dumps({"H": H, "train": TRAIN, "first_call_s": first, "cc_s": tc.last_compile_s, "cc_cpu_s": cc_cpu,
                  "nodes": len(fn.trace(x, tg, il, tl).order), "steady_call_s": steady}))
"""


def cc_startup() -> float:
    """Seconds for the C compiler to build an empty shared object with nnforge's flags (best of 3)."""
    from nnforge.codegen.c.toolchain import FLAGS, find_compiler

    cc = find_compiler()
    best = float("inf")
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "empty.c")
        with open(src, "w") as f:
            f.write("int nf_empty(void) { return 0; }\n")
        for _ in range(3):
            t0 = time.perf_counter()
            subprocess.run([cc, *FLAGS, src, "-o", os.path.join(d, "e.so")], check=True)
            best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    print(f"load average {os.getloadavg()}")
    start = cc_startup()
    print(f"cc start-up (empty file, same flags): {start:.2f} s")
    for T, kind in ((100, "equal"), (10_000, "equal"), (100, "distinct")):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "NNFORGE_CACHE_DIR": cache}
            out = subprocess.run([sys.executable, "-c", CHILD, str(T), kind], env=env, stdout=subprocess.PIPE,
                                 text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{kind} widths, T={T:>6}: compile {r['compile_s']:.2f} s = trace {r['trace_s']:.2f} + passes/codegen "
              f"{r['passes_codegen_s']:.2f} + cc {r['cc_s']:.2f} s ({r['compiles']} build, {r['c_lines']} C lines); "
              f"without cc start-up {r['compile_s'] - start:.2f} s; first call {r['first_call_s']:.2f} s, "
              f"steady call {r['steady_call_s']:.2f} s")
    for H, mode in ((96, "infer"), (96, "train"), (384, "infer"), (384, "train")):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "NNFORGE_CACHE_DIR": cache}
            out = subprocess.run([sys.executable, "-c", BASECALLER, str(H), mode], env=env, stdout=subprocess.PIPE,
                                 text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        goal = 10.0 if mode == "train" else 2.0
        print(f"basecaller F={H} {mode}: compile (first call) {r['first_call_s']:.2f} s (goal <= {goal:.0f} s) = "
              f"cc {r['cc_s']:.2f} s wall, {r['cc_cpu_s']:.2f} s of compiler CPU time, + the rest; {r['nodes']} IR "
              f"nodes; steady call {r['steady_call_s']:.3f} s; load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

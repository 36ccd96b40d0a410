"""A transformer's feed-forward block on a [T, N, d] sequence, compiled for the CPU with and without
``passes.reshapes.elementwise_before_views``, timed against each other in one interleaved run.

``linear2(relu(linear1(x)))``: each linear layer traces as ``reshape(x2 @ w.T) + b``. Without the pass the bias
and relu run on the reshaped view, a kernel of their own that writes the [T * N, d_ff] product again and reads
it back; with it they are the GEMM's epilogue. Every round calls each form ``--calls`` times, the order
alternating by round; printed: each round's times and the median (and quartiles) of the per-round ratio
without / with (> 1: the pass is faster). Record results in docs/benchmarks.md with the machine and date.

Usage: ``python bench/reshapes_cpu.py [--steps 500] [--batch 16] [--width 256] [--hidden 1024] [--rounds 15]
[--calls 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import nnforge as nf
import nnforge.codegen.c as c_backend
from nnforge.nn import Linear


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=3)
    a = ap.parse_args()
    nf.manual_seed(0)
    up, down = Linear(a.width, a.hidden), Linear(a.hidden, a.width)

    def block(x):
        return down(nf.relu(up(x)))

    x = np.random.default_rng(0).standard_normal((a.steps, a.batch, a.width)).astype(np.float32)
    forms = {"with": nf.compile(block, backend="cpu")}
    forms["with"](x)  # built with the pass
    every = c_backend.pipeline
    c_backend.pipeline = lambda target: tuple(p for p in every(target) if p[0] != "elementwise_before_views")
    try:
        forms["without"] = nf.compile(block, backend="cpu")
        forms["without"](x)
    finally:
        c_backend.pipeline = every
    np.testing.assert_allclose(forms["with"](x), forms["without"](x), rtol=1e-4, atol=1e-4)
    print(f"feed-forward block: T = {a.steps}, N = {a.batch}, {a.width} -> {a.hidden} -> {a.width}, float32, "
          f"backend cpu")
    ratios = []
    for r in range(a.rounds):
        took = {}
        for name in (("with", "without") if r % 2 == 0 else ("without", "with")):
            t0 = time.perf_counter()
            for _ in range(a.calls):
                forms[name](x)
            took[name] = (time.perf_counter() - t0) / a.calls
        ratios.append(took["without"] / took["with"])
        print(f"round {r}: with {took['with'] * 1e3:.2f} ms, without {took['without'] * 1e3:.2f} ms", flush=True)
    q = statistics.quantiles(ratios, n=4)
    print(f"without / with: median {statistics.median(ratios):.3f} (quartiles {q[0]:.3f}-{q[2]:.3f})")


if __name__ == "__main__":
    main()

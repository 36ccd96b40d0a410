"""What a short call costs: nnforge ``backend="cpu"`` against torch eager and numpy on work too small to time
anything but the call path (flattening the arguments, finding the traced signature, checking shapes, taking the
outputs, launching the C).

Three functions: ``a * b + 1`` on 4 x 4 arrays (one elementwise kernel), a two-layer MLP (64 -> 64 -> 64, tanh)
at batch 1, and an LSTM cell step at batch 1, width 32. The three sides compute the same values (checked before
timing). Interleaved rounds (nnforge, torch, numpy, ...) of ``--calls`` calls each, median microseconds per call;
the ratios are torch / nnforge and numpy / nnforge time (> 1: nnforge's call is shorter). Then the first one
summed, called on a torch tensor that requires grad and differentiated (``backward()``): the call through torch
autograd against torch eager's.
Usage: ``python bench/call_overhead_cpu.py [--rounds 15] [--calls 2000]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

import numpy as np
import torch

import nnforge as nf


def cases(rng: np.random.Generator) -> dict[str, tuple[Callable, Callable, Callable, tuple[np.ndarray, ...]]]:
    """name -> (nnforge function, torch function, numpy function, arguments)."""
    def f32(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.3).astype(np.float32)

    def cell(x, h, c, w_ih, w_hh, b, lib):
        gates = x @ w_ih.T + h @ w_hh.T + b
        i, f, g, o = (gates[:, k * 32:(k + 1) * 32] for k in range(4))
        sig = lib["sigmoid"]
        c2 = sig(f) * c + sig(i) * lib["tanh"](g)
        return sig(o) * lib["tanh"](c2), c2

    nf_lib = {"sigmoid": nf.sigmoid, "tanh": nf.tanh}
    torch_lib = {"sigmoid": torch.sigmoid, "tanh": torch.tanh}
    np_lib = {"sigmoid": lambda v: 1 / (1 + np.exp(-v)), "tanh": np.tanh}
    return {
        "a * b + 1, 4 x 4": (lambda a, b: a * b + 1, lambda a, b: a * b + 1, lambda a, b: a * b + 1,
                             (f32(4, 4), f32(4, 4))),
        "MLP 64-64-64, batch 1": (lambda x, w1, w2: nf.tanh(x @ w1) @ w2, lambda x, w1, w2: torch.tanh(x @ w1) @ w2,
                                  lambda x, w1, w2: np.tanh(x @ w1) @ w2, (f32(1, 64), f32(64, 64), f32(64, 64))),
        "LSTM cell H=32, batch 1": (lambda *a: cell(*a, nf_lib), lambda *a: cell(*a, torch_lib),
                                    lambda *a: cell(*a, np_lib),
                                    (f32(1, 32), f32(1, 32), f32(1, 32), f32(128, 32), f32(128, 32), f32(128))),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    print(f"{'function':>26} {'nnforge us':>11} {'torch us':>9} {'numpy us':>9} {'torch/nnforge':>14} "
          f"{'numpy/nnforge':>14}")
    for name, (ours, theirs, plain, arrays) in cases(rng).items():
        compiled = nf.compile(ours, backend="cpu")
        tensors = tuple(torch.from_numpy(a) for a in arrays)
        want = plain(*arrays)
        got, ref = compiled(*arrays), theirs(*tensors)
        for w, g, r in zip(*(v if isinstance(v, tuple) else (v,) for v in (want, got, ref))):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(r.numpy(), w, rtol=1e-5, atol=1e-5)
        sides = {"nnforge": partial(compiled, *arrays), "torch": partial(theirs, *tensors),
                 "numpy": partial(plain, *arrays)}
        times: dict[str, list[float]] = {side: [] for side in sides}
        with torch.no_grad():
            for _ in range(args.rounds):
                for side, call in sides.items():
                    t0 = time.perf_counter()
                    for _ in range(args.calls):
                        call()
                    times[side].append((time.perf_counter() - t0) / args.calls)
        us = {side: statistics.median(v) * 1e6 for side, v in times.items()}
        print(f"{name:>26} {us['nnforge']:11.1f} {us['torch']:9.1f} {us['numpy']:9.1f} "
              f"{us['torch'] / us['nnforge']:13.2f}x {us['numpy'] / us['nnforge']:13.2f}x")
    through_autograd(args.rounds, args.calls, rng)


def through_autograd(rounds: int, calls: int, rng: np.random.Generator) -> None:
    """The same short call where torch autograd records it: ``(a * b + 1).sum()`` on 4 x 4 with ``a`` requiring
    grad, forward and ``backward()``, the compiled function's against torch eager's."""
    a = torch.from_numpy(rng.standard_normal((4, 4)).astype(np.float32)).requires_grad_()
    b = torch.from_numpy(rng.standard_normal((4, 4)).astype(np.float32))
    compiled = nf.compile(lambda a, b: (a * b + 1).sum(), backend="cpu")

    def step(fn: Callable) -> torch.Tensor:
        a.grad = None
        fn(a, b).backward()
        return a.grad

    np.testing.assert_allclose(step(compiled).numpy(), step(lambda a, b: (a * b + 1).sum()).numpy(), rtol=1e-6)
    sides = {"nnforge": partial(step, compiled), "torch": partial(step, lambda a, b: (a * b + 1).sum())}
    times: dict[str, list[float]] = {side: [] for side in sides}
    for _ in range(rounds):
        for side, call in sides.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                call()
            times[side].append((time.perf_counter() - t0) / calls)
    us = {side: statistics.median(v) * 1e6 for side, v in times.items()}
    print(f"through torch autograd, (a * b + 1).sum() on 4 x 4, forward and backward: nnforge "
          f"{us['nnforge']:.1f} us, torch {us['torch']:.1f} us, torch / nnforge {us['torch'] / us['nnforge']:.2f}")


if __name__ == "__main__":
    main()

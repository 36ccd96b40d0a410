"""The CTC loss, and the loss with its gradient, float32: nnforge ``backend="cpu"`` against
``torch.nn.functional.ctc_loss`` (its CPU kernels, 2 threads), measured in the same run.

Inputs are ``log_softmax`` of random scores ``[T, N, C]`` and padded targets of random lengths (half to all of
``S``), every input length ``T``; both sides take the same scores and compute the log-softmax themselves. The
results are compared before timing (loss to 1e-5 relative, gradient to 1e-5 absolute). Interleaved repeats
(nnforge, torch, nnforge, ...), median time per call; the ratio is torch / nnforge time (> 1: nnforge is faster).
Usage: ``python bench/ctc_cpu.py [--repeats 15] [--shapes 500,16,5,50 ...]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial

import numpy as np
import torch

import nnforge as nf
from nnforge.nn.losses import ctc_loss


def bench_shape(T: int, N: int, C: int, S: int, repeats: int) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((T, N, C)).astype(np.float32)
    targets = rng.integers(1, C, (N, S))
    lengths, target_lengths = np.full(N, T), rng.integers(S // 2, S + 1, N)

    def loss(x, targets, lengths, target_lengths):
        return ctc_loss(x.log_softmax(-1), targets, lengths, target_lengths)

    ours = {"loss": nf.compile(loss, backend="cpu"), "loss+grad": nf.compile(nf.value_and_grad(loss), backend="cpu")}
    tt = [torch.from_numpy(a) for a in (targets, lengths, target_lengths)]

    def theirs(grad: bool):
        xt = torch.from_numpy(x).requires_grad_(grad)
        out = torch.nn.functional.ctc_loss(xt.log_softmax(-1), *tt)
        if grad:
            out.backward()
        return out.item(), xt.grad

    want, want_grad = theirs(True)
    got, got_grad = ours["loss+grad"](x, targets, lengths, target_lengths)
    assert abs(float(got) - want) <= 1e-5 * abs(want), (float(got), want)
    assert abs(float(ours["loss"](x, targets, lengths, target_lengths)) - want) <= 1e-5 * abs(want)
    np.testing.assert_allclose(got_grad, want_grad.numpy(), atol=1e-5)
    for name, grad in (("loss", False), ("loss+grad", True)):
        calls = {"nnforge": partial(ours[name], x, targets, lengths, target_lengths), "torch": partial(theirs, grad)}
        times: dict[str, list[float]] = {who: [] for who in calls}
        for _ in range(repeats):
            for who, call in calls.items():
                t0 = time.perf_counter()
                call()
                times[who].append(time.perf_counter() - t0)
        a, b = statistics.median(times["nnforge"]), statistics.median(times["torch"])
        print(f"{(T, N, C, S)!s:>20} {name:>10} {a * 1e3:11.2f} {b * 1e3:9.2f} {b / a:12.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--shapes", nargs="*", default=["500,16,5,50", "2000,16,5,200"],
                        help="T,N,C,S per shape (C classes, the blank among them)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; float32")
    print(f"{'T, N, C, S':>20} {'call':>10} {'nnforge ms':>11} {'torch ms':>9} {'torch/nnforge':>13}")
    for shape in args.shapes:
        bench_shape(*(int(v) for v in shape.split(",")), args.repeats)


if __name__ == "__main__":
    main()

"""The CTC-CRF loss and its gradient, float32: nnforge backend="cpu" vs the same recursion in plain torch (autograd
through a Python loop over time, tests/nn/torch_crf.py), measured in the same run.

Each call computes the loss (normaliser included) and d loss / d scores. Interleaved repeats (nnforge, torch,
nnforge, torch, ...), median time per call; the ratio is torch / nnforge time (> 1: nnforge is faster). The two
results are compared before timing. Usage: ``python bench/ctc_crf_cpu.py [--repeats 5] [--quick]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

import nnforge as nf
import nnforge.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "nn"))
from torch_crf import ctc_crf_loss as torch_ctc_crf_loss

SHAPES = [(200, 16, 3, 40), (400, 16, 4, 80), (200, 8, 5, 40)]  # T, N, state_len, target length


def inputs(T: int, N: int, state_len: int, S: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    scores = (np.tanh(rng.standard_normal((T, N, 5 * 4 ** state_len))) * 5).astype(np.float32)
    lengths = rng.integers(S // 2, S + 1, N)
    targets = rng.integers(1, 5, (N, S))
    targets[np.arange(S)[None, :] >= lengths[:, None]] = 0
    return scores, targets, lengths


def bench_shape(T: int, N: int, state_len: int, S: int, repeats: int) -> dict:
    scores, targets, lengths = inputs(T, N, state_len, S)
    fn = nf.compile(nf.value_and_grad(lambda s, y, n: F.ctc_crf_loss(s, y, n, state_len)), backend="cpu")
    t0 = time.perf_counter()
    loss, grad = fn(scores, targets, lengths)
    first = time.perf_counter() - t0
    ty, tn = torch.from_numpy(targets), torch.from_numpy(lengths)

    def torch_call():
        ts = torch.from_numpy(scores).requires_grad_()
        out = torch_ctc_crf_loss(ts, ty, tn, state_len)
        out.backward()
        return out.item(), ts.grad

    want, want_grad = torch_call()
    err = max(abs(float(loss) - want) / abs(want), float(np.abs(grad - want_grad.numpy()).max()))
    times: dict[str, list[float]] = {"nnforge": [], "torch": []}
    for _ in range(repeats):
        for name, call in (("nnforge", lambda: fn(scores, targets, lengths)), ("torch", torch_call)):
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    nf_t, torch_t = statistics.median(times["nnforge"]), statistics.median(times["torch"])
    return {"nf": nf_t, "torch": torch_t, "ratio": torch_t / nf_t, "first": first, "err": err}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="the first shape only, 3 repeats")
    args = ap.parse_args()
    shapes = SHAPES[:1] if args.quick else SHAPES
    repeats = 3 if args.quick else args.repeats
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; loss + gradient per call, float32")
    print(f"{'T, N, state_len, S':>22} {'nnforge ms':>11} {'torch ms':>9} {'torch/nnforge':>14} "
          f"{'first call s':>13} {'max err':>9}")
    for shape in shapes:
        r = bench_shape(*shape, repeats)
        print(f"{shape!s:>22} {r['nf'] * 1e3:11.1f} {r['torch'] * 1e3:9.1f} {r['ratio']:13.2f}x "
              f"{r['first']:13.2f} {r['err']:9.1e}")


if __name__ == "__main__":
    main()

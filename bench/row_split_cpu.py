"""Row-split scans vs work-shared steps, same run: the decision evidence for ``passes.rows`` / ``GemmConfig.row_split``.

Each model is compiled twice for the CPU backend: with row-separable scans split by batch rows among the threads
(the default: each thread runs every step on its own rows, no barrier per step) and with every kernel of a step
work-shared among the threads (a barrier per kernel). Interleaved rounds (rows, work-shared, nn.LSTM, ...),
median ms; ratios are nn.LSTM time / this. Usage: ``python bench/row_split_cpu.py [--rounds 7] [--t-div 10]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch
from cells_cpu import nf_gru_cho, nf_ln_lstm, nf_lstm

import nnforge as nf
from nnforge.codegen import BACKENDS
from nnforge.codegen.c import CpuBackend, GemmConfig

SHAPES = [(2000, 64, 96, 96), (1000, 64, 384, 384), (100, 64, 512, 512)]


def _args(model: str, T: int, N: int, I: int, H: int) -> list[np.ndarray]:
    rng = np.random.default_rng()
    x = rng.standard_normal((T, N, I), dtype=np.float32)
    h0 = (rng.standard_normal((N, H), dtype=np.float32) * 0.1)
    s = 1 / np.sqrt(H)
    if model == "gru":
        return [x, h0, *(rng.uniform(-s, s, shp).astype(np.float32) for shp in ((3 * H, I), (2 * H, H), (H, H),
                                                                                   (3 * H,)))]
    c0 = (rng.standard_normal((N, H), dtype=np.float32) * 0.1)
    return [x, h0, c0, *(rng.uniform(-s, s, shp).astype(np.float32) for shp in ((4 * H, I), (4 * H, H), (4 * H,)))]


MODELS = {"LSTM": nf_lstm, "layer-norm LSTM": nf_ln_lstm, "gru": nf_gru_cho}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--t-div", type=int, default=10)
    args = ap.parse_args()
    BACKENDS["cpu-work-shared"] = CpuBackend(gemm=GemmConfig(row_split=False))
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.1f}")
    print(f"{'model':>16} {'T,N,I,H':>16} {'rows ms':>8} {'shared ms':>9} {'nn.LSTM ms':>10} {'rows/shared':>11} "
          f"{'LSTM/rows':>9} {'LSTM/shared':>11}")
    for T, N, I, H in SHAPES:
        T = max(T // args.t_div, 10)
        ref = torch.nn.LSTM(I, H)
        xt = torch.randn(T, N, I)
        for name, fn in MODELS.items():
            a = _args("gru" if name == "gru" else "lstm", T, N, I, H)
            rows, shared = nf.compile(fn, backend="cpu"), nf.compile(fn, backend="cpu-work-shared")
            for got, want in zip(rows(*a), shared(*a)):
                np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
            ts: dict[str, list[float]] = {"rows": [], "shared": [], "torch": []}
            calls = {"rows": (rows, a), "shared": (shared, a), "torch": (ref, [xt])}
            for _ in range(args.rounds):
                for key, (call, call_args) in calls.items():
                    with torch.no_grad():
                        t0 = time.perf_counter()
                        call(*call_args)
                        ts[key].append(time.perf_counter() - t0)
            m = {k: statistics.median(v) * 1e3 for k, v in ts.items()}
            print(f"{name:>16} {f'{T},{N},{I},{H}':>16} {m['rows']:8.1f} {m['shared']:9.1f} {m['torch']:10.1f} "
                  f"{m['shared'] / m['rows']:11.2f} {m['torch'] / m['rows']:9.2f} {m['torch'] / m['shared']:11.2f}")


if __name__ == "__main__":
    main()

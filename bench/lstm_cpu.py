"""One LSTM layer, float32: nnforge backend="cpu" vs torch.nn.LSTM, measured in the same run.

Interleaved repeats (nnforge, torch, nnforge, torch, ...), median time per call; ratios are torch / nnforge
time (= nnforge throughput / torch throughput). Also prints this machine's measured matmul peak (torch GEMM) and
the GFLOP/s each run achieves. Usage: ``python bench/lstm_cpu.py [--repeats 5] [--quick]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

import nnforge as nf

SHAPES = [(2000, 64, 96, 96), (1000, 64, 384, 384), (100, 64, 512, 512)]


def lstm(x, h0, c0, w_ih, w_hh, b, reverse=False):
    def cell(carry, x_t):
        h, c = carry
        i, f, g, o = (x_t @ w_ih.T + h @ w_hh.T + b).chunk(4, axis=-1)
        c = nf.sigmoid(f) * c + nf.sigmoid(i) * nf.tanh(g)
        h = nf.sigmoid(o) * nf.tanh(c)
        return (h, c), h

    (h, c), ys = nf.scan(cell, (h0, c0), x, reverse=reverse)
    return ys, h, c


def stack(x, h0, c0, *ws):
    """Five of these layers, alternating direction (a basecaller's encoder; ``ws``: w_ih, w_hh, b per layer)."""
    for k in range(5):
        x = lstm(x, h0, c0, *ws[3 * k:3 * k + 3], reverse=bool(k % 2))[0]
    return x


def stack_step(mode: str):
    """What the GPU compile benches build of ``stack``: the stack itself (``"inference"``) or the gradients of
    ``(y * y).sum()`` with respect to its 15 weights (``"training"``)."""
    def loss(x, h0, c0, *ws):
        y = stack(x, h0, c0, *ws)
        return (y * y).sum()

    return stack if mode == "inference" else nf.grad(loss, argnums=tuple(range(3, 18)))


def flops(T: int, N: int, I: int, H: int) -> float:
    return 2.0 * T * N * 4 * H * (I + H)


def matmul_peak(n: int = 1024, repeats: int = 5) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        ts.append(time.perf_counter() - t0)
    return 2 * n**3 / min(ts) / 1e9


def bench_shape(T: int, N: int, I: int, H: int, repeats: int) -> dict:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((T, N, I), dtype=np.float32)
    h0 = np.zeros((N, H), np.float32)
    c0 = np.zeros((N, H), np.float32)
    ref = torch.nn.LSTM(I, H)
    w_ih, w_hh = ref.weight_ih_l0.detach().numpy(), ref.weight_hh_l0.detach().numpy()
    b = (ref.bias_ih_l0 + ref.bias_hh_l0).detach().numpy()
    fn = nf.compile(lstm, backend="cpu")
    t0 = time.perf_counter()
    ys, _, _ = fn(x, h0, c0, w_ih, w_hh, b)
    first = time.perf_counter() - t0
    xt = torch.from_numpy(x)
    with torch.no_grad():
        want = ref(xt)[0].numpy()
    err = float(np.abs(ys - want).max())
    tn, tt = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(x, h0, c0, w_ih, w_hh, b)
        tn.append(time.perf_counter() - t0)
        with torch.no_grad():
            t0 = time.perf_counter()
            ref(xt)
            tt.append(time.perf_counter() - t0)
    mn, mt = statistics.median(tn), statistics.median(tt)
    return {"shape": (T, N, I, H), "nnforge_s": mn, "torch_s": mt, "ratio": mt / mn, "first_call_s": first,
            "max_err": err, "gflops": flops(T, N, I, H) / mn / 1e9, "torch_gflops": flops(T, N, I, H) / mt / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="divide T by 10")
    args = ap.parse_args()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    peak = matmul_peak()
    print(f"measured matmul peak (torch 1024^3 sgemm): {peak:.1f} GFLOP/s")
    print(f"{'T,N,I,H':>20} {'nnforge ms':>11} {'nn.LSTM ms':>11} {'ratio':>6} {'GFLOP/s':>8} {'%peak':>6} "
          f"{'first call s':>12} {'max err':>9}")
    for T, N, I, H in SHAPES:
        if args.quick:
            T = max(T // 10, 10)
        r = bench_shape(T, N, I, H, args.repeats)
        print(f"{','.join(map(str, r['shape'])):>20} {r['nnforge_s'] * 1e3:11.1f} {r['torch_s'] * 1e3:11.1f} "
              f"{r['ratio']:6.2f} {r['gflops']:8.1f} {100 * r['gflops'] / peak:6.1f} {r['first_call_s']:12.2f} "
              f"{r['max_err']:9.1e}")


if __name__ == "__main__":
    main()

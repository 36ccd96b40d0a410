"""One LSTM layer on a GPU: nnforge backend="triton" against cuDNN (torch.nn.LSTM, one single-layer module: only
then can cuDNN pick its persistent kernels), measured in the same process, interleaved. (FlashRNN, TorchScript
and torch.compile anchors are not in it yet.)

Per shape (T, batch, hidden; input size = hidden, input projection included) and mode (inference: forward;
training: forward + backward of ``(ys * cot).sum()`` into the weights), each round times every candidate once
with CUDA events after a warm-up; the table shows the median time per call, microseconds per step, achieved
TFLOP/s and the ratio anchor time / nnforge time (> 1: nnforge faster). Also printed: the device's name and its
measured dense-GEMM peak in the dtype. Record results in docs/benchmarks.md with the device and date.

Usage: ``python bench/lstm_gpu.py [--hidden 96 384 1024] [--batch 128 1024] [--steps 2000] [--dtype float16]
[--mode inference training] [--rounds 5]``. ``--smoke`` runs tiny shapes on the CPU under Triton's interpreter
(with ``TRITON_INTERPRET=1`` set by the script, anchors on the CPU): it proves the script runs, its times mean
nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import lstm_cpu  # noqa: E402  (this folder, on sys.path when run as a script)
import torch  # noqa: E402

import nnforge as nf  # noqa: E402


def lstm(x, h0, c0, w_ih, w_hh, b):
    """bench/lstm_cpu.py's layer, its stacked outputs only."""
    return lstm_cpu.lstm(x, h0, c0, w_ih, w_hh, b)[0]


def flops(T: int, N: int, H: int, training: bool) -> float:
    fwd = 2.0 * T * N * 4 * H * (H + H)
    return 3 * fwd if training else fwd


class Clock:
    """Wall time of a call on the device: CUDA events on a GPU, perf_counter on the CPU (smoke runs)."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"

    def __call__(self, fn: Callable[[], object]) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0


def gemm_peak(device: str, dtype: torch.dtype, clock: Clock) -> float:
    n = 8192 if device == "cuda" else 256
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    return 2 * n ** 3 / min(clock(lambda: a @ b) for _ in range(5)) / 1e12


def candidates(T: int, N: int, H: int, dtype: torch.dtype, device: str, training: bool) -> dict[str, Callable]:
    """name -> a call running one forward (or forward + backward) on the same weights and inputs."""
    torch.manual_seed(0)
    ref = torch.nn.LSTM(H, H).to(device=device, dtype=dtype)
    x = torch.randn(T, N, H, device=device, dtype=dtype)
    h0 = torch.randn(N, H, device=device, dtype=dtype) * 0.1
    c0 = torch.randn(N, H, device=device, dtype=dtype) * 0.1
    cot = torch.randn(T, N, H, device=device, dtype=dtype)
    w_ih, w_hh = ref.weight_ih_l0.detach(), ref.weight_hh_l0.detach()
    b = (ref.bias_ih_l0 + ref.bias_hh_l0).detach()
    out: dict[str, Callable] = {}
    anchor = "cudnn" if device == "cuda" else "nn.LSTM"
    if training:
        def loss(x, h0, c0, w_ih, w_hh, b, cot):
            return (lstm(x, h0, c0, w_ih, w_hh, b) * cot).sum()

        step = nf.compile(nf.grad(loss, argnums=(3, 4, 5)), backend="triton")
        out["nnforge.triton"] = lambda: step(x, h0, c0, w_ih, w_hh, b, cot)

        def cudnn() -> None:
            ref.zero_grad(set_to_none=True)
            ys, _ = ref(x, (h0[None], c0[None]))
            ys.backward(cot)

        out[anchor] = cudnn
    else:
        fwd = nf.compile(lstm, backend="triton")
        out["nnforge.triton"] = lambda: fwd(x, h0, c0, w_ih, w_hh, b)

        def cudnn_inference() -> None:
            with torch.no_grad():
                ref(x, (h0[None], c0[None]))

        out[anchor] = cudnn_inference
    return out


def bench(T: int, N: int, H: int, dtype: torch.dtype, device: str, training: bool, rounds: int,
          clock: Clock) -> None:
    fns = candidates(T, N, H, dtype, device, training)
    t0 = time.perf_counter()
    fns["nnforge.triton"]()  # trace, render, and compile every kernel
    if device == "cuda":
        torch.cuda.synchronize()
    first = time.perf_counter() - t0
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(clock(fn))
    med = {name: statistics.median(ts) for name, ts in times.items()}
    mine = med["nnforge.triton"]
    mode = "training" if training else "inference"
    print(f"T={T} N={N} H={H} {str(dtype).removeprefix('torch.')} {mode}: first call (compile) {first:.2f} s")
    for name, t in med.items():
        ratio = "" if name == "nnforge.triton" else f"  {name} / nnforge = {t / mine:.2f}"
        print(f"  {name:16s} {t * 1e3:9.3f} ms  {t / T * 1e6:8.2f} us/step  "
              f"{flops(T, N, H, training) / t / 1e12:7.2f} TFLOP/s{ratio}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, nargs="+", default=[96, 384, 1024])
    p.add_argument("--batch", type=int, nargs="+", default=[128, 1024])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--mode", nargs="+", default=["inference", "training"], choices=["inference", "training"])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU under Triton's interpreter")
    a = p.parse_args()
    if a.smoke:
        a.hidden, a.batch, a.steps, a.rounds, a.dtype = [16], [4], 3, 1, "float32"
    device = "cpu" if a.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench/lstm_gpu.py needs a CUDA device (or --smoke)")
    dtype = getattr(torch, a.dtype)
    clock = Clock(device)
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (Triton interpreter, smoke run)"
    print(f"device: {name}; dense {a.dtype} GEMM peak measured {gemm_peak(device, dtype, clock):.1f} TFLOP/s")
    for mode in a.mode:
        for H in a.hidden:
            for N in a.batch:
                bench(a.steps, N, H, dtype, device, mode == "training", a.rounds, clock)


if __name__ == "__main__":
    main()

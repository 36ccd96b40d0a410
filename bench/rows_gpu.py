"""Layer norms and softmaxes over rows on a GPU: nnforge backend="triton" (one kernel of whole rows, ``Rows``)
against the same program with ``row_programs=0`` (its reductions and elementwise kernels each a kernel, as before
whole-row kernels), PyTorch's own kernels (``torch.nn.functional.layer_norm``, ``torch.softmax``) and
``torch.compile`` of the same function, measured in the same process, interleaved. And a projection followed by
its layer norm (``x @ w + b0``, then the norm): nnforge's one kernel whose programs compute whole rows of the
product and normalize them (``Target.gemm_row_programs``) against the same program with ``gemm_row_programs=0``
(a GEMM, then the norm's kernel), PyTorch (``x @ w + b0``, ``F.layer_norm``) and ``torch.compile``; likewise an
attention's scores and their softmax, ``(q @ k.T * scale).softmax(-1)`` over a batch of heads.

Shapes: rows x width in the dtype, float16 by default: the layer-norm LSTM's input projection at T = 2000, batch
1024, H = 96 (2,048,000 rows of 384), a transformer's features (rows of 1024, 4096) and attention scores (rows of
2048); the projections: that LSTM's (K = 96 to 384) and a transformer's feed-forward output (2048 to 512); the
scores: 128 heads of 500 queries and keys of 64 values (a basecaller transformer's chunk after its stride). Each
round times every candidate once with CUDA events after a warm-up; printed per shape and candidate: the median
time, the GB/s of the fewest bytes the operation must move (the rows read once and written once; a projection's
inputs read once) with the device's copy bandwidth beside it, the ratio candidate time / nnforge time (> 1:
nnforge faster), and each candidate's error: its largest difference from the same function in float64 on the
device, over the largest value. Record results in docs/benchmarks.md with the device and date.

Usage: ``python bench/rows_gpu.py [--rows 2048000 --width 384] [--op "layer norm" softmax projection attention] [--dtype
float16] [--rounds 5]`` (a projection given by --rows and --width has K = width / 4); ``--smoke`` runs
tiny shapes on the CPU under Triton's interpreter (anchors on the CPU): it proves the script runs, its times mean
nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import numpy as np  # noqa: E402
import torch  # noqa: E402
from lstm_gpu import Clock, copy_peak, first_calls, interleaved  # noqa: E402  (this folder, on sys.path when run as a script)

import nnforge as nf  # noqa: E402
import nnforge.nn.functional as F  # noqa: E402
from nnforge.codegen.triton import triton_target  # noqa: E402

# (rows, width): the layer-norm LSTM's projection (T x N rows of 4H), a transformer's features, attention rows
SHAPES = [(2_048_000, 384), (65_536, 1024), (16_384, 4096), (65_536, 2048)]
SMOKE_SHAPES = [(40, 48), (9, 100)]
# (rows, K, width) of the projections: the layer-norm LSTM's input projection, a transformer's feed-forward output
PROJECTIONS = [(2_048_000, 96, 384), (65_536, 2048, 512)]
SMOKE_PROJECTIONS = [(40, 12, 48)]
# (heads x queries, values per query and key, keys) of the attention scores; queries as many as keys
ATTENTION = [(128 * 500, 64, 500)]
SMOKE_ATTENTION = [(2 * 20, 8, 20)]


def layer_norm(x, g, b):
    return F.layer_norm(x, x.shape[-1:], g, b)


def softmax(x):
    return x.softmax(-1)


def t_layer_norm(x, g, b):
    d = x - x.mean(-1, keepdim=True)
    return d / torch.sqrt((d * d).mean(-1, keepdim=True) + 1e-5) * g + b


def t_softmax(x):
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def projection(x, w, b0, g, b):
    return layer_norm(x @ w + b0, g, b)


def t_projection(x, w, b0, g, b):
    return t_layer_norm(x @ w + b0, g, b)


def attention(q, k):
    return (q @ k.transpose(-1, -2) * 0.125).softmax(-1)


def t_attention(q, k):
    return t_softmax(q @ k.transpose(-1, -2) * 0.125)


@dataclass(frozen=True)
class RowOp:
    """One operation's rules, together: nnforge's function, the same in torch (what torch.compile compiles and the
    float64 reference), PyTorch's own kernels on the same arguments, the ``Target`` field that (0) runs it as
    separate kernels, and of ``(rows, k, width)``: its arguments' shapes, the values it must read at least, its
    printed description."""

    fn: Callable
    torch_fn: Callable
    aten: Callable
    apart: str
    shapes: Callable[[int, int, int], list[tuple[int, ...]]]
    reads: Callable[[int, int, int], int]
    what: Callable[[int, int, int], str]


def _rows(r: int, k: int, w: int) -> str:
    return f"{r} rows of {w}"


OPS = {
    "layer norm": RowOp(layer_norm, t_layer_norm,
                        lambda x, g, b: torch.nn.functional.layer_norm(x, x.shape[-1:], g, b, 1e-5), "row_programs",
                        lambda r, k, w: [(r, w), (w,), (w,)], lambda r, k, w: r * w, _rows),
    "softmax": RowOp(softmax, t_softmax, lambda x: torch.softmax(x, -1), "row_programs",
                     lambda r, k, w: [(r, w)], lambda r, k, w: r * w, _rows),
    "projection": RowOp(projection, t_projection,
                        lambda x, w, b0, g, b: torch.nn.functional.layer_norm(x @ w + b0, w.shape[-1:], g, b, 1e-5),
                        "gemm_row_programs", lambda r, k, w: [(r, k), (k, w), (w,), (w,), (w,)],
                        lambda r, k, w: r * k + k * w, lambda r, k, w: f"{r} rows of {k} projected to {w}"),
    "attention": RowOp(attention, t_attention, lambda q, k: torch.softmax(q @ k.transpose(-1, -2) * 0.125, -1),
                       "gemm_row_programs", lambda r, k, w: [(r // w, w, k)] * 2, lambda r, k, w: 2 * r * k,
                       lambda r, k, w: f"{r // w} heads of {w} queries and keys of {k}"),
}


def candidates(op: RowOp, args: list[torch.Tensor]) -> dict[str, Callable[[], object]]:
    """name -> a call computing ``op`` on ``args``."""
    apart = dataclasses.replace(triton_target(), **{op.apart: 0})
    mine = nf.compile(op.fn, backend="triton")
    theirs = nf.compile(op.fn, backend="triton", options={"target": apart})
    compiled = torch.compile(op.torch_fn, dynamic=False)
    return {"nnforge.triton": lambda: mine(*args), f"nnforge[{op.apart}=0]": lambda: theirs(*args),
            "torch": lambda: op.aten(*args), "torch.compile": lambda: compiled(*args)}


def bench(name: str, rows: int, width: int, dtype: torch.dtype, device: str, rounds: int, clock: Clock,
          peak: float, k: int = 0) -> None:
    """Operation ``name`` on ``rows`` x ``width`` (a product's from ``rows`` x ``k``), timed against its anchors."""
    op = OPS[name]
    gen = torch.Generator(device="cpu").manual_seed(rows * 7919 + width)
    k = k or max(width // 4, 1)
    args = [(torch.randn(s, generator=gen) * 2.0).to(device=device, dtype=dtype) for s in op.shapes(rows, k, width)]
    if name == "projection":
        args[1] = args[1] / (2.0 * k ** 0.5)  # products of the size of the inputs
    fns = candidates(op, args)
    ref = op.torch_fn(*(a.double() for a in args))
    failed: dict[str, str] = {}
    errors = {name: float(((out.double() - ref).abs().max() / ref.abs().max()).item())  # type: ignore[union-attr]
              for name, out in first_calls(fns, device, failed).items()}
    med = interleaved(fns, rounds, clock)
    moved = (op.reads(rows, k, width) + rows * width) * dtype.itemsize
    print(f"{name}: {op.what(rows, k, width)}, {str(dtype).removeprefix('torch.')} (copy peak {peak:.0f} GB/s)")
    for who, t in med.items():
        ratio = "" if who == "nnforge.triton" else f"  {who} / nnforge = {t / med['nnforge.triton']:.2f}"
        print(f"  {who:28s} {t * 1e3:9.3f} ms  {moved / t / 1e9:7.0f} GB/s  error {errors[who]:.1e}{ratio}")
    for who, why in failed.items():
        print(f"  {who:28s} failed: {why}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", help="rows per shape (with --width, one each)")
    ap.add_argument("--width", type=int, nargs="+")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    ap.add_argument("--op", nargs="+", default=list(OPS), choices=list(OPS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU under Triton's interpreter")
    a = ap.parse_args()
    device = "cpu" if a.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench/rows_gpu.py needs a CUDA GPU (--smoke runs it on the CPU under Triton's interpreter)")
    if a.rows or a.width:
        if not (a.rows and a.width) or len(a.rows) != len(a.width):
            sys.exit(f"--rows and --width give one shape each: got {a.rows} and {a.width}")
        shapes = list(zip(a.rows, a.width))
        projections = attentions = [(r, max(w // 4, 1), w) for r, w in shapes]
    else:
        shapes = SMOKE_SHAPES if a.smoke else SHAPES
        projections = SMOKE_PROJECTIONS if a.smoke else PROJECTIONS
        attentions = SMOKE_ATTENTION if a.smoke else ATTENTION
    dtype = getattr(torch, "float32" if a.smoke else a.dtype)  # the interpreter's half arithmetic is numpy's
    clock = Clock(device)
    print(f"device: {torch.cuda.get_device_name() if device == 'cuda' else 'CPU (interpreter: times mean nothing)'}")
    peak = copy_peak(device, clock)
    np.seterr(all="ignore")
    for rows, width in shapes:
        for op in a.op:
            if op in ("layer norm", "softmax"):
                bench(op, rows, width, dtype, device, a.rounds, clock, peak)
    for op, cases in (("projection", projections), ("attention", attentions)):
        for rows, k, width in cases if op in a.op else ():
            bench(op, rows, width, dtype, device, a.rounds, clock, peak, k)


if __name__ == "__main__":
    main()

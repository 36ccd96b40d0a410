"""A transformer encoder layer on a GPU: nnforge backend="triton" against PyTorch's own layer and torch.compile of
it, measured in the same process, interleaved; inference and a training step.

The layer is ``nnforge.nn.TransformerEncoderLayer`` run as a torch module (``nnforge.torch.TorchModule``) whose
weights are those of a ``torch.nn.TransformerEncoderLayer`` twin: the same parameters, so the outputs and
gradients compare directly. A basecaller's transformer encoder at its default shape: d = 512, 8 heads, a 2048-wide
feed-forward, on a chunk after its stride (T = 500 steps) at batch 64, float16, no dropout. Candidates: nnforge;
torch eager (``torch``: its fused fast path where it takes one); ``torch.compile`` of the twin. Inference runs each
under ``torch.no_grad``; the training step is the forward and ``backward`` of a loss on the output (the gradients of
the input and of every weight), torch autograd reaching nnforge's weights through its compiled pullback. Printed
per mode: each candidate's median time over the rounds, the ratio candidate / nnforge (> 1: nnforge faster), the
error of each against the layer in float64 on the device (output, and the input's gradient in training), and with
``--profile`` nnforge's call by kernel. Record results in docs/benchmarks.md with the device and date.

Usage: ``python bench/transformer_gpu.py [--steps 500] [--batch 64] [--width 512] [--heads 8] [--ff 2048]
[--dtype float16] [--mode inference training] [--rounds 10] [--profile]``; ``--smoke`` runs tiny shapes on the CPU
under Triton's interpreter: it proves the script runs, its times mean nothing.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from collections.abc import Callable

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import numpy as np  # noqa: E402
import torch  # noqa: E402
from lstm_gpu import Clock, first_calls, interleaved, kernel_profile  # noqa: E402  (this folder, on sys.path as a script)

import nnforge as nf  # noqa: E402
import nnforge.nn as nn  # noqa: E402
from nnforge.torch import TorchModule  # noqa: E402

NF_DTYPES = {torch.float16: nf.float16, torch.bfloat16: nf.bfloat16, torch.float32: nf.float32}


def layers(d: int, heads: int, ff: int, dtype: torch.dtype, device: str) -> dict[str, torch.nn.Module]:
    """name -> the layer as each candidate runs it, all with the twin's weights; ``float64``: the reference."""
    torch.manual_seed(0)
    twin = torch.nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0).to(device=device, dtype=dtype)
    ours = TorchModule(nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0).to(NF_DTYPES[dtype]), twin,
                       backend="triton")
    return {"nnforge.triton": ours, "torch": twin, "torch.compile": torch.compile(twin, dynamic=False),
            "float64": copy.deepcopy(twin).double()}


def calls(mods: dict[str, torch.nn.Module], x: torch.Tensor, cot: torch.Tensor,
          training: bool) -> dict[str, Callable[[], object]]:
    """name -> one call of that candidate: the output (inference), or the input's gradient after a backward."""
    def inference(m: torch.nn.Module) -> Callable[[], object]:
        def call() -> object:
            with torch.no_grad():
                return m(x)
        return call

    def step(m: torch.nn.Module) -> Callable[[], object]:
        def call() -> object:
            xg = x.detach().requires_grad_(True)
            (m(xg) * cot).sum().backward()
            return xg.grad
        return call

    return {name: (step if training else inference)(m) for name, m in mods.items() if name != "float64"}


def error(got: object, ref: torch.Tensor) -> float:
    return float(((got.double() - ref).abs().max() / ref.abs().max()).item())  # type: ignore[attr-defined]


def report(med: dict[str, float], errors: dict[str, float], failed: dict[str, str], base: str,
           training: bool) -> None:
    """Each candidate's median time, its ratio to nnforge's (``base``) and its error against float64; then the
    candidates that failed, with their reasons."""
    for who, t in med.items():
        ratio = "" if who == base else f"  {who} / nnforge = {t / med[base]:.2f}"
        what = "input gradient" if training else "output"
        print(f"  {who:16s} {t * 1e3:9.3f} ms  {what} error vs float64 {errors[who]:.1e}{ratio}")
    for who, why in failed.items():
        print(f"  {who:16s} failed: {why}")


def bench(T: int, N: int, d: int, heads: int, ff: int, dtype: torch.dtype, device: str, training: bool,
          rounds: int, clock: Clock, profile: bool) -> None:
    mods = layers(d, heads, ff, dtype, device)
    if not training:
        for m in mods.values():
            m.eval()  # torch's fused inference path where it takes one
    gen = torch.Generator(device="cpu").manual_seed(T * 7919 + N)
    x = torch.randn(T, N, d, generator=gen).to(device=device, dtype=dtype)
    cot = torch.randn(T, N, d, generator=gen).to(device=device, dtype=dtype)
    fns = calls(mods, x, cot, training)
    ref = calls({"ref": mods["float64"]}, x.double(), cot.double(), training)["ref"]()
    failed: dict[str, str] = {}
    errors = {name: error(out, ref) for name, out in first_calls(fns, device, failed).items()}
    med = interleaved(fns, rounds, clock)
    mode = "training step (forward, backward to the input and weights)" if training else "inference"
    print(f"transformer encoder layer d={d} heads={heads} ff={ff} T={T} N={N} "
          f"{str(dtype).removeprefix('torch.')} {mode}:")
    report(med, errors, failed, "nnforge.triton", training)
    if profile:
        kernel_profile(fns["nnforge.triton"], device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--ff", type=int, default=2048)
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    ap.add_argument("--mode", nargs="+", default=["inference", "training"], choices=["inference", "training"])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--profile", action="store_true", help="nnforge's call by kernel under torch's profiler")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU under Triton's interpreter")
    a = ap.parse_args()
    device = "cpu" if a.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench/transformer_gpu.py needs a CUDA GPU (--smoke runs it on the CPU under Triton's interpreter)")
    if a.width % a.heads:
        sys.exit(f"--width {a.width} is not divisible by --heads {a.heads}")
    T, N, d, heads, ff = (6, 2, 16, 2, 32) if a.smoke else (a.steps, a.batch, a.width, a.heads, a.ff)
    dtype = getattr(torch, "float32" if a.smoke else a.dtype)  # the interpreter's half arithmetic is numpy's
    print(f"device: {torch.cuda.get_device_name() if device == 'cuda' else 'CPU (interpreter: times mean nothing)'}")
    np.seterr(all="ignore")  # the interpreter computes masked-off lanes too
    for mode in a.mode:
        bench(T, N, d, heads, ff, dtype, device, mode == "training", a.rounds, Clock(device), a.profile)


if __name__ == "__main__":
    main()

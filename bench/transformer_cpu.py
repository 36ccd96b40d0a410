"""A transformer encoder layer on the CPU: nnforge backend="cpu" against PyTorch's own layer (and, with
``--compile``, torch.compile of it), measured in the same process, interleaved; inference and a training step.

The layer and its twin are bench/transformer_gpu.py's (``nnforge.nn.TransformerEncoderLayer`` run as a torch module
with the weights of a ``torch.nn.TransformerEncoderLayer``), in float32, no dropout, at a shape a 2-core machine
runs in tens of milliseconds: d = 256, 4 heads, a 1024-wide feed-forward, T = 500, batch 16. Inference runs under
``torch.no_grad`` (torch's fused fast path where it takes one); the training step is the forward and ``backward``
of a loss on the output. Printed per mode: each candidate's median time over the rounds, candidate / nnforge (> 1:
nnforge faster) and the error against the layer in float64. Record results in docs/benchmarks.md with the machine
and date; on a shared machine only the same-run ratios mean anything.

Usage: ``python bench/transformer_cpu.py [--steps 500] [--batch 16] [--width 256] [--heads 4] [--ff 1024]
[--mode inference training] [--rounds 7] [--compile]``.
"""

from __future__ import annotations

import argparse
import copy
import sys

import torch
from lstm_gpu import Clock, first_calls, interleaved  # this folder, on sys.path as a script
from transformer_gpu import calls, error, report

import nnforge.nn as nn
from nnforge.torch import TorchModule


def layers(d: int, heads: int, ff: int, compiled: bool) -> dict[str, torch.nn.Module]:
    """name -> the layer as each candidate runs it, all with the twin's weights; ``float64``: the reference."""
    torch.manual_seed(0)
    twin = torch.nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0)
    mods = {"nnforge.cpu": TorchModule(nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0), twin, backend="cpu"),
            "torch": twin}
    if compiled:
        mods["torch.compile"] = torch.compile(twin, dynamic=False)
    return mods | {"float64": copy.deepcopy(twin).double()}


def bench(T: int, N: int, d: int, heads: int, ff: int, training: bool, rounds: int, compiled: bool) -> None:
    mods = layers(d, heads, ff, compiled)
    if not training:
        for m in mods.values():
            m.eval()
    gen = torch.Generator().manual_seed(T * 7919 + N)
    x, cot = torch.randn(T, N, d, generator=gen), torch.randn(T, N, d, generator=gen)
    fns = calls(mods, x, cot, training)
    ref = calls({"ref": mods["float64"]}, x.double(), cot.double(), training)["ref"]()
    failed: dict[str, str] = {}
    errors = {name: error(out, ref) for name, out in first_calls(fns, "cpu", failed).items()}
    med = interleaved({k: f for k, f in fns.items() if k not in failed}, rounds, Clock("cpu"))
    mode = "training step (forward, backward to the input and weights)" if training else "inference"
    print(f"transformer encoder layer d={d} heads={heads} ff={ff} T={T} N={N} float32 {mode}, "
          f"{torch.get_num_threads()} torch threads:")
    report(med, errors, failed, "nnforge.cpu", training)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ff", type=int, default=1024)
    ap.add_argument("--mode", nargs="+", default=["inference", "training"], choices=["inference", "training"])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--compile", action="store_true", help="torch.compile of the twin too (minutes to build)")
    a = ap.parse_args()
    if a.width % a.heads:
        sys.exit(f"--width {a.width} is not divisible by --heads {a.heads}")
    for mode in a.mode:
        bench(a.steps, a.batch, a.width, a.heads, a.ff, mode == "training", a.rounds, a.compile)


if __name__ == "__main__":
    main()

"""A transformer encoder layer on the CPU: nnforge backend="cpu" against PyTorch's own layer (and, with
``--compile``, torch.compile of it), measured in the same process, interleaved; inference and a training step.

The layer and its twin are bench/transformer_gpu.py's (``nnforge.nn.TransformerEncoderLayer`` run as a torch module
with the weights of a ``torch.nn.TransformerEncoderLayer``), in float32, no dropout, at a shape a 2-core machine
runs in tens of milliseconds: d = 256, 4 heads, a 1024-wide feed-forward, T = 500, batch 16. Inference runs under
``torch.no_grad`` (torch's fused fast path where it takes one); the training step is the forward and ``backward``
of a loss on the output. Printed per mode: each candidate's median time over the rounds, candidate / nnforge (> 1:
nnforge faster) and the error against the layer in float64. Record results in docs/benchmarks.md with the machine
and date; on a shared machine only the same-run ratios mean anything.

``--gpt`` times a hand-written GPT block instead (``GPTBlock``: pre-norm causal attention with nanoGPT's mask
buffer sliced to the length, a GELU feed-forward), which nnforge runs as captured by ``from_torch``: the path a
model that is not built from torch's layers takes.

Usage: ``python bench/transformer_cpu.py [--steps 500] [--batch 16] [--width 256] [--heads 4] [--ff 1024]
[--mode inference training] [--rounds 7] [--compile] [--gpt]``.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys

import torch
from lstm_gpu import Clock, first_calls, interleaved  # this folder, on sys.path as a script
from transformer_gpu import calls, error, report

import nnforge.nn as nn
from nnforge.torch import TorchModule, from_torch


class GPTBlock(torch.nn.Module):
    """A GPT block as nanoGPT writes it, on [T, N, d] like torch's layer: pre-norm causal self-attention (a
    fused q, k, v projection, the mask a buffer sliced to the length) and a GELU feed-forward, both residual."""

    def __init__(self, d: int, heads: int, ff: int, most: int):
        super().__init__()
        self.heads, self.ln1, self.ln2 = heads, torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.up, self.down = torch.nn.Linear(d, ff), torch.nn.Linear(ff, d)
        self.register_buffer("bias", torch.tril(torch.ones(most, most)).view(1, 1, most, most))

    def forward(self, x):
        x = x.transpose(0, 1)  # [N, T, d]
        n, t, d = x.size()
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = [y.view(n, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v)]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf")).softmax(dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).contiguous().view(n, t, d))
        x = x + self.down(torch.nn.functional.gelu(self.up(self.ln2(x))))
        return x.transpose(0, 1)


def layers(d: int, heads: int, ff: int, compiled: bool, gpt: int = 0) -> dict[str, torch.nn.Module]:
    """name -> the layer as each candidate runs it, all with the twin's weights; ``float64``: the reference.
    ``gpt``: a ``GPTBlock`` for sequences up to that length, nnforge's from ``from_torch``."""
    torch.manual_seed(0)
    if gpt:
        twin = GPTBlock(d, heads, ff, gpt)
        ours = TorchModule(from_torch(twin), twin, backend="cpu")
    else:
        twin = torch.nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0)
        ours = TorchModule(nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0), twin, backend="cpu")
    mods = {"nnforge.cpu": ours, "torch": twin}
    if compiled:
        mods["torch.compile"] = torch.compile(twin, dynamic=False)
    return mods | {"float64": copy.deepcopy(twin).double()}


def bench(T: int, N: int, d: int, heads: int, ff: int, training: bool, rounds: int, compiled: bool,
          gpt: bool) -> None:
    mods = layers(d, heads, ff, compiled, T if gpt else 0)
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
    what = "GPT block (from_torch)" if gpt else "transformer encoder layer"
    print(f"{what} d={d} heads={heads} ff={ff} T={T} N={N} float32 {mode}, "
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
    ap.add_argument("--gpt", action="store_true", help="a hand-written GPT block, nnforge's from from_torch")
    a = ap.parse_args()
    if a.width % a.heads:
        sys.exit(f"--width {a.width} is not divisible by --heads {a.heads}")
    for mode in a.mode:
        bench(a.steps, a.batch, a.width, a.heads, a.ff, mode == "training", a.rounds, a.compile, a.gpt)


if __name__ == "__main__":
    main()

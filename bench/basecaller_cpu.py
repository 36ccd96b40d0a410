"""A Bonito-fast-like basecaller on the CPU: nnforge ``backend="cpu"`` against torch eager and ONNX Runtime,
every figure a ratio measured in the same run (interleaved rounds, medians).

The model: three Conv1d with swish (1->4 k5, 4->16 k5, 16->F k19 stride 5), five LSTM layers of width F
alternating direction (the first reversed), a linear head to 5 classes and log-softmax. Both implementations
carry the same weights (the torch twin is loaded from the nnforge module's state dict with
``nn.stack_rnn_layers``' inverse naming), and their outputs are compared before timing.

* inference on a chunk of ``--samples`` samples (10,000: T = 2,000 LSTM steps) at batch 16 and 64: nnforge vs
  torch eager and vs ONNX Runtime (the torch twin exported with ``torch.onnx``; intra-op spinning disabled, so
  its idle threads cannot slow the candidate that runs after it);
* a training step (forward, CTC loss, backward, Adam) at ``--train-samples`` samples (2,500: T = 500): nnforge
  vs torch eager, their losses compared before and after one update (which checks the gradients); and the torch
  model with its five LSTM layers one nnforge program (``nnforge.torch.TorchModule``) in torch's own training loop
  (torch's convolutions, CTC loss and Adam; the LSTMs' backward from what their forward saved), vs torch eager;
* in both, the torch model captured by ``nnforge.torch.from_torch`` (its reversed layers flip time around a forward
  LSTM, which the compiler turns into reversed scans) and compiled whole, vs torch eager and vs the hand-written
  nnforge model.

Each round runs every candidate for one untimed call and ``--calls`` timed calls, in turn.
Usage: ``python bench/basecaller_cpu.py [--rounds 5] [--calls 2] [--width 96] [--batches 16 64]``.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np
import torch

import nnforge as nf
import nnforge.nn as nn
from nnforge.demo import compiled_step
from nnforge.nn import optim
from nnforge.torch import TorchModule, from_torch

LAYERS = 5


class Encoder(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.convs = nn.ModuleList([nn.Conv1d(1, 4, 5, padding=2), nn.Conv1d(4, 16, 5, padding=2),
                                    nn.Conv1d(16, width, 19, stride=5, padding=9)])
        self.rnn = nn.LSTM(width, width, num_layers=LAYERS, reverse=[k % 2 == 0 for k in range(LAYERS)])
        self.head = nn.Linear(width, 5)

    def forward(self, x):
        for conv in self.convs:
            x = nf.silu(conv(x))
        return self.head(self.rnn(x.permute(2, 0, 1))[0]).log_softmax(-1)


class TorchEncoder(torch.nn.Module):
    """The same model in torch: single-layer LSTMs, the reversed ones run on flipped time."""

    def __init__(self, width: int):
        super().__init__()
        self.convs = torch.nn.ModuleList([torch.nn.Conv1d(1, 4, 5, padding=2), torch.nn.Conv1d(4, 16, 5, padding=2),
                                          torch.nn.Conv1d(16, width, 19, stride=5, padding=9)])
        self.rnns = torch.nn.ModuleList([torch.nn.LSTM(width, width) for _ in range(LAYERS)])
        self.head = torch.nn.Linear(width, 5)

    def forward(self, x):
        for conv in self.convs:
            x = torch.nn.functional.silu(conv(x))
        x = x.permute(2, 0, 1)
        for k, rnn in enumerate(self.rnns):
            x = rnn(x.flip(0))[0].flip(0) if k % 2 == 0 else rnn(x)[0]
        return self.head(x).log_softmax(-1)


class HybridEncoder(torch.nn.Module):
    """The torch model with its LSTM layers one nnforge program: ``model.rnn`` behind ``TorchModule``, trained
    through the parameters of a ``torch.nn.LSTM`` of as many layers that only holds them (its own forward, one
    direction, is never run)."""

    def __init__(self, model: Encoder, twin: TorchEncoder):
        super().__init__()
        self.convs, self.head = copy.deepcopy(twin.convs), copy.deepcopy(twin.head)
        width = twin.head.in_features
        holder = torch.nn.LSTM(width, width, num_layers=LAYERS)
        with torch.no_grad():
            for k, rnn in enumerate(twin.rnns):
                for name, value in rnn.named_parameters():
                    getattr(holder, name.replace("_l0", f"_l{k}")).copy_(value)
        self.rnn = TorchModule(model.rnn, holder, backend="cpu")

    def forward(self, x):
        for conv in self.convs:
            x = torch.nn.functional.silu(conv(x))
        return self.head(self.rnn(x.permute(2, 0, 1))[0]).log_softmax(-1)


def twin_of(model: Encoder, width: int) -> TorchEncoder:
    twin = TorchEncoder(width)
    sd = {}
    for key, value in model.state_dict().items():
        if key.startswith("rnn."):
            name, layer = key[len("rnn."):].rsplit("_l", 1)
            key = f"rnns.{layer}.{name}_l0"
        sd[key] = torch.from_numpy(np.asarray(value))
    twin.load_state_dict(sd)
    return twin


def onnx_session(module: torch.nn.Module, args: tuple, input_names: list[str], output_names: list[str],
                 dynamic_axes: dict[str, dict[int, str]]):
    """An ONNX Runtime session (CPU provider, this process's thread count) running ``module`` exported with
    ``torch.onnx`` on example ``args``; intra- and inter-op spinning disabled, so its idle threads cannot slow the
    candidate timed after it."""
    import onnxruntime as ort

    path = os.path.join(tempfile.mkdtemp(), "model.onnx")
    torch.onnx.export(module, args, path, input_names=input_names, output_names=output_names, dynamo=False,
                      dynamic_axes=dynamic_axes)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = torch.get_num_threads()
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def interleaved(candidates: dict[str, Callable[[], object]], rounds: int, calls: int) -> dict[str, float]:
    """Median seconds per call of each candidate over ``rounds`` rounds of (one untimed call, ``calls`` timed)."""
    times: dict[str, list[float]] = {k: [] for k in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            fn()
            for _ in range(calls):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def inference(width: int, batch: int, samples: int, rounds: int, calls: int, rng: np.random.Generator) -> None:
    model = Encoder(width)
    twin = twin_of(model, width).eval()
    x = rng.standard_normal((batch, 1, samples)).astype(np.float32)
    ours = nf.compile(lambda x: model(x), backend="cpu")
    start = time.perf_counter()
    y = ours(x)
    compile_s = time.perf_counter() - start
    converted = from_torch(twin)
    from_twin = nf.compile(lambda x: converted(x), backend="cpu")
    tx = torch.from_numpy(x)
    with torch.no_grad():
        want = twin(tx).numpy()
    sess = onnx_session(twin, (tx,), ["x"], ["y"], {"x": {0: "n", 2: "t"}, "y": {0: "t", 1: "n"}})
    got_ort = sess.run(None, {"x": x})[0]
    print(f"  agreement: nnforge vs torch max |diff| {np.abs(y - want).max():.1e}, from_torch(torch model) "
          f"{np.abs(from_twin(x) - want).max():.1e}, ONNX Runtime vs torch {np.abs(got_ort - want).max():.1e}; "
          f"nnforge compile + first call {compile_s:.1f} s")

    def eager():
        with torch.no_grad():
            twin(tx)

    med = interleaved({"nnforge": lambda: ours(x), "from_torch": lambda: from_twin(x), "torch eager": eager,
                       "onnxruntime": lambda: sess.run(None, {"x": x})}, rounds, calls)
    print(f"  inference F={width} N={batch} samples={samples}: nnforge {med['nnforge'] * 1e3:.0f} ms, torch eager "
          f"{med['torch eager'] * 1e3:.0f} ms ({med['torch eager'] / med['nnforge']:.2f}x, goal >= 2), ONNX Runtime "
          f"{med['onnxruntime'] * 1e3:.0f} ms ({med['onnxruntime'] / med['nnforge']:.2f}x, goal >= 1.3); "
          f"from_torch(torch model) {med['from_torch'] * 1e3:.0f} ms ({med['torch eager'] / med['from_torch']:.2f}x "
          f"torch eager, {med['nnforge'] / med['from_torch']:.2f}x the hand-written nnforge model)")


def training(width: int, batch: int, samples: int, rounds: int, calls: int, rng: np.random.Generator) -> None:
    model = Encoder(width)
    twin = twin_of(model, width)
    opt = optim.Adam(model.parameters(), lr=1e-4)
    topt = torch.optim.Adam(twin.parameters(), lr=1e-4)
    x = rng.standard_normal((batch, 1, samples)).astype(np.float32)
    S = samples // 50
    tg, il, tl = rng.integers(1, 5, (batch, S)), np.full(batch, samples // 5), np.full(batch, S)

    step = compiled_step(model, opt, "cpu")
    hybrid = HybridEncoder(model, twin)  # before any update: the same weights as the other two
    hopt = torch.optim.Adam(hybrid.parameters(), lr=1e-4)
    converted = from_torch(twin)  # so is the torch model captured as an nnforge module, trained by nnforge
    converted_step = compiled_step(converted, optim.Adam(converted.parameters(), lr=1e-4), "cpu")

    targs = [torch.from_numpy(a) for a in (x, tg, il, tl)]

    def torch_step(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            optimizer.zero_grad()
            loss = torch.nn.functional.ctc_loss(module(targs[0]), *targs[1:])
            loss.backward()
            optimizer.step()
            return loss

        return run

    eager, mixed = torch_step(twin, topt), torch_step(hybrid, hopt)
    start = time.perf_counter()
    first = float(step(x, tg, il, tl))
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    first_mixed = mixed().item()
    mixed_s = time.perf_counter() - start
    first_converted = float(converted_step(x, tg, il, tl))
    print(f"  first losses: nnforge {first:.5f}, torch {eager().item():.5f}, torch with nnforge LSTMs "
          f"{first_mixed:.5f}, from_torch(torch model) {first_converted:.5f}; after one update (the gradients' "
          f"check): nnforge {float(step(x, tg, il, tl)):.5f}, torch {eager().item():.5f}, torch with nnforge LSTMs "
          f"{mixed().item():.5f}, from_torch {float(converted_step(x, tg, il, tl)):.5f}; nnforge compile + first "
          f"call {compile_s:.1f} s, torch with nnforge LSTMs {mixed_s:.1f} s")
    med = interleaved({"nnforge": lambda: step(x, tg, il, tl), "torch eager": eager, "mixed": mixed,
                       "from_torch": lambda: converted_step(x, tg, il, tl)}, rounds, calls)
    print(f"  training step F={width} N={batch} samples={samples}: nnforge {med['nnforge'] * 1e3:.0f} ms, "
          f"torch eager {med['torch eager'] * 1e3:.0f} ms ({med['torch eager'] / med['nnforge']:.2f}x, goal >= 1.5); "
          f"torch's loop with nnforge LSTMs {med['mixed'] * 1e3:.0f} ms ({med['torch eager'] / med['mixed']:.2f}x "
          f"torch eager); from_torch(torch model) {med['from_torch'] * 1e3:.0f} ms "
          f"({med['torch eager'] / med['from_torch']:.2f}x torch eager, {med['nnforge'] / med['from_torch']:.2f}x "
          "the hand-written nnforge model)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2)
    parser.add_argument("--width", type=int, default=96)
    parser.add_argument("--batches", type=int, nargs="*", default=[16, 64],
                        help="inference batches (none: the training step only)")
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--train-samples", type=int, default=2_500)
    parser.add_argument("--train-batch", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    rng = np.random.default_rng(0)
    print(f"load average before: {os.getloadavg()}; torch threads {torch.get_num_threads()}")
    for batch in args.batches:
        inference(args.width, batch, args.samples, args.rounds, args.calls, rng)
    training(args.width, args.train_batch, args.train_samples, args.rounds, args.calls, rng)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()

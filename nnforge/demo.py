"""``make demo``: the main job on the embedded defaults (CPU, SQLite).

1. The forge: a small basecaller (a strided Conv1d front end with swish, LSTM layers of alternating direction, a
   linear head, CTC loss, Adam) learns to read synthetic nanopore-like signal. The whole training step (forward,
   backprop through time, CTC, the Adam update) is one program compiled to C (``backend="cpu"``); its compile
   time and steps/s are printed against the same model trained by torch eager, then the falling loss.
2. The finder: a ModelView sweep of LSTM implementations x PyTorch backends x batch sizes on this CPU, stored in
   SQLite, with its closing table.
3. The report: one self-contained HTML file of that sweep.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import nnforge as nf
from nnforge import nn

LEVELS = np.array([-1.2, -0.4, 0.4, 1.2], np.float32)  # the current of each base A, C, G, T


class Basecaller(nn.Module):
    """Conv1d (stride 3) + swish -> LSTM layers alternating direction (the first reversed) -> linear -> CTC."""

    def __init__(self, hidden: int = 32, layers: int = 2, stride: int = 3):
        super().__init__()
        self.conv1 = nn.Conv1d(1, 16, 5, padding=2)
        self.conv2 = nn.Conv1d(16, hidden, 9, stride=stride, padding=4)
        self.rnn = nn.LSTM(hidden, hidden, num_layers=layers, reverse=[k % 2 == 0 for k in range(layers)])
        self.head = nn.Linear(hidden, 5)

    def forward(self, signal: nf.Tensor) -> nf.Tensor:  # signal [N, 1, T] -> log-probabilities [T / stride, N, 5]
        h = nf.silu(self.conv2(nf.silu(self.conv1(signal))))
        out, _ = self.rnn(h.permute(2, 0, 1))
        return self.head(out).log_softmax(-1)


def synthetic_reads(rng: np.random.Generator, batch: int, samples: int, bases: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Signal chunks [N, 1, samples]: each base holds its level for a random dwell, plus noise; labels 1-4."""
    signal = np.zeros((batch, 1, samples), np.float32)
    targets = rng.integers(1, 5, (batch, bases))
    for n in range(batch):
        dwell = rng.integers(samples // bases - 3, samples // bases + 4, bases)
        edges = np.minimum(np.concatenate([[0], np.cumsum(dwell)]), samples)
        for b in range(bases):
            signal[n, 0, edges[b]:edges[b + 1]] = LEVELS[targets[n, b] - 1]
        signal[n, 0, edges[-1]:] = LEVELS[targets[n, -1] - 1]
    signal += rng.normal(0, 0.15, signal.shape).astype(np.float32)
    return signal, targets, np.full(batch, samples // 3), np.full(batch, bases)


def _torch_twin(hidden: int, layers: int, stride: int):
    """The same model in torch (layers of alternating direction as flips around single-layer LSTMs)."""
    import torch

    class Twin(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = torch.nn.Conv1d(1, 16, 5, padding=2)
            self.conv2 = torch.nn.Conv1d(16, hidden, 9, stride=stride, padding=4)
            self.rnns = torch.nn.ModuleList([torch.nn.LSTM(hidden, hidden) for _ in range(layers)])
            self.head = torch.nn.Linear(hidden, 5)

        def forward(self, signal):
            h = torch.nn.functional.silu(self.conv2(torch.nn.functional.silu(self.conv1(signal)))).permute(2, 0, 1)
            for k, rnn in enumerate(self.rnns):
                h = rnn(h.flip(0))[0].flip(0) if k % 2 == 0 else rnn(h)[0]
            return self.head(h).log_softmax(-1)

    return Twin()


def torch_steps_per_s(batches: list, hidden: int, layers: int, stride: int) -> float:
    """Steps per second of the torch-eager twin on the same batches (its first step not timed)."""
    import torch

    model = _torch_twin(hidden, layers, stride)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)

    def step(batch):
        x, tg, il, tl = (torch.from_numpy(np.asarray(a)) for a in batch)
        opt.zero_grad()
        loss = torch.nn.functional.ctc_loss(model(x), tg, il, tl)
        loss.backward()
        opt.step()

    step(batches[0])
    start = time.perf_counter()
    for batch in batches:
        step(batch)
    return len(batches) / (time.perf_counter() - start)


def compiled_step(model: nn.Module, opt: nn.optim.Optimizer, backend: str = "cpu") -> nf.CompiledFunction:
    """The whole training step — forward, CTC loss, backprop through time, the optimizer's update — as one
    compiled program taking (signal, targets, input_lengths, target_lengths) and returning the loss."""

    @nf.compile(backend=backend)
    def train_step(signal, targets, input_lengths, target_lengths):
        opt.zero_grad()
        loss = nn.functional.ctc_loss(model(signal), targets, input_lengths, target_lengths)
        loss.backward()
        opt.step()
        return loss

    return train_step


def train(steps: int = 150, batch: int = 16, samples: int = 300, bases: int = 20, hidden: int = 32,
          layers: int = 2, log_every: int = 25, backend: str = "cpu", compare_torch: bool = True) -> list[float]:
    """Train the basecaller with a compiled step; returns the loss of every step."""
    nf.manual_seed(0)
    rng = np.random.default_rng(0)
    model = Basecaller(hidden, layers)
    opt = nn.optim.Adam(model.parameters(), lr=3e-3)

    train_step = compiled_step(model, opt, backend)
    batches = [synthetic_reads(rng, batch, samples, bases) for _ in range(steps)]
    start = time.perf_counter()
    losses = [float(train_step(*batches[0]))]
    compile_s = time.perf_counter() - start
    graph = train_step.trace(*batches[0])
    print(f"training step compiled for backend {backend!r} in {compile_s:.1f} s: {len(graph.order)} IR nodes, "
          f"one program (forward, backprop through time, CTC, Adam). nf.show(train_step, *batch) prints its IR.")
    start = time.perf_counter()
    for k, b in enumerate(batches[1:], start=1):
        losses.append(float(train_step(*b)))
        if k % log_every == 0 or k == steps - 1:
            print(f"step {k:4d}  CTC loss {losses[-1]:.4f}")
    ours = (steps - 1) / (time.perf_counter() - start)
    line = (f"{steps} steps, {train_step.trace_count} trace; loss {np.mean(losses[:5]):.3f} -> "
            f"{np.mean(losses[-5:]):.3f}; {ours:.1f} steps/s")
    if compare_torch:
        theirs = torch_steps_per_s(batches[:max(5, steps // 5)], hidden, layers, 3)
        line += f", torch eager {theirs:.1f} steps/s ({ours / theirs:.2f}x, same batches, this run)"
    print(line)
    return losses


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--db", default="modelview.db")
    parser.add_argument("--report", default="report.html")
    parser.add_argument("--skip-sweep", action="store_true", help="only the forge part")
    args = parser.parse_args(argv)

    print("══ 1. The forge: a basecaller's training step compiled to C (cpu backend) ══")
    train(args.steps)
    if args.skip_sweep:
        return
    from nnforge.modelview.demo import run_demo
    from nnforge.modelview.report import write_report

    print("\n══ 2. ModelView: a CPU sweep of LSTM implementations and backends ══")
    run_id = run_demo(args.db)
    print("\n══ 3. Report ══")
    path = write_report(args.db, args.report, run_id=run_id)
    print(f"report of run {run_id} written to {os.path.abspath(path)}")


if __name__ == "__main__":
    main()

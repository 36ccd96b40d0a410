"""``make demo``: the main job on the embedded defaults (CPU, SQLite).

1. The forge: a small LSTM sequence model learns a synthetic task (echo the input delayed by a few steps). The
   whole training step (forward, backprop through time, Adam update) is one compiled program on the reference
   backend; the IR of that step is printed, then the falling loss.
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


class DelayModel(nn.Module):
    """LSTM + linear head: y_t should equal x_{t-delay}."""

    def __init__(self, hidden: int):
        super().__init__()
        self.lstm = nn.LSTM(1, hidden)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: nf.Tensor) -> nf.Tensor:
        ys, _ = self.lstm(x)
        return self.head(ys)


def synthetic_batch(rng: np.random.Generator, seq_len: int, batch: int, delay: int) -> tuple[np.ndarray, np.ndarray]:
    x = rng.standard_normal((seq_len, batch, 1)).astype(np.float32)
    y = np.zeros_like(x)
    y[delay:] = x[:-delay]
    return x, y


def train(steps: int = 300, seq_len: int = 24, batch: int = 16, hidden: int = 24, delay: int = 3,
          log_every: int = 25, show_ir: bool = True) -> list[float]:
    """Train the delay model with a compiled step; returns the loss of every step."""
    nf.manual_seed(0)
    rng = np.random.default_rng(0)
    model = DelayModel(hidden)
    opt = nn.optim.Adam(model.parameters(), lr=1e-2)

    @nf.compile(backend="reference")
    def train_step(x, y):
        pred = model(x)
        loss = nn.functional.mse_loss(pred[delay:], y[delay:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    x, y = synthetic_batch(rng, seq_len, batch, delay)
    if show_ir:
        print("── IR of one training step (forward, backprop through time, Adam) ──")
        nf.show(train_step, x, y)
    losses = []
    start = time.perf_counter()
    for step in range(steps):
        x, y = synthetic_batch(rng, seq_len, batch, delay)
        losses.append(float(train_step(x, y)))
        if step % log_every == 0 or step == steps - 1:
            print(f"step {step:4d}  loss {losses[-1]:.5f}")
    elapsed = time.perf_counter() - start
    print(f"{steps} steps in {elapsed:.1f} s ({train_step.trace_count} trace); "
          f"loss {np.mean(losses[:10]):.4f} -> {np.mean(losses[-10:]):.4f}")
    return losses


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--db", default="modelview.db")
    parser.add_argument("--report", default="report.html")
    parser.add_argument("--skip-sweep", action="store_true", help="only the forge part")
    args = parser.parse_args(argv)

    print("══ 1. The forge: training an LSTM with a compiled step (reference backend) ══")
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

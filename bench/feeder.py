"""A streamed training loop (nf.loop + nf.Feeder + nf.Receiver): Feeders prefetched on a thread vs called in step,
its step interpreted vs compiled to C.

The loop trains a small MLP regressor with Adam (nnforge.nn) for ``--steps`` steps. Each batch is made by the
Feeder's function from raw int16 signal chunks, as a basecaller's reader would: widen to float32, normalise each
read by its median and median absolute deviation, then take moving averages at four window lengths (cumulative
sums) and the last ``--features`` samples of each. That is CPU-bound numpy work with no sleep in it; ``--io-ms``
adds a ``time.sleep`` per batch standing for I/O latency (default 0: none). The Receiver logs each loss.

"on" is the default (``prefetch=2``, ``pending=2``: batches made on a thread ahead of the step, losses delivered
behind it); "off" is ``prefetch=0, pending=0`` (both called on the loop's thread when the step needs them, as
before). The loop is ``nf.compile``-d for each backend of ``--backends``: ``reference`` interprets the step with
numpy, ``cpu`` calls it as generated C once per iteration (``nnforge/codegen/streamed.py``). Rounds run every
(backend, mode) in turn, the order alternating by round, in one process; each run traces a fresh loop from the
same initial weights, calls it once (tracing and compiling, untimed) and times the second call, and each
backend's two modes' losses are checked to be bit-identical. Printed: off / on time per backend (> 1:
prefetching is faster) and each backend's "on" time against the first's. On a shared machine only these
same-run ratios mean anything.

The prefetch thread needs a free core: numpy's OpenBLAS starts one thread per core for the step's matrix
products, so on a 2-core machine run it as ``OPENBLAS_NUM_THREADS=1 python bench/feeder.py`` too (the header
prints the setting). Usage: ``python bench/feeder.py [--rounds 5] [--steps 60] [--io-ms 0]
[--backends reference,cpu] [--trace feeder.json]``.

On a GPU, ``--backends cpu,triton --trace feeder.json`` runs the step as Triton kernels with the batches and losses
crossing on a copy stream (``nnforge/runtime/staging.py``), then profiles one more run: the trace shows the copy
stream's ``Memcpy HtoD`` / ``DtoH`` rows beside the compute stream's kernels, and the summary printed says how much
of the copies' time a kernel ran on another stream (``nnforge/runtime/timeline.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import time
from collections.abc import Iterator

import numpy as np

import nnforge as nf
import nnforge.nn as nn
from nnforge.nn import optim
from nnforge.trace import fresh_session

WINDOWS = (4, 16, 64, 256)


class Reader:
    """Raw int16 chunks (made once, as if read from disk) turned into (features | target) batches on demand."""

    def __init__(self, batch: int, chunk: int, features: int, io_ms: float, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.raw = (rng.standard_normal((batch * 8, chunk)) * 120 + 450).astype(np.int16)
        self.batch, self.features, self.io_s = batch, features, io_ms / 1e3
        self.w_true = rng.standard_normal((len(WINDOWS) * features, 1)).astype(np.float32) / 8
        self.calls = 0

    def __call__(self) -> np.ndarray:
        if self.io_s:
            time.sleep(self.io_s)
        start = (self.calls * self.batch) % len(self.raw)
        self.calls += 1
        x = self.raw[start:start + self.batch].astype(np.float32)
        med = np.median(x, axis=1, keepdims=True)
        mad = np.median(np.abs(x - med), axis=1, keepdims=True) + 1.0
        x = (x - med) / mad
        c = np.cumsum(x, axis=1)
        feats = [(c[:, w:] - c[:, :-w])[:, -self.features:] / w for w in WINDOWS]
        f = np.concatenate(feats, axis=1).astype(np.float32)
        return np.concatenate([f, f @ self.w_true], axis=1)


def run(args: argparse.Namespace, prefetch: int, backend: str,
        trace: str | None = None) -> tuple[float, list[float], float]:
    """(seconds of the loop's second call, its losses, seconds spent making its batches on whichever thread made
    them). ``trace``: profile that call with torch's profiler (CUDA activity where a GPU is) into this file."""
    with fresh_session():
        nf.manual_seed(0)
        width = len(WINDOWS) * args.features
        model = nn.Sequential(nn.Linear(width, args.hidden), nn.Tanh(), nn.Linear(args.hidden, args.hidden),
                              nn.Tanh(), nn.Linear(args.hidden, 1))
        opt = optim.Adam(model.parameters(), lr=1e-3)
        reader = Reader(args.batch, args.chunk, args.features, args.io_ms)
        made = [0.0]

        def next_batch() -> np.ndarray:
            t0 = time.perf_counter()
            b = reader()
            made[0] += time.perf_counter() - t0
            return b

        losses: list[float] = []

        def step() -> None:
            d = nf.Feeder(next_batch, shape=[args.batch, width + 1], name="batches", prefetch=prefetch)
            loss = ((model(d[:, :width]) - d[:, width:]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            nf.Receiver(lambda v: losses.append(float(v)), [loss], name="losses", pending=prefetch)

        train = nf.compile(lambda: nf.loop(args.steps, step), backend=backend)
        train()  # traced, compiled, run: not timed
        del losses[:]
        made[0] = 0.0
        with profiled(trace):
            t0 = time.perf_counter()
            train()
            elapsed = time.perf_counter() - t0
        return elapsed, losses, made[0]


@contextlib.contextmanager
def profiled(trace: str | None) -> Iterator[None]:
    """Torch's profiler around the block (CUDA activity where a GPU is), its Chrome trace written to ``trace``;
    nothing without one."""
    if not trace:
        yield
        return
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = [ProfilerActivity.CUDA] if torch.cuda.is_available() else []
    with profile(activities=[ProfilerActivity.CPU, *cuda]) as prof:
        yield
    prof.export_chrome_trace(trace)


def report_trace(args: argparse.Namespace, backend: str) -> None:
    """One prefetching run of ``backend`` under torch's profiler: where its copies ran against its kernels."""
    from nnforge.runtime.timeline import copy_overlap

    t, _, _ = run(args, 2, backend, trace=args.trace)
    o = copy_overlap(args.trace)
    print(f"trace of {backend} (prefetch=2, pending=2, {t / args.steps * 1e3:.1f} ms/step under the profiler): "
          f"{args.trace}; {o.kernels} kernels on streams {sorted(o.kernel_streams)}")
    for direction, c in sorted(o.copies.items()):
        print(f"  {direction}: {c.count} copies on streams {sorted(c.streams)}, {c.busy_us:.0f} µs, "
              f"{c.overlapped:.0%} of it while a kernel ran on another stream")
    if not o.copies:
        print("  no device copies in the trace (a host backend, or no GPU)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="on/off pairs, interleaved")
    ap.add_argument("--steps", type=int, default=60, help="loop iterations per run")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=4000, help="int16 samples per read in a batch")
    ap.add_argument("--features", type=int, default=32, help="samples kept per moving average")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--io-ms", type=float, default=0.0, help="time.sleep per batch standing for I/O (0: none)")
    ap.add_argument("--backends", default="reference,cpu", help="comma-separated; the first is the anchor")
    ap.add_argument("--trace", default="", help="after the rounds, profile one prefetching run of the last "
                    "backend into this Chrome trace (chrome://tracing, Perfetto) and print its copy overlap")
    args = ap.parse_args()
    if args.chunk < max(WINDOWS) + args.features:
        ap.error(f"--chunk {args.chunk} is shorter than the widest moving average ({max(WINDOWS)} samples) plus the "
                 f"--features {args.features} it keeps: at least {max(WINDOWS) + args.features}")
    backends = args.backends.split(",")
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, numpy {np.__version__}; "
          f"{args.steps} steps of batch {args.batch} x {args.chunk} int16 samples, MLP "
          f"{len(WINDOWS) * args.features}-{args.hidden}-{args.hidden}-1, Adam; I/O sleep {args.io_ms} ms/batch; "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}")
    cells = [(b, mode) for b in backends for mode in ("on", "off")]
    times: dict[tuple[str, str], list[float]] = {c: [] for c in cells}
    made: dict[tuple[str, str], list[float]] = {c: [] for c in cells}
    want: dict[str, list[float]] = {}
    print(f"{'round':>5} " + " ".join(f"{b + ' ' + m + ' s':>16}" for b, m in cells))
    for r in range(args.rounds + 1):  # round 0 warms caches and the allocator; not counted
        row = {}
        for b, mode in (cells if r % 2 else cells[::-1]):
            t, losses, m = run(args, 2 if mode == "on" else 0, b)
            if want.setdefault(b, losses) != losses:
                raise SystemExit(f"{b}: prefetching changed the losses")
            row[b, mode] = t
            if r:
                times[b, mode].append(t)
                made[b, mode].append(m)
        if r:
            print(f"{r:5d} " + " ".join(f"{row[c]:16.3f}" for c in cells))
    for b in backends:
        on, off = statistics.median(times[b, "on"]), statistics.median(times[b, "off"])
        ratios = [y / x for x, y in zip(times[b, "on"], times[b, "off"])]
        print(f"{b}: on {on / args.steps * 1e3:.1f} ms/step, off {off / args.steps * 1e3:.1f} ms/step; median of "
              f"per-round off/on ratios {statistics.median(ratios):.2f}x; batch making "
              f"{statistics.median(made[b, 'off']) / args.steps * 1e3:.1f} ms/batch (off), "
              f"{statistics.median(made[b, 'on']) / args.steps * 1e3:.1f} ms/batch (on, on the prefetch thread); "
              f"losses identical in both modes, first {want[b][0]:.4f} last {want[b][-1]:.4f}")
    if args.trace:
        report_trace(args, backends[-1])
    first = backends[0]
    for b in backends[1:]:
        for mode in ("on", "off"):
            ratios = [x / y for x, y in zip(times[first, mode], times[b, mode])]
            print(f"{first} / {b} time, {mode}: median of per-round ratios {statistics.median(ratios):.2f}x "
                  f"(range {min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()

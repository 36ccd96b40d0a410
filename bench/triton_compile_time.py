"""Compile time of a program's Triton kernels for a Hopper GPU, without one: one after another (as Triton compiles
them at their first launches) against a thread pool (``nnforge/codegen/triton/warm.py`` on a GPU).

The program is a 5-layer LSTM stack (bench/lstm_cpu.py's layer, H = ``--hidden``, float16, alternating direction,
batch ``--batch``), its forward (``--mode inference``) or a training step (the gradients of every weight). Its
kernels' launches are recorded while Triton's interpreter runs it once (three steps: the kernels do not depend on
T); each round then compiles every recorded kernel for sm_90 with Triton's own ptxas in a fresh process and an
empty Triton cache (``nnforge/codegen/triton/offline.py``), in sequence and on ``--threads`` threads, the order
alternating by round. Printed: per-kernel seconds, each round's totals, and the median of
per-round sequence / pool ratios (> 1: the pool is faster). On a shared machine only the same-round ratio means
anything. Usage: ``python bench/triton_compile_time.py [--rounds 3] [--threads 2] [--hidden 96] [--batch 16]
[--mode inference|training]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: the launches are recorded by its interpreter

import lstm_cpu  # this folder, on sys.path when run as a script
import numpy as np
import triton

import nnforge as nf
from nnforge.codegen.triton.offline import compile_offline, record_launches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=96)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--mode", choices=["inference", "training"], default="inference")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    H, N = a.hidden, a.batch
    ws = [(rng.standard_normal(s) * 0.1).astype(np.float16) for _ in range(5)
          for s in ((4 * H, H), (4 * H, H), (4 * H,))]
    x, h0, c0 = ((rng.standard_normal(s) * 0.1).astype(np.float16) for s in ((3, N, H), (N, H), (N, H)))
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["NNFORGE_CACHE_DIR"] = tmp  # the generated modules, where the compile processes import them
        fn = lstm_cpu.stack_step(a.mode)
        records = record_launches(lambda: nf.compile(fn, backend="triton")(x, h0, c0, *ws))
        names = [r["name"] for r in records]
        print(f"5-layer LSTM stack, H={H}, batch {N}, float16, {a.mode}: {len(names)} kernels {names}; compiled "
              f"for sm_90 by "
              f"Triton {triton.__version__} on {os.cpu_count()} CPUs")
        ratios = []
        for r in range(a.rounds):
            order = (1, a.threads) if r % 2 == 0 else (a.threads, 1)
            got = {t: compile_offline(records, arch=90, threads=t) for t in order}
            seq, pool = got[1]["total"], got[a.threads]["total"]
            ratios.append(seq / pool)
            each = ", ".join(f"{n} {k['seconds']:.2f}" for n, k in got[1]["kernels"].items())
            print(f"round {r + 1}: in sequence {seq:.2f} s ({each}); {a.threads} threads {pool:.2f} s")
        print(f"sequence / {a.threads} threads: median {statistics.median(ratios):.2f}x "
              f"(range {min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()

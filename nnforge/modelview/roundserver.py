"""One revision's side of an interleaved A/B: a worker that prepares a setting, then times one round per request.

``nnforge ab`` and ``nnforge history`` start one of these per revision and setting. The coordinator asks each in turn
(fresh order every round) for a round, so only one of them runs at any moment and every revision's round is taken at
the machine's pace of that moment — the drift that makes two separate runs disagree lands on all revisions alike.

The harness (this file and the rest of ``nnforge.modelview``) is the coordinator's own; the code under test — the
``nnforge`` compiler when the repository is nnforge, and the spec's plugin files — is the revision's: ``BOOT`` puts
the revision's worktree first on the path and then loads this harness package from the coordinator's checkout.
"""

from __future__ import annotations

import gc
import math
import os
import random
import sys
import time
from typing import Any

# Run as ``python -c BOOT HARNESS_DIR WORKTREE JOB`` with the worktree as working directory.
BOOT = """
import importlib.util, json, os, sys
harness, root, job = sys.argv[1:4]
cpus = json.load(open(job)).get("cpus")
if cpus:  # before any import can start a thread: every thread of the process stays on these CPUs
    os.sched_setaffinity(0, cpus)
sys.path[:1] = [root]
import nnforge
spec = importlib.util.spec_from_file_location("nnforge.modelview", harness + "/__init__.py",
                                              submodule_search_locations=[harness])
mod = importlib.util.module_from_spec(spec)
sys.modules["nnforge.modelview"] = mod
spec.loader.exec_module(mod)
nnforge.modelview = mod
from nnforge.modelview.roundserver import main
sys.exit(main(job))
"""


def _collecting_harness(job: dict[str, Any]) -> Any:
    from .worker import Harness

    class Collecting(Harness):
        """The setting harness, with the rows it would write (failures, mismatches) kept for the coordinator."""

        rows: list[dict[str, Any]]

        def write(self, cell: Any, status: str, started: float, **fields: Any) -> None:
            self.rows.append({"backend": cell.backend, "status": status, **fields})
            self.done.add(cell.key)

    h = Collecting(job)
    h.rows = []
    return h


def main(job_path: str) -> int:
    """Prepare and check every backend, warm each up, send what is ready, then answer ``"round"`` until ``"stop"``."""
    import json
    from multiprocessing.connection import Connection
    from pathlib import Path

    from .timer import CpuClock, warm_up
    from .worker import _die_with_parent, _limit_memory, error_text

    job = json.loads(Path(job_path).read_text())
    _die_with_parent()
    _limit_memory(int(job.get("memory_mb", 0)), "cpu")
    conn = Connection(int(job["fd"]))  # the coordinator's end of a socket pair, inherited
    try:
        h = _collecting_harness(job)
        setup = h._setup()
        ready = {}
        for cell in h.cells:
            st = h._prepare_and_check(cell, setup)
            if st is not None:
                ready[cell.backend] = st
        cfg = h.timing
        clock = CpuClock(cfg.clock)
        calls, inner, info = {}, {}, {}
        for b, st in ready.items():
            state = {"i": 0}

            def call(st: dict[str, Any] = st, state: dict[str, int] = state) -> Any:
                c = st["calls"][state["i"] % len(st["calls"])]
                state["i"] += 1
                return c()

            _, _, steady, est = warm_up(call, clock, cfg)
            calls[b] = call
            inner[b] = max(1, math.ceil(cfg.min_sample_s / est)) if est > 0 else 1
            info[b] = {"compile_s": st["compile_s"], "first_call_s": st["first_call_s"], "steady": steady,
                       "cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
                       "max_abs_err": st["max_abs_err"], "peak_mem_bytes": st["peak"], "calls_per_sample": inner[b]}
        variant, req = setup["variant"], setup["request"]
        conn.send({"ready": info, "rows": h.rows, "items": float(variant.items(req)),
                   "unit": variant.throughput_unit, "flops": float(variant.flops(req))})
    except BaseException as e:
        conn.send({"error": "setting setup failed: " + error_text(e)})
        return 1
    rng = random.Random(job["seed"])
    gc.collect()
    gc.disable()
    while True:
        msg = conn.recv()
        if msg != "round":
            break
        out: dict[str, Any] = {}
        order = list(calls)
        rng.shuffle(order)
        t0 = time.perf_counter()
        for b in order:
            try:
                out[b] = [clock.sample(calls[b], inner[b]) for _ in range(cfg.round_samples)]
            except Exception as e:
                out[b] = f"{type(e).__name__}: {e}"
                del calls[b]
        out["_wall_s"] = time.perf_counter() - t0
        conn.send(out)
    conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

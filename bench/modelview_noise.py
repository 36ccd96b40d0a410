"""How reproducible are ModelView's numbers? The same CPU sweep twice, compared cell by cell, against naive timing.

Runs four sweeps of identical cells into one store, alternating methods so that both see the same machine drift:
adaptive #1, naive #1, adaptive #2, naive #2. "adaptive" is ModelView's method (warm-up until steady, interleaved
rounds, adaptive repeats to the CI target, GC off); "naive" is the usual hand-rolled loop (3 warm-up calls, one timed
loop for the same time budget, mean; one backend after the other). For each method it prints the median and the 90th
percentile over cells of |t1 - t2| / mean(t1, t2), the per-cell run-to-run difference.

    .venv/bin/python bench/modelview_noise.py                 # defaults below
    .venv/bin/python bench/modelview_noise.py --threads 2 --budget 3

This is a benchmark, not a test: it takes minutes and its numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from nnforge.modelview import open_store, sweep
from nnforge.modelview.metrics import cpu_model


def _spec(args: argparse.Namespace, method: str, name: str) -> dict:
    return {
        "name": name,
        "variants": args.variants,
        "backends": args.backends,
        "batch": args.batch,
        "seq_len": [args.seq_len],
        "params": {"input_size": args.hidden, "hidden": args.hidden},
        "seed": 1234,  # same weights and inputs in every run
        "measure_peaks": False,
        "timing": {"method": method, "budget_s": args.budget, "threads": args.threads, "target_rel_ci": 0.01,
                   "clock": args.clock if method == "adaptive" else "wall",
                   "processes": args.processes if method == "adaptive" else 1},
    }


def _diffs(db: str, run_a: str, run_b: str) -> tuple[list[float], list[float]]:
    """Per cell: relative run-to-run difference of the median time, and of the time relative to eager in the same
    setting (what a sweep's table reports)."""
    with open_store(db) as s:
        a = s.cells(run_a).set_index("cell_key")
        b = s.cells(run_b).set_index("cell_key")

    def ratio(df, key):
        eager = key.rsplit("|", 1)[0] + "|eager"
        return df.loc[key, "median_s"] / df.loc[eager, "median_s"] if eager in df.index else None

    times, ratios = [], []
    for key in a.index.intersection(b.index):
        if a.loc[key, "status"] != "ok" or b.loc[key, "status"] != "ok":
            continue
        ta, tb = a.loc[key, "median_s"], b.loc[key, "median_s"]
        times.append(abs(ta - tb) / ((ta + tb) / 2))
        if not key.endswith("|eager"):
            ra, rb = ratio(a, key), ratio(b, key)
            if ra and rb:
                ratios.append(abs(ra - rb) / ((ra + rb) / 2))
    return times, ratios


def _line(label: str, d: list[float]) -> str:
    if not d:
        return f"{label:24} no comparable cells"
    d = sorted(d)
    p90 = d[min(len(d) - 1, int(0.9 * len(d)))]
    return f"{label:24} {100 * statistics.median(d):11.2f}% {100 * p90:9.2f}% {100 * max(d):9.2f}% {len(d):6d}"


def _loadavg() -> str:
    try:
        import os

        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=["lstm_manual", "lstm_premult", "torch_lstm", "torch_gru"])
    p.add_argument("--backends", nargs="+", default=["eager", "jit.script", "onnxruntime"])
    p.add_argument("--batch", nargs="+", type=int, default=[16, 64])
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--budget", type=float, default=2.0, help="timing budget per backend and setting, seconds")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall", help="ModelView's clock (naive: always wall)")
    p.add_argument("--processes", type=int, default=1, help="ModelView's worker processes per setting (naive: 1)")
    p.add_argument("--db", default=None, help="store file (default: a temporary one)")
    args = p.parse_args()
    db = args.db or str(Path(tempfile.mkdtemp(prefix="mv-noise-")) / "noise.db")
    started = time.time()
    load_before = _loadavg()
    runs: dict[str, list[str]] = {"adaptive": [], "naive": []}
    for i in (1, 2):
        for method in ("adaptive", "naive"):
            res = sweep(_spec(args, method, f"noise-{method}-{i}"), db=db, progress=True, table=False)
            runs[method].append(res.run_id)
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        model = next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name")), "")
    except OSError:
        model = ""
    print()
    print(f"date: {datetime.date.today().isoformat()}  machine: {model or cpu_model()} ({platform.machine()}), "
          f"threads: {args.threads}, clock: {args.clock}, processes: {args.processes}, "
          f"load average before: {load_before}, after: {_loadavg()}")
    print(f"cells per run: {len(args.variants) * len(args.backends) * len(args.batch)} "
          f"({len(args.variants)} variants × {len(args.backends)} backends × {len(args.batch)} batch sizes), "
          f"T={args.seq_len}, hidden={args.hidden}, budget {args.budget} s per backend and setting")
    print("run-to-run difference per cell, |t1 - t2| / mean(t1, t2):")
    print(f"{'':24} {'median':>12} {'p90':>10} {'max':>10} {'cells':>6}")
    for method, (a, b) in runs.items():
        times, ratios = _diffs(db, a, b)
        print(_line(f"{method} time", times))
        print(_line(f"{method} ratio to eager", ratios))
    print(f"total wall time {time.time() - started:.0f} s; store: {db}")


if __name__ == "__main__":
    main()

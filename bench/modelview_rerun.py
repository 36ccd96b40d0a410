"""The same CPU sweep twice, code unchanged: how far apart are the figures ``nnforge compare`` judges, and how many
unchanged cells does it call changed?

Runs ``nnforge sweep SPEC`` twice into one store (recording the 1-minute load average before and after each run),
then ``nnforge compare --json`` on the pair, and prints per kind of figure (time relative to eager in the same
setting; absolute time for eager's own cells): the median and 90th percentile of |change|, the verdict counts, and
the median half-width of the intervals. The default spec is the one in docs/modelview.md, "Measured".

    .venv/bin/python bench/modelview_rerun.py [--clock cpu] [--processes 2] [--budget 2.0] [--db rerun.db]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

SPEC = """name = "rerun"
variants = ["lstm_manual", "lstm_premult", "lstm_combined", "torch_lstm", "torch_gru"]
backends = ["eager", "jit.script", "onnxruntime"]
batch = [1, 16, 64]
seq_len = [32]
seed = 1234
measure_peaks = false

[params]
hidden = 128
input_size = 128

[timing]
budget_s = {budget}
threads = 1
target_rel_ci = 0.01
clock = "{clock}"
processes = {processes}
round_samples = {round_samples}
"""


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clock", choices=["wall", "cpu"], default="cpu")
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--budget", type=float, default=2.0)
    ap.add_argument("--round-samples", type=int, default=2)
    ap.add_argument("--db", type=Path, default=None, help="store to write (default: a temporary file)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rerun-") as tmp:
        spec = Path(tmp) / "rerun.toml"
        spec.write_text(SPEC.format(budget=args.budget, clock=args.clock, processes=args.processes,
                                    round_samples=args.round_samples))
        db = args.db or Path(tmp) / "rerun.db"
        runs = []
        for i in (1, 2):
            before = load()
            out = subprocess.run([sys.executable, "-m", "nnforge.cli", "sweep", str(spec), "--db", str(db), "--quiet"],
                                 capture_output=True, text=True, check=True)
            runs.append(out.stdout.strip().splitlines()[-1])
            print(f"run {i}: {runs[-1]}, load {before} -> {load()}", flush=True)
        out = subprocess.run([sys.executable, "-m", "nnforge.cli", "compare", *runs, "--db", str(db), "--json"],
                             capture_output=True, text=True, check=True)
        cells = json.loads(out.stdout)["cells"]
    for figure in sorted({c["figure"] for c in cells}):
        sel = [c for c in cells if c["figure"] == figure]
        change = np.abs([c["change"] for c in sel])
        half = np.median([(c["ci"][1] - c["ci"][0]) / 2 for c in sel])
        verdicts = {v: sum(c["verdict"] == v for c in sel) for v in ("slower", "faster", "no change", "inconclusive")}
        print(f"{figure}: {len(sel)} cells, |change| median {100 * np.median(change):.2f} % p90 "
              f"{100 * np.percentile(change, 90):.2f} %, verdicts {verdicts}, median CI half-width {100 * half:.1f} %")
    alarms = sum(c["verdict"] in ("slower", "faster") for c in cells)
    print(f"false alarms: {alarms} of {len(cells)} unchanged cells")


if __name__ == "__main__":
    main()

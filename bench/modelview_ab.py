"""Does ``nnforge ab`` find and size a 5 % slowdown of CPU-bound work on this (shared, drifting) machine?

Builds a throwaway git repository with a plugin variant of ``REPEAT`` matmul + tanh layers (about 6 ms a call, so
the call's fixed overhead is well under 1 %): commit 0 has REPEAT = 20, commit 1 only touches a note (an A/A
control), commit 2 has REPEAT = 21 (5 % more work, not a sleep). Then it runs ``nnforge ab`` on (0, 1) and (0, 2)
``--reps`` times each, and prints each verdict with the load average before and after.

    .venv/bin/python bench/modelview_ab.py [--reps 3] [--budget 2.0] [--clock cpu] [--processes 1]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from revision_repo import make_repo  # this folder, on sys.path when run as a script


def load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--budget", type=float, default=2.0)
    ap.add_argument("--clock", choices=["wall", "cpu"], default="cpu")
    ap.add_argument("--processes", type=int, default=1, help="fresh round servers per revision, one after another")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ab-bench-") as tmp:
        repo = Path(tmp) / "repo"
        timing = {"budget_s": args.budget, "clock": args.clock, "processes": args.processes, "threads": 1,
                  "round_samples": 2, "target_rel_ci": 0.005}
        commits = make_repo(repo, [20, None, 21], width=96, seq_len=16, timing=timing)  # A/A control, then +5 %
        print(f"# {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, clock={args.clock}, budget={args.budget}, "
              f"processes={args.processes}")
        print("| pair | true change | measured change [99 % CI] | verdict | rounds | load before → after |")
        print("| --- | --- | --- | --- | --- | --- |")
        for rep in range(args.reps):
            for name, b, truth in (("A/A", commits[1], "0 %"), ("+5 % work", commits[2], "+5 %")):
                l0 = load()
                out = subprocess.run(
                    [sys.executable, "-m", "nnforge.cli", "ab", commits[0], b, "--spec", str(repo / "bench.toml"),
                     "--repo", str(repo), "--db", str(Path(tmp) / "ab.db"), "--worktrees", str(Path(tmp) / "wt"),
                     "--json", "--threshold", "2%"], capture_output=True, text=True)
                if out.returncode not in (0, 1):
                    print(out.stdout, out.stderr, file=sys.stderr)
                    continue
                (c,) = json.loads(out.stdout)["cells"]
                print(f"| {name} (rep {rep + 1}) | {truth} | {100 * c['change']:+.2f} % [{100 * c['ci'][0]:+.2f}, "
                      f"{100 * c['ci'][1]:+.2f}] | {c['text']} | {c['rounds']} | {l0:.1f} → {load():.1f} |",
                      flush=True)


if __name__ == "__main__":
    main()

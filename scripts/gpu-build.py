"""Build every Triton kernel the test matrix launches for a GPU, on a machine without one.

Runs the backend-parametrized tests on ``triton`` under Triton's interpreter (they check values) while noting
each distinct kernel launched (``tests/conftest.py``, ``NNFORGE_RECORD_LAUNCHES``), then the bfloat16 cases for
their kernels alone (the interpreter's bfloat16 arithmetic is wrong: their values are not counted), then compiles
every kernel for a CUDA architecture with Triton's compiler and ptxas (``nnforge.codegen.triton.offline``). What
the interpreter runs and a GPU build refuses (a plain Python function called from a kernel, an operation a type
has no GPU form of, a program over its shared memory) is found here rather than in a GPU lease. Exit status 1
when a kernel fails to build or asks for more shared memory than a program may use, or a checked test fails.

    python scripts/gpu-build.py [--arch 90] [--threads N] [-k EXPR]

Minutes: the matrix under the interpreter (~1.5 min on 2 cores), then one compile per distinct kernel (thousands,
~0.3 s each per thread: 11 minutes on two, docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from nnforge.codegen.triton.offline import MAX_SHARED, compile_offline

ROOT = Path(__file__).resolve().parent.parent


def record(folder: Path, select: str, workers: int, checked: bool = True) -> int:
    """Run the tests ``select`` picks with the kernels they launch recorded into ``folder``; their exit status.
    Tests whose values are not ``checked`` report only their count."""
    folder.mkdir(parents=True)
    env = os.environ | {"TRITON_INTERPRET": "1", "NNFORGE_RECORD_LAUNCHES": str(folder)}
    cmd = [sys.executable, "-m", "pytest", "-q", "--disable-warnings", "-rfE", "-p", "no:cacheprovider",
           "--basetemp", str(folder / "tmp"), "-m", "not timing", "-k", select, "tests"]
    if workers > 1:
        cmd[4:4] = ["-n", str(workers), "--dist", "loadgroup"]
    if checked:
        return subprocess.run(cmd, cwd=ROOT, env=env).returncode
    done = subprocess.run([*cmd, "--tb=no", "-rN"], cwd=ROOT, env=env, capture_output=True, text=True)
    print(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:], flush=True)
    return done.returncode


def distinct(folders: list[Path]) -> list[dict]:
    """The kernels nnforge generated (``nf_<hash>.py`` modules; not a test's own kernels) recorded in
    ``folders``, once each, labelled by module file and kernel name."""
    kernels: dict[str, dict] = {}
    for folder in folders:
        for part in sorted(folder.glob("*.json")):
            for rec in json.loads(part.read_text()):
                module = Path(rec["path"])
                if module.parent.name == "triton" and module.name.startswith("nf_"):
                    kernels.setdefault(f"{module.stem}:{rec['name']}", rec)
    return [rec | {"label": label} for label, rec in kernels.items()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, default=90, choices=sorted(MAX_SHARED), help="CUDA architecture (sm_XX)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="kernels compiled at once")
    ap.add_argument("-k", dest="select", default="triton", help="pytest -k expression (default: triton)")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1), help="pytest-xdist workers")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="nnforge-gpu-build-") as tmp:
        checked, half = Path(tmp, "checked"), Path(tmp, "bfloat16")
        status = record(checked, f"({args.select}) and not bfloat16", args.workers)
        # bfloat16 cases run for their kernels alone: the interpreter's bfloat16 arithmetic is wrong
        print("\nbfloat16 cases, for the kernels they launch (their values are checked on a GPU only):", flush=True)
        record(half, f"({args.select}) and bfloat16", args.workers, checked=False)
        records = distinct([checked, half])
        print(f"\n{len(records)} distinct kernels launched; building them for sm_{args.arch} "
              f"on {args.threads} threads", flush=True)
        built = compile_offline(records, arch=args.arch, threads=args.threads, timeout=6 * 3600, keep_going=True)
    origin = {r["label"]: r.get("origin", "?") for r in records}
    kernels = built["kernels"]
    failed = {label: k["error"] for label, k in kernels.items() if "error" in k}
    limit = MAX_SHARED[args.arch]
    shared = {label: k["shared"] for label, k in kernels.items() if "shared" in k}
    over = {label: used for label, used in shared.items() if used > limit}
    spills = {label: k for label, k in kernels.items() if k.get("spill_bytes")}
    print(f"built {len(kernels) - len(failed)} of {len(kernels)} in {built['total']:.0f} s")
    largest = max(shared, key=shared.__getitem__, default=None)
    if largest:
        print(f"most shared memory: {shared[largest]} bytes of {limit}, {largest} ({origin[largest]})")
    for label, error in failed.items():
        print(f"FAILED {label} (first launched by {origin[label]}):\n  {error.strip().splitlines()[-1]}")
    for label, used in over.items():
        print(f"OVER {label}: {used} bytes of shared memory > {limit} (first launched by {origin[label]})")
    kinds = Counter(label.split(":")[1].split("_", 1)[1] if "_" in label.split(":")[1] else "?" for label in spills)
    print(f"{len(spills)} kernels spill registers to local memory" + (f": {dict(kinds.most_common(8))}" if kinds
                                                                       else ""))
    for label, k in sorted(spills.items(), key=lambda item: -item[1]["spill_bytes"])[:10]:
        print(f"  {k['spill_bytes']:6d} B  {k['registers']} regs  {label}  ({origin[label]})")
    if status:
        print(f"the tests themselves failed (pytest exit status {status})")
    return 1 if failed or over or status else 0


if __name__ == "__main__":
    sys.exit(main())

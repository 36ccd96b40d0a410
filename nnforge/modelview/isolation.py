"""Parent side of process isolation: start a worker, watch it, and say how it ended.

A worker is a fresh interpreter (``python -m nnforge.modelview.worker JOB``), started in its own session so that the
parent can kill its whole process group (the worker and e.g. TorchInductor's compile workers) and so that a Ctrl-C in
the terminal reaches the parent, which then stops the worker itself. The parent enforces two limits:

* **no progress for ``timeout_s``** (the worker emits phase markers and a heartbeat per timing round) → ``timeout``;
* **resident memory of the worker's process tree above ``memory_mb``** → ``oom`` (the worker additionally runs under
  RLIMIT_AS on CPU, so most runaway allocations fail inside it and are recorded by the worker itself).

A negative return code is a signal: ``crashed`` with the signal's name and the tail of the worker's stderr (with
``PYTHONFAULTHANDLER=1`` a segfault leaves a Python traceback there).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PACKAGE_ROOT = Path(__file__).resolve().parent.parent.parent  # the directory holding the nnforge package


@dataclass
class Outcome:
    """How a worker ended. ``status`` is ok (exited 0), timeout, oom or crashed; ``rows`` maps cell keys the worker
    recorded to their status; ``last_phase`` is the last phase marker (which backend was running)."""

    status: str
    returncode: int | None
    error: str = ""
    rows: dict[str, str] = field(default_factory=dict)
    last_phase: dict[str, Any] = field(default_factory=dict)


def worker_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH", "")) if p)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    # numpy's OpenBLAS serves only the nnforge reference interpreter here. Its worker threads keep spinning after
    # each call and, interleaved with a backend on its own OpenMP pool, stole the cores from it (a 100x slowdown
    # of nnforge.cpu measured next to nnforge.reference): keep that pool at one thread.
    env["OPENBLAS_NUM_THREADS"] = "1"
    # One compile thread: a pool of compile subprocesses costs more than it saves on a few cores, and adds noise.
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    env["PYTHONFAULTHANDLER"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env["MODELVIEW_PARENT_PID"] = str(os.getpid())  # the worker exits if its parent died before it could watch it
    return env


def _tree_rss(pid: int) -> int:
    try:
        import psutil

        proc = psutil.Process(pid)
        total = proc.memory_info().rss
        for child in proc.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += child.memory_info().rss
        return total
    except Exception:
        return 0


def _tail(path: Path, limit: int = 3000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    text = data[-limit:].decode(errors="replace")
    return text if len(data) <= limit else "..." + text


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()


def run_worker(
    job: dict[str, Any],
    workdir: Path,
    timeout_s: float,
    memory_mb: int,
    threads: int,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    poll_s: float = 0.05,
) -> Outcome:
    """Run one job to its end and classify it. Ctrl-C kills the worker's group and propagates."""
    workdir.mkdir(parents=True, exist_ok=True)
    stem = f"job-{time.time_ns()}"
    job = dict(job)
    job.setdefault("events", str(workdir / f"{stem}.events"))
    job_path = workdir / f"{stem}.json"
    job_path.write_text(json.dumps(job))
    events_path = Path(job["events"])
    events_path.touch()
    err_path = workdir / f"{stem}.stderr"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "nnforge.modelview.worker", str(job_path)],
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=subprocess.STDOUT,
            env=worker_env(threads),
            start_new_session=True,
        )
    outcome = Outcome(status="ok", returncode=None)
    last_progress = time.monotonic()
    offset = 0
    pending = b""
    killed: tuple[str, str] | None = None

    def read_events() -> None:
        nonlocal offset, pending, last_progress
        with open(events_path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
        offset += len(chunk)
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if not line.strip():
                continue
            ev = json.loads(line)
            last_progress = time.monotonic()
            if ev["event"] == "row":
                outcome.rows[ev["cell_key"]] = ev["status"]
            elif ev["event"] == "phase":
                outcome.last_phase = ev
            if on_event is not None:
                on_event(ev)

    try:
        while True:
            rc = proc.poll()
            read_events()
            if rc is not None:
                break
            if time.monotonic() - last_progress > timeout_s:
                killed = ("timeout", f"no progress for {timeout_s:g} s")
                _kill_group(proc)
                break
            if memory_mb > 0:
                rss = _tree_rss(proc.pid)
                if rss > memory_mb * 2**20:
                    killed = ("oom", f"resident memory {rss / 2**20:.0f} MiB exceeded the limit of {memory_mb} MiB")
                    _kill_group(proc)
                    break
            time.sleep(poll_s)
    except BaseException:
        _kill_group(proc)
        raise
    read_events()
    outcome.returncode = proc.returncode
    where = ""
    if outcome.last_phase:
        b = outcome.last_phase.get("backend")
        where = f" (during {outcome.last_phase.get('phase')}" + (f" of {b})" if b else ")")
    if killed is not None:
        outcome.status, outcome.error = killed[0], killed[1] + where
    elif proc.returncode and proc.returncode < 0:
        sig = -proc.returncode
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        outcome.status = "crashed"
        outcome.error = f"worker killed by {name}{where}"
        if sig == signal.SIGKILL:
            outcome.error += " — not by modelview; likely the kernel's OOM killer"
    elif proc.returncode:
        outcome.status = "crashed"
        outcome.error = f"worker exited with code {proc.returncode}{where}"
    if outcome.status != "ok":
        tail = _tail(err_path)
        if tail:
            outcome.error += "\n--- worker output (tail) ---\n" + tail
    for p in (job_path, err_path, events_path):
        if outcome.status == "ok":
            p.unlink(missing_ok=True)
    return outcome

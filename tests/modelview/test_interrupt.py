"""Ctrl-C and kill -9 of a running sweep lose no finished row and leave no worker behind; --resume completes it."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from nnforge.modelview import open_store

ROOT = Path(__file__).resolve().parents[2]


def _start(db: Path, faulty: str, extra: list[str] = ()) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "nnforge.cli", "sweep", "-v", "test_tanh", "-b", "eager", "-n", "1", "-n", "2",
           "-n", "3", "-n", "4", "-n", "5", "-n", "6", "-t", "3", "--plugin", faulty, "--name", "intr", "--no-peaks",
           "--budget", "0.3", "--threads", "1", "--target-ci", "0.0001", "--db", str(db), "--quiet", *extra]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_ctrl_c_as_in_a_terminal)


def _ctrl_c_as_in_a_terminal() -> None:
    """The sweep gets Ctrl-C as from a terminal. A test suite started in the background by a non-interactive shell
    (``make test &``) inherits SIGINT ignored, and so would the sweep: it ran to its end and exited 0."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _wait_for_rows(db: Path, n: int, proc: subprocess.Popen, limit: float = 120) -> int:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0]
        if db.exists():
            try:
                with sqlite3.connect(db) as con:
                    count = con.execute("SELECT COUNT(*) FROM cells").fetchone()[0]
            except sqlite3.OperationalError:
                count = 0
            if count >= n:
                return count
        time.sleep(0.1)
    raise AssertionError("sweep made no progress")


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_interrupted_sweep_keeps_rows_and_resumes(tmp_path: Path, faulty: str, sig: signal.Signals):
    db = tmp_path / "i.db"
    proc = _start(db, faulty)
    _wait_for_rows(db, 1, proc)
    workers = _descendants(proc.pid)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and "--resume" in out, out
    else:
        assert proc.returncode == -signal.SIGKILL
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, f"workers survived the sweep: {alive}"
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    with open_store(db) as s:
        (run_id,) = s.run_ids()
        before = s.cells(run_id)
    assert 1 <= len(before) < 6 and set(before["status"]) == {"ok"}
    resumed = _start(db, faulty, ["--resume"])
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out
    with open_store(db) as s:
        assert s.run_ids() == [run_id]
        after = s.cells(run_id, latest_only=False)
    assert len(after) == 6 and set(after["batch"]) == {1, 2, 3, 4, 5, 6}
    kept = after.set_index("cell_key").loc[before["cell_key"], "row_id"]
    assert list(kept) == list(before["row_id"])  # the rows finished before the interruption were not redone

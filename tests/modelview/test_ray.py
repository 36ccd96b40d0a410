"""Sweeps through a real local Ray cluster (2 CPUs, so two settings run at once): a Ray worker killed mid-task is
retried and every row lands exactly once; a second run resumes with nothing to do; crashing, hanging and OOM cells
are rows with those statuses, as in a local run."""

from __future__ import annotations

import signal
import threading
import time

import psutil
import pytest

from nnforge.modelview import open_store, sweep

ray = pytest.importorskip("ray")  # the modelview extra installs it; a GPU image without it skips these tests

pytestmark = pytest.mark.xdist_group("ray")  # one local cluster per test process: keep these tests on one worker


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _rows(db: str, run_id: str) -> list[dict]:
    with open_store(db) as s:
        return s.rows(run_id, latest_only=False)


def _kill_one_ray_worker_mid_task(killed: list[int], stop: threading.Event) -> None:
    """SIGKILL the Ray worker running the first task whose isolated measurement worker has started — of this
    process's own cluster: its Ray workers are its descendants, and another xdist worker may run a cluster too
    (``xdist_group`` does not keep these tests on one worker under pytest 9, which ignores the group suffix
    xdist 3.8 writes into ``item._nodeid``)."""
    me = psutil.Process()
    while not stop.is_set() and not killed:
        for p in me.children(recursive=True):
            try:
                cmd = " ".join(p.cmdline())
                parent = p.parent()  # a Ray worker's title is "ray::<task name>"
                title = " ".join(parent.cmdline()) if parent is not None else ""
            except psutil.Error:  # ended meanwhile
                continue
            if "nnforge.modelview.worker" in cmd and title.startswith("ray::measure_setting"):
                parent.send_signal(signal.SIGKILL)
                killed.append(parent.pid)
                return
        time.sleep(0.05)


def test_a_killed_worker_is_retried_and_every_row_lands_once(cluster, db: str, fast: dict, faulty: str) -> None:
    grid = {"variants": ["test_tanh"], "backends": ["eager", "jit.trace"], "batch": [2, 3, 4], "seq_len": [3],
            "plugins": [faulty], "name": "ray-sweep"}
    killed: list[int] = []
    stop = threading.Event()
    killer = threading.Thread(target=_kill_one_ray_worker_mid_task, args=(killed, stop), daemon=True)
    killer.start()
    try:
        res = sweep(db=db, progress=False, table=False, ray=True, **grid, **fast)
    finally:
        stop.set()
        killer.join()
    assert killed, "no Ray worker was found mid-task"
    assert res.retried == 1 and res.counts == {"ok": 6} and res.ran == 6
    rows = _rows(db, res.run_id)
    assert sorted(r["cell_key"] for r in rows) == sorted({r["cell_key"] for r in rows})  # each cell exactly once
    assert len(rows) == 6 and all(r["status"] == "ok" and r["median_s"] > 0 for r in rows)
    assert all(r["machine_id"] and r["row_uid"] for r in rows)
    again = sweep(db=db, progress=False, table=False, ray=True, resume=True, **grid, **fast)
    assert again.run_id == res.run_id and again.ran == 0 and len(_rows(db, res.run_id)) == 6


def test_crash_hang_and_oom_cells_are_rows_under_ray(cluster, db: str, fast: dict, faulty: str) -> None:
    fast["isolation"] = {"timeout_s": 20.0, "memory_mb": 2048}
    res = sweep(variants=["test_segfault", "test_hog", "test_hang", "test_raises", "test_tanh"], backends=["eager"],
                batch=[2], seq_len=[3], plugins=[faulty], db=db, progress=False, table=False, ray=True, **fast)
    status = {r["variant"]: r for r in _rows(db, res.run_id)}
    assert {k: r["status"] for k, r in status.items()} == {
        "test_segfault": "crashed", "test_hog": "oom", "test_hang": "timeout", "test_raises": "failed",
        "test_tanh": "ok"}
    assert "SIGSEGV" in status["test_segfault"]["error"] and "no progress for 20 s" in status["test_hang"]["error"]
    assert "this variant always fails" in status["test_raises"]["error"] and res.retried == 0


def test_more_threads_than_any_node_has_is_refused_before_running(cluster, db: str, fast: dict, faulty: str) -> None:
    from nnforge.modelview.distributed import RayUnavailable

    fast["timing"]["threads"] = 64
    with pytest.raises(RayUnavailable, match=r"timing\.threads = 64 but the largest Ray node has 2 CPUs"):
        sweep(variants=["test_tanh"], backends=["eager"], batch=[2], seq_len=[3], plugins=[faulty], db=db,
              progress=False, table=False, ray=True, **fast)

"""Isolation: a cell that segfaults, hangs, allocates too much, raises or is numerically wrong is a row with its
status, and the sweep completes with every other cell measured."""

from __future__ import annotations

import json

from nnforge.modelview import open_store, sweep


def _rows(db: str, run_id: str) -> dict[tuple[str, str], dict]:
    with open_store(db) as s:
        return {(r["variant"], r["backend"]): r for r in s.rows(run_id)}


def test_crash_oom_failure_are_recorded_and_sweep_completes(db: str, fast: dict, faulty: str) -> None:
    fast["isolation"] = {"timeout_s": 120.0, "memory_mb": 2048}
    res = sweep(
        variants=["test_segfault", "test_hog", "test_raises", "test_tanh"],
        backends=["eager"],
        batch=[2],
        seq_len=[3],
        plugins=[faulty],
        db=db,
        progress=False,
        table=False,
        **fast,
    )
    rows = _rows(db, res.run_id)
    assert len(rows) == 4
    assert rows[("test_segfault", "eager")]["status"] == "crashed"
    assert "SIGSEGV" in rows[("test_segfault", "eager")]["error"]
    assert "Fatal Python error" in rows[("test_segfault", "eager")]["error"]  # faulthandler's traceback is kept
    assert rows[("test_hog", "eager")]["status"] == "oom"
    assert rows[("test_raises", "eager")]["status"] == "failed"
    assert "this variant always fails" in rows[("test_raises", "eager")]["error"]
    ok = rows[("test_tanh", "eager")]
    assert ok["status"] == "ok" and ok["median_s"] > 0
    assert res.counts == {"crashed": 1, "oom": 1, "failed": 1, "ok": 1}


def test_a_hanging_cell_times_out(db: str, fast: dict, faulty: str) -> None:
    # A short limit is safe here: it counts time without progress, and this cell really makes none.
    fast["isolation"] = {"timeout_s": 4.0, "memory_mb": 2048}
    res = sweep(variants=["test_hang"], backends=["eager", "jit.trace"], batch=[2], seq_len=[3], plugins=[faulty],
                db=db, progress=False, table=False, **fast)
    rows = _rows(db, res.run_id)
    assert {k: r["status"] for k, r in rows.items()} == {("test_hang", "eager"): "timeout",
                                                         ("test_hang", "jit.trace"): "timeout"}
    assert "no progress for 4 s" in rows[("test_hang", "eager")]["error"]


def test_crashing_backend_does_not_lose_the_others(db: str, fast: dict, faulty: str) -> None:
    res = sweep(
        variants=["test_tanh"],
        backends=["eager", "test_crash", "test_wrong", "test_skip", "jit.trace"],
        batch=[2],
        seq_len=[3],
        plugins=[faulty],
        db=db,
        progress=False,
        table=False,
        **fast,
    )
    rows = _rows(db, res.run_id)
    assert {b: r["status"] for (_, b), r in rows.items()} == {
        "eager": "ok",
        "test_crash": "crashed",
        "test_wrong": "mismatch",
        "test_skip": "skipped",
        "jit.trace": "ok",
    }
    assert "during prepare of test_crash" in rows[("test_tanh", "test_crash")]["error"]
    assert "exceeds" in rows[("test_tanh", "test_wrong")]["error"]
    assert rows[("test_tanh", "test_skip")]["error"] == "never applies (test)"
    # the survivors were re-run alone after the crash, and say so
    for b in ("eager", "jit.trace"):
        m = json.loads(rows[("test_tanh", b)]["metrics_json"])
        assert m["alone"] is True and m["interleaved"] is False


def test_process_repeats_pool_samples_and_expose_intermittent_failures(
    db: str, fast: dict, faulty: str, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("MV_FLAKY_MARK", str(tmp_path / "flaky-mark"))
    fast["timing"]["processes"] = 2
    res = sweep(variants=["test_tanh"], backends=["eager", "test_flaky", "test_skip"], batch=[2], seq_len=[3],
                plugins=[faulty], db=db, progress=False, table=False, **fast)
    rows = _rows(db, res.run_id)
    eager = rows[("test_tanh", "eager")]
    m = json.loads(eager["metrics_json"])
    assert eager["status"] == "ok" and m["processes"] == 2 and len(m["process_medians"]) == 2
    assert len(json.loads(eager["samples_json"])) == m["samples"]
    assert eager["ci_low_s"] <= eager["median_s"] <= eager["ci_high_s"]
    flaky = rows[("test_tanh", "test_flaky")]
    assert flaky["status"] == "failed" and flaky["error"].startswith("process 2 of 2:")
    assert rows[("test_tanh", "test_skip")]["status"] == "skipped"
    with open_store(db) as s:
        history = s.cells(res.run_id, latest_only=False)
    # eager: two process rows + the merged row; skip: decided once, not repeated
    assert list(history.groupby("backend").size().sort_index()) == [3, 3, 1]
    assert sorted(m["merged_row_ids"]) == sorted(history[history.backend == "eager"].row_id.iloc[:2])


def test_parent_memory_watchdog_kills_a_worker_over_its_resident_limit(tmp_path) -> None:
    from nnforge.modelview.isolation import run_worker

    # device "cuda" makes the worker skip RLIMIT_AS (as on GPU machines), so only the parent's watchdog can stop it;
    # importing torch alone takes well over 60 MiB of resident memory.
    job = {"kind": "peaks", "threads": 1, "device": "cuda", "dtypes": ["float32"], "measure_peaks": True,
           "out": str(tmp_path / "env.json"), "memory_mb": 60}
    outcome = run_worker(job, tmp_path, timeout_s=120, memory_mb=60, threads=1)
    assert outcome.status == "oom" and "exceeded the limit of 60 MiB" in outcome.error
    assert not (tmp_path / "env.json").exists()


def test_a_device_oom_is_a_row_and_the_settings_next_backend_runs(db: str, fast: dict, faulty: str) -> None:
    res = sweep(variants=["test_tanh"], backends=["test_device_oom", "eager"], batch=[2], seq_len=[3],
                plugins=[faulty], db=db, progress=False, table=False, **fast)
    rows = _rows(db, res.run_id)
    assert rows[("test_tanh", "test_device_oom")]["status"] == "oom"
    assert "CUDA out of memory" in rows[("test_tanh", "test_device_oom")]["error"]
    assert rows[("test_tanh", "eager")]["status"] == "ok"
    assert res.counts == {"oom": 1, "ok": 1}

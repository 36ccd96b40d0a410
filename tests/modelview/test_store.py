"""Store: round trip, latest-row semantics, resume bookkeeping, concurrent writers, kill -9 during writes."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pandas as pd
import pytest

from nnforge.modelview.store import CELL_COLUMN_NAMES, open_store

ROOT = Path(__file__).resolve().parents[2]


def _row(run_id: str, key: str, status: str = "ok", median: float = 1e-3) -> dict:
    return {"run_id": run_id, "cell_key": key, "variant": "v", "backend": "eager", "batch": 4, "seq_len": 8,
            "layout": "TNC", "dtype": "float32", "mode": "inference", "device": "cpu", "params_json": "{}",
            "status": status, "median_s": median, "samples_json": [median] * 3, "metrics_json": {"x": 1}}


def test_round_trip_latest_filters_and_export(db: str, tmp_path: Path):
    with open_store(db) as s:
        rid = s.new_run("n", json.dumps({"seed": 1, "a": 1}), {"git_commit": "abc", "threads": 2})
        s.append_cell(_row(rid, "k1", median=1.0))
        s.append_cell(_row(rid, "k2", status="skipped"))
        s.append_cell(_row(rid, "k1", median=2.0))  # re-measured: newer row wins
        df = s.cells(rid)
        assert list(df.columns) == ["row_id", *CELL_COLUMN_NAMES]
        assert len(df) == 2 and df.set_index("cell_key").loc["k1", "median_s"] == 2.0
        assert len(s.cells(rid, latest_only=False)) == 3
        assert len(s.cells(rid, status="skipped")) == 1
        assert len(s.cells(rid, status=["ok", "skipped"])) == 2
        assert json.loads(df.iloc[0]["samples_json"]) == [2.0] * 3 or json.loads(df.iloc[1]["samples_json"])
        assert s.finished_keys(rid) == {"k1", "k2"} and s.finished_keys(rid, ["ok"]) == {"k1"}
        runs = s.runs()
        assert runs.iloc[0]["run_id"] == rid and json.loads(runs.iloc[0]["env_json"])["git_commit"] == "abc"
        assert s.resolve_run("n") == rid and s.resolve_run(rid[:10]) == rid
        assert s.latest_run("n", json.dumps({"seed": 7, "a": 1})) == rid  # the seed does not distinguish specs
        assert s.latest_run("n", json.dumps({"seed": 1, "a": 2})) is None
        with pytest.raises(KeyError):
            s.resolve_run("nope")
        with pytest.raises(KeyError):
            s.append_cell(_row(rid, "k3") | {"throughputt": 1.0})
        with pytest.raises(ValueError):
            s.append_cell(_row(rid, "k3", status="great"))
        csv, pq = s.export(tmp_path / "c.csv", rid), s.export(tmp_path / "c.parquet", rid)
    assert len(pd.read_csv(csv)) == 2 and len(pd.read_parquet(pq)) == 2


def test_cells_and_export_take_a_run_as_the_commands_do(db: str, tmp_path: Path):
    """A run name reads its latest run; a reference to no run is a KeyError, not an empty frame or file."""
    with open_store(db) as s:
        first = s.new_run("n", json.dumps({"seed": 1}), {})
        s.append_cell(_row(first, "k1", median=1.0))
        time.sleep(0.01)  # runs of one name are ordered by creation time
        rid = s.new_run("n", json.dumps({"seed": 2}), {})
        s.append_cell(_row(rid, "k1", median=3.0))
        s.append_cell(_row(rid, "k2", median=4.0))
        assert sorted(s.cells("n")["median_s"]) == [3.0, 4.0] and len(s.cells(first[:-1])) == 1
        for call in (lambda: s.cells("no-such-run"), lambda: s.export(tmp_path / "x.csv", "no-such-run")):
            with pytest.raises(KeyError, match="no run 'no-such-run'"):
                call()
    assert not (tmp_path / "x.csv").exists()


WRITER = textwrap.dedent(
    """
    import sys
    from nnforge.modelview.store import open_store  # the store imports neither torch nor pandas: a fast start
    db, run_id, tag, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    s = open_store(db)
    for i in range(n):
        s.append_cell({"run_id": run_id, "cell_key": f"{tag}-{i}", "status": "ok", "median_s": 1.0,
                       "samples_json": "[" + ",".join(["1.0"] * 2000) + "]", "metrics_json": "{}",
                       "artifact": "x" * 20000})
        print(i + 1, flush=True)
    """
)


def _writer(db: str, run_id: str, tag: str, n: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WRITER, db, run_id, tag, str(n)],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)


def test_concurrent_writers_lose_nothing(db: str):
    with open_store(db) as s:
        rid = s.new_run("c", "{}", {})
    procs = [_writer(db, rid, f"w{i}", 40) for i in range(3)]
    for p in procs:
        p.communicate(timeout=120)
        assert p.returncode == 0
    with open_store(db) as s:
        keys = set(s.cells(rid)["cell_key"])
    assert keys == {f"w{i}-{j}" for i in range(3) for j in range(40)}


def test_kill_9_during_writes_keeps_every_committed_row(db: str):
    with open_store(db) as s:
        rid = s.new_run("k", "{}", {})
    p = _writer(db, rid, "w", 100000)
    committed = 0
    deadline = time.monotonic() + 60
    stop_after = 20 + uuid.uuid4().int % 60  # a fresh random moment each run
    assert p.stdout is not None
    while committed < stop_after and time.monotonic() < deadline:
        committed = int(p.stdout.readline())
    p.send_signal(signal.SIGKILL)  # most likely in the middle of the next row's transaction
    p.wait()
    assert p.returncode == -signal.SIGKILL
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    con.close()
    with open_store(db) as s:
        df = s.cells(rid)
    assert len(df) >= committed  # every row reported as committed is there (maybe one more that committed)
    assert len(df) <= committed + 1
    for _, r in df.iterrows():  # and no row is torn
        assert len(json.loads(r["samples_json"])) == 2000 and len(r["artifact"]) == 20000

"""``nnforge merge``: stores from two (simulated) machines in one, merged twice without duplicates; every row keeps its
machine, and the report, the web view and ``compare`` say when numbers of different machines meet."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from report_synth import ENV, add_run, bulk_insert, cell_row, new_db, small_rows
from typer.testing import CliRunner

from nnforge.cli import app
from nnforge.modelview.compare import compare_runs
from nnforge.modelview.report.build import build_report
from nnforge.modelview.report.data import Database
from nnforge.modelview.store import Store
from nnforge.modelview.web import running

RUNNER = CliRunner()
ALPHA = {"hostname": "alpha", "cpu_model": "Synthetic CPU A", "cpu_count": 8, "memory_bytes": 2**35, "gpus": [],
         "platform": "Linux"}
BETA = {**ALPHA, "hostname": "beta", "cpu_model": "Synthetic CPU B", "gpus": ["Synthetic GPU"]}


def _write(path: Path, run_id: str, machine: str, fp: dict, scale: float) -> int:
    """The rows of small_rows(run_id) as a runner on ``machine`` writes them (one durable row at a time)."""
    rows = small_rows(run_id, scale)
    with Store(path) as s:
        if s.run(run_id) is None:
            s.new_run("small", '{"name": "small", "variants": ["x"]}', ENV, run_id=run_id)
        s.add_machine(machine, fp)
        for r in rows:
            s.append_cell({**r, "machine_id": machine})
    return len(rows)


def _count(path: Path) -> tuple[int, int]:
    con = sqlite3.connect(path)
    try:
        return (con.execute("SELECT COUNT(*) FROM cells").fetchone()[0],
                con.execute("SELECT COUNT(DISTINCT row_uid) FROM cells").fetchone()[0])
    finally:
        con.close()


def test_merge_twice_adds_nothing_and_keeps_machines(tmp_path: Path) -> None:
    a, b, out = tmp_path / "alpha.db", tmp_path / "beta.db", tmp_path / "all.db"
    na = _write(a, "run-alpha", "alpha-1", ALPHA, 1.0)
    nb = _write(b, "run-beta", "beta-2", BETA, 1.3)
    r = RUNNER.invoke(app, ["merge", str(a), str(b), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert f"2 runs and {na + nb} rows added, 0 rows already present" in r.output
    assert _count(out) == (na + nb, na + nb)
    r = RUNNER.invoke(app, ["merge", str(a), str(b), "-o", str(out)])  # again: nothing new
    assert r.exit_code == 0 and f"0 runs and 0 rows added, {na + nb} rows already present" in r.output, r.output
    r = RUNNER.invoke(app, ["merge", str(out), str(a), "-o", str(out)])  # a store into itself and a part of it
    assert r.exit_code == 0 and "0 rows added" in r.output, r.output
    assert _count(out) == (na + nb, na + nb)
    with Store(out) as s:
        assert s.machines() == {"alpha-1": ALPHA, "beta-2": BETA}
        assert set(s.cells("run-alpha")["machine_id"]) == {"alpha-1"}
        assert set(s.cells("run-beta")["machine_id"]) == {"beta-2"}
        with Store(a) as sa:  # rows are the same rows, not copies with new identities
            assert set(sa.cells("run-alpha")["row_uid"]) == set(s.cells("run-alpha")["row_uid"])
    _, _, _, notes = compare_runs(out, "run-alpha", "run-beta")
    assert notes and notes[0].startswith("different machines: A was measured on alpha-1, B on beta-2")
    _, _, _, same = compare_runs(a, "run-alpha", "run-alpha")
    assert not any("different machines" in n for n in same)


def test_a_run_over_two_machines_is_flagged_and_filterable(tmp_path: Path) -> None:
    a, b, out = tmp_path / "a.db", tmp_path / "b.db", tmp_path / "all.db"
    _write(a, "run-x", "alpha-1", ALPHA, 1.0)
    shutil.copy(a, b)  # the store went to a second machine, which measured the same cells again
    _write(b, "run-x", "beta-2", BETA, 1.3)
    r = RUNNER.invoke(app, ["merge", str(a), str(b), "-o", str(out)])
    assert r.exit_code == 0 and "1 runs" in r.output, r.output
    db = Database(out)
    assert {c.machine_id for c in db.cells("run-x")} == {"beta-2"}  # latest row per cell: the later measurement
    with Store(out) as s:
        assert len(s.cells("run-x", latest_only=False)) == 2 * len(db.cells("run-x"))
    # a run whose latest rows come from two machines: half the cells re-measured on beta
    c, out2 = tmp_path / "c.db", tmp_path / "mixed.db"
    rows = small_rows("run-m")
    with Store(c) as s:
        s.new_run("mixed", '{"name": "mixed"}', ENV, run_id="run-m")
        for i, row in enumerate(rows):
            s.append_cell({**row, "machine_id": "alpha-1" if i % 2 else "beta-2"})
    assert RUNNER.invoke(app, ["merge", str(c), "-o", str(out2)]).exit_code == 0
    notices = build_report(out2, run_id="run-m").notices
    assert any("measured on 2 machines (alpha-1, beta-2)" in n for n in notices), notices
    only = Database(out2).cells("run-m", {"machine_id": ["alpha-1"]})
    assert only and {x.machine_id for x in only} == {"alpha-1"}
    import urllib.request

    with running(out2) as url:
        html = urllib.request.urlopen(url + "/runs/run-m").read().decode()
        assert 'id="machines-notice"' in html and 'name="machine_id"' in html
        one = urllib.request.urlopen(url + "/runs/run-m?machine_id=alpha-1").read().decode()
        assert 'id="machines-notice"' not in one and f"Filtered view: {len(only)} cells" in one


def test_old_rows_get_stable_identities(tmp_path: Path) -> None:
    """Rows written before stores had uids and machines (bulk insert, NULL columns) merge once, under a machine
    derived from their run's environment."""
    old, out = tmp_path / "old.db", tmp_path / "all.db"
    new_db(old)
    rid = add_run(old, "old", env={**ENV, "hostname": "gamma", "cpu_count": 4})
    n = bulk_insert(old, [cell_row(rid, "lstm", be, 4, 8, 1e-3, seed=i) for i, be in enumerate(("eager", "x"))])
    for _ in range(2):
        assert RUNNER.invoke(app, ["merge", str(old), "-o", str(out)]).exit_code == 0
    assert _count(out) == (n, n)
    with Store(out) as s:
        (mid,) = set(s.cells(rid)["machine_id"])
        assert mid.startswith("gamma-") and s.machines()[mid]["from"] == "run environment"


def test_written_rows_carry_this_machine(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    with Store(db) as s:
        rid = s.new_run("r", "{}", ENV)
        s.append_cell(cell_row(rid, "lstm", "eager", 4, 8, 1e-3))
        (mid,) = set(s.cells(rid)["machine_id"])
        assert mid == s.machine_id() and s.machines()[mid]["cpu_count"] >= 1


@pytest.mark.parametrize("bad", ["missing", "not_a_store"])
def test_bad_sources_are_one_line_errors_and_change_nothing(tmp_path: Path, bad: str) -> None:
    good, out = tmp_path / "good.db", tmp_path / "all.db"
    _write(good, "run-g", "alpha-1", ALPHA, 1.0)
    src = tmp_path / "x.db"
    if bad == "not_a_store":
        sqlite3.connect(src).execute("CREATE TABLE t(x)").connection.close()
    r = RUNNER.invoke(app, ["merge", str(good), str(src), "-o", str(out)])
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert ("no store at" if bad == "missing" else "is not a ModelView store") in r.output
    assert not out.exists() or _count(out) == (0, 0)

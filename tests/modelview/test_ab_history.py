"""``nnforge ab`` and ``nnforge history`` on a throwaway repository: revisions in one interleaved schedule, steps
named at the commits that made them: 50 % (ab) and 30 % (history) more CPU work, beyond a loaded machine's noise."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nnforge.cli import app
from nnforge.modelview import open_store
from nnforge.modelview.ab import blocks_of
from nnforge.modelview.interleave import shared_cpus

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from revision_repo import make_repo  # bench/'s throwaway repository, as bench/modelview_ab.py uses it

RUNNER = CliRunner()


def _metrics(m: str | dict) -> dict:
    return json.loads(m) if isinstance(m, str) else m


@pytest.mark.timing
def test_ab_finds_and_sizes_a_slowdown_and_gates_on_it(tmp_path: Path):
    repo = tmp_path / "repo"
    c = make_repo(repo, [20, 30])  # 50 % more layers
    db = tmp_path / "ab.db"
    args = ["ab", c[0], c[1], "--spec", str(repo / "bench.toml"), "--repo", str(repo), "--db", str(db),
            "--worktrees", str(tmp_path / "wt"), "--json"]
    r = RUNNER.invoke(app, [*args, "--fail-on", "10%"])
    assert r.exit_code == 1, r.output
    out = json.loads(r.output)
    (cell,) = out["cells"]
    assert cell["verdict"] == "slower" and 0.2 < cell["change"] < 0.8 and out["regressions"]  # call overhead dilutes
    with open_store(db) as s:
        rows = s.cells(out["run_id"])
    assert sorted(rows["backend"]) == sorted([f"eager@{c[0][:10]}", f"eager@{c[1][:10]}"])
    assert (rows["status"] == "ok").all()
    cpus = {json.dumps(m["cpus"]) for m in rows["metrics_json"].map(_metrics)}
    assert len(cpus) == 1 and cpus == {json.dumps(shared_cpus(1))}  # both revisions ran on the same CPU
    r = RUNNER.invoke(app, ["ab", c[0], "nope", "--spec", str(repo / "bench.toml"), "--repo", str(repo), "--db",
                            str(db), "--worktrees", str(tmp_path / "wt")])
    assert r.exit_code == 2 and "unknown revision 'nope'" in r.output


@pytest.mark.timing
def test_history_flags_both_steps_at_their_commits_and_no_other(tmp_path: Path):
    repo = tmp_path / "repo"
    c = make_repo(repo, [20, 26, None, 20])  # 30 % more layers at 1, unrelated 2, removed at 3
    args = ["history", f"{c[0]}..{c[3]}", "--spec", str(repo / "bench.toml"), "--repo", str(repo), "--db",
            str(tmp_path / "h.db"), "--worktrees", str(tmp_path / "wt"), "--json", "--threshold", "10%"]
    r = RUNNER.invoke(app, [*args, "--check"])
    assert r.exit_code == 1, r.output  # --check: a slowdown step
    out = json.loads(r.output)
    assert out["commits"] == c
    (cell,) = out["cells"]
    assert cell["steps"] == [c[1], c[3]]
    assert [s["commit"] for s in out["slowdowns"]] == [c[1]]
    ratios = [p["ratio_to_reference"] for p in cell["points"]]
    assert ratios[0] == 1.0 and ratios[1] > 1.15 and ratios[2] > 1.15 and abs(ratios[3] - 1) < 0.1
    from nnforge.modelview.report.build import build_report
    from nnforge.modelview.web.queries import run_figures

    fig = build_report(tmp_path / "h.db").figure("revisions")  # the report's chart marks the same commits
    (trace,) = fig.plot["data"]
    assert [bool(t) for t in trace["text"]] == [False, True, False, True]
    from nnforge.modelview.report.data import Database

    db = Database(tmp_path / "h.db")
    web = run_figures(db, db.runs()[-1], {})["figures"]
    assert web[0]["id"] == "revisions"


def test_blocks_share_the_reference_and_overlap():
    commits = [f"c{i}" for i in range(8)]
    assert blocks_of(commits[:4], 6) == [commits[:4]]
    blocks = blocks_of(commits, 4)
    assert all(b[0] == "c0" for b in blocks) and len(blocks) == 3
    assert blocks == [["c0", "c1", "c2", "c3"], ["c0", "c3", "c4", "c5"], ["c0", "c5", "c6", "c7"]]


def test_round_servers_of_a_setting_share_their_cpus():
    """Every revision's round server gets the same CPUs (the last ``threads`` of this process's), none pinned when
    the threads take every CPU."""
    import os

    allowed = sorted(os.sched_getaffinity(0))
    assert shared_cpus(len(allowed)) is None and shared_cpus(0) is None
    if len(allowed) > 1:
        assert shared_cpus(1) == allowed[-1:] and shared_cpus(len(allowed) - 1) == allowed[1:]

"""``nnforge ab`` and ``nnforge history`` on a throwaway repository: revisions in one interleaved schedule, steps
named at the commits that made them: 50 % (ab) and 30 % (history) more CPU work, beyond a loaded machine's noise."""

from __future__ import annotations

import io
import json
import random
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from nnforge.cli import app
from nnforge.modelview import open_store
from nnforge.modelview.ab import ab_cells, ab_untimed, blocks_of, broken, history_cells, history_untimed, print_ab
from nnforge.modelview.interleave import Series, SettingResult, shared_cpus
from nnforge.modelview.revisions import Revision
from nnforge.modelview.spec import Cell

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from revision_repo import git, make_repo  # bench/'s throwaway repository, as bench/modelview_ab.py uses it

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


def test_ab_fails_on_a_cell_the_later_revision_broke(tmp_path: Path):
    """Through the command: the cell B cannot time is named under the table and in --json, and --fail-on exits 1."""
    repo = tmp_path / "repo"
    (c0,) = make_repo(repo, [2])
    plugin = repo / "work.py"
    plugin.write_text(plugin.read_text().replace("        return x\n", "        raise RuntimeError('REPEAT broke')\n"))
    git(repo, "commit", "-q", "-am", "break the forward")
    c1 = git(repo, "rev-parse", "HEAD")
    args = ["ab", c0, c1, "--spec", str(repo / "bench.toml"), "--repo", str(repo), "--db", str(tmp_path / "ab.db"),
            "--worktrees", str(tmp_path / "wt"), "--fail-on", "10%"]
    r = RUNNER.invoke(app, [*args, "--json"])
    assert r.exit_code == 1, r.output
    out = json.loads(r.output)
    assert out["cells"] == [] and out["regressions"] == [] and len(out["broken"]) == 1
    (lost,) = out["untimed"]
    assert lost["before"] == "ok" and lost["after"] == "failed" and "REPEAT broke" in lost["reason"]
    r = RUNNER.invoke(app, args[:-2])  # without --fail-on: said, not gated
    assert r.exit_code == 0 and "status ok → failed: work" in r.output and "REPEAT broke" in r.output


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


def _series(rng: random.Random, scale: float, rounds: int = 12, per: int = 3) -> Series:
    """Seeded samples around ``scale`` seconds, ``per`` a round, as a round server returns them."""
    s = Series()
    for r in range(rounds):
        s.samples += [scale * rng.uniform(0.95, 1.05) for _ in range(per)]
        s.rounds += [r] * per
        s.processes += [0] * per
    return s


def _setting(rng: random.Random, revisions: dict[str, list[str]], hidden: int = 16) -> SettingResult:
    """One setting of backends whose status per revision is given ("ok", "failed": the series' error, "crashed":
    a failure row, "late": ok samples and then a failure row from a later process)."""
    cells = [Cell("lstm_manual", b, 4, 8, "TNC", "float32", "inference", "cpu", (("hidden", hidden),))
             for b in revisions]
    res = SettingResult(cells, {}, {})
    for b, statuses in revisions.items():
        for i, st in enumerate(statuses):
            if st in ("ok", "failed", "late"):
                res.series[(i, b)] = _series(rng, rng.uniform(1e-3, 2e-3))
            if st == "failed":
                res.series[(i, b)].error = 'Traceback (most recent call last):\n  File "x.py"\nRuntimeError: boom'
            if st in ("crashed", "late"):
                res.failures[(i, b)] = {"status": "crashed", "error": "worker killed by SIGSEGV (during timing)"}
    return res


def test_ab_says_which_cells_lost_their_time_and_gates_on_them():
    """A cell failed in B and ok in A is neither judged nor silent: a note with B's reason, and ``broken`` (what
    ``--fail-on`` gates on) names it; a cell failed in A and ok in B, or failed in both, is a note only."""
    rng = random.Random(7)
    res = _setting(rng, {"eager": ["ok", "ok"], "jit.script": ["ok", "failed"], "compile": ["failed", "ok"],
                         "onnxruntime": ["crashed", "crashed"], "jit.trace": ["ok", "late"]})
    judged = ab_cells([res], 0.02, 0.99)
    assert [c.backend for c in judged] == ["eager"]  # a later process's failure makes the cell failed, as stored
    untimed = ab_untimed([res])
    got = {(u.backend, u.before, u.after) for u in untimed}
    assert got == {("jit.script", "ok", "failed"), ("compile", "failed", "ok"), ("onnxruntime", "crashed", "crashed"),
                   ("jit.trace", "ok", "crashed")}
    assert sorted(u.backend for u in broken(untimed)) == ["jit.script", "jit.trace"]
    by = {u.backend: u for u in untimed}
    assert by["jit.script"].reason == "RuntimeError: boom" and by["compile"].reason == "RuntimeError: boom"
    assert by["jit.script"].as_dict()["broke"] and not by["compile"].as_dict()["broke"]
    con = Console(width=80, record=True, file=io.StringIO())
    revs = [Revision(n, c * 40, "", Path(".")) for n, c in (("main", "a"), ("topic", "b"))]
    print_ab(judged, *revs, con, untimed)
    lines = con.export_text().splitlines()
    label = "lstm_manual N=4 T=8 TNC float32 inference cpu [hidden=16]"
    assert f"status ok → failed: {label} jit.script: RuntimeError: boom" in lines  # one line, not hard-wrapped
    assert f"crashed in A and B: {label} onnxruntime: worker killed by SIGSEGV (during timing)" in lines
    assert f"status failed → ok: {label} compile: RuntimeError: boom" in lines


def test_history_says_at_which_commit_a_cell_broke_and_was_fixed():
    """A commit that breaks a cell has no point to call a step: ``history_untimed`` names it (``broken``: what
    ``--check`` gates on) and the commit that fixed it; a reference without a time is one note; a commit measured
    in two blocks is failed if it failed in either."""
    rng = random.Random(11)
    commits = ["c0", "c1", "c2", "c3"]
    revs = {c: _rev(c) for c in commits}
    block1 = ([revs[c] for c in ("c0", "c1", "c2")],
              [_setting(rng, {"eager": ["ok", "ok", "ok"], "jit.script": ["ok", "failed", "ok"],
                              "compile": ["crashed", "crashed", "crashed"]})])
    block2 = ([revs[c] for c in ("c0", "c2", "c3")],
              [_setting(rng, {"eager": ["ok", "crashed", "ok"], "jit.script": ["ok", "ok", "ok"],
                              "compile": ["crashed", "crashed", "crashed"]})])
    untimed = history_untimed([block1, block2], commits)
    got = [(u.backend, u.commit, u.before, u.after) for u in untimed]
    assert got == [("eager", "c2", "ok", "crashed"), ("eager", "c3", "crashed", "ok"),  # c2 crashed in block 2
                   ("jit.script", "c1", "ok", "failed"), ("jit.script", "c2", "failed", "ok"),
                   ("compile", "c0", None, "crashed")]
    assert [(u.backend, u.commit) for u in broken(untimed)] == [("eager", "c2"), ("jit.script", "c1")]
    assert untimed[-1].note().startswith("crashed at c0 (subject c0), the reference: lstm_manual N=4")
    assert untimed[2].note() == ("status ok → failed at c1 (subject c1): lstm_manual N=4 T=8 TNC float32 inference "
                                 "cpu [hidden=16] jit.script: RuntimeError: boom")
    cells = {hc.backend: hc for hc in history_cells([block1, block2], commits, 0.05, 0.99)}
    assert [p.commit for p in cells["jit.script"].points] == ["c0", "c2", "c3"]  # no point where it failed
    assert "compile" not in cells  # nothing to plot without the reference: the note says why


def _rev(commit: str) -> Revision:
    """A revision named by its commit, with a subject to show in notes."""
    return Revision(commit, commit, f"subject {commit}", Path("."))

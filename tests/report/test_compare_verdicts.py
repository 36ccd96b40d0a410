"""One rule for "did it change": ``nnforge compare`` (table, --json, --fail-on) and the web view's compare page give
the same verdict for every cell, on runs of a drifting machine."""

from __future__ import annotations

import json
from pathlib import Path

import report_synth as synth
from typer.testing import CliRunner

from nnforge.cli import app

RUNNER = CliRunner()


def _json(db: Path, a: str, b: str, *extra: str) -> tuple[int, dict]:
    r = RUNNER.invoke(app, ["compare", a, b, "--db", str(db), "--json", *extra])
    return r.exit_code, json.loads(r.output)


def test_cli_verdicts_gate_and_json(tmp_path: Path) -> None:
    db = tmp_path / "drift.db"
    a, b, c = synth.make_drifting(db)
    code, same = _json(db, a, b, "--noise-floor", "1%", "--time-noise-floor", "20%", "--fail-on", "5%")
    assert code == 0 and len(same["cells"]) == 18 and same["regressions"] == []
    judged = [x for x in same["cells"] if x["figure"] == "vs eager"]
    assert len(judged) == 12 and all(x["verdict"] in ("no change", "inconclusive") for x in judged)
    code, slow = _json(db, a, c, "--noise-floor", "1%", "--time-noise-floor", "20%", "--fail-on", "5%")
    regressed = {x["cell_key"] for x in slow["cells"] if x["verdict"] == "slower"}
    assert code == 1 and set(slow["regressions"]) == regressed
    assert regressed == {x["cell_key"] for x in slow["cells"] if x["backend"] == "jit.script"}
    assert all(abs(x["change"] - 0.10) < 0.03 for x in slow["cells"] if x["backend"] == "jit.script")
    code, _ = _json(db, a, c, "--noise-floor", "1%", "--time-noise-floor", "20%", "--fail-on", "20%")
    assert code == 0  # a 10 % regression does not trip a 20 % gate
    r = RUNNER.invoke(app, ["compare", a, c, "--db", str(db), "--noise-floor", "1%"])
    assert r.exit_code == 0 and "slower" in r.output and "Traceback" not in r.output
    r = RUNNER.invoke(app, ["compare", a, c, "--db", str(db), "--fail-on", "five"])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "--fail-on 'five'" in r.output


def test_web_view_gives_the_cli_verdicts(tmp_path: Path) -> None:
    from nnforge.modelview.report.data import Database
    from nnforge.modelview.web import running
    from nnforge.modelview.web.compare import compare

    db = tmp_path / "drift.db"
    a, _, c = synth.make_drifting(db)
    _, cli = _json(db, a, c)
    store = Database(db)
    ca, cc = store.cells(a), store.cells(c)
    sa, sc = store.samples(a, [x.cell_key for x in ca]), store.samples(c, [x.cell_key for x in cc])
    pairs, _ = compare(ca, cc, sa, sc, specs=(store.run(a).spec, store.run(c).spec))
    web = {p.a.cell_key: p.change.verdict.verdict for p in pairs}
    assert web == {x["cell_key"]: x["verdict"] for x in cli["cells"]}
    assert "slower" in web.values()
    wall, _ = compare(ca, cc, sa, sc, specs=({}, {}))  # wall-clock runs: a larger between-run noise floor
    assert "slower" not in {p.verdict for p in wall} and len(wall) == len(pairs)
    with running(db) as url:
        import urllib.request

        html = urllib.request.urlopen(f"{url}/compare?a={a}&b={c}", timeout=30).read().decode()
    n_slow = sum(v == "slower" for v in web.values())
    assert html.count('data-verdict="slower"') == n_slow and f"▼ {n_slow} slower" in html

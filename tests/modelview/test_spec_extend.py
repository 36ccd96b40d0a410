"""A spec file completed by flags or keywords, and a resumed run whose grid was extended: the stored spec and the
report follow what the user asked for, not only what the file or the first invocation said."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

from typer.testing import CliRunner

from nnforge.cli import app
from nnforge.modelview import open_store
from nnforge.modelview.report.build import build_report
from nnforge.modelview.spec import SpecError, load_spec

RUNNER = CliRunner()


def _toml(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "spec.toml"
    path.write_text(body)
    return path


def test_a_file_without_variants_is_completed_by_flags(tmp_path: Path) -> None:
    spec = _toml(tmp_path, 'name = "tiny"\nbatch = [2, 4]\nseq_len = [3]\n[params]\nhidden = 16\n')
    loaded = load_spec(spec, {"variants": ["lstm_manual"], "backends": ["eager"]})
    assert loaded.variants == ("lstm_manual",) and loaded.batch == (2, 4) and loaded.params == {"hidden": 16}
    loaded = load_spec({"batch": [8]}, {"variants": ["lstm_manual"]})  # a mapping, as `sweep(dict, variants=...)`
    assert loaded.variants == ("lstm_manual",) and loaded.batch == (8,)
    r = RUNNER.invoke(app, ["sweep", str(spec), "-v", "lstm_manual", "-b", "eager", "--dry-run",
                            "--db", str(tmp_path / "x.db")])
    assert r.exit_code == 0 and "2 cells in 2 settings" in r.output, r.output
    r = RUNNER.invoke(app, ["sweep", str(spec), "--dry-run", "--db", str(tmp_path / "x.db")])
    assert r.exit_code == 2 and r.output == "error: invalid spec: variants = None: required: at least one variant\n"


def test_a_bad_value_in_the_file_is_still_named_when_flags_are_given(tmp_path: Path) -> None:
    spec = _toml(tmp_path, 'variants = ["lstm_manual"]\nlayout = ["CNT"]\ntiming = 5\n')
    for overrides, key in (({"batch": [2]}, "layout"), ({"layout": ["TNC"], "timing": {"budget_s": 1.0}}, "timing")):
        try:
            load_spec(spec, overrides)
        except SpecError as e:
            assert e.key == key, e
        else:
            raise AssertionError(f"{overrides}: the file's bad {key} was accepted")


def _spec(tmp_path: Path, faulty: str, batch: str) -> Path:
    return _toml(tmp_path, f'name = "ext"\nvariants = ["test_tanh"]\nbackends = ["eager"]\nbatch = {batch}\n'
                           f'seq_len = [3]\nplugins = ["{faulty}"]\nmeasure_peaks = false\nseed = 7\n\n[timing]\n'
                           'budget_s = 0.1\nwarmup_max_s = 0.05\nmin_samples = 5\nthreads = 1\ntarget_rel_ci = 0.05\n')


def test_resuming_with_an_extended_grid_stores_the_extended_spec(tmp_path: Path, faulty: str) -> None:
    db = tmp_path / "r.db"
    base = ["--db", str(db), "--quiet"]
    r = RUNNER.invoke(app, ["sweep", str(_spec(tmp_path, faulty, "[2]")), *base])
    assert r.exit_code == 0, r.output
    run = re.findall(r"^\d{8}-\d{6}-\w+$", r.output, re.M)[-1]
    r = RUNNER.invoke(app, ["sweep", str(_spec(tmp_path, faulty, "[2, 3]")), *base, "--resume"])
    assert r.exit_code == 0 and "extended grid" in r.output and run in r.output, r.output
    with open_store(db) as s:
        stored = json.loads(s.run(run)["spec_json"])
        assert stored["batch"] == [2, 3] and stored["seed"] == 7 and s.run_ids() == [run]
    with sqlite3.connect(db) as con:  # as if interrupted before the new cell was measured
        con.execute("DELETE FROM cells WHERE run_id = ? AND batch = 3", (run,))
    report = build_report(db, run)
    assert ("batch", "2, 3") in report.spec_rows or ("batch", "[2, 3]") in report.spec_rows, report.spec_rows
    assert any("1 of 2 planned cells not measured" in n for n in report.notices), report.notices
    r = RUNNER.invoke(app, ["sweep", str(_spec(tmp_path, faulty, "[2, 3]")), *base, "--resume"])
    assert r.exit_code == 0 and "extended grid" not in r.output, r.output  # now the same spec: a plain resume
    with open_store(db) as s:
        assert sorted(s.cells(run)["batch"]) == [2, 3]

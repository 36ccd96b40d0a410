"""The command line: spec errors exit 2 naming key and value; a TOML sweep, --resume, --force, --export; compare."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
from typer.testing import CliRunner

from nnforge.cli import app
from nnforge.modelview import open_store

RUNNER = CliRunner()


def test_invalid_flags_fail_before_anything_runs(tmp_path: Path):
    db = tmp_path / "x.db"
    r = RUNNER.invoke(app, ["sweep", "-v", "lstm_manual", "-b", "eager", "--layout", "CNT", "--db", str(db)])
    assert r.exit_code == 2 and "layout = 'CNT'" in r.output
    r = RUNNER.invoke(app, ["sweep", "-v", "lstm_manual", "-p", "hidden=0", "--db", str(db)])
    assert r.exit_code == 2 and "params.hidden = 0" in r.output
    assert not db.exists()  # nothing ran, not even the store was created


def test_listing_commands():
    r = RUNNER.invoke(app, ["variants"])
    assert r.exit_code == 0 and "lstm_combined" in r.output and "bonito" in r.output
    r = RUNNER.invoke(app, ["backends"])
    assert r.exit_code == 0 and "onnxruntime" in r.output and "nnforge.reference" in r.output


def test_toml_sweep_resume_force_export_and_compare(tmp_path: Path, faulty: str):
    db = tmp_path / "cli.db"
    spec = tmp_path / "spec.toml"
    spec.write_text(
        f'name = "cli"\nvariants = ["test_tanh"]\nbackends = ["eager", "jit.trace"]\nbatch = [2]\nseq_len = [3]\n'
        f'plugins = ["{faulty}"]\nmeasure_peaks = false\n\n[timing]\nbudget_s = 0.1\nwarmup_max_s = 0.05\n'
        "min_samples = 5\nthreads = 1\ntarget_rel_ci = 0.05\n"
    )
    base = ["sweep", str(spec), "--db", str(db), "--quiet"]
    r = RUNNER.invoke(app, [*base, "--export", str(tmp_path / "out.csv")])
    assert r.exit_code == 0, r.output
    run_a = re.findall(r"^\d{8}-\d{6}-\w+$", r.output, re.M)[-1]
    assert len(pd.read_csv(tmp_path / "out.csv")) == 2
    r = RUNNER.invoke(app, [*base, "--resume"])
    assert r.exit_code == 0 and run_a in r.output
    with open_store(db) as s:
        assert len(s.cells(run_a, latest_only=False)) == 2  # resume found nothing left to do
    r = RUNNER.invoke(app, [*base, "--resume", "--force"])
    assert r.exit_code == 0
    with open_store(db) as s:
        assert len(s.cells(run_a, latest_only=False)) == 4 and len(s.cells(run_a)) == 2
    r = RUNNER.invoke(app, base)  # without --resume: a new run
    run_b = re.findall(r"^\d{8}-\d{6}-\w+$", r.output, re.M)[-1]
    assert run_b != run_a
    r = RUNNER.invoke(app, ["compare", run_a, run_b, "--db", str(db)])
    assert r.exit_code == 0, r.output
    assert "2 cells:" in r.output and "inconclusive" in r.output
    r = RUNNER.invoke(app, ["compare", run_a, "nope", "--db", str(db)])
    assert r.exit_code == 2 and "nope" in r.output

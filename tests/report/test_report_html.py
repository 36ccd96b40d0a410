"""``write_report`` and ``nnforge report``: one offline HTML file, for every kind of store."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from nnforge.cli import app
from nnforge.modelview.report import write_report
from nnforge.modelview.report.plotlyjs import plotly_js_text


def _check_offline(html: str) -> None:
    assert not re.search(r"<script[^>]+src=", html), "the report must not load scripts from anywhere"
    assert not re.search(r"<link[^>]+href=[\"']?https?:", html), "nor stylesheets"
    assert "Plotly.newPlot" in html and plotly_js_text() in html  # plotly.js inline


def test_report_file_is_self_contained(small_db: Path, tmp_path: Path) -> None:
    out = write_report(small_db, tmp_path / "sub" / "r.html", run_id="run-a")
    html = Path(out).read_text()
    _check_offline(html)
    for fid in ("max_throughput", "scaling_batch", "scaling_seq", "speedup", "roofline", "compile", "latency"):
        assert f'id="fig-{fid}"' in html
    assert 'id="fig-gpu-empty"' in html
    assert "RuntimeError: kernel launch failed" in html and "tensorrt is not installed" in html
    assert "</script><b>x</b>" not in html  # an error message cannot break out of the page
    assert "Synthetic CPU @ 3.0GHz" in html
    assert Path(out).stat().st_mode & 0o044  # readable by others


def test_report_edge_cases(empty_db: Path, failed_db: Path, tmp_path: Path) -> None:
    html = Path(write_report(empty_db, tmp_path / "e.html")).read_text()
    assert 'id="no-runs"' in html
    html = Path(write_report(failed_db, tmp_path / "f.html")).read_text()
    assert "timeout: reason 1" in html and "Failed and skipped cells (5)" in html


def test_cli_report(small_db: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "cli.html"
    res = runner.invoke(app, ["report", str(small_db), "-o", str(out), "--run", "run-a"])
    assert res.exit_code == 0, res.output
    assert str(out) in res.output.replace("\n", "") and out.exists()
    res = runner.invoke(app, ["report", str(tmp_path / "none.db"), "-o", str(out)])
    assert res.exit_code == 2 and "no ModelView database" in res.output
    assert not (tmp_path / "none.db").exists()
    res = runner.invoke(app, ["report", str(small_db), "--run", "nope"])
    assert res.exit_code == 2 and "no run 'nope'" in res.output

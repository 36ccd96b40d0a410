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


def test_the_gpu_example_stores_of_the_docs_draw(tmp_path: Path) -> None:
    """docs/report.md's examples are real GPU stores: each still opens with this store's schema and draws the GPU
    metrics chart (a copy: the files under docs/ stay as measured); the Triton one has nnforge.triton cells."""
    examples = sorted((Path(__file__).resolve().parents[2] / "docs" / "examples").glob("*.db"))
    assert {p.name for p in examples} >= {"h200-half.db", "h200-triton.db"}
    for db in examples:
        copy = tmp_path / db.name
        copy.write_bytes(db.read_bytes())
        html = Path(write_report(copy, tmp_path / f"{db.stem}.html")).read_text()
        _check_offline(html)
        assert 'id="fig-gpu"' in html and "NVIDIA H200" in html, db.name
    assert "nnforge.triton" in (tmp_path / "h200-triton.html").read_text()

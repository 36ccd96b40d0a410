"""Assemble a report: read one run, build every figure, render one self-contained HTML file.

The file embeds plotly.js inline (about 4.8 MB) rather than linking a CDN, so it opens on an air-gapped machine, from
an e-mail attachment or a CI artefact years later, exactly as it looked when written.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .common import FigureSpec, fmt_si
from .data import CellRow, Database, RunInfo
from .figures import common_setting, max_throughput, scaling, speedup
from .figures_perf import compile_vs_steady, flatten, gpu, gpu_metrics_of, latency, latency_cells, roofline
from .notices import apply, planned_cells, run_notices
from .plotdict import plot_json
from .plotlyjs import plotly_js_text
from .revisions import revisions_figure

MAX_PROBLEM_ROWS = 500  # failed/skipped cells listed in a report; the rest are counted


@dataclass(frozen=True)
class Report:
    """Everything a report page shows, before rendering (the tests check this, the templates draw it)."""

    db_path: str
    runs: list[RunInfo]
    run: RunInfo | None
    figures: list[FigureSpec] = field(default_factory=list)
    problems: list[CellRow] = field(default_factory=list)
    problems_total: int = 0
    throttled: list[tuple[CellRow, list[str]]] = field(default_factory=list)
    headline: str = ""
    notices: list[str] = field(default_factory=list)  # unfinished run, busy machine, missed CI targets

    def figure(self, fid: str) -> FigureSpec:
        return next(f for f in self.figures if f.id == fid)

    @property
    def env_rows(self) -> list[tuple[str, str]]:
        if self.run is None:
            return []
        return [(k, _show(v)) for k, v in flatten(self.run.env)]

    @property
    def spec_rows(self) -> list[tuple[str, str]]:
        if self.run is None:
            return []
        return [(k, _show(v)) for k, v in flatten(self.run.spec)]


def _show(v: Any) -> str:
    if isinstance(v, list | tuple):
        return ", ".join(map(str, v)) or "–"
    return "–" if v is None or v == {} else str(v)


def build_figures(cells: list[CellRow], run: RunInfo, samples: dict[str, tuple[float, ...]]) -> list[FigureSpec]:
    """All figures of one run, in page order: backends at a common setting, then the seed chart (each at its best)."""
    return [
        common_setting(cells),
        max_throughput(cells),
        scaling(cells, "batch"),
        scaling(cells, "seq_len"),
        speedup(cells),
        roofline(cells, run.env),
        compile_vs_steady(cells),
        latency(cells, samples),
        gpu(cells),
    ]


def headline(cells: list[CellRow]) -> str:
    ok = [c for c in cells if c.ok]
    if not ok:
        return "No successful cells."
    best = max(ok, key=lambda c: c.throughput or 0)
    return (
        f"Best: {best.model_label} on {best.backend} at {best.shape_label} ({best.group_label}): "
        f"{fmt_si(best.throughput)} {best.throughput_unit}"  # its own unit: variants may count different items
    )


def build_report(db_path: str | Path, run_id: str | None = None) -> Report:
    """Read the run (default: the latest) and build its figures and tables."""
    db = Database(db_path)
    runs = db.runs()
    run = db.run(run_id) if runs or run_id else None
    if run is None:
        return Report(db_path=str(db_path), runs=runs, run=None, headline="This database holds no runs yet.")
    cells = db.cells(run.run_id)
    samples = db.samples(run.run_id, [c.cell_key for c in latency_cells(cells)])
    revisions = None
    if run.env.get("revisions"):  # an ab / history run: its chart over the revisions comes first
        revisions = revisions_figure(cells, run, db.samples(run.run_id, [c.cell_key for c in cells if c.ok]))
    problems = [c for c in cells if c.status != "ok"]
    throttled = [(c, m["throttle_reasons"]) for c in cells if (m := gpu_metrics_of(c)).get("throttle_reasons")]
    return Report(
        db_path=str(db_path),
        runs=runs,
        run=run,
        figures=([revisions] if revisions else []) + apply(build_figures(cells, run, samples), cells, run),
        problems=problems[:MAX_PROBLEM_ROWS],
        problems_total=len(problems),
        throttled=throttled[:MAX_PROBLEM_ROWS],
        headline=headline(cells),
        notices=run_notices(cells, run, planned_cells(run)),
    )


def figure_json(spec: FigureSpec) -> str:
    """A figure as JSON that is safe inside a <script> element (no '</' can close it early)."""
    if spec.plot is None:
        return "null"
    text = plot_json(spec.plot) if isinstance(spec.plot, dict) else spec.plot.to_json()
    return text.replace("</", "<\\/")


def when(ts: float | None) -> str:
    if not ts:
        return "–"
    return _dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")


def render_html(report: Report) -> str:
    """The report as one HTML document with plotly.js inline."""
    from .templating import environment

    tpl = environment().get_template("report.html.j2")
    return tpl.render(
        report=report,
        plotlyjs=plotly_js_text(),
        figures=[(f, figure_json(f)) for f in report.figures],
        when=when,
        fmt_si=fmt_si,
        generated=_dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        json=json,
    )


def write_report(db_path: str | Path, out_path: str | Path, run_id: str | None = None) -> str:
    """Write the report of ``run_id`` (default: the latest run) to ``out_path``; returns the absolute path written.
    Written to a temporary file then renamed, so a reader never sees half a report."""
    return write_html(render_html(build_report(db_path, run_id)), out_path)


def write_html(html: str, out_path: str | Path) -> str:
    """Write a rendered page to ``out_path`` (its missing directories created); returns the absolute path. Apart
    from ``write_report`` so a caller can tell a store it cannot read from a file it cannot write (an OSError)."""
    out = Path(out_path).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".report-", suffix=".html", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(html)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a report is meant to be shared
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return str(out)

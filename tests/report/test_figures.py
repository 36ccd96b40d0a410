"""The report's figures carry the right data: checked exactly on synthetic runs with known times, structurally on a
real small sweep, and for the edge cases (empty, only failures, GPU telemetry, 10,000 cells)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from nnforge.modelview.report import Database, build_report
from nnforge.modelview.report.figures_perf import latency_cells, machine_peaks


def _trace(fig, name: str):
    return next(t for t in fig.data if t.name == name)


def test_latest_row_per_cell_and_filters(small_db: Path) -> None:
    db = Database(small_db)
    runs = db.runs()
    assert [r.run_id for r in runs] == ["run-a", "run-b"]
    assert runs[0].status_counts == {"ok": 28, "failed": 1, "skipped": 1, "mismatch": 1}
    assert db.run().run_id == "run-b" and db.run("run-a").run_id == "run-a" and db.run("small").run_id == "run-b"
    assert db.count("run-a") == 31
    assert db.count("run-a", {"backend": ["eager"], "batch": [4]}) == 4
    assert {c.status for c in db.cells("run-a", {"status": ["failed", "skipped"]})} == {"failed", "skipped"}
    page2 = db.cells("run-a", limit=10, offset=10)
    assert len(page2) == 10 and page2[0].row_id == db.cells("run-a")[10].row_id
    with pytest.raises(KeyError):
        db.cells("run-a", {"error": ["x"]})
    with pytest.raises(FileNotFoundError):
        Database(small_db.parent / "missing.db")


def test_max_throughput_marks_the_best_backend(small_db: Path) -> None:
    rep = build_report(small_db, "run-a")
    fig = rep.figure("max_throughput").figure
    assert {t.name for t in fig.data} == {"eager", "jit.script", "fast"}
    for t in fig.data:
        assert t.type == "bar" and t.orientation == "h"
    # lstm_manual: base 1e-3 s at N=1,T=8; throughput N*T/t peaks at N=16 (sqrt scaling): 16*8/(1e-3*4/sp)
    fast, eager = _trace(fig, "fast"), _trace(fig, "eager")
    i = list(fast.y).index("lstm_manual(hidden=32)")
    assert fast.x[i] == pytest.approx(16 * 8 / (1e-3 * 4 / 4))
    assert fast.text[i].startswith("★") and fast.marker.line.width[i] > 0
    j = list(eager.y).index("lstm_manual(hidden=32)")
    assert eager.x[j] == pytest.approx(16 * 8 / (1e-3 * 4)) and "★" not in eager.text[j]
    assert eager.text[j].startswith("32 k vectors/s · 4 ms")  # plain units: not 3.200e+04
    assert fig.layout.xaxis.title.text == "Throughput (vectors/s)"


def test_scaling_lines_have_confidence_bands(small_db: Path) -> None:
    rep = build_report(small_db, "run-a")
    fig = rep.figure("scaling_batch").figure
    lines = [t for t in fig.data if t.mode == "lines+markers"]
    bands = [t for t in fig.data if t.fill == "toself"]
    assert len(lines) == len(bands) > 0
    eager = next(t for t in lines if t.name == "eager")
    assert list(eager.x) == [1, 4, 16]
    assert all(b.y[k] >= line_y for b in bands[:1] for k, line_y in enumerate(lines[0].y))  # upper edge above line
    seq = rep.figure("scaling_seq").figure
    assert {t.name for t in seq.data if t.mode == "lines+markers"} >= {"eager", "jit.script"}


def test_speedup_heatmap_values(small_db: Path) -> None:
    fig = build_report(small_db, "run-a").figure("speedup").figure
    hm = fig.data[0]
    assert hm.type == "heatmap" and list(hm.x) == ["fast", "jit.script"]
    js = [row[1][0] for row in hm.customdata]
    assert all(v == pytest.approx(2.0) for v in js)
    fast = [row[0][0] for row in hm.customdata if row[0][0] is not None]
    assert fast and all(v == pytest.approx(4.0) for v in fast)
    assert all(z[1] == pytest.approx(1.0) for z in hm.z)  # log2(2)


def test_roofline_uses_measured_peaks(small_db: Path) -> None:
    rep = build_report(small_db, "run-a")
    assert machine_peaks(rep.run.env)[:2] == (2.0e11, 2.0e10)
    fig = rep.figure("roofline").figure
    roof = _trace(fig, "roof (measured peaks)")
    assert max(roof.y) == pytest.approx(2.0e11)
    assert min(roof.y) / min(roof.x) == pytest.approx(2.0e10)  # slanted part: bandwidth × intensity
    pts = sum(len(t.x) for t in fig.data if t.mode == "markers")
    assert pts == 28
    assert any(t.name == "float64 peak" for t in fig.data)


def test_compile_latency_and_problem_list(small_db: Path) -> None:
    rep = build_report(small_db, "run-a")
    comp = rep.figure("compile").figure
    assert {t.name for t in comp.data} == {"eager", "jit.script", "fast"} or len(comp.data) >= 2
    lat = rep.figure("latency").figure
    assert {t.type for t in lat.data} == {"box"} and {t.name for t in lat.data} == {"eager", "jit.script", "fast"}
    assert {c.status for c in rep.problems} == {"failed", "skipped", "mismatch"}
    assert rep.figure("gpu").figure is None and "no GPU metrics" in rep.figure("gpu").note
    assert ("cpu_model", "Synthetic CPU @ 3.0GHz") in rep.env_rows


def test_gpu_metrics_and_throttling(gpu_db: Path) -> None:
    rep = build_report(gpu_db)
    spec = rep.figure("gpu")
    assert spec.figure is not None and "1 cell(s) throttled" in spec.note
    clocks = [t for t in spec.figure.data if t.xaxis in ("x", None)]
    assert sorted(v for t in clocks for v in t.y) == [1680.0, 1980.0, 1980.0, 1980.0]
    assert any("#d62728" in list(t.marker.color) for t in clocks)
    assert len(rep.throttled) == 1 and rep.throttled[0][1] == ["sw_power_cap"]
    titles = [a.text for a in spec.figure.layout.annotations]
    assert titles[-2:] == ["energy per call (J)", "energy per item (J)"]
    per_item = [t for t in spec.figure.data if t.xaxis == "x4"]
    assert per_item and all(v == pytest.approx(0.01 / 64) for t in per_item for v in t.y)


def test_real_sweep_renders_every_chart(real_db: Path) -> None:
    """A real (tiny) ModelView sweep: every cell ok, every chart present and fed by its cells."""
    rep = build_report(real_db)
    cells = Database(real_db).cells(rep.run.run_id)
    assert len(cells) == 8 and all(c.ok for c in cells)
    for fid in ("max_throughput", "scaling_batch", "scaling_seq", "speedup", "compile", "latency"):
        assert rep.figure(fid).figure is not None, fid
    bars = rep.figure("max_throughput").figure
    assert max(max(t.x) for t in bars.data) == pytest.approx(max(c.throughput for c in cells))
    hm = rep.figure("speedup").figure.data[0]
    assert list(hm.x) == ["jit.script"] and len(hm.y) == 4
    lat = rep.figure("latency").figure
    assert sum(len(t.y) for t in lat.data) > 0 and {t.name for t in lat.data} == {"eager", "jit.script"}
    assert len(latency_cells(cells)) == 2
    roof = rep.figure("roofline")
    if machine_peaks(rep.run.env)[0]:
        assert roof.figure is not None and "peaks:" in roof.note


def test_empty_and_only_failed(empty_db: Path, failed_db: Path) -> None:
    empty = build_report(empty_db)
    assert empty.run is None and empty.figures == [] and "no runs" in empty.headline
    failed = build_report(failed_db)
    assert failed.problems_total == 5 and failed.headline == "No successful cells."
    assert all(f.figure is None for f in failed.figures)
    assert {c.status for c in failed.problems} == {"failed", "timeout", "oom", "crashed", "skipped"}


def test_huge_run_is_aggregated(huge_db: Path) -> None:
    rep = build_report(huge_db)
    assert rep.run.n_cells == 10_000
    spec = rep.figure("max_throughput")
    bars = spec.figure
    assert len({y for t in bars.data for y in t.y}) == sum(len(t.y) for t in bars.data) == 40  # compact: best only
    assert "one bar per row" in spec.note and all(x.startswith("★") for t in bars.data for x in t.text)
    hm = rep.figure("speedup")
    assert "geometric mean" in hm.note and len(hm.figure.data[0].y) <= 60
    roof = rep.figure("roofline")
    assert sum(len(t.x) for t in roof.figure.data if t.mode == "markers") <= 1000 and "cells drawn" in roof.note
    assert len(rep.problems) <= 500 and rep.problems_total > 0
    lat = rep.figure("latency").figure
    assert sum(len(t.y) for t in lat.data) <= 8 * 5 * 1000
    assert not math.isnan(bars.data[0].x[0])


def test_plot_dicts_read_as_plotly_py_would_draw_them(small_db: Path) -> None:
    """Figures are plain dicts (fast to build); their JSON must still draw what go.Figure would: the named template
    inlined (plotly.js knows no names) and plotly.py's RdBu (plotly.js's own is reversed: 2x faster would be red)."""
    import json

    from nnforge.modelview.report.build import figure_json

    rep = build_report(small_db, "run-a")
    for spec in rep.figures:
        if spec.plot is not None:
            fig = json.loads(figure_json(spec))
            assert fig["layout"]["template"]["layout"], spec.id
    heat = json.loads(figure_json(rep.figure("speedup")))["data"][0]
    assert heat["colorscale"][0] == [0.0, "rgb(103,0,31)"]


def test_log_axes_that_span_decades_have_no_bare_digit_labels(small_db: Path) -> None:
    """Plotly labels a log axis's minor ticks "2", "5" by default, which read as values; spanning a decade or more,
    the decades' own labels suffice. Under a decade the digits are the only labels and stay."""
    from nnforge.modelview.report.common import log_axis

    assert log_axis([1.0, 100.0]) == {"type": "log", "minorloglabels": "none"}
    assert log_axis([1.0, 5.0]) == {"type": "log"}
    rep = build_report(small_db, "run-a")
    compile_fig = rep.figure("compile").figure
    assert compile_fig.layout.yaxis.type == "log" and compile_fig.layout.yaxis.exponentformat == "SI"
    assert compile_fig.layout.xaxis.minorloglabels == "none"  # 0.1 ms .. 10 ms per call
    roofline = rep.figure("roofline").figure.layout
    assert roofline.yaxis.minorloglabels == "none" and roofline.xaxis.minorloglabels is None  # x: under a decade


def test_common_setting_compares_backends_at_the_same_size(small_db: Path) -> None:
    """Every backend of a row at one batch and length: the one most backends have (here N=16, where "fast" runs too),
    ties broken by the larger size (T=32); the maximum-throughput chart stays each backend's own best."""
    rep = build_report(small_db, "run-a")
    fig = rep.figure("common_setting").figure
    row = "lstm_manual(hidden=32) · N=16 T=32"
    got = {t.name: t.x[list(t.y).index(row)] for t in fig.data if row in t.y}
    assert got == pytest.approx({"eager": 32000.0, "jit.script": 64000.0, "fast": 128000.0})
    assert [f.id for f in rep.figures][:2] == ["common_setting", "max_throughput"]

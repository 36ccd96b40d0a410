"""The plotly.js bundle: the cartesian partial bundle draws every trace type our figures use, matches the version of
plotly.py that builds the figures, and the lookup order (override, node_modules, plotly.py's full bundle) holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nnforge.modelview.report import Database, build_report
from nnforge.modelview.report.build import figure_json, render_html
from nnforge.modelview.report.plotlyjs import (
    CARTESIAN_BUNDLE,
    CARTESIAN_TRACE_TYPES,
    bundle_version,
    full_bundle_path,
    plotly_js_path,
    repo_root,
)
from nnforge.modelview.web.compare import compare
from nnforge.modelview.web.pages import cell_figures, compare_figure


def _trace_types(fig_json: str) -> set[str]:
    if fig_json == "null":
        return set()
    return {t.get("type", "scatter") for t in json.loads(fig_json)["data"]}


def test_every_figure_draws_with_the_cartesian_bundle(small_db: Path, gpu_db: Path, real_db: Path,
                                                      huge_db: Path) -> None:
    """Report figures of every fixture run, a cell's page and the compare page: only trace types the cartesian bundle
    has (anything else would be an empty chart in the browser, with no error raised by Python)."""
    used: set[str] = set()
    for db in (small_db, gpu_db, real_db, huge_db):
        for spec in build_report(db).figures:
            used |= _trace_types(figure_json(spec))
    store = Database(small_db)
    cells, cb = store.cells("run-a"), store.cells("run-b")
    used |= _trace_types(cell_figures(store.cell("run-a", next(c.cell_key for c in cells if c.ok)))[0][1])
    pairs, _ = compare(cells, cb, store.samples("run-a", [c.cell_key for c in cells]),
                       store.samples("run-b", [c.cell_key for c in cb]))
    used |= _trace_types(compare_figure(pairs)[1])
    assert {"bar", "box", "heatmap", "scatter", "histogram"} <= used  # the check saw the figures it should
    assert used <= CARTESIAN_TRACE_TYPES, used - CARTESIAN_TRACE_TYPES


def test_cartesian_bundle_matches_plotly_py() -> None:
    """``make`` installs the pinned cartesian bundle (npm ci); its plotly.js version is the one plotly.py bundles, so
    the figure JSON plotly.py builds means the same to it."""
    cartesian = repo_root() / CARTESIAN_BUNDLE
    if not cartesian.is_file():
        pytest.skip("node_modules/ not installed (run `npm ci`, as `make` does); pages use plotly.py's full bundle")
    assert bundle_version(cartesian) == bundle_version(full_bundle_path()) != "unknown"
    assert plotly_js_path() == cartesian
    assert cartesian.stat().st_size < full_bundle_path().stat().st_size / 2


def test_override_and_its_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, small_db: Path) -> None:
    bundle = tmp_path / "my-plotly.min.js"
    bundle.write_text("/**\n* plotly.js v9.9.9\n*/\nwindow.Plotly = {};\n")
    monkeypatch.setenv("NNFORGE_PLOTLY_JS", str(bundle))
    assert plotly_js_path() == bundle and bundle_version(bundle) == "9.9.9"
    assert "plotly.js v9.9.9" in render_html(build_report(small_db, "run-a"))  # the report inlines the chosen one
    monkeypatch.setenv("NNFORGE_PLOTLY_JS", str(tmp_path / "missing.js"))
    with pytest.raises(FileNotFoundError, match="NNFORGE_PLOTLY_JS"):
        plotly_js_path()

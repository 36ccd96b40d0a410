"""The web view over HTTP (no browser): pages, filters, pagination, comparison verdicts, errors, port handling."""

from __future__ import annotations

import gzip
import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from report_synth import get
from typer.testing import CliRunner

from nnforge.cli import app
from nnforge.modelview.web import PortInUse, bind, running
from nnforge.modelview.web.compare import holm, mann_whitney_p
from nnforge.modelview.web.static import plotly_body, plotly_url


def test_plotly_js_cached_and_compressed_for_remote_browsers(view_small: str) -> None:
    """plotly.js: a year-long immutable cache at its versioned URL; gzipped only for a browser on another machine
    (over loopback compressing costs more than it saves). Pages and figure JSON are gzipped by the middleware."""
    from nnforge.modelview.web.static import YEAR

    req = urllib.request.Request(view_small + plotly_url(), headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(req) as r:
        assert r.headers["Cache-Control"] == YEAR and r.headers.get("Content-Encoding") is None
    req = urllib.request.Request(view_small + "/api/runs/run-a/figures", headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(req) as r:
        assert r.headers["Content-Encoding"] == "gzip" and json.loads(gzip.decompress(r.read()))["figures"]
    assert gzip.decompress(plotly_body(gzipped=True)) == plotly_body()  # what a remote browser gets


def test_pages(view_small: str) -> None:
    status, html = get(view_small + "/")
    assert status == 200 and 'href="/runs/run-a"' in html and 'id="compare-form"' in html
    status, html = get(view_small + "/runs/run-a")
    assert status == 200 and html.count('class="cell-row"') == 31 and "/api/runs/run-a/figures" in html
    assert "cdn" not in html and f'<script defer src="{plotly_url()}">' in html  # versioned, cached for a year
    for path in (plotly_url(), "/static/plotly.min.js"):
        status, js = get(view_small + path)
        assert status == 200 and len(js) > 1_000_000 and js.startswith("//# allFunctionsCalledOnLoad"), path
    status, html = get(view_small + "/runs/nope")
    assert status == 404 and 'id="error-detail"' in html and "no run" in html
    assert get(view_small + "/no/such/page")[0] == 404
    assert json.loads(get(view_small + "/api/runs/nope/cells")[1])["detail"].startswith("no run")


def test_filters_and_pagination(view_small: str) -> None:
    _, html = get(view_small + "/runs/run-a?backend=eager&batch=4")
    assert html.count('class="cell-row"') == 4 and 'data-backend="jit.script"' not in html
    data = json.loads(get(view_small + "/api/runs/run-a/cells?status=failed&status=skipped")[1])
    assert data["total"] == 2 and {c["status"] for c in data["cells"]} == {"failed", "skipped"}
    data = json.loads(get(view_small + "/api/runs/run-a/cells?per_page=10&page=4")[1])
    assert data["pages"] == 4 and len(data["cells"]) == 1
    assert json.loads(get(view_small + "/api/runs/run-a/cells?batch=abc")[1])["total"] == 0


def test_figures_api_follows_filters(view_small: str) -> None:
    full = json.loads(get(view_small + "/api/runs/run-a/figures")[1])
    ids = [f["id"] for f in full["figures"]]
    assert ids[:2] == ["common_setting", "max_throughput"] and full["n_cells"] == 31
    only = json.loads(get(view_small + "/api/runs/run-a/figures?backend=eager")[1])
    bars = next(f for f in only["figures"] if f["id"] == "max_throughput")["figure"]
    assert [t["name"] for t in bars["data"]] == ["eager"]
    assert next(f for f in only["figures"] if f["id"] == "speedup")["figure"] is None


def test_cell_page(view_small: str) -> None:
    cells = json.loads(get(view_small + "/api/runs/run-a/cells?backend=jit.script&batch=4&seq_len=8")[1])["cells"]
    key = cells[0]["cell_key"]
    status, html = get(view_small + "/runs/run-a/cell?" + urllib.parse.urlencode({"key": key}))
    assert status == 200 and 'id="fig-samples"' in html and "def kernel():" in html and 'id="siblings"' in html
    failed = json.loads(get(view_small + "/api/runs/run-a/cells?status=mismatch")[1])["cells"][0]["cell_key"]
    status, html = get(view_small + "/runs/run-a/cell?" + urllib.parse.urlencode({"key": failed}))
    assert status == 200 and "&lt;/script&gt;&lt;b&gt;x&lt;/b&gt;" in html and 'id="fig-samples-empty"' in html
    assert get(view_small + "/runs/run-a/cell?key=nope")[0] == 404


def test_compare_marks_significant_changes(view_small: str) -> None:
    status, html = get(view_small + "/compare?a=run-a&b=run-b")
    assert status == 200
    # run b is 10 % slower everywhere, eager included: the times relative to eager did not change; eager's own time
    # did, but by less than the between-run noise of absolute times (the samples here come sorted: no round
    # structure, so nothing here is called slower)
    assert html.count('class="pair"') == 28 and html.count('data-verdict="slower"') == 0
    assert "3 cells not ok in one of the runs" in html
    _, same = get(view_small + "/compare?a=run-a&b=run-a")
    assert same.count('data-verdict="faster"') + same.count('data-verdict="slower"') == 0


def test_mann_whitney_matches_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    rng = __import__("numpy").random.default_rng(0)
    for n1, n2, shift in ((10, 12, 0.0), (30, 25, 0.3), (8, 8, 1.0)):
        a = rng.normal(0, 1, n1).round(1)  # rounding makes ties
        b = rng.normal(shift, 1, n2).round(1)
        ref = stats.mannwhitneyu(a, b, alternative="two-sided", method="asymptotic").pvalue
        assert mann_whitney_p(a, b) == pytest.approx(ref, rel=1e-9)
    assert holm([0.01, 0.04, float("nan"), 0.03]) == pytest.approx([0.03, 0.06, float("nan"), 0.06], nan_ok=True)


def test_port_in_use_is_refused(small_db: Path) -> None:
    with running(small_db) as url:
        port = int(url.rsplit(":", 1)[1])
        with pytest.raises(PortInUse, match="already in use"):
            bind("127.0.0.1", port)
        res = CliRunner().invoke(app, ["view", str(small_db), "--port", str(port)])
        assert res.exit_code == 2 and "already in use" in res.output
    # stopped: the port is free again and nothing listens
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
    res = CliRunner().invoke(app, ["view", str(small_db.parent / "absent.db")])
    assert res.exit_code == 2 and "no ModelView database" in res.output


def test_view_serves_empty_and_failed(empty_db: Path, failed_db: Path) -> None:
    with running(empty_db) as url:
        status, html = get(url + "/")
        assert status == 200 and 'id="no-runs"' in html
    with running(failed_db) as url:
        runs = json.loads(get(url + "/api/runs")[1])
        rid = runs[0]["run_id"]
        status, html = get(url + f"/runs/{rid}")
        assert status == 200 and html.count('class="cell-row"') == 5
        figs = json.loads(get(url + f"/api/runs/{rid}/figures")[1])
        assert all(f["figure"] is None for f in figs["figures"]) and figs["headline"] == "No successful cells."


def test_ok_cells_have_no_failure_reason(view_small: str) -> None:
    _, html = get(view_small + "/runs/run-a?status=ok")
    assert html.count('class="cell-row"') > 0 and "no reason recorded" not in html
    _, html = get(view_small + "/runs/run-a?status=failed")
    assert html.count('class="cell-row"') == 1 and '<td class="err"></td>' not in html

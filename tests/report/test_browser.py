"""In a real browser (Playwright + headless Chromium): the report file and the web view render their charts without
console errors, filters change the table, a cell's page opens, and a 10,000-cell run stays responsive.

Screenshots go to the test's tmp dir; a failing test lists them (and one taken at the failure) in its report.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nnforge.modelview.report import write_report
from nnforge.modelview.web import running

REPORT_FIGURES = ("common_setting", "max_throughput", "scaling_batch", "scaling_seq", "speedup", "roofline", "compile",
                  "latency")
LOAD_BUDGET_MS = 2000


def test_report_renders_offline(page, small_db: Path, tmp_path: Path) -> None:
    out = write_report(small_db, tmp_path / "report.html", run_id="run-a")
    page.page.route("http*://**", lambda route: route.abort())  # offline: any network request would fail
    page.page.goto(Path(out).as_uri())
    assert page.wait_plots() == len(REPORT_FIGURES)
    page.screenshot("report")
    for fid in REPORT_FIGURES:
        assert page.traces(fid), fid
    bars = {t["name"] for t in page.traces("max_throughput")}
    assert bars == {"eager", "jit.script", "fast"}
    assert page.page.locator("#problems tbody tr").count() == 3
    assert page.page.locator(".main-svg").count() >= len(REPORT_FIGURES)
    assert page.errors == []


def test_report_of_real_sweep(page, real_db: Path, tmp_path: Path) -> None:
    out = write_report(real_db, tmp_path / "real.html")
    page.page.goto(Path(out).as_uri())
    assert page.wait_plots() >= 6
    page.screenshot("real-report")
    assert {t["name"] for t in page.traces("max_throughput")} == {"eager", "jit.script"}
    assert page.errors == []


def test_view_filter_and_cell(page, view_small: str) -> None:
    p = page.page
    p.goto(view_small + "/")
    p.click("a.run-link >> text=run-a")
    page.wait_plots()
    page.screenshot("run")
    assert {t["name"] for t in page.traces("max_throughput")} == {"eager", "jit.script", "fast"}
    rows = p.locator("#cell-table tr.cell-row")
    assert rows.count() == 31
    p.select_option("select[data-filter=backend]", "eager")  # submits the form
    p.wait_for_url("**backend=eager**")
    page.wait_plots()
    assert rows.count() == 12 and p.locator("tr.cell-row[data-backend=jit\\.script]").count() == 0
    assert [t["name"] for t in page.traces("max_throughput")] == ["eager"]
    p.select_option("select[data-filter=batch]", "4")
    p.wait_for_url("**batch=4**")
    assert rows.count() == 4
    page.screenshot("filtered")
    p.click("#cell-table a.cell-link >> nth=0")
    p.wait_for_url("**/cell?key=**")
    page.wait_plots()
    page.screenshot("cell")
    assert p.locator("#fig-samples").count() == 1 and len(page.traces("samples")) >= 2
    assert p.locator("#fields").inner_text().count("eager") >= 1
    assert page.errors == []


def test_view_compare(page, view_small: str) -> None:
    p = page.page
    p.goto(view_small + "/compare?a=run-a&b=run-b")
    page.wait_plots()
    page.screenshot("compare")
    rows = p.locator("tr.pair")
    assert rows.count() == 28  # b is 10 % slower in every backend: ratios to eager unchanged, none called slower
    verdicts = {rows.nth(i).get_attribute("data-verdict") for i in range(rows.count())}
    assert "slower" not in verdicts and {t["name"] for t in page.traces("compare")} == verdicts
    assert page.errors == []


NAV_TIMING = (
    "() => { const n = performance.getEntriesByType('navigation')[0];"
    " return {load: n.loadEventEnd, first: Number(document.body.dataset.firstPlotMs)}; }"
)
VISIT_TRIES = 3


def _visit(page, url: str) -> dict[str, float]:
    """Navigate, wait for every chart, and return when the load event ended and the first chart was drawn (ms from
    navigation start)."""
    page.page.goto(url)
    page.wait_plots(60_000)
    return page.page.evaluate(NAV_TIMING)


@pytest.mark.timing
def test_huge_run_first_visit_is_fast(fresh_page, huge_db: Path) -> None:
    """10,000 cells, first visit: a server just started (``running`` returns once it is up and warmed, as `nnforge
    view --open` opens the browser) and a fresh browser context (no plotly.js in its cache, no compiled code) reach
    the run page's load event and draw its first chart within 2 s. The machine is shared and noisy (2 vCPUs, other
    jobs, the other xdist worker), so each of up to three tries is a genuine first visit (new server, new context)
    and one within budget passes; a regression (figures built on request, plotly.js blocking) misses all three."""
    tries = []
    for i in range(VISIT_TRIES):
        page = fresh_page()
        with running(huge_db) as url:
            rid = page.page.context.request.get(url + "/api/runs").json()[0]["run_id"]
            timing = _visit(page, url + f"/runs/{rid}")
            if i == 0:
                page.screenshot("huge-run-first-visit")
        assert page.errors == []
        page.page.context.close()
        tries.append(timing)
        if max(timing["load"], timing["first"]) < LOAD_BUDGET_MS:
            break
    best = min(tries, key=lambda t: max(t["load"], t["first"]))
    assert best["load"] < LOAD_BUDGET_MS, tries
    assert best["first"] < LOAD_BUDGET_MS, tries


@pytest.mark.timing
def test_huge_run_stays_responsive(page, huge_db: Path, tmp_path: Path) -> None:
    """10,000 cells: a returning visit to the run page (the server's figure cache warm, plotly.js in the browser's
    cache) reaches its load event and draws its first chart within 2 s; the table is paginated; the report file of the
    same run renders too. (The first visit is test_huge_run_first_visit_is_fast.) Noise only adds time, so the best of
    up to three returning visits is the page's speed; a regression misses all three."""
    p = page.page
    with running(huge_db) as url:
        rid = p.context.request.get(url + "/api/runs").json()[0]["run_id"]
        _visit(page, url + f"/runs/{rid}")
        tries = []
        for _ in range(VISIT_TRIES):
            tries.append(_visit(page, url + f"/runs/{rid}"))
            if max(tries[-1]["load"], tries[-1]["first"]) < LOAD_BUDGET_MS:
                break
        page.screenshot("huge-run")
        assert p.locator("tr.cell-row").count() == 100 and "10000 cells" in p.locator("#cell-count").inner_text()
        best = min(tries, key=lambda t: max(t["load"], t["first"]))
        assert best["load"] < LOAD_BUDGET_MS, tries
        assert best["first"] < LOAD_BUDGET_MS, tries
        p.click("#next")
        p.wait_for_url("**page=2**")
        assert p.locator("tr.cell-row").count() == 100
    out = write_report(huge_db, tmp_path / "huge.html")
    p.goto(Path(out).as_uri())
    assert page.wait_plots(60_000) == len(REPORT_FIGURES)
    assert page.errors == []


@pytest.mark.parametrize("which", ["empty", "failed"])
def test_edge_cases_in_browser(page, which: str, empty_db: Path, failed_db: Path, tmp_path: Path) -> None:
    db = empty_db if which == "empty" else failed_db
    out = write_report(db, tmp_path / f"{which}.html")
    page.page.goto(Path(out).as_uri())
    assert page.wait_plots() == 0
    page.screenshot(which)
    with running(db) as url:
        page.page.goto(url + "/")
        if which == "failed":
            page.page.click("a.run-link")
            page.wait_plots()
            assert page.page.locator("tr.cell-row").count() == 5
            assert page.page.locator(".empty").count() >= 7
    assert page.errors == []

"""Fixtures for the report and web-view tests: store files (a real tiny sweep, synthetic runs with known values, edge
cases, a 10,000-cell run), the web view on a free local port, and a headless Chromium driven by Playwright.

Session-scoped store files are built once per test session even under xdist (the first worker builds, under a file
lock, and the others reuse the file), so the real sweep runs once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import report_synth as synth

CHROMIUM = os.environ.get("NNFORGE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run",
]  # fmt: skip


def _shared_dir(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    base = tmp_path_factory.getbasetemp()
    return base if worker_id == "master" else base.parent


def _build_once(tmp_path_factory: pytest.TempPathFactory, worker_id: str, name: str,
                make: Callable[[Path], Any]) -> Path:
    """Build ``name`` once for all xdist workers of this session (a flock serialises the builders)."""
    shared = _shared_dir(tmp_path_factory, worker_id)
    path = shared / name
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (shared / f"{name}.done").exists():
            tmp = shared / f"{name}.building"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            make(tmp / name)
            for f in tmp.iterdir():
                f.replace(shared / f.name)
            (shared / f"{name}.done").touch()
    return path


def _real_sweep(path: Path) -> None:
    """A real ModelView sweep, as small as still covers every chart: 1 variant × 2 backends × 2 batch × 2 lengths."""
    from nnforge.modelview import sweep

    sweep(
        variants=["lstm_manual"], backends=["eager", "jit.script"], batch=[1, 4], seq_len=[4, 16],
        params={"hidden": 16}, db=path, progress=False, table=False, name="tiny-real",
        timing={"budget_s": 0.1, "min_samples": 10, "warmup_max_s": 0.2, "warmup_min_calls": 2,
                "perf_counters": False},
    )


@pytest.fixture(scope="session")
def real_db(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    return _build_once(tmp_path_factory, worker_id, "real.db", _real_sweep)


@pytest.fixture(scope="session")
def small_db(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    return _build_once(tmp_path_factory, worker_id, "small.db", synth.make_small)


@pytest.fixture(scope="session")
def huge_db(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    return _build_once(tmp_path_factory, worker_id, "huge.db", synth.make_huge)


@pytest.fixture(scope="session")
def gpu_db(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    return _build_once(tmp_path_factory, worker_id, "gpu.db", synth.make_gpu)


@pytest.fixture(scope="session")
def failed_db(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    return _build_once(tmp_path_factory, worker_id, "failed.db", synth.make_only_failed)


@pytest.fixture(scope="session")
def empty_db(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    return _build_once(tmp_path_factory, worker_id, "empty.db", synth.new_db)


@pytest.fixture(scope="session")
def view_small(small_db: Path) -> Iterator[str]:
    from nnforge.modelview.web import running

    with running(small_db) as url:
        yield url


# -- browser -----------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: run scripts/install-browser.sh (or set NNFORGE_CHROMIUM)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


class Page:
    """A browser page that records console errors and saves screenshots under the test's tmp dir."""

    def __init__(self, page: Any, shots: Path) -> None:
        self.page = page
        self.shots = shots
        self.errors: list[str] = []
        self.saved: list[Path] = []
        page.on("console", lambda m: self.errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))

    def screenshot(self, name: str) -> Path:
        path = self.shots / f"{len(self.saved):02d}-{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        self.saved.append(path)
        return path

    def wait_plots(self, timeout_ms: float = 30_000) -> int:
        self.page.wait_for_selector("body[data-plots-rendered]", timeout=timeout_ms)
        return int(self.page.evaluate("document.body.dataset.plotsRendered"))

    def traces(self, fig_id: str) -> list[dict[str, Any]]:
        """Name and type of each trace Plotly drew into #fig-<id> (read back from the live graph div)."""
        return self.page.evaluate(
            "id => (document.getElementById('fig-' + id).data || []).map(t => ({name: t.name || '', type: t.type,"
            " n: (t.x || t.z || []).length}))",
            fig_id,
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    page: Page | None = getattr(item, "_nnforge_page", None)
    if rep.when == "call" and rep.failed and page is not None:
        with contextlib.suppress(Exception):
            page.screenshot("at-failure")
        lines = [str(p) for p in page.saved] + [f"console errors: {page.errors}"]
        rep.sections.append(("screenshots", "\n".join(lines)))


@pytest.fixture
def page(browser: Any, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Page]:
    ctx = browser.new_context(viewport={"width": 1300, "height": 900})
    ctx.set_default_timeout(30_000)
    p = Page(ctx.new_page(), tmp_path)
    request.node._nnforge_page = p
    try:
        yield p
    finally:
        ctx.close()


@pytest.fixture
def fresh_page(browser: Any, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[[], Page]]:
    """A factory of pages, each in a new browser context (empty HTTP and code caches: a first visit); all are closed
    at teardown, and a failing test lists the last one's screenshots."""
    contexts: list[Any] = []

    def make() -> Page:
        ctx = browser.new_context(viewport={"width": 1300, "height": 900})
        ctx.set_default_timeout(30_000)
        contexts.append(ctx)
        p = Page(ctx.new_page(), tmp_path)
        request.node._nnforge_page = p
        return p

    try:
        yield make
    finally:
        for ctx in contexts:
            ctx.close()

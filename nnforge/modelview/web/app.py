"""The ModelView web view: FastAPI routes over the store, server-rendered Jinja2 pages, Plotly charts.

Why FastAPI + Jinja2 + plain Plotly rather than Dash or Panel: the report already builds Plotly figures as JSON, so the
view only needs routes and templates (no second figure model, no websocket session state per tab); FastAPI is
maintained, small, and its TestClient makes every page testable without a browser. plotly.js is served from the
installed plotly package, never a CDN, so the view works offline (static.py). Pages: ``/`` runs, ``/runs/{id}`` plots +
filtered cell table, ``/runs/{id}/cell?key=...`` one cell, ``/compare?a=&b=`` two runs; ``/api/...`` the same data as
JSON.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..console import rel_ci_text
from ..report.build import when
from ..report.common import fmt_s, fmt_si
from ..report.data import CellRow, RunInfo
from ..report.figures_perf import flatten, gpu_metrics_of
from ..report.plotlyjs import plotly_js_path
from ..report.templating import environment
from . import queries
from .compare import compare
from .pages import cell_figures, compare_figure
from .state import ViewState
from .static import GZipPages, add_static_routes, plotly_url
from .warm import start_warm_up

WEB_TEMPLATES = Path(__file__).with_name("templates")
__all__ = ["WEB_TEMPLATES", "create_app", "plotly_js_path"]


def create_app(db_path: str | Path, warm: bool = False) -> FastAPI:
    """An app serving one store file (checked to exist now, so a typo fails before the server starts). ``warm``
    builds the latest runs' figures (and compresses plotly.js) on a background thread now, so that the first visit
    after a server start does not wait for them; the server turns it on, tests with a TestClient need not."""
    state = ViewState(str(db_path))
    app = FastAPI(title="ModelView", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(GZipPages, minimum_size=2048, compresslevel=5)
    app.state.view = state
    env = environment(WEB_TEMPLATES)
    env.globals.update(when=when, fmt_si=fmt_si, fmt_s=fmt_s, fmt_rel_ci=rel_ci_text, urlencode=urlencode,
                       db_path=str(db_path), plotly_url=plotly_url())

    def page(name: str, **ctx: Any) -> HTMLResponse:
        return HTMLResponse(env.get_template(name).render(**ctx))

    def get_run(ref: str) -> RunInfo:
        try:
            run = state.db.run(ref, runs=state.runs())
        except KeyError as e:
            raise HTTPException(404, str(e.args[0]) if e.args else str(e)) from e
        if run is None:
            raise HTTPException(404, f"no run {ref!r}")
        return run

    @app.exception_handler(StarletteHTTPException)  # the base class: unknown URLs get the page too
    def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        """JSON for /api, a readable page for people."""
        if request.url.path.startswith("/api/"):
            return Response(json.dumps({"detail": exc.detail}), exc.status_code, media_type="application/json")
        html = env.get_template("error.html.j2").render(status=exc.status_code, detail=exc.detail)
        return HTMLResponse(html, exc.status_code)

    add_static_routes(app)

    @app.get("/favicon.ico")
    def favicon() -> Response:
        return Response(status_code=204)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        """Up; ``warm`` says whether the start-up warm-up has finished ("done"), is under way, or is "off"."""
        return {"status": "ok", "warm": state.warm}

    @app.get("/", response_class=HTMLResponse)
    def index() -> HTMLResponse:
        runs = list(reversed(state.runs()))
        return page("index.html.j2", runs=runs)

    @app.get("/runs/{run_id}", response_class=HTMLResponse)
    def run_page(run_id: str, request: Request) -> HTMLResponse:
        run = get_run(run_id)
        filters = queries.parse_filters(request.query_params)
        page_no, per_page = queries.page_args(request.query_params)
        pg = queries.cell_page(state.db, run.run_id, filters, page_no, per_page)
        options = state.options(run.run_id)
        fq = [(k, v) for k, vals in filters.items() for v in vals]
        return page("run.html.j2", run=run, page=pg, filters=filters, options=options, filter_query=urlencode(fq),
                    figures_url=f"/api/runs/{run.run_id}/figures" + (f"?{urlencode(fq)}" if fq else ""))

    @app.get("/api/runs")
    def api_runs() -> list[dict[str, Any]]:
        return [{"run_id": r.run_id, "name": r.name, "created": r.created, "status_counts": r.status_counts}
                for r in state.runs()]

    @app.get("/api/runs/{run_id}/figures")
    def api_figures(run_id: str, request: Request) -> Response:
        run = get_run(run_id)
        filters = queries.parse_filters(request.query_params)
        data = queries.cached_figures(state, run, filters)
        # The figures are already JSON text: splice them in rather than parse and re-serialise megabytes.
        parts = [
            f'{{"id":{json.dumps(f["id"])},"title":{json.dumps(f["title"])},"note":{json.dumps(f["note"])},'
            f'"figure":{f["figure"] or "null"}}}'
            for f in data["figures"]
        ]
        head = json.dumps(data["headline"])
        body = f'{{"headline":{head},"n_cells":{data["n_cells"]},"figures":[{",".join(parts)}]}}'
        return Response(body, media_type="application/json")

    @app.get("/api/runs/{run_id}/cells")
    def api_cells(run_id: str, request: Request) -> dict[str, Any]:
        run = get_run(run_id)
        filters = queries.parse_filters(request.query_params)
        pg = queries.cell_page(state.db, run.run_id, filters, *queries.page_args(request.query_params))
        return {"total": pg.total, "page": pg.page, "pages": pg.pages, "cells": [_cell_json(c) for c in pg.cells]}

    @app.get("/runs/{run_id}/cell", response_class=HTMLResponse)
    def cell_page(run_id: str, key: str) -> HTMLResponse:
        run = get_run(run_id)
        cell = state.db.cell(run.run_id, key)
        if cell is None:
            raise HTTPException(404, f"no cell {key!r} in run {run.run_id}")
        siblings = [c for c in state.db.cells(run.run_id, {"variant": [cell.variant]})
                    if c.setting_key == cell.setting_key and c.cell_key != cell.cell_key]
        figs = cell_figures(cell)
        return page("cell.html.j2", run=run, cell=cell, siblings=siblings, figures=figs,
                    fields=_cell_fields(cell), gpu=gpu_metrics_of(cell),
                    metrics_text=json.dumps(cell.metrics, indent=2, sort_keys=True, default=str))

    @app.get("/compare", response_class=HTMLResponse)
    def compare_page(request: Request, a: str = "", b: str = "", verdict: str = "") -> HTMLResponse:
        runs = list(reversed(state.runs()))
        if not a or not b:
            return page("compare.html.j2", runs=runs, ra=None, rb=None, pairs=None)
        ra, rb = get_run(a), get_run(b)

        def make() -> tuple[list[Any], list[str]]:
            ca, cb = state.db.cells(ra.run_id), state.db.cells(rb.run_id)
            keys = [c.cell_key for c in ca if c.ok]
            return compare(ca, cb, state.db.samples(ra.run_id, keys), state.db.samples(rb.run_id, keys),
                           specs=(ra.spec, rb.spec))

        pairs, notes = state.cached("compare", (ra.run_id, rb.run_id), make)
        counts = {v: sum(1 for p in pairs if p.verdict == v) for v in ("faster", "slower", "no-change", "inconclusive")}
        shown = [p for p in pairs if not verdict or p.verdict == verdict]
        page_no, per_page = queries.page_args(request.query_params)
        pages = max(1, math.ceil(len(shown) / per_page))
        page_no = min(page_no, pages)
        env_a, env_b = dict(flatten(ra.env)), dict(flatten(rb.env))
        env_diff = [(k, env_a.get(k), env_b.get(k)) for k in sorted(set(env_a) | set(env_b))]
        return page("compare.html.j2", runs=runs, ra=ra, rb=rb, pairs=shown[(page_no - 1) * per_page:][:per_page],
                    total=len(shown), counts=counts, notes=notes, verdict=verdict, page_no=page_no, pages=pages,
                    env_diff=env_diff, figure=compare_figure(pairs))

    app.state.warm_thread = start_warm_up(state, env) if warm else None
    return app


def _cell_json(c: CellRow) -> dict[str, Any]:
    return {k: getattr(c, k) for k in (
        "cell_key", "variant", "backend", "batch", "seq_len", "layout", "dtype", "mode", "device", "params", "status",
        "error", "median_s", "ci_low_s", "ci_high_s", "throughput", "throughput_unit", "compile_s",
    )}


def _cell_fields(c: CellRow) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = [
        ("status", c.status), ("variant", c.model_label), ("backend", c.backend), ("batch", str(c.batch)),
        ("seq_len", str(c.seq_len)), ("layout", c.layout), ("dtype", c.dtype), ("mode", c.mode),
        ("device", c.device), ("throughput", f"{fmt_si(c.throughput)} {c.throughput_unit}"),
        ("median time per call", fmt_s(c.median_s)),
        ("95% CI", f"{fmt_s(c.ci_low_s)} – {fmt_s(c.ci_high_s)}"),
        ("compile", fmt_s(c.compile_s)), ("first call", fmt_s(c.first_call_s)),
        ("FLOPs / call", fmt_si(c.flops)), ("bytes / call", fmt_si(c.bytes, "B")),
        ("achieved", fmt_si(c.achieved_flops, "FLOP/s")), ("achieved bandwidth", fmt_si(c.achieved_bytes_per_s, "B/s")),
        ("peak memory", fmt_si(c.peak_mem_bytes, "B")), ("max abs error vs reference", f"{c.max_abs_err:.3g}"
                                                          if c.max_abs_err is not None else "–"),
        ("samples", str(len(c.samples or ()))), ("started", when(c.started)), ("cell key", c.cell_key),
    ]
    return rows

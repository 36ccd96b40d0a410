"""Query-string handling for the web view: filters, pagination, and the figures of a filtered run.

Filters are plain GET parameters (``?backend=eager&dtype=float32``; repeat a name for several values), so every view is
a URL that can be bookmarked, shared, or fetched by a script from ``/api``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import QueryParams

from ..report.build import build_figures, figure_json, headline
from ..report.data import FILTER_COLUMNS, CellRow, Database, RunInfo
from ..report.figures_perf import latency_cells
from ..report.revisions import revisions_figure
from .state import ViewState

PER_PAGE = 100
MAX_PER_PAGE = 1000
INT_COLUMNS = ("batch", "seq_len")


NO_MATCH = -(2**62)  # an integer filter value no cell has: what a bad integer becomes
SQLITE_INT_MAX = 2**63 - 1
_INT = re.compile(r"-?[0-9]+")


def _int_or_none(v: str) -> int | None:
    """``v`` as an integer SQLite can bind, else None. ASCII digits only: ``str.isdigit`` accepts ``²``, which
    ``int`` rejects, and a value past 64 bits overflows SQLite's binding; either was an HTTP 500."""
    if not _INT.fullmatch(v):
        return None
    n = int(v)
    return n if -SQLITE_INT_MAX - 1 <= n <= SQLITE_INT_MAX else None


def parse_filters(q: QueryParams) -> dict[str, list[Any]]:
    """Only known columns, empty values dropped, integers parsed (a bad integer matches nothing rather than erring)."""
    out: dict[str, list[Any]] = {}
    for col in FILTER_COLUMNS:
        vals = [v for v in q.getlist(col) if v != ""]
        if col in INT_COLUMNS:
            vals = [NO_MATCH if (n := _int_or_none(v)) is None else n for v in vals]
        if vals:
            out[col] = vals
    return out


def filters_key(f: Mapping[str, list[Any]]) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    return tuple(sorted((k, tuple(v)) for k, v in f.items()))


@dataclass(frozen=True)
class Page:
    """One page of a filtered cell table."""

    cells: list[CellRow]
    total: int
    page: int
    per_page: int

    @property
    def pages(self) -> int:
        return max(1, math.ceil(self.total / self.per_page))


def page_args(q: QueryParams) -> tuple[int, int]:
    """Page number and page size; a missing or bad value (``²``, ``-1``, letters) is the default, and a huge one is
    clamped (to the last page by ``cell_page`` and the comparison page), so no value is an error."""

    def as_int(name: str, default: int) -> int:
        v = q.get(name, "")
        return int(v) if _INT.fullmatch(v) and not v.startswith("-") else default

    per_page = min(MAX_PER_PAGE, max(1, as_int("per_page", PER_PAGE)))
    return max(1, as_int("page", 1)), per_page


def cell_page(db: Database, run_id: str, filters: Mapping[str, list[Any]], page: int, per_page: int) -> Page:
    total = db.count(run_id, filters)
    page = min(page, max(1, math.ceil(total / per_page)))
    cells = db.cells(run_id, filters, limit=per_page, offset=(page - 1) * per_page)
    return Page(cells, total, page, per_page)


def cached_figures(state: ViewState, run: RunInfo, filters: Mapping[str, list[Any]]) -> dict[str, Any]:
    """The figures of a filtered run from the app's cache (the start-up warm-up fills it under the same key)."""
    return state.cached("figures", (run.run_id, filters_key(filters)), lambda: run_figures(state.db, run, filters))


def run_figures(db: Database, run: RunInfo, filters: Mapping[str, list[Any]]) -> dict[str, Any]:
    """Figures of the filtered run as JSON-ready dicts (figure JSON as text, parsed by the page)."""
    cells = db.cells(run.run_id, filters)
    samples = db.samples(run.run_id, [c.cell_key for c in latency_cells(cells)])
    figs = build_figures(cells, run, samples)
    if run.env.get("revisions"):  # ab / history runs: the chart over revisions, from the same statistics as the CLI
        rev = revisions_figure(cells, run, db.samples(run.run_id, [c.cell_key for c in cells if c.ok]))
        figs = ([rev] if rev is not None else []) + figs
    return {
        "headline": headline(cells),
        "n_cells": len(cells),
        "figures": [
            {"id": f.id, "title": f.title, "note": f.note, "figure": figure_json(f) if f.plot is not None else None}
            for f in figs
        ],
    }

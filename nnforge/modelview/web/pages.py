"""Figures that only the web view draws: one cell's samples, and the change between two runs."""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..report.build import figure_json
from ..report.common import FigureSpec, base_layout
from ..report.data import CellRow
from .compare import Pair

VERDICT_COLORS = {"faster": "#2e7d32", "slower": "#c62828", "no-change": "#9e9e9e", "inconclusive": "#f9a825"}
MAX_COMPARE_POINTS = 2000


def cell_figures(cell: CellRow) -> list[tuple[FigureSpec, str]]:
    """Every per-call sample in call order (drift, warm-up leftovers and periodic stalls show here) and their
    histogram with the median and its CI."""
    title = "All samples: time per call, in order, and their distribution"
    if not cell.samples:
        spec = FigureSpec("samples", title, None, "no per-call samples recorded for this cell")
        return [(spec, "null")]
    ms = np.asarray(cell.samples) * 1e3
    fig = make_subplots(rows=1, cols=2, column_widths=[0.62, 0.38], horizontal_spacing=0.08,
                        subplot_titles=["in call order", "distribution"])
    fig.add_scatter(x=np.arange(len(ms)), y=ms, mode="markers", marker={"size": 4, "color": "#1f77b4"},
                    name="sample", hovertemplate="#%{x}: %{y:.4g} ms<extra></extra>", row=1, col=1)
    fig.add_histogram(x=ms, nbinsx=min(60, max(10, len(ms) // 5)), marker_color="#1f77b4", name="count", row=1, col=2)
    for v, dash in ((cell.median_s, "solid"), (cell.ci_low_s, "dot"), (cell.ci_high_s, "dot")):
        if v:
            fig.add_hline(y=v * 1e3, line={"color": "#d62728", "dash": dash, "width": 1}, row=1, col=1)
            fig.add_vline(x=v * 1e3, line={"color": "#d62728", "dash": dash, "width": 1}, row=1, col=2)
    fig.update_layout(**base_layout(title, height=380), showlegend=False)
    fig.update_yaxes(title_text="ms per call", row=1, col=1)
    fig.update_xaxes(title_text="sample", row=1, col=1)
    fig.update_xaxes(title_text="ms per call", row=1, col=2)
    spec = FigureSpec("samples", title, fig, "red: median (solid) and its 95 % CI (dotted)")
    return [(spec, figure_json(spec))]


def compare_figure(pairs: Sequence[Pair]) -> tuple[FigureSpec, str]:
    """Time ratio B/A of every compared cell by backend (log scale), coloured by verdict."""
    title = "Change per cell: time B / A (below 1: B is faster)"
    if not pairs:
        spec = FigureSpec("compare", title, None, "no cell was measured successfully in both runs")
        return spec, "null"
    shown = list(pairs[:MAX_COMPARE_POINTS])  # pairs come sorted by the size of the change
    backends = sorted({p.a.backend for p in shown}, key=lambda b: (b != "eager", b))
    pos = {b: i for i, b in enumerate(backends)}
    fig = go.Figure()
    for verdict, color in VERDICT_COLORS.items():
        sel = [p for p in shown if p.verdict == verdict]
        if not sel:
            continue
        jitter = [((zlib.crc32(p.a.cell_key.encode()) % 1000) / 1000 - 0.5) * 0.5 for p in sel]  # stable
        fig.add_scatter(
            x=[pos[p.a.backend] + j for p, j in zip(sel, jitter)],
            y=[p.ratio for p in sel],
            mode="markers",
            name=verdict,
            marker={"color": color, "size": 7, "opacity": 0.8},
            hovertext=[f"{p.a.setting_label} · {p.a.backend}<br>{p.change.figure}: {p.change.verdict.text}"
                       for p in sel],
            customdata=[[p.a.cell_key] for p in sel],
            hovertemplate="%{hovertext}<br>B/A = %{y:.3f}<extra></extra>",
        )
    fig.add_hline(y=1.0, line={"color": "#333", "width": 1})
    fig.update_layout(**base_layout(title, height=380))
    fig.update_layout(legend={"title": {"text": "verdict"}})
    fig.update_xaxes(tickvals=list(range(len(backends))), ticktext=backends, title_text="backend")
    lo = min(p.ratio for p in shown)
    hi = max(p.ratio for p in shown)
    pad = max(0.05, (math.log10(hi) - math.log10(lo)) * 0.1)
    fig.update_yaxes(type="log", title_text="time B / A", range=[math.log10(lo) - pad, math.log10(hi) + pad])
    note = f"{len(shown)} of {len(pairs)} cells (the largest changes)" if len(pairs) > len(shown) else ""
    spec = FigureSpec("compare", title, fig, note)
    return spec, figure_json(spec)

"""Throughput charts: maximum throughput by variant and setting, scaling with batch and length, speed-up over eager.

Each function takes the run's cells (latest rows) and returns a :class:`FigureSpec`; none reads the database, so the
report, the web view and the tests all build the very same figures from the same rows. Big runs are aggregated here
(a bounded number of bars, panels and heatmap rows) so that no page ships thousands of traces. Figures are plain
dicts (plotdict.py: graph_objects' validation cost the web view a second per 10,000-cell run).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence

from plotly.colors import get_colorscale

from .common import (
    BASELINE,
    MAX_BARS,
    MAX_COMPACT_BARS,
    MAX_HEATMAP_ROWS,
    MAX_PANELS,
    FigureSpec,
    axis_unit,
    backend_colors,
    base_layout,
    fmt_s,
    fmt_si,
    log_axis,
    spans_decade,
)
from .data import CellRow
from .plotdict import axis_suffix, new_plot, subplot_grid


def _category(c: CellRow, groups: int) -> str:
    return f"{c.model_label} · {c.group_label}" if groups > 1 else c.model_label


def max_throughput(cells: Sequence[CellRow]) -> FigureSpec:
    """The seed chart: per variant (with its parameters) and setting group, the best throughput of each backend over
    all batch sizes and lengths; a bar per backend, the best one starred and outlined."""
    title = "Maximum throughput by variant and setting"
    ok = [c for c in cells if c.ok]
    if not ok:
        return FigureSpec("max_throughput", title, None, "no successful cells")
    groups = len({c.group_label for c in ok})
    best: dict[tuple[str, str], CellRow] = {}
    for c in ok:
        k = (_category(c, groups), c.backend)
        if k not in best or (c.throughput or 0) > (best[k].throughput or 0):
            best[k] = c
    top: dict[str, float] = defaultdict(float)
    winner: dict[str, str] = {}
    for (cat, be), c in best.items():
        if (c.throughput or 0) > top[cat]:
            top[cat], winner[cat] = c.throughput or 0.0, be
    order = sorted(top, key=lambda k: top[k])[-MAX_BARS:]  # ascending: the best category ends up on top
    shown = set(order)
    note = f"{len(top) - len(order)} lower categories not shown" if len(top) > len(order) else ""
    unit = axis_unit(ok)  # the axis; each bar's text and hover carry its own cell's unit
    colors = backend_colors(c.backend for c in ok)
    # Compact when a bar per backend would make the chart a scroll: only each row's best bar, coloured by backend.
    compact = len(order) * len(colors) > MAX_COMPACT_BARS
    rank = {cat: i for i, cat in enumerate(order)}
    traces: list[dict] = []
    for be, color in colors.items():
        rows = [
            (cat, c) for (cat, b), c in best.items()
            if b == be and cat in shown and (not compact or winner[cat] == be)
        ]
        if not rows:
            continue
        rows.sort(key=lambda r: rank[r[0]])
        bands = [c.throughput_band for _, c in rows]
        traces.append(dict(
            type="bar",
            name=be,
            orientation="h",
            y=[cat for cat, _ in rows],
            x=[c.throughput for _, c in rows],
            error_x={
                "type": "data",
                "symmetric": False,
                "array": [(b[1] - (c.throughput or 0)) if b else 0 for b, (_, c) in zip(bands, rows)],
                "arrayminus": [((c.throughput or 0) - b[0]) if b else 0 for b, (_, c) in zip(bands, rows)],
                "thickness": 1,
            },
            text=[
                f"{'★ ' if winner[cat] == be else ''}{fmt_si(c.throughput)} {c.throughput_unit} · "
                f"{fmt_s(c.median_s)} · {c.shape_label}" for cat, c in rows
            ],
            textposition="auto",
            insidetextanchor="start",
            marker={
                "color": color,
                "line": {"color": ["#000" if winner[cat] == be else color for cat, _ in rows],
                         "width": [2.5 if winner[cat] == be else 0 for cat, _ in rows]},
            },
            customdata=[[c.cell_key, c.setting_label, c.throughput_unit] for _, c in rows],
            hovertemplate="%{customdata[1]}<br>" + be + ": %{x:.4g} %{customdata[2]}<extra></extra>",
        ))
    n_be = 1 if compact else max(1, len(traces))
    fig = new_plot(base_layout(
        title,
        height=max(320, 90 + 22 * len(order) * n_be),
        barmode="overlay" if compact else "group",
        showlegend=True,  # also with one backend: the colour must stay explained
        bargap=0.25,
        xaxis=(log_axis(top.values()) if spans_decade(top.values(), 3) else {"type": "linear"})
        | {"title": {"text": f"Throughput ({unit})"}},
        yaxis={"categoryorder": "array", "categoryarray": order, "automargin": True},
    ))
    fig["data"] = traces
    fig["layout"]["margin"]["l"] = 10
    marks = (
        f"one bar per row: its best backend ({len(order)} rows × {len(colors)} backends would not be readable; "
        "filter by backend in the web view to compare them)" if compact
        else "★ and outline: the best backend of each row"
    )
    return FigureSpec("max_throughput", title, fig, "; ".join(x for x in (marks, note) if x))


def common_setting(cells: Sequence[CellRow]) -> FigureSpec:
    """Backends compared at one setting per row: the batch and length most backends of that variant were measured at
    (ties: the largest). The maximum-throughput chart lets each backend pick its own best batch, which answers a
    different question; a comparison of backends needs them side by side at the same size."""
    title = "Throughput at one common setting per variant"
    ok = [c for c in cells if c.ok]
    if not ok:
        return FigureSpec("common_setting", title, None, "no successful cells")
    groups = len({c.group_label for c in ok})
    by_cat: dict[str, list[CellRow]] = defaultdict(list)
    for c in ok:
        by_cat[_category(c, groups)].append(c)
    rows: dict[str, list[CellRow]] = {}
    for cat, cs in by_cat.items():
        backends_at: dict[tuple[int | None, int | None], set[str]] = defaultdict(set)
        for c in cs:
            backends_at[(c.batch, c.seq_len)].add(c.backend)
        shape = max(backends_at, key=lambda k: (len(backends_at[k]), k[0] or 0, k[1] or 0))
        rows[f"{cat} · N={shape[0]} T={shape[1]}"] = [c for c in cs if (c.batch, c.seq_len) == shape]
    top = {r: max(c.throughput or 0.0 for c in cs) for r, cs in rows.items()}
    colors = backend_colors(c.backend for c in ok)
    # every backend has its bar here, so rows are fewer than in the compact chart: at most MAX_COMPACT_BARS bars
    order = sorted(top, key=lambda r: top[r])[-max(1, min(MAX_BARS, MAX_COMPACT_BARS // max(1, len(colors)))):]
    unit = axis_unit(ok)  # the axis; each bar's text and hover carry its own cell's unit
    traces: list[dict] = []
    for be, color in colors.items():
        pts = [(r, c) for r in order for c in rows[r] if c.backend == be]
        if not pts:
            continue
        traces.append(dict(
            type="bar", name=be, orientation="h", y=[r for r, _ in pts], x=[c.throughput for _, c in pts],
            text=[f"{fmt_si(c.throughput)} {c.throughput_unit} · {fmt_s(c.median_s)}" for _, c in pts],
            textposition="auto", insidetextanchor="start", marker={"color": color},
            customdata=[[c.cell_key, c.setting_label, c.throughput_unit] for _, c in pts],
            hovertemplate="%{customdata[1]}<br>" + be + ": %{x:.4g} %{customdata[2]}<extra></extra>",
        ))
    fig = new_plot(base_layout(
        title, height=max(320, 90 + 22 * len(order) * max(1, len(traces))), barmode="group", showlegend=True,
        bargap=0.25,
        xaxis=(log_axis(top.values()) if spans_decade(top.values(), 3) else {"type": "linear"})
        | {"title": {"text": f"Throughput ({unit})"}},
        yaxis={"categoryorder": "array", "categoryarray": order, "automargin": True},
    ))
    fig["data"] = traces
    fig["layout"]["margin"]["l"] = 10
    note = ("each row: every backend at the same batch and length, the one most backends were measured at "
            "(ties: the largest); the next chart lets each backend pick its own best size")
    if len(top) > len(order):
        note += f"; {len(top) - len(order)} lower rows not shown"
    return FigureSpec("common_setting", title, fig, note)


def _reference(cells: Sequence[CellRow], axis: str) -> tuple[str, int | None]:
    """The fixed coordinates of a scaling panel: the commonest setting group, and for the other size axis the value
    with most cells (ties: the largest), so each line has as many points as the run offers."""
    group = Counter(c.group_label for c in cells).most_common(1)[0][0]
    other = "seq_len" if axis == "batch" else "batch"
    counts = Counter(getattr(c, other) for c in cells if c.group_label == group)
    fixed = max(counts, key=lambda v: (counts[v], v or 0)) if counts else None
    return group, fixed


def scaling(cells: Sequence[CellRow], axis: str) -> FigureSpec:
    """Throughput vs ``axis`` ("batch" or "seq_len"), one panel per variant, one line per backend, 95 % CI bands."""
    label = "batch size" if axis == "batch" else "sequence length"
    fid = "scaling_batch" if axis == "batch" else "scaling_seq"
    title = f"Throughput vs {label}"
    ok = [c for c in cells if c.ok]
    by_model: dict[str, list[CellRow]] = defaultdict(list)
    for c in ok:
        by_model[c.model_label].append(c)
    models = [m for m in by_model if len({getattr(c, axis) for c in by_model[m]}) > 1]
    if not models:
        return FigureSpec(fid, title, None, f"no variant was measured at more than one {label}")
    models.sort(key=lambda m: -max(c.throughput or 0 for c in by_model[m]))
    note = f"{len(models) - MAX_PANELS} more variants not shown" if len(models) > MAX_PANELS else ""
    models = models[:MAX_PANELS]
    other = "T" if axis == "batch" else "N"
    refs = {m: _reference(by_model[m], axis) for m in models}
    ncols = min(3, len(models))
    nrows = math.ceil(len(models) / ncols)
    fig = new_plot(base_layout(title, height=120 + 300 * nrows))
    subplot_grid(
        fig["layout"],
        nrows,
        ncols,
        titles=[f"{m}<br><sup>{refs[m][0]}, {other}={refs[m][1]}</sup>" for m in models],
        horizontal_spacing=0.08,
        vertical_spacing=0.18 if nrows > 1 else 0.1,
    )
    colors = backend_colors(c.backend for c in ok)
    mixed = len({c.throughput_unit for m in models for c in by_model[m]}) > 1  # then every panel names its unit
    other_attr = "seq_len" if axis == "batch" else "batch"
    legend_done: set[str] = set()
    for i, m in enumerate(models):
        row, col = i // ncols + 1, i % ncols + 1
        ax = axis_suffix(row, col, ncols)
        group, fixed = refs[m]
        sel = [c for c in by_model[m] if c.group_label == group and getattr(c, other_attr) == fixed]
        for be, color in colors.items():
            pts = sorted((c for c in sel if c.backend == be), key=lambda c: getattr(c, axis) or 0)
            if not pts:
                continue
            xs = [getattr(c, axis) for c in pts]
            bands = [c.throughput_band or (c.throughput, c.throughput) for c in pts]
            fig["data"].append(dict(
                type="scatter",
                xaxis="x" + ax,
                yaxis="y" + ax,
                x=xs + xs[::-1],
                y=[b[1] for b in bands] + [b[0] for b in bands][::-1],
                fill="toself",
                mode="lines",
                fillcolor=color,
                opacity=0.2,
                line={"width": 0},
                hoverinfo="skip",
                showlegend=False,
                legendgroup=be,
                name=f"{be} 95% CI",
            ))
            fig["data"].append(dict(
                type="scatter",
                xaxis="x" + ax,
                yaxis="y" + ax,
                x=xs,
                y=[c.throughput for c in pts],
                mode="lines+markers",
                name=be,
                legendgroup=be,
                showlegend=be not in legend_done,
                line={"color": color},
                customdata=[[c.cell_key, c.setting_label, c.throughput_unit] for c in pts],
                hovertemplate="%{customdata[1]}<br>" + be + ": %{y:.4g} %{customdata[2]}<extra></extra>",
            ))
            legend_done.add(be)
        xs_all = sorted({getattr(c, axis) for c in sel})
        ticks = {"tickvals": xs_all} if len(xs_all) <= 12 else {}  # sizes are integers: no "2.5" ticks
        fig["layout"]["xaxis" + ax].update(type="log" if spans_decade(xs_all) else "linear", title={"text": label},
                                           **ticks)
        title_y = {"title": {"text": axis_unit(sel)}} if col == 1 or mixed else {}  # a panel is one variant
        fig["layout"]["yaxis" + ax].update(rangemode="tozero", **title_y)
    return FigureSpec(fid, title, fig, note or "lines: median; bands: 95 % confidence interval of the median")


def speedup(cells: Sequence[CellRow]) -> FigureSpec:
    """Speed-up of every backend over eager in each setting (eager time / backend time); colour on a log2 scale so
    that 2× faster and 2× slower are equally strong. Big runs: geometric mean per variant and setting group."""
    title = f"Speed-up over {BASELINE}, per setting"
    ok = [c for c in cells if c.ok and c.median_s]
    base = {c.setting_key: c for c in ok if c.backend == BASELINE}
    if not base:
        return FigureSpec("speedup", title, None, f"no successful {BASELINE} cells to compare with")
    others = sorted({c.backend for c in ok if c.backend != BASELINE})
    if not others:
        return FigureSpec("speedup", title, None, f"only {BASELINE} was measured")
    ratios: dict[tuple[str, str], list[float]] = defaultdict(list)
    settings = {c.setting_key for c in ok if c.backend != BASELINE and c.setting_key in base}
    aggregate = len(settings) > MAX_HEATMAP_ROWS
    groups = len({c.group_label for c in ok})
    labels: dict[str, str] = {}
    for c in ok:
        b = base.get(c.setting_key)
        if c.backend == BASELINE or b is None or not b.median_s:
            continue
        row = _category(c, groups) if aggregate else f"{c.model_label} · {c.shape_label}" + (
            f" · {c.group_label}" if groups > 1 else ""
        )
        labels[row] = row
        ratios[(row, c.backend)].append(b.median_s / (c.median_s or math.inf))
    if not ratios:
        return FigureSpec("speedup", title, None, f"no setting has both {BASELINE} and another backend")
    rows = sorted(labels)
    if aggregate:
        rows = rows[:MAX_HEATMAP_ROWS]

    def gmean(v: list[float]) -> float | None:
        v = [x for x in v if x > 0]
        return math.exp(sum(math.log(x) for x in v) / len(v)) if v else None

    z, text, raw, counts = [], [], [], []
    for r in rows:
        vals = [gmean(ratios.get((r, be), [])) for be in others]
        raw.append(vals)
        z.append([math.log2(v) if v else None for v in vals])
        text.append([f"{v:.2f}×" if v else "" for v in vals])
        counts.append([len(ratios.get((r, be), [])) for be in others])
    zmax = max([abs(v) for row in z for v in row if v is not None] + [0.5])
    heatmap = dict(
        type="heatmap",
        x=others,
        y=rows,
        z=z,
        text=text,
        texttemplate="%{text}",
        customdata=[[[v, n] for v, n in zip(rv, rn)] for rv, rn in zip(raw, counts)],
        colorscale=get_colorscale("RdBu"),  # plotly.py's RdBu (red = slower); plotly.js's own "RdBu" is reversed
        zmid=0,
        zmin=-zmax,
        zmax=zmax,
        colorbar={"title": {"text": "speed-up"}, "tickvals": [-2, -1, 0, 1, 2],
                  "ticktext": ["¼×", "½×", "1×", "2×", "4×"]},
        hovertemplate="%{y}<br>%{x}: %{customdata[0]:.3f}× over " + BASELINE
        + (" (geometric mean of %{customdata[1]} settings)" if aggregate else "") + "<extra></extra>",
        xgap=2,
        ygap=2,
    )
    fig = new_plot(base_layout(title, height=max(300, 120 + 24 * len(rows)),
                               yaxis={"automargin": True, "autorange": "reversed"}))
    fig["data"].append(heatmap)
    fig["layout"]["margin"]["l"] = 10
    note = (
        f"{len(settings)} settings: geometric mean per variant and setting group" if aggregate
        else f"{BASELINE} time / backend time; blue: faster than {BASELINE}"
    )
    return FigureSpec("speedup", title, fig, note)

"""Where the time goes: roofline position, compile vs steady-state time, latency distributions, GPU telemetry.

Like figures.py these are pure functions of the cells (plus the run's environment for the machine peaks and the
samples of the few cells whose distributions are drawn), and build plain figure dicts (see plotdict.py).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from .common import MAX_BARS, FigureSpec, backend_colors, base_layout, fmt_si, log_axis
from .data import CellRow
from .plotdict import axis_suffix, new_plot, subplot_grid

MAX_BOX_SAMPLES = 1000  # per cell; larger sample sets are reduced to evenly spaced quantiles (same distribution)
MAX_LATENCY_MODELS = 8
MAX_SCATTER_POINTS = 1000  # cells drawn in the roofline and compile-time scatters; more are subsampled


def subsample(cells: Sequence[CellRow], limit: int, key: Callable[[CellRow], float]) -> list[CellRow]:
    """At most ``limit`` cells, deterministically: every backend keeps its share, made of its best quarter (by
    ``key``) and an evenly spaced sample of the rest, so the cloud keeps its shape and its top edge. Drawing 10,000
    markers costs the browser seconds and shows nothing more than 2,000 do."""
    if len(cells) <= limit:
        return list(cells)
    by_be: dict[str, list[CellRow]] = defaultdict(list)
    for c in cells:
        by_be[c.backend].append(c)
    out: list[CellRow] = []
    for sel in by_be.values():
        quota = max(1, limit * len(sel) // len(cells))
        ranked = sorted(sel, key=key, reverse=True)
        top = quota // 4
        rest = ranked[top:]
        step = max(1, len(rest) / max(1, quota - top))
        out += ranked[:top] + [rest[int(i * step)] for i in range(min(len(rest), quota - top))]
    return out


def point_labels(sel: Sequence[CellRow]) -> dict[str, Any]:
    """Hover text for scatter points, plus the cell key as customdata (the web view opens a clicked cell's page)."""
    return {"hovertext": [c.setting_label for c in sel], "customdata": [[c.cell_key] for c in sel]}


def machine_peaks(env: Mapping[str, Any]) -> tuple[float | None, float | None, dict[str, float]]:
    """(peak FLOP/s, peak bytes/s, peak FLOP/s per dtype) from the run's environment, wherever the runner put them."""
    flat = dict(flatten(env))

    def pick(name: str) -> Any:
        for k, v in flat.items():
            if k == name or k.endswith("." + name):
                return v
        return None

    by_dtype = pick("peak_flops_by_dtype") or {}
    if not isinstance(by_dtype, dict):
        by_dtype = {}
    by_dtype = {k: float(v) for k, v in by_dtype.items() if isinstance(v, int | float) and v > 0}
    for k, v in flat.items():  # flattened form of the same mapping
        if ".peak_flops_by_dtype." in f".{k}" and isinstance(v, int | float) and v > 0:
            by_dtype[k.rsplit(".", 1)[1]] = float(v)

    def pos(x: Any) -> float | None:
        return float(x) if isinstance(x, int | float) and math.isfinite(x) and x > 0 else None

    return pos(pick("peak_flops")), pos(pick("peak_bytes_per_s")), by_dtype


def flatten(d: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Nested mappings as dotted keys; leaves (including lists) as they are."""
    if isinstance(d, Mapping):
        for k, v in d.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, Mapping) and v:
                yield from flatten(v, key)
            else:
                yield key, v
    elif prefix:
        yield prefix, d


def roofline(cells: Sequence[CellRow], env: Mapping[str, Any]) -> FigureSpec:
    """Achieved FLOP/s vs arithmetic intensity (FLOPs per byte moved) under the measured compute and bandwidth
    roofs: a point far below the roof at its intensity has headroom; near the slanted part it is memory bound."""
    title = "Roofline: achieved FLOP/s vs arithmetic intensity"
    pts = [c for c in cells if c.ok and c.intensity and c.achieved_flops]
    if not pts:
        return FigureSpec("roofline", title, None, "no cell recorded FLOPs, bytes and achieved FLOP/s")
    n_all = len(pts)
    pts = subsample(pts, MAX_SCATTER_POINTS, key=lambda c: c.achieved_flops or 0.0)
    peak, bw, by_dtype = machine_peaks(env)
    colors = backend_colors(c.backend for c in pts)
    fig = new_plot(base_layout(
        title, height=460,
        xaxis=log_axis([c.intensity for c in pts], title={"text": "arithmetic intensity (FLOP/byte)"}),
        yaxis=log_axis([c.achieved_flops for c in pts], title={"text": "achieved FLOP/s"}, exponentformat="SI"),
    ))
    xs = [c.intensity or 0.0 for c in pts]
    lo, hi = min(xs) / 4, max(xs) * 4
    if peak and bw:
        ridge = peak / bw
        lo, hi = min(lo, ridge / 4), max(hi, ridge * 4)
        grid = sorted({lo, ridge, hi})
        fig["data"].append(dict(
            type="scatter", x=grid, y=[min(peak, bw * x) for x in grid], mode="lines", name="roof (measured peaks)",
            line={"color": "#333", "width": 2}, legendgroup="roof",
            hovertemplate="roof: %{y:.3s}FLOP/s at %{x:.3g} FLOP/B<extra></extra>",
        ))
        for dt, p in sorted(by_dtype.items()):
            if abs(p - peak) / peak > 0.01:
                fig["data"].append(dict(
                    type="scatter", x=[p / bw, hi], y=[p, p], mode="lines", name=f"{dt} peak",
                    line={"dash": "dot", "width": 1}, legendgroup="roof",
                    hovertemplate=f"{dt} peak: %{{y:.3s}}FLOP/s<extra></extra>",
                ))
        note = f"peaks: {fmt_si(peak, 'FLOP/s')}, {fmt_si(bw, 'B/s')} (ridge at {ridge:.3g} FLOP/B)"
    else:
        note = "machine peaks not measured for this run: points only"
    if n_all > len(pts):
        note += f"; {len(pts)} of {n_all} cells drawn (each backend's best and an even sample)"
    _scatter_by_backend(fig, pts, colors, n_all, lambda c: c.intensity, lambda c: c.achieved_flops,
                        ": %{y:.3s}FLOP/s at %{x:.3g} FLOP/B", opacity=0.8)
    return FigureSpec("roofline", title, fig, note)


def _scatter_by_backend(fig: dict, pts: Sequence[CellRow], colors: dict[str, str], n_all: int,
                        x: Callable[[CellRow], Any], y: Callable[[CellRow], Any], hover: str,
                        opacity: float | None = None) -> None:
    """One marker trace per backend (its colour), points labelled by cell; smaller markers once subsampled."""
    marker: dict[str, Any] = {"size": 8 if n_all <= MAX_SCATTER_POINTS else 5}
    if opacity is not None:
        marker["opacity"] = opacity
    for be, color in colors.items():
        sel = [c for c in pts if c.backend == be]
        if sel:
            fig["data"].append(dict(
                type="scatter", x=[x(c) for c in sel], y=[y(c) for c in sel], mode="markers", name=be,
                marker={"color": color, **marker}, **point_labels(sel),
                hovertemplate="%{hovertext}<br>" + be + hover + "<extra></extra>",
            ))


def compile_vs_steady(cells: Sequence[CellRow]) -> FigureSpec:
    """Compile (or first-call) cost against steady-state time per call: the ratio is how many calls a compiled
    backend needs before its compile time is paid back."""
    title = "Compile time vs steady-state time per call"
    pts = [c for c in cells if c.ok and c.median_s and (c.compile_s or c.first_call_s)]
    if not pts:
        return FigureSpec("compile", title, None, "no cell recorded compile or first-call time")
    n_all = len(pts)
    pts = subsample(pts, MAX_SCATTER_POINTS, key=lambda c: c.compile_s or c.first_call_s or 0.0)
    colors = backend_colors(c.backend for c in pts)
    fig = new_plot(base_layout(
        title, height=420,
        xaxis=log_axis([c.median_s for c in pts], title={"text": "steady-state median time per call (s)"},
                       exponentformat="SI"),
        yaxis=log_axis([c.compile_s or c.first_call_s for c in pts],
                       title={"text": "compile time (s; first call where no compile)"}, exponentformat="SI"),
    ))
    _scatter_by_backend(fig, pts, colors, n_all, lambda c: c.median_s,
                        lambda c: c.compile_s if c.compile_s is not None else c.first_call_s,
                        ": compile %{y:.3s}s, steady %{x:.3s}s/call")
    note = "each point is a cell; higher and left: compile dominates short jobs"
    if n_all > len(pts):
        note += f"; {len(pts)} of {n_all} cells drawn (each backend's slowest compiles and an even sample)"
    return FigureSpec("compile", title, fig, note)


def latency_cells(cells: Sequence[CellRow]) -> list[CellRow]:
    """The cells whose sample distributions are drawn: every backend in each variant's best setting (bounded, so a
    huge run still loads the samples of only a few dozen cells)."""
    ok = [c for c in cells if c.ok]
    best: dict[str, CellRow] = {}
    for c in ok:
        if c.model_label not in best or (c.throughput or 0) > (best[c.model_label].throughput or 0):
            best[c.model_label] = c
    models = sorted(best, key=lambda m: -(best[m].throughput or 0))[:MAX_LATENCY_MODELS]
    keys = {best[m].setting_key for m in models}
    return [c for c in ok if c.setting_key in keys]


def _reduce(samples: Sequence[float]) -> list[float]:
    if len(samples) <= MAX_BOX_SAMPLES:
        return list(samples)
    return np.quantile(np.asarray(samples), np.linspace(0, 1, MAX_BOX_SAMPLES)).tolist()


def latency(cells: Sequence[CellRow], samples: Mapping[str, Sequence[float]]) -> FigureSpec:
    """Per-call latency distributions (box per backend) at each variant's best setting: the median hides jitter, a
    long upper tail (GC, frequency drops, other tenants) shows here."""
    title = "Latency distributions at each variant's best setting"
    sel = [c for c in latency_cells(cells) if samples.get(c.cell_key)]
    if not sel:
        return FigureSpec("latency", title, None, "no per-call samples recorded")
    colors = backend_colors(c.backend for c in sel)
    fig = new_plot(base_layout(title, height=440, boxmode="group",
                               yaxis=log_axis([x for c in sel for x in samples[c.cell_key]],
                                              title={"text": "time per call (ms)"})))
    for be, color in colors.items():
        xs: list[str] = []
        ys: list[float] = []
        for c in sel:
            if c.backend == be:
                vals = _reduce(samples[c.cell_key])
                xs += [f"{c.model_label}<br>{c.shape_label}"] * len(vals)
                ys += [v * 1e3 for v in vals]
        fig["data"].append(dict(type="box", x=xs, y=ys, name=be, marker={"color": color}, boxpoints=False,
                                hovertemplate="%{y:.4g} ms"))
    return FigureSpec("latency", title, fig, "boxes: quartiles; whiskers: 1.5 IQR")


GPU_KEYS = {
    "sm_clock_mhz_mean": "SM clock (MHz)",
    "power_w_mean": "power (W)",
    "energy_per_call_j": "energy per call (J)",
    "energy_per_item_j": "energy per item (J)",
}


def gpu_metrics_of(c: CellRow) -> dict[str, Any]:
    """The NVML summary of a cell, wherever in metrics_json the runner nested it."""
    out: dict[str, Any] = {}
    for k, v in flatten(c.metrics):
        leaf = k.rsplit(".", 1)[-1]
        if leaf in GPU_KEYS and isinstance(v, int | float) and math.isfinite(v):
            out[leaf] = float(v)
        elif leaf == "throttle_reasons" and v:
            out[leaf] = [str(x) for x in v] if isinstance(v, list) else [str(v)]
    if "throttle_reasons" in out:
        out["throttle_reasons"] = [r for r in out["throttle_reasons"] if r not in ("gpu_idle", "none")]
    return out


def gpu_bar_label(c: CellRow, groups: int) -> str:
    """A cell's category on the GPU figure's x axes. With more than one dtype / layout / mode / device in the run the
    group is part of it: without, a float32 and a float16 cell of the same model and shape shared one category and
    their bars were drawn over each other."""
    label = f"{c.model_label} {c.shape_label}"
    return f"{label} · {c.group_label}" if groups > 1 else label


def gpu(cells: Sequence[CellRow]) -> FigureSpec:
    """SM clock, power, energy per call and per item (a sequence, a vector: the unit of the cell's throughput) per
    cell; throttled cells drawn red with the reasons in the hover, since a throttled measurement is a measurement of
    the cooling, not of the code."""
    title = "GPU metrics (clock, power, energy per call and per item)"
    ncols = len(GPU_KEYS)
    rows = [(c, gpu_metrics_of(c)) for c in cells if c.ok]
    rows = [(c, m) for c, m in rows if any(k in m for k in GPU_KEYS)]
    if not rows:
        return FigureSpec("gpu", title, None, "no GPU metrics in this run (a CPU sweep, or NVML unavailable)")
    rows.sort(key=lambda r: -(r[0].throughput or 0))
    note = f"{len(rows) - MAX_BARS} more cells not shown" if len(rows) > MAX_BARS else ""
    rows = rows[:MAX_BARS]
    fig = new_plot(base_layout(title, height=440, barmode="group"))
    subplot_grid(fig["layout"], 1, ncols, titles=list(GPU_KEYS.values()), horizontal_spacing=0.05)
    colors = backend_colors(c.backend for c, _ in rows)
    groups = len({c.group_label for c, _ in rows})
    throttled = sum(1 for _, m in rows if m.get("throttle_reasons"))
    for j, key in enumerate(GPU_KEYS, start=1):
        per_be: dict[str, list[tuple[CellRow, dict[str, Any]]]] = defaultdict(list)
        for c, m in rows:
            if key in m:
                per_be[c.backend].append((c, m))
        for be, sel in per_be.items():
            flags = [", ".join(m.get("throttle_reasons", [])) for _, m in sel]
            ax = axis_suffix(1, j, ncols)
            fig["data"].append(dict(
                type="bar",
                xaxis="x" + ax,
                yaxis="y" + ax,
                x=[gpu_bar_label(c, groups) for c, _ in sel],
                y=[m[key] for _, m in sel],
                name=be,
                legendgroup=be,
                showlegend=j == 1,
                marker={"color": [("#d62728" if f else colors[be]) for f in flags],
                        "line": {"color": colors[be], "width": 1.5}},
                customdata=[[c.cell_key, f or "none"] for (c, _), f in zip(sel, flags)],
                hovertemplate="%{x}<br>" + be + ": %{y:.4g}<br>throttle: %{customdata[1]}<extra></extra>",
            ))
    for j in range(1, ncols + 1):
        fig["layout"]["xaxis" + axis_suffix(1, j, ncols)]["showticklabels"] = len(rows) <= 12
    flag = f"{throttled} cell(s) throttled (red)" if throttled else "no throttling recorded"
    return FigureSpec("gpu", title, fig, "; ".join(x for x in (flag, note) if x))

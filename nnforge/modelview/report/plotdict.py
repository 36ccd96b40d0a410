"""Figures as plain dicts (``{"data": [...], "layout": {...}}``, exactly the JSON plotly.js takes) and their JSON.

Why not plotly.graph_objects for the run's charts: graph_objects validates every property on every assignment and
deep-copies the template into each figure; for a 10,000-cell run that was about half of the 2-3 s the web view spent
before it could answer the first request for a run. Our charts are a few dozen traces written by our own code, so
plotly.js's own checking is enough. Tests and notebooks still get a ``go.Figure`` (``FigureSpec.figure`` builds one
on demand, validating then), so a wrong property name still fails a test.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

Plot = dict[str, Any]


def new_plot(layout: dict[str, Any]) -> Plot:
    return {"data": [], "layout": layout}


def axis_suffix(row: int, col: int, cols: int) -> str:
    """'' for the first subplot, then '2', '3', ... row-major, as plotly names them (xaxis2 / x2)."""
    k = (row - 1) * cols + col
    return "" if k == 1 else str(k)


def subplot_grid(
    layout: dict[str, Any],
    rows: int,
    cols: int,
    titles: Sequence[str] = (),
    horizontal_spacing: float | None = None,
    vertical_spacing: float | None = None,
    column_widths: Sequence[float] | None = None,
) -> None:
    """Axes and title annotations of a rows x cols grid, laid out as ``plotly.subplots.make_subplots`` does (row 1 on
    top), written into ``layout``. Traces refer to a cell with ``xaxis="x" + axis_suffix(...)`` (and y likewise)."""
    hs = 0.2 / cols if horizontal_spacing is None else horizontal_spacing
    vs = 0.3 / rows if vertical_spacing is None else vertical_spacing
    rel = list(column_widths or [1.0] * cols)
    widths = [w / sum(rel) * (1 - hs * (cols - 1)) for w in rel]
    height = (1 - vs * (rows - 1)) / rows
    annotations = layout.setdefault("annotations", [])
    for r in range(1, rows + 1):
        top = 1 - (r - 1) * (height + vs)
        for c in range(1, cols + 1):
            x0 = sum(widths[: c - 1]) + hs * (c - 1)
            x1 = x0 + widths[c - 1]
            s = axis_suffix(r, c, cols)
            layout[f"xaxis{s}"] = {"anchor": f"y{s}", "domain": [x0, x1]}
            layout[f"yaxis{s}"] = {"anchor": f"x{s}", "domain": [max(0.0, top - height), top]}
            k = (r - 1) * cols + c - 1
            if k < len(titles):
                annotations.append({
                    "text": titles[k], "x": (x0 + x1) / 2, "y": top, "xref": "paper", "yref": "paper",
                    "xanchor": "center", "yanchor": "bottom", "showarrow": False, "font": {"size": 16},
                })


@lru_cache(maxsize=8)
def template_json(name: str) -> str:
    """A named plotly.py template as JSON (plotly.js knows no template names; plotly.py inlines them too)."""
    import plotly.io as pio

    return json.dumps(pio.templates[name].to_plotly_json(), separators=(",", ":"))


def _default(o: Any) -> Any:
    if hasattr(o, "tolist"):  # numpy arrays and scalars
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def plot_json(plot: Plot) -> str:
    """The figure as compact JSON with its named template inlined. Non-finite numbers (which JSON.parse rejects) go
    through plotly's encoder, which writes them as null."""
    layout = plot.get("layout", {})
    template = layout.get("template")
    if isinstance(template, str):
        layout = {**layout, "template": "\0TEMPLATE\0"}
    try:
        text = json.dumps({"data": plot.get("data", []), "layout": layout}, separators=(",", ":"), allow_nan=False,
                          default=_default)
    except ValueError:
        import plotly.io as pio

        text = pio.to_json({"data": plot.get("data", []), "layout": layout}, validate=False)
    if isinstance(template, str):
        text = text.replace('"\\u0000TEMPLATE\\u0000"', template_json(template), 1)
    return text

"""Shared pieces of the figures: the figure record, stable backend colours, number formatting, layout defaults.

Why one colour per backend everywhere: a reader learns "orange is jit.script" once, on the first chart, and every
later chart (scaling, roofline, latency) reads at a glance.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from .data import CellRow

PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip
BASELINE = "eager"
MAX_BARS = 40  # categories in the throughput chart before the rest are summarised in its note
MAX_COMPACT_BARS = 60  # rows × backends above which the throughput chart shows only each row's best bar
MAX_PANELS = 6  # variants shown in the scaling charts
MAX_HEATMAP_ROWS = 60  # settings before the speed-up heatmap aggregates (geometric mean) per variant and setting group


@dataclass(frozen=True)
class FigureSpec:
    """One chart of the report: ``plot`` is None when the run has no data for it, and ``note`` says why.

    ``plot`` is either a plain figure dict (the run's charts, built cheaply; see plotdict.py) or a ``go.Figure``;
    ``figure`` is always a ``go.Figure``, built from the dict on first use (tests and notebooks; pages never need it).
    """

    id: str
    title: str
    plot: go.Figure | dict[str, Any] | None
    note: str = ""

    @cached_property
    def figure(self) -> go.Figure | None:
        if self.plot is None or not isinstance(self.plot, dict):
            return self.plot
        import plotly.graph_objects as go

        return go.Figure(self.plot)


def backend_colors(backends: Iterable[str]) -> dict[str, str]:
    """Eager first (the baseline is always blue), then the rest alphabetically."""
    names = sorted(set(backends), key=lambda b: (b != BASELINE, b))
    return {b: PALETTE[i % len(PALETTE)] for i, b in enumerate(names)}


def fmt_si(x: float | None, unit: str = "") -> str:
    """3 significant digits with an SI prefix: 2.62 M vectors/s, 41.3 GFLOP/s."""
    if x is None or not math.isfinite(x):
        return "–"
    for f, p in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""), (1e-3, "m"), (1e-6, "µ"), (1e-9, "n")):
        if abs(x) >= f:
            return f"{x / f:.3g} {p}{unit}".strip()
    return f"{x:.3g} {unit}".strip()


def fmt_s(x: float | None) -> str:
    return fmt_si(x, "s")


MIXED_UNITS = "per variant's unit"


def axis_unit(cells: Sequence[CellRow]) -> str:
    """The unit for a throughput axis: the cells' one unit, or ``MIXED_UNITS`` when they have several (a basecaller
    counts samples/s, an LSTM vectors/s: one unit on the axis would mislabel the others; each bar says its own)."""
    units = {c.throughput_unit for c in cells if c.ok}
    return units.pop() if len(units) == 1 else (MIXED_UNITS if units else "vectors/s")


def base_layout(title: str, height: int = 420, **extra: Any) -> dict[str, Any]:
    """Common layout. The title goes into ``meta`` (the page's section heading shows it; a second title inside the
    plot would only take space), so a figure exported on its own still knows what it is."""
    return {
        "meta": {"title": title},
        "template": "plotly_white",
        "height": height,
        "margin": {"l": 60, "r": 20, "t": 30, "b": 50},
        "legend": {"title": {"text": "backend"}},
        "hoverlabel": {"namelength": -1},
        **extra,
    }


def log_axis(values: Iterable[float | None], **extra: Any) -> dict[str, Any]:
    """A log axis; when the values span a decade or more, without plotly's bare-digit minor labels ("2", "5" between
    the decades read as values of their own). With less than a decade those are the only labels, so they stay."""
    minor = {"minorloglabels": "none"} if spans_decade(values, 10.0) else {}
    return {"type": "log", **minor, **extra}


def spans_decade(values: Iterable[float | None], factor: float = 8.0) -> bool:
    """Whether an axis should be logarithmic: the positive values span at least ``factor``."""
    v = [x for x in values if x is not None and x > 0]
    return bool(v) and max(v) / min(v) >= factor

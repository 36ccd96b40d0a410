"""The revisions chart of an ``nnforge ab`` / ``nnforge history`` run: each cell's time relative to the first
revision, commit by commit, with its interval, and the commits that stepped.

The figures come from ``stats.judge_paired`` on the stored rounds — the same function the command line uses — so
the chart and ``nnforge history`` name the same commits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..stats import judge_paired, timing_from
from .common import FigureSpec, base_layout
from .data import CellRow, RunInfo
from .plotdict import new_plot

THRESHOLD = 0.05  # steps of runs that recorded no rule of their own (before ab / history stored theirs)
MAX_LINES = 40


def revisions_figure(cells: Sequence[CellRow], run: RunInfo,
                     samples: Mapping[str, tuple[float, ...]]) -> FigureSpec | None:
    """None for an ordinary sweep (no revisions in its environment)."""
    revs = run.env.get("revisions")
    if not revs:
        return None
    title = "Time per call relative to the first revision"
    rule = run.env.get("steps") or {}  # the threshold and confidence ``ab`` / ``history`` judged steps by
    threshold, confidence = rule.get("threshold", THRESHOLD), rule.get("confidence", 0.99)
    lines: dict[tuple[str, str], dict[int, CellRow]] = {}
    for c in cells:
        i = c.metrics.get("revision_index")
        if c.ok and isinstance(i, int) and samples.get(c.cell_key):
            lines.setdefault((c.setting_key, c.metrics.get("backend_name") or c.backend), {})[i] = c
    if not lines:
        return FigureSpec("revisions", title, None, "no cell was timed in every revision")
    labels = [f"{r['commit'][:10]} {r['subject'][:30]}" for r in revs]
    traces: list[dict] = []
    steps = 0
    for (_, backend), by_rev in list(lines.items())[:MAX_LINES]:
        ref = by_rev.get(0)
        if ref is None:
            continue
        t_ref = timing_from(samples[ref.cell_key], ref.metrics)
        xs, ys, lo, hi, marks = [], [], [], [], []
        prev = None
        for i in sorted(by_rev):
            c = by_rev[i]
            t = timing_from(samples[c.cell_key], c.metrics)
            v = judge_paired(t, t_ref) if i else None
            r, a, b = (1.0, 1.0, 1.0) if v is None else (1 + v.change, 1 + v.ci[0], 1 + v.ci[1])
            xs.append(labels[i])
            ys.append(r)
            lo.append(r - a)
            hi.append(b - r)
            step = judge_paired(t, prev, threshold, confidence) if prev is not None else None
            stepped = step is not None and step.verdict in ("slower", "faster") and abs(step.change) >= threshold
            steps += stepped
            marks.append(f"step {100 * step.change:+.1f} %" if stepped and step else "")
            prev = t
        name = f"{ref.model_label} {ref.shape_label} · {backend}"
        traces.append({"type": "scatter", "mode": "lines+markers+text", "name": name, "x": xs, "y": ys,
                       "text": marks, "textposition": "top center",
                       "error_y": {"type": "data", "symmetric": False, "array": hi, "arrayminus": lo},
                       "hovertemplate": "%{x}<br>" + name + ": %{y:.3f}× the first revision<extra></extra>"})
    fig = new_plot(base_layout(title, height=420, yaxis={"title": {"text": "time / first revision"}},
                               xaxis={"title": {"text": "revision (oldest first)"}, "type": "category"}))
    fig["data"] = traces
    note = (f"rounds of all revisions interleaved in one schedule; bars: 99 % intervals; a step: a commit "
            f"significantly different from its predecessor by ≥ {100 * threshold:g} % ({steps} marked)")
    if len(lines) > MAX_LINES:
        note += f"; {len(lines) - MAX_LINES} more cells not shown"
    return FigureSpec("revisions", title, fig, note)

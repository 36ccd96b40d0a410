"""``nnforge compare RUN_A RUN_B``: which cells changed, and whether the runs can tell.

Cells are matched by their stable key. The figure judged for a cell is its time **relative to the baseline backend of
the same setting** (default ``eager``), taken round by round inside each run — the machine's pace cancels there, so
this figure reproduced to 1–3 % between runs where absolute times drifted by 10–17 %. The baseline's own cells (and
settings without one, or with ``absolute=True``) are judged on their absolute time. The errors come from independent
units (rounds, processes; ``stats.estimate``) plus, when a side has no repeated processes to measure it, a stated
between-run noise floor; the verdict itself is ``stats.judge`` — the same function the web view, ``nnforge ab`` and
``nnforge history`` use.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .console import setting_label
from .stats import Estimate, Timing, Verdict, estimate, judge, pooled_between, timing_from, with_between
from .store import Store

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_BASELINE = "eager"
DEFAULT_THRESHOLD = 0.05
DEFAULT_CONFIDENCE = 0.99
# Standard deviation of the between-run difference that one process per run cannot reveal, by the runs' clock
# ("cpu": process CPU time; "wall": wall time or CUDA events); docs/modelview.md, "Comparing runs", gives the
# measurements behind these defaults.
FLOORS = {"cpu": (0.03, 0.10), "wall": (0.08, 0.20)}
DEFAULT_FLOOR_RATIO, DEFAULT_FLOOR_TIME = FLOORS["wall"]


def floors_for(*specs: dict[str, Any]) -> dict[str, float]:
    """The noise floors for runs with these specs: the CPU-time ones only when every run timed CPU time."""
    cpu = all((s.get("timing") or {}).get("clock") == "cpu" for s in specs)
    ratio, time_ = FLOORS["cpu" if cpu else "wall"]
    return {"floor_ratio": ratio, "floor_time": time_}


@dataclass(frozen=True)
class TimedCell:
    """What the comparison needs of one ok cell of a run."""

    cell_key: str
    setting_key: str
    backend: str
    label: str
    median_s: float
    timing: Timing


@dataclass(frozen=True)
class CellChange:
    cell_key: str
    label: str
    backend: str
    median_a: float
    median_b: float
    figure: str  # "time", or "vs <baseline>"
    estimate_a: Estimate
    estimate_b: Estimate
    verdict: Verdict

    @property
    def change(self) -> float:
        """Relative change of the judged figure, B vs A (negative: B is faster)."""
        return self.verdict.change

    def as_dict(self) -> dict[str, Any]:
        return {"cell_key": self.cell_key, "label": self.label, "backend": self.backend, "median_a_s": self.median_a,
                "median_b_s": self.median_b, "figure": self.figure, "units_a": self.estimate_a.units,
                "units_b": self.estimate_b.units, "processes_a": self.estimate_a.processes,
                "processes_b": self.estimate_b.processes, **self.verdict.as_dict()}


def timed_cells_from_frame(df: pd.DataFrame) -> tuple[list[TimedCell], dict[str, str]]:
    """The ok cells of a run's DataFrame (``Store.cells``), and the status of every cell by key."""
    cells, status = [], {}
    for _, r in df.iterrows():
        status[r["cell_key"]] = r["status"]
        if r["status"] != "ok" or not r["samples_json"]:
            continue
        samples = json.loads(r["samples_json"])
        if not samples:
            continue
        metrics = json.loads(r["metrics_json"] or "{}")
        cells.append(TimedCell(r["cell_key"], r["setting_key"], r["backend"], setting_label(r), float(r["median_s"]),
                               timing_from(samples, metrics)))
    return cells, status


def _figure(cell: TimedCell, by_setting: dict[tuple[str, str], TimedCell], baseline: str | None) -> Estimate:
    base = by_setting.get((cell.setting_key, baseline)) if baseline else None
    return estimate(cell.timing, base.timing if base is not None else None)


def compare_cells(
    a: Sequence[TimedCell],
    b: Sequence[TimedCell],
    baseline: str | None = DEFAULT_BASELINE,
    threshold: float = DEFAULT_THRESHOLD,
    confidence: float = DEFAULT_CONFIDENCE,
    floor_ratio: float = DEFAULT_FLOOR_RATIO,
    floor_time: float = DEFAULT_FLOOR_TIME,
) -> list[CellChange]:
    """Every cell timed in both runs with its verdict, largest change first. ``baseline=None`` judges absolute times."""
    a_set = {(c.setting_key, c.backend): c for c in a}
    b_set = {(c.setting_key, c.backend): c for c in b}
    b_by_key = {c.cell_key: c for c in b}
    raw = []
    for ca in a:
        cb = b_by_key.get(ca.cell_key)
        if cb is None:
            continue
        relative = (baseline is not None and ca.backend != baseline
                    and (ca.setting_key, baseline) in a_set and (cb.setting_key, baseline) in b_set)
        base = baseline if relative else None
        raw.append((ca, cb, relative, _figure(ca, a_set, base), _figure(cb, b_set, base)))
    # the spread between processes, pooled over each run's cells of one kind of figure (stats.pooled_between)
    pooled = {(side, rel): pooled_between([r[3 + side] for r in raw if r[2] == rel]) for side in (0, 1)
              for rel in (False, True)}
    out = []
    for ca, cb, relative, ea, eb in raw:
        ea, eb = with_between(ea, *pooled[(0, relative)]), with_between(eb, *pooled[(1, relative)])
        v = judge(ea, eb, threshold, confidence, floor_ratio if relative else floor_time)
        out.append(CellChange(ca.cell_key, ca.label, ca.backend, ca.median_s, cb.median_s,
                              f"vs {baseline}" if relative else "time", ea, eb, v))
    out.sort(key=lambda ch: -abs(ch.change) if math.isfinite(ch.change) else 0.0)
    return out


def compare_notes(a_status: dict[str, str], b_status: dict[str, str]) -> list[str]:
    """Cells on one side only, and status changes: news a table of timings would otherwise hide."""
    notes = [f"only in A: {k}" for k in a_status if k not in b_status]
    notes += [f"only in B: {k}" for k in b_status if k not in a_status]
    notes += [f"status {s} → {b_status[k]}: {k}" for k, s in a_status.items() if k in b_status and s != b_status[k]]
    return notes


def machines_note(a_machines: Iterable[str | None], b_machines: Iterable[str | None]) -> str | None:
    """Runs measured on different machines: every change below compares the machines as well as the code."""
    a, b = sorted({m for m in a_machines if m}), sorted({m for m in b_machines if m})
    if not a or not b or a == b:
        return None
    return (f"different machines: A was measured on {', '.join(a)}, B on {', '.join(b)}; "
            "each change includes the difference between the machines")


def compare_runs(
    db: str | Path, run_a: str, run_b: str, **kw: Any
) -> tuple[str, str, list[CellChange], list[str]]:
    """Returns (run_a id, run_b id, changes sorted by |change|, notes on cells that could not be compared).

    Raises KeyError — what the CLI reports as one line, exit 2 — for a run it cannot find and for a ``baseline``
    other than the default that neither run has (a typo would otherwise quietly judge every cell on absolute time;
    the default ``eager`` may be absent, and then is, as documented)."""
    with Store(db) as store:
        a_id, b_id = store.resolve_run(run_a), store.resolve_run(run_b)
        a, b = store.cells(a_id), store.cells(b_id)
        specs = [json.loads((store.run(r) or {}).get("spec_json") or "{}") for r in (a_id, b_id)]
    baseline = kw.get("baseline", DEFAULT_BASELINE)
    backends = sorted({*a["backend"].dropna(), *b["backend"].dropna()})
    if baseline not in (None, DEFAULT_BASELINE) and baseline not in backends:
        raise KeyError(f"baseline backend {baseline!r} is in neither run (their backends: {', '.join(backends)})")
    ca, sa = timed_cells_from_frame(a)
    cb, sb = timed_cells_from_frame(b)
    machines = machines_note(a["machine_id"], b["machine_id"])
    notes = ([machines] if machines else []) + compare_notes(sa, sb)
    return a_id, b_id, compare_cells(ca, cb, **{**floors_for(*specs), **kw}), notes


def regressions(changes: Iterable[CellChange], fail_on: float) -> list[CellChange]:
    """Cells significantly slower by at least ``fail_on`` (relative): what ``--fail-on`` gates on."""
    return [ch for ch in changes if ch.verdict.regression(fail_on)]


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}" if math.isfinite(x) else "?"


VERDICT_STYLE = {"faster": "green", "slower": "red", "inconclusive": "yellow"}


def verdict_cell(v: Verdict) -> str:
    """The verdict for a table column that never wraps: "no change" and "within ±2 %" on two lines, so the column
    is as wide as "inconclusive" and Rich never squeezes (and cuts) the verdict to fit 80 columns."""
    return f"[{VERDICT_STYLE.get(v.verdict, 'dim')}]{escape(v.text.replace(' within ', chr(10) + 'within '))}[/]"


def print_comparison(a_id: str, b_id: str, changes: list[CellChange], notes: list[str],
                     console: Console | None = None) -> None:
    """The verdicts, a summary and the notes. No column has a minimum width: Rich's shrinking ignores it and the
    table then overflows 80 columns (a pipe) and loses its last column; the verdict keeps its words by not wrapping."""
    console = console or Console()
    table = Table(title=f"B = {escape(b_id)} vs A = {escape(a_id)}\nnegative change = B faster")
    table.add_column("cell", overflow="fold", max_width=48)
    table.add_column("ms/call A → B", justify="right")
    table.add_column("figure", overflow="fold")
    table.add_column("change [CI]", justify="right")
    table.add_column("verdict", no_wrap=True)
    for ch in changes:
        v = ch.verdict
        table.add_row(
            f"{escape(ch.label)} [bold]{escape(ch.backend)}[/]",
            f"{ch.median_a * 1e3:.4g} → {ch.median_b * 1e3:.4g}",
            escape(ch.figure),
            f"{_pct(v.change)}% [{_pct(v.ci[0])}, {_pct(v.ci[1])}]",
            verdict_cell(v),
        )
    console.print(table)
    if changes:
        v = changes[0].verdict
        counts = {k: sum(1 for ch in changes if ch.verdict.verdict == k) for k in ("slower", "faster", "inconclusive")}
        same = len(changes) - sum(counts.values())
        console.print(
            f"{len(changes)} cells: {counts['slower']} slower, {counts['faster']} faster, {same} no change within "
            f"±{100 * v.threshold:g} %, {counts['inconclusive']} inconclusive ({100 * v.confidence:g} % intervals "
            "per cell from rounds and processes; a run with one process per setting adds a between-run noise floor).",
            highlight=False,
        )
    for n in notes:  # soft-wrapped: a cell key is copied from here, and a hard wrap would break it in two
        console.print(f"[dim]{escape(n)}[/]", highlight=False, soft_wrap=True)

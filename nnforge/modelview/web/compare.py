"""Two runs side by side: cells matched by key, each judged by ``modelview.compare.compare_cells`` — the very function
behind ``nnforge compare``, so the page and the command line cannot disagree (they used two different tests before).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..compare import CellChange, TimedCell, compare_cells, floors_for, machines_note
from ..report.data import CellRow
from ..stats import holm, mann_whitney_p, timing_from

__all__ = ["Pair", "compare", "holm", "mann_whitney_p"]

MARKS = {"faster": "▲ faster", "slower": "▼ slower", "no-change": "≈ no change", "inconclusive": "? inconclusive"}


@dataclass(frozen=True)
class Pair:
    """One cell in both runs. ``ratio`` = median time B / A (< 1: B is faster); ``change`` the judged figure."""

    a: CellRow
    b: CellRow
    change: CellChange

    @property
    def ratio(self) -> float:
        return (self.b.median_s or 0.0) / (self.a.median_s or 1.0)

    @property
    def verdict(self) -> str:
        """The verdict as an HTML class and filter value: slower, faster, no-change, inconclusive."""
        return self.change.verdict.verdict.replace(" ", "-")

    @property
    def mark(self) -> str:
        return MARKS[self.verdict]


def _timed(c: CellRow, samples: tuple[float, ...]) -> TimedCell:
    return TimedCell(c.cell_key, c.setting_key, c.backend, c.setting_label, float(c.median_s or 0.0),
                     timing_from(samples, c.metrics))


def compare(
    a_cells: list[CellRow],
    b_cells: list[CellRow],
    samples_a: dict[str, tuple[float, ...]],
    samples_b: dict[str, tuple[float, ...]],
    specs: tuple[dict, dict] | None = None,
    **kw: object,
) -> tuple[list[Pair], list[str]]:
    """Pairs sorted by the size of the change (largest first), and notes on cells only one run has."""
    rows_a = {c.cell_key: c for c in a_cells}
    rows_b = {c.cell_key: c for c in b_cells}
    ta = [_timed(c, samples_a[c.cell_key]) for c in a_cells if c.ok and c.median_s and samples_a.get(c.cell_key)]
    tb = [_timed(c, samples_b[c.cell_key]) for c in b_cells if c.ok and c.median_s and samples_b.get(c.cell_key)]
    floors = floors_for(*specs) if specs is not None else {}
    changes = compare_cells(ta, tb, **{**floors, **kw})  # type: ignore[arg-type]
    pairs = [Pair(rows_a[ch.cell_key], rows_b[ch.cell_key], ch) for ch in changes]
    only_a = len(set(rows_a) - set(rows_b))
    only_b = len(set(rows_b) - set(rows_a))
    notes = [f"{n} cells only in run {w}" for n, w in ((only_a, "A"), (only_b, "B")) if n]
    machines = machines_note((c.machine_id for c in a_cells), (c.machine_id for c in b_cells))
    if machines:
        notes.insert(0, machines)
    not_ok = sum(1 for k, c in rows_a.items() if k in rows_b and not (c.ok and rows_b[k].ok))
    if not_ok:
        notes.append(f"{not_ok} cells not ok in one of the runs (not compared)")
    return pairs, notes

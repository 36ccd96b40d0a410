"""Two runs side by side: cells matched by key, Mann-Whitney U on the per-call samples, Holm-adjusted, and a verdict.

Same rule as ``nnforge compare`` (modelview/compare.py): a change counts when the adjusted p is below ``alpha`` and the
ratio's confidence interval excludes changes smaller than ``min_effect``. Two differences, both for speed at 10,000
cells: the U test uses its normal approximation with tie correction (``stats.mann_whitney_p``: numpy,
microseconds per pair; scipy's "asymptotic" method), and the ratio's interval is the conservative one from the
stored per-cell median CIs (B_low/A_high .. B_high/A_low) instead of a bootstrap, so the view can only be stricter
than the CLI, never looser.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..report.data import CellRow
from ..stats import holm, mann_whitney_p

ALPHA = 0.01
MIN_EFFECT = 0.01


@dataclass(frozen=True)
class Pair:
    """One cell in both runs. ``ratio`` = median time B / A (< 1: B is faster)."""

    a: CellRow
    b: CellRow
    ratio: float
    ratio_ci: tuple[float, float]
    p: float
    p_adjusted: float
    verdict: str  # "faster" | "slower" | "same" | "n/a"

    @property
    def mark(self) -> str:
        return {"faster": "▲ faster", "slower": "▼ slower", "same": "≈", "n/a": "–"}[self.verdict]


def _ratio_ci(a: CellRow, b: CellRow, ratio: float) -> tuple[float, float]:
    if a.ci_low_s and a.ci_high_s and b.ci_low_s and b.ci_high_s:
        return b.ci_low_s / a.ci_high_s, b.ci_high_s / a.ci_low_s
    return ratio, ratio


def compare(
    a_cells: list[CellRow],
    b_cells: list[CellRow],
    samples_a: dict[str, tuple[float, ...]],
    samples_b: dict[str, tuple[float, ...]],
    alpha: float = ALPHA,
    min_effect: float = MIN_EFFECT,
) -> tuple[list[Pair], list[str]]:
    """Pairs sorted by the size of the change (largest first), and notes on cells only one run has."""
    b_by = {c.cell_key: c for c in b_cells}
    a_keys = {c.cell_key for c in a_cells}
    raw: list[tuple[CellRow, CellRow, float, tuple[float, float], float]] = []
    for ca in a_cells:
        cb = b_by.get(ca.cell_key)
        if cb is None or not (ca.ok and cb.ok and ca.median_s and cb.median_s):
            continue
        ratio = cb.median_s / ca.median_s
        sa, sb = samples_a.get(ca.cell_key, ()), samples_b.get(cb.cell_key, ())
        raw.append((ca, cb, ratio, _ratio_ci(ca, cb, ratio), mann_whitney_p(sa, sb)))
    adjusted = holm([r[4] for r in raw])
    pairs = []
    for (ca, cb, ratio, ci, p), padj in zip(raw, adjusted):
        if math.isnan(padj):
            verdict = "n/a"
        elif padj < alpha and ci[1] < 1 - min_effect:
            verdict = "faster"
        elif padj < alpha and ci[0] > 1 + min_effect:
            verdict = "slower"
        else:
            verdict = "same"
        pairs.append(Pair(ca, cb, ratio, ci, p, padj, verdict))
    pairs.sort(key=lambda p: -abs(math.log(p.ratio)))
    only_a = len(a_keys - set(b_by))
    only_b = len(set(b_by) - a_keys)
    notes = [f"{n} cells only in run {w}" for n, w in ((only_a, "A"), (only_b, "B")) if n]
    not_ok = sum(1 for c in a_cells if c.cell_key in b_by and not (c.ok and b_by[c.cell_key].ok))
    if not_ok:
        notes.append(f"{not_ok} cells not ok in one of the runs (not compared)")
    return pairs, notes

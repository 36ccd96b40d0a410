"""``nnforge compare RUN_A RUN_B``: which cells changed, significantly, and by how much.

Cells are matched by their stable key. For each pair with timings on both sides: the Mann-Whitney U test on the
per-call samples, Holm-adjusted across all pairs (many cells compared at once would otherwise turn noise into
"significant"), and a bootstrap CI of the ratio of medians. A difference counts when the adjusted p is below ``alpha``
*and* the ratio's CI excludes changes smaller than ``min_effect`` — with thousands of samples a 0.1 % shift is
"significant" but not interesting.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from .console import setting_label
from .stats import Comparison, compare_samples, holm
from .store import Store

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class CellChange:
    cell_key: str
    label: str
    backend: str
    comparison: Comparison
    p_adjusted: float
    verdict: str  # "faster", "slower", "no significant change"

    @property
    def change(self) -> float:
        """Relative change of time per call, B vs A (negative: B is faster)."""
        return self.comparison.ratio - 1.0


def compare_runs(
    db: str | Path, run_a: str, run_b: str, alpha: float = 0.01, min_effect: float = 0.01, seed: int | None = None
) -> tuple[str, str, list[CellChange], list[str]]:
    """Returns (run_a id, run_b id, changes sorted by |change|, notes on cells that could not be compared)."""
    with Store(db) as store:
        a_id, b_id = store.resolve_run(run_a), store.resolve_run(run_b)
        a, b = store.cells(a_id), store.cells(b_id)
    return (a_id, b_id, *compare_frames(a, b, alpha, min_effect, seed))


def compare_frames(
    a: pd.DataFrame, b: pd.DataFrame, alpha: float = 0.01, min_effect: float = 0.01, seed: int | None = None
) -> tuple[list[CellChange], list[str]]:
    notes: list[str] = []
    pairs = []
    b_by_key = {r["cell_key"]: r for _, r in b.iterrows()}
    for _, ra in a.iterrows():
        rb = b_by_key.get(ra["cell_key"])
        if rb is None:
            notes.append(f"only in A: {ra['cell_key']}")
            continue
        if ra["status"] != "ok" or rb["status"] != "ok":
            if ra["status"] != rb["status"]:
                notes.append(f"status {ra['status']} → {rb['status']}: {ra['cell_key']}")
            continue
        sa, sb = json.loads(ra["samples_json"]), json.loads(rb["samples_json"])
        if len(sa) < 2 or len(sb) < 2:
            notes.append(f"too few samples to test: {ra['cell_key']}")
            continue
        pairs.append((ra, compare_samples(sa, sb, seed=seed)))
    a_keys = set(a["cell_key"]) if len(a) else set()
    notes += [f"only in B: {k}" for k in b_by_key if k not in a_keys]
    adjusted = holm([c.p for _, c in pairs]) if pairs else []
    changes = []
    for (ra, c), p_adj in zip(pairs, adjusted):
        lo, hi = c.ratio_ci
        if p_adj < alpha and hi < 1 - min_effect:
            verdict = "faster"
        elif p_adj < alpha and lo > 1 + min_effect:
            verdict = "slower"
        else:
            verdict = "no significant change"
        changes.append(CellChange(ra["cell_key"], setting_label(ra), ra["backend"], c, p_adj, verdict))
    changes.sort(key=lambda ch: -abs(ch.change))
    return changes, notes


def print_comparison(a_id: str, b_id: str, changes: list[CellChange], notes: list[str],
                     console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title=f"B = {b_id} vs A = {a_id}\ntime per call; negative change = B faster")
    table.add_column("cell", overflow="fold", max_width=40)
    table.add_column("A → B, ms", justify="right", no_wrap=True)
    table.add_column("change [95% CI]", justify="right")
    table.add_column("p Holm", justify="right", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    style = {"faster": "green", "slower": "red"}
    for ch in changes:
        c = ch.comparison
        lo, hi = 100 * (c.ratio_ci[0] - 1), 100 * (c.ratio_ci[1] - 1)
        table.add_row(
            f"{ch.label} [bold]{ch.backend}[/]",
            f"{c.median_a * 1e3:.4g} → {c.median_b * 1e3:.4g}",
            f"{100 * ch.change:+.2f}% [{lo:+.1f}, {hi:+.1f}]",
            f"{ch.p_adjusted:.2g}",
            f"[{style.get(ch.verdict, 'dim')}]{'same' if ch.verdict.startswith('no') else ch.verdict}[/]",
        )
    console.print(table)
    sig = [ch for ch in changes if ch.verdict != "no significant change"]
    console.print(f"{len(sig)} of {len(changes)} compared cells changed significantly.")
    for n in notes:
        console.print(f"[dim]{n}[/]", highlight=False)

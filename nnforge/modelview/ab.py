"""``nnforge ab`` and ``nnforge history``: code versions compared inside one interleaved schedule.

``ab REV_A REV_B``: both revisions' round servers take turns in every round (``interleave``), and each cell's verdict
is ``stats.judge_paired`` on the per-round ratio B / A — the machine's drift cancels inside a round.

``history A..B``: every commit of the range, oldest first, with A as the reference; commits are measured in blocks of
at most ``block`` revisions that all include A, so every commit has a paired ratio to A. A **step** is a commit whose
figure differs from its predecessor's by a significant change of at least ``threshold``. Inside one block the two
neighbours are compared directly, round by round; across blocks through their ratios to A, errors added. Why not a
change-point search (asv's, ``ruptures``): those segment a noisy series whose points came from separate runs; here
every commit has an interval of its own from paired rounds, so testing neighbours directly asks exactly "did this
commit change it?" and names the commit.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .compare import verdict_cell
from .console import setting_label
from .interleave import SettingResult
from .reasons import failure_reason
from .revisions import Revision
from .stats import Estimate, Verdict, estimate, judge_difference, judge_paired


@dataclass(frozen=True)
class AbCell:
    """One cell (setting and backend): B against A, paired by round."""

    label: str
    backend: str
    median_a: float
    median_b: float
    verdict: Verdict
    rounds: int

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "backend": self.backend, "median_a_s": self.median_a, "median_b_s": self.median_b,
                "rounds": self.rounds, **self.verdict.as_dict()}


def _label(res: SettingResult) -> str:
    c = res.cells[0]
    return setting_label({**c.to_dict(), "params_json": c.params_json})


def _median(samples: Sequence[float]) -> float:
    s = sorted(samples)
    n = len(s)
    return (s[n // 2] + s[(n - 1) // 2]) / 2 if n else float("nan")


def revision_status(res: SettingResult, rev: int, backend: str) -> tuple[str, str | None]:
    """A revision's status and error for one backend of a setting, by ``interleave.store_setting``'s rule, so that
    the verdicts and notes say what the stored rows say (a failure in a later process makes the cell failed)."""
    fail = res.failures.get((rev, backend))
    s = res.series.get((rev, backend))
    if fail is None and s is not None and not s.error and len(s.samples) >= 2:
        return "ok", None
    return (fail or {}).get("status", "failed"), (fail or {}).get("error") or (s.error if s else None) or "not measured"


def ab_cells(results: Sequence[SettingResult], threshold: float, confidence: float, a: int = 0,
             b: int = 1) -> list[AbCell]:
    """Revision ``b`` against revision ``a`` for every cell both timed; the others are ``ab_untimed``'s."""
    out = []
    for res in results:
        for cell in res.cells:
            if revision_status(res, a, cell.backend)[0] != "ok" or revision_status(res, b, cell.backend)[0] != "ok":
                continue
            sa, sb = res.series[(a, cell.backend)], res.series[(b, cell.backend)]
            v = judge_paired(sb.timing(), sa.timing(), threshold, confidence)
            out.append(AbCell(_label(res), cell.backend, _median(sa.samples), _median(sb.samples), v,
                              len(set(zip(sb.processes, sb.rounds)))))
    return out


@dataclass(frozen=True)
class StatusChange:
    """A cell without a time on one side — ab: A → B; history: the previous commit → ``commit`` — which no verdict
    covers, so it is a note; ``broke`` (ok before, not after) is what ``--fail-on`` and ``--check`` gate on."""

    label: str
    backend: str
    before: str | None  # None: the first commit of a history, which has no predecessor
    after: str
    reason: str | None  # why the side without a time has none (after's, else before's); None when both are ok
    commit: str = ""  # history only: the commit whose status is ``after``
    subject: str = ""

    @property
    def broke(self) -> bool:
        """Timed before, not any more: a cell a change broke (or lost)."""
        return self.before == "ok" and self.after != "ok"

    def note(self) -> str:
        """One line for under the table, in ``compare_notes``' words."""
        where = f" at {self.commit[:10]} ({self.subject})" if self.commit else ""
        if self.before is None:
            head = f"{self.after}{where}, the reference"
        elif self.before == self.after:  # ab only: history notes a status once, where it begins
            head = f"{self.after} in A and B"
        else:
            head = f"status {self.before} → {self.after}{where}"
        return f"{head}: {self.label} {self.backend}" + (f": {self.reason}" if self.reason else "")

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "backend": self.backend, "before": self.before, "after": self.after,
                "reason": self.reason, "commit": self.commit or None, "broke": self.broke}


def _reason(*errors: str | None) -> str | None:
    err = next((e for e in errors if e), None)
    return failure_reason(err)[:160] if err else None


def ab_untimed(results: Sequence[SettingResult], a: int = 0, b: int = 1) -> list[StatusChange]:
    """Every cell without a time in revision ``a`` or ``b`` (``ab_cells`` judges the rest), with both statuses:
    a cell that fails in one revision is news that a table of verdicts would otherwise hide."""
    out = []
    for res in results:
        for cell in res.cells:
            (sa, ea), (sb, eb) = revision_status(res, a, cell.backend), revision_status(res, b, cell.backend)
            if sa != "ok" or sb != "ok":
                out.append(StatusChange(_label(res), cell.backend, sa, sb, _reason(eb, ea)))
    return out


def broken(changes: Sequence[StatusChange]) -> list[StatusChange]:
    """The cells that were ok before and have no time after: a CI gate fails on these as on a slowdown."""
    return [c for c in changes if c.broke]


def _print_notes(changes: Sequence[StatusChange], console: Console) -> None:
    for c in changes:
        style = "red" if c.broke else "dim"
        console.print(f"[{style}]{escape(c.note())}[/]", highlight=False, soft_wrap=True)


def print_ab(cells: Sequence[AbCell], rev_a: Revision, rev_b: Revision, console: Console,
             untimed: Sequence[StatusChange] = ()) -> None:
    """The verdicts, then ``untimed`` (``ab_untimed``) as notes. No column has a minimum width (Rich's shrinking
    ignores it and overflows), and the verdict does not wrap (``verdict_cell``): every column fits 80 columns."""
    table = Table(title=f"B = {escape(rev_b.name)} ({rev_b.short}) vs A = {escape(rev_a.name)} ({rev_a.short}), "
                        "interleaved rounds\nnegative change = B faster")
    table.add_column("cell", overflow="fold", max_width=44)
    table.add_column("backend", overflow="fold")
    table.add_column("ms/call A → B", justify="right")
    table.add_column("change [CI]", justify="right")
    table.add_column("rounds", justify="right", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    for c in cells:
        v = c.verdict
        table.add_row(escape(c.label), escape(c.backend), f"{c.median_a * 1e3:.4g} → {c.median_b * 1e3:.4g}",
                      f"{100 * v.change:+.1f}% [{100 * v.ci[0]:+.1f}, {100 * v.ci[1]:+.1f}]", str(c.rounds),
                      verdict_cell(v))
    console.print(table)
    _print_notes(untimed, console)


@dataclass(frozen=True)
class HistoryPoint:
    """One commit's figure for one cell: its time relative to the reference commit (1.0 for the reference)."""

    commit: str
    subject: str
    ratio: float
    ci: tuple[float, float]
    step: Verdict | None  # against the previous commit; None for the first


@dataclass(frozen=True)
class HistoryCell:
    label: str
    backend: str
    points: list[HistoryPoint]

    def steps(self, fail_on: float | None = None) -> list[HistoryPoint]:
        """Commits that changed the figure significantly by at least the verdict's threshold (or ``fail_on``)."""
        out = []
        for p in self.points:
            v = p.step
            if v is None or v.verdict not in ("slower", "faster"):
                continue
            size = fail_on if fail_on is not None else v.threshold
            if abs(v.change) >= size:
                out.append(p)
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "backend": self.backend, "points": [
            {"commit": p.commit, "subject": p.subject, "ratio_to_reference": p.ratio, "ci": list(p.ci),
             "step": p.step.as_dict() if p.step else None} for p in self.points],
            "steps": [p.commit for p in self.steps()]}


def history_cells(blocks: Sequence[tuple[Sequence[Revision], Sequence[SettingResult]]], commits: Sequence[str],
                  threshold: float, confidence: float) -> list[HistoryCell]:
    """Per cell, each commit's ratio to the reference (index 0 of every block) and the step from its predecessor."""
    est: dict[tuple[str, str], dict[str, Estimate]] = {}  # (setting, backend) -> commit -> log ratio to reference
    same_block: dict[tuple[str, str], dict[tuple[str, str], Verdict]] = {}
    labels: dict[tuple[str, str], str] = {}
    subjects: dict[str, str] = {}
    for revs, results in blocks:
        index = {r.commit: i for i, r in enumerate(revs)}
        for r in revs:
            subjects[r.commit] = r.subject
        for res in results:
            for cell in res.cells:
                key = (cell.setting_key, cell.backend)
                labels[key] = _label(res)
                if revision_status(res, 0, cell.backend)[0] != "ok":
                    continue  # history_untimed says why
                ref = res.series[(0, cell.backend)]
                for r in revs:
                    if revision_status(res, index[r.commit], cell.backend)[0] != "ok":
                        continue
                    s = res.series[(index[r.commit], cell.backend)]
                    est.setdefault(key, {})[r.commit] = estimate(s.timing(), ref.timing())
                for prev, cur in itertools.pairwise(commits):
                    if prev in index and cur in index and all(
                            revision_status(res, index[c], cell.backend)[0] == "ok" for c in (prev, cur)):
                        sp, sc = res.series[(index[prev], cell.backend)], res.series[(index[cur], cell.backend)]
                        same_block.setdefault(key, {})[(prev, cur)] = judge_paired(sc.timing(), sp.timing(),
                                                                                  threshold, confidence)
    out = []
    for key, by_commit in est.items():
        points = []
        prev = None
        for c in commits:
            e = by_commit.get(c)
            if e is None:
                continue
            if c == commits[0]:
                ratio, ci = 1.0, (1.0, 1.0)
            else:
                v = judge_difference(e.log_value, e.se, e.df, threshold, confidence)
                ratio, ci = 1.0 + v.change, (1.0 + v.ci[0], 1.0 + v.ci[1])
            step = None
            if prev is not None:
                step = same_block.get(key, {}).get((prev, c))
                if step is None:  # neighbours in different blocks: through their ratios to the reference
                    ep = by_commit[prev]
                    se = math.sqrt(ep.se**2 + e.se**2)
                    step = judge_difference(e.log_value - ep.log_value, se, min(ep.df, e.df), threshold, confidence)
            points.append(HistoryPoint(c, subjects.get(c, ""), ratio, ci, step))
            prev = c
        out.append(HistoryCell(labels[key], key[1], points))
    return out


def history_untimed(blocks: Sequence[tuple[Sequence[Revision], Sequence[SettingResult]]],
                    commits: Sequence[str]) -> list[StatusChange]:
    """Per cell, every commit whose status differs from its predecessor's (and the reference when it has no time):
    a commit that breaks a cell leaves no point to call a step, so it is said here. A commit measured in two blocks
    has the first status that is not ok, if any (an intermittent failure is news)."""
    status: dict[tuple[str, str], dict[str, tuple[str, str | None]]] = {}
    labels: dict[tuple[str, str], str] = {}
    subjects: dict[str, str] = {}
    for revs, results in blocks:
        for i, r in enumerate(revs):
            subjects[r.commit] = r.subject
            for res in results:
                for cell in res.cells:
                    key = (cell.setting_key, cell.backend)
                    labels[key] = _label(res)
                    seen = status.setdefault(key, {})
                    if seen.get(r.commit, ("ok", None))[0] == "ok":
                        seen[r.commit] = revision_status(res, i, cell.backend)
    out = []
    for key, by_commit in status.items():
        prev: tuple[str, str | None] | None = None
        for c in commits:
            if c not in by_commit:
                continue
            (s, err), before = by_commit[c], prev
            if (before is None and s != "ok") or (before is not None and s != before[0]):
                reason = _reason(err, before[1] if before else None)
                out.append(StatusChange(labels[key], key[1], before[0] if before else None, s, reason, c,
                                        subjects.get(c, "")))
            prev = (s, err)
    return out


def blocks_of(commits: Sequence[str], size: int) -> list[list[str]]:
    """Blocks of at most ``size`` revisions, each the reference (the first commit) plus consecutive commits; a block
    starts with the previous block's last commit, so neighbours are compared directly wherever possible."""
    ref, rest = commits[0], list(commits[1:])
    per = max(2, size - 1)
    out, i = [], 0
    while True:
        out.append([ref, *rest[i : i + per]])
        if i + per >= len(rest):
            return out
        i += per - 1


def print_history(cells: Sequence[HistoryCell], console: Console, untimed: Sequence[StatusChange] = ()) -> None:
    """One table per cell, then ``untimed`` (``history_untimed``) as notes: the commits that broke or fixed a cell."""
    for hc in cells:
        table = Table(title=f"{escape(hc.label)} · {escape(hc.backend)}: time relative to the first commit")
        table.add_column("commit", no_wrap=True)
        table.add_column("subject", overflow="fold", max_width=40)
        table.add_column("time / reference [CI]", justify="right", no_wrap=True)
        table.add_column("vs previous commit", no_wrap=True)
        steps = {p.commit for p in hc.steps()}
        for p in hc.points:
            step = ""
            if p.step is not None:
                step = f"{100 * p.step.change:+.1f}% {p.step.text}"
                if p.commit in steps:
                    step = f"[bold red]STEP[/] {step}" if p.step.change > 0 else f"[bold green]STEP[/] {step}"
            table.add_row(p.commit[:10], escape(p.subject), f"{p.ratio:.3f} [{p.ci[0]:.3f}, {p.ci[1]:.3f}]", step)
        console.print(table)
    _print_notes(untimed, console)

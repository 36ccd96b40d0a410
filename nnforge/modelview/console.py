"""Terminal output: a Rich progress bar while a sweep runs, and the closing table.

The closing table has one row per setting and one column per backend: throughput and, in brackets, the ratio to
eager; the fastest backend of the row is named and highlighted. Cells that did not produce a time show their status.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Column, Table
from rich.text import Text

from .reasons import failure_reason

if TYPE_CHECKING:
    import pandas as pd

STATUS_STYLE = {
    "ok": "green",
    "skipped": "dim",
    "mismatch": "magenta",
    "failed": "red",
    "timeout": "yellow",
    "oom": "yellow",
    "crashed": "red",
}


class _CroppedText(TextColumn):
    """A text column that Rich may narrow (its table column wraps) but that renders as one line cut with "…"."""

    def render(self, task: Task) -> Text:
        text = super().render(task)
        text.no_wrap, text.overflow = True, "ellipsis"
        return text


class SweepProgress:
    """Cells done / total with an ETA; the description names the status counts and the setting being measured.

    Only the description and the bar give way to a narrow console (a pipe: 80 columns); the cell count and the
    times never do. Rich's default gave the no-wrap description its whole width and squeezed the count to "o…"."""

    def __init__(self, total: int, enabled: bool = True, console: Console | None = None) -> None:
        self.enabled = enabled
        self.counts: Counter[str] = Counter()
        self._setting = ""
        fixed = Column(no_wrap=True)
        self._progress = Progress(
            SpinnerColumn(table_column=fixed),
            _CroppedText("[bold]{task.description}", table_column=Column(no_wrap=False)),
            BarColumn(),
            MofNCompleteColumn(table_column=fixed),
            TextColumn("cells", table_column=fixed),
            TimeElapsedColumn(table_column=fixed),
            TextColumn("ETA", table_column=fixed),
            TimeRemainingColumn(table_column=fixed),
            console=console,
            transient=False,
            disable=not enabled,
        )
        self._task = self._progress.add_task("starting", total=total)

    def __enter__(self) -> SweepProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def _describe(self) -> str:
        counts = " ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))
        return f"{counts} {self._setting}".strip()  # counts first: a narrow console cuts the end

    def extend(self, cells: int) -> None:
        """More measurements than planned (process repeats)."""
        total = self._progress.tasks[0].total or 0
        self._progress.update(self._task, total=total + cells)

    def setting(self, label: str) -> None:
        self._setting = escape(label)  # a label holds "[hidden=16]", which Rich would take for markup
        self._progress.update(self._task, description=self._describe())

    def done(self, status: str) -> None:
        self.counts[status] += 1
        self._progress.update(self._task, advance=1, description=self._describe())


def setting_label(row: Any) -> str:
    params = json.loads(row["params_json"] or "{}")
    p = ",".join(f"{k}={v}" for k, v in sorted(params.items()))
    return f"{row['variant']} N={row['batch']} T={row['seq_len']} {row['layout']} {row['dtype']} {row['mode']} " \
           f"{row['device']}" + (f" [{p}]" if p else "")


def _fmt(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def seconds(x: float) -> str:
    """A duration in plain units: 2.6 ms, 387 µs, 1.2 s."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x / 1e-9:.3g} ns"


def closing_table(df: pd.DataFrame, title: str = "ModelView", backend_order: Sequence[str] = (),
                  width: int | None = None) -> Table:
    """Per setting (a section): each backend's throughput, its ratio to eager and CI half-width; the fastest starred.

    Long format (one line per backend) so that it stays readable in an 80-column terminal or a CI log. The
    throughput's unit is said once, in the header, where every cell shares it (each row's own where they differ).
    ``width`` (the console's) below 100 folds long backend names and a row's unit onto a line of its own: Rich
    shrinks the widest columns first, so without these limits the setting column kept as little room as the backend
    names left it (its text folded to a few letters a line)."""
    units = {_unit(u) for u in df.loc[df["status"] == "ok", "throughput_unit"]} if len(df) else set()
    shared = units.pop() if len(units) == 1 else None
    backend_max = throughput_max = None
    if width is not None and width < 100:
        backend_max, throughput_max = max(12, width - 67), 10  # 13 at 80 columns, leaving the setting 17
    table = Table(title=title, show_lines=False)
    table.add_column("setting", overflow="fold", max_width=44)
    table.add_column("backend", overflow="fold", max_width=backend_max)
    table.add_column(f"throughput\n{shared}" if shared else "throughput", justify="right",
                     max_width=None if shared else throughput_max)
    table.add_column("time/call", justify="right", no_wrap=True)
    table.add_column("vs eager", justify="right", no_wrap=True)
    table.add_column("±CI", justify="right", no_wrap=True)
    order = {b: i for i, b in enumerate(backend_order)}
    first_section = True
    for _, group in df.groupby("setting_key", sort=False):
        group = group.assign(_o=[order.get(b, len(order)) for b in group["backend"]]).sort_values("_o", kind="stable")
        ok = group[group["status"] == "ok"]
        eager = ok[ok["backend"] == "eager"]["throughput"]
        eager_thr = float(eager.iloc[0]) if len(eager) else None
        fastest = ok.loc[ok["throughput"].idxmax()]["backend"] if len(ok) else None
        if not first_section:
            table.add_section()
        first_section = False
        label = escape(setting_label(group.iloc[0]))
        for i, (_, r) in enumerate(group.iterrows()):
            name = escape(r["backend"])
            setting = label if i == 0 else ""
            if r["status"] != "ok":
                table.add_row(setting, name, f"[{STATUS_STYLE.get(r['status'], '')}]{r['status']}[/]", "", "", "")
                continue
            thr = _fmt(float(r["throughput"])) + ("" if shared else f" {_unit(r['throughput_unit'])}")
            ratio = f"{float(r['throughput']) / eager_thr:.2f}×" if eager_thr else "-"
            ci = rel_ci_text(r["median_s"], r["ci_low_s"], r["ci_high_s"], missing="")
            if name == fastest:
                name, thr, ratio = f"[bold green]★ {name}[/]", f"[bold green]{thr}[/]", f"[bold green]{ratio}[/]"
            table.add_row(setting, name, thr, seconds(float(r["median_s"])), ratio, ci)
    return table


def rel_ci_text(median_s: float | None, ci_low_s: float | None, ci_high_s: float | None, missing: str = "–") -> str:
    """The ±CI of a median as every view prints it (closing table, web view): the larger side of the interval over
    the median (``stats.rel_halfwidth``), the figure the adaptive repeats drive below their target."""
    values = (median_s, ci_low_s, ci_high_s)
    if not median_s or any(v is None or not math.isfinite(v) for v in values):
        return missing
    from .stats import rel_halfwidth

    rel = rel_halfwidth(float(median_s), float(ci_low_s), float(ci_high_s))  # type: ignore[arg-type]
    return f"{100 * rel:.1f}%" if rel < 1 else ">100%"


def _unit(unit: Any) -> str:
    """A throughput unit as the table prints it: per second, once (``vectors`` and ``vectors/s`` alike)."""
    return f"{str(unit).replace('/s', '')}/s"


def print_closing_table(
    df: pd.DataFrame, console: Console | None = None, title: str = "ModelView", backend_order: Sequence[str] = ()
) -> None:
    console = console or Console()
    console.print(closing_table(df, title, backend_order, console.width))
    loads = []
    for m in df["metrics_json"].dropna() if len(df) else []:
        loads += [x for x in json.loads(m).get("loadavg_1m") or [] if x is not None]
    cpus = os.cpu_count() or 1
    if loads and max(loads) > cpus:
        console.print(f"[yellow]note:[/] the 1-minute load average reached {max(loads):.1f} while timing, more than "
                      f"the {cpus} CPUs here: other processes competed for the cores; expect wide CIs.")
    not_ok = df[df["status"] != "ok"] if len(df) else df
    if len(not_ok):
        console.print("[dim]cells without a time:[/]")
        for _, r in not_ok.iterrows():
            reason = failure_reason(r["error"])
            console.print(f"  [{STATUS_STYLE.get(r['status'], '')}]{r['status']:8}[/] {escape(r['backend']):24} "
                          f"{escape(setting_label(r))}: {escape(reason[:160])}", highlight=False, soft_wrap=True)

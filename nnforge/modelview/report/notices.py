"""What a reader must know before trusting a run's charts: an unfinished run, a loaded machine, cells that missed their
confidence target, and scaling curves drawn from settings measured at different times.

Each notice is one sentence with the numbers; the report shows them under the headline and the scaling charts carry
the caveat in their own note, so a chart copied out of the page keeps it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from .common import FigureSpec
from .data import CellRow, RunInfo


def planned_cells(run: RunInfo) -> int | None:
    """Cells the run's spec expands to (None when the spec cannot be expanded here, e.g. a plugin is missing)."""
    try:
        from ..backends import backend_registry
        from ..spec import expand, spec_from_mapping, validate
        from ..variants import variant_registry

        spec = spec_from_mapping({k: v for k, v in run.spec.items() if k != "seed"})
        vreg, breg = variant_registry(spec.plugins), backend_registry(spec.plugins)
        validate(spec, vreg, breg)
        return len(expand(spec, vreg))
    except Exception:
        return None


def _loads(cells: Sequence[CellRow]) -> list[float]:
    out: list[float] = []
    for c in cells:
        out += [x for x in (c.metrics.get("loadavg_1m") or []) if isinstance(x, int | float)]
    return out


def _on_cpu(cells: Sequence[CellRow]) -> list[float]:
    return [x for c in cells if isinstance(x := c.metrics.get("on_cpu_fraction"), int | float)]


def load_summary(cells: Sequence[CellRow], run: RunInfo) -> str | None:
    """"load average up to 4.7 on 2 CPUs, on-CPU fraction down to 0.41" when the machine was busy, else None."""
    loads, on_cpu = _loads(cells), _on_cpu(cells)
    cpus = run.env.get("cpus_available") or run.env.get("cpu_count")
    busy = bool(loads and cpus and max(loads) > float(cpus))
    waited = bool(on_cpu and min(on_cpu) < 0.9)
    if not (busy or waited):
        return None
    parts = []
    if loads:
        parts.append(f"1-minute load average up to {max(loads):.1f}" + (f" on {cpus} CPUs" if cpus else ""))
    if waited:  # only a fraction below 0.9 says cells waited for a CPU
        parts.append(f"on-CPU fraction down to {min(on_cpu):.2f}")
    return ", ".join(parts)


def machines_notice(cells: Sequence[CellRow]) -> str | None:
    """Several machines in one run (a Ray cluster, a merged store): their numbers must not be read as one's."""
    machines = sorted({c.machine_id for c in cells if c.machine_id})
    if len(machines) < 2:
        return None
    return (f"This run's cells were measured on {len(machines)} machines ({', '.join(machines)}): the charts put "
            "their numbers side by side, and a ratio between cells of different machines compares machines too. "
            "Filter by machine to see one machine's results.")


def run_notices(cells: Sequence[CellRow], run: RunInfo, planned: int | None) -> list[str]:
    notices = []
    machines = machines_notice(cells)
    if machines:
        notices.append(machines)
    if planned is not None and planned > len(cells):
        notices.append(f"{planned - len(cells)} of {planned} planned cells not measured: the run was interrupted or "
                       "is still going (continue it with nnforge sweep --resume).")
    load = load_summary(cells, run)
    if load:
        notices.append(f"The machine was busy while timing ({load}): other processes competed for the cores; "
                       "absolute times and curves across settings are less trustworthy than ratios within a setting.")
    timed = [c for c in cells if c.ok]
    missed = [c for c in timed if c.metrics.get("ci_converged") is False]
    if missed:
        target = run.spec.get("timing", {}).get("target_rel_ci")
        goal = f" (±{100 * target:g} %)" if isinstance(target, int | float) else ""
        names = ", ".join(f"{c.model_label} {c.backend} {c.shape_label}" for c in missed[:5])
        more = f" and {len(missed) - 5} more" if len(missed) > 5 else ""
        notices.append(f"{len(missed)} of {len(timed)} timed cells missed their confidence target{goal}: "
                       f"{names}{more}.")
    return notices


def with_scaling_caveat(spec: FigureSpec, cells: Sequence[CellRow], run: RunInfo) -> FigureSpec:
    """A scaling curve joins settings that ran in different workers at different times: say so, with the load."""
    if spec.plot is None:
        return spec
    load = load_summary(cells, run)
    caveat = ("Each point is a separate setting, measured in its own worker at its own time (not interleaved): the "
              "curve's shape includes the machine's drift between them"
              + (f" — and the machine was busy ({load})." if load else "."))
    return dataclasses.replace(spec, note=f"{spec.note} {caveat}".strip())


def apply(figures: list[FigureSpec], cells: Sequence[CellRow], run: RunInfo) -> list[FigureSpec]:
    return [with_scaling_caveat(f, cells, run) if f.id.startswith("scaling") else f for f in figures]


__all__: list[Any] = ["apply", "machines_notice", "planned_cells", "run_notices"]

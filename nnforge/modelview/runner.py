"""The sweep: spec → cells → one worker per setting → rows in the store.

Isolation and interleaving pull in opposite directions: interleaving needs every backend of a setting in one process,
isolation wants every cell alone. The runner gives each *setting* one worker, which holds all of that setting's
backends and times them in interleaved rounds. When that worker dies (segfault, hang, OOM), its finished rows are
already committed; the backend that was running (known from the worker's phase markers) gets the crash row, and every
backend still without a row is re-run *alone* in a fresh worker — so one crashing backend is recorded without losing
the others, which are then timed without interleaving (marked ``alone`` in their metrics).
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
import tempfile
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .backends import backend_registry
from .console import SweepProgress, print_closing_table, setting_label
from .isolation import Outcome, run_worker
from .metrics import available_cpus
from .spec import Cell, SweepSpec, expand, load_spec, settings, validate
from .store import STATUSES, Store, cell_identity, same_spec
from .variants import variant_registry

if TYPE_CHECKING:
    import pandas as pd
    from rich.console import Console


@dataclass
class SweepResult:
    run_id: str
    db: str
    total: int  # cells in the spec
    ran: int  # cells measured by this call (the rest were finished already)
    counts: dict[str, int]
    retried: int = 0  # Ray tasks submitted again after their worker died

    def cells(self) -> pd.DataFrame:
        with Store(self.db) as s:
            return s.cells(self.run_id)


def _extended_run(store: Store, spec: SweepSpec, console: Console | None, prev: str | None = None) -> str | None:
    """``--resume`` whose spec differs from the latest run of that name (or ``--run-id`` naming a run ``prev`` with
    a different spec): resume it when the new spec only extends its axes (its finished cells stay valid; only new
    cells are measured), else say why a new run starts — rows of another spec never join an existing run."""
    from rich.console import Console
    from rich.markup import escape

    from .spec import extension_gap

    console = console or Console()
    prev = prev or store.latest_run(spec.name)
    if prev is None:
        console.print(f"note: no run named {escape(spec.name)!r} to resume; starting a new run", highlight=False,
                      soft_wrap=True)
        return None
    gap = extension_gap(store.run(prev)["spec_json"], spec.to_json())  # type: ignore[index]
    if gap is None:
        console.print(f"resuming run {prev} with an extended grid: only cells it lacks are measured",
                      highlight=False, soft_wrap=True)
        return prev
    console.print(f"note: not resuming run {prev}: its spec differs ({escape(gap)}); starting a new run",
                  highlight=False, soft_wrap=True)
    return None


def _half_pooled(store: Store, run_id: str) -> set[str]:
    """Cells whose latest row is one process's ok row of a ``timing.processes`` > 1 measurement (``process_repeat``
    set; the pooled row has none): ``run_repeated`` writes the pooled row only after the last process, so a sweep
    interrupted in between leaves these, and resuming measures their setting again instead of calling a fraction of
    the samples done. (Re-measuring all processes keeps them in one invocation: their rows pool as they would have.)"""
    return {r["cell_key"] for r in store.rows(run_id, status="ok")
            if json.loads(r["metrics_json"] or "{}").get("process_repeat")}


def _status_counts(store: Store, run_id: str, measured: Sequence[Cell]) -> dict[str, int]:
    """Statuses of the cells this call measured, from their latest rows: the progress bar counts every row written,
    and with ``timing.processes`` > 1 that is each process's row as well as the pooled one."""
    keys = {c.key for c in measured}
    return dict(Counter(r["status"] for r in store.rows(run_id) if r["cell_key"] in keys))


def _setting_seed(run_seed: int, setting_key: str) -> int:
    return (run_seed * 1_000_003 + zlib.crc32(setting_key.encode())) % (2**31 - 1)


def sweep(
    spec: SweepSpec | Mapping[str, Any] | str | Path | None = None,
    *,
    db: str | Path = "modelview.db",
    resume: bool = False,
    force: bool = False,
    retry_failed: bool = False,
    run_id: str | None = None,
    progress: bool = True,
    table: bool = True,
    console: Console | None = None,
    extra_variants: Iterable[type] = (),
    extra_backends: Iterable[type] = (),
    workdir: str | Path | None = None,
    ray: bool = False,
    ray_address: str | None = None,
    **fields: Any,
) -> SweepResult:
    """Run a sweep and return its run id and status counts.

    ``spec`` is a :class:`SweepSpec`, a mapping, or a TOML path; keyword ``fields`` override it (``batch=[1, 8]``,
    ``timing={"budget_s": 2}``...). ``resume`` continues the latest run with the same name and spec (or ``run_id``),
    skipping cells that already have a row; ``force`` re-measures them (new rows; readers take the latest);
    ``retry_failed`` re-measures only cells whose row is not ``ok``/``skipped``. ``extra_variants`` and
    ``extra_backends`` add classes (defined in an importable module or a file) to the registries. The spec is fully
    validated before anything runs. ``ray`` (or a ``ray_address``) measures the settings as tasks on a Ray cluster
    (``distributed``); without an address a local Ray instance is started.
    """
    from rich.console import Console
    from rich.markup import escape

    spec = load_spec(spec, fields)
    extra_variants, extra_backends = tuple(extra_variants), tuple(extra_backends)
    vreg = variant_registry(spec.plugins, extra_variants)
    breg = backend_registry(spec.plugins, extra_backends)
    validate(spec, vreg, breg)
    cells = expand(spec, vreg)
    console = console or Console()
    ray = ray or ray_address is not None
    started_ray = False
    if ray:
        from . import distributed

        started_ray = distributed.connect(ray_address)
    store = Store(db)
    try:
        if resume or run_id:
            spec_json = spec.to_json()
            if run_id:
                named = store.run(run_id)
                if named is None:
                    raise KeyError(f"no run {run_id!r} in {db}")
                same = same_spec(named["spec_json"], spec_json)
                rid = run_id if same else _extended_run(store, spec, console, run_id)
            else:
                rid = store.latest_run(spec.name, spec_json) or _extended_run(store, spec, console)
        else:
            rid = None
        threads = spec.timing.threads or (distributed.node_cpus() if ray else available_cpus())
        if rid is not None:
            stored_json = store.run(rid)["spec_json"]  # type: ignore[index]
            spec = dataclasses.replace(spec, seed=json.loads(stored_json).get("seed", spec.seed))
            if not same_spec(stored_json, spec.to_json()):  # an extended grid: the run now plans its new cells
                store.update_run_spec(rid, spec.to_json())
            env = json.loads(store.run(rid)["env_json"] or "{}")  # type: ignore[index]
        else:
            if spec.seed is None:
                spec = dataclasses.replace(spec, seed=random.SystemRandom().randrange(2**31))
            env = _environment(spec, threads, Path(workdir) if workdir else None)
            rid = store.new_run(spec.name, spec.to_json(), env)
        finished: set[str] = set()
        if not force:
            keep = [s for s in STATUSES if s in ("ok", "skipped")] if retry_failed else list(STATUSES)
            finished = store.finished_keys(rid, keep) - _half_pooled(store, rid)
        pending = [c for c in cells if c.key not in finished]
        if progress:
            console.print(f"[bold]ModelView[/] run [cyan]{rid}[/] ({escape(spec.name)}): {len(cells)} cells, "
                          f"{len(pending)} to measure, {threads} threads, db {escape(str(db))}", highlight=False,
                          soft_wrap=True)  # one line: a store path is copied from here
        tmp = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="modelview-"))
        try:
            with SweepProgress(len(pending), enabled=progress, console=console) as bar:
                ctx = _RunContext(spec, rid, str(db), vreg, breg, env, threads, tmp, bar, store)
                retried = 0
                if ray:
                    retried = distributed.run_settings(ctx, list(settings(pending).values()), extra_variants,
                                                       extra_backends)["retried"]
                else:
                    for group in settings(pending).values():
                        ctx.run_repeated(group)
        finally:
            if not workdir:
                shutil.rmtree(tmp, ignore_errors=True)
        result = SweepResult(rid, str(db), len(cells), len(pending), _status_counts(store, rid, pending), retried)
        if table:
            print_closing_table(store.cells(rid), console, f"ModelView run {rid} ({spec.name})", spec.backends)
        return result
    finally:
        store.close()
        if started_ray:
            import ray as ray_module

            ray_module.shutdown()


@dataclass(frozen=True)
class Plan:
    """What a sweep would do: its cells, settings and a rough duration (``nnforge sweep --dry-run``)."""

    cells: int
    settings: int
    processes: int
    estimated_s: float


SETUP_S = 8.0  # a worker's start, torch import and model build on the 2-core development machine, roughly


def plan(spec: SweepSpec | Mapping[str, Any] | str | Path | None = None, **fields: Any) -> Plan:
    """Validate and expand a spec without running anything. The estimate is an upper figure: every backend uses its
    whole warm-up and timing budget in every process (compiles not counted)."""
    spec = load_spec(spec, fields)
    vreg = variant_registry(spec.plugins)
    breg = backend_registry(spec.plugins)
    validate(spec, vreg, breg)
    cells = expand(spec, vreg)
    groups = settings(cells)
    t = spec.timing
    per_process = sum(SETUP_S + len(g) * (t.warmup_max_s + t.budget_s) for g in groups.values())
    return Plan(len(cells), len(groups), t.processes, per_process * t.processes)


def merge_process_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from the ok rows of several processes: pooled samples, median of compile/first-call times, maxima of
    memory and error. The CI is that of the pooled samples; ``process_medians`` shows the spread between processes."""
    import numpy as np

    from .stats import median_ci, percentiles

    base = {k: v for k, v in rows[0].items() if k not in ("row_id", "row_uid")}
    samples = [x for r in rows for x in json.loads(r["samples_json"])]
    med, lo, hi = median_ci(samples)
    metrics = json.loads(base["metrics_json"] or "{}")
    medians = [float(r["median_s"]) for r in rows]
    items = float(base["throughput"]) * float(base["median_s"])
    metrics.update({
        "processes": len(rows),
        "process_medians": medians,
        "process_spread": (max(medians) - min(medians)) / med if med > 0 else None,
        "merged_row_ids": [r["row_id"] for r in rows],
        "process_sample_counts": [len(json.loads(r["samples_json"])) for r in rows],
        "sample_rounds": [x for r in rows for x in (json.loads(r["metrics_json"] or "{}").get("sample_rounds") or [])],
        "samples": len(samples),
        "latency_s": percentiles(samples),
        "rel_ci": max(med - lo, hi - med) / med if med > 0 else None,
        "process_repeat": None,
    })
    flops_frac = metrics.get("flops_fraction_of_peak")
    bytes_frac = metrics.get("bytes_fraction_of_peak")
    if flops_frac:
        metrics["flops_fraction_of_peak"] = flops_frac * float(base["median_s"]) / med
    if bytes_frac:
        metrics["bytes_fraction_of_peak"] = bytes_frac * float(base["median_s"]) / med
    base.update({
        "median_s": med, "ci_low_s": lo, "ci_high_s": hi, "throughput": items / med,
        "achieved_flops": float(base["flops"]) / med, "achieved_bytes_per_s": float(base["bytes"]) / med,
        "compile_s": float(np.median(compiles)) if (compiles := [r["compile_s"] for r in rows
                                                                 if r["compile_s"] is not None]) else None,
        "first_call_s": float(np.median([r["first_call_s"] for r in rows])),
        "peak_mem_bytes": max(int(r["peak_mem_bytes"] or 0) for r in rows) or None,
        "max_abs_err": max(float(r["max_abs_err"] or 0.0) for r in rows),
        "metrics_json": metrics, "samples_json": samples,
        "started": rows[0]["started"], "finished": rows[-1]["finished"],
    })
    return base


def _environment(spec: SweepSpec, threads: int, workdir: Path | None) -> dict[str, Any]:
    """Environment fingerprint and machine peaks, measured in a worker with the sweep's thread setting."""
    tmp = workdir or Path(tempfile.mkdtemp(prefix="modelview-env-"))
    out = tmp / "env.json"
    device = "cuda" if "cuda" in spec.device else "cpu"
    job = {"kind": "peaks", "threads": threads, "device": device, "dtypes": list(spec.dtype),
           "measure_peaks": spec.measure_peaks, "out": str(out), "memory_mb": spec.isolation.memory_mb}
    try:
        outcome = run_worker(job, tmp, max(120.0, spec.isolation.timeout_s), spec.isolation.memory_mb, threads)
        if outcome.status == "ok" and out.exists():
            env = json.loads(out.read_text())
        else:
            env = {"env_error": outcome.error}
    finally:
        if workdir is None:
            shutil.rmtree(tmp, ignore_errors=True)
    env["threads"] = threads
    env.setdefault("peak_flops", None)
    env.setdefault("peak_bytes_per_s", None)
    return env


@dataclass
class _RunContext:
    spec: SweepSpec
    run_id: str
    db: str
    vreg: Any
    breg: Any
    env: dict[str, Any]
    threads: int
    workdir: Path
    bar: SweepProgress
    store: Store
    repeat: tuple[int, int] | None = None

    def run_repeated(self, cells: list[Cell]) -> None:
        """``timing.processes`` > 1: measure the setting in that many independent worker processes and append one
        merged row per cell (pooled samples). Differences between processes — memory placement, allocator state,
        a library's thread pool — are invisible to a CI computed inside one process; pooling makes the figure
        cover them, and ``process_medians`` shows them. Only cells that were ok in the first process are repeated;
        a later process that fails for a cell makes the cell's row that failure (an intermittent crash is news)."""
        n = self.spec.timing.processes
        if n <= 1 or self.spec.timing.method != "adaptive":
            self.run_setting(cells)
            return
        first: dict[str, dict[str, Any]] = {}
        rows: dict[str, list[dict[str, Any]]] = {}
        for i in range(n):
            todo = cells if i == 0 else [c for c in cells if first.get(c.key, {}).get("status") == "ok"]
            if not todo:
                break
            if i > 0:
                self.bar.extend(len(todo))
            self.repeat = (i + 1, n)
            try:
                self.run_setting(todo)
            finally:
                self.repeat = None
            for c in todo:
                latest = self.store.rows(self.run_id, cell_key=c.key)
                if latest:
                    rows.setdefault(c.key, []).append(latest[-1])
                    first.setdefault(c.key, latest[-1])
        for c in cells:
            got = rows.get(c.key, [])
            if len(got) <= 1 or got[0]["status"] != "ok":
                continue
            bad = next((r for r in got if r["status"] != "ok"), None)
            if bad is not None:
                k = got.index(bad) + 1
                self.store.append_cell(cell_identity(self.run_id, c) | {
                    "status": bad["status"], "error": f"process {k} of {n}: {bad['error']}",
                    "started": got[0]["started"], "finished": bad["finished"]})
                continue
            self.store.append_cell(merge_process_rows(got))

    def job(self, cells: list[Cell], alone: bool) -> dict[str, Any]:
        first = cells[0]
        return {
            "kind": "setting",
            "run_id": self.run_id,
            "db": self.db,
            "cells": [c.to_dict() for c in cells],
            "variant_ref": self.vreg.ref(first.variant),
            "backend_refs": {c.backend: self.breg.ref(c.backend) for c in cells},
            "timing": dataclasses.asdict(self.spec.timing),
            "tolerance": list(self.spec.tolerance(first.dtype)),
            "check": self.spec.check,
            "seed": _setting_seed(self.spec.seed or 0, first.setting_key),
            "threads": self.threads,
            "memory_mb": self.spec.isolation.memory_mb,
            "device": first.device,
            "peaks": {k: self.env.get(k) for k in ("peak_flops", "peak_flops_by_dtype", "peak_bytes_per_s")},
            "alone": alone,
            "repeat": list(self.repeat) if self.repeat else None,
        }

    def record(self, cell: Cell, status: str, error: str) -> None:
        import time

        now = time.time()
        self.store.append_cell(cell_identity(self.run_id, cell) | {"status": status, "error": error,
                                                                    "started": now, "finished": now})
        self.bar.done(status)

    def run_setting(self, cells: list[Cell], alone: bool = False) -> None:
        label = setting_label({**cells[0].to_dict(), "params_json": cells[0].params_json})
        self.bar.setting(label + (f" · {cells[0].backend} alone" if alone else ""))

        def on_event(ev: dict[str, Any]) -> None:
            if ev["event"] == "row":
                self.bar.done(ev["status"])

        outcome: Outcome = run_worker(
            self.job(cells, alone), self.workdir, self.spec.isolation.timeout_s, self.spec.isolation.memory_mb,
            self.threads, on_event,
        )
        missing = [c for c in cells if c.key not in outcome.rows]
        if not missing:
            return
        if outcome.status == "ok":
            for c in missing:
                self.record(c, "failed", "worker exited without recording this cell")
            return
        phase = outcome.last_phase
        culprit = next((c for c in missing if c.backend == phase.get("backend")), None)
        if len(cells) == 1:
            culprit = missing[0]
        if culprit is None and phase.get("phase") in (None, "setup"):
            # Building the variant or its reference is shared by every backend: they would all die the same way.
            for c in missing:
                self.record(c, outcome.status, outcome.error + "\n(while building the variant / reference)")
            return
        if culprit is not None:
            self.record(culprit, outcome.status, outcome.error)
        for c in missing:
            if c is not culprit:
                self.run_setting([c], alone=True)

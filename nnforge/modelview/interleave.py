"""Several revisions of the code timed in one schedule: per setting, one round server per revision, asked in turn.

Two runs taken one after the other on a shared machine differ by its drift (10–17 % per cell measured here); rounds
of the revisions taken alternately, a few milliseconds apart, share it. Each round visits every revision in a fresh
random order; a revision's round times every backend of the setting. Rows are stored under the backend name
``backend@commit`` with the revision in the metrics, so the store, report and web view show them as usual; the
verdicts come from ``stats.judge_paired`` on the per-round ratios.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing import Pipe
from pathlib import Path
from typing import Any

from .backends import backend_registry
from .isolation import worker_env
from .metrics import available_cpus
from .revisions import Revision
from .roundserver import BOOT
from .spec import Cell, SweepSpec, expand, settings, validate
from .stats import Timing, judge_paired, median_ci, percentiles
from .store import Store, cell_identity
from .variants import variant_registry

HARNESS_DIR = Path(__file__).resolve().parent
MIN_ROUNDS = 10
CHECK_EVERY = 5


@dataclass
class Series:
    """One backend of one revision in one setting: samples with their round and process."""

    samples: list[float] = field(default_factory=list)
    rounds: list[int] = field(default_factory=list)
    processes: list[int] = field(default_factory=list)
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def timing(self) -> Timing:
        return Timing(tuple(self.samples), tuple(self.rounds), tuple(self.processes))


@dataclass
class SettingResult:
    cells: list[Cell]
    series: dict[tuple[int, str], Series]  # (revision index, backend) -> series
    failures: dict[tuple[int, str], dict[str, Any]]  # (revision index, backend) -> row fields of a failed cell
    rounds: int = 0


def revision_spec(spec: SweepSpec, rev: Revision) -> SweepSpec:
    """The spec as seen from a revision: relative plugin files are taken from its worktree."""
    import dataclasses

    plugins = tuple(str(rev.path / p) if p.endswith(".py") and not Path(p).is_absolute() else p for p in spec.plugins)
    return dataclasses.replace(spec, plugins=plugins)


def _job(spec: SweepSpec, rev_spec: SweepSpec, cells: list[Cell], threads: int, fd: int, tmp: Path, index: int,
         seed: int) -> dict[str, Any]:
    import dataclasses

    vreg, breg = variant_registry(rev_spec.plugins), backend_registry(rev_spec.plugins)
    first = cells[0]
    return {
        "kind": "rounds", "run_id": "-", "db": str(tmp / f"scratch-{index}.db"), "events": str(tmp / f"ev-{index}"),
        "cells": [c.to_dict() for c in cells], "variant_ref": vreg.ref(first.variant),
        "backend_refs": {c.backend: breg.ref(c.backend) for c in cells},
        "timing": dataclasses.asdict(spec.timing), "tolerance": list(spec.tolerance(first.dtype)),
        "check": spec.check, "seed": seed, "threads": threads, "memory_mb": spec.isolation.memory_mb,
        "device": first.device, "peaks": {}, "alone": False, "repeat": None, "fd": fd, "rev": index,
        "cpus": shared_cpus(threads),
    }


def shared_cpus(threads: int) -> list[int] | None:
    """The CPUs every revision's round server of a setting runs on: the same ``threads`` of this process's CPUs
    for all of them (None: all CPUs, when it needs as many as there are, or the OS cannot pin).

    Left to the scheduler, two round servers settle on different CPUs, and on a shared machine one CPU's pace
    drifts apart from another's (a busy neighbour on its SMT sibling): the per-round ratio then carries the two
    CPUs' drift, which alternating the revisions does not cancel. Measured with ``bench/modelview_ab.py`` on the
    2-core VM: 99 % intervals of an A/A pair ±7-15 % unpinned, ±0.4-0.8 % pinned to one CPU."""
    get = getattr(os, "sched_getaffinity", None)
    if get is None or not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(get(0))
    return allowed[-threads:] if 0 < threads < len(allowed) else None


def _recv(conn: Any, proc: subprocess.Popen, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while not conn.poll(0.2):
        if proc.poll() is not None and not conn.poll(0):
            raise RuntimeError(f"round server exited with code {proc.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no answer for {timeout_s:g} s")
        continue
    return conn.recv()


def _pairs_converged(res: SettingResult, n_revs: int, target: float, confidence: float) -> bool:
    for (i, b), s in res.series.items():
        if i == 0 or s.error or (0, b) not in res.series or res.series[(0, b)].error:
            continue
        v = judge_paired(s.timing(), res.series[(0, b)].timing(), confidence=confidence)
        if not (math.isfinite(v.ci[0]) and math.isfinite(v.ci[1])) or (v.ci[1] - v.ci[0]) / 2 > target:
            return False
    return True


def measure_setting(spec: SweepSpec, revs: Sequence[Revision], cells: list[Cell], threads: int, seed: int,
                    tmp: Path, on_round: Callable[[int], None] | None = None) -> SettingResult:
    """Every revision of one setting, ``timing.processes`` times, in interleaved rounds (see module doc)."""
    res = SettingResult(cells, {}, {})
    cfg = spec.timing
    rng = random.Random(seed)
    for p in range(cfg.processes):
        procs, conns = [], []
        try:
            for i, rev in enumerate(revs):
                parent, child = Pipe(duplex=True)
                job = _job(spec, revision_spec(spec, rev), cells, threads, child.fileno(), tmp, i, seed)
                path = tmp / f"job-{i}.json"
                path.write_text(json.dumps(job))
                env = worker_env(threads)
                env["PYTHONPATH"] = os.pathsep.join([str(rev.path), env.get("PYTHONPATH", "")])
                with open(tmp / f"err-{i}.txt", "ab") as err:
                    procs.append(subprocess.Popen(
                        [sys.executable, "-c", BOOT, str(HARNESS_DIR), str(rev.path), str(path)],
                        cwd=rev.path, env=env, pass_fds=(child.fileno(),), stdout=err, stderr=err,
                        start_new_session=True))
                child.close()
                conns.append(parent)
            live: dict[int, set[str]] = {}
            for i, (conn, proc) in enumerate(zip(conns, procs)):
                try:
                    hello = _recv(conn, proc, spec.isolation.timeout_s)
                except (RuntimeError, TimeoutError, EOFError) as e:
                    hello = {"error": f"{e}; worker output: {_tail(tmp / f'err-{i}.txt')}"}
                if "error" in hello:
                    for c in cells:
                        res.failures.setdefault((i, c.backend), {"status": "failed", "error": hello["error"]})
                    continue
                for row in hello["rows"]:
                    res.failures.setdefault((i, row.pop("backend")), row)
                for b, info in hello["ready"].items():
                    s = res.series.setdefault((i, b), Series())
                    s.info = {**info, "items": hello["items"], "unit": hello["unit"], "flops": hello["flops"]}
                live[i] = set(hello["ready"])
            budget = cfg.budget_s * max(1, len(cells)) * max(1, len(live))
            t0 = time.perf_counter()
            r = 0
            while live:
                order = list(live)
                rng.shuffle(order)
                for i in order:
                    conns[i].send("round")
                    try:
                        out = _recv(conns[i], procs[i], spec.isolation.timeout_s)
                    except (RuntimeError, TimeoutError, EOFError) as e:
                        for b in live.pop(i):
                            res.series[(i, b)].error = f"round server died: {e}; {_tail(tmp / f'err-{i}.txt')}"
                        continue
                    out.pop("_wall_s", None)
                    for b, got in out.items():
                        s = res.series[(i, b)]
                        if isinstance(got, str):
                            s.error = got
                            live[i].discard(b)
                            continue
                        s.samples += got
                        s.rounds += [r] * len(got)
                        s.processes += [p] * len(got)
                r += 1
                res.rounds = max(res.rounds, r)
                if on_round is not None:
                    on_round(r)
                elapsed = time.perf_counter() - t0
                if r >= MIN_ROUNDS and r % CHECK_EVERY == 0 and (
                        elapsed >= budget or r * cfg.round_samples >= cfg.max_samples
                        or _pairs_converged(res, len(revs), cfg.target_rel_ci, cfg.confidence)):
                    break
        finally:
            for conn in conns:
                with contextlib.suppress(OSError):
                    conn.send("stop")
            for proc in procs:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            for conn in conns:
                conn.close()
    return res


def _tail(path: Path, n: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-n:].strip()
    except OSError:
        return ""


def rev_backend(backend: str, rev: Revision) -> str:
    return f"{backend}@{rev.short}"


def store_setting(store: Store, run_id: str, revs: Sequence[Revision], res: SettingResult) -> None:
    """One row per revision and backend, ``backend@commit``, with rounds and processes for the statistics."""
    import dataclasses

    now = time.time()
    for cell in res.cells:
        for i, rev in enumerate(revs):
            c = dataclasses.replace(cell, backend=rev_backend(cell.backend, rev))
            ident = cell_identity(run_id, c)
            meta = {"revision": rev.commit, "revision_name": rev.name, "revision_subject": rev.subject,
                    "revision_index": i, "backend_name": cell.backend, "interleaved_revisions": len(revs)}
            fail = res.failures.get((i, cell.backend))
            s = res.series.get((i, cell.backend))
            if fail is not None or s is None or s.error or len(s.samples) < 2:
                err = (fail or {}).get("error") or (s.error if s else None) or "not measured"
                status = (fail or {}).get("status", "failed")
                store.append_cell(ident | {"status": status, "error": err, "started": now, "finished": now,
                                           "metrics_json": meta})
                continue
            med, lo, hi = median_ci(s.samples)
            counts = [s.processes.count(p) for p in range(max(s.processes) + 1)]
            info = s.info
            store.append_cell(ident | {
                "status": "ok", "compile_s": info.get("compile_s"), "first_call_s": info.get("first_call_s"),
                "median_s": med, "ci_low_s": lo, "ci_high_s": hi, "throughput": info["items"] / med,
                "throughput_unit": info["unit"], "flops": info["flops"], "achieved_flops": info["flops"] / med,
                "peak_mem_bytes": info.get("peak_mem_bytes"), "max_abs_err": info.get("max_abs_err"),
                "metrics_json": {**meta, "sample_rounds": s.rounds, "process_sample_counts": counts,
                                 "round_samples": None, "samples": len(s.samples), "latency_s": percentiles(s.samples),
                                 "calls_per_sample": info.get("calls_per_sample"), "warmup_steady": info.get("steady"),
                                 "interleaved": True, "cpus": info.get("cpus")},
                "samples_json": s.samples, "started": now, "finished": now,
            })


def run_revisions(spec: SweepSpec, revs: Sequence[Revision], db: str | Path, name: str,
                  env: dict[str, Any], on_setting: Callable[[str, int, int], None] | None = None,
                  ) -> tuple[str, list[SettingResult]]:
    """Validate the spec against the first revision's plugins, then measure every setting (module doc)."""
    first = revision_spec(spec, revs[0])
    vreg, breg = variant_registry(first.plugins), backend_registry(first.plugins)
    validate(first, vreg, breg)
    cells = expand(first, vreg)
    threads = spec.timing.threads or available_cpus()
    seed = spec.seed if spec.seed is not None else random.SystemRandom().randrange(2**31)
    results = []
    with Store(db) as store, tempfile.TemporaryDirectory(prefix="modelview-ab-") as tmp:
        run_id = store.new_run(name, json.dumps({**json.loads(spec.to_json()), "seed": seed}), {
            **env, "threads": threads, "revisions": [{"name": r.name, "commit": r.commit, "subject": r.subject}
                                                     for r in revs]})
        groups = list(settings(cells).values())
        for k, group in enumerate(groups):
            if on_setting is not None:
                on_setting(group[0].setting_key, k, len(groups))
            res = measure_setting(spec, revs, group, threads, seed + k, Path(tmp))
            store_setting(store, run_id, revs, res)
            results.append(res)
    return run_id, results

"""``nnforge merge A.db B.db -o all.db``: results of several machines in one store, idempotently.

A row's identity is its ``row_uid`` (written with every row); merging a row already present adds nothing, so merging
the same stores twice, or a store into one that already holds part of it, gives the same result. Rows keep the id of
the machine that measured them, runs keep their ids (time-stamped and random: two machines never mint the same one),
and new rows are appended in the order they were measured, so "the latest row of a cell" still means the latest
measurement; among the rows of one cell from one store, that store's own row order decides (a ``processes`` > 1
run's pooled row is written after the process rows it summarises, though it started earlier). Rows written before
stores had uids get one derived from their content (stable across merges), and a machine id derived from their run's
recorded environment. A run found with two specs keeps the first, unless one only extends the other's grid (a
resume in one copy): then the extended one, whatever the order of the sources.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .machine import machine_id
from .spec import extension_gap
from .store import CELL_COLUMN_NAMES, RUN_COLUMNS, Store, same_spec


@dataclass
class MergeResult:
    runs_added: int = 0
    rows_added: int = 0
    rows_present: int = 0
    machines: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _content_uid(row: dict[str, Any]) -> str:
    key = [row.get(c) for c in ("run_id", "cell_key", "status", "started", "finished", "median_s", "samples_json",
                                "error")]
    return "c" + hashlib.sha1(json.dumps(key, default=str).encode()).hexdigest()[:31]


def _env_fingerprint(env_json: str | None) -> dict[str, Any]:
    """A machine fingerprint rebuilt from a run's environment record (rows from before rows carried machines)."""
    env = json.loads(env_json or "{}")
    gpus = [env["gpu_model"]] * int(env.get("gpu_count") or 1) if env.get("gpu_model") else []
    return {"hostname": env.get("hostname"), "cpu_model": env.get("cpu_model"), "cpu_count": env.get("cpu_count"),
            "memory_bytes": None, "gpus": gpus, "platform": env.get("platform"), "from": "run environment"}


SortKey = tuple[bool, float, float]


def _time_key(row: dict[str, Any]) -> SortKey:
    """When a row was measured: finished, then started; rows without a finish time last."""
    return (row.get("finished") is None, row.get("finished") or 0.0, row.get("started") or 0.0)


def _ordered_keys(cells: Sequence[dict[str, Any]]) -> list[SortKey]:
    """Sort keys for one store's rows (in its row order) that never put a cell's row before an earlier row of the
    same cell: a row's key is at least that of every earlier row of its cell. Times alone would not do: a
    ``processes`` > 1 run's pooled row shares its finish with the last process row and started before it, so by
    times it would sort before the row it summarises and stop being the cell's latest row."""
    latest: dict[tuple[Any, Any], SortKey] = {}
    keys = []
    for row in cells:
        cell = (row.get("run_id"), row.get("cell_key"))
        key = max(_time_key(row), latest.get(cell, _time_key(row)))
        latest[cell] = key
        keys.append(key)
    return keys


def _extends(old_json: str | None, new_json: str | None) -> bool:
    """Whether ``new_json`` is ``old_json`` with a grid a resume extended (``spec.extension_gap``): then the two
    copies of the run are one run at two moments, and the extended spec, which names every cell either copy holds,
    is the one to keep whichever store comes first."""
    if not old_json or not new_json or same_spec(old_json, new_json):
        return False
    try:
        return extension_gap(old_json, new_json) is None
    except (TypeError, ValueError, AttributeError, StopIteration):  # not a spec's JSON: not an extension
        return False


def _read(path: Path) -> tuple[list[dict[str, Any]], dict[str, str], list[dict[str, Any]]]:
    if not path.is_file():
        raise FileNotFoundError(f"no store at {path}")
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not {"runs", "cells"} <= tables:
            raise ValueError(f"{path} is not a ModelView store (no runs/cells tables)")
        runs = [dict(zip(RUN_COLUMNS, r)) for r in con.execute(f"SELECT {', '.join(RUN_COLUMNS)} FROM runs")]
        machines = dict(con.execute("SELECT machine_id, fingerprint_json FROM machines")) if "machines" in tables \
            else {}
        have = [r[1] for r in con.execute("PRAGMA table_info(cells)")]
        cols = [c for c in CELL_COLUMN_NAMES if c in have]
        cells = [dict(zip(cols, r)) for r in con.execute(f"SELECT {', '.join(cols)} FROM cells ORDER BY rowid")]
    except sqlite3.DatabaseError as e:
        raise ValueError(f"cannot read {path}: {e}") from None
    finally:
        con.close()
    return runs, machines, cells


def merge(sources: Sequence[str | Path], out: str | Path) -> MergeResult:
    """Merge every source store into ``out`` (created if missing; may be one of the sources' copies)."""
    res = MergeResult()
    data = [_read(Path(s)) for s in sources]  # read everything first: a bad source changes nothing
    with Store(out) as store:
        have_runs = {r: (store.run(r) or {}).get("spec_json") for r in store.run_ids()}
        have_uids = store.row_uids()
        new_rows: list[tuple[SortKey, int, dict[str, Any]]] = []  # (time, position among all sources, row)
        env_of: dict[str, str | None] = {}
        for src, (runs, machines, cells) in zip(sources, data):
            for run in runs:
                env_of.setdefault(run["run_id"], run["env_json"])
                if run["run_id"] in have_runs:
                    kept = have_runs[run["run_id"]]
                    if kept == run["spec_json"] or _extends(run["spec_json"], kept):
                        continue
                    if _extends(kept, run["spec_json"]):  # a resume extended this copy's grid: it plans more cells
                        store.update_run_spec(run["run_id"], run["spec_json"])
                        have_runs[run["run_id"]] = run["spec_json"]
                    else:
                        res.notes.append(f"run {run['run_id']} of {src} differs from the one already merged; "
                                         "kept the first")
                    continue
                store.import_run(run)
                have_runs[run["run_id"]] = run["spec_json"]
                res.runs_added += 1
            for mid, fp in machines.items():
                store.add_machine(mid, json.loads(fp or "{}"))
            for key, row in zip(_ordered_keys(cells), cells):
                uid = row.get("row_uid") or _content_uid(row)
                if uid in have_uids:
                    res.rows_present += 1
                    continue
                have_uids.add(uid)
                if not row.get("machine_id"):
                    fp = _env_fingerprint(env_of.get(row["run_id"]))
                    row["machine_id"] = machine_id(fp)
                    store.add_machine(row["machine_id"], fp)
                new_rows.append((key, len(new_rows), {**row, "row_uid": uid}))
        new_rows.sort(key=lambda t: t[:2])  # ties (equal keys) keep the sources' row order
        store.import_rows([r for _, _, r in new_rows])
        res.rows_added = len(new_rows)
        res.machines = sorted(store.machines())
    return res

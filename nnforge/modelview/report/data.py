"""A small read-only layer over the ModelView store's SQLite tables.

Why not the store's own readers: the report and web view must open any store file (an old one, one being written by a
running sweep, one with fewer columns) without pandas and without the write-side set-up (schema creation, WAL
pragmas). Reading the two tables directly keeps the report decoupled from the writer; missing columns read as None.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from ..reasons import failure_reason

# Columns read for tables and plots; samples_json and artifact are large and read only for one cell at a time.
SUMMARY_COLUMNS = (
    "cell_key", "setting_key", "variant", "backend", "batch", "seq_len", "layout", "dtype", "mode", "device",
    "params_json", "status", "error", "compile_s", "first_call_s", "median_s", "ci_low_s", "ci_high_s", "throughput",
    "throughput_unit", "flops", "bytes", "achieved_flops", "achieved_bytes_per_s", "peak_mem_bytes", "max_abs_err",
    "metrics_json", "started", "finished", "machine_id",
)  # fmt: skip
DETAIL_COLUMNS = (*SUMMARY_COLUMNS, "samples_json", "artifact")
FILTER_COLUMNS = ("variant", "backend", "dtype", "layout", "batch", "seq_len", "mode", "status", "machine_id")


class StoreNotFound(FileNotFoundError):
    """The database path does not exist (opening it with sqlite3 would silently create an empty file)."""


class StoreUnusable(StoreNotFound):
    """The path is a file but not an SQLite database: said when the store is opened, in the words ``sweep`` and
    ``merge`` use, not as a traceback (report) or an error page (view) at the first query. A :class:`StoreNotFound`
    so that whoever handles a missing store handles this too."""


def _loads(text: Any, default: Any) -> Any:
    if text is None or text == "":
        return default
    if not isinstance(text, str | bytes):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return default


def _num(v: Any) -> float | None:
    """A finite float or None: NaN/inf in a row must not poison plots or JSON."""
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


@dataclass(frozen=True)
class RunInfo:
    """One row of ``runs`` plus per-status cell counts (latest row per cell)."""

    run_id: str
    name: str
    created: float | None
    spec: dict[str, Any]
    env: dict[str, Any]
    status_counts: dict[str, int] = field(default_factory=dict)

    @property
    def n_cells(self) -> int:
        return sum(self.status_counts.values())


@dataclass(frozen=True)
class CellRow:
    """One cell's latest measurement with JSON columns decoded; derived labels used by every figure and table.

    The labels are cached properties: the figures of a 10,000-cell run ask for them ~80,000 times, and rebuilding the
    strings each time was a fifth of the time the web view took to build them."""

    row_id: int
    cell_key: str
    variant: str
    backend: str
    batch: int | None
    seq_len: int | None
    layout: str
    dtype: str
    mode: str
    device: str
    params: dict[str, Any]
    status: str
    error: str | None
    compile_s: float | None
    first_call_s: float | None
    median_s: float | None
    ci_low_s: float | None
    ci_high_s: float | None
    throughput: float | None
    throughput_unit: str
    flops: float | None
    bytes: float | None
    achieved_flops: float | None
    achieved_bytes_per_s: float | None
    peak_mem_bytes: float | None
    max_abs_err: float | None
    metrics: dict[str, Any]
    started: float | None
    finished: float | None
    setting_key: str
    samples: tuple[float, ...] | None = None
    artifact: str | None = None
    machine_id: str | None = None  # the machine that measured it (None in stores from before machines were recorded)

    @cached_property
    def reason(self) -> str:
        """Why the cell has no time, in one line (``reasons.failure_reason``)."""
        return failure_reason(self.error)

    @cached_property
    def ok(self) -> bool:
        return self.status == "ok" and self.throughput is not None and self.throughput > 0

    @cached_property
    def params_label(self) -> str:
        return ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))

    @cached_property
    def model_label(self) -> str:
        """The "model version" axis of the seed chart: the variant with its parameters."""
        return f"{self.variant}({self.params_label})" if self.params else self.variant

    @cached_property
    def group_label(self) -> str:
        """The coarse setting (what changes the arithmetic, not the workload size)."""
        return " · ".join(x for x in (self.dtype, self.layout, self.mode, self.device) if x)

    @cached_property
    def shape_label(self) -> str:
        return f"N={self.batch} T={self.seq_len}"

    @cached_property
    def setting_label(self) -> str:
        return f"{self.model_label} · {self.shape_label} · {self.group_label}"

    @property
    def throughput_band(self) -> tuple[float, float] | None:
        """Throughput CI from the time CI (throughput is inversely proportional to time)."""
        if not self.ok or not self.median_s or not self.ci_low_s or not self.ci_high_s:
            return None
        t = self.throughput or 0.0
        return t * self.median_s / self.ci_high_s, t * self.median_s / self.ci_low_s

    @property
    def intensity(self) -> float | None:
        if self.flops and self.bytes:
            return self.flops / self.bytes
        return None


def _setting_key(d: Mapping[str, Any], params_json: str) -> str:
    return (
        f"{d.get('variant')}|N={d.get('batch')}|T={d.get('seq_len')}|{d.get('layout')}|{d.get('dtype')}|"
        f"{d.get('mode')}|{d.get('device')}|{params_json}"
    )


@lru_cache(maxsize=4096)
def _params(text: Any) -> dict[str, Any]:
    """Decoded params_json, memoised: a run repeats a handful of distinct values over thousands of rows. Callers must
    not mutate the (shared) result."""
    params = _loads(text, {})
    return params if isinstance(params, dict) else {}


def row_to_cell(d: Mapping[str, Any]) -> CellRow:
    """Decode one raw row (a column -> value mapping, missing columns allowed)."""
    params = _params(d.get("params_json"))
    metrics = _loads(d.get("metrics_json"), {})
    samples = _loads(d.get("samples_json"), None)
    samples_t = tuple(x for x in (_num(s) for s in samples) if x is not None) if isinstance(samples, list) else None
    ints = {k: (int(d[k]) if d.get(k) is not None else None) for k in ("batch", "seq_len")}
    return CellRow(
        row_id=int(d.get("row_id") or 0),
        cell_key=str(d.get("cell_key") or ""),
        variant=str(d.get("variant") or "?"),
        backend=str(d.get("backend") or "?"),
        batch=ints["batch"],
        seq_len=ints["seq_len"],
        layout=str(d.get("layout") or ""),
        dtype=str(d.get("dtype") or ""),
        mode=str(d.get("mode") or ""),
        device=str(d.get("device") or ""),
        params=params,
        status=str(d.get("status") or "?"),
        error=d.get("error"),
        compile_s=_num(d.get("compile_s")),
        first_call_s=_num(d.get("first_call_s")),
        median_s=_num(d.get("median_s")),
        ci_low_s=_num(d.get("ci_low_s")),
        ci_high_s=_num(d.get("ci_high_s")),
        throughput=_num(d.get("throughput")),
        throughput_unit=str(d.get("throughput_unit") or "vectors/s"),
        flops=_num(d.get("flops")),
        bytes=_num(d.get("bytes")),
        achieved_flops=_num(d.get("achieved_flops")),
        achieved_bytes_per_s=_num(d.get("achieved_bytes_per_s")),
        peak_mem_bytes=_num(d.get("peak_mem_bytes")),
        max_abs_err=_num(d.get("max_abs_err")),
        metrics=metrics if isinstance(metrics, dict) else {},
        started=_num(d.get("started")),
        finished=_num(d.get("finished")),
        setting_key=str(d.get("setting_key") or _setting_key(d, json.dumps(params, sort_keys=True))),
        samples=samples_t,
        artifact=d.get("artifact"),
        machine_id=d.get("machine_id"),
    )


class Database:
    """A store file opened for reading. Holds only its path: every call opens its own short-lived connection, so one
    ``Database`` can serve many web-request threads and never blocks a sweep that is writing the file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise StoreNotFound(f"no ModelView database at {self.path} (run `nnforge sweep` first)")
        try:
            with self.connect() as con:
                con.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.DatabaseError as e:
            raise StoreUnusable(f"cannot use store {self.path}: {e}") from e

    @contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        con = sqlite3.connect(f"file:{self.path.resolve()}?mode=ro", uri=True, timeout=30)
        try:
            yield con
        finally:
            con.close()

    def _columns(self, con: sqlite3.Connection, table: str) -> set[str]:
        return {r[1] for r in con.execute(f"PRAGMA table_info({table})")}

    def mtime(self) -> float:
        """Changes whenever a writer commits (WAL file included): the key for caches of derived data."""
        wal = self.path.with_name(self.path.name + "-wal")
        return max(self.path.stat().st_mtime, wal.stat().st_mtime if wal.exists() else 0.0)

    # -- runs ----------------------------------------------------------------------------------------------------
    def runs(self) -> list[RunInfo]:
        """All runs, oldest first, with per-status counts of their latest cell rows."""
        with self.connect() as con:
            if "run_id" not in self._columns(con, "runs"):
                return []
            counts: dict[str, dict[str, int]] = {}
            if "status" in self._columns(con, "cells"):
                q = (
                    "SELECT run_id, status, COUNT(*) FROM cells WHERE rowid IN "
                    "(SELECT MAX(rowid) FROM cells GROUP BY run_id, cell_key) GROUP BY run_id, status"
                )
                for run_id, status, n in con.execute(q):
                    counts.setdefault(run_id, {})[status] = n
            rows = con.execute("SELECT run_id, name, created, spec_json, env_json FROM runs ORDER BY created, rowid")
            return [
                RunInfo(
                    run_id=r[0],
                    name=r[1] or "",
                    created=_num(r[2]),
                    spec=_loads(r[3], {}) or {},
                    env=_loads(r[4], {}) or {},
                    status_counts=counts.get(r[0], {}),
                )
                for r in rows
            ]

    def run(self, ref: str | None = None, runs: list[RunInfo] | None = None) -> RunInfo | None:
        """A run by id, unique id prefix or name (latest of that name); None picks the latest run. ``runs``: the
        result of :meth:`runs` if the caller has it (the web view caches it), saving a scan of the cells."""
        runs = self.runs() if runs is None else runs
        if not runs:
            return None
        if ref is None:
            return max(runs, key=lambda r: r.created or 0.0)
        for r in runs:
            if r.run_id == ref:
                return r
        named = [r for r in runs if r.name == ref]
        if named:
            return max(named, key=lambda r: r.created or 0.0)
        pref = [r for r in runs if r.run_id.startswith(ref)]
        if len(pref) == 1:
            return pref[0]
        raise KeyError(f"run {ref!r} is ambiguous" if pref else f"no run {ref!r} in {self.path}")

    # -- cells ---------------------------------------------------------------------------------------------------
    def _where(
        self, run_id: str, filters: Mapping[str, Sequence[Any]] | None, have: set[str]
    ) -> tuple[str, list[Any]]:
        where = ["run_id = ?", "rowid IN (SELECT MAX(rowid) FROM cells WHERE run_id = ? GROUP BY cell_key)"]
        args: list[Any] = [run_id, run_id]
        for k, values in (filters or {}).items():
            if k not in FILTER_COLUMNS:
                raise KeyError(f"cannot filter on {k!r}; filters: {', '.join(FILTER_COLUMNS)}")
            vals = [v for v in values if v not in (None, "")]
            if not vals:
                continue
            if k not in have:
                return "0", []
            where.append(f"{k} IN ({', '.join('?' for _ in vals)})")
            args += vals
        return " AND ".join(where), args

    def cells(
        self,
        run_id: str,
        filters: Mapping[str, Sequence[Any]] | None = None,
        limit: int | None = None,
        offset: int = 0,
        columns: Iterable[str] = SUMMARY_COLUMNS,
    ) -> list[CellRow]:
        """Latest row per cell of one run, in insertion order, optionally filtered and paginated."""
        with self.connect() as con:
            have = self._columns(con, "cells")
            if "run_id" not in have:
                return []
            cols = [c for c in columns if c in have]
            where, args = self._where(run_id, filters, have)
            sql = f"SELECT rowid AS row_id, {', '.join(cols)} FROM cells WHERE {where} ORDER BY rowid"
            if limit is not None:
                sql += " LIMIT ? OFFSET ?"
                args = [*args, int(limit), int(offset)]
            cur = con.execute(sql, args)
            names = [c[0] for c in cur.description]
            return [row_to_cell(dict(zip(names, r))) for r in cur]

    def count(self, run_id: str, filters: Mapping[str, Sequence[Any]] | None = None) -> int:
        with self.connect() as con:
            have = self._columns(con, "cells")
            if "run_id" not in have:
                return 0
            where, args = self._where(run_id, filters, have)
            return int(con.execute(f"SELECT COUNT(*) FROM cells WHERE {where}", args).fetchone()[0])

    def distinct(self, run_id: str, column: str) -> list[Any]:
        """Values of one filter column in a run (for the filter drop-downs)."""
        if column not in FILTER_COLUMNS:
            raise KeyError(column)
        with self.connect() as con:
            if column not in self._columns(con, "cells"):
                return []
            q = f"SELECT DISTINCT {column} FROM cells WHERE run_id = ? AND {column} IS NOT NULL ORDER BY {column}"
            return [r[0] for r in con.execute(q, (run_id,))]

    def cell(self, run_id: str, cell_key: str) -> CellRow | None:
        """One cell's latest row with its samples and artifact."""
        with self.connect() as con:
            have = self._columns(con, "cells")
            cols = [c for c in DETAIL_COLUMNS if c in have]
            cur = con.execute(
                f"SELECT rowid AS row_id, {', '.join(cols)} FROM cells WHERE run_id = ? AND cell_key = ? "
                "ORDER BY rowid DESC LIMIT 1",
                (run_id, cell_key),
            )
            r = cur.fetchone()
            return row_to_cell(dict(zip([c[0] for c in cur.description], r))) if r else None

    def samples(self, run_id: str, cell_keys: Iterable[str]) -> dict[str, tuple[float, ...]]:
        """Per-call seconds of several cells (latest rows), read in one query."""
        keys = list(dict.fromkeys(cell_keys))
        out: dict[str, tuple[float, ...]] = {}
        if not keys:
            return out
        with self.connect() as con:
            if "samples_json" not in self._columns(con, "cells"):
                return out
            for i in range(0, len(keys), 500):  # SQLite's bound-parameter limit
                chunk = keys[i : i + 500]
                q = (
                    "SELECT cell_key, samples_json FROM cells WHERE rowid IN (SELECT MAX(rowid) FROM cells "
                    f"WHERE run_id = ? AND cell_key IN ({', '.join('?' for _ in chunk)}) GROUP BY cell_key)"
                )
                for key, text in con.execute(q, (run_id, *chunk)):
                    vals = _loads(text, None)
                    if isinstance(vals, list):
                        out[key] = tuple(x for x in (_num(v) for v in vals) if x is not None)
        return out

"""The result store: SQLite, append-only, one transaction per row.

Why SQLite in WAL mode with ``synchronous=FULL``: a committed row survives the writer being killed at any instant
(kill -9, OOM killer, Ctrl-C), several workers and a reader can use the file at once, and the file is one portable
artefact. Rows are never updated or deleted: re-measuring (``--force``) appends a newer row for the same cell, and
readers take the latest row per (run, cell) unless asked for all of them. (A run's spec is updated when a resume
extends its grid, so that it names every cell the run plans.)

Readers (:meth:`Store.runs`, :meth:`Store.cells`) return pandas DataFrames; the report and web view build on those.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

STATUSES = ("ok", "failed", "timeout", "oom", "crashed", "mismatch", "skipped")
FINAL_STATUSES = frozenset(STATUSES)

RUN_COLUMNS = ("run_id", "name", "created", "spec_json", "env_json")
CELL_COLUMNS: tuple[tuple[str, str], ...] = (
    ("run_id", "TEXT NOT NULL"),
    ("cell_key", "TEXT NOT NULL"),
    ("setting_key", "TEXT"),
    ("variant", "TEXT"),
    ("backend", "TEXT"),
    ("batch", "INTEGER"),
    ("seq_len", "INTEGER"),
    ("layout", "TEXT"),
    ("dtype", "TEXT"),
    ("mode", "TEXT"),
    ("device", "TEXT"),
    ("params_json", "TEXT"),
    ("status", "TEXT NOT NULL"),
    ("error", "TEXT"),
    ("compile_s", "REAL"),
    ("first_call_s", "REAL"),
    ("median_s", "REAL"),
    ("ci_low_s", "REAL"),
    ("ci_high_s", "REAL"),
    ("throughput", "REAL"),
    ("throughput_unit", "TEXT"),
    ("flops", "REAL"),
    ("bytes", "REAL"),
    ("achieved_flops", "REAL"),
    ("achieved_bytes_per_s", "REAL"),
    ("peak_mem_bytes", "INTEGER"),
    ("max_abs_err", "REAL"),
    ("metrics_json", "TEXT"),
    ("samples_json", "TEXT"),
    ("artifact", "TEXT"),
    ("started", "REAL"),
    ("finished", "REAL"),
    ("machine_id", "TEXT"),  # the machine that measured the row (``machines`` table); merged stores keep it
    ("row_uid", "TEXT"),  # a row's identity across stores: what makes ``merge`` idempotent
)
CELL_COLUMN_NAMES = tuple(c for c, _ in CELL_COLUMNS)

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS runs(
    run_id TEXT PRIMARY KEY, name TEXT, created REAL, spec_json TEXT, env_json TEXT
);
CREATE TABLE IF NOT EXISTS cells(
    row_id INTEGER PRIMARY KEY AUTOINCREMENT,
    {", ".join(f"{c} {t}" for c, t in CELL_COLUMNS)}
);
CREATE INDEX IF NOT EXISTS cells_run_key ON cells(run_id, cell_key);
CREATE TABLE IF NOT EXISTS machines(machine_id TEXT PRIMARY KEY, fingerprint_json TEXT);
"""


EXPORT_SUFFIXES = (".csv", ".parquet", ".pq")
"""The files ``Store.export`` writes: CSV, or Parquet (checked by ``nnforge sweep --export`` before measuring)."""


class Store:
    """A connection to one store file. Cheap to open; open one per process (connections are not shared)."""

    def __init__(self, path: str | Path, timeout_s: float = 60.0) -> None:
        self.path = str(path)
        self._con = sqlite3.connect(self.path, timeout=timeout_s, isolation_level=None, check_same_thread=False)
        self._con.execute("PRAGMA journal_mode=WAL")
        self._con.execute("PRAGMA synchronous=FULL")
        self._con.execute(f"PRAGMA busy_timeout={int(timeout_s * 1000)}")
        with self._write():
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    self._con.execute(stmt)
            have = {r[1] for r in self._con.execute("PRAGMA table_info(cells)")}
            for col, typ in CELL_COLUMNS:  # a store written before a column existed gains it (NULL in old rows)
                if col not in have:
                    self._con.execute(f"ALTER TABLE cells ADD COLUMN {col} {typ}")
            self._con.execute("CREATE UNIQUE INDEX IF NOT EXISTS cells_uid ON cells(row_uid)")
        self._machine: str | None = None

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[None]:
        """One IMMEDIATE transaction: takes the write lock up front, so concurrent writers queue instead of failing
        half-way; the commit is the moment the row becomes durable."""
        self._con.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._con.execute("ROLLBACK")
            raise
        self._con.execute("COMMIT")

    # -- writing -------------------------------------------------------------------------------------------------
    def machine_id(self) -> str:
        """This machine's id, registered in the ``machines`` table on first use (rows written here carry it)."""
        if self._machine is None:
            from .machine import fingerprint, machine_id

            fp = fingerprint()
            self._machine = machine_id(fp)
            self.add_machine(self._machine, fp)
        return self._machine

    def add_machine(self, machine_id: str, fingerprint: Mapping[str, Any]) -> None:
        with self._write():
            self._con.execute("INSERT OR IGNORE INTO machines(machine_id, fingerprint_json) VALUES (?, ?)",
                              (machine_id, json.dumps(fingerprint, sort_keys=True)))

    def new_run(self, name: str, spec_json: str, env: Mapping[str, Any], run_id: str | None = None) -> str:
        run_id = run_id or time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        with self._write():
            self._con.execute(
                "INSERT INTO runs(run_id, name, created, spec_json, env_json) VALUES (?, ?, ?, ?, ?)",
                (run_id, name, time.time(), spec_json, json.dumps(env, sort_keys=True, default=str)),
            )
        return run_id

    def update_run_spec(self, run_id: str, spec_json: str) -> None:
        """Replace a run's spec: a resume with an extended grid records the grid it now plans, so the report's spec
        table and its list of planned but unmeasured cells describe the extended run, not the first invocation."""
        with self._write():
            cur = self._con.execute("UPDATE runs SET spec_json = ? WHERE run_id = ?", (spec_json, run_id))
            if cur.rowcount != 1:
                raise KeyError(f"no run {run_id!r} in {self.path}")

    def append_cell(self, row: Mapping[str, Any]) -> None:
        """Append one row in its own transaction. Unknown keys are an error (a typo must not lose a metric)."""
        unknown = set(row) - set(CELL_COLUMN_NAMES)
        if unknown:
            raise KeyError(f"unknown cell columns: {sorted(unknown)}")
        if row.get("status") not in FINAL_STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {row.get('status')!r}")
        row = {**row, "machine_id": row.get("machine_id") or self.machine_id(),
               "row_uid": row.get("row_uid") or uuid.uuid4().hex}
        values = {k: _encode(v) for k, v in row.items()}
        cols = ", ".join(values)
        marks = ", ".join("?" for _ in values)
        with self._write():
            self._con.execute(f"INSERT INTO cells({cols}) VALUES ({marks})", tuple(values.values()))

    def import_run(self, run: Mapping[str, Any]) -> None:
        """A run record copied from another store, as it was (``merge``)."""
        marks = ", ".join("?" * len(RUN_COLUMNS))
        with self._write():
            self._con.execute(f"INSERT INTO runs({', '.join(RUN_COLUMNS)}) VALUES ({marks})",
                              tuple(run[c] for c in RUN_COLUMNS))

    def import_rows(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Rows copied from another store with their machine and uid, in one transaction (``merge``)."""
        cols = list(CELL_COLUMN_NAMES)
        with self._write():
            self._con.executemany(f"INSERT INTO cells({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                                  [tuple(r.get(c) for c in cols) for r in rows])

    def row_uids(self) -> set[str]:
        return {r[0] for r in self._con.execute("SELECT row_uid FROM cells WHERE row_uid IS NOT NULL")}

    # -- reading -------------------------------------------------------------------------------------------------
    def run_ids(self) -> list[str]:
        return [r[0] for r in self._con.execute("SELECT run_id FROM runs ORDER BY created, rowid")]

    def run(self, run_id: str) -> dict[str, Any] | None:
        cur = self._con.execute(f"SELECT {', '.join(RUN_COLUMNS)} FROM runs WHERE run_id = ?", (run_id,))
        r = cur.fetchone()
        return dict(zip(RUN_COLUMNS, r)) if r else None

    def resolve_run(self, ref: str) -> str:
        """A run id, a unique run-id prefix, or a run name (its latest run)."""
        ids = self.run_ids()
        if ref in ids:
            return ref
        by_name = self._con.execute(
            "SELECT run_id FROM runs WHERE name = ? ORDER BY created DESC, rowid DESC LIMIT 1", (ref,)
        ).fetchone()
        if by_name:
            return by_name[0]
        pref = [i for i in ids if i.startswith(ref)]
        if len(pref) == 1:
            return pref[0]
        if len(pref) > 1:
            raise KeyError(f"run reference {ref!r} is ambiguous: {', '.join(pref)}")
        raise KeyError(f"no run {ref!r} in {self.path}")

    def latest_run(self, name: str, spec_json: str | None = None) -> str | None:
        q = "SELECT run_id, spec_json FROM runs WHERE name = ? ORDER BY created DESC, rowid DESC"
        for run_id, sj in self._con.execute(q, (name,)):
            if spec_json is None or same_spec(sj, spec_json):
                return run_id
        return None

    def finished_keys(self, run_id: str, statuses: Sequence[str] = STATUSES) -> set[str]:
        marks = ", ".join("?" for _ in statuses)
        cur = self._con.execute(
            f"SELECT DISTINCT cell_key FROM cells WHERE run_id = ? AND status IN ({marks})", (run_id, *statuses)
        )
        return {r[0] for r in cur}

    def rows(self, run_id: str | None = None, latest_only: bool = True, **filters: Any) -> list[dict[str, Any]]:
        """Cell rows as dicts (JSON columns still encoded). ``filters`` are column = value (or a list of values)."""
        where, args = [], []
        if run_id is not None:
            where.append("run_id = ?")
            args.append(run_id)
        for k, v in filters.items():
            if k not in CELL_COLUMN_NAMES:
                raise KeyError(f"unknown column {k!r}")
            if isinstance(v, list | tuple | set):
                where.append(f"{k} IN ({', '.join('?' for _ in v)})")
                args += list(v)
            else:
                where.append(f"{k} = ?")
                args.append(v)
        if latest_only:
            where.append("row_id IN (SELECT MAX(row_id) FROM cells GROUP BY run_id, cell_key)")
        sql = f"SELECT row_id, {', '.join(CELL_COLUMN_NAMES)} FROM cells"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY row_id"
        names = ("row_id", *CELL_COLUMN_NAMES)
        return [dict(zip(names, r)) for r in self._con.execute(sql, args)]

    def machines(self) -> dict[str, dict[str, Any]]:
        """machine id -> its fingerprint (host, CPU, memory, GPUs)."""
        return {m: json.loads(f or "{}") for m, f in self._con.execute("SELECT machine_id, fingerprint_json "
                                                                         "FROM machines ORDER BY machine_id")}

    def runs(self) -> pd.DataFrame:
        import pandas as pd

        rows = self._con.execute(f"SELECT {', '.join(RUN_COLUMNS)} FROM runs ORDER BY created, rowid").fetchall()
        return pd.DataFrame(rows, columns=list(RUN_COLUMNS))

    def cells(self, run_id: str | None = None, latest_only: bool = True, **filters: Any) -> pd.DataFrame:
        """Cell rows as a DataFrame, one row per cell (the latest measurement) unless ``latest_only=False``.
        ``run_id`` may be an id, a unique prefix or a run name (its latest run), as the commands take it; one that
        names no run is a KeyError, not an empty frame that reads as a run without cells."""
        import pandas as pd

        if run_id is not None:
            run_id = self.resolve_run(run_id)
        rows = self.rows(run_id, latest_only=latest_only, **filters)
        return pd.DataFrame(rows, columns=["row_id", *CELL_COLUMN_NAMES])

    def export(self, path: str | Path, run_id: str | None = None) -> Path:
        """Write cells to ``.csv`` or ``.parquet`` (chosen by the suffix, ``EXPORT_SUFFIXES``); ``run_id`` as
        :meth:`cells` takes it."""
        path = Path(path)
        if path.suffix not in EXPORT_SUFFIXES:
            raise ValueError(f"export format of {path.name!r} unknown: use .csv or .parquet")
        df = self.cells(run_id)
        if path.suffix == ".csv":
            df.to_csv(path, index=False)
        else:
            df.to_parquet(path, index=False)
        return path


def cell_identity(run_id: str, cell: Any) -> dict[str, Any]:
    """The identifying columns of a row for a :class:`~nnforge.modelview.spec.Cell`."""
    return {
        "run_id": run_id,
        "cell_key": cell.key,
        "setting_key": cell.setting_key,
        "variant": cell.variant,
        "backend": cell.backend,
        "batch": cell.batch,
        "seq_len": cell.seq_len,
        "layout": cell.layout,
        "dtype": cell.dtype,
        "mode": cell.mode,
        "device": cell.device,
        "params_json": cell.params_json,
    }


def open_store(path: str | Path = "modelview.db") -> Store:
    """Open (creating if needed) a store file."""
    return Store(path)


def _encode(v: Any) -> Any:
    if isinstance(v, dict | list | tuple):
        return json.dumps(v, sort_keys=True, default=str)
    if v is not None and not isinstance(v, str | int | float | bytes):
        try:
            return float(v)
        except (TypeError, ValueError):
            return str(v)
    return v


def same_spec(a: str, b: str) -> bool:
    """Specs match for resuming when they agree on everything but the seed (a fresh seed is drawn per run)."""
    try:
        da, db = json.loads(a), json.loads(b)
    except (TypeError, ValueError):
        return a == b
    da.pop("seed", None)
    db.pop("seed", None)
    return da == db

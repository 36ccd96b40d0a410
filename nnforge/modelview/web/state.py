"""Per-app state: the database and a small LRU of derived results (figures, comparisons).

Why a cache: figures for a 10,000-cell run take about half a second to build; filters and pages are revisited, and the
server warms the latest runs at start so that even a first visit finds its figures built. Entries are keyed by the
database's modification time too, so a sweep still writing the file is never shown stale. The cache lives on the app
instance (one per ``create_app``), never at module level.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from ..report.data import FILTER_COLUMNS, Database, RunInfo

T = TypeVar("T")


class LRU:
    """A thread-safe least-recently-used map; ``get_or_make`` builds outside the lock (builds may be slow), and a
    second caller asking for a key that is being built waits for that build instead of starting its own (the first
    request of a run page arrives while the start-up warm-up is still building it: two builds would each take twice
    as long on a 2-core machine)."""

    def __init__(self, maxsize: int = 16) -> None:
        self.maxsize = maxsize
        self._data: OrderedDict[Hashable, Any] = OrderedDict()
        self._building: dict[Hashable, threading.Event] = {}
        self._lock = threading.Lock()

    def get_or_make(self, key: Hashable, make: Callable[[], T]) -> T:
        while True:
            with self._lock:
                if key in self._data:
                    self._data.move_to_end(key)
                    return self._data[key]
                done = self._building.get(key)
                if done is None:
                    done = self._building[key] = threading.Event()
                    break
            done.wait()  # then look again: normally there now; if that build failed, build here
        try:
            value = make()
            with self._lock:
                self._data[key] = value
                while len(self._data) > self.maxsize:
                    self._data.popitem(last=False)
            return value
        finally:
            with self._lock:
                self._building.pop(key, None)
            done.set()


class ViewState:
    """What every request handler needs: the database and the cache."""

    def __init__(self, db_path: str) -> None:
        self.db = Database(db_path)
        self.cache = LRU(maxsize=32)
        self.warm: str = "off"  # the start-up warm-up: "off", "running" or "done" (/healthz says which)

    def cached(self, kind: str, key: Hashable, make: Callable[[], T]) -> T:
        return self.cache.get_or_make((kind, self.db.mtime(), key), make)

    def runs(self) -> list[RunInfo]:
        """All runs with their status counts (a scan of every cell row: ~25 ms at 10,000 cells, asked for twice
        per page), cached until the database changes."""
        return self.cached("runs", None, self.db.runs)

    def options(self, run_id: str) -> dict[str, list[Any]]:
        """The values of each filter column in a run (the drop-downs; eight scans of the run), cached likewise."""
        return self.cached("options", run_id, lambda: {c: self.db.distinct(run_id, c) for c in FILTER_COLUMNS})

"""Per-app state: the database and a small LRU of derived results (figures, comparisons).

Why a cache: figures for a 10,000-cell run take a second or two to build; filters and pages are revisited. Entries are
keyed by the database's modification time too, so a sweep still writing the file is never shown stale. The cache
lives on the app instance (one per ``create_app``), never at module level.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from ..report.data import Database

T = TypeVar("T")


class LRU:
    """A thread-safe least-recently-used map; ``get_or_make`` builds outside the lock (builds may be slow)."""

    def __init__(self, maxsize: int = 16) -> None:
        self.maxsize = maxsize
        self._data: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get_or_make(self, key: Hashable, make: Callable[[], T]) -> T:
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return self._data[key]
        value = make()
        with self._lock:
            self._data[key] = value
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)
        return value


class ViewState:
    """What every request handler needs: the database and the cache."""

    def __init__(self, db_path: str) -> None:
        self.db = Database(db_path)
        self.cache = LRU()

    def cached(self, kind: str, key: Hashable, make: Callable[[], T]) -> T:
        return self.cache.get_or_make((kind, self.db.mtime(), key), make)

"""The search both tuners run and the file each keeps its result in: one axis at a time over a frozen record of
sizes (``GemmConfig``, ``Tiles``), each candidate timed once, the winner cached on disk as JSON."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, TypeVar

log = logging.getLogger("nnforge.tune")

R = TypeVar("R")


def coordinate_search(start: R, axes: Mapping[str, Sequence[Any]], timer: Callable[[R], float],
                      skip: Callable[[R, str], bool] = lambda _best, _axis: False,
                      failures_lose: bool = False) -> tuple[R, dict[str, float]]:
    """The best record found by trying each value of one axis at a time from ``start``, keeping the best so far
    (a few dozen timings instead of the product: the axes interact little); an axis named ``"a+b"`` sets fields
    ``a`` and ``b`` together, from tuples, for fields that do interact (a choice that pays only with another);
    ``skip(best, axis)`` passes over an axis that does not apply. Returns it and every timing by candidate (its
    fields as JSON). With ``failures_lose`` a candidate whose timing raises is logged and loses instead of ending
    the search."""
    results: dict[str, float] = {}

    def timed(candidate: R) -> float:
        key = json.dumps(asdict(candidate), sort_keys=True)  # type: ignore[call-overload]
        if key not in results:
            try:
                results[key] = timer(candidate)
            except Exception as e:
                if not failures_lose:
                    raise
                log.warning("%s failed: %s", key, e)
                results[key] = float("inf")
            log.info("%s: %.3f ms", key, results[key] * 1e3)
        return results[key]

    best = start
    for axis, values in axes.items():
        if not skip(best, axis):
            fields = axis.split("+")
            settings = [dict(zip(fields, v if len(fields) > 1 else (v,), strict=True)) for v in values]
            best = min((replace(best, **s) for s in settings), key=timed)  # type: ignore[type-var]
    return best, results


def save_result(path: Path, record: dict[str, Any]) -> None:
    """``record`` as JSON at ``path``, replaced whole (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)


def load_result(path: Path, field: str, cls: Callable[..., R]) -> R | None:
    """``cls`` of the fields saved under ``field`` at ``path``; None when there is no (valid) result."""
    try:
        return cls(**json.loads(path.read_text())[field])
    except (OSError, ValueError, KeyError, TypeError):
        return None

"""What a GPU trace says about copies against compute: read from the Chrome trace torch's profiler (Kineto) writes.

A streamed loop hides its host<->device copies only if they run on another stream while kernels run; the trace is
the evidence. ``copy_overlap`` sums, per copy direction, the copies' time and the part of it during which a kernel
ran on another stream, and names the streams each ran on: the numbers ``bench/feeder.py --trace`` prints and the
GPU test checks.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Copies:
    """Copies of one direction (``HtoD``, ``DtoH``, ``DtoD``): how many, on which streams, for how long (µs),
    and for how long a kernel ran on another stream at the same time."""

    count: int = 0
    streams: set[int] = field(default_factory=set)
    busy_us: float = 0.0
    overlapped_us: float = 0.0

    @property
    def overlapped(self) -> float:
        """The share of the copies' time hidden behind kernels (0 when there were none)."""
        return self.overlapped_us / self.busy_us if self.busy_us else 0.0


@dataclass
class Overlap:
    copies: dict[str, Copies]
    kernel_streams: set[int]
    kernels: int


def _union(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _covered(start: float, end: float, spans: Sequence[tuple[float, float]]) -> float:
    return sum(max(0.0, min(end, e) - max(start, s)) for s, e in spans)


def _direction(name: str) -> str:
    for d in ("HtoD", "DtoH", "DtoD"):
        if d in name:
            return d
    return "other"


def copy_overlap(trace: str | Path | dict[str, Any]) -> Overlap:
    """Copies against kernels in a Chrome trace (a path, or the parsed JSON) from ``torch.profiler``."""
    data = trace if isinstance(trace, dict) else json.loads(Path(trace).read_text())
    events = [e for e in data.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    kernels = [e for e in events if str(e.get("cat", "")).lower() == "kernel"]
    memcpys = [e for e in events if str(e.get("cat", "")).lower() == "gpu_memcpy"]
    by_stream: dict[int, list[tuple[float, float]]] = {}
    for k in kernels:
        by_stream.setdefault(int(k.get("args", {}).get("stream", -1)), []).append(
            (float(k["ts"]), float(k["ts"]) + float(k["dur"])))
    copies: dict[str, Copies] = {}
    elsewhere: dict[int, list[tuple[float, float]]] = {}  # by a copy's stream: kernels on the others, merged
    for m in memcpys:
        stream = int(m.get("args", {}).get("stream", -1))
        start, end = float(m["ts"]), float(m["ts"]) + float(m["dur"])
        if stream not in elsewhere:
            elsewhere[stream] = _union(span for s, spans in by_stream.items() if s != stream for span in spans)
        others = elsewhere[stream]
        c = copies.setdefault(_direction(str(m.get("name", ""))), Copies())
        c.count += 1
        c.streams.add(stream)
        c.busy_us += end - start
        c.overlapped_us += _covered(start, end, others)
    return Overlap(copies, set(by_stream), len(kernels))

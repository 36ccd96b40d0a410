"""Reading copies against kernels from a torch profiler trace (``runtime.timeline``), on a hand-made trace whose
overlaps are known: kernels on streams 7 and 9, copies on stream 9 and 7, one copy overlapping two kernels that
overlap each other, one hidden only by a kernel on its own stream (which does not count)."""

from __future__ import annotations

import json

import pytest

from nnforge.runtime.timeline import copy_overlap


def _x(cat: str, name: str, ts: float, dur: float, stream: int) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}


TRACE = {"traceEvents": [
    _x("kernel", "k0", 0, 10, 7), _x("kernel", "k1", 5, 10, 7), _x("kernel", "k2", 40, 10, 7),
    _x("kernel", "k3", 60, 10, 9),
    _x("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 2, 20, 9),   # 13 µs under k0 ∪ k1 (0..15)
    _x("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 45, 10, 9),  # 5 µs under k2
    _x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 62, 4, 9),   # under k3 only: its own stream
    _x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 64, 4, 7),   # under k3: 4 µs
    {"ph": "i", "cat": "kernel", "name": "instant", "ts": 0},      # not a span: ignored
]}


def test_copy_time_hidden_behind_kernels_on_other_streams(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(TRACE))
    for trace in (TRACE, path, str(path)):
        o = copy_overlap(trace)
        assert o.kernels == 4 and o.kernel_streams == {7, 9}
        h2d, d2h = o.copies["HtoD"], o.copies["DtoH"]
        assert (h2d.count, h2d.streams, h2d.busy_us, h2d.overlapped_us) == (2, {9}, 30.0, 18.0)
        assert h2d.overlapped == pytest.approx(0.6)
        assert (d2h.count, d2h.streams, d2h.busy_us, d2h.overlapped_us) == (2, {7, 9}, 8.0, 4.0)


def test_a_trace_without_copies():
    o = copy_overlap({"traceEvents": [_x("kernel", "k", 0, 1, 7)]})
    assert o.copies == {} and o.kernels == 1

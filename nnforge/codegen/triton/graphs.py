"""A Triton program's launches captured in a CUDA graph per run-time sizes, and replayed (opt-in).

A loop the schedule cannot make one persistent kernel is a host loop: Python launches the body's kernels every step,
and on an H200 that cost 19–40 µs per step whatever the work (docs/benchmarks.md, "The GPU backend"). A CUDA graph
replays the same launches from the driver in one call. ``CudaGraphs`` wraps a generated module's ``run``: the first
call at given sizes runs it as usual (compiling and loading its kernels) and then captures it into a graph whose
inputs and outputs are tensors the graph owns; later calls at those sizes copy the inputs in, replay, and copy the
outputs out (device-to-device copies, on the caller's stream). A new sequence length is a new capture, not a new
compile; the ``keep`` most recently used graphs are kept (each holds its scratch memory). A capture that fails
(something in the program that a graph cannot hold) is logged once and the program runs uncaptured from then on.

Not captured: programs that draw random numbers (a graph would freeze their seed). By default a program with a
host loop is captured and one without is not (``captured_by_default``): on an H200 replaying a host loop took
0.40–0.90 of its time at batch 128 (and at H = 384, batch 1024, in training) and was never slower, while programs
whose loops are persistent kernels gained nothing (0.97–1.02; docs/benchmarks.md) and a graph keeps its scratch
memory. ``NNFORGE_CUDA_GRAPHS=1`` / ``0`` or ``TritonBackend(cuda_graphs=True / False)`` decide for every program.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger("nnforge.codegen")

KEEP = 4  # graphs kept per program (by run-time sizes), least recently used dropped first

Run = Callable[[list, list, list, list, str, int], None]  # a generated module's run(ins, data, outs, S, dev, seed)


def captured_by_default(module: Any) -> bool:
    """Whether a generated module's ``run`` is replayed as CUDA graphs when nobody chose: where it steps through
    a host loop, a launch per kernel per step (``HOST_LOOPS``), which a graph replays without Python."""
    return getattr(module, "HOST_LOOPS", 0) > 0


class CudaGraphs:
    """``run`` behind a cache of CUDA graphs keyed by the call's sizes and tensor shapes (see the module)."""

    def __init__(self, run: Run, api: Any = None, keep: int = KEEP):
        if api is None:
            import torch as api
        self.run, self.torch, self.keep = run, api, keep
        self.graphs: OrderedDict[tuple, tuple[Any, list, list]] = OrderedDict()
        self.captures = 0
        self.failed: str | None = None  # why capturing stopped, once it did

    def __call__(self, ins: list, data: list, outs: list, sizes: Sequence[int], device: str, seed: int = 0) -> None:
        if self.failed is not None:
            self.run(ins, data, outs, list(sizes), device, seed)
            return
        key = (tuple(sizes), tuple((tuple(t.shape), t.dtype) for t in ins), tuple(tuple(o.shape) for o in outs))
        entry = self.graphs.get(key)
        if entry is None:
            self.run(ins, data, outs, list(sizes), device, seed)  # this call's results; kernels compiled and loaded
            self._capture(key, ins, data, outs, sizes, device)
            return
        self.graphs.move_to_end(key)
        graph, static_ins, static_outs = entry
        for s, t in zip(static_ins, ins):
            s.copy_(t)
        graph.replay()
        for o, s in zip(outs, static_outs):
            o.copy_(s)

    def _capture(self, key: tuple, ins: list, data: list, outs: list, sizes: Sequence[int], device: str) -> None:
        torch = self.torch
        static_ins = [torch.empty_like(t) for t in ins]
        static_outs = [torch.empty_like(o) for o in outs]
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: a Feeder thread's copies on another stream may run while this thread captures
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self.run(static_ins, data, static_outs, list(sizes), device, 0)
        except Exception as e:  # the program runs uncaptured from now on
            self.failed = f"{type(e).__name__}: {e}"
            self.graphs.clear()
            log.warning("backend 'triton': CUDA graph capture failed (%s); this program runs without graphs",
                        self.failed)
            return
        self.captures += 1
        self.graphs[key] = (graph, static_ins, static_outs)
        while len(self.graphs) > self.keep:
            self.graphs.popitem(last=False)

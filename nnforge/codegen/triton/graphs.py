"""A Triton program's launches captured in a CUDA graph per run-time sizes, and replayed (opt-in).

A loop the schedule cannot make one persistent kernel is a host loop: Python launches the body's kernels every step,
and on an H200 that cost 19–40 µs per step whatever the work (docs/benchmarks.md, "The GPU backend"). A CUDA graph
replays the same launches from the driver in one call. ``CudaGraphs`` wraps a generated module's ``run``: the first
call at given sizes runs it as usual (compiling and loading its kernels) and then captures it into a graph whose
inputs and outputs are tensors the graph owns; later calls at those sizes copy the inputs in, replay, and copy the
outputs out (device-to-device copies, on the caller's stream). A new sequence length is a new capture, not a new
compile; the ``keep`` most recently used graphs are kept (each holds its scratch memory). A capture that fails
(something in the program that a graph cannot hold) is logged once and the program runs uncaptured from then on.

Not captured: programs that draw random numbers (a graph would freeze their seed). Turned on by
``NNFORGE_CUDA_GRAPHS=1`` or ``TritonBackend(cuda_graphs=True)``; whether it becomes the default is a measurement
on a GPU (``bench/lstm_gpu.py`` times both), not yet made.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger("nnforge.codegen")

KEEP = 4  # graphs kept per program (by run-time sizes), least recently used dropped first

Run = Callable[[list, list, list, list, str, int], None]  # a generated module's run(ins, data, outs, S, dev, seed)


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

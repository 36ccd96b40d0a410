"""The executable form of a compiled graph: a loaded shared object plus the Python glue that reads sizes from
the inputs, allocates the outputs and calls ``nf_main`` (which releases the GIL for the whole program)."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Mapping, Sequence

import numpy as np

from ...errors import NNForgeError
from ...ir.dims import Dim, substitute
from ...ir.node import Graph
from .cexpr import Sizes
from .recycle import OutputPool


class CProgram:
    """Callable on a list of arrays; the same object serves every trip count (``sizes_at_runtime``)."""

    sizes_at_runtime = True

    def __init__(self, graph: Graph, lib: ctypes.CDLL, key: str, sizes: Sizes, data: Sequence[np.ndarray],
                 listing: object = None):
        self.graph = graph
        self.lib = lib
        self.key = key
        self.sizes = sizes
        self.data = [np.ascontiguousarray(d) for d in data]
        self.listing = listing
        self._fn = lib.nf_main
        self._fn.restype = None
        self._fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
        self._ws_bytes = lib.nf_workspace
        self._ws_bytes.restype = ctypes.c_int64
        self._ws_bytes.argtypes = [ctypes.c_void_p]
        self._ws = np.empty(0, np.uint8)  # scratch reused across calls: its pages stay mapped
        self._ws_lock = threading.Lock()  # a concurrent call (nf_main runs without the GIL) gets its own
        self.outputs = OutputPool(keep=2 * len(graph.outputs))  # results the caller dropped are reused

    def workspace_bytes(self, env: Mapping[str, int] | None = None) -> int:
        """Scratch bytes one call needs at the run-time sizes ``env`` (symbol -> size; missing ones are 0)."""
        env = env or {}
        sizes = np.array([int(env.get(name, 0)) for name in self.sizes.dynamic] or [0], dtype=np.int64)
        return int(self._ws_bytes(sizes.ctypes.data))

    def _env(self, arrays: Sequence[np.ndarray]) -> dict[str, int]:
        env: dict[str, int] = {}
        for n, a in zip(self.graph.inputs, arrays):
            for d, actual in zip(n.shape, a.shape):
                if (isinstance(d, Dim) and d.expr[0] == "sym" and d.expr[1] in self.sizes.slot
                        and env.setdefault(d.expr[1], int(actual)) != int(actual)):
                    raise NNForgeError(f"inputs disagree on size {d.expr[1]}: {env[d.expr[1]]} vs {actual}")
        for name in self.sizes.dynamic:
            env.setdefault(name, 0)
        return env

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        g = self.graph
        if len(inputs) != len(g.inputs):
            raise NNForgeError(f"program takes {len(g.inputs)} inputs, got {len(inputs)}")
        arrays = [np.ascontiguousarray(a, dtype=n.dtype.np) for n, a in zip(g.inputs, inputs)]
        env = self._env(arrays)
        for n, a in zip(g.inputs, arrays):
            want = tuple(int(d) for d in substitute(tuple(n.shape), env))
            if tuple(a.shape) != want:
                raise NNForgeError(f"input {n.attrs.get('name')!r} has shape {list(a.shape)}, expected {list(want)}")
        outs = [self.outputs.empty(tuple(int(d) for d in substitute(tuple(o.shape), env)), o.dtype.np)
                for o in g.outputs]
        sizes = np.array([env[name] for name in self.sizes.dynamic] or [0], dtype=np.int64)
        need = int(self._ws_bytes(sizes.ctypes.data)) + 64
        owned = self._ws_lock.acquire(blocking=False)
        try:
            if owned and self._ws.size < need:
                self._ws = np.empty(need, np.uint8)
            ws = self._ws if owned else np.empty(need, np.uint8)
            base = ws.ctypes.data + (-ws.ctypes.data) % 64
            ptrs = (ctypes.c_void_p * (len(arrays) + len(self.data) + len(outs) + 1))(
                *[a.ctypes.data for a in (*arrays, *self.data, *outs)], base)
            self._fn(ptrs, sizes.ctypes.data)
        finally:
            if owned:
                self._ws_lock.release()
        return outs

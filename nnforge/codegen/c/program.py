"""The executable form of a compiled graph: a loaded shared object plus the Python glue that reads sizes from
the inputs, allocates the outputs and calls ``nf_main`` (which releases the GIL for the whole program)."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Mapping, Sequence

import numpy as np

from ...errors import NNForgeError
from ...ir.dims import free_symbols, substitute, symbol_name
from ...ir.node import Graph
from .cexpr import Sizes
from .recycle import OutputPool


class CProgram:
    """Callable on a list of arrays; the same object serves every trip count (``sizes_at_runtime``)."""

    sizes_at_runtime = True

    def __init__(self, graph: Graph, lib: ctypes.CDLL, key: str, sizes: Sizes, data: Sequence[np.ndarray],
                 listing: object = None, source: str = ""):
        self.graph = graph
        self.lib = lib
        self.key = key
        self.source = source  # the generated C (saved with the binary: a program can be rebuilt elsewhere)
        self.sizes = sizes
        self.data = [np.asarray(d, order="C") for d in data]
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
        # Per-call Python work kept small (it is the whole cost of a short call, and its allocations drive the
        # cyclic GC): shapes are planned once, data pointers read once.
        known = set(sizes.slot) | set(sizes.dynamic)  # the names every call's size environment has
        self._in_plans = [_plan(n.shape, known) for n in graph.inputs]
        self._out_plans = [(_plan(o.shape, known), o.dtype.np) for o in graph.outputs]
        self._in_dtypes = [n.dtype.np for n in graph.inputs]
        self._sym_slots = [[(axis, x) for axis, x in enumerate(plan) if type(x) is str and x in sizes.slot]
                           for plan in self._in_plans]  # the axes that set a run-time size
        self._data_ptrs = [d.ctypes.data for d in self.data]

    def library_bytes(self) -> bytes:
        """The shared object this program runs (read back from the cache, checked against its recorded hash)."""
        from .toolchain import library_bytes

        return library_bytes(self.key)

    def workspace_bytes(self, env: Mapping[str, int] | None = None) -> int:
        """Scratch bytes one call needs at the run-time sizes ``env`` (symbol -> size; missing ones are 0)."""
        env = env or {}
        sizes = np.array([int(env.get(name, 0)) for name in self.sizes.dynamic] or [0], dtype=np.int64)
        return int(self._ws_bytes(sizes.ctypes.data))

    def _env(self, arrays: Sequence[np.ndarray]) -> dict[str, int]:
        env: dict[str, int] = {}
        for slots, a in zip(self._sym_slots, arrays):
            for axis, name in slots:
                actual = a.shape[axis]
                if env.setdefault(name, actual) != actual:
                    raise NNForgeError(f"inputs disagree on size {name}: {env[name]} vs {actual}")
        for name in self.sizes.dynamic:
            env.setdefault(name, 0)
        return env

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        g = self.graph
        if len(inputs) != len(g.inputs):
            raise NNForgeError(f"program takes {len(g.inputs)} inputs, got {len(inputs)}")
        # np.asarray(order="C"), not np.ascontiguousarray: that one turns a 0-d input (an optimizer's step counter)
        # into shape [1]
        arrays = [np.asarray(a, dtype=dt, order="C") for dt, a in zip(self._in_dtypes, inputs)]
        env = self._env(arrays)
        for n, plan, a in zip(g.inputs, self._in_plans, arrays):
            want = _shape(plan, env)
            if a.shape != want:
                raise NNForgeError(f"input {n.attrs.get('name')!r} has shape {list(a.shape)}, expected {list(want)}")
        outs = [self.outputs.empty(_shape(plan, env), dt) for plan, dt in self._out_plans]
        sizes = np.array([env[name] for name in self.sizes.dynamic] or [0], dtype=np.int64)
        need = int(self._ws_bytes(sizes.ctypes.data)) + 64
        owned = self._ws_lock.acquire(blocking=False)
        try:
            if owned and self._ws.size < need:
                self._ws = np.empty(need, np.uint8)
            ws = self._ws if owned else np.empty(need, np.uint8)
            base = ws.ctypes.data + (-ws.ctypes.data) % 64
            ptrs = (ctypes.c_void_p * (len(arrays) + len(self.data) + len(outs) + 1))(
                *[a.ctypes.data for a in arrays], *self._data_ptrs, *[o.ctypes.data for o in outs], base)
            self._fn(ptrs, sizes.ctypes.data)
        finally:
            if owned:
                self._ws_lock.release()
        return outs


def _plan(shape: Sequence[object], known: set[str]) -> tuple:
    """A shape as ints (sizes fixed for this program) and the names of sizes given per call; a ``Dim`` that is an
    expression of those (T * N) stays itself and is evaluated per call."""
    return tuple(int(substitute(d, {})) if not free_symbols(d) & known else symbol_name(d) or d for d in shape)


def _shape(plan: tuple, env: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(x if type(x) is int else env[x] if type(x) is str else int(substitute((x,), env)[0])
                 for x in plan)

"""The backend-neutral half of an executable program: the Python glue every compiled backend needs around its
kernels, so a backend writes only the hook that sizes its scratch memory and launches its code.

It reads the run-time sizes from the inputs' shapes and checks the inputs against shapes planned once from the
graph (once per run of calls with the same shapes: what they decide is kept), takes the outputs from a recycling
pool and lends the launch a workspace reused across calls. This is the whole cost of a short call and its
allocations drive the cyclic GC, so it stays small: no per-call dicts or lists beyond the arrays and the outputs.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import NNForgeError
from ..ir.dims import free_symbols, substitute, symbol_name
from ..ir.node import Graph
from .recycle import OutputPool, aligned_bytes


class CompiledProgram(ABC):
    """Callable on a list of arrays; the same object serves every value of the run-time sizes
    (``sizes_at_runtime``).

    A backend subclasses it and provides ``workspace_need(sizes)`` and ``launch(inputs, outputs, workspace,
    sizes)``; ``sizes`` is what ``pack_sizes`` makes of the run-time sizes in ``dynamic`` order (a list of ints
    unless the backend wants another form, such as an array its code reads)."""

    sizes_at_runtime = True

    def __init__(self, graph: Graph, dynamic: Sequence[str]):
        self.graph = graph
        self.dynamic = list(dynamic)  # the run-time size symbols, in the order the backend's code takes them
        self.outputs = OutputPool(keep=2 * len(graph.outputs))  # results the caller dropped are reused
        self._ws = self.new_workspace(0)  # scratch reused across calls: its pages stay mapped
        self._ws_lock = threading.Lock()  # a concurrent call (launches run without the GIL) gets its own
        known = set(self.dynamic)
        self._in_plans = [_plan(n.shape, known) for n in graph.inputs]
        self._out_plans = [(_plan(o.shape, known), o.dtype.np) for o in graph.outputs]
        self._in_dtypes = [n.dtype.np for n in graph.inputs]
        self._sym_slots = [[(axis, x) for axis, x in enumerate(plan) if type(x) is str]
                           for plan in self._in_plans]  # the axes that set a run-time size
        self._last: tuple | None = None  # (input shapes, output shapes and dtypes, sizes, workspace bytes)

    # The backend's hook.

    def pack_sizes(self, values: list[int]) -> object:
        """The run-time sizes (in ``dynamic`` order) in the form ``workspace_need`` and ``launch`` take."""
        return values

    @abstractmethod
    def workspace_need(self, sizes: object) -> int:
        """Scratch bytes one call needs at ``sizes`` (from ``pack_sizes``)."""

    @abstractmethod
    def launch(self, inputs: list[np.ndarray], outputs: list[np.ndarray], workspace: np.ndarray,
               sizes: object) -> None:
        """Run the program: read ``inputs`` (checked, C-contiguous), fill ``outputs`` (uninitialized), use at
        least ``workspace_need(sizes)`` bytes of ``workspace`` (64-byte aligned when not empty) as scratch.
        ``sizes`` serves every call of the same input shapes (made once by ``pack_sizes``): read it, never write it."""

    @staticmethod
    def call_seed() -> int:
        """A fresh seed for one call of a program that draws random numbers, from the session's generator (the
        interpreter's source too): ``nf.manual_seed`` makes a run repeat on every backend."""
        from ..trace import session

        return int(session().rng.integers(0, 2**63))

    def new_workspace(self, nbytes: int) -> np.ndarray:
        """Scratch memory of ``nbytes`` (host bytes; a backend whose code runs elsewhere allocates there, from
        state its ``__init__`` sets before calling this one's)."""
        return aligned_bytes(nbytes)

    # The call path.

    def workspace_bytes(self, env: Mapping[str, int] | None = None) -> int:
        """Scratch bytes one call needs at the run-time sizes ``env`` (symbol -> size; missing ones are 0)."""
        env = env or {}
        return int(self.workspace_need(self.pack_sizes([int(env.get(name, 0)) for name in self.dynamic])))

    def _env(self, arrays: Sequence[Any]) -> dict[str, int]:
        env: dict[str, int] = {}
        for slots, a in zip(self._sym_slots, arrays):
            for axis, name in slots:
                actual = a.shape[axis]
                if env.setdefault(name, actual) != actual:
                    raise NNForgeError(f"inputs disagree on size {name}: {env[name]} vs {actual}")
        for name in self.dynamic:
            env.setdefault(name, 0)
        return env

    def checked_sizes(self, arrays: Sequence[Any]) -> dict[str, int]:
        """The run-time sizes read off the inputs' shapes (numpy arrays or tensors), every input's shape checked
        against its plan."""
        env = self._env(arrays)
        for n, plan, a in zip(self.graph.inputs, self._in_plans, arrays):
            want = _shape(plan, env)
            if tuple(a.shape) != want:
                raise NNForgeError(f"input {n.attrs.get('name')!r} has shape {list(a.shape)}, expected {list(want)}")
        return env

    def output_shapes(self, env: Mapping[str, int]) -> list[tuple[int, ...]]:
        return [_shape(plan, env) for plan, _ in self._out_plans]

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        g = self.graph
        if len(inputs) != len(g.inputs):
            raise NNForgeError(f"program takes {len(g.inputs)} inputs, got {len(inputs)}")
        # np.asarray(order="C"), not np.ascontiguousarray: that one turns a 0-d input (an optimizer's step counter)
        # into shape [1]
        arrays = [np.asarray(a, dtype=dt, order="C") for dt, a in zip(self._in_dtypes, inputs)]
        shapes = tuple(a.shape for a in arrays)
        last = self._last
        if last is None or last[0] != shapes:  # what the shapes decide, worked out once for a run of equal calls
            env = self.checked_sizes(arrays)
            sizes = self.pack_sizes([env[name] for name in self.dynamic])
            last = self._last = (shapes, [(_shape(plan, env), dt) for plan, dt in self._out_plans], sizes,
                                 self.workspace_need(sizes))
        _, out_specs, sizes, need = last
        outs = [self.outputs.empty(shape, dt) for shape, dt in out_specs]
        if not self._ws_lock.acquire(blocking=False):  # another call is running on the held workspace
            self.launch(arrays, outs, self.new_workspace(need), sizes)
            return outs
        try:
            if len(self._ws) < need:
                self._ws = self.new_workspace(need)
            self.launch(arrays, outs, self._ws, sizes)
        finally:
            self._ws_lock.release()
        return outs


def _plan(shape: Sequence[object], known: set[str]) -> tuple:
    """A shape as ints (sizes fixed for this program) and the names of sizes given per call; a ``Dim`` that is an
    expression of those (T * N) stays itself and is evaluated per call."""
    return tuple(int(substitute(d, {})) if not free_symbols(d) & known else symbol_name(d) or d for d in shape)


def _shape(plan: tuple, env: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(x if type(x) is int else env[x] if type(x) is str else int(substitute((x,), env)[0])
                 for x in plan)

"""The executable form of a compiled graph for the CPU: a loaded shared object, sized by ``nf_workspace`` and run
by ``nf_main`` (which releases the GIL for the whole program); the call path around it is
``runtime.program.CompiledProgram``."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import numpy as np

from ...ir.node import Graph
from ...runtime.program import CompiledProgram
from .cexpr import Sizes


class CProgram(CompiledProgram):
    """Callable on a list of arrays; the same object serves every trip count (``sizes_at_runtime``)."""

    def __init__(self, graph: Graph, lib: ctypes.CDLL, key: str, sizes: Sizes, data: Sequence[np.ndarray],
                 listing: object = None, source: str = ""):
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
        # nf_main's pointer array: inputs, constant data (pointers read once), outputs, workspace
        self._ptrs = ctypes.c_void_p * (len(graph.inputs) + len(self.data) + len(graph.outputs) + 1)
        self._data_ptrs = [d.ctypes.data for d in self.data]
        super().__init__(graph, sizes.dynamic)

    def library_bytes(self) -> bytes:
        """The shared object this program runs (read back from the cache, checked against its recorded hash)."""
        from .toolchain import library_bytes

        return library_bytes(self.key)

    def pack_sizes(self, values: list[int]) -> np.ndarray:
        """The size array ``nf_workspace`` and ``nf_main`` read (one entry at least: never a null pointer); a
        program that draws random numbers has one more entry, its seed, drawn anew by every ``launch``."""
        return np.array([*values, *([0] * self.sizes.seeded)] or [0], dtype=np.int64)

    def workspace_need(self, sizes: np.ndarray) -> int:
        return self._ws_bytes(sizes.ctypes.data)

    def launch(self, inputs: list[np.ndarray], outputs: list[np.ndarray], workspace: np.ndarray,
               sizes: np.ndarray) -> None:
        if self.sizes.seeded:  # a copy: ``sizes`` serves every call of these shapes, some maybe on other threads
            sizes = sizes.copy()
            sizes[len(self.sizes.dynamic)] = self.call_seed()
        self._fn(self._ptrs(*[a.ctypes.data for a in inputs], *self._data_ptrs, *[o.ctypes.data for o in outputs],
                            workspace.ctypes.data), sizes.ctypes.data)

"""Code generation: one builder per backend, turning an optimized graph into a callable program."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..ir.node import Graph


def _reference(graph: Graph) -> Callable[[Sequence[np.ndarray]], list[np.ndarray]]:
    from .reference import ReferenceProgram

    return ReferenceProgram(graph)


def _cpu_backend() -> Callable[[Graph], Callable]:
    from .c import CpuBackend

    return CpuBackend()


def _triton_backend() -> Callable[[Graph], Callable]:
    from .triton import TritonBackend

    return TritonBackend()


BACKENDS: dict[str, Callable[[Graph], Callable]] = {"reference": _reference, "cpu": _cpu_backend(),
                                                    "triton": _triton_backend()}


def build_program(backend: str, graph: Graph) -> Callable[[Sequence[np.ndarray]], list[np.ndarray]]:
    """``graph`` made executable by ``backend``; an ``nf.loop`` calling Feeders or Receivers runs its steps as
    the backend's code, the rest of its graph on the interpreter (``streamed``)."""
    if backend != "reference":
        from .streamed import StreamedProgram, streamed_loops

        if streamed_loops(graph):
            return StreamedProgram(graph, BACKENDS[backend], backend)
    return BACKENDS[backend](graph)


def available_backends() -> list[str]:
    """Backends that can run on this machine ("cpu" only where a C compiler with OpenMP works, "triton" where
    Triton imports and a CUDA device or its interpreter, ``TRITON_INTERPRET=1``, can run kernels)."""
    return sorted(name for name, b in BACKENDS.items() if getattr(b, "available", True))

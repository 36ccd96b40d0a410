"""Code generation: one builder per backend, turning an optimized graph into a callable program."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

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


def backend_with(backend: str, options: Mapping[str, Any] | None) -> Callable[[Graph], Callable]:
    """The builder of ``backend`` with ``options``: the shared one without options; with them, a builder of its
    own, made from the options its class names (``OPTIONS``: the Triton backend's ``cuda_graphs`` and ``tiles``).
    Others raise ``ValueError`` naming the ones the backend takes."""
    shared = BACKENDS[backend]
    if not options:
        return shared
    allowed = getattr(type(shared), "OPTIONS", ())
    if not allowed:
        raise ValueError(f"backend {backend!r} takes no options (got {', '.join(sorted(options))})")
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"backend {backend!r} takes the options {', '.join(allowed)}; got {', '.join(unknown)}")
    return type(shared)(**options)


Program = Callable[[Sequence[np.ndarray]], list[np.ndarray]]


def build_program(backend: str, graph: Graph, builder: Callable[[Graph], Callable] | None = None) -> Program:
    """``graph`` made executable by ``backend`` (by ``builder``, its builder with options, where given); an
    ``nf.loop`` calling Feeders or Receivers runs its steps as the backend's code, the rest of its graph on the
    interpreter (``streamed``)."""
    build = builder or BACKENDS[backend]
    if backend != "reference":
        from .streamed import StreamedProgram, streamed_loops

        if streamed_loops(graph):
            return StreamedProgram(graph, build, backend)
    return build(graph)


def available_backends() -> list[str]:
    """Backends that can run on this machine ("cpu" only where a C compiler with OpenMP works, "triton" where
    Triton imports and a CUDA device or its interpreter, ``TRITON_INTERPRET=1``, can run kernels)."""
    return sorted(name for name, b in BACKENDS.items() if getattr(b, "available", True))

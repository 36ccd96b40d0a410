"""Code generation: one builder per backend, turning an optimized graph into a callable program."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..ir.node import Graph
from ..trace import session


def _reference(graph: Graph) -> Callable[[Sequence[np.ndarray]], list[np.ndarray]]:
    from .reference import ReferenceProgram

    return ReferenceProgram(graph, session().rng)


BACKENDS: dict[str, Callable[[Graph], Callable]] = {"reference": _reference}


def build_program(backend: str, graph: Graph) -> Callable[[Sequence[np.ndarray]], list[np.ndarray]]:
    return BACKENDS[backend](graph)


def available_backends() -> list[str]:
    """Backends that can run on this machine."""
    return sorted(BACKENDS)

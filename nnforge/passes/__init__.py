"""Optimizing passes: each a named pure function Graph -> Graph, run in the order of ``PIPELINE``."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..ir.node import Graph
from ..ir.verify import verify
from .dce import dce
from .scans import merge_augmented_scans

Pass = Callable[[Graph], Graph]

PIPELINE: tuple[tuple[str, Pass], ...] = (
    ("merge_augmented_scans", merge_augmented_scans),
    ("dce", dce),
)


CPU_PIPELINE: tuple[tuple[str, Pass], ...] = (
    ("dce", dce),
)
"""Passes that only matter for compiled code (they may reassociate float sums), run by the CPU backend."""


def run_pipeline(graph: Graph, passes: Sequence[tuple[str, Pass]] = PIPELINE, check: bool = True) -> Graph:
    """Apply the passes in order; verify after each one so a broken pass is caught where it broke."""
    for _name, p in passes:
        graph = p(graph)
        if check:
            verify(graph)
    return graph

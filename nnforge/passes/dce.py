"""Dead-code elimination."""

from __future__ import annotations

from ..ir.node import Graph


def dce(graph: Graph) -> Graph:
    """Drop nodes no output or effect reads. Graph.order already walks from the roots, so a fresh Graph is it."""
    return Graph(graph.inputs, graph.outputs, graph.effects)

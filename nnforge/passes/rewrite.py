"""Graph rewriting helpers shared by the passes: substitution and rebuilding in topological order."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..ir.build import rebuild
from ..ir.node import Graph, Node


def substitute(graph: Graph, mapping: Mapping[int, Node], attrs_fn: Callable[[Node], dict | None] | None = None,
               types_fn: Callable[[Node], tuple | None] | None = None) -> Graph:
    """A copy of ``graph`` with nodes replaced per ``mapping`` (id -> node) and users rebuilt.

    ``attrs_fn``/``types_fn`` may return new attrs/types for any node (None keeps them); inputs are rebuilt too
    when they change.
    """
    new: dict[int, Node] = dict(mapping)
    for n in graph.order:
        if id(n) in new:
            continue
        srcs = tuple(new.get(id(s), s) for s in n.srcs)
        attrs = attrs_fn(n) if attrs_fn else None
        types = types_fn(n) if types_fn else None
        if srcs == n.srcs and attrs is None and types is None:
            new[id(n)] = n
        else:
            new[id(n)] = rebuild(n, srcs, attrs, types)
    return Graph([new.get(id(i), i) for i in graph.inputs], [new[id(o)] for o in graph.outputs],
                 [new[id(e)] for e in graph.effects])

"""Re-specialize a traced graph to new sizes without calling the Python function again."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..ir.build import make
from ..ir.dims import expressed, substitute
from ..ir.node import Graph, Node
from ..ir.ops import Op
from .rewrite import substitute as rewrite


def specialize(graph: Graph, env: Mapping[str, int]) -> Graph:
    """Every symbolic size re-evaluated under ``env``; shape rules re-run, so an inconsistency raises."""
    return _resized(graph, lambda v: substitute(v, env))


def unify_sizes(graph: Graph, sizes: Mapping[str, int]) -> Graph:
    """Sizes that must be equal written as one: each symbol of ``sizes`` replaced by the size it names (the
    lengths of the sequences one scan walks, so that a program checks them against each other)."""
    return _resized(graph, lambda v: expressed(v, sizes))


def _resized(graph: Graph, size: Callable[[object], object]) -> Graph:
    """``graph`` with ``size`` applied to every size of its inputs, attributes, loop bodies and result types."""
    bodies: dict[int, Graph] = {}

    def attrs(n: Node) -> dict | None:
        out = {}
        for k, v in n.attrs.items():
            if isinstance(v, Graph):
                if id(v) not in bodies:
                    bodies[id(v)] = _resized(v, size)
                out[k] = bodies[id(v)]
            else:
                out[k] = size(v)
        return out

    def types(n: Node) -> tuple | None:
        return None if n.types is None else tuple((size(s), d) for s, d in n.types)

    inputs = {id(i): make(Op.INPUT, (), {**i.attrs, "shape": size(i.attrs["shape"])}, loc=i.loc)
              for i in graph.inputs}
    return rewrite(graph, inputs, attrs_fn=attrs, types_fn=types)

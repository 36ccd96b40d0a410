"""Re-specialize a traced graph to new sizes without calling the Python function again."""

from __future__ import annotations

from collections.abc import Mapping

from ..ir.build import make
from ..ir.dims import substitute
from ..ir.node import Graph, Node
from ..ir.ops import Op
from .rewrite import substitute as rewrite


def specialize(graph: Graph, env: Mapping[str, int]) -> Graph:
    """Every symbolic size re-evaluated under ``env``; shape rules re-run, so an inconsistency raises."""
    bodies: dict[int, Graph] = {}

    def attrs(n: Node) -> dict | None:
        out = {}
        for k, v in n.attrs.items():
            if isinstance(v, Graph):
                if id(v) not in bodies:
                    bodies[id(v)] = specialize(v, env)
                out[k] = bodies[id(v)]
            else:
                out[k] = substitute(v, env)
        return out

    def types(n: Node) -> tuple | None:
        return None if n.types is None else tuple((substitute(s, env), d) for s, d in n.types)

    inputs = {id(i): _input(i, env) for i in graph.inputs}
    return rewrite(graph, inputs, attrs_fn=attrs, types_fn=types)


def _input(n: Node, env: Mapping[str, int]) -> Node:
    return make(Op.INPUT, (), {**n.attrs, "shape": substitute(n.attrs["shape"], env)}, loc=n.loc)

"""Common-subexpression elimination: one node per (op, sources, attributes), bodies included.

Random numbers and feeders are never merged (two draws are two values); constant arrays merge only when they
are the same array object.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ir.build import rebuild
from ..ir.dims import Dim
from ..ir.node import Graph, Node
from ..ir.ops import EFFECTFUL, Op


def _key_attr(v: Any) -> Any:
    if isinstance(v, (np.ndarray, Graph)) or callable(v):
        return ("id", id(v))
    if isinstance(v, (tuple, list)):
        return tuple(_key_attr(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _key_attr(x)) for k, x in v.items()))
    if isinstance(v, Dim):
        return ("dim", v.expr)  # equal now is not equal at every length: compare the recipes
    if isinstance(v, float) and v != v:
        return ("nan",)
    return (type(v).__name__, v)


def _key(n: Node, canon: dict[int, Node]) -> tuple | None:
    if n.op in EFFECTFUL or n.op in (Op.INPUT, Op.FEEDER, Op.RECEIVER):
        return None
    attrs = tuple(sorted((k, _key_attr(v)) for k, v in n.attrs.items()))
    return (n.op, tuple(id(canon.get(id(s), s)) for s in n.srcs), attrs, n.types is not None)


def cse(graph: Graph) -> Graph:
    """Merge structurally equal nodes; every scan/loop body gets the same treatment."""
    seen: dict[tuple, Node] = {}
    canon: dict[int, Node] = {}
    new: dict[int, Node] = {}
    changed = False
    for n in graph.order:
        k = _key(n, canon)
        if k is not None and k in seen:
            canon[id(n)] = seen[k]
            new[id(n)] = new[id(seen[k])]
            changed = True
            continue
        if k is not None:
            seen[k] = n
        srcs = tuple(new.get(id(s), s) for s in n.srcs)
        body = n.attrs.get("body")
        attrs = None
        if isinstance(body, Graph):
            nb = cse(body)
            attrs = None if nb is body else {**n.attrs, "body": nb}
        new[id(n)] = n if srcs == n.srcs and attrs is None else rebuild(n, srcs, attrs)
        changed |= new[id(n)] is not n
    if not changed:
        return graph
    return Graph([new.get(id(i), i) for i in graph.inputs], [new[id(o)] for o in graph.outputs],
                 [new[id(e)] for e in graph.effects])

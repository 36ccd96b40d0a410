"""The verifier: checks that a graph is well formed after every pass (types re-inferred, bodies consistent)."""

from __future__ import annotations

from ..errors import NNForgeError
from .node import Graph, Node
from .ops import Op
from .registry import SHAPE_RULES


class VerifyError(NNForgeError):
    """A graph that breaks an IR invariant: a bug in a pass or in nnforge, never the user's fault."""


def verify(graph: Graph, checked: dict[int, Node] | None = None) -> None:
    """Raise VerifyError naming the first node whose recorded type disagrees with its rule, or a bad body.

    ``checked``: nodes verified before (by id, held so ids stay theirs), skipped: nodes never change, so after a
    pass only the nodes it made need checking (a pipeline shares one dict: most passes rewrite a few nodes).
    """
    inputs = {id(n) for n in graph.inputs}
    for n in graph.order:
        if n.op == Op.INPUT and id(n) not in inputs:
            raise VerifyError(f"placeholder {n.attrs.get('name')!r} is not an input of its graph (created at {n.loc})")
        if checked is not None:
            if id(n) in checked:
                continue
            checked[id(n)] = n
        shape, dtype = SHAPE_RULES[n.op](n.op, n.srcs, n.attrs)
        if n.types is None and (tuple(map(int, shape)) != tuple(map(int, n.shape)) or dtype != n.dtype):
            raise VerifyError(f"{n.op.name.lower()} records {n.shape} {n.dtype} but its rule gives {shape} {dtype}")
        if n.op in (Op.SCAN, Op.LOOP):
            body: Graph = n.attrs["body"]
            verify(body, checked)
            n_in = len(body.inputs) - (1 if n.attrs.get("with_index") else 0)
            if n_in != len(n.srcs):
                raise VerifyError(f"{n.op.name.lower()} has {len(n.srcs)} sources but its body takes {n_in} inputs")

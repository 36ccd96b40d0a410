"""Transposed weights enter a scan as views, not copies.

A cell written ``h @ w_hh.T`` traces the transpose outside the body, so the scan reads ``permute(w_hh)`` as a
loop invariant, and a loop source has to be a buffer: the C backend materialized the transpose every call (4 MB
read down its columns at H = 512) and then packed the copy into GEMM panels. Moved into the body, the permute is
an index expression of the matmul's right operand, and the panels are packed straight from ``w_hh`` (the packing
reads any strides), once per call as before.

Only inputs that the body uses solely as a matmul's right operand are moved: those are packed anyway, while a
view read element by element would change how the row split (``passes.rows``) sees the body. Runs after
``hoist``, which would lift a view of an invariant back out of the loop.
"""

from __future__ import annotations

from ..ir.build import make
from ..ir.node import Graph, Node, users
from ..ir.ops import Op
from .rewrite import map_nodes, substitute


def _only_right_operand(p: Node, us: dict[int, list[Node]]) -> bool:
    readers = us.get(id(p), [])
    return bool(readers) and all(u.op == Op.MATMUL and u.srcs[1] is p and u.srcs[0] is not p for u in readers)


def _sink(n: Node) -> Node | None:
    if n.op != Op.SCAN:
        return None
    a = n.attrs
    body: Graph = a["body"]
    first = a["n_carry"] + a["n_xs"]
    us = users(body.order)
    moved = [k for k in range(first, len(n.srcs))
             if n.srcs[k].op == Op.PERMUTE and _only_right_operand(body.inputs[k], us)
             and id(body.inputs[k]) not in {id(o) for o in body.outputs}]
    if not moved:
        return None
    srcs, inputs, mapping = list(n.srcs), list(body.inputs), {}
    for k in moved:
        view, old = n.srcs[k], body.inputs[k]
        base = view.srcs[0]
        new_in = make(Op.INPUT, (), {**old.attrs, "shape": tuple(base.shape), "dtype": base.dtype}, loc=old.loc)
        mapping[id(old)] = make(Op.PERMUTE, (new_in,), dict(view.attrs), loc=view.loc)
        srcs[k], inputs[k] = base, new_in
    inner = substitute(Graph(body.inputs, body.outputs, body.effects), mapping)
    new_body = Graph(inputs, inner.outputs, inner.effects)
    return make(Op.SCAN, tuple(srcs), {**a, "body": new_body}, n.types, loc=n.loc)


def views_into_scans(graph: Graph) -> Graph:
    """Every scan (nested ones included) reads a transposed weight through a view of the weight itself."""
    return map_nodes(graph, _sink)

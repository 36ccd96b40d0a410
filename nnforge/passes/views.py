"""Transposed weights enter a scan as views, not copies.

A cell written ``h @ w_hh.T`` traces the transpose outside the body, so the scan reads ``permute(w_hh)`` as a
loop invariant, and a loop source has to be a buffer: the C backend materialized the transpose every call (4 MB
read down its columns at H = 512) and then packed the copy into GEMM panels. Moved into the body, the permute is
an index expression of the matmul's right operand, and the panels are packed straight from ``w_hh`` (the packing
reads any strides), once per call as before.

Only inputs that the body uses solely as a matmul's right operand are moved: those are packed anyway, while a
view read element by element would change how the row split (``passes.rows``) sees the body. The exception is
a broadcast of one row (``b`` of ``h @ W + b``, traced as ``expand(reshape(b))`` outside the body), which the row
split reads like a constant: moved in, kernels read ``b`` itself, where a loop source had to be materialized as
an ``[N, G]`` array. Runs after ``hoist``, which would lift a view of an invariant back out of the loop.
"""

from __future__ import annotations

from ..ir.build import make
from ..ir.node import Graph, Node, users
from ..ir.ops import Op
from .rewrite import map_nodes, rewire_scan
from .rows import one_row_broadcast


def _only_right_operand(p: Node, us: dict[int, list[Node]]) -> bool:
    readers = us.get(id(p), [])
    return bool(readers) and all(u.op == Op.MATMUL and u.srcs[1] is p and u.srcs[0] is not p for u in readers)


def _sink(n: Node) -> Node | None:
    if n.op != Op.SCAN:
        return None
    body: Graph = n.attrs["body"]
    us = users(body.order)
    outs = {id(o) for o in body.outputs}
    changes = {}
    for k in range(n.attrs["n_carry"] + n.attrs["n_xs"], len(n.srcs)):
        view, old = n.srcs[k], body.inputs[k]
        if id(old) in outs:
            continue
        if view.op == Op.PERMUTE and _only_right_operand(old, us):
            chain = [view]
        elif one_row_broadcast(view):
            chain = [view, view.srcs[0]] if view.srcs[0].op == Op.RESHAPE else [view]
        else:
            continue
        base = chain[-1].srcs[0]
        new_in = make(Op.INPUT, (), {**old.attrs, "shape": tuple(base.shape), "dtype": base.dtype}, loc=old.loc)
        inner = new_in
        for v in reversed(chain):
            inner = make(v.op, (inner,), dict(v.attrs), loc=v.loc)
        changes[k] = (base, new_in, inner)
    return rewire_scan(n, changes) if changes else None


def views_into_scans(graph: Graph) -> Graph:
    """Every scan (nested ones included) reads a transposed weight, or a broadcast row, through a view of the
    array itself."""
    return map_nodes(graph, _sink)

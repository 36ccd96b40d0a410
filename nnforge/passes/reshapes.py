"""Elementwise work on a matrix's rows before the reshape that splits their leading axis.

A linear layer on a ``[T, N, I]`` input is traced as ``reshape(x2 @ w.T, [T, N, H]) + b``: the product of the
``[T * N, I]`` rows, reshaped back, then the bias and the activation on the reshaped view. A GEMM's epilogue
(``passes.fuse``) and a whole-row kernel led by a GEMM (``schedule.row_programs``) take only elementwise work on
the product's own ``[M, N]`` shape, so the bias add was a kernel of its own: a write and a read of the product.
The reshape only renames the rows (same last axis, row-major), so ``f(reshape(a), b) = reshape(f(a, b'))`` where
each other operand ``b'`` is ``b`` on the ``[M, N]`` rows: another reshape of such rows, a broadcast of one row
(the bias) or of one value, or a constant. Applied bottom-up, a chain of such ops ends in one reshape (a view).
"""

from __future__ import annotations

from ..ir.build import make
from ..ir.node import Graph, Node
from ..ir.ops import ELEMENTWISE, Op
from .rewrite import map_nodes


def _rows_of(s: Node, shape: tuple) -> tuple | None:
    """The ``[M, N]`` shape of the matrix ``s`` reshapes to ``shape`` by splitting its leading axis, if it does."""
    if s.op != Op.RESHAPE or s.srcs[0].ndim != 2 or len(shape) < 3:
        return None
    m, n = s.srcs[0].shape  # the same last axis: the reshape (valid at every size) splits the rows
    return (m, n) if n == shape[-1] and tuple(s.shape) == tuple(shape) else None


def _on_rows(s: Node, rows: tuple, shape: tuple) -> Node | None:
    """Operand ``s`` (of ``shape``) as the same values on the ``rows`` matrix, where that is a view."""
    if _rows_of(s, shape) == rows:
        return s.srcs[0]
    if s.op == Op.CONST:
        return make(Op.CONST, (), {**s.attrs, "shape": rows}, loc=s.loc)
    if s.op == Op.EXPAND:
        one = s.srcs[0]
        if one.ndim == len(shape) and all(int(d) == 1 for d in one.shape[:-1]):
            row = make(Op.RESHAPE, (one,), {"shape": (1, one.shape[-1])}, loc=s.loc)
            return make(Op.EXPAND, (row,), {"shape": rows}, loc=s.loc)
    return None


def _before_reshape(n: Node) -> Node | None:
    if n.op not in ELEMENTWISE or n.ndim < 3:
        return None
    shape = tuple(n.shape)
    rows = next((r for r in (_rows_of(s, shape) for s in n.srcs) if r is not None), None)
    if rows is None:
        return None
    srcs = [_on_rows(s, rows, shape) for s in n.srcs]
    if any(s is None for s in srcs):
        return None
    flat = make(n.op, tuple(srcs), n.attrs, loc=n.loc)  # type: ignore[arg-type]
    return make(Op.RESHAPE, (flat,), {"shape": shape}, loc=n.loc)


def elementwise_before_reshapes(graph: Graph) -> Graph:
    """``graph`` with each elementwise op on a matrix's rows reshaped (their leading axis split) computed on the
    matrix, the reshape after it (bodies included)."""
    return map_nodes(graph, _before_reshape)

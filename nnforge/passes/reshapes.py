"""Elementwise work on a product before the views it is read through: a reshape splitting its rows, one dropping
axes of 1, a permute.

A linear layer on a ``[T, N, I]`` input is traced as ``reshape(x2 @ w.T, [T, N, H]) + b``: the product of the
``[T * N, I]`` rows, reshaped back, then the bias and the activation on the reshaped view. A GEMM's epilogue
(``passes.fuse``) and a whole-row kernel led by a GEMM (``schedule.row_programs``) take only elementwise work on
the product's own ``[M, N]`` shape, so the bias add was a kernel of its own: a write and a read of the product.
The reshape only renames the rows (same last axis, row-major), so ``f(reshape(a), b) = reshape(f(a, b'))`` where
each other operand ``b'`` is ``b`` on the ``[M, N]`` rows: another reshape of such rows, a broadcast of one row
(the bias) or of one value, a constant, or an array that is not itself a view (a residual: reshaped, it is a view
of what the scheduler stores, or indexes work an epilogue inlines); a permuted or sliced operand stays, its rows
reshaped would be a copy. Applied bottom-up, a chain of such ops ends in one reshape (a view).

A reshape that only drops or inserts axes of size 1 is a view of any array, so the same holds for it with every
operand: a convolution's grouped product ``[N, 1, C, L]`` read as ``[N, C, L]`` takes its per-channel bias and
activation on the product's own shape, its GEMM's epilogue.

Work on a permute of a product (or of its rows reshaped) moves before the permute likewise, the other operands
permuted back (a broadcast stays one), the permute after it a view its readers index: a convolution's product
read channels-first takes its bias and swish as its GEMM's epilogue, in the product's own order.

Only work on a product (or on work already moved onto one) moves: elsewhere it would only change shape, and the
pointwise kernel reading it back through the reshape would store it apart.
"""

from __future__ import annotations

from collections.abc import Callable

from ..ir.build import make
from ..ir.dims import Dim, same_product
from ..ir.node import Graph, Node
from ..ir.ops import ELEMENTWISE, MOVEMENT, Op
from .rewrite import map_nodes


def _rows_of(s: Node, shape: tuple) -> tuple | None:
    """The ``[M, N]`` shape of the matrix ``s`` reshapes to ``shape`` by splitting its leading axis, if it does."""
    if s.op != Op.RESHAPE or s.srcs[0].ndim != 2 or len(shape) < 3:
        return None
    m, n = s.srcs[0].shape  # the same last axis: the reshape (valid at every size) splits the rows
    return (m, n) if n == shape[-1] and tuple(s.shape) == tuple(shape) else None


def _on_rows(s: Node, rows: tuple, shape: tuple) -> Node | None:
    """Operand ``s`` (of ``shape``) as the same values on the ``rows`` matrix, where that is a view (or indexes
    work that is not stored)."""
    if _rows_of(s, shape) == rows:
        return s.srcs[0]
    if s.op == Op.CONST:
        return make(Op.CONST, (), {**s.attrs, "shape": rows}, loc=s.loc)
    if s.op == Op.EXPAND:
        one = s.srcs[0]
        if one.ndim == len(shape) and all(int(d) == 1 for d in one.shape[:-1]):
            row = make(Op.RESHAPE, (one,), {"shape": (1, one.shape[-1])}, loc=s.loc)
            return make(Op.EXPAND, (row,), {"shape": rows}, loc=s.loc)
    if s.op not in MOVEMENT:
        return make(Op.RESHAPE, (s,), {"shape": rows}, loc=s.loc)
    return None


def _same(a: int, b: int) -> bool:
    """Whether sizes ``a`` and ``b`` are equal at every size (by their recipes)."""
    if isinstance(a, Dim) != isinstance(b, Dim):
        return False
    return int(a) == int(b) and (not isinstance(a, Dim) or same_product(a, b))


def _unit_pairs(src: tuple, shape: tuple) -> list[tuple[int, int]] | None:
    """The axes of ``src`` and ``shape`` that are one another, where ``shape`` is ``src`` with axes of size 1
    dropped or inserted: every other axis is 1 now, and as the reshape keeps the element count with the matched
    axes equal at every size, at every size (a symbolic channel count of 1 too). None for any other reshape."""
    pairs, i, j = [], 0, 0
    while i < len(src) or j < len(shape):
        if i < len(src) and j < len(shape) and _same(src[i], shape[j]):
            pairs.append((i, j))
            i, j = i + 1, j + 1
        elif i < len(src) and int(src[i]) == 1:
            i += 1
        elif j < len(shape) and int(shape[j]) == 1:
            j += 1
        else:
            return None
    return pairs


def _unit_source(s: Node, shape: tuple) -> tuple | None:
    """The shape ``s``'s source has, if ``s`` reshapes it to ``shape`` by dropping or inserting axes of size 1."""
    if s.op != Op.RESHAPE or tuple(s.shape) != shape:
        return None
    src = tuple(s.srcs[0].shape)
    return src if len(src) != len(shape) and _unit_pairs(src, shape) is not None else None


def _on_unit_axes(s: Node, src: tuple, shape: tuple) -> Node:
    """Operand ``s`` (of ``shape``, or broadcast to it) on ``src``, ``shape`` with axes of size 1 dropped or
    inserted: a view of anything."""
    if _unit_source(s, shape) == src:
        return s.srcs[0]
    if s.op == Op.CONST:
        return make(Op.CONST, (), {**s.attrs, "shape": src}, loc=s.loc)
    if s.op == Op.EXPAND and s.srcs[0].ndim == len(shape):  # the broadcast operand itself, on src's axes
        one = s.srcs[0]
        sizes = [1] * len(src)
        for a, b in _unit_pairs(src, shape) or ():
            sizes[a] = one.shape[b]
        small = make(Op.RESHAPE, (one,), {"shape": tuple(sizes)}, loc=s.loc)
        return make(Op.EXPAND, (small,), {"shape": src}, loc=s.loc)
    return make(Op.RESHAPE, (s,), {"shape": src}, loc=s.loc)


def _of_product(n: Node, depth: int = 6) -> bool:
    """Whether ``n`` is a matrix product or elementwise work on one (a chain this pass moved already): work moved
    onto it is then the GEMM's epilogue, which reads its other operands through any view. Elsewhere the move only
    changes which shape the work has, and a pointwise kernel after it would read it through the reshape, which
    it does not inline: one kernel more."""
    if n.op == Op.MATMUL:
        return True
    return depth > 0 and n.op in ELEMENTWISE and any(_of_product(s, depth - 1) for s in n.srcs)


def _read_product(n: Node, seen_as: Callable[[Node, tuple], tuple | None]) -> tuple | None:
    """What ``seen_as`` says of the first operand of ``n`` that reshapes a product's work (None: none does)."""
    shape = tuple(n.shape)
    for s in n.srcs:
        got = seen_as(s, shape)
        if got is not None and _of_product(s.srcs[0]):
            return got
    return None


def _flat(n: Node, srcs: list[Node | None]) -> Node | None:
    """``n``'s op on ``srcs``, its operands as they were before the view (None where one cannot be)."""
    if any(s is None for s in srcs):
        return None
    return make(n.op, tuple(srcs), n.attrs, loc=n.loc)  # type: ignore[arg-type]


def _reshaped(flat: Node | None, n: Node) -> Node | None:
    return None if flat is None else make(Op.RESHAPE, (flat,), {"shape": tuple(n.shape)}, loc=n.loc)


def _before_unit_reshape(n: Node) -> Node | None:
    shape = tuple(n.shape)
    src = _read_product(n, _unit_source)
    return None if src is None else _reshaped(_flat(n, [_on_unit_axes(s, src, shape) for s in n.srcs]), n)


def _before_rows_reshape(n: Node) -> Node | None:
    shape = tuple(n.shape)
    rows = _read_product(n, _rows_of) if n.ndim >= 3 else None
    return None if rows is None else _reshaped(_flat(n, [_on_rows(s, rows, shape) for s in n.srcs]), n)


def _before_reshape(n: Node) -> Node | None:
    """Elementwise ``n`` before a reshape of a product's work it reads, if it reads one."""
    return _before_unit_reshape(n) or _before_rows_reshape(n)


def _permuted_product(s: Node) -> tuple | None:
    """The permutation of ``s``, a permute of a product's work (or of its rows reshaped), else None."""
    if s.op != Op.PERMUTE:
        return None
    src = s.srcs[0].srcs[0] if s.srcs[0].op == Op.RESHAPE else s.srcs[0]
    return tuple(s.attrs["perm"]) if _of_product(src) else None


def _unpermuted(s: Node, perm: tuple) -> Node:
    """Operand ``s`` (of the permuted shape) in the order before ``perm``: its source where it is that permute,
    a constant or a broadcast of that shape, else a permute back (a view)."""
    if s.op == Op.PERMUTE and tuple(s.attrs["perm"]) == perm:
        return s.srcs[0]
    inverse = tuple(perm.index(a) for a in range(len(perm)))
    shape = tuple(s.shape[a] for a in inverse)
    if s.op == Op.CONST:
        return make(Op.CONST, (), {**s.attrs, "shape": shape}, loc=s.loc)
    if s.op == Op.EXPAND and s.srcs[0].ndim == len(perm):  # a broadcast stays one: of its source permuted back
        small = make(Op.PERMUTE, (s.srcs[0],), {"perm": inverse}, loc=s.loc)
        return make(Op.EXPAND, (small,), {"shape": shape}, loc=s.loc)
    return make(Op.PERMUTE, (s,), {"perm": inverse}, loc=s.loc)


def _before_permute(n: Node) -> Node | None:
    """Work on a permuted product computed in the product's order, the permute after it (a view the readers
    index): the GEMM's epilogue then, where before a kernel of its own wrote it in the permuted order."""
    perm = next((q for q in map(_permuted_product, n.srcs) if q is not None), None)
    if perm is None:
        return None
    flat = make(n.op, tuple(_unpermuted(s, perm) for s in n.srcs), n.attrs, loc=n.loc)
    flat = _before_reshape(flat) or flat  # then before the reshape of the product's rows it reads
    return make(Op.PERMUTE, (flat,), {"perm": perm}, loc=n.loc)


def _before_views(n: Node) -> Node | None:
    if n.op not in ELEMENTWISE or n.ndim == 0:
        return None
    return _before_reshape(n) or _before_permute(n)


def elementwise_before_views(graph: Graph) -> Graph:
    """``graph`` with each elementwise op on a product seen through a reshape or a permute (above) computed on the
    product, the view after it (bodies included)."""
    return map_nodes(graph, _before_views)

"""Algebraic simplification: constant folding and identities that are exact in floating point.

Exact rewrites only (x*1, x+0, x-0, x/1, --x, no-op movement and casts, movement of movement), so the
reference backend gives bit-identical results after this pass. ``sigmoid_forms`` (in the CPU pipeline) also
recognizes ``1/(1+exp(-x))`` and ``(exp(2x)-1)/(exp(2x)+1)``-style spellings, which changes rounding.
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np

from ..ir.build import make
from ..ir.builders import unflipped
from ..ir.dims import Dim, free_symbols
from ..ir.node import Graph, Node
from ..ir.ops import BINARY, COMPARE, ELEMENTWISE, UNARY, Op
from ..ir.registry import NUMPY
from .rewrite import map_nodes, rewire_scan


def _const_value(n: Node) -> float | None:
    """A constant's value; None for a size that may change (a symbolic ``Dim``, equal to its traced value only at
    the traced length: folding ``1 / T`` or dropping ``x * (T - 1)`` as ``x * 1`` would bake that length in)."""
    if n.op != Op.CONST:
        return None
    v = n.attrs["value"]
    return None if isinstance(v, Dim) and free_symbols(v) else v


def _is(n: Node, value: float) -> bool:
    v = _const_value(n)
    return v is not None and not isinstance(v, bool) and v == value


def _fold(n: Node) -> Node | None:
    """An elementwise op on scalar constants becomes one constant, computed by the numpy rule the reference
    interpreter runs (the same table), so folding never changes a result."""
    if n.op not in ELEMENTWISE or not n.srcs or any(_const_value(s) is None for s in n.srcs):
        return None
    args = [np.full((), s.attrs["value"], dtype=s.dtype.np) for s in n.srcs]
    probe = Node(n.op, tuple(), n.attrs, (), n.dtype, n.loc)
    value = np.asarray(NUMPY[n.op](probe, args)).item()
    return make(Op.CONST, (), {"value": value, "shape": n.shape, "dtype": n.dtype}, loc=n.loc)


def _identity(n: Node) -> Node | None:
    s = n.srcs
    same = lambda a: a.dtype == n.dtype and tuple(map(int, a.shape)) == tuple(map(int, n.shape))  # noqa: E731
    if n.op == Op.MUL and n.dtype.is_float:
        if _is(s[1], 1) and same(s[0]):
            return s[0]
        if _is(s[0], 1) and same(s[1]):
            return s[1]
    if n.op == Op.ADD and n.dtype.is_float:
        if _is(s[1], 0) and same(s[0]):
            return s[0]
        if _is(s[0], 0) and same(s[1]):
            return s[1]
    if n.op == Op.SUB and _is(s[1], 0) and same(s[0]):
        return s[0]
    if n.op == Op.DIV and n.dtype.is_float and _is(s[1], 1):
        return s[0]
    if n.op == Op.NEG and s[0].op == Op.NEG:
        return s[0].srcs[0]
    if n.op == Op.CAST and s[0].dtype == n.dtype:
        return s[0]
    if n.op in (Op.RESHAPE, Op.EXPAND) and tuple(n.shape) == tuple(s[0].shape):
        return s[0]
    if n.op == Op.PERMUTE and tuple(n.attrs["perm"]) == tuple(range(n.ndim)):
        return s[0]
    if n.op == Op.RESHAPE and s[0].op == Op.RESHAPE:
        return make(Op.RESHAPE, (s[0].srcs[0],), n.attrs, loc=n.loc)
    if n.op == Op.PERMUTE and s[0].op == Op.PERMUTE:
        inner, outer = s[0].attrs["perm"], n.attrs["perm"]
        return make(Op.PERMUTE, (s[0].srcs[0],), {"perm": tuple(inner[p] for p in outer)}, loc=n.loc)
    if (back := unflipped(n)) is not None:
        return back
    if n.op in (Op.RESHAPE, Op.EXPAND, Op.PERMUTE) and s[0].op == Op.CONST:
        return make(Op.CONST, (), {**s[0].attrs, "shape": n.shape}, loc=n.loc)
    return None


def _zero_pad_axis(n: Node) -> int | None:
    """The one axis a zero-filled pad pads — or a concat with a part of zeros joins (a GRU's input-projection
    gradient ``concat(dr, 0, dn)``) — else None."""
    if n.op == Op.CONCAT and any(_is(p, 0) for p in n.srcs):
        return n.attrs["axis"]
    if n.op != Op.PAD or n.attrs["value"] != 0:
        return None
    axes = [k for k, (lo, hi) in enumerate(n.attrs["pads"]) if int(lo) or int(hi)]
    return axes[0] if len(axes) == 1 else None


def _pads_to_concat(n: Node) -> Node | None:
    """``pad(a) + pad(b)``, both zero-filled along one axis where their values do not overlap, is
    ``pad(concat(a, 0, b))`` (zeros in a concat count as padding, so sums of several such terms merge too, and a
    concat with zeros where the other term has its values: ``concat(a, 0, c) + pad(b)`` is ``concat(a, b, c)``).

    Autodiff writes the gradient of a tensor read through slices (an LSTM's four gates) as a sum of padded slice
    gradients: every element then evaluates every term behind a select. As a concat each element is computed once
    (the C backend stores a concat part by part). Exact: at each index one term is the value, the others add 0
    (only a -0.0 value comes out as +0.0 through the sum)."""
    if n.op != Op.ADD or not n.dtype.is_float:
        return None
    a, b = n.srcs
    axis = _zero_pad_axis(a)
    if axis is None or _zero_pad_axis(b) != axis or not tuple(a.shape) == tuple(b.shape) == tuple(n.shape):
        return None  # not both placed along one axis, or a broadcast
    segments = sorted(_segments(a, axis) + _segments(b, axis), key=lambda seg: int(seg[0]))
    if not segments:
        return None
    for (s0, l0, _), (s1, _, _) in pairwise(segments):
        if int(s0) + int(l0) > int(s1):
            return None  # values overlap: a real sum there
    first = segments[0][0]
    cursor, parts = first, []
    for start, length, part in segments:
        if int(start) > int(cursor):
            shape = tuple(start - cursor if k == axis else d for k, d in enumerate(n.shape))
            parts.append(make(Op.CONST, (), {"value": 0.0, "shape": shape, "dtype": n.dtype}, loc=n.loc))
        parts.append(part)
        cursor = start + length
    cat = parts[0] if len(parts) == 1 else make(Op.CONCAT, tuple(parts), {"axis": axis}, loc=n.loc)
    hi = n.shape[axis] - cursor
    if not int(first) and not int(hi):
        return cat
    pads = tuple((first, hi) if k == axis else (0, 0) for k in range(n.ndim))
    return make(Op.PAD, (cat,), {"pads": pads, "value": 0}, loc=n.loc)


def _segments(pad: Node, axis: int) -> list[tuple[int, int, Node]]:
    """(start, length, node) of the values a zero pad (or a concat) places along ``axis`` (zero parts of a concat
    left out)."""
    start, src = (pad.attrs["pads"][axis][0], pad.srcs[0]) if pad.op == Op.PAD else (0, pad)
    parts = list(src.srcs) if src.op == Op.CONCAT and src.attrs["axis"] == axis else [src]
    out = []
    for part in parts:
        length = part.shape[axis]
        if not _is(part, 0):
            out.append((start, length, part))
        start = start + length
    return out


def _const_into_body(n: Node) -> Node | None:
    """A constant a scan reads as a loop invariant (``1.0 - z`` traced outside the cell) becomes a constant of
    its body again: inside the loop it is a literal of the kernel that reads it, not a buffer read every step."""
    if n.op != Op.SCAN:
        return None
    first = n.attrs["n_carry"] + n.attrs["n_xs"]
    changes = {k: (None, None, make(Op.CONST, (), dict(s.attrs), loc=s.loc))
               for k, s in enumerate(n.srcs) if k >= first and s.op == Op.CONST}
    return rewire_scan(n, changes) if changes else None


def simplify(graph: Graph) -> Graph:
    """Fold constants and apply exact identities until nothing changes (bodies included)."""
    return map_nodes(graph, lambda n: _fold(n) or _identity(n) or _pads_to_concat(n) or _const_into_body(n))


def _sigmoid_of(n: Node) -> Node | None:
    """x for ``1 / (1 + exp(-x))`` spelled with recip or div, else None."""
    if n.op == Op.RECIP:
        den = n.srcs[0]
    elif n.op == Op.DIV and _is(n.srcs[0], 1):
        den = n.srcs[1]
    else:
        return None
    if den.op != Op.ADD:
        return None
    a, b = den.srcs
    e = b if _is(a, 1) else a if _is(b, 1) else None
    if e is None or e.op != Op.EXP or e.srcs[0].op != Op.NEG:
        return None
    return e.srcs[0].srcs[0]


def sigmoid_forms(graph: Graph) -> Graph:
    """Recognize spelled-out sigmoids (and ``2*sigmoid(2x)-1`` is left alone) so codegen emits one fast call."""

    def rule(n: Node) -> Node | None:
        x = _sigmoid_of(n)
        return make(Op.SIGMOID, (x,), loc=n.loc) if x is not None and x.dtype == n.dtype else None

    return map_nodes(graph, rule)


__all__ = ["BINARY", "COMPARE", "UNARY", "sigmoid_forms", "simplify"]

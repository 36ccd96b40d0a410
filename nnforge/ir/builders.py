"""IR builders: one function per op that makes its node, for code below the frontend (vjp rules, autodiff).

They take and return ``Node``s and skip no-op nodes as the frontend does (a reshape to the same shape, an
identity permutation, an empty reduction, an all-zero pad, a cast to the same dtype), so gradients built here
are the graphs the frontend would trace. Broadcasting is explicit: a Python scalar operand becomes a constant
of the other operand's shape and dtype (vjp rules only mix scalars with float tensors).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..dtypes import DType
from .build import make
from .dims import Dim, same_size
from .node import Node
from .ops import Op

Scalar = int | float | bool
Operand = Node | Scalar


def const(value: Scalar, shape: Sequence[int], dtype: DType) -> Node:
    """``shape`` filled with ``value`` rounded to ``dtype`` (a symbolic size as value stays symbolic)."""
    value = value if isinstance(value, Dim) else dtype.np.type(value).item()
    return make(Op.CONST, (), {"value": value, "shape": tuple(shape), "dtype": dtype})


def zeros_like(x: Node) -> Node:
    return const(0, x.shape, x.dtype)


def _pair(a: Operand, b: Operand) -> tuple[Node, Node]:
    if not isinstance(a, Node):
        a = const(a, b.shape, b.dtype)
    if not isinstance(b, Node):
        b = const(b, a.shape, a.dtype)
    return a, b


def binary(op: Op, a: Operand, b: Operand) -> Node:
    return make(op, _pair(a, b))


def add(a: Operand, b: Operand) -> Node:
    return binary(Op.ADD, a, b)


def sub(a: Operand, b: Operand) -> Node:
    return binary(Op.SUB, a, b)


def mul(a: Operand, b: Operand) -> Node:
    return binary(Op.MUL, a, b)


def div(a: Operand, b: Operand) -> Node:
    return binary(Op.DIV, a, b)


def pow(a: Operand, b: Operand) -> Node:
    return binary(Op.POW, a, b)


def lt(a: Operand, b: Operand) -> Node:
    return binary(Op.LT, a, b)


def le(a: Operand, b: Operand) -> Node:
    return binary(Op.LE, a, b)


def eq(a: Operand, b: Operand) -> Node:
    return binary(Op.EQ, a, b)


def logical_and(a: Node, b: Node) -> Node:
    """``a & b`` of two bool tensors (their minimum)."""
    return make(Op.MIN, (a, b))


def neg(x: Node) -> Node:
    return make(Op.NEG, (x,))


def exp(x: Node) -> Node:
    return make(Op.EXP, (x,))


def log(x: Node) -> Node:
    return make(Op.LOG, (x,))


def sin(x: Node) -> Node:
    return make(Op.SIN, (x,))


def cos(x: Node) -> Node:
    return make(Op.COS, (x,))


def sign(x: Node) -> Node:
    return make(Op.SIGN, (x,))


def where(cond: Node, a: Node, b: Node) -> Node:
    return make(Op.WHERE, (cond, a, b))


def cast(x: Node, dtype: DType) -> Node:
    return x if x.dtype == dtype else make(Op.CAST, (x,), {"dtype": dtype})


def reduce_sum(x: Node, axes: Sequence[int], keepdims: bool) -> Node:
    axes = tuple(sorted(set(axes)))
    return make(Op.SUM, (x,), {"axes": axes, "keepdims": bool(keepdims)}) if axes else x


def matmul(a: Node, b: Node) -> Node:
    return make(Op.MATMUL, (a, b))


def transpose(x: Node) -> Node:
    """``x`` with its last two axes swapped (``mT``)."""
    perm = list(range(x.ndim))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    return permute(x, perm)


def is_transpose(n: Node) -> bool:
    """Whether ``n`` is what ``transpose`` makes: a permute swapping the last two axes, the others in place."""
    return n.op == Op.PERMUTE and tuple(n.attrs["perm"]) == (*range(n.ndim - 2), n.ndim - 1, n.ndim - 2)


def reshape(x: Node, shape: Sequence[int]) -> Node:
    shape = tuple(shape)
    if tuple(map(int, shape)) == tuple(map(int, x.shape)):
        return x
    return make(Op.RESHAPE, (x,), {"shape": shape})


def permute(x: Node, perm: Sequence[int]) -> Node:
    perm = tuple(perm)
    return x if perm == tuple(range(x.ndim)) else make(Op.PERMUTE, (x,), {"perm": perm})


def expand(x: Node, shape: Sequence[int]) -> Node:
    """``x`` with its size-1 axes grown to ``shape`` (same rank)."""
    shape = tuple(shape)
    if tuple(map(int, shape)) == tuple(map(int, x.shape)):
        return x
    return make(Op.EXPAND, (x,), {"shape": shape})


def unsqueeze(x: Node, axis: int) -> Node:
    return reshape(x, (*x.shape[:axis], 1, *x.shape[axis:]))


def slice_(x: Node, starts: Sequence[int], stops: Sequence[int], steps: Sequence[int] | None = None) -> Node:
    """``x[starts:stops:steps]`` per axis; no node where it keeps all of ``x``."""
    steps = tuple(steps) if steps is not None else (1,) * x.ndim
    if all(int(a) == 0 and int(b) == int(d) and s == 1 for a, b, s, d in zip(starts, stops, steps, x.shape)):
        return x
    return make(Op.SLICE, (x,), {"starts": tuple(starts), "stops": tuple(stops), "steps": steps})


def slice_axis(x: Node, axis: int, lo: int, hi: int) -> Node:
    """``x[lo:hi]`` along ``axis`` (always a node: a concat's pieces stay pieces)."""
    starts = [0] * x.ndim
    stops = list(x.shape)
    starts[axis], stops[axis] = lo, hi
    return make(Op.SLICE, (x,), {"starts": tuple(starts), "stops": tuple(stops), "steps": (1,) * x.ndim})


def flip(x: Node, axis: int) -> Node:
    """``x`` reversed along ``axis``."""
    starts = [0] * x.ndim
    stops = list(x.shape)
    steps = [1] * x.ndim
    d = x.shape[axis]
    starts[axis], stops[axis], steps[axis] = d - 1 if int(d) > 0 else 0, -1, -1
    return slice_(x, starts, stops, steps)


def flipped_axes(n: Node) -> frozenset[int] | None:
    """The axes ``n`` reverses whole, if ``n`` is a flip (``flip`` of one or more axes: every other axis kept
    whole), else None. Sizes are compared in their normal form, so a flip of a traced length ``T`` is told from a
    slice that happened to cover it when traced."""
    if n.op != Op.SLICE:
        return None
    out = set()
    for k, (a, b, s, d) in enumerate(zip(n.attrs["starts"], n.attrs["stops"], n.attrs["steps"], n.srcs[0].shape)):
        if s == -1 and int(b) == -1 and (same_size(a, d - 1) or int(d) == 0):
            out.add(k)
        elif s != 1 or int(a) != 0 or not same_size(b, d):
            return None
    return frozenset(out) if out else None


def unflipped(n: Node) -> Node | None:
    """The value ``n`` flips back, if ``n`` is a flip of a flip over the same axes, else None."""
    axes = flipped_axes(n)
    return n.srcs[0].srcs[0] if axes is not None and flipped_axes(n.srcs[0]) == axes else None


def pad(x: Node, pads: Sequence[tuple[int, int]], value: Scalar = 0) -> Node:
    pads = tuple((lo, hi) for lo, hi in pads)
    if all(p == (0, 0) for p in pads):
        return x
    return make(Op.PAD, (x,), {"pads": pads, "value": value})


def gather(x: Node, index: Node, axis: int) -> Node:
    return make(Op.GATHER, (x, index), {"axis": axis})


def scatter_add(x: Node, index: Node, axis: int, size: int) -> Node:
    return make(Op.SCATTER_ADD, (x, index), {"axis": axis, "size": size})


def proj(node: Node, index: int) -> Node:
    """Result ``index`` of a multi-result node (a scan)."""
    return make(Op.PROJ, (node,), {"index": index})


__all__ = [
    "Operand", "add", "binary", "cast", "const", "cos", "div", "eq", "exp", "expand", "flip", "gather", "le",
    "log", "logical_and", "lt", "matmul", "mul", "neg", "pad", "permute", "pow", "proj", "reduce_sum", "reshape",
    "scatter_add", "sign", "sin", "slice_", "slice_axis", "sub", "transpose", "unsqueeze", "where", "zeros_like",
]

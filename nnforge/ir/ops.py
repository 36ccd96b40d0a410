"""The op set and its shape/dtype rules: one row per op.

The set is small on purpose. Higher-level functions (softmax, layer norm, an LSTM cell) are compositions in the
frontend, so every transform (autodiff, reference, C, Triton) only needs a rule per row here. Binary and ternary
ops take operands of identical shape: the frontend makes broadcasting explicit with reshape + expand, which later
become index expressions of the consuming kernel instead of copies.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from typing import Any

from ..dtypes import DType
from ..errors import DTypeError, ShapeError
from .dims import render


class Op(enum.Enum):
    # leaves
    INPUT = enum.auto()     # placeholder of a graph or loop body: attrs name, shape, dtype
    CONST = enum.auto()     # a scalar filled to a shape: attrs value, shape, dtype
    DATA = enum.auto()      # a concrete array: attrs array
    RAND = enum.auto()      # fresh random numbers on every evaluation: attrs shape, dtype, dist ("uniform"|"normal")
    FEEDER = enum.auto()    # host -> device: calls attrs fn() on every evaluation
    # elementwise
    NEG = enum.auto()
    EXP = enum.auto()
    LOG = enum.auto()
    SQRT = enum.auto()
    RECIP = enum.auto()
    SIN = enum.auto()
    COS = enum.auto()
    TANH = enum.auto()
    SIGMOID = enum.auto()
    ERF = enum.auto()
    ABS = enum.auto()
    SIGN = enum.auto()
    ADD = enum.auto()
    SUB = enum.auto()
    MUL = enum.auto()
    DIV = enum.auto()
    POW = enum.auto()
    MAX = enum.auto()
    MIN = enum.auto()
    LT = enum.auto()
    LE = enum.auto()
    EQ = enum.auto()
    NE = enum.auto()
    WHERE = enum.auto()
    CAST = enum.auto()      # attrs dtype
    # reductions: attrs axes (sorted tuple), keepdims
    SUM = enum.auto()
    REDUCE_MAX = enum.auto()
    # contraction: [..., m, k] @ [..., k, n], batch dims equal
    MATMUL = enum.auto()
    # movement: never copies unless a pass decides so
    RESHAPE = enum.auto()   # attrs shape
    PERMUTE = enum.auto()   # attrs perm
    EXPAND = enum.auto()    # attrs shape (size-1 axes grow)
    SLICE = enum.auto()     # attrs starts, stops, steps (steps may be negative: flip)
    PAD = enum.auto()       # attrs pads ((lo, hi) per axis), value
    CONCAT = enum.auto()    # attrs axis
    # indexing by data: (x, index), index int32/int64 of x's rank; attrs axis (GATHER), axis and size (SCATTER_ADD)
    GATHER = enum.auto()       # out[i] = x[i with i[axis] replaced by index[i]] (torch.gather, take_along_axis)
    SCATTER_ADD = enum.auto()  # out = zeros(size along axis); out[i with index[i] on axis] += x[i] (its vjp)
    # structure
    PROJ = enum.auto()      # one result of a multi-result node: attrs index
    SCAN = enum.auto()      # attrs body, n_carry, n_xs, reverse, unroll, length
    LOOP = enum.auto()      # attrs body, n_state, length, with_index
    RECEIVER = enum.auto()  # device -> host: calls attrs fn(*values); no result


UNARY = frozenset({Op.NEG, Op.EXP, Op.LOG, Op.SQRT, Op.RECIP, Op.SIN, Op.COS, Op.TANH, Op.SIGMOID, Op.ERF,
                   Op.ABS, Op.SIGN})
FLOAT_ONLY = frozenset({Op.EXP, Op.LOG, Op.SQRT, Op.RECIP, Op.SIN, Op.COS, Op.TANH, Op.SIGMOID, Op.ERF})
BINARY = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.POW, Op.MAX, Op.MIN})
COMPARE = frozenset({Op.LT, Op.LE, Op.EQ, Op.NE})
ELEMENTWISE = UNARY | BINARY | COMPARE | {Op.WHERE, Op.CAST}
MOVEMENT = frozenset({Op.RESHAPE, Op.PERMUTE, Op.EXPAND, Op.SLICE, Op.PAD, Op.CONCAT})
REDUCE = frozenset({Op.SUM, Op.REDUCE_MAX})
LEAVES = frozenset({Op.INPUT, Op.CONST, Op.DATA, Op.RAND, Op.FEEDER})
EFFECTFUL = frozenset({Op.RAND, Op.FEEDER, Op.RECEIVER, Op.LOOP})
MULTI = frozenset({Op.SCAN, Op.LOOP, Op.RECEIVER})

Type = tuple[tuple[int, ...] | None, DType | None]


def fmt_shape(shape: tuple[int, ...]) -> str:
    """A shape for an error message: the concrete sizes of this call (a traced size's symbol, ``a0.1``, means
    nothing to the user)."""
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def _same_shape(op: Op, srcs: tuple) -> None:
    shapes = [s.shape for s in srcs]
    if any(tuple(map(int, s)) != tuple(map(int, shapes[0])) for s in shapes[1:]):
        raise ShapeError(f"{op.name.lower()}: operand shapes differ: {', '.join(fmt_shape(s) for s in shapes)}")


def _same_dtype(op: Op, srcs: tuple) -> None:
    dts = [s.dtype for s in srcs]
    if any(d != dts[0] for d in dts[1:]):
        raise DTypeError(f"{op.name.lower()}: operand dtypes differ: {', '.join(map(str, dts))}")


def _unary(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    (x,) = srcs
    if op in FLOAT_ONLY and not x.dtype.is_float:
        raise DTypeError(f"{op.name.lower()}: needs a float tensor, got {x.dtype}")
    if x.dtype == DType.bool and op in (Op.NEG, Op.SIGN):
        raise DTypeError(f"{op.name.lower()}: not defined for bool")
    return x.shape, x.dtype


def _binary(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    _same_shape(op, srcs)
    _same_dtype(op, srcs)
    if op in COMPARE:
        return srcs[0].shape, DType.bool
    if srcs[0].dtype == DType.bool and op not in (Op.MAX, Op.MIN, Op.MUL):
        raise DTypeError(f"{op.name.lower()}: not defined for bool tensors")
    return srcs[0].shape, srcs[0].dtype


def _where(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    c, a, b = srcs
    _same_shape(op, srcs)
    if c.dtype != DType.bool:
        raise DTypeError(f"where: condition must be bool, got {c.dtype}")
    _same_dtype(op, (a, b))
    return a.shape, a.dtype


def _reduce(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    (x,) = srcs
    axes = attrs["axes"]
    if any(not 0 <= a < x.ndim for a in axes) or len(set(axes)) != len(axes):
        raise ShapeError(f"{op.name.lower()}: axes {axes} out of range for shape {fmt_shape(x.shape)}")
    if attrs["keepdims"]:
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    else:
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return shape, x.dtype


def _matmul(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    a, b = srcs
    _same_dtype(op, srcs)
    if a.ndim < 2 or b.ndim < 2 or a.ndim != b.ndim:
        raise ShapeError(f"matmul: needs operands of equal rank >= 2, got {fmt_shape(a.shape)} @ {fmt_shape(b.shape)}")
    if a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"matmul: shapes do not fit: {fmt_shape(a.shape)} @ {fmt_shape(b.shape)}")
    return (*a.shape[:-1], b.shape[-1]), a.dtype


def _reshape(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    (x,) = srcs
    shape = attrs["shape"]
    if math.prod(map(int, shape)) != math.prod(map(int, x.shape)) or any(int(d) < 0 for d in shape):
        raise ShapeError(f"reshape: cannot view {fmt_shape(x.shape)} as {fmt_shape(shape)}")
    return tuple(shape), x.dtype


def _permute(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    (x,) = srcs
    perm = attrs["perm"]
    if sorted(perm) != list(range(x.ndim)):
        raise ShapeError(f"permute: {perm} is not a permutation of the {x.ndim} axes of {fmt_shape(x.shape)}")
    return tuple(x.shape[p] for p in perm), x.dtype


def _expand(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    (x,) = srcs
    shape = attrs["shape"]
    if len(shape) != x.ndim or any(int(a) != int(b) and int(a) != 1 for a, b in zip(x.shape, shape)):
        raise ShapeError(f"expand: cannot expand {fmt_shape(x.shape)} to {fmt_shape(shape)}")
    return tuple(shape), x.dtype


def _slice(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    (x,) = srcs
    starts, stops, steps = attrs["starts"], attrs["stops"], attrs["steps"]
    if not len(starts) == len(stops) == len(steps) == x.ndim:
        raise ShapeError(f"slice: needs one (start, stop, step) per axis of {fmt_shape(x.shape)}")
    shape = []
    for d, a, b, s in zip(x.shape, starts, stops, steps):
        if s == 0:
            raise ShapeError("slice: step must not be zero")
        if s > 0 and not (0 <= a <= d and a <= b <= d):
            raise ShapeError(f"slice: [{a}:{b}:{s}] out of range for size {render(d)}")
        if s < 0 and not (-1 <= b <= a < d or (d == 0)):
            raise ShapeError(f"slice: [{a}:{b}:{s}] out of range for size {render(d)}")
        if s == 1:
            shape.append(b - a)
        elif s > 0:
            shape.append((b - a + (s - 1)) // s)
        else:
            shape.append((a - b + (-s - 1)) // (-s))
    return tuple(shape), x.dtype


def _pad(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    (x,) = srcs
    pads = attrs["pads"]
    if len(pads) != x.ndim or any(lo < 0 or hi < 0 for lo, hi in pads):
        raise ShapeError(f"pad: needs non-negative (lo, hi) per axis of {fmt_shape(x.shape)}, got {pads}")
    return tuple(d + lo + hi for d, (lo, hi) in zip(x.shape, pads)), x.dtype


def _concat(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    axis = attrs["axis"]
    first = srcs[0]
    _same_dtype(op, srcs)
    for s in srcs[1:]:
        if s.ndim != first.ndim or any(int(a) != int(b) for i, (a, b) in enumerate(zip(s.shape, first.shape))
                                       if i != axis):
            raise ShapeError(f"concat: shapes {', '.join(fmt_shape(t.shape) for t in srcs)} differ off axis {axis}")
    size = srcs[0].shape[axis]
    for s in srcs[1:]:
        size = size + s.shape[axis]
    return (*first.shape[:axis], size, *first.shape[axis + 1:]), first.dtype


def _indexed(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    """GATHER reads ``x`` at ``index`` along ``axis``; SCATTER_ADD adds ``x`` into ``size`` slots along ``axis`` at
    ``index`` (the gather's transpose). Off the axis, the two shapes are equal: the frontend broadcasts."""
    x, index = srcs
    name, axis = op.name.lower(), attrs["axis"]
    if not index.dtype.is_int:
        raise DTypeError(f"{name}: index must be int32 or int64, got {index.dtype}")
    if index.ndim != x.ndim or not 0 <= axis < x.ndim:
        raise ShapeError(f"{name}: index {fmt_shape(index.shape)} must have the rank of {fmt_shape(x.shape)} and "
                         f"axis {axis} must be one of its axes")
    if op == Op.SCATTER_ADD:
        if tuple(map(int, index.shape)) != tuple(map(int, x.shape)):
            raise ShapeError(f"scatter_add: index {fmt_shape(index.shape)} and values {fmt_shape(x.shape)} differ")
        return (*x.shape[:axis], attrs["size"], *x.shape[axis + 1:]), x.dtype
    if any(int(a) != int(b) for d, (a, b) in enumerate(zip(index.shape, x.shape)) if d != axis):
        raise ShapeError(f"gather: index {fmt_shape(index.shape)} and {fmt_shape(x.shape)} differ off axis {axis}")
    return tuple(index.shape), x.dtype


def _cast(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    return srcs[0].shape, attrs["dtype"]


def _leaf(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    if op == Op.DATA:
        from ..dtypes import from_numpy

        return tuple(attrs["array"].shape), from_numpy(attrs["array"].dtype)
    return tuple(attrs["shape"]), attrs["dtype"]


def _proj(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    return srcs[0].types[attrs["index"]]


def _multi(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    return None, None  # result types are computed by the builder of scan / loop / receiver


SHAPE_RULES: dict[Op, Callable[[Op, tuple, Mapping[str, Any]], Type]] = {
    **{o: _unary for o in UNARY},
    **{o: _binary for o in BINARY | COMPARE},
    Op.WHERE: _where, Op.CAST: _cast, Op.SUM: _reduce, Op.REDUCE_MAX: _reduce, Op.MATMUL: _matmul,
    Op.RESHAPE: _reshape, Op.PERMUTE: _permute, Op.EXPAND: _expand, Op.SLICE: _slice, Op.PAD: _pad,
    Op.CONCAT: _concat, Op.PROJ: _proj, Op.GATHER: _indexed, Op.SCATTER_ADD: _indexed,
    **{o: _leaf for o in LEAVES}, Op.SCAN: _multi, Op.LOOP: _multi, Op.RECEIVER: _multi,
}

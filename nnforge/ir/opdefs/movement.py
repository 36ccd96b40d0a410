"""Movement ops: reshape, permute, expand, slice, pad, concat. They never copy unless a pass decides so; their
vjps move the cotangent back (a slice's is a pad, a pad's a slice, a concat's its pieces)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from ...errors import ShapeError
from .. import builders as b
from ..dims import Dim, render
from ..node import Node
from ..ops import Op, fmt_shape
from ..registry import Type, define
from .common import same_dtype


def _shape(n: Node) -> tuple[int, ...]:
    return tuple(map(int, n.shape))


# ---- reshape ------------------------------------------------------------------------------------------------


def _reshape(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    (x,) = srcs
    shape = attrs["shape"]
    if math.prod(map(int, shape)) != math.prod(map(int, x.shape)) or any(int(d) < 0 for d in shape):
        raise ShapeError(f"reshape: cannot view {fmt_shape(x.shape)} as {fmt_shape(shape)}")
    return tuple(shape), x.dtype


def _reshape_vjp(n: Node, g: Node) -> tuple:
    """A ``detach`` reshape (``Tensor.detach``) passes no gradient."""
    return (None if n.attrs.get("detach") else b.reshape(g, n.srcs[0].shape),)


define(Op.RESHAPE, _reshape, lambda n, a: a[0].reshape(_shape(n)), _reshape_vjp)


# ---- permute ------------------------------------------------------------------------------------------------


def _permute(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    (x,) = srcs
    perm = attrs["perm"]
    if sorted(perm) != list(range(x.ndim)):
        raise ShapeError(f"permute: {perm} is not a permutation of the {x.ndim} axes of {fmt_shape(x.shape)}")
    return tuple(x.shape[p] for p in perm), x.dtype


def _permute_vjp(n: Node, g: Node) -> tuple:
    inv = [0] * g.ndim
    for i, p in enumerate(n.attrs["perm"]):
        inv[p] = i
    return (b.permute(g, inv),)


define(Op.PERMUTE, _permute, lambda n, a: a[0].transpose(n.attrs["perm"]), _permute_vjp)


# ---- expand -------------------------------------------------------------------------------------------------


def _expand(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    (x,) = srcs
    shape = attrs["shape"]
    if len(shape) != x.ndim or any(int(a) != int(c) and int(a) != 1 for a, c in zip(x.shape, shape)):
        raise ShapeError(f"expand: cannot expand {fmt_shape(x.shape)} to {fmt_shape(shape)}")
    return tuple(shape), x.dtype


def _expand_vjp(n: Node, g: Node) -> tuple:
    """Sum the broadcast axes back to size 1."""
    axes = [i for i, (a, c) in enumerate(zip(g.shape, n.srcs[0].shape)) if int(a) != int(c)]
    return (b.reduce_sum(g, axes, keepdims=True),)


define(Op.EXPAND, _expand, lambda n, a: np.broadcast_to(a[0], _shape(n)), _expand_vjp)


# ---- slice --------------------------------------------------------------------------------------------------


def _slice(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    (x,) = srcs
    starts, stops, steps = attrs["starts"], attrs["stops"], attrs["steps"]
    if not len(starts) == len(stops) == len(steps) == x.ndim:
        raise ShapeError(f"slice: needs one (start, stop, step) per axis of {fmt_shape(x.shape)}")
    shape = []
    for d, lo, hi, s in zip(x.shape, starts, stops, steps):
        if s == 0:
            raise ShapeError("slice: step must not be zero")
        if s > 0 and not (0 <= lo <= d and lo <= hi <= d):
            raise ShapeError(f"slice: [{lo}:{hi}:{s}] out of range for size {render(d)}")
        if s < 0 and not (-1 <= hi <= lo < d or (d == 0)):
            raise ShapeError(f"slice: [{lo}:{hi}:{s}] out of range for size {render(d)}")
        if s == 1:
            shape.append(hi - lo)
        elif s > 0:
            shape.append((hi - lo + (s - 1)) // s)
        else:
            shape.append((lo - hi + (-s - 1)) // (-s))
    return tuple(shape), x.dtype


def _slice_np(node: Node, args: Sequence[np.ndarray]) -> np.ndarray:
    idx = tuple(slice(lo, None if (s < 0 and hi < 0) else hi, s)
                for lo, hi, s in zip(node.attrs["starts"], node.attrs["stops"], node.attrs["steps"]))
    return args[0][idx]


def _slice_vjp(n: Node, g: Node) -> tuple:
    """Scatter ``g`` back into zeros of x's shape: per axis, strided steps are re-spread and edges padded."""
    x = n.srcs[0]
    for ax, (start, step) in enumerate(zip(n.attrs["starts"], n.attrs["steps"])):
        size, count = x.shape[ax], g.shape[ax]
        if int(count) == 0:
            return (b.zeros_like(x),)
        if step < 0:
            g = b.flip(g, ax)
            start = start + (count - 1) * step
            step = -step
        if step > 1:
            g = b.unsqueeze(g, ax + 1)
            g = b.pad(g, [(0, step - 1) if i == ax + 1 else (0, 0) for i in range(g.ndim)])
            g = b.reshape(g, (*g.shape[:ax], count * step, *g.shape[ax + 2:]))
            span = (count - 1) * step + 1
            g = b.slice_(g, [0] * g.ndim, [span if i == ax else d for i, d in enumerate(g.shape)])
        else:
            span = count
        g = b.pad(g, [(start, size - start - span) if i == ax else (0, 0) for i in range(g.ndim)])
    return (g,)


define(Op.SLICE, _slice, _slice_np, _slice_vjp)


# ---- pad ----------------------------------------------------------------------------------------------------


def _pad(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    (x,) = srcs
    pads = attrs["pads"]
    if len(pads) != x.ndim or any(lo < 0 or hi < 0 for lo, hi in pads):
        raise ShapeError(f"pad: needs non-negative (lo, hi) per axis of {fmt_shape(x.shape)}, got {pads}")
    return tuple(d + lo + hi for d, (lo, hi) in zip(x.shape, pads)), x.dtype


def _pad_vjp(n: Node, g: Node) -> tuple:
    """The padded region read back out; a stop at the end of ``g`` is spelled as g's own size."""
    starts, stops = [], []
    for (lo, _), d, end in zip(n.attrs["pads"], n.srcs[0].shape, g.shape):
        stop = lo + d
        starts.append(_size(lo))
        stops.append(end if int(stop) >= int(end) else _size(stop))
    return (b.slice_(g, starts, stops),)


def _size(v: int) -> int:
    """A bound as a slice attribute: a symbolic size stays symbolic, anything else becomes a plain int."""
    return v if isinstance(v, Dim) else int(v)


define(Op.PAD, _pad, lambda n, a: np.pad(a[0], n.attrs["pads"], constant_values=n.attrs["value"]), _pad_vjp)


# ---- concat -------------------------------------------------------------------------------------------------


def _concat(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    axis = attrs["axis"]
    first = srcs[0]
    same_dtype(op, srcs)
    for s in srcs[1:]:
        if s.ndim != first.ndim or any(int(p) != int(q) for i, (p, q) in enumerate(zip(s.shape, first.shape))
                                       if i != axis):
            raise ShapeError(f"concat: shapes {', '.join(fmt_shape(t.shape) for t in srcs)} differ off axis {axis}")
    size = srcs[0].shape[axis]
    for s in srcs[1:]:
        size = size + s.shape[axis]
    return (*first.shape[:axis], size, *first.shape[axis + 1:]), first.dtype


def _concat_vjp(n: Node, g: Node) -> tuple:
    ax, lo, out = n.attrs["axis"], 0, []
    for s in n.srcs:
        hi = lo + s.shape[ax]
        out.append(b.slice_axis(g, ax, lo, hi))
        lo = hi
    return tuple(out)


define(Op.CONCAT, _concat, lambda n, a: np.concatenate(a, axis=n.attrs["axis"]), _concat_vjp)

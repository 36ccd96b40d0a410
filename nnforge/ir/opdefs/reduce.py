"""Reductions (sum, max over sorted ``axes``, with ``keepdims``) and the contraction ``matmul``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ...errors import ShapeError
from .. import builders as b
from ..node import Node
from ..ops import Op, fmt_shape
from ..registry import Type, define
from .common import same_dtype, wide


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


def _reduce_np(node: Node, args: Sequence[np.ndarray]) -> np.ndarray:
    fn = np.sum if node.op == Op.SUM else np.max
    out = fn(wide(args[0]), axis=tuple(node.attrs["axes"]), keepdims=node.attrs["keepdims"])
    return np.asarray(out).astype(node.dtype.np, copy=False)


def _kept(n: Node, v: Node) -> Node:
    """``v`` (shaped like n's result) with the reduced axes kept as size 1."""
    x, axes = n.srcs[0], n.attrs["axes"]
    if n.attrs["keepdims"]:
        return v
    return b.reshape(v, [1 if i in axes else d for i, d in enumerate(x.shape)])


def _sum_vjp(n: Node, g: Node) -> tuple:
    return (b.expand(_kept(n, g), n.srcs[0].shape),)


def _reduce_max_vjp(n: Node, g: Node) -> tuple:
    """Spread evenly over the maxima (amax semantics)."""
    x = n.srcs[0]
    keep = _kept(n, n)
    mask = b.cast(b.eq(x, b.expand(keep, x.shape)), x.dtype)
    count = b.reduce_sum(mask, n.attrs["axes"], keepdims=True)
    return (b.mul(mask, b.expand(b.div(_kept(n, g), count), x.shape)),)


def _matmul(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    x, y = srcs
    same_dtype(op, srcs)
    if x.ndim < 2 or y.ndim < 2 or x.ndim != y.ndim:
        raise ShapeError(f"matmul: needs operands of equal rank >= 2, got {fmt_shape(x.shape)} @ {fmt_shape(y.shape)}")
    if x.shape[:-2] != y.shape[:-2] or x.shape[-1] != y.shape[-2]:
        raise ShapeError(f"matmul: shapes do not fit: {fmt_shape(x.shape)} @ {fmt_shape(y.shape)}")
    return (*x.shape[:-1], y.shape[-1]), x.dtype


def _matmul_np(node: Node, args: Sequence[np.ndarray]) -> np.ndarray:
    x, y = (wide(a) for a in args)
    return np.matmul(x, y).astype(node.dtype.np, copy=False)


def _matmul_vjp(n: Node, g: Node) -> tuple:
    x, y = n.srcs
    return b.matmul(g, b.transpose(y)), b.matmul(b.transpose(x), g)


define(Op.SUM, _reduce, _reduce_np, _sum_vjp)
define(Op.REDUCE_MAX, _reduce, _reduce_np, _reduce_max_vjp)
define(Op.MATMUL, _matmul, _matmul_np, _matmul_vjp)

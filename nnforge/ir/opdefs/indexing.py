"""Indexing by data: ``gather`` reads ``x`` at ``index`` along ``axis``; ``scatter_add`` adds ``x`` into ``size``
slots along ``axis`` at ``index``. Each is the other's transpose, so each one's vjp is the other on the same
index."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ...errors import DTypeError, NNForgeError, ShapeError
from .. import builders as b
from ..node import Node
from ..ops import Op, fmt_shape
from ..registry import Type, define
from .common import wide


def _indexed(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    """Off the axis, the two shapes are equal: the frontend broadcasts."""
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
    if any(int(p) != int(q) for d, (p, q) in enumerate(zip(index.shape, x.shape)) if d != axis):
        raise ShapeError(f"gather: index {fmt_shape(index.shape)} and {fmt_shape(x.shape)} differ off axis {axis}")
    return tuple(index.shape), x.dtype


def _checked_index(node: Node, x_size: int, index: np.ndarray) -> np.ndarray:
    """The index array, or a clear error naming the first value outside [0, size)."""
    bad = (index < 0) | (index >= x_size)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise NNForgeError(f"{node.op.name.lower()}: index {int(index[at])} at position {list(at)} is out of range "
                           f"for size {x_size} along axis {node.attrs['axis']} (created at {node.loc})")
    return index.astype(np.intp, copy=False)


def _gather_np(node: Node, args: Sequence[np.ndarray]) -> np.ndarray:
    x, index = args
    axis = node.attrs["axis"]
    return np.take_along_axis(x, _checked_index(node, x.shape[axis], index), axis=axis)


def _scatter_add_np(node: Node, args: Sequence[np.ndarray]) -> np.ndarray:
    x, index = args
    axis = node.attrs["axis"]
    out = np.zeros(tuple(map(int, node.shape)), dtype=wide(x).dtype)
    idx = list(np.indices(x.shape, sparse=True))
    idx[axis] = _checked_index(node, out.shape[axis], index)
    np.add.at(out, tuple(idx), wide(x))  # unbuffered: repeated indices all add
    return out.astype(node.dtype.np, copy=False)


def _gather_vjp(n: Node, g: Node) -> tuple:
    x, index = n.srcs
    axis = n.attrs["axis"]
    return b.scatter_add(g, index, axis, x.shape[axis]), None


def _scatter_add_vjp(n: Node, g: Node) -> tuple:
    return b.gather(g, n.srcs[1], n.attrs["axis"]), None


define(Op.GATHER, _indexed, _gather_np, _gather_vjp)
define(Op.SCATTER_ADD, _indexed, _scatter_add_np, _scatter_add_vjp)

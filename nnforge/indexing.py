"""Indexing by data: ``gather`` (torch.gather), ``take_along_axis``, ``index_select`` and ``scatter_add``; and
``set_at``, an assignment ``x[index] = value`` as a new tensor.

Each is one ``GATHER`` or ``SCATTER_ADD`` node (plus broadcasts and slices, which are index expressions), so a
lattice that reads scores by state index (the CTC-CRF) costs one load per element, not a one-hot matmul. Index
values are checked where they are known: a constant index when the op is built, any index when the reference
backend runs it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import DTypeError, ShapeError, at
from .ir.build import make
from .ir.ops import Op, fmt_shape
from .tensor import Tensor, _axis, _basic_index, arange, as_tensor, broadcast_shapes, full, where

__all__ = ["gather", "index_select", "scatter_add", "set_at", "take_along_axis"]


def _index(index: Any, op: str) -> Tensor:
    index = index if isinstance(index, Tensor) else Tensor(np.asarray(index))
    if not index.dtype.is_int:
        raise DTypeError(at(f"{op}: index must be an int32 or int64 tensor, got {index.dtype}"))
    return index


def _check_values(index: Tensor, size: Any, axis: int, op: str) -> None:
    """A constant index is checked now, at the user's line; others when the program runs (reference backend)."""
    if index.node.op != Op.DATA or index.numel() == 0:
        return
    a = index.node.attrs["array"]
    bad = (a < 0) | (a >= int(size))
    if bad.any():
        pos = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ShapeError(at(f"{op}: index {int(a[pos])} at position {list(pos)} is out of range for size "
                            f"{int(size)} along axis {axis}"))


def gather(x: Any, axis: int, index: Any) -> Tensor:
    """``out[i] = x[i with i[axis] := index[i]]``, torch.gather's semantics: ``index`` has ``x``'s rank and, off
    ``axis``, sizes no larger than ``x``'s; the result has ``index``'s shape. Differentiable in ``x``."""
    x, index = as_tensor(x), _index(index, "gather")
    if index.ndim != x.ndim:
        raise ShapeError(at(f"gather: index {fmt_shape(index.shape)} must have the rank of x {fmt_shape(x.shape)}"))
    axis = _axis(axis, x.ndim, "gather")
    if any(int(i) > int(d) for k, (i, d) in enumerate(zip(index.shape, x.shape)) if k != axis):
        raise ShapeError(at(f"gather: index {fmt_shape(index.shape)} is larger than x {fmt_shape(x.shape)} off "
                            f"axis {axis}"))
    _check_values(index, x.shape[axis], axis, "gather")
    if any(int(i) != int(d) for k, (i, d) in enumerate(zip(index.shape, x.shape)) if k != axis):
        x = x[tuple(slice(None) if k == axis else slice(0, i) for k, i in enumerate(index.shape))]
    return Tensor(make(Op.GATHER, (x.node, index.node), {"axis": axis}))


def take_along_axis(x: Any, indices: Any, axis: int) -> Tensor:
    """numpy's ``take_along_axis``: ``x`` and ``indices`` broadcast against each other off ``axis``."""
    x, indices = as_tensor(x), _index(indices, "take_along_axis")
    if indices.ndim != x.ndim:
        raise ShapeError(at(f"take_along_axis: indices {fmt_shape(indices.shape)} must have the rank of x "
                            f"{fmt_shape(x.shape)}"))
    axis = _axis(axis, x.ndim, "take_along_axis")
    _check_values(indices, x.shape[axis], axis, "take_along_axis")
    off = [(d, i) for k, (d, i) in enumerate(zip(x.shape, indices.shape)) if k != axis]
    shape = list(broadcast_shapes(tuple(d for d, _ in off), tuple(i for _, i in off), op="take_along_axis"))
    x = x.expand(*shape[:axis], x.shape[axis], *shape[axis:])
    indices = indices.expand(*shape[:axis], indices.shape[axis], *shape[axis:])
    return gather(x, axis, indices)


def index_select(x: Any, axis: int, index: Any) -> Tensor:
    """torch.index_select: the slices of ``x`` along ``axis`` named by the 1-d ``index``, in its order."""
    x, index = as_tensor(x), _index(index, "index_select")
    if index.ndim != 1:
        raise ShapeError(at(f"index_select: index must be 1-d, got {fmt_shape(index.shape)}"))
    axis = _axis(axis, x.ndim, "index_select")
    _check_values(index, x.shape[axis], axis, "index_select")
    k = index.shape[0]
    index = index.reshape(*[k if a == axis else 1 for a in range(x.ndim)])
    return gather(x, axis, index.expand(*[k if a == axis else d for a, d in enumerate(x.shape)]))


def scatter_add(x: Any, axis: int, index: Any, src: Any) -> Tensor:
    """torch.scatter_add (out of place): ``x`` plus each ``src[i]`` added at ``i with i[axis] := index[i]``;
    repeated indices all add. ``index`` has ``src``'s rank, sizes no larger than ``src``'s, and off ``axis`` no
    larger than ``x``'s. Differentiable in ``x`` and ``src``."""
    x, index = as_tensor(x), _index(index, "scatter_add")
    src = src if isinstance(src, Tensor) else Tensor(np.asarray(src), dtype=x.dtype)  # plain data takes x's dtype
    if not index.ndim == src.ndim == x.ndim:
        raise ShapeError(at(f"scatter_add: x {fmt_shape(x.shape)}, index {fmt_shape(index.shape)} and src "
                            f"{fmt_shape(src.shape)} must have one rank"))
    axis = _axis(axis, x.ndim, "scatter_add")
    if any(int(i) > int(s) for i, s in zip(index.shape, src.shape)) or any(
            int(i) > int(d) for k, (i, d) in enumerate(zip(index.shape, x.shape)) if k != axis):
        raise ShapeError(at(f"scatter_add: index {fmt_shape(index.shape)} is larger than src {fmt_shape(src.shape)} "
                            f"or, off axis {axis}, than x {fmt_shape(x.shape)}"))
    if src.dtype != x.dtype:
        raise DTypeError(at(f"scatter_add: src is {src.dtype} but x is {x.dtype}"))
    _check_values(index, x.shape[axis], axis, "scatter_add")
    if any(int(i) != int(s) for i, s in zip(index.shape, src.shape)):
        src = src[tuple(slice(0, i) for i in index.shape)]
    out = Tensor(make(Op.SCATTER_ADD, (src.node, index.node), {"axis": axis, "size": x.shape[axis]}))
    pads = tuple((0, 0) if k == axis else (0, int(d) - int(i)) for k, (i, d) in enumerate(zip(index.shape, x.shape)))
    if any(hi for _, hi in pads):
        out = out.pad(pads)
    return x + out


def set_at(x: Any, index: Any, value: Any) -> Tensor:
    """``x`` with ``x[index]`` replaced by ``value`` (broadcast to that selection), what ``x[index] = value`` does
    in torch and ``x.at[index].set(value)`` in JAX, as a new tensor. Basic indices: ints, slices of step 1 or -1,
    None, one Ellipsis. The gradient reaches ``value`` from the selection and ``x`` everywhere else."""
    x = as_tensor(x)
    selection = x[index]  # checks the index, and gives the shape value broadcasts to
    starts, stops, steps, kinds = _basic_index(x, index)
    if any(abs(s) != 1 for s in steps):
        raise ShapeError(at(f"set_at: slice steps {tuple(steps)} on {fmt_shape(x.shape)}: an assignment takes "
                            f"steps of 1 or -1"))
    if not isinstance(value, (bool, int, float, Tensor)):  # an array or a nested list: a tensor like any other
        value = as_tensor(value)
    if isinstance(value, Tensor):
        try:
            value = value.cast(x.dtype).expand(*selection.shape)
        except ShapeError:
            raise ShapeError(at(f"set_at: a value of {fmt_shape(value.shape)} does not broadcast to the selection "
                                f"{fmt_shape(selection.shape)} of {fmt_shape(x.shape)}")) from None
        # as many axes as x: the selection's, a 1 for each int index, without the None axes
        sizes, kept = [], iter(selection.shape)
        for kind in kinds:
            if kind == "new":
                next(kept)
            elif kind == "keep":
                sizes.append(next(kept))
            else:
                sizes.append(1)
        value = value.reshape(*sizes)
    mask = None
    for a, (lo, hi, step, d) in enumerate(zip(starts, stops, steps, x.shape)):
        if int(lo) == 0 and int(hi) == int(d) and step == 1:
            continue
        p = arange(d).reshape(*[d if k == a else 1 for k in range(x.ndim)])
        chosen = (p >= lo) & (p < hi) if step == 1 else (p <= lo) & (p > hi)
        mask = chosen if mask is None else mask & chosen
        if not isinstance(value, Tensor):
            continue
        count = value.shape[a]  # value's element for each position of x along a
        if int(count) == 0:
            return x
        if int(count) == 1:
            value = value.expand(*[d if k == a else n for k, n in enumerate(value.shape)])
        elif not (step == 1 and int(lo) == 0 and int(count) == int(d)):
            value = index_select(value, a, (arange(d) - lo if step == 1 else lo - arange(d)).clamp(0, count - 1))
    if mask is None:  # the whole tensor
        return value.expand(*x.shape) if isinstance(value, Tensor) else full(x.shape, value, x.dtype)
    return where(mask, value, x).cast(x.dtype)

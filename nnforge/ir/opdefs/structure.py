"""Leaves (placeholders, constants, data, random numbers, feeders) and the multi-result structure ops (scan,
loop, receiver, read through ``proj``).

Only the pure ones have a numpy rule here: placeholders, random draws, host I/O and loop bodies need the
interpreter's own state, so ``nnforge.codegen.reference`` runs them. None has a vjp of its own: autodiff
differentiates a scan as a reversed scan (``nnforge.autodiff.scan``) and refuses a loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ...dtypes import from_numpy
from ..node import Node
from ..ops import Op
from ..registry import Type, define


def _leaf(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    return tuple(attrs["shape"]), attrs["dtype"]


def _data(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    return tuple(attrs["array"].shape), from_numpy(attrs["array"].dtype)


def _const_np(node: Node, args: Sequence[np.ndarray]) -> np.ndarray:
    value = node.attrs["value"]
    return np.full(tuple(map(int, node.shape)), int(value) if isinstance(value, int) else value, dtype=node.dtype.np)


def _proj(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    return srcs[0].types[attrs["index"]]


def _multi(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    return None, None  # result types are computed by the builder of scan / loop / receiver


define(Op.CONST, _leaf, _const_np)
define(Op.DATA, _data, lambda n, a: n.attrs["array"])
define((Op.INPUT, Op.RAND, Op.FEEDER), _leaf)
define(Op.PROJ, _proj, lambda n, a: a[0][n.attrs["index"]])
define((Op.SCAN, Op.LOOP, Op.RECEIVER), _multi)

"""What the op families share: operand checks for shape rules, float32 widening for numpy rules."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...dtypes import DType
from ...errors import DTypeError, ShapeError
from ..ops import Op, fmt_shape

_HALF_NP = (DType.float16.np, DType.bfloat16.np)


def same_shape(op: Op, srcs: Sequence) -> None:
    shapes = [s.shape for s in srcs]
    if any(tuple(map(int, s)) != tuple(map(int, shapes[0])) for s in shapes[1:]):
        raise ShapeError(f"{op.name.lower()}: operand shapes differ: {', '.join(fmt_shape(s) for s in shapes)}")


def same_dtype(op: Op, srcs: Sequence) -> None:
    dts = [s.dtype for s in srcs]
    if any(d != dts[0] for d in dts[1:]):
        raise DTypeError(f"{op.name.lower()}: operand dtypes differ: {', '.join(map(str, dts))}")


def wide(a: np.ndarray) -> np.ndarray:
    """Half precision computed in float32 and rounded once per op (by the caller), as PyTorch does on CPUs."""
    return a.astype(np.float32) if a.dtype in _HALF_NP else a


def is_half(a: np.ndarray) -> bool:
    return a.dtype in _HALF_NP

"""Elementwise ops: unary math, binary arithmetic, comparisons, where and cast.

Each ``define`` line is one op: its shape/dtype rule, its numpy reference (half precision computed in float32
and rounded once, as PyTorch does on CPUs) and its vjp. Operands have identical shapes and dtypes: the frontend
inserts the casts and broadcasts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ...dtypes import DType
from ...errors import DTypeError
from .. import builders as b
from ..node import Node
from ..ops import COMPARE, FLOAT_ONLY, Op
from ..registry import Type, define
from .common import is_half, same_dtype, same_shape, wide

# ---- shape/dtype rules --------------------------------------------------------------------------------------


def _unary(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    (x,) = srcs
    if op in FLOAT_ONLY and not x.dtype.is_float:
        raise DTypeError(f"{op.name.lower()}: needs a float tensor, got {x.dtype}")
    if x.dtype == DType.bool and op in (Op.NEG, Op.SIGN):
        raise DTypeError(f"{op.name.lower()}: not defined for bool")
    return x.shape, x.dtype


def _binary(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    same_shape(op, srcs)
    same_dtype(op, srcs)
    if op in COMPARE:
        return srcs[0].shape, DType.bool
    if srcs[0].dtype == DType.bool and op not in (Op.MAX, Op.MIN, Op.MUL):
        raise DTypeError(f"{op.name.lower()}: not defined for bool tensors")
    return srcs[0].shape, srcs[0].dtype


def _where(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    c, x, y = srcs
    same_shape(op, srcs)
    if c.dtype != DType.bool:
        raise DTypeError(f"where: condition must be bool, got {c.dtype}")
    same_dtype(op, (x, y))
    return x.shape, x.dtype


def _cast(op: Op, srcs: tuple, attrs: Mapping) -> Type:
    return srcs[0].shape, attrs["dtype"]


# ---- numpy --------------------------------------------------------------------------------------------------


def _np(fn: Callable[..., np.ndarray]) -> Callable[[Node, Sequence[np.ndarray]], np.ndarray]:
    """The numpy rule of an elementwise op computed by ``fn``: widened operands, IEEE specials kept quiet."""

    def rule(node: Node, args: Sequence[np.ndarray]) -> np.ndarray:
        with np.errstate(all="ignore"):
            out = fn(*[wide(a) for a in args])
        return np.asarray(out).astype(node.dtype.np, copy=False)

    return rule


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.where(x >= 0, 1 / (1 + np.exp(-np.abs(x))), np.exp(-np.abs(x)) / (1 + np.exp(-np.abs(x))))


_ERF = np.frompyfunc(math.erf, 1, 1)


def _erf(x: np.ndarray) -> np.ndarray:
    """libm's erf (within an ulp in float64; numpy has none, and the interpreter is the ground truth)."""
    return np.asarray(_ERF(np.asarray(x, np.float64)), np.float64).astype(x.dtype, copy=False)


def _sign(x: np.ndarray) -> np.ndarray:
    """torch's sign: 0 at NaN (numpy's is NaN)."""
    return np.where(np.isnan(x), 0, np.sign(x)) if x.dtype.kind == "f" else np.sign(x)


def _pow(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """An integer to a negative power is torch's: 1 for 1, +-1 for -1, else 0 (the quotient's integer part)."""
    if np.issubdtype(x.dtype, np.integer):
        negative = y < 0
        power = np.power(x, np.where(negative, 0, y))
        fraction = np.where(x == 1, 1, np.where(x == -1, np.where(y % 2 == 0, 1, -1), 0))
        return np.where(negative, fraction, power).astype(power.dtype)
    return np.power(x, y)


def _divide(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if np.issubdtype(x.dtype, np.integer):
        return np.floor_divide(x, y)
    return np.divide(x, y)


def _cast_np(node: Node, args: Sequence[np.ndarray]) -> np.ndarray:
    x = args[0]
    target = node.dtype
    if target.is_int and x.dtype.kind == "f":
        x = np.trunc(wide(x))  # float -> int truncates toward zero, as in C and PyTorch
    if target in (DType.float16, DType.bfloat16) and is_half(x):
        x = x.astype(np.float32)
    return x.astype(target.np)


# ---- vjp ----------------------------------------------------------------------------------------------------


def _maxmin_vjp(n: Node, g: Node) -> tuple:
    """Ties split the gradient in half, as PyTorch's maximum/minimum do."""
    x, y = n.srcs
    pick_x = b.lt(y, x) if n.op == Op.MAX else b.lt(x, y)
    tie = b.eq(x, y)
    half = b.mul(g, 0.5)
    gx = b.where(pick_x, g, b.where(tie, half, b.zeros_like(g)))
    gy = b.where(pick_x, b.zeros_like(g), b.where(tie, half, g))
    return gx, gy


def _pow_vjp(n: Node, g: Node) -> tuple:
    """torch's rules: d/dx is 0 where the exponent is 0 (x^0 is constant in x, even at 0 where x^-1 is inf);
    d/dy = x^y log(x) is 0 only at x = 0 with y >= 0, and NaN (x < 0) or -inf (x = 0, y < 0) stay visible."""
    x, y = n.srcs
    gx = b.where(b.eq(y, 0), b.zeros_like(x), b.mul(b.mul(g, y), b.pow(x, b.sub(y, 1))))
    at_zero = b.logical_and(b.eq(x, 0), b.le(0, y))
    gy = b.mul(g, b.where(at_zero, b.zeros_like(x), b.mul(n, b.log(x))))
    return gx, gy


def _where_vjp(n: Node, g: Node) -> tuple:
    c = n.srcs[0]
    return None, b.where(c, g, b.zeros_like(g)), b.where(c, b.zeros_like(g), g)


def _cast_vjp(n: Node, g: Node) -> tuple:
    x = n.srcs[0]
    return (b.cast(g, x.dtype) if x.dtype.is_float else None,)


_TWO_OVER_SQRT_PI = 2 / math.sqrt(math.pi)

# ---- the ops ------------------------------------------------------------------------------------------------

define(Op.NEG, _unary, _np(np.negative), lambda n, g: (b.neg(g),))
define(Op.EXP, _unary, _np(np.exp), lambda n, g: (b.mul(g, n),))
define(Op.LOG, _unary, _np(np.log), lambda n, g: (b.div(g, n.srcs[0]),))
define(Op.SQRT, _unary, _np(np.sqrt), lambda n, g: (b.div(b.mul(g, 0.5), n),))
define(Op.RECIP, _unary, _np(np.reciprocal), lambda n, g: (b.mul(b.mul(b.neg(g), n), n),))
define(Op.SIN, _unary, _np(np.sin), lambda n, g: (b.mul(g, b.cos(n.srcs[0])),))
define(Op.COS, _unary, _np(np.cos), lambda n, g: (b.mul(b.neg(g), b.sin(n.srcs[0])),))
define(Op.TANH, _unary, _np(np.tanh), lambda n, g: (b.mul(g, b.sub(1, b.mul(n, n))),))
define(Op.SIGMOID, _unary, _np(_sigmoid), lambda n, g: (b.mul(b.mul(g, n), b.sub(1, n)),))
define(Op.ERF, _unary, _np(_erf),
       lambda n, g: (b.mul(b.mul(g, _TWO_OVER_SQRT_PI), b.exp(b.mul(b.neg(n.srcs[0]), n.srcs[0]))),))
define(Op.LOG1P, _unary, _np(np.log1p), lambda n, g: (b.div(g, b.add(n.srcs[0], 1)),))
define(Op.EXPM1, _unary, _np(np.expm1), lambda n, g: (b.mul(g, b.add(n, 1)),))
define(Op.ABS, _unary, _np(np.abs), lambda n, g: (b.mul(g, b.sign(n.srcs[0])),))
define(Op.SIGN, _unary, _np(_sign), lambda n, g: (None,))

define(Op.ADD, _binary, _np(np.add), lambda n, g: (g, g))
define(Op.SUB, _binary, _np(np.subtract), lambda n, g: (g, b.neg(g)))
define(Op.MUL, _binary, _np(np.multiply), lambda n, g: (b.mul(g, n.srcs[1]), b.mul(g, n.srcs[0])))
define(Op.DIV, _binary, _np(_divide),
       lambda n, g: (b.div(g, n.srcs[1]), b.div(b.mul(b.neg(g), n), n.srcs[1])))
define(Op.POW, _binary, _np(_pow), _pow_vjp)
define(Op.MAX, _binary, _np(np.maximum), _maxmin_vjp)
define(Op.MIN, _binary, _np(np.minimum), _maxmin_vjp)

define(Op.LT, _binary, _np(np.less))
define(Op.LE, _binary, _np(np.less_equal))
define(Op.EQ, _binary, _np(np.equal))
define(Op.NE, _binary, _np(np.not_equal))

define(Op.WHERE, _where, _np(np.where), _where_vjp)
define(Op.CAST, _cast, _cast_np, _cast_vjp)

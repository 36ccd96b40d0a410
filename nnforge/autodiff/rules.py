"""One vector-Jacobian product per op.

Each rule gets the node, its sources and its own value as Tensors plus the cotangent ``g`` of its result, and
returns one cotangent per source (None where no gradient flows). Rules are written with the frontend ops, so
they are traced into IR like any user code and can themselves be differentiated.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ..ir.build import make
from ..ir.node import Node
from ..ir.ops import Op
from ..tensor import Tensor, full, where

Rule = Callable[[Node, list[Tensor], Tensor, Tensor], tuple]


def _zeros(x: Tensor) -> Tensor:
    return full(x.shape, 0, x.dtype)


def _sum_to(g: Tensor, shape: tuple) -> Tensor:
    """Undo an EXPAND: sum the broadcast axes back to size 1."""
    axes = tuple(i for i, (a, b) in enumerate(zip(g.shape, shape)) if int(a) != int(b))
    return g.sum(axes, keepdims=True) if axes else g


def _slice_vjp(n: Node, x: Tensor, g: Tensor) -> Tensor:
    """Scatter ``g`` back into zeros of x's shape: per axis, strided steps are re-spread and edges padded."""
    a = n.attrs
    for ax, (start, step) in enumerate(zip(a["starts"], a["steps"])):
        size, count = x.shape[ax], g.shape[ax]
        if int(count) == 0:
            return _zeros(x)
        if step < 0:
            g = g.flip(ax)
            start = start + (count - 1) * step
            step = -step
        if step > 1:
            g = g.unsqueeze(ax + 1)
            g = g.pad(tuple((0, step - 1) if i == ax + 1 else (0, 0) for i in range(g.ndim)))
            g = g.reshape(*g.shape[:ax], count * step, *g.shape[ax + 2:])
            span = (count - 1) * step + 1
            g = g[tuple(slice(0, span) if i == ax else slice(None) for i in range(g.ndim))]
        else:
            span = count
        g = g.pad(tuple((start, size - start - span) if i == ax else (0, 0) for i in range(g.ndim)))
    return g


def _maxmin_vjp(n: Node, a: Tensor, b: Tensor, g: Tensor) -> tuple:
    """Ties split the gradient in half, as PyTorch's maximum/minimum do."""
    pick_a = (a > b) if n.op == Op.MAX else (a < b)
    tie = a == b
    half = g * 0.5
    ga = where(pick_a, g, where(tie, half, _zeros(g)))
    gb = where(pick_a, _zeros(g), where(tie, half, g))
    return ga, gb


def _reduce_max_vjp(n: Node, x: Tensor, y: Tensor, g: Tensor) -> Tensor:
    """Spread evenly over the maxima (amax semantics)."""
    axes = n.attrs["axes"]
    keep = y if n.attrs["keepdims"] else y.reshape(*[1 if i in axes else d for i, d in enumerate(x.shape)])
    gk = g if n.attrs["keepdims"] else g.reshape(*keep.shape)
    mask = (x == keep.expand(*x.shape)).cast(x.dtype)
    count = mask.sum(axes, keepdims=True)
    return mask * (gk / count).expand(*x.shape)


def _sum_vjp(n: Node, x: Tensor, g: Tensor) -> Tensor:
    axes = n.attrs["axes"]
    if not n.attrs["keepdims"]:
        g = g.reshape(*[1 if i in axes else d for i, d in enumerate(x.shape)])
    return g.expand(*x.shape)


def _pad_vjp(n: Node, g: Tensor) -> Tensor:
    return g[tuple(slice(lo, lo + d) for (lo, _), d in zip(n.attrs["pads"], n.srcs[0].shape))]


def _concat_vjp(n: Node, g: Tensor) -> tuple:
    ax = n.attrs["axis"]
    return tuple(g.split([s.shape[ax] for s in n.srcs], ax))


def _pow_vjp(a: Tensor, b: Tensor, y: Tensor, g: Tensor) -> tuple:
    """torch's rules: d/da is 0 where the exponent is 0 (b^0 is constant in b, even at 0 where b^-1 is inf);
    d/db = y log(a) is 0 only at a = 0 with b >= 0, and NaN (a < 0) or -inf (a = 0, b < 0) stay visible."""
    ga = where(b == 0, _zeros(a), g * b * a ** (b - 1))
    gb = g * where((a == 0) & (b >= 0), _zeros(a), y * a.log())
    return ga, gb


def _indexed(op: Op, g: Tensor, index: Tensor, axis: int, size: object = None) -> Tensor:
    """GATHER and SCATTER_ADD are each other's transpose: the vjp of one is the other on the same index."""
    attrs = {"axis": axis} if op == Op.GATHER else {"axis": axis, "size": size}
    return Tensor(make(op, (g.node, index.node), attrs))


def _inv_perm(perm: tuple) -> tuple:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


VJP: dict[Op, Rule] = {
    Op.NEG: lambda n, s, y, g: (-g,),
    Op.EXP: lambda n, s, y, g: (g * y,),
    Op.LOG: lambda n, s, y, g: (g / s[0],),
    Op.SQRT: lambda n, s, y, g: (g * 0.5 / y,),
    Op.RECIP: lambda n, s, y, g: (-g * y * y,),
    Op.SIN: lambda n, s, y, g: (g * s[0].cos(),),
    Op.COS: lambda n, s, y, g: (-g * s[0].sin(),),
    Op.TANH: lambda n, s, y, g: (g * (1 - y * y),),
    Op.SIGMOID: lambda n, s, y, g: (g * y * (1 - y),),
    Op.ERF: lambda n, s, y, g: (g * (2 / math.sqrt(math.pi)) * (-s[0] * s[0]).exp(),),
    Op.ABS: lambda n, s, y, g: (g * s[0].sign(),),
    Op.SIGN: lambda n, s, y, g: (None,),
    Op.ADD: lambda n, s, y, g: (g, g),
    Op.SUB: lambda n, s, y, g: (g, -g),
    Op.MUL: lambda n, s, y, g: (g * s[1], g * s[0]),
    Op.DIV: lambda n, s, y, g: (g / s[1], -g * y / s[1]),
    Op.POW: lambda n, s, y, g: _pow_vjp(s[0], s[1], y, g),
    Op.MAX: lambda n, s, y, g: _maxmin_vjp(n, s[0], s[1], g),
    Op.MIN: lambda n, s, y, g: _maxmin_vjp(n, s[0], s[1], g),
    Op.WHERE: lambda n, s, y, g: (None, where(s[0], g, _zeros(g)), where(s[0], _zeros(g), g)),
    Op.CAST: lambda n, s, y, g: (g.cast(s[0].dtype) if s[0].dtype.is_float else None,),
    Op.SUM: lambda n, s, y, g: (_sum_vjp(n, s[0], g),),
    Op.REDUCE_MAX: lambda n, s, y, g: (_reduce_max_vjp(n, s[0], y, g),),
    Op.MATMUL: lambda n, s, y, g: (g @ s[1].mT, s[0].mT @ g),
    Op.RESHAPE: lambda n, s, y, g: (None if n.attrs.get("detach") else g.reshape(*s[0].shape),),
    Op.PERMUTE: lambda n, s, y, g: (g.permute(*_inv_perm(n.attrs["perm"])),),
    Op.EXPAND: lambda n, s, y, g: (_sum_to(g, s[0].shape),),
    Op.SLICE: lambda n, s, y, g: (_slice_vjp(n, s[0], g),),
    Op.PAD: lambda n, s, y, g: (_pad_vjp(n, g),),
    Op.CONCAT: lambda n, s, y, g: _concat_vjp(n, g),
    Op.GATHER: lambda n, s, y, g: (_indexed(Op.SCATTER_ADD, g, s[1], n.attrs["axis"], s[0].shape[n.attrs["axis"]]),
                                   None),
    Op.SCATTER_ADD: lambda n, s, y, g: (_indexed(Op.GATHER, g, s[1], n.attrs["axis"]), None),
}

NO_GRAD = frozenset({Op.LT, Op.LE, Op.EQ, Op.NE, Op.INPUT, Op.CONST, Op.DATA, Op.RAND, Op.FEEDER, Op.RECEIVER})

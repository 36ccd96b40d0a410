"""Movement ops as index expressions: how a kernel reads a node through reshape/permute/expand/slice.

Backend-neutral: ``index_map`` maps an output index (one ``Expr`` per axis) to the source's index, for any movement
op; ``strided`` describes a chain of strided movements over a stored buffer as (base, offset, strides), which is
what a GEMM needs to read its operands without a copy. A backend prints the expressions; ``size`` says how a size
becomes an expression (the C renderer turns sizes it knows statically into constants, so they fold).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TypeVar

from .dims import same_product
from .expr import ZERO, Expr, contiguous_strides, floordiv, mod, row_major
from .expr import size as size_expr
from .node import Node
from .ops import Op

B = TypeVar("B")
SizeOf = Callable[[int], Expr]


def sliced_index(i: Expr, start: Expr, step: int = 1) -> Expr:
    """The source index that output index ``i`` of a slice (``start``, ``step``; a negative step reads backwards)
    reads."""
    return start + i * step


def squeeze_map(out_shape: Sequence[int], in_shape: Sequence[int]) -> list[int | None] | None:
    """For a reshape that only adds/drops size-1 axes: for each input axis, the output axis it reads (None for
    a size-1 axis). None when the reshape really regroups elements."""
    a = [i for i, d in enumerate(out_shape) if int(d) != 1]
    b = [i for i, d in enumerate(in_shape) if int(d) != 1]
    if [int(out_shape[i]) for i in a] != [int(in_shape[i]) for i in b]:
        return None
    m: list[int | None] = [None] * len(in_shape)
    for i, j in zip(b, a):
        m[i] = j
    return m


def index_map(n: Node, idx: Sequence[Expr], size: SizeOf = size_expr) -> list[Expr]:
    """Index into ``n.srcs[0]`` read by output index ``idx`` of movement node ``n`` (not pad/concat)."""
    src = n.srcs[0]
    if n.op == Op.PERMUTE:
        out = [ZERO] * len(idx)
        for i, p in enumerate(n.attrs["perm"]):
            out[p] = idx[i]
        return out
    if n.op == Op.EXPAND:
        return [ZERO if int(s) == 1 and int(d) != 1 else i for i, s, d in zip(idx, src.shape, n.shape)]
    if n.op == Op.SLICE:
        return [sliced_index(i, size(a), s) for i, a, s in zip(idx, n.attrs["starts"], n.attrs["steps"])]
    if n.op == Op.RESHAPE:
        out = [ZERO] * src.ndim  # a squeeze is blocks of one axis each: every index read as is
        for o_axes, i_axes in reshape_blocks(_as_built(n.shape, size), _as_built(src.shape, size)):
            lin = row_major([idx[a] for a in o_axes], [size(n.shape[a]) for a in o_axes])
            ishape = [size(src.shape[a]) for a in i_axes]
            for k, (a, d, st) in enumerate(zip(i_axes, ishape, contiguous_strides(ishape))):
                q = floordiv(lin, st)
                out[a] = q if k == 0 else mod(q, d)
        return out
    raise ValueError(f"no index map for {n.op}")


def _as_built(shape: Sequence[int], size: SizeOf) -> list[int]:
    """``shape`` with each size the program fixes as its number: two symbols of one value (a cotangent's ``T`` and
    the input's, each traced as its own) are then the same size, and their axes separate blocks."""
    return [e.value if (e := size(d)).value is not None else d for d in shape]


def reshape_blocks(out_shape: Sequence[int], in_shape: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """The axes of a reshape in blocks that map onto each other alone: (output axes, input axes) whose sizes have
    the same product for every value of the sizes (the input's ``[N, C, L]`` read as ``[N, C, L // 5, 5]``: three
    blocks). Each block's input index then comes from its own output indices: ``q // 5`` and ``q % 5``, not a
    division of the whole flat offset by ``80 * (L // 5)``, which no compiler can simplify. Size-1 axes are left
    out (their index is 0). Blocks whose products agree only at the current sizes are merged with the next."""
    outs = [a for a, d in enumerate(out_shape) if int(d) != 1]
    ins = [a for a, d in enumerate(in_shape) if int(d) != 1]
    blocks: list[tuple[list[int], list[int]]] = []
    o_blk: list[int] = []
    i_blk: list[int] = []
    i = j = 0
    while i < len(outs) or j < len(ins):
        po = math.prod(out_shape[a] for a in o_blk)  # Dims multiply symbolically
        pi = math.prod(in_shape[a] for a in i_blk)
        if o_blk and i_blk and int(po) == int(pi) and same_product(po, pi):
            blocks.append((o_blk, i_blk))
            o_blk, i_blk = [], []
        elif j >= len(ins) or (i < len(outs) and int(po) <= int(pi)):
            o_blk.append(outs[i])
            i += 1
        else:
            i_blk.append(ins[j])
            j += 1
    if o_blk or i_blk:
        blocks.append((o_blk, i_blk))
    return blocks


Strided = tuple[B, Expr, list[Expr]]  # (base buffer, offset, stride per axis)


def strided(n: Node, buffer_of: Callable[[Node], B | None], size: SizeOf = size_expr) -> Strided | None:
    """(base, offset, strides) of ``n`` read as a strided view of a stored buffer (``buffer_of`` gives the base of
    a stored node, None for others), or None when it is not one (a regrouping reshape of a view)."""
    ptr = buffer_of(n)
    if ptr is not None:
        return ptr, ZERO, contiguous_strides([size(d) for d in n.shape])
    if n.op not in (Op.PERMUTE, Op.EXPAND, Op.SLICE, Op.RESHAPE):
        return None
    base = strided(n.srcs[0], buffer_of, size)
    if base is None:
        return None
    ptr, off, st = base
    src = n.srcs[0]
    if n.op == Op.PERMUTE:
        return ptr, off, [st[p] for p in n.attrs["perm"]]
    if n.op == Op.EXPAND:
        return ptr, off, [ZERO if int(s) == 1 and int(d) != 1 else t for s, d, t in zip(src.shape, n.shape, st)]
    if n.op == Op.SLICE:
        for a, t in zip(n.attrs["starts"], st):
            off = off + size(a) * t
        return ptr, off, [t * s for t, s in zip(st, n.attrs["steps"])]
    m = squeeze_map(n.shape, src.shape)
    if m is None:
        return None
    out = [ZERO] * n.ndim
    for i, j in enumerate(m):
        if j is not None:
            out[j] = st[i]
    return ptr, off, out

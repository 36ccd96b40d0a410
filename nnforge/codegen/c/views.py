"""Movement ops as index expressions: how a kernel reads a node through reshape/permute/expand/slice.

Two forms: ``index_map`` maps an output index (C expressions, one per axis) to the source's index, for any
movement op; ``strided`` describes a chain of strided movements over a contiguous buffer as (offset, strides),
which is what a GEMM needs to read its operands without a copy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ...ir.node import Node
from ...ir.ops import Op
from .cexpr import Sizes, flat


def contiguous_strides(shape: Sequence[str]) -> list[str]:
    out = []
    acc = "1"
    for d in reversed(shape):
        out.append(acc)
        acc = d if acc == "1" else f"{acc} * {d}"
    return list(reversed(out))


def _mul(a: str, b: str) -> str:
    if a == "0" or b == "0":
        return "0"
    if a == "1":
        return b
    if b == "1":
        return a
    return f"({a}) * ({b})"


def _add(a: str, b: str) -> str:
    if a == "0":
        return b
    if b == "0":
        return a
    return f"{a} + {b}"


def sliced_index(i: str, start: str, step: int = 1) -> str:
    """The source index that output index ``i`` of a slice (``start``, ``step``) reads."""
    return _add(start, _mul(i, str(step))) if step != 1 or start != "0" else i


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


def index_map(n: Node, idx: Sequence[str], sz: Sizes) -> list[str]:
    """Index into ``n.srcs[0]`` read by output index ``idx`` of movement node ``n`` (not pad/concat)."""
    src = n.srcs[0]
    if n.op == Op.PERMUTE:
        out = ["0"] * len(idx)
        for i, p in enumerate(n.attrs["perm"]):
            out[p] = idx[i]
        return out
    if n.op == Op.EXPAND:
        return ["0" if int(s) == 1 and int(d) != 1 else i for i, s, d in zip(idx, src.shape, n.shape)]
    if n.op == Op.SLICE:
        out = []
        for i, a, s in zip(idx, n.attrs["starts"], n.attrs["steps"]):
            out.append(sliced_index(i, sz(a), s))
        return out
    if n.op == Op.RESHAPE:
        m = squeeze_map(n.shape, src.shape)
        if m is not None:
            return ["0" if j is None else idx[j] for j in m]
        oshape = [sz(d) for d in n.shape]
        lin = flat(idx, oshape)
        ishape = [sz(d) for d in src.shape]
        strides = contiguous_strides(ishape)
        out = []
        for k, (d, st) in enumerate(zip(ishape, strides)):
            q = lin if st == "1" else f"({lin}) / ({st})"
            out.append(q if k == 0 else f"({q}) % ({d})")
        return out
    raise ValueError(f"no index map for {n.op}")


Strided = tuple[str, str, list[str]]  # (pointer expr, offset expr, stride per axis)


def strided(n: Node, buffer_of: Callable[[Node], str | None], sz: Sizes) -> Strided | None:
    """(pointer, offset, strides) of ``n`` read as a strided view of a stored buffer, or None."""
    ptr = buffer_of(n)
    if ptr is not None:
        return ptr, "0", contiguous_strides([sz(d) for d in n.shape])
    if n.op not in (Op.PERMUTE, Op.EXPAND, Op.SLICE, Op.RESHAPE):
        return None
    base = strided(n.srcs[0], buffer_of, sz)
    if base is None:
        return None
    ptr, off, st = base
    src = n.srcs[0]
    if n.op == Op.PERMUTE:
        return ptr, off, [st[p] for p in n.attrs["perm"]]
    if n.op == Op.EXPAND:
        return ptr, off, ["0" if int(s) == 1 and int(d) != 1 else t for s, d, t in zip(src.shape, n.shape, st)]
    if n.op == Op.SLICE:
        for a, t in zip(n.attrs["starts"], st):
            off = _add(off, _mul(sz(a), t))
        return ptr, off, [_mul(t, str(s)) for t, s in zip(st, n.attrs["steps"])]
    m = squeeze_map(n.shape, src.shape)
    if m is None:
        return None
    out = ["0"] * n.ndim
    for i, j in enumerate(m):
        if j is not None:
            out[j] = st[i]
    return ptr, off, out

"""Reductions arranged for parallel hardware and for half precision.

``nested_half_sums``: a half-precision sum of a half-precision sum is one sum. Autodiff sums a bias's gradient
over a sequence's steps and then its batch rows (``[T, N, G] -> [N, G] -> [G]``); in float16 the partial sums
were rounded to float16 in between, an error the one sum (accumulating in float32) does not make.

``split_long_sums``: a sum (or max) with few outputs over a long leading axis runs in two parallel steps.

A reduction kernel parallelizes over its outputs. A training step's loss, ``(ys * cot).sum()`` over a [T, N, H]
sequence, has one output and T * N * H summands: one GPU program read all of them (49 M at T = 500, N = 1024,
H = 96: 198 ms of a 200 ms ModelView training cell on an H200, the card at idle power, where the whole
forward and backward through time took the rest). Summed over the leading axis first, it has N * H outputs,
each a program's share; the N * H partial sums are then a short reduction of their own:

    sum(x, axes=(0, 1, 2))  ->  sum(sum(x, axes=(0,)), axes=(0, 1))

The partial sums are float32 where ``x`` is half precision (a reduction kernel accumulates in float32 anyway:
rounding the partials to half would be a new error), and the result is rounded once, as before. A max splits the
same way and gives the same answer; a sum's order of additions changes, as any parallel sum's does.
"""

from __future__ import annotations

from ..ir.build import make
from ..ir.dims import fixed
from ..ir.lengths import loop_length_symbols
from ..ir.node import Graph, Node, users
from ..ir.ops import Op
from ..schedule import Target
from .rewrite import rewrite_top


def _split(n: Node, min_outputs: int, dynamic: set[str]) -> Node | None:
    """``n`` as a reduction over its leading axis, then over its other axes; None where it is not worth it: the
    leading axis is not reduced (or is alone, or is 1), the result has ``min_outputs`` elements or more (it runs
    in parallel already), or summing the leading axis alone leaves fewer than that."""
    if n.op not in (Op.SUM, Op.REDUCE_MAX) or not n.dtype.is_float:
        return None
    src = n.srcs[0]
    axes = tuple(sorted(n.attrs["axes"]))
    if len(axes) < 2 or axes[0] != 0 or fixed(src.shape[:1], dynamic) == 1:
        return None
    outputs = fixed(tuple(d for a, d in enumerate(src.shape) if a not in axes), dynamic)
    partials = fixed(tuple(src.shape[1:]), dynamic)
    if outputs is None or outputs >= min_outputs or partials is None or partials < min_outputs:
        return None
    keep = bool(n.attrs["keepdims"])
    wide = n.op == Op.SUM and n.dtype.is_half
    x = make(Op.CAST, (src,), {"dtype": n.dtype.accumulator}, loc=n.loc) if wide else src
    first = make(n.op, (x,), {"axes": (0,), "keepdims": keep}, loc=n.loc)
    rest = axes[1:] if keep else tuple(a - 1 for a in axes[1:])
    total = make(n.op, (first,), {"axes": rest, "keepdims": keep}, loc=n.loc)
    return make(Op.CAST, (total,), {"dtype": n.dtype}, loc=n.loc) if wide else total


def _merged(n: Node, original: Node, readers: dict[int, list[Node]]) -> Node | None:
    """``sum(sum(x, A), B)`` in half precision, the inner sum read by nothing else, as one sum of ``x`` over both
    axis sets (reshaped where the outer sum keeps axes the inner one dropped); None otherwise. ``original`` is
    ``n`` as it was in the graph ``readers`` maps."""
    if original.op != Op.SUM or not original.dtype.is_half:
        return None
    inner = original.srcs[0]
    if inner.op != Op.SUM or inner.dtype != original.dtype or len(readers.get(id(inner), [])) != 1:
        return None
    x = n.srcs[0].srcs[0]  # the rewritten graph's
    first = set(inner.attrs["axes"])
    left = list(range(x.ndim)) if inner.attrs["keepdims"] else [a for a in range(x.ndim) if a not in first]
    axes = tuple(sorted(first | {left[b] for b in original.attrs["axes"]}))
    total = make(Op.SUM, (x,), {"axes": axes, "keepdims": False}, loc=n.loc)
    if tuple(total.shape) == tuple(n.shape):
        return total
    return make(Op.RESHAPE, (total,), {"shape": tuple(n.shape)}, loc=n.loc)


def nested_half_sums(graph: Graph) -> Graph:
    """Top-level half-precision sums of sums read by nothing else are one sum (``_merged``)."""
    readers = users(graph.order)
    return rewrite_top(graph, lambda n, original: _merged(n, original, readers))


def split_long_sums(graph: Graph, target: Target) -> Graph:
    """Top-level sums and maxes with fewer than ``target.split_sum_outputs`` results that reduce their leading
    axis with others are computed over the leading axis first (``_split``); 0: never."""
    if target.split_sum_outputs == 0:
        return graph
    dynamic = loop_length_symbols(graph)
    return rewrite_top(graph, lambda n, _: _split(n, target.split_sum_outputs, dynamic))

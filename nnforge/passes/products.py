"""Batched matrix products that are one GEMM: ``sums_of_products`` and ``shared_weight_products``.

``sums_of_products``: a sum over the batch axes of a batched matrix product becomes one matrix product.

Why: the gradient of a weight shared by every step of a sequence (``y = x @ W`` with ``x`` [T, N, K], W
broadcast over T) comes out of autodiff as ``sum_t x_tᵀ @ g_t``: a batched product with a contraction of only N
(the batch) per step, whose [T, K, M] result — 73 MB for a 96 x 384 weight over T = 500 — is written to memory and
read back to be summed. The same value is ``x_flatᵀ @ g_flat`` with the time axis folded into the contraction
(K = T * N): one GEMM at full efficiency, nothing stacked. It reassociates float sums, so it runs with the
compiled-code passes only (``pipeline``), not for the reference interpreter.

``normalized_products``: ``(a / s) @ c`` with ``s`` one number per row of ``a`` (a softmax's row sums, broadcast
along the contracted axis) becomes ``(a @ c) / s``, and ``(a / s)ᵀ @ c`` becomes ``aᵀ @ (c / s)``. Why: an
attention's probabilities ``e / sum(e)`` are [B, H, T, T], its output [B, H, T, d]; dividing the output instead
saves a pass that writes and reads the probabilities, and the GEMM divides on its accumulator. In a training step
the gradient of V reads them transposed (``pᵀ @ dO``): with both products rewritten, what is left of the
probabilities is elementwise (the softmax's own gradient), computed where it is read, and they are stored
nowhere. It reassociates (compiled code only), and a half-precision product could overflow where the scaled one
did not, so float32 and float64 only.

``shared_weight_products``: ``x @ W`` with x [T, N, K] and W broadcast over T (traced as a batched product with
an expanded right operand, or its transpose) becomes ``reshape(x_flat @ W, [T, N, M])``, one GEMM of T * N
rows and a view of its result — the form in which a row-split loop that reads the projection computes it a chunk
of steps at a time (``codegen/c/chunks.py``). Exact: every element is the same sum in the same order.
"""

from __future__ import annotations

import math

from ..dtypes import DType
from ..ir.build import make
from ..ir.builders import is_transpose, slice_axis, transpose
from ..ir.node import Graph, Node, users
from ..ir.ops import Op
from .rewrite import rewrite_top


def sums_of_products(graph: Graph) -> Graph:
    """Rewrite ``sum(A @ C, axes=batch axes)`` (A [*B, m, k], C [*B, k, n], the product read by nothing else) as
    ``A' @ C'`` with A' [m, B * k] and C' [B * k, n] (reshaped to keep the summed axes where ``keepdims``);
    top-level nodes only (loop bodies hold per-step products)."""
    us = users(graph.order)

    def rule(n: Node, original: Node) -> Node | None:
        if n.op != Op.SUM:
            return None
        p = n.srcs[0]
        b = p.ndim - 2
        if p.op != Op.MATMUL or b < 1 or tuple(sorted(n.attrs["axes"])) != tuple(range(b)):
            return None
        a, c = p.srcs
        if a.ndim != p.ndim or c.ndim != p.ndim or len(us.get(id(original.srcs[0]), [])) != 1:
            return None
        folded = _folded(a, c, b, n.loc)
        if n.attrs.get("keepdims"):  # [1, ..., m, n], as autodiff's sum over broadcast axes asks
            folded = make(Op.RESHAPE, (folded,), {"shape": tuple(n.shape)}, loc=n.loc)
        return folded

    return rewrite_top(graph, rule)


def _folded(a: Node, c: Node, b: int, loc: str) -> Node:
    batch = math.prod(a.shape[:b])  # symbolic sizes multiply symbolically
    m, k, n = a.shape[b], a.shape[b + 1], c.shape[b + 1]
    if is_transpose(a):
        # A is Xᵀ per step (the usual case: x_tᵀ @ g_t): A' = (X reshaped [B * k, m])ᵀ, a view the GEMM reads
        # down its columns, instead of a transposing copy
        x = make(Op.RESHAPE, (a.srcs[0],), {"shape": (batch * k, m)}, loc=loc)
        left = make(Op.PERMUTE, (x,), {"perm": (1, 0)}, loc=loc)
    else:
        moved = make(Op.PERMUTE, (a,), {"perm": (b, *range(b), b + 1)}, loc=loc)
        left = make(Op.RESHAPE, (moved,), {"shape": (m, batch * k)}, loc=loc)
    right = make(Op.RESHAPE, (c,), {"shape": (batch * k, n)}, loc=loc)
    return make(Op.MATMUL, (left, right), loc=loc)


def normalized_products(graph: Graph) -> Graph:
    """Rewrite ``(a / s) @ c`` or ``(a * s) @ c`` (``s`` [*B, m, 1] expanded along the contracted axis of ``a``
    [*B, m, k]) as ``(a @ c) / s`` (``s`` expanded to the product's [*B, m, n]), and ``(a / s)ᵀ @ c`` as
    ``aᵀ @ (c / s)`` (``s`` expanded along c's [*B, m, n] rows); float32 and float64 top-level products only."""

    def rule(n: Node, original: Node) -> Node | None:
        if n.op != Op.MATMUL or n.ndim < 2 or n.dtype not in (DType.float32, DType.float64):
            return None
        left, c = n.srcs
        scaled = left.srcs[0] if is_transpose(left) else left
        if scaled.op not in (Op.DIV, Op.MUL) or not scaled.ndim == c.ndim == n.ndim:
            return None
        a, e = scaled.srcs
        row = _per_row(e, scaled)
        if row is None or a.shape != scaled.shape:
            return None
        if scaled is left:  # rows of the product
            product = make(Op.MATMUL, (a, c), loc=n.loc)
            return make(scaled.op, (product, make(Op.EXPAND, (row,), {"shape": tuple(product.shape)}, loc=n.loc)),
                        loc=n.loc)
        # the scaled rows are the contraction: scale c's rows instead
        c = make(scaled.op, (c, make(Op.EXPAND, (row,), {"shape": tuple(c.shape)}, loc=n.loc)), loc=n.loc)
        return make(Op.MATMUL, (transpose(a), c), loc=n.loc)

    return rewrite_top(graph, rule)


def _per_row(e: Node, scaled: Node) -> Node | None:
    """``s`` where ``e`` is ``s`` [*B, m, 1] expanded along the last axis only to ``scaled``'s [*B, m, k]."""
    if e.op != Op.EXPAND or e.shape != scaled.shape:
        return None
    s = e.srcs[0]
    if s.ndim != e.ndim or int(s.shape[-1]) != 1 or any(
            int(a) != int(b) for a, b in zip(s.shape[:-1], e.shape[:-1])):
        return None
    return s


def shared_weight_products(graph: Graph) -> Graph:
    """Rewrite ``A @ expand(W)`` (A [*B, m, k], W with batch axes of size 1), or ``A @ expand(W)ᵀ`` (the input
    gradient ``g @ W`` of ``x @ Wᵀ``: [T, N, 4H] @ [4H, I] per step, a small GEMM per step with B packed again
    each time), as a 2-D product of A's rows and a view; top-level nodes only."""

    def rule(n: Node, original: Node) -> Node | None:
        if n.op != Op.MATMUL or n.ndim < 3:
            return None
        a, r = n.srcs
        w = _shared_matrix(r, n.loc)
        if a.ndim != n.ndim or w is None:
            return None
        batch = math.prod(a.shape[:-1])
        rows = make(Op.RESHAPE, (a,), {"shape": (batch, a.shape[-1])}, loc=n.loc)
        flat = make(Op.MATMUL, (rows, w), loc=n.loc)
        return make(Op.RESHAPE, (flat,), {"shape": tuple(n.shape)}, loc=n.loc)

    return rewrite_top(graph, rule)


def _shared_matrix(r: Node, loc: str) -> Node | None:
    """The [k, m] matrix a right operand ``r`` [*B, k, m] repeats over its batch axes (an expand of one, or the
    last two axes of such an expand swapped), or None."""
    swapped = is_transpose(r)
    e = r.srcs[0] if swapped else r
    if e.op != Op.EXPAND or any(int(d) != 1 for d in e.srcs[0].shape[:-2]):
        return None
    w = make(Op.RESHAPE, (e.srcs[0],), {"shape": tuple(e.shape[-2:])}, loc=loc)
    return make(Op.PERMUTE, (w,), {"perm": (1, 0)}, loc=loc) if swapped else w


def transposed_products(graph: Graph) -> Graph:
    """Compute a matrix product that is read only with its last two axes swapped as the swapped product:
    ``(A @ C)ᵀ`` becomes ``Cᵀ @ Aᵀ``, and the transpose of a sum of products the sum of theirs; top-level nodes
    only.

    Why: a weight's gradient comes out of autodiff as the transpose of a product, ``(xᵀ @ g)ᵀ`` for ``x @ Wᵀ``, on
    its way to the ``[out, in]`` parameter, its optimizer state and ``.grad``. Stored as the product and read
    transposed, every element-wise reader (Adam's moments, the update) ran in the product's layout and was copied
    into the parameter's, one kernel and one pass over the weight each. ``gᵀ @ x`` stores the gradient in the
    layout its readers want, and the transposes of its operands are views a GEMM reads through strides. Exact
    up to the order a GEMM sums in, so it runs with the compiled-code passes only."""
    us = users(graph.order)
    outputs = {id(o) for o in graph.outputs}

    def single(n: Node) -> bool:
        return len(us.get(id(n), [])) == 1 and id(n) not in outputs

    def swappable(n: Node) -> bool:
        """Whether ``n`` (read once) is a product, or a sum of such, through reshapes that end where they
        started (autodiff's ``[1, k, m]`` and back; carries_read_from_outputs' sum of two), each read once."""
        p = n
        while p.op == Op.RESHAPE and single(p):
            p = p.srcs[0]
        if not single(p) or tuple(map(int, p.shape)) != tuple(map(int, n.shape)):
            return False
        return p.op == Op.MATMUL or (p.op == Op.ADD and all(swappable(s) for s in p.srcs))

    def swap(n: Node) -> Node:
        """The transpose of ``n`` (which ``swappable`` accepted, rebuilt on rewritten sources) as products."""
        while n.op == Op.RESHAPE:
            n = n.srcs[0]
        if n.op == Op.ADD:
            return make(Op.ADD, tuple(swap(s) for s in n.srcs), loc=n.loc)
        a, c = n.srcs
        return make(Op.MATMUL, (_swapped(c), _swapped(a)), loc=n.loc)

    def rule(n: Node, original: Node) -> Node | None:
        if not is_transpose(original) or not swappable(original.srcs[0]):
            return None
        if all(is_transpose(u) for u in us.get(id(original), [])) and id(original) not in outputs:
            return None  # transposed back: ``simplify`` reads the product as it is
        return swap(n.srcs[0])

    return rewrite_top(graph, rule)


def _swapped(x: Node) -> Node:
    """``x`` with its last two axes swapped (a transpose's source, where ``x`` is one)."""
    return x.srcs[0] if is_transpose(x) else transpose(x)


def products_of_stacked_rows(graph: Graph) -> Graph:
    """A product whose right operand is the rows of a concatenation along its first axis becomes the sum of the
    products of each part with the matching columns of the left operand: ``L @ [P; Q]`` is ``L[:, :p] @ P +
    L[:, p:] @ Q``; where the concatenation is read by nothing but such products (``read_as_product_rows``);
    top-level nodes only.

    Why: the carries a scan stacked for a weight gradient's product are its stacked output shifted by a step
    (``scans.carries_read_from_outputs``, and the backward half of a torch autograd call, ``autodiff.partition``):
    written as a concatenation of views of stored arrays they would be copied into one array only for a GEMM to
    read it once. Each part's product reads its views through strides. The longest part's product comes first:
    its GEMM adds the others' results in its epilogue, so in half precision the long sum is rounded once, not
    stored rounded and added again. Exact up to the order a GEMM sums in."""
    us = users(graph.order)
    results = {id(o) for o in graph.outputs}
    cats = {id(n) for n in graph.order
            if n.op == Op.CONCAT and n.attrs["axis"] == 0 and read_as_product_rows(n, us, results)}
    if not cats:
        return graph

    def rule(n: Node, original: Node) -> Node | None:
        if n.op != Op.MATMUL or n.ndim != 2:
            return None
        view = original.srcs[1]
        if id(view) not in cats and not (view.op == Op.RESHAPE and id(view.srcs[0]) in cats):
            return None
        left, right = n.srcs
        parts = (right if right.op == Op.CONCAT else right.srcs[0]).srcs
        terms, lo = [], 0
        for part in parts:
            rows = _rows(part)
            hi = lo + rows.shape[0]
            terms.append(make(Op.MATMUL, (slice_axis(left, 1, lo, hi), rows), loc=n.loc))
            lo = hi
        terms.sort(key=lambda t: -int(t.srcs[1].shape[0]))  # the traced sizes: the longest part first
        out = terms[0]
        for t in terms[1:]:
            out = make(Op.ADD, (out, t), loc=n.loc)
        return out

    return rewrite_top(graph, rule)


def read_as_product_rows(n: Node, us: dict[int, list[Node]], results: set[int]) -> bool:
    """Whether every reader of ``n`` (no result) multiplies its rows as a matrix product's right operand: a 2-D
    ``n`` itself, or a ``[rows, last axis]`` view of it that nothing else reads. A 1-D ``n`` is one row: its
    concatenation joins columns, not rows."""
    def right_operand(v: Node) -> bool:
        readers = us.get(id(v), [])
        return bool(readers) and id(v) not in results and all(
            m.op == Op.MATMUL and m.ndim == 2 and m.srcs[1] is v and m.srcs[0] is not v for m in readers)

    if n.ndim < 2:
        return False
    if n.ndim == 2:
        return right_operand(n)
    rows = tuple(map(int, (math.prod(n.shape[:-1]), n.shape[-1])))
    views = us.get(id(n), [])
    return bool(views) and id(n) not in results and all(
        v.op == Op.RESHAPE and tuple(map(int, v.shape)) == rows and right_operand(v) for v in views)


def _rows(part: Node) -> Node:
    """``part`` ``[t, *mid, c]`` as the matrix of its ``t * prod(mid)`` rows, through the views it was made of
    where it is rows of an array: a slice along the first axis is a slice of the rows, an added leading axis
    is dropped again."""
    if part.ndim == 2:
        return part
    src = part.srcs[0] if part.op in (Op.SLICE, Op.RESHAPE) else None
    if part.op == Op.SLICE and src.ndim == part.ndim and all(
            int(a) == 0 and int(z) == int(d) and s == 1 for a, z, s, d in zip(
                part.attrs["starts"][1:], part.attrs["stops"][1:], part.attrs["steps"][1:], src.shape[1:])) \
            and part.attrs["steps"][0] == 1:
        per = math.prod(src.shape[1:-1])
        return slice_axis(_rows(src), 0, part.attrs["starts"][0] * per, part.attrs["stops"][0] * per)
    if part.op == Op.RESHAPE and tuple(part.shape) == (1, *src.shape) and src.ndim == 2:
        return src
    return make(Op.RESHAPE, (part,), {"shape": (math.prod(part.shape[:-1]), part.shape[-1])}, loc=part.loc)

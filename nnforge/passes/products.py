"""Batched matrix products that are one GEMM: ``sums_of_products`` and ``shared_weight_products``.

``sums_of_products``: a sum over the batch axes of a batched matrix product becomes one matrix product.

Why: the gradient of a weight shared by every step of a sequence (``y = x @ W`` with ``x`` [T, N, K], W
broadcast over T) comes out of autodiff as ``sum_t x_tᵀ @ g_t``: a batched product with a contraction of only N
(the batch) per step, whose [T, K, M] result — 73 MB for a 96 x 384 weight over T = 500 — is written to memory and
read back to be summed. The same value is ``x_flatᵀ @ g_flat`` with the time axis folded into the contraction
(K = T * N): one GEMM at full efficiency, nothing stacked. It reassociates float sums, so it runs with the
compiled-code passes only (``pipeline``), not for the reference interpreter.

``shared_weight_products``: ``x @ W`` with x [T, N, K] and W broadcast over T (traced as a batched product with
an expanded right operand, or its transpose) becomes ``reshape(x_flat @ W, [T, N, M])``, one GEMM of T * N
rows and a view of its result — the form in which a row-split loop that reads the projection computes it a chunk
of steps at a time (``codegen/c/chunks.py``). Exact: every element is the same sum in the same order.
"""

from __future__ import annotations

import math

from ..ir.build import make
from ..ir.builders import is_transpose, transpose
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

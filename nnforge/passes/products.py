"""``sums_of_products``: a sum over the batch axes of a batched matrix product becomes one matrix product.

Why: the gradient of a weight shared by every step of a sequence (``y = x @ W`` with ``x`` [T, N, K], W
broadcast over T) comes out of autodiff as ``sum_t x_tᵀ @ g_t``: a batched product with a contraction of only N
(the batch) per step, whose [T, K, M] result — 73 MB for a 96 x 384 weight over T = 500 — is written to memory and
read back to be summed. The same value is ``x_flatᵀ @ g_flat`` with the time axis folded into the contraction
(K = T * N): one GEMM at full efficiency, nothing stacked. It reassociates float sums, so it runs with the
compiled-code passes only (``pipeline``), not for the reference interpreter.
"""

from __future__ import annotations

import math

from ..ir.build import make
from ..ir.node import Graph, Node, users
from ..ir.ops import Op
from .rewrite import substitute


def sums_of_products(graph: Graph) -> Graph:
    """Rewrite ``sum(A @ C, axes=batch axes)`` (A [*B, m, k], C [*B, k, n], the product read by nothing else) as
    ``A' @ C'`` with A' [m, B * k] and C' [B * k, n] (reshaped to keep the summed axes where ``keepdims``);
    top-level nodes only (loop bodies hold per-step products)."""
    us = users(graph.order)
    mapping: dict[int, Node] = {}
    for n in graph.order:
        if n.op != Op.SUM:
            continue
        p = n.srcs[0]
        b = p.ndim - 2
        if p.op != Op.MATMUL or b < 1 or tuple(sorted(n.attrs["axes"])) != tuple(range(b)):
            continue
        a, c = p.srcs
        if a.ndim != p.ndim or c.ndim != p.ndim or len(us.get(id(p), [])) != 1:
            continue
        folded = _folded(a, c, b, n.loc)
        if n.attrs.get("keepdims"):  # [1, ..., m, n], as autodiff's sum over broadcast axes asks
            folded = make(Op.RESHAPE, (folded,), {"shape": tuple(n.shape)}, loc=n.loc)
        mapping[id(n)] = folded
    return substitute(graph, mapping) if mapping else graph


def _folded(a: Node, c: Node, b: int, loc: str) -> Node:
    batch = math.prod(a.shape[:b])  # symbolic sizes multiply symbolically
    m, k, n = a.shape[b], a.shape[b + 1], c.shape[b + 1]
    if a.op == Op.PERMUTE and tuple(a.attrs["perm"]) == (*range(b), b + 1, b):
        # A is Xᵀ per step (the usual case: x_tᵀ @ g_t): A' = (X reshaped [B * k, m])ᵀ, a view the GEMM reads
        # down its columns, instead of a transposing copy
        x = make(Op.RESHAPE, (a.srcs[0],), {"shape": (batch * k, m)}, loc=loc)
        left = make(Op.PERMUTE, (x,), {"perm": (1, 0)}, loc=loc)
    else:
        moved = make(Op.PERMUTE, (a,), {"perm": (b, *range(b), b + 1)}, loc=loc)
        left = make(Op.RESHAPE, (moved,), {"shape": (m, batch * k)}, loc=loc)
    right = make(Op.RESHAPE, (c,), {"shape": (batch * k, n)}, loc=loc)
    return make(Op.MATMUL, (left, right), loc=loc)

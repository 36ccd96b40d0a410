"""``biases_into_scans``: a bias broadcast over a scan's input sequence is added inside the step, not before it.

Why: ``nn.LSTM`` (like most RNN code) computes the input projection for all steps at once, ``x @ W_ih + b``; the
bias add was a kernel of its own over the whole [T, N, 4H] projection — at T = 2,000, N = 16, H = 96 a 49 MB
read and a 49 MB write per layer, and the projection had to be stored whole because its root was that add, not
the GEMM that a row-split loop computes a chunk of steps at a time (``codegen/c/chunks.py``). Added inside the
step, the bias is one more operand of the step's GEMM epilogue, and the loop reads the GEMM's result directly.
Only for loops the target splits by rows (their steps run with no barrier, and the chunked projection applies).
"""

from __future__ import annotations

from ..ir.build import make
from ..ir.node import Graph, Node, users
from ..ir.ops import Op
from ..schedule import Target
from .rewrite import rewrite_top, substitute
from .rows import RowSplit, worth_splitting


def _row_broadcast(q: Node) -> bool:
    """An ``expand`` of one row over every step and batch row ([1, 1, G] -> [T, N, G])."""
    return q.op == Op.EXPAND and q.ndim == 3 and all(int(d) == 1 for d in q.srcs[0].shape[:-1])


def _sunk(n: Node, original: Node, us: dict[int, list[Node]], outputs: set[int]) -> Node | None:
    a = n.attrs
    nc, nx = a["n_carry"], a["n_xs"]
    body: Graph = a["body"]
    srcs, inputs = list(n.srcs), list(body.inputs)
    mapping: dict[int, Node] = {}
    for j in range(nc, nc + nx):
        s, was = n.srcs[j], original.srcs[j]
        if s.op != Op.ADD or id(was) in outputs or [id(u) for u in us.get(id(was), [])] != [id(original)]:
            continue
        side = next((k for k in (0, 1) if _row_broadcast(s.srcs[k])), None)
        if side is None:
            continue
        seq, row = s.srcs[1 - side], s.srcs[side].srcs[0]  # [T, N, G] and [1, 1, G]
        old = body.inputs[j]
        step = make(Op.INPUT, (), dict(old.attrs), loc=old.loc)
        const = make(Op.INPUT, (), {"name": f"bias{j}", "shape": tuple(row.shape), "dtype": row.dtype}, loc=s.loc)
        flat = make(Op.RESHAPE, (const,), {"shape": (1, row.shape[-1])}, loc=s.loc)
        bias = make(Op.EXPAND, (flat,), {"shape": tuple(old.shape)}, loc=s.loc)
        mapping[id(old)] = make(Op.ADD, (bias, step) if side == 0 else (step, bias), loc=s.loc)
        srcs[j], inputs[j] = seq, step
        srcs.append(row)
        inputs.append(const)
    if not mapping:
        return None
    inner = substitute(Graph(body.inputs, body.outputs, body.effects), mapping)
    new_body = Graph(inputs, inner.outputs, inner.effects)
    return make(Op.SCAN, tuple(srcs), {**a, "body": new_body}, n.types, loc=n.loc)


def biases_into_scans(graph: Graph, target: Target) -> Graph:
    """Top-level scans split by rows read ``seq`` and add the broadcast bias in their step, where they read
    ``seq + expand(b)`` that nothing else reads."""
    us = users(graph.order)
    outputs = {id(o) for o in graph.outputs}

    def rule(n: Node, original: Node) -> Node | None:
        if n.op == Op.SCAN and isinstance(worth_splitting(n, target), RowSplit):
            return _sunk(n, original, us, outputs)
        return None

    return rewrite_top(graph, rule)

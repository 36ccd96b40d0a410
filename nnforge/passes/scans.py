"""Scan passes."""

from __future__ import annotations

from ..ir.build import make
from ..ir.node import Graph, Node
from ..ir.ops import Op
from .rewrite import substitute


def merge_augmented_scans(graph: Graph) -> Graph:
    """Let forward users of a scan read the augmented copy that autodiff made of it.

    Differentiating a scan creates a copy whose body also stacks the per-step carries; its first results equal
    the original's. Re-pointing the original's readers at the copy runs the forward recurrence once, not twice.
    """
    augmented = {id(n.attrs["primal"]): n for n in graph.order if n.op == Op.SCAN and "primal" in n.attrs}
    mapping: dict[int, Node] = {}
    for n in graph.order:
        if n.op == Op.PROJ and id(n.srcs[0]) in augmented:
            mapping[id(n)] = make(Op.PROJ, (augmented[id(n.srcs[0])],), n.attrs, loc=n.loc)
    if mapping:
        graph = substitute(graph, mapping)

    def strip(n: Node) -> dict | None:
        return {k: v for k, v in n.attrs.items() if k != "primal"} if "primal" in n.attrs else None

    return substitute(graph, {}, attrs_fn=strip)

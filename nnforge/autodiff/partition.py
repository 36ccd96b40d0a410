"""A function and its pullback traced as one graph, split where the cotangents enter.

Torch autograd runs a layer's forward when it is called and its backward later, with the cotangents. Compiling
the pullback alone would run the forward again inside it; instead the joint graph (the outputs and the
gradients, as functions of the inputs and the cotangents) is cut in two. The forward half is every node that
reads no cotangent: it returns the outputs and the values the backward half reads of it (the ``saved`` values:
a scan's stacked carries and gate pre-activations, an attention's exponentials...). The backward half takes the
graph's inputs again (they are passed for free), the cotangents and the saved values, and returns the gradients.

What is saved is chosen as AOTAutograd's partitioner does in spirit, by rules rather than a min-cut: a value
computed from no input (a constant, zeros) is rebuilt, a view is taken again of its saved source, and an
element-wise value is recomputed where everything it reads is saved anyway or small (a softmax's probabilities
from its saved exponentials and their row sums; a layer norm's centred input from the input and the mean).
Random draws are saved, never drawn again.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from ..ir.loops import placeholder
from ..ir.node import Graph, Node
from ..ir.ops import ELEMENTWISE, Op
from ..passes.rewrite import substitute

VIEWS = frozenset({Op.RESHAPE, Op.PERMUTE, Op.EXPAND, Op.SLICE})  # movement that never copies
SMALL = 8  # a value at most 1/SMALL of the size of the one recomputed from it is saved instead of it


@dataclass(frozen=True)
class Partition:
    """``forward``: the joint graph's inputs but the cotangents -> its primal outputs, then the saved values that
    are not among them, with the graph's side effects (a Receiver's callback runs once a call, with the forward);
    ``saved_at[k]`` is the position of the k-th saved value among ``forward``'s outputs.
    ``backward``: the joint graph's inputs, then one input per saved value -> the gradients."""

    forward: Graph
    backward: Graph
    saved_at: tuple[int, ...]


def split_at_cotangents(graph: Graph, cotangents: Collection[int], primal: Sequence[int]) -> Partition:
    """Cut ``graph`` into the halves described in ``Partition``: ``cotangents`` are the positions of the cotangents
    among its inputs, ``primal`` those of its outputs the forward half returns (results, values written back);
    the others are the gradients."""
    cts = {id(graph.inputs[i]) for i in cotangents}
    inputs = {id(n) for n in graph.inputs}
    reads_ct: set[int] = set(cts)
    varies: set[int] = set(inputs)  # computed from an input or a random draw: not rebuilt from nothing
    for n in graph.order:
        if any(id(s) in reads_ct for s in n.srcs):
            reads_ct.add(id(n))
        if n.op in (Op.RAND, Op.FEEDER) or any(id(s) in varies for s in n.srcs):
            varies.add(id(n))
    grads = [o for i, o in enumerate(graph.outputs) if i not in primal]
    results = [graph.outputs[i] for i in primal]
    if any(id(o) in reads_ct for o in (*results, *graph.effects)):
        raise ValueError("split_at_cotangents: a primal output or a side effect reads a cotangent")
    read_back: dict[int, Node] = {}  # forward values the backward half reads
    for n in graph.order:
        if id(n) in reads_ct:
            for s in n.srcs:
                if id(s) not in reads_ct:
                    read_back.setdefault(id(s), s)
    for g in grads:
        if id(g) not in reads_ct:
            read_back.setdefault(id(g), g)
    position = {id(n): k for k, n in enumerate(graph.order)}
    saved = _fewer_saved([n for n in read_back.values() if id(n) in varies and id(n) not in inputs], position,
                         {id(o) for o in results}, lambda n: id(n) in varies and id(n) not in inputs)
    if any(n.shape is None for n in saved):
        raise ValueError("split_at_cotangents: the backward half reads a loop's results other than one by one")
    slots = {id(n): placeholder(n.shape, n.dtype, f"saved{k}") for k, n in enumerate(saved)}
    back = substitute(Graph(graph.inputs, grads), slots)
    backward = Graph((*back.inputs, *(slots[id(n)] for n in saved)), back.outputs)
    at = {id(o): k for k, o in reversed(list(enumerate(results)))}
    extra = [n for n in saved if id(n) not in at]
    at |= {id(n): len(results) + k for k, n in enumerate(extra)}
    forward = Graph([n for n in graph.inputs if id(n) not in cts], (*results, *extra), graph.effects)
    return Partition(forward, backward, tuple(at[id(n)] for n in saved))


def _fewer_saved(saved: list[Node], position: dict[int, int], outputs: set[int],
                 needs_saving: Callable[[Node], bool]) -> list[Node]:
    """``saved`` with views replaced by their sources and element-wise values recomputed from what they read
    where that is saved anyway, an output, or small (see the module docstring); latest values first, so that a
    chain of element-wise values folds back to its start, until nothing changes."""
    kept = {id(n): n for n in saved}
    changed = True
    while changed:
        changed = False
        for n in sorted(kept.values(), key=lambda m: -position[id(m)]):
            if id(n) in outputs:
                continue  # stored by the forward anyway
            if n.op in VIEWS:
                reads = [n.srcs[0]]
            elif n.op in ELEMENTWISE and all(id(s) in kept or id(s) in outputs or not needs_saving(s)
                                             or _base(s).numel * SMALL <= n.numel for s in n.srcs):
                reads = list(n.srcs)
            else:
                continue
            del kept[id(n)]
            for s in reads:
                s = _base(s) if id(s) not in kept else s
                if needs_saving(s):
                    kept.setdefault(id(s), s)
            changed = True
    return sorted(kept.values(), key=lambda m: position[id(m)])


def _base(n: Node) -> Node:
    """The value a chain of views reads."""
    while n.op in VIEWS:
        n = n.srcs[0]
    return n

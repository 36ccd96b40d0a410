"""A function and its pullback traced as one graph, split where the cotangents enter.

Torch autograd runs a layer's forward when it is called and its backward later, with the cotangents. Compiling
the pullback alone would run the forward again inside it; instead the joint graph (the outputs and the
gradients, as functions of the inputs and the cotangents) is cut in two. The forward half is every node that
reads no cotangent: it returns the outputs and the values the backward half reads of it (the ``saved`` values:
a scan's stacked carries and gate pre-activations, an attention's exponentials...). The backward half takes the
graph's inputs again (they are passed for free), the cotangents and the saved values, and returns the gradients.

What is saved is chosen as AOTAutograd's partitioner does in spirit, by rules rather than a min-cut: a value
computed from no input (a constant, zeros) is rebuilt, a view is taken again of its saved source, and an
element-wise value (or a concatenation) is recomputed where everything it reads is saved anyway or small (a
softmax's probabilities from its saved exponentials and their row sums; a layer norm's centred input from the input
and the mean). Random draws are saved, never drawn again. A scan's stack of the carries its steps start from, read
by the backward only for a weight gradient's product (an LSTM's ``h`` for ``dW_hh``), is not saved: it is the
scan's stacked output one step shifted (``passes.scans.carries_from_outputs``), whose product the backward half's
passes split by rows (``passes.products.products_of_stacked_rows``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from ..ir.loops import placeholder
from ..ir.node import Graph, Node, users
from ..ir.ops import ELEMENTWISE, Op
from ..passes.cse import cse
from ..passes.rewrite import substitute
from ..passes.scans import carries_from_outputs, stacked_carry

VIEWS = frozenset({Op.RESHAPE, Op.PERMUTE, Op.EXPAND, Op.SLICE})  # movement that never copies
RECOMPUTED = ELEMENTWISE | {Op.CONCAT}  # one pass over what they read: recomputed where that is saved anyway
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
    reads_ct = _reading(graph, [graph.inputs[i] for i in cotangents])
    rebuilt = _carries_from_outputs(graph, reads_ct)
    if rebuilt is not graph:
        graph = rebuilt
        reads_ct = _reading(graph, [graph.inputs[i] for i in cotangents])
    cts = {id(graph.inputs[i]) for i in cotangents}
    inputs = {id(n) for n in graph.inputs}
    varies: set[int] = set(inputs)  # computed from an input or a random draw: not rebuilt from nothing
    for n in graph.order:
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
            elif n.op in RECOMPUTED and all(id(_base(s)) in kept or id(_base(s)) in outputs
                                            or not needs_saving(_base(s)) or _base(s).numel * SMALL <= n.numel
                                            for s in n.srcs):
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


def _reading(graph: Graph, sources: Sequence[Node]) -> set[int]:
    """ids of ``sources`` and of the nodes of ``graph`` computed from them."""
    out = {id(n) for n in sources}
    for n in graph.order:
        if any(id(s) in out for s in n.srcs):
            out.add(id(n))
    return out


def _carries_from_outputs(graph: Graph, reads_ct: set[int]) -> Graph:
    """``graph`` with each stack of a scan's incoming carries that only backward scans read, each for nothing but
    a matrix product, rebuilt from the scan's stacked output of the carry (see the module docstring)."""
    us = users(graph.order)
    results = {id(o) for o in graph.outputs}
    mapping = {}
    for n in graph.order:
        found = stacked_carry(n)
        readers = us.get(id(n), [])
        if found is not None and id(n) not in results and readers and all(
                id(u) in reads_ct and _multiplied_each_step(u, n) for u in readers):
            mapping[id(n)] = carries_from_outputs(n.srcs[0], *found, n.loc)
    return cse(substitute(graph, mapping)) if mapping else graph  # one node for the output and what reads it


def _multiplied_each_step(scan: Node, xs: Node) -> bool:
    """Whether ``scan`` reads ``xs`` only as a sequence, each step's slice only as a matrix product's operand
    (through transposes)."""
    if scan.op != Op.SCAN:
        return False
    body: Graph = scan.attrs["body"]
    us = users(body.order)
    lo, hi = scan.attrs["n_carry"], scan.attrs["n_carry"] + scan.attrs["n_xs"]
    at = [i for i, s in enumerate(scan.srcs) if s is xs]

    def in_products(v: Node) -> bool:
        readers = us.get(id(v), [])
        return bool(readers) and all(u.op == Op.MATMUL or (u.op == Op.PERMUTE and in_products(u)) for u in readers)

    outputs = {id(o) for o in body.outputs}
    return bool(at) and all(lo <= i < hi and id(body.inputs[i]) not in outputs and in_products(body.inputs[i])
                            for i in at)


def _base(n: Node) -> Node:
    """The value a chain of views reads."""
    while n.op in VIEWS:
        n = n.srcs[0]
    return n

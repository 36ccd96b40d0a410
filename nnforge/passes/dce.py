"""Dead-code elimination.

Unreachable nodes vanish by construction (``Graph.order`` walks from the outputs and effects). What is left to
remove is dead work *inside* loops: a stacked scan output nobody reads still costs a store per step and T
copies of memory, and its computation in the body stays alive through the body's outputs. Likewise a stacked
output that is another one again (the same body node: autodiff stacks an LSTM's gate gradients once for the
weight gradients and once for the input gradient) costs a copy per step of T of them: its readers read the
first.
"""

from __future__ import annotations

from ..ir.build import make, rebuild
from ..ir.loops import calls_python
from ..ir.node import Graph, Node
from ..ir.ops import Op


def dce(graph: Graph) -> Graph:
    """Drop unread stacked outputs (ys) of scans, in this graph and in every body."""
    read: dict[int, set[int]] = {}
    for n in graph.order:
        if n.op == Op.PROJ:
            read.setdefault(id(n.srcs[0]), set()).add(n.attrs["index"])
    new: dict[int, Node] = {}
    index_map: dict[int, dict[int, int]] = {}
    projs: dict[tuple[int, int], Node] = {}  # one result node per loop and index (a merged duplicate's readers too)
    changed = False
    for n in graph.order:
        srcs = tuple(new.get(id(s), s) for s in n.srcs)
        if n.op == Op.PROJ and id(n.srcs[0]) in index_map:
            index = index_map[id(n.srcs[0])][n.attrs["index"]]
            key = (id(srcs[0]), index)
            if key not in projs:
                projs[key] = make(Op.PROJ, srcs, {"index": index}, loc=n.loc)
            node = projs[key]
        elif n.op in (Op.SCAN, Op.LOOP):
            node, remap = _prune(n, srcs, read.get(id(n), set()))
            if remap is not None:
                index_map[id(n)] = remap
        else:
            node = n if srcs == n.srcs else rebuild(n, srcs)
        new[id(n)] = node
        changed |= node is not n
    if not changed:
        return graph
    return Graph([new.get(id(i), i) for i in graph.inputs], [new[id(o)] for o in graph.outputs],
                 [new[id(e)] for e in graph.effects])


def _prune(n: Node, srcs: tuple[Node, ...], read: set[int]) -> tuple[Node, dict[int, int] | None]:
    """The loop node with a dead-code-free body and, for a scan, only the ys someone reads."""
    body: Graph = n.attrs["body"]
    first = n.attrs["n_carry"] if n.op == Op.SCAN else len(n.types)
    firsts: dict[int, int] = {}
    same = {i: firsts.setdefault(id(body.outputs[i]), i) for i in range(first, len(n.types))}  # -> first stacking it
    read = {same.get(i, i) for i in read}
    keep = list(range(first)) + [i for i in range(first, len(n.types)) if i in read and same[i] == i]
    if len(keep) < len(n.types):
        body = Graph(body.inputs, [body.outputs[i] for i in keep], body.effects)
    new_body = dce(body)
    attrs = {**n.attrs, "body": new_body}
    if n.op == Op.SCAN:
        new_body, srcs, attrs = _unread_inputs(new_body, srcs, attrs)
    if new_body is n.attrs["body"] and srcs == n.srcs:
        return n, None
    types = tuple(n.types[i] for i in keep)
    node = rebuild(n, srcs, attrs, types)
    at = {old: new for new, old in enumerate(keep)}
    return node, {**at, **{i: at[j] for i, j in same.items() if j in at}}


def _unread_inputs(body: Graph, srcs: tuple[Node, ...], attrs: dict) -> tuple[Graph, tuple[Node, ...], dict]:
    """A scan without the stepped inputs (xs) and constants its body does not read: each xs costs the loop a
    slice (and on the CPU a prefetch) per step, and keeps a [T, ...] array alive that its producer could
    otherwise have chunked (a backward step that reads saved gate sums instead of the input projection)."""
    nc, nx = attrs["n_carry"], attrs["n_xs"]
    read = {id(s) for m in body.order for s in m.srcs} | {id(o) for o in (*body.outputs, *body.effects)}
    keep = [i for i in range(len(body.inputs)) if i < nc or id(body.inputs[i]) in read]
    if len(keep) == len(body.inputs):
        return body, srcs, attrs
    body = Graph([body.inputs[i] for i in keep], body.outputs, body.effects)
    return body, tuple(srcs[i] for i in keep), {**attrs, "body": body,
                                                "n_xs": sum(nc <= i < nc + nx for i in keep)}


def pure_loops(graph: Graph) -> Graph:
    """Drop from the graph's effects each ``nf.loop`` whose body calls no Python (no Receiver, no Feeder, at any
    depth): such a loop is a value, computed where its results are read (the state a compiled function returns
    or writes back), and one whose results nobody reads has no effect anyone could see. Compiled code then runs
    it as a loop of its own instead of sending the whole graph to the interpreter."""
    keep = tuple(e for e in graph.effects if e.op != Op.LOOP or calls_python(e.attrs["body"]))
    return graph if keep == graph.effects else Graph(graph.inputs, graph.outputs, keep)

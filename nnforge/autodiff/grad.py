"""Reverse-mode differentiation over the IR, scans included (backprop through time without unrolling).

The backward of a scan is another scan, run in the opposite direction. The forward scan is augmented to also
stack the carry each step starts from (and the random numbers it drew); the backward body re-runs one step
from that carry and pulls the cotangents through it. Only carries are stored, never a step's internals: a
step's activations are recomputed, which keeps memory at O(T x carry).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import TraceError
from ..ir.build import make, rebuild
from ..ir.node import Graph, Node, toposort
from ..ir.ops import Op
from ..tensor import Tensor, full
from .rules import NO_GRAD, VJP


def _fresh(t: Tensor) -> Tensor:
    """A distinct node with the same value, so gradients w.r.t. it count only the paths through it."""
    return Tensor(make(Op.RESHAPE, (t.node,), {"shape": t.shape}))


def inline(graph: Graph, inputs: Sequence[Node], replace: dict[int, Node] | None = None) -> list[Node]:
    """Instantiate ``graph``'s outputs on new input nodes (its effects are not re-run)."""
    mapping: dict[int, Node] = {id(p): v for p, v in zip(graph.inputs, inputs)}
    mapping.update(replace or {})
    for n in toposort(graph.outputs, graph.inputs):
        if id(n) in mapping:
            continue
        srcs = tuple(mapping[id(s)] for s in n.srcs)
        mapping[id(n)] = n if srcs == n.srcs else rebuild(n, srcs)
    return [mapping[id(o)] for o in graph.outputs]


def gradients(outputs: Sequence[Node], cotangents: Sequence[Tensor], wrt: Sequence[Node]) -> list[Tensor | None]:
    """d(sum_i <outputs_i, cotangents_i>)/d(wrt_j) for each j; None where ``wrt_j`` does not reach the outputs."""
    order = toposort(outputs)
    wrt_ids = {id(w) for w in wrt}
    reach: set[int] = set()
    for n in order:
        if id(n) in wrt_ids or any(id(s) in reach for s in n.srcs):
            reach.add(id(n))
    grads: dict[int, Tensor] = {}
    multi: dict[int, list[Tensor | None]] = {}

    def add(node: Node, g: Tensor) -> None:
        if id(node) not in reach or node.dtype is None or not node.dtype.is_float:
            return
        if g.dtype != node.dtype:
            g = g.cast(node.dtype)
        grads[id(node)] = g if id(node) not in grads else grads[id(node)] + g

    for o, c in zip(outputs, cotangents):
        add(o, c)
    for n in reversed(order):
        if id(n) not in reach or n.op in NO_GRAD:
            continue
        if n.op == Op.PROJ:
            g = grads.get(id(n))
            if g is not None:
                slot = multi.setdefault(id(n.srcs[0]), [None] * len(n.srcs[0].types))
                i = n.attrs["index"]
                slot[i] = g if slot[i] is None else slot[i] + g
            continue
        if n.op == Op.SCAN:
            cts = multi.get(id(n))
            if cts is None:
                continue
            src_grads = scan_vjp(n, cts)
        elif n.op == Op.LOOP:
            raise TraceError(f"cannot differentiate through nf.loop (created at {n.loc}); use nf.scan for a "
                             "differentiable loop")
        else:
            g = grads.get(id(n))
            if g is None:
                continue
            src_grads = VJP[n.op](n, [Tensor(s) for s in n.srcs], Tensor(n), g)
        for s, sg in zip(n.srcs, src_grads):
            if sg is not None:
                add(s, sg)
    return [grads.get(id(w)) for w in wrt]


def _zeros(shape: tuple, dtype) -> Tensor:
    return full(shape, 0, dtype)


def scan_vjp(n: Node, cts: list[Tensor | None]) -> list[Tensor | None]:
    """Cotangents of a scan's sources from the cotangents of its results: a reversed scan."""
    from ..control import scan

    a = n.attrs
    nc, nx = a["n_carry"], a["n_xs"]
    body: Graph = a["body"]
    srcs = [Tensor(s) for s in n.srcs]
    init, xs, consts = srcs[:nc], srcs[nc:nc + nx], srcs[nc + nx:]
    ny = len(n.types) - nc
    length = n.types[nc][0][0] if ny else a["length"]
    if xs:
        length = xs[0].shape[0]

    # Augmented forward: also stack each step's incoming carry and the random numbers / fed arrays it used.
    drawn = [m for m in body.order if m.op in (Op.RAND, Op.FEEDER)]
    aug_body = Graph(body.inputs, body.outputs + body.inputs[:nc] + tuple(drawn), body.effects)
    aug_types = n.types + tuple(((length, *c.shape), c.dtype) for c in init) + tuple(
        ((length, *m.shape), m.dtype) for m in drawn)
    aug = make(Op.SCAN, n.srcs, {**a, "body": aug_body, "primal": n}, types=aug_types, loc=n.loc)
    saved = [Tensor(make(Op.PROJ, (aug,), {"index": len(n.types) + i})) for i in range(nc + len(drawn))]
    saved_carry, saved_drawn = saved[:nc], saved[nc:]

    fc = [i for i in range(nc) if init[i].dtype.is_float]
    fx = [i for i in range(nx) if xs[i].dtype.is_float]
    fk = [i for i in range(len(consts)) if consts[i].dtype.is_float]
    fy = [j for j in range(ny) if n.types[nc + j][1].is_float]
    d_final = [cts[i] if cts[i] is not None else _zeros(init[i].shape, init[i].dtype) for i in fc]
    d_ys = [cts[nc + j] if cts[nc + j] is not None else _zeros(*n.types[nc + j]) for j in fy]
    d_consts0 = [_zeros(consts[k].shape, consts[k].dtype) for k in fk]
    fresh_consts = [_fresh(c) for c in consts]

    def backward_step(carry, x):
        d_c, d_k = carry
        c_t, x_t, dy_t, drawn_t = x
        outs = inline(body, [t.node for t in (*c_t, *x_t, *fresh_consts)],
                      {id(m): v.node for m, v in zip(drawn, drawn_t)})
        primal = [outs[i] for i in fc] + [outs[nc + j] for j in fy]
        wrt = [c_t[i].node for i in fc] + [x_t[i].node for i in fx] + [fresh_consts[k].node for k in fk]
        g = gradients(primal, list(d_c) + list(dy_t), wrt)
        g = [gi if gi is not None else _zeros(w.shape, w.dtype) for gi, w in zip(g, wrt)]
        g_c, g_x, g_k = g[:len(fc)], g[len(fc):len(fc) + len(fx)], g[len(fc) + len(fx):]
        return (g_c, [acc + gk for acc, gk in zip(d_k, g_k)]), g_x

    (d_init, d_consts), d_xs = scan(backward_step, (d_final, d_consts0),
                                    (saved_carry, xs, d_ys, saved_drawn), reverse=not a["reverse"],
                                    unroll=a["unroll"])
    out: list[Tensor | None] = [None] * len(srcs)
    for i, g in zip(fc, d_init):
        out[i] = g
    for i, g in zip(fx, d_xs):
        out[nc + i] = g
    for k, g in zip(fk, d_consts):
        out[nc + nx + k] = g
    return out

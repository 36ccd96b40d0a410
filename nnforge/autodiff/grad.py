"""Reverse-mode differentiation over the IR, scans included (backprop through time without unrolling).

The backward of a scan is another scan, run in the opposite direction. The forward scan is augmented to also
stack the carry each step starts from, the random numbers it drew and the matrix products that read the carry
(an LSTM's ``h @ W_hh.T``), each as the sum it is the sole term of where there is one (the gate pre-activations,
``saved_values``); the backward body re-runs one step from that carry and pulls the cotangents through it. A
product of the carry is the one recomputation that cannot leave the backward loop as a single GEMM over all steps
for free, so it is stored, as cuDNN's reserve space stores gates; every elementwise activation is recomputed,
which keeps memory at O(T x (carry + products)). ``nf.checkpoint`` trades that memory for time.

Everything here is nodes: the per-op rules (``nnforge.ir.registry.VJP``) build IR with ``nnforge.ir.builders``
and the reversed scan is built with ``nnforge.ir.loops``, so the gradient graph is differentiable again by the
same code and nothing depends on the frontend.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from ..errors import TraceError
from ..ir import builders as b
from ..ir.build import make, rebuild
from ..ir.loops import placeholder, scan_node
from ..ir.node import Graph, Node, toposort, users
from ..ir.ops import Op
from ..ir.registry import VJP


def fresh(node: Node) -> Node:
    """A distinct node with the same value, so gradients w.r.t. it count only the paths through it."""
    return make(Op.RESHAPE, (node,), {"shape": node.shape})


def inline(graph: Graph, inputs: Sequence[Node], replace: dict[int, Node] | None = None,
           also: Sequence[Node] = ()) -> list[Node]:
    """Instantiate ``graph``'s outputs (then the inner nodes ``also``) on new input nodes; effects are not re-run."""
    mapping: dict[int, Node] = {id(p): v for p, v in zip(graph.inputs, inputs)}
    mapping.update(replace or {})
    for n in toposort(graph.outputs + tuple(also), graph.inputs):
        if id(n) in mapping:
            continue
        srcs = tuple(mapping[id(s)] for s in n.srcs)
        mapping[id(n)] = n if srcs == n.srcs else rebuild(n, srcs)
    return [mapping[id(o)] for o in (*graph.outputs, *also)]


def carry_products(body: Graph, n_carry: int) -> list[Node]:
    """The body's matrix products that read a carry (directly or not), in body order: what a backward step
    would otherwise recompute one small GEMM per step."""
    reads_carry = {id(p) for p in body.inputs[:n_carry]}
    out = []
    for m in body.order:
        if any(id(s) in reads_carry for s in m.srcs):
            reads_carry.add(id(m))
            if m.op == Op.MATMUL and m.dtype.is_float:
                out.append(m)
    return out


def saved_values(body: Graph, products: Sequence[Node]) -> list[Node]:
    """What the augmented forward stores for each carry product: the product, or the sum it is the sole term
    of (``x_t @ W_ih.T + b + h @ W_hh.T``, an LSTM's gate pre-activations), followed through adds and
    subtractions of the same shape while each value has one reader and is not a body output. The sum is as big
    as the product and holds what the backward step reads: the step's input and the product itself are then
    read by nothing there (measured: the backward step of the basecaller's LSTMs read two [N, 4H] arrays per
    step). The adds' VJPs read no values, so the recomputed chain is dead once its end is the saved value."""
    us = users(body.order)
    outputs = {id(o) for o in body.outputs}
    out: dict[int, Node] = {}
    for p in products:
        v = p
        while len(us.get(id(v), ())) == 1 and id(v) not in outputs:
            (m,) = us[id(v)]
            if m.op not in (Op.ADD, Op.SUB) or m.shape != v.shape or m.dtype != v.dtype:
                break
            v = m
        out.setdefault(id(v), v)
    return list(out.values())


def _split(items: Sequence[Node], sizes: Sequence[int]) -> list[list[Node]]:
    """``items`` cut into consecutive runs of the given sizes."""
    ends = list(itertools.accumulate(sizes))
    return [list(items[e - k:e]) for e, k in zip(ends, sizes)]


def gradients(outputs: Sequence[Node], cotangents: Sequence[Node], wrt: Sequence[Node]) -> list[Node | None]:
    """d(sum_i <outputs_i, cotangents_i>)/d(wrt_j) for each j; None where ``wrt_j`` does not reach the outputs."""
    order = toposort(outputs)
    wrt_ids = {id(w) for w in wrt}
    reach: set[int] = set()
    for n in order:
        if id(n) in wrt_ids or any(id(s) in reach for s in n.srcs):
            reach.add(id(n))
    grads: dict[int, Node] = {}
    multi: dict[int, list[Node | None]] = {}

    def add(node: Node, g: Node) -> None:
        if id(node) not in reach or node.dtype is None or not node.dtype.is_float:
            return
        g = b.cast(g, node.dtype)
        grads[id(node)] = g if id(node) not in grads else b.add(grads[id(node)], g)

    for o, c in zip(outputs, cotangents):
        add(o, c)
    for n in reversed(order):
        if id(n) not in reach:
            continue
        if n.op == Op.PROJ:
            g = grads.get(id(n))
            if g is not None:
                slot = multi.setdefault(id(n.srcs[0]), [None] * len(n.srcs[0].types))
                i = n.attrs["index"]
                slot[i] = g if slot[i] is None else b.add(slot[i], g)
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
            rule = VJP.get(n.op)
            g = grads.get(id(n))
            if rule is None or g is None:
                continue  # no gradient flows through this op (or none reached it)
            src_grads = rule(n, g)
        for s, sg in zip(n.srcs, src_grads):
            if sg is not None:
                add(s, sg)
    return [grads.get(id(w)) for w in wrt]


def scan_vjp(n: Node, cts: list[Node | None]) -> list[Node | None]:
    """Cotangents of a scan's sources from the cotangents of its results: a reversed scan."""
    a = n.attrs
    nc, nx = a["n_carry"], a["n_xs"]
    body: Graph = a["body"]
    init, xs, consts = n.srcs[:nc], n.srcs[nc:nc + nx], n.srcs[nc + nx:]
    ny = len(n.types) - nc
    length = n.types[nc][0][0] if ny else a["length"]
    if xs:
        length = xs[0].shape[0]

    # Augmented forward: also stack each step's incoming carry, the random numbers / fed arrays it used and the
    # products of its carry.
    drawn = [m for m in body.order if m.op in (Op.RAND, Op.FEEDER)]
    products = saved_values(body, carry_products(body, nc))
    aug_body = Graph(body.inputs, body.outputs + body.inputs[:nc] + tuple(drawn) + tuple(products), body.effects)
    aug_types = n.types + tuple(((length, *c.shape), c.dtype) for c in init) + tuple(
        ((length, *m.shape), m.dtype) for m in (*drawn, *products))
    aug = make(Op.SCAN, n.srcs, {**a, "body": aug_body, "primal": n}, types=aug_types, loc=n.loc)
    saved = [b.proj(aug, len(n.types) + i) for i in range(nc + len(drawn) + len(products))]
    saved_carry, saved_drawn, saved_products = _split(saved, (nc, len(drawn), len(products)))

    fc = [i for i in range(nc) if init[i].dtype.is_float]
    fx = [i for i in range(nx) if xs[i].dtype.is_float]
    fk = [i for i in range(len(consts)) if consts[i].dtype.is_float]
    fy = [j for j in range(ny) if n.types[nc + j][1].is_float]
    d_final = [cts[i] if cts[i] is not None else b.zeros_like(init[i]) for i in fc]
    d_ys = [cts[nc + j] if cts[nc + j] is not None else b.const(0, *n.types[nc + j]) for j in fy]
    d_consts0 = [b.zeros_like(consts[k]) for k in fk]
    fresh_consts = [fresh(c) for c in consts]

    # The backward body: one step re-run from its saved carry, then pulled back. Placeholders are named and
    # ordered as nf.scan names a traced body's: carries (d_final, d_consts), then xs (saved carries, xs, d_ys,
    # the step's draws, its products).
    carry0 = [*d_final, *d_consts0]
    seq = [*saved_carry, *xs, *d_ys, *saved_drawn, *saved_products]
    c_ph = [placeholder(c.shape, c.dtype, f"carry{i}") for i, c in enumerate(carry0)]
    x_ph = [placeholder(x.shape[1:], x.dtype, f"x{i}") for i, x in enumerate(seq)]
    d_c, d_k = c_ph[:len(fc)], c_ph[len(fc):]
    c_t, x_t, dy_t, drawn_t, products_t = _split(x_ph, (nc, nx, len(fy), len(drawn), len(products)))
    outs = inline(body, [*c_t, *x_t, *fresh_consts], {id(m): v for m, v in zip(drawn, drawn_t)}, also=products)
    primal = [outs[i] for i in fc] + [outs[nc + j] for j in fy]
    wrt = [c_t[i] for i in fc] + [x_t[i] for i in fx] + [fresh_consts[k] for k in fk]
    g = gradients(primal, [*d_c, *dy_t], wrt)
    g = [gi if gi is not None else b.zeros_like(w) for gi, w in zip(g, wrt)]
    g_c, g_x, g_k = g[:len(fc)], g[len(fc):len(fc) + len(fx)], g[len(fc) + len(fx):]
    new_carry = [*g_c, *(b.add(acc, gk) for acc, gk in zip(d_k, g_k))]
    # The products were recomputed only to be differentiated through (their VJPs never read their values): now
    # every value read of them reads the saved one instead.
    stepped = Graph(tuple(c_ph + x_ph), tuple(new_carry + g_x))
    stepped_outs = inline(stepped, c_ph + x_ph, {id(m): v for m, v in zip(outs[len(body.outputs):], products_t)})
    new_carry, g_x = stepped_outs[:len(new_carry)], stepped_outs[len(new_carry):]

    results = scan_node(carry0, seq, c_ph, x_ph, new_carry, g_x, length=seq[0].shape[0] if seq else length,
                        reverse=not a["reverse"], unroll=a["unroll"])
    d_init, d_consts, d_xs = results[:len(fc)], results[len(fc):len(carry0)], results[len(carry0):]
    out: list[Node | None] = [None] * len(n.srcs)
    for i, gi in zip(fc, d_init):
        out[i] = gi
    for i, gi in zip(fx, d_xs):
        out[nc + i] = gi
    for k, gi in zip(fk, d_consts):
        out[nc + nx + k] = gi
    return out

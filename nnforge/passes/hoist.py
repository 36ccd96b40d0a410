"""Loop-invariant hoisting for scans, including the "premul" trick.

Work in a scan body that does not depend on the carry leaves the loop:

* values that depend only on consts (``W.T``, a reshaped bias) are computed once before the loop and passed in
  as new consts;
* values that depend on ``x_t`` (and consts) but not on the carry are computed for every step at once before the
  loop and passed in as new xs: ``x_t @ W`` of every step becomes one ``[T*N, I] @ [I, G]`` GEMM, and a bias
  added to it rides along as that GEMM's epilogue.

In a scan that the target splits by batch rows (``rows.worth_splitting``) only the GEMM part of a carry-free
value is hoisted: the elementwise work on top of it stays in the loop (see ``_cut``), unless the target hoists
step work whole (``Target.hoist_step_work``).

Sums are first re-associated so carry-free terms are added together (``x@Wi + h@Wh + b`` becomes
``(x@Wi + b) + h@Wh``); that changes float rounding, so this pass belongs to the CPU pipeline.
"""

from __future__ import annotations

from ..ir.build import make
from ..ir.node import Graph, Node, users
from ..ir.ops import ELEMENTWISE, MOVEMENT, REDUCE, Op
from ..schedule import Target
from .rewrite import map_nodes, substitute
from .rows import RowSplit, worth_splitting

_VARIANT_LEAVES = (Op.RAND, Op.FEEDER)


def _classes(body: Graph, nc: int, nx: int) -> dict[int, str]:
    """id -> "carry" (depends on the carry or an effect), "step" (on xs only), "inv" (on consts only)."""
    cls: dict[int, str] = {}
    for k, p in enumerate(body.inputs):
        cls[id(p)] = "carry" if k < nc else "step" if k < nc + nx else "inv"
    for n in body.order:
        if id(n) in cls:
            continue
        if n.op in _VARIANT_LEAVES or n.op in (Op.SCAN, Op.LOOP, Op.RECEIVER):
            cls[id(n)] = "carry"
            continue
        kinds = {cls[id(s)] for s in n.srcs}
        cls[id(n)] = "carry" if "carry" in kinds else "step" if "step" in kinds else "inv"
    return cls


def _reassociate(body: Graph, nc: int, nx: int) -> Graph:
    cls = _classes(body, nc, nx)
    us = users(body.order)
    rank = {"inv": 0, "step": 1, "carry": 2}

    def terms(n: Node, top: bool) -> list[Node]:
        if n.op == Op.ADD and (top or len(us.get(id(n), [])) == 1) and n.dtype.is_float:
            return terms(n.srcs[0], False) + terms(n.srcs[1], False)
        return [n]

    def rule(n: Node) -> Node | None:
        if n.op != Op.ADD or not n.dtype.is_float:
            return None
        ts = terms(n, True)
        if len(ts) < 3 or "carry" not in {cls.get(id(t), "carry") for t in ts}:
            return None
        ordered = sorted(ts, key=lambda t: rank[cls.get(id(t), "carry")])
        if [id(t) for t in ordered] == [id(t) for t in ts]:
            return None
        acc = ordered[0]
        for t in ordered[1:]:
            acc = make(Op.ADD, (acc, t), loc=n.loc)
        return acc

    return map_nodes(body, rule, max_rounds=1)


class _Lifter:
    """Builds the top-level, all-steps version of carry-free body values."""

    def __init__(self, body: Graph, srcs: tuple[Node, ...], nc: int, nx: int):
        self.body = body
        self.T = srcs[nc].shape[0] if nx else None
        self.val: dict[int, tuple[Node, str]] = {}  # id(body node) -> (top node, form: none | time | flat)
        for k, p in enumerate(body.inputs):
            if nc <= k < nc + nx:
                self.val[id(p)] = (srcs[k], "time")
            elif k >= nc + nx:
                self.val[id(p)] = (srcs[k], "none")

    def time(self, n: Node) -> Node:
        top, form = self.lift(n)
        if form == "time":
            return top
        if form == "flat":
            return make(Op.RESHAPE, (top,), {"shape": (self.T, *n.shape)}, loc=n.loc)
        return make(Op.EXPAND, (make(Op.RESHAPE, (top,), {"shape": (1, *n.shape)}, loc=n.loc),),
                    {"shape": (self.T, *n.shape)}, loc=n.loc)

    def flat(self, n: Node) -> Node:
        top, form = self.lift(n)
        if form == "flat":
            return top
        shape = (self.T * n.shape[0], *n.shape[1:])
        if form == "none" and top.op == Op.EXPAND and int(top.srcs[0].shape[0]) == 1:
            return make(Op.EXPAND, (top.srcs[0],), {"shape": shape}, loc=n.loc)
        return make(Op.RESHAPE, (self.time(n),), {"shape": shape}, loc=n.loc)

    def lift(self, n: Node) -> tuple[Node, str]:
        if id(n) in self.val:
            return self.val[id(n)]
        for s in n.srcs:
            self.lift(s)
        forms = [self.val[id(s)][1] for s in n.srcs]
        if n.op == Op.CONST or all(f == "none" for f in forms):
            out = (n if not n.srcs else make(n.op, tuple(self.val[id(s)][0] for s in n.srcs), n.attrs, n.types,
                                              loc=n.loc), "none")
        elif n.op == Op.MATMUL and n.ndim == 2 and forms[1] == "none":
            out = (make(Op.MATMUL, (self.flat(n.srcs[0]), self.val[id(n.srcs[1])][0]), loc=n.loc), "flat")
        elif n.op in ELEMENTWISE and "flat" in forms and n.ndim >= 1 and all(f != "time" for f in forms):
            out = (make(n.op, tuple(self.flat(s) for s in n.srcs), n.attrs, loc=n.loc), "flat")
        else:
            out = (self._time_op(n), "time")
        self.val[id(n)] = out
        return out

    def _time_op(self, n: Node) -> Node:
        srcs = tuple(self.time(s) for s in n.srcs)
        a = dict(n.attrs)
        if n.op in ELEMENTWISE or n.op == Op.CAST:
            pass
        elif n.op in (Op.RESHAPE, Op.EXPAND):
            a["shape"] = (self.T, *a["shape"])
        elif n.op == Op.PERMUTE:
            a["perm"] = (0, *(p + 1 for p in a["perm"]))
        elif n.op == Op.SLICE:
            a = {"starts": (0, *a["starts"]), "stops": (self.T, *a["stops"]), "steps": (1, *a["steps"])}
        elif n.op == Op.PAD:
            a["pads"] = ((0, 0), *a["pads"])
        elif n.op in (Op.CONCAT, Op.GATHER, Op.SCATTER_ADD):
            a["axis"] = a["axis"] + 1
        elif n.op in REDUCE:
            a["axes"] = tuple(x + 1 for x in a["axes"])
        elif n.op != Op.MATMUL:
            raise ValueError(f"cannot hoist {n.op}")
        return make(n.op, srcs, a, loc=n.loc)


def _worth(n: Node, body: Graph, kind: str) -> bool:
    """Hoist a step value only when its cone has a matmul; an invariant one when it computes or moves data."""
    cone = [m for m in Graph((), (n,)).order if m.op != Op.INPUT]
    if kind == "step":
        return any(m.op == Op.MATMUL for m in cone)
    return any(m.op in ELEMENTWISE or m.op in MOVEMENT or m.op in (Op.MATMUL, *REDUCE) for m in cone)


def _linear(n: Node, cls: dict[int, str]) -> bool:
    """A matmul, or a sum of matmuls and loop invariants (a bias): what a hoisted GEMM computes with its epilogue."""
    if n.op == Op.MATMUL:
        return True
    if n.op == Op.ADD:
        return any(_linear(s, cls) for s in n.srcs) and all(_linear(s, cls) or cls[id(s)] == "inv" for s in n.srcs)
    return False


def _cut(m: Node, cls: dict[int, str], body: Graph) -> list[Node]:
    """The GEMM parts of a carry-free step value ``m``: what to compute for all steps before the loop. The
    elementwise and movement work on top of them (the sigmoid / tanh of recomputed gates in a backward scan, a
    layer norm) stays in the loop: hoisted it would only write and re-read a [T, N, H] array per op, for the same
    arithmetic, where in the loop it fuses into the step's kernels."""
    if _linear(m, cls) or m.op not in ELEMENTWISE | MOVEMENT | REDUCE:
        return [m]
    out: list[Node] = []
    for s in m.srcs:
        if cls[id(s)] == "step" and _worth(s, body, "step"):
            out += [c for c in _cut(s, cls, body) if all(c is not o for o in out)]
    return out or [m]


def _roots(body: Graph, cls: dict[int, str], nc: int, nx: int, cut: bool) -> list[Node]:
    """The carry-free values of ``body`` to compute before the loop: each one a carry-dependent value or an output
    reads, or with ``cut`` only the GEMM parts of the step ones (``_cut``)."""
    us = users(body.order)
    outs = {id(o) for o in body.outputs}
    roots: list[Node] = []
    for m in body.order:
        kind = cls[id(m)]
        if kind == "carry" or m.op in (Op.INPUT, Op.CONST):
            continue
        if (id(m) in outs or any(cls[id(u)] == "carry" for u in us.get(id(m), []))) and _worth(m, body, kind):
            for r in _cut(m, cls, body) if kind == "step" and cut else [m]:
                if all(r is not o for o in roots):
                    roots.append(r)
    return roots


def _hoist_scan(n: Node, target: Target) -> Node | None:
    a = n.attrs
    nc, nx = a["n_carry"], a["n_xs"]
    # Only a loop split by rows runs the step's extra elementwise kernels without barriers: elsewhere each would
    # cost one per step, so there the whole carry-free value is hoisted.
    cut = isinstance(worth_splitting(n, target), RowSplit)
    body = _reassociate(a["body"], nc, nx)
    cls = _classes(body, nc, nx)
    roots = _roots(body, cls, nc, nx, cut)
    if cut and target.hoist_step_work:
        # the whole values where they are no more data to write and read back than their GEMM parts (a layer norm
        # of the input projection: one array either way); a backward step's recomputed activations stay
        whole = _roots(body, cls, nc, nx, cut=False)
        if sum(v.numel for v in whole) <= sum(v.numel for v in roots):
            roots = whole
    if not roots:
        return None if body is a["body"] else make(Op.SCAN, n.srcs, {**a, "body": body}, n.types, loc=n.loc)
    lifter = _Lifter(body, n.srcs, nc, nx)
    new_xs, new_consts, mapping = [], [], {}
    for m in roots:
        top, form = lifter.lift(m)
        if form == "none":
            ph = make(Op.INPUT, (), {"name": f"hoisted{len(new_consts)}", "shape": m.shape, "dtype": m.dtype})
            new_consts.append((ph, top))
        else:
            ph = make(Op.INPUT, (), {"name": f"premul{len(new_xs)}", "shape": m.shape, "dtype": m.dtype})
            new_xs.append((ph, lifter.time(m)))
        mapping[id(m)] = ph
    inner = substitute(Graph(body.inputs, body.outputs, body.effects), mapping)
    ins = list(inner.inputs)
    new_body = Graph(ins[:nc + nx] + [p for p, _ in new_xs] + ins[nc + nx:] + [p for p, _ in new_consts],
                     inner.outputs, inner.effects)
    srcs = (*n.srcs[:nc + nx], *(t for _, t in new_xs), *n.srcs[nc + nx:], *(t for _, t in new_consts))
    return make(Op.SCAN, srcs, {**a, "body": new_body, "n_xs": nx + len(new_xs)}, n.types, loc=n.loc)


def _prune(n: Node) -> Node | None:
    """Drop xs and consts the body no longer reads (what hoisting left behind)."""
    a = n.attrs
    nc, nx = a["n_carry"], a["n_xs"]
    body: Graph = a["body"]
    used = {id(s) for m in body.order for s in m.srcs} | {id(o) for o in body.outputs}
    keep = [k for k, p in enumerate(body.inputs) if k < nc or id(p) in used]
    if len(keep) == len(body.inputs):
        return None
    new_body = Graph([body.inputs[k] for k in keep], body.outputs, body.effects)
    n_xs = sum(1 for k in keep if nc <= k < nc + nx)
    return make(Op.SCAN, tuple(n.srcs[k] for k in keep), {**a, "body": new_body, "n_xs": n_xs}, n.types, loc=n.loc)


def hoist(graph: Graph, target: Target) -> Graph:
    """Move carry-free work out of every scan (innermost first), premultiplying inputs where a GEMM pays; how much of
    a step's work goes depends on whether ``target`` splits the loop by rows."""

    def rule(n: Node) -> Node | None:
        if n.op != Op.SCAN:
            return None
        h = _hoist_scan(n, target) or n
        return _prune(h) or (h if h is not n else None)

    return map_nodes(graph, rule, max_rounds=1)

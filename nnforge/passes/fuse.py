"""Fusion grouping: which nodes get a buffer (kernel roots) and which are inlined into a consumer's kernel.

This is the scheduling decision every compiled backend shares. It does not rewrite the graph; it returns a
``Grouping`` (a plain immutable-by-convention record) that a code generator walks. Rules, greedily from the
outputs back (producers join their consumer, as in Inductor's vertical fusion):

* inherent buffers: inputs, constant arrays, matmuls, reductions, scan/loop results, random numbers;
* *free* nodes (constants, and movement ops whose sources are buffers or free) are never stored: they become
  index expressions of whichever kernel reads them;
* an elementwise or movement node joins its users' kernel when all its users sit in one kernel; otherwise it is
  stored (a refusal, logged at ``NNFORGE_DEBUG=2`` with the reason), unless it is *cheap*: at most
  ``RECOMPUTE_OPS`` arithmetic ops over buffers of which at most one is read element by element (the others
  broadcast along the row: ``v - mean`` of a layer norm). A cheap node is recomputed by each reader kernel: its
  readers load the one buffer it reads instead of a stored copy, and the kernel that would have stored it is
  gone (a layer norm's ``d = v - mean``, read by its variance and its output, was a whole pass per row). What
  counts as cheap is a ``Recompute`` policy: the shared one above, or a target's own for the bodies of loops
  stepped by the host, where every kernel is a launch per step (``Target.step_recompute``);
* a node its one kernel reads through overlapping windows (a convolution's im2col: one strided slice per tap of
  ``silu(conv(x))``) would be evaluated once per window, so it is stored unless it is cheap: the swish of a
  Conv1d with 19 taps and stride 5 was computed 3.8 times per element, scalar, inside the gather (a single
  value is never stored for this: an Adam step's bias corrections read its step count twice, and a kernel of
  its own to save one evaluation was a launch per parameter);
* a matmul or reduction whose single user is an elementwise chain of the same shape, with no movement on the
  way, runs that chain as its epilogue (DPElwFuse / ReduceElwFuse in the seed's words).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ..ir.node import Graph, Node, users
from ..ir.ops import ELEMENTWISE, MOVEMENT, REDUCE, Op

log = logging.getLogger("nnforge.fuse")

RECOMPUTE_OPS = 2
OVERLAP = 1.5  # evaluations per element above which a non-cheap node read through windows is stored
_CHEAP = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.NEG})


@dataclass(frozen=True)
class Recompute:
    """Which elementwise nodes read by several kernels each reader recomputes instead of one kernel storing them:
    a cone of at most ``ops`` nodes whose ops are in ``op_set`` (None: any elementwise op) over at most ``reads``
    buffers read element by element (broadcast ones do not count)."""

    ops: int = RECOMPUTE_OPS
    op_set: frozenset[Op] | None = _CHEAP
    reads: int = 1


CHEAP = Recompute()  # the shared rule (module docstring)

INHERENT = frozenset({Op.INPUT, Op.DATA, Op.MATMUL, Op.SUM, Op.REDUCE_MAX, Op.PROJ, Op.RAND, Op.FEEDER,
                      Op.SCAN, Op.LOOP, Op.RECEIVER, Op.SCATTER_ADD})
STRIDED = frozenset({Op.PERMUTE, Op.EXPAND, Op.SLICE, Op.RESHAPE})


@dataclass
class Grouping:
    """Per-graph fusion decision. Keys are ``id(node)`` of nodes of ``graph`` (bodies get their own Grouping)."""

    graph: Graph
    stored: set[int] = field(default_factory=set)          # nodes with a buffer (roots and inherent buffers)
    free: set[int] = field(default_factory=set)            # index-expression-only nodes
    kernel_of: dict[int, int] = field(default_factory=dict)  # lazy node -> root it is inlined into
    epilogue_of: dict[int, int] = field(default_factory=dict)  # matmul/reduce -> elementwise root it computes
    prologue: dict[int, int] = field(default_factory=dict)   # root -> matmul/reduce feeding its epilogue
    alias: set[int] = field(default_factory=set)           # reshapes that are another name for their source
    refusals: list[str] = field(default_factory=list)
    recomputed: set[int] = field(default_factory=set)  # cheap nodes every reader kernel computes itself
    sliced: list[SlicedGroup] = field(default_factory=list)  # GEMMs whose column-slice readers run on its tiles

    def is_stored(self, n: Node) -> bool:
        return id(n) in self.stored and id(n) not in self.epilogue_of and id(n) not in self.alias


def _same_shape(a: Node, b: Node) -> bool:
    return a.shape is not None and b.shape is not None and tuple(map(int, a.shape)) == tuple(map(int, b.shape))


def strided_base(n: Node, stored: set[int], free: set[int]) -> bool:
    """True when ``n`` is a stored buffer or a chain of permute/expand/slice/reshape over one (a GEMM operand
    read through strides, without a copy). Reshapes must only add or drop size-1 axes."""
    while id(n) not in stored:
        if not _strided_step(n):
            return False
        n = n.srcs[0]
    return True


def _strided_step(n: Node) -> bool:
    """Whether ``n`` indexes its source through strides: a permute, broadcast or slice, or a reshape that only
    adds or drops size-1 axes."""
    if n.op not in STRIDED:
        return False
    if n.op == Op.RESHAPE:
        return [int(d) for d in n.shape if int(d) != 1] == [int(d) for d in n.srcs[0].shape if int(d) != 1]
    return True


def _view_needs_buffer(n: Node, readers: list[Node], g: Grouping, outputs: set[int]) -> bool:
    """Whether a view (a movement node its readers could index) must be stored all the same: it is a result of
    the graph, a loop or a reshape alias reads it as a buffer, or a GEMM reads it and it is no strided view of a
    buffer. One rule for the views found free walking back from the outputs and for those ``group`` stored
    before their source was decided (``_views_of_later_buffers``)."""
    return (id(n) in outputs or any(u.op in (Op.SCAN, Op.LOOP, Op.RECEIVER) or id(u) in g.alias for u in readers)
            or (any(u.op == Op.MATMUL for u in readers)
                and not (_strided_step(n) and strided_base(n.srcs[0], g.stored, g.free))))


def _view_of_reshape(n: Node, readers: list[Node], g: Grouping, outputs: set[int]) -> bool:
    """True when ``n``, read only by matmuls, is a permute, slice or broadcast of a reshape not yet decided."""
    return (n.op in STRIDED and n.op != Op.RESHAPE and n.srcs[0].op == Op.RESHAPE and id(n) not in outputs
            and id(n.srcs[0]) not in g.stored and id(n.srcs[0]) not in g.free
            and bool(readers) and all(u.op == Op.MATMUL for u in readers))


def group(graph: Graph, recompute: Recompute = CHEAP) -> Grouping:
    """Decide kernels for one graph (not its bodies); ``recompute``: which nodes readers recompute."""
    g = Grouping(graph)
    order = graph.order
    us = users(order)
    outputs = {id(o) for o in graph.outputs}
    for n in order:  # forward: inherent buffers and free nodes
        if n.op in INHERENT:
            g.stored.add(id(n))
        elif n.op == Op.RESHAPE and id(n.srcs[0]) in g.stored:
            g.stored.add(id(n))  # a contiguous buffer seen with another shape: no copy
            g.alias.add(id(n))
        elif n.op == Op.CONST or (n.op in MOVEMENT and _over_buffers(n, g)):
            g.free.add(id(n))

    def kernel(u: Node) -> int:
        if id(u) in g.stored:
            return id(u)
        return g.kernel_of.get(id(u), id(u))

    cost = _recompute_costs(order, g, recompute)
    reads: dict[int, dict[tuple[int, ...], float]] = {}
    for n in reversed(order):  # backward: producers join their consumer's kernel
        if id(n) in g.stored:
            continue
        readers = us.get(id(n), [])
        if n.op == Op.RESHAPE and id(n) not in g.free:
            ks = {kernel(u) for u in readers}
            if id(n) in outputs or len(ks) != 1 or any(u.op in (Op.SCAN, Op.LOOP, Op.MATMUL) for u in readers):
                g.stored.add(id(n))  # store the source instead (below) and alias it
                g.alias.add(id(n))
                continue
        if _view_of_reshape(n, readers, g, outputs):
            # a GEMM reads a regrouped array through a transpose or slice (a weight gradient's xᵀ with x [N, T, K]
            # seen as [N * T, K]): store the regrouped array, which the view then reads, not a transposed copy
            g.stored.add(id(n.srcs[0]))
            g.alias.add(id(n.srcs[0]))
            g.free.add(id(n))
            continue
        needs_view = any(u.op == Op.MATMUL for u in readers)
        if id(n) in g.free:
            if _view_needs_buffer(n, readers, g, outputs):
                g.free.discard(id(n))
                g.stored.add(id(n))
            continue
        why = ""
        if id(n) in outputs:
            why = "it is a result of the graph"
        elif any(id(u) in g.alias for u in readers):
            why = "a reshape reads it as a buffer"
        elif not readers:
            why = "it has no readers"
        elif any(u.op in (Op.SCAN, Op.LOOP, Op.RECEIVER) for u in readers):
            why = "a loop reads it"
        elif needs_view:
            why = "a matmul reads it (GEMM operands are strided buffers)"
        elif any(id(u) in g.recomputed for u in readers):
            g.recomputed.add(id(n))  # in a recomputed node's cone (counted in its cost)
            continue
        else:
            ks = {kernel(u) for u in readers}
            if len(ks) == 1:
                reads[id(n)] = _window_reads(n, readers, g, reads)
                evaluations = sum(reads[id(n)].values()) / max(n.numel, 1)
                if n.op not in ELEMENTWISE or id(n) in cost or evaluations <= OVERLAP or n.numel == 1:
                    g.kernel_of[id(n)] = ks.pop()
                    continue
                why = f"its kernel reads it through overlapping windows ({evaluations:.1f} evaluations per element)"
            elif id(n) in cost and not _feeds_epilogue(n, us):
                g.recomputed.add(id(n))
                continue
            else:
                why = f"its {len(readers)} readers sit in {len(ks)} different kernels"
        g.stored.add(id(n))
        if n.op in ELEMENTWISE and readers and id(n) not in outputs:
            g.refusals.append(f"{n.op.name.lower()} at {n.loc}: not fused into its readers: {why}")
    # free nodes that now read a stored non-buffer are still free (they only remap indices)
    _views_of_later_buffers(g, order, us, outputs)
    _epilogues(g, order, us)
    g.sliced = sliced_groups(g)
    for r in g.refusals:
        log.debug("fusion refused: %s", r)
    return g


def _views_of_later_buffers(g: Grouping, order: list[Node], us: dict[int, list[Node]], outputs: set[int]) -> None:
    """Permutes, broadcasts and slices stored (a copy) because their source was decided after them, walking back
    from the outputs: a layer norm's 1 / std broadcast along the row, read by the output's kernel and a
    gradient's, was stored as a whole [T, N, d] array before the 1 / std itself was found to need a buffer; an
    attention's probabilities transposed for the gradient of V were copied before the probabilities were stored
    for the forward's own GEMM; a head split's permute read by a GEMM was copied though a later GEMM had made its
    reshape an alias of the projection. Where the source is a buffer after all, each is a view of it that its
    readers index, free as those found early (not a result, not read by a loop or an alias; a GEMM's operand
    through strides)."""
    for n in order:
        readers = us.get(id(n), [])
        if (n.op in STRIDED and n.op != Op.RESHAPE and id(n) in g.stored and id(n) not in g.alias and readers
                and _over_buffers(n, g) and not _view_needs_buffer(n, readers, g, outputs)):
            g.stored.discard(id(n))
            g.free.add(id(n))


def _over_buffers(n: Node, g: Grouping) -> bool:
    """Whether every source of ``n`` is a buffer or free: a movement node over them only indexes them."""
    return all(id(s) in g.stored or id(s) in g.free for s in n.srcs)


def _window_reads(n: Node, readers: list[Node], g: Grouping,
                  reads: dict[int, dict[tuple[int, ...], float]]) -> dict[tuple[int, ...], float]:
    """How often the kernel evaluates ``n``, by index path: path (the movement nodes between the kernel's root and
    ``n``) -> evaluations. Reads along one path share a value (the renderers compute an index once); a slice or
    a permute reads one element of ``n`` per evaluation of its own, a pad or a concat only its share of them, and
    a broadcast is not counted as a re-read (its recomputation is the price of not storing a row value)."""
    out: dict[tuple[int, ...], float] = {}
    for u in readers:
        base = {(): float(u.numel)} if id(u) in g.stored else reads.get(id(u), {(): float(u.numel)})
        if u.op in (Op.PAD, Op.CONCAT, Op.EXPAND):
            share = n.numel / max(u.numel, 1)
        else:
            share = 1.0
        for path, count in base.items():
            key = (*path, id(u)) if u.op in MOVEMENT else path
            out[key] = max(out.get(key, 0.0), count * share)
    return out


def _recompute_costs(order: tuple[Node, ...], g: Grouping, policy: Recompute) -> dict[int, int]:
    """id -> op count of the nodes cheap enough to recompute in each reader (``policy``; module docstring).

    Leaves are the nodes stored by nature (inputs, matmuls, reductions..., the graph's results), free nodes and
    constants; a broadcast (``expand``) makes the leaves under it row-invariant, so they do not count as
    element-wise reads."""
    cost: dict[int, int] = {}
    full: dict[int, frozenset[int]] = {}  # leaves read element by element
    outputs = {id(o) for o in g.graph.outputs}
    for n in order:
        reads = frozenset() if n.op == Op.EXPAND else frozenset().union(*(full.get(id(s), ()) for s in n.srcs))
        if id(n) in g.stored or id(n) in outputs:
            full[id(n)], cost[id(n)] = frozenset({id(n)}), 0
            continue
        if id(n) in g.free or n.op == Op.CONST:  # a view of leaves: reads what they read
            full[id(n)], cost[id(n)] = reads, 0
            continue
        counted = n.op in ELEMENTWISE and (policy.op_set is None or n.op in policy.op_set)
        if any(id(s) not in cost for s in n.srcs) or (not counted and n.op not in STRIDED):
            continue
        ops = sum(cost[id(s)] for s in n.srcs) + counted
        if ops <= policy.ops and len(reads) <= policy.reads:
            cost[id(n)], full[id(n)] = ops, reads
    return {k: v for k, v in cost.items() if v > 0}


def _feeds_epilogue(n: Node, us: dict[int, list[Node]]) -> bool:
    """True when ``n`` reads a matmul or reduction it is the only reader of: stored, it is that GEMM's (or
    reduction's) epilogue, which is better than recomputing it."""
    return any(s.op in (Op.MATMUL, *REDUCE) and len(us.get(id(s), [])) == 1 for s in n.srcs)


def _epilogues(g: Grouping, order: tuple[Node, ...], us: dict[int, list[Node]]) -> None:
    """Let a matmul/reduction compute the elementwise root that is its only reader, on the accumulator (not one
    the graph returns: only a sliced GEMM stores its product besides, see ``sliced_groups``)."""
    outputs = {id(o) for o in g.graph.outputs}
    members = _kernel_members(g, order)
    for p in order:
        if p.op not in (Op.MATMUL, *REDUCE) or id(p) in outputs:
            continue
        root = _epilogue_root(g, p, us, members)
        if isinstance(root, str):
            if root:
                g.refusals.append(f"{p.op.name.lower()} at {p.loc}: no epilogue: {root}")
            continue
        g.epilogue_of[id(p)] = id(root)
        g.prologue[id(root)] = id(p)


def _kernel_members(g: Grouping, order: tuple[Node, ...]) -> dict[int, list[Node]]:
    """id of a kernel root -> the nodes inlined into it, in order, and the root itself last."""
    members: dict[int, list[Node]] = {}
    for n in order:
        if id(n) in g.kernel_of:
            members.setdefault(g.kernel_of[id(n)], []).append(n)
    for n in order:
        if id(n) in members:
            members[id(n)].append(n)
    return members


def _epilogue_root(g: Grouping, p: Node, us: dict[int, list[Node]], members: dict[int, list[Node]]) -> Node | str:
    """The elementwise kernel root matmul/reduction ``p`` can compute on its accumulator, or why not ("" when
    there is nothing to say). ``members``: ``_kernel_members``."""
    readers = us.get(id(p), [])
    if len(readers) != 1:
        return ""
    u = readers[0]
    if u.op not in ELEMENTWISE:
        return f"its reader is a {u.op.name.lower()}"
    root_id = id(u) if id(u) in g.stored else g.kernel_of.get(id(u))
    root = u if root_id == id(u) else (members[root_id][-1] if root_id in members else None)
    if root is None or root.op not in ELEMENTWISE or root_id in g.prologue or root_id in g.epilogue_of:
        return ""
    if not _same_shape(p, root):
        return "reader kernel has another shape"
    kernel_nodes = members.get(root_id, [root])
    on_product = {id(p)}  # the epilogue's nodes computed from the product (in order: sources first)
    for m in kernel_nodes:
        if any(id(s) in on_product for s in m.srcs):
            on_product.add(id(m))
    if any(m.op in MOVEMENT and id(m) in on_product for m in kernel_nodes):
        return "the epilogue moves indices"  # a view of another operand (a bias broadcast) is only its loads
    if any(m.op in (Op.MATMUL, *REDUCE) and id(m) != id(p) and id(m) in g.epilogue_of for m in kernel_nodes):
        return ""
    return root


@dataclass(frozen=True)
class SlicedGroup:
    """A GEMM whose result is read only through column slices of one width by elementwise kernels of shape
    ``[M, width]`` (an RNN step: the gates ``i, f, g, o`` are slices of ``h @ W``). Code generators compute the
    GEMM column tile by column tile (the columns ``offset + u`` for every offset) and run ``members`` on each
    tile while it is in cache: one kernel, one barrier. ``root`` is the stored GEMM result (the matmul or the
    elementwise root of its epilogue); a matmul or root that is also a result of the graph is stored tile by
    tile besides."""

    gemm: Node
    root: Node
    offsets: tuple[int, ...]
    width: int
    members: tuple[Node, ...]


def sliced_groups(g: Grouping) -> list[SlicedGroup]:
    """Every ``SlicedGroup`` of one graph's grouping (refusals are logged at ``NNFORGE_DEBUG=2``).

    When the matmul's result is an elementwise chain inlined into its only reader kernel (a GRU's ``h @ W + b``
    read through three slices by one kernel), the chain's last node becomes the stored GEMM root with the chain
    as the GEMM's epilogue; ``g`` records that."""
    order = g.graph.order
    us = users(order)
    pos = {id(n): k for k, n in enumerate(order)}
    by_id = {id(n): n for n in order}
    outputs = {id(o) for o in g.graph.outputs}
    members = _kernel_members(g, order)
    out: list[SlicedGroup] = []
    taken: set[int] = set()
    for p in order:
        if p.op != Op.MATMUL or p.ndim != 2:
            continue
        if id(p) in g.epilogue_of:
            root = by_id[g.epilogue_of[id(p)]]
        else:  # a returned product's epilogue was left to this pass
            ep = _epilogue_root(g, p, us, members) if id(p) in outputs else ""
            root = ep if isinstance(ep, Node) else _chain_end(g, p, us, outputs)
        why = _sliced_refusal(g, p, root, us, pos, outputs, taken)
        if isinstance(why, str):
            if why:
                log.debug("sliced epilogue refused for matmul at %s: %s", p.loc, why)
            continue
        if id(p) not in g.epilogue_of and root is not p:
            g.stored.add(id(root))
            g.kernel_of.pop(id(root), None)
            g.epilogue_of[id(p)] = id(root)
            g.prologue[id(root)] = id(p)
        out.append(why)
        taken |= {id(m) for m in why.members}
    return out


def _chain_end(g: Grouping, p: Node, us: dict[int, list[Node]], outputs: set[int]) -> Node:
    """The last node of the single-reader, same-shape elementwise chain that starts at matmul ``p`` (which may
    be a result of the graph itself: its tiles are stored on the way)."""
    r = p
    while True:
        rs = us.get(id(r), [])
        if len(rs) != 1 or (id(r) in outputs and r is not p):
            return r
        u = rs[0]
        if u.op not in ELEMENTWISE or not _same_shape(u, p) or id(u) in g.stored or id(u) in g.prologue:
            return r
        r = u


def _sliced_refusal(g: Grouping, p: Node, root: Node, us: dict[int, list[Node]], pos: dict[int, int],
                    outputs: set[int], taken: set[int]) -> SlicedGroup | str:
    M = int(p.shape[0])
    readers = us.get(id(root), [])
    if not readers:
        return ""
    if id(root) in outputs and root is not p and id(p) in outputs:
        return "the graph returns both the product and its epilogue's value"
    slices, offsets, widths = [], [], set()
    for s in readers:
        if (s.op != Op.SLICE or id(s) in g.stored or tuple(s.attrs["steps"]) != (1, 1)
                or int(s.attrs["starts"][0]) != 0 or int(s.shape[0]) != M):
            return f"its result is read by a {s.op.name.lower()} that is not a column slice"
        slices.append(s)
        widths.add(int(s.shape[1]))
        if int(s.attrs["starts"][1]) not in offsets:
            offsets.append(int(s.attrs["starts"][1]))
    if len(widths) != 1:
        return "its column slices differ in width"
    width = widths.pop()
    slice_ids = {id(s) for s in slices}

    def kernel(u: Node) -> int:
        return id(u) if id(u) in g.stored else g.kernel_of.get(id(u), -1)

    member_ids: set[int] = set()
    for s in slices:
        for u in us.get(id(s), []):
            if u.op not in ELEMENTWISE:
                return f"a column slice is read by a {u.op.name.lower()}"
            member_ids.add(kernel(u))
    members = sorted((g.graph.order[pos[k]] for k in member_ids if k in pos), key=lambda n: pos[id(n)])
    if len(members) != len(member_ids):
        return "a slice reader is not part of a kernel"
    for m in members:
        if (m.op not in ELEMENTWISE or not g.is_stored(m) or id(m) in g.prologue or id(m) in taken
                or tuple(int(d) for d in m.shape) != (M, width)):
            return f"the reader kernel {m.op.name.lower()} at {m.loc} is not an elementwise [{M}, {width}] kernel"
    first = pos[id(p)]
    seen: set[int] = set()

    def walk(n: Node) -> str:
        for s in n.srcs:
            if id(s) in member_ids or id(s) in slice_ids:
                if n.op not in ELEMENTWISE:
                    return f"{n.op.name.lower()} at {n.loc} moves the indices of a fused value"
                continue
            if id(s) == id(root):
                return "the GEMM result is read other than through a column slice"
            if id(s) in g.stored and id(s) not in g.alias:
                if pos.get(id(s), -1) > first and s.op != Op.INPUT:
                    return f"{s.op.name.lower()} at {s.loc} is computed after the GEMM"
                continue
            if id(s) not in seen:
                seen.add(id(s))
                why = walk(s)
                if why:
                    return why
        return ""

    for m in members:
        why = walk(m)
        if why:
            return why
    return SlicedGroup(p, root, tuple(offsets), width, tuple(members))

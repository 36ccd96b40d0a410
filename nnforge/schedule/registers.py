"""Which row-split bodies a target that keeps a step's values in registers can run (``Target.steps_in_registers``).

On a GPU a row-split loop is one persistent program per block of rows: the carries and every value a step
computes are register tiles ``[rows, width]``, element ``(r, c)`` held by one thread. Such a tile can be read
at its own element, or a per-row value along the row; a read at another element (a shifted slice of a carry, a
transpose, a gather) or a kernel form the program has no register spelling for would need shared memory. A
concat of tiles along the row stays a list of tiles when only products read it (the gate gradients that an
LSTM's backward step multiplies by its weights), and a product read only through column slices is computed
slice by slice (a GRU's reset and update gates). The
scheduler asks ``register_body_refusal`` and keeps such a loop work-shared (stepped by the host): the decision is
made here, once, not by a renderer falling back.
"""

from __future__ import annotations

from ..ir.node import Graph, Node
from ..ir.ops import ELEMENTWISE, Op
from ..passes.fuse import Grouping

_VIEWS = (Op.SLICE, Op.PERMUTE, Op.PAD, Op.CONCAT, Op.GATHER, Op.RESHAPE, Op.EXPAND)
_NESTED = (Op.SCAN, Op.LOOP, Op.SCATTER_ADD)


def register_body_refusal(body: Graph, g: Grouping, n_carry: int) -> str | None:
    """Why ``body`` (a row-split loop body, batch rows first, its first ``n_carry`` inputs the carries) cannot
    keep its step values in registers; None when it can."""
    tiled = {id(sg.root) for sg in g.sliced}  # read through its slices on the gate tiles, never as a whole
    held = {id(x) for x in body.inputs[:n_carry]}
    held |= {id(m) for m in body.order
             if g.is_stored(m) and m.op not in (Op.INPUT, Op.DATA, Op.PROJ, Op.CONST) and id(m) not in tiled}
    readers: dict[int, list[Node]] = {}
    for m in body.order:
        for s in m.srcs:
            readers.setdefault(id(s), []).append(m)
    carried = {id(o) for o in body.outputs[:n_carry]}
    outputs = {id(o) for o in body.outputs}
    for m in body.order:
        where = f"{m.op.name.lower()} at {m.loc}"
        if m.op in _NESTED:
            return f"{where} in the body has no register form"
        if m.op == Op.CONCAT and g.is_stored(m):
            why = _tile_concat_refusal(m, readers.get(id(m), []), id(m) in carried)
            if why:
                return f"{where} is a stored concat that {why}"
            continue
        if m.op == Op.MATMUL and m.ndim != 2:
            return f"{where} is a batched product"
        if m.op in (Op.SUM, Op.REDUCE_MAX) and tuple(m.attrs["axes"]) != tuple(range(1, m.srcs[0].ndim)):
            return f"{where} reduces other than each row's values"
        if m.op in _VIEWS and not _in_place(m) and _reaches(m.srcs[0], held, g, set()):
            if _sliced_product(m.srcs[0], readers.get(id(m.srcs[0]), []), outputs):
                continue
            return f"{where} reads a value of the step at another element"
    return None


def _tile_concat_refusal(m: Node, readers: list[Node], carried: bool) -> str | None:
    """A stored concat of tiles along the row (the gate gradients of an LSTM's backward step) stays a list of
    tiles: stored part by part, and read only as the left operand of products (one ``tl.dot`` per part, summed).
    Why ``m`` is not such a concat; None when it is."""
    if m.ndim != 2 or m.attrs["axis"] != 1:
        return "joins other than the values of a row"
    if carried:
        return "is carried to the next step"
    for r in readers:
        if r.op != Op.MATMUL or r.srcs[0] is not m or r.srcs[1] is m:
            return f"is read by {r.op.name.lower()} at {r.loc}, not as a product's left operand"
    return None


def _sliced_product(p: Node, readers: list[Node], outputs: set[int]) -> bool:
    """Whether ``p`` is a stored product read only through column slices (a GRU's ``h @ W_hrz`` split into its
    reset and update gates): it is then computed slice by slice, one ``tl.dot`` each, never held whole."""
    if p.op != Op.MATMUL or p.ndim != 2 or id(p) in outputs:
        return False
    return all(_column_slice(r, p) for r in readers)


def _column_slice(m: Node, src: Node) -> bool:
    """``m`` is ``src[:, a:b]``: every row, a contiguous range of columns."""
    if m.op != Op.SLICE or m.srcs[0] is not src:
        return False
    a = m.attrs
    return tuple(a["steps"]) == (1, 1) and int(a["starts"][0]) == 0 and m.shape[0] == src.shape[0]


def _in_place(m: Node) -> bool:
    """A view that reads each element of its source's tile at its own place: an expand of a per-row value along
    the row, or a reshape that changes nothing."""
    src = m.srcs[0]
    if m.op == Op.EXPAND:
        return all(int(d) == 1 for d in src.shape[1:])
    if m.op == Op.RESHAPE:
        return tuple(map(int, m.shape)) == tuple(map(int, src.shape))
    return False


def _reaches(n: Node, held: set[int], g: Grouping, seen: set[int]) -> bool:
    """Whether reading ``n`` at some index reads a held value (through inlined elementwise ops and views)."""
    if id(n) in held:
        return True
    if id(n) in seen or (n.op not in ELEMENTWISE and n.op not in _VIEWS):
        return False
    seen.add(id(n))
    srcs = n.srcs[:1] if n.op == Op.GATHER else n.srcs
    return any(_reaches(s, held, g, seen) for s in srcs)

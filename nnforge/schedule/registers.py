"""Which row-split bodies a target that keeps a step's values in registers can run (``Target.steps_in_registers``).

On a GPU a row-split loop is one persistent program per block of rows: the carries and every value a step
computes are register tiles ``[rows, width]``, element ``(r, c)`` held by one thread. Such a tile can be read
at its own element, or a per-row value along the row; a read at another element (a shifted slice of a carry, a
transpose, a gather) or a kernel form the program has no register spelling for would need shared memory. A
concat of tiles along the row stays a list of tiles when only products read it (the gate gradients that an
LSTM's backward step multiplies by its weights); a row cut into gates by column slices (a GRU's ``h @ W_hrz`` into
its reset and update gates, a layer-norm LSTM's normalized gate row) is held one tile per gate
(``row_segments``), and so is what is computed from such a row at full width (a layer-norm LSTM's gradient: the
gate gradients joined into a row, normalized backwards, multiplied by the weights and summed over the steps in a
carry). The scheduler asks ``register_body_refusal`` and keeps a
loop it refuses work-shared (stepped by the host): the decision is made here, once, not by a renderer falling
back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise

from ..ir.dims import fixed
from ..ir.node import Graph, Node
from ..ir.ops import ELEMENTWISE, Op
from ..passes.fuse import Grouping

_VIEWS = (Op.SLICE, Op.PERMUTE, Op.PAD, Op.CONCAT, Op.GATHER, Op.RESHAPE, Op.EXPAND)
_NESTED = (Op.SCAN, Op.LOOP, Op.SCATTER_ADD)


def register_body_refusal(body: Graph, g: Grouping, n_carry: int, dynamic: set[str] = frozenset()) -> str | None:
    """Why ``body`` (a row-split loop body, batch rows first, its first ``n_carry`` inputs the carries) cannot
    keep its step values in registers (tiles of a width fixed when compiling: none of ``dynamic``, the run-time
    size symbols); None when it can."""
    tiled = {id(sg.root) for sg in g.sliced}  # read through its slices on the gate tiles, never as a whole
    held = {id(x) for x in body.inputs[:n_carry]}
    held |= {id(m) for m in body.order
             if g.is_stored(m) and m.op not in (Op.INPUT, Op.DATA, Op.PROJ, Op.CONST) and id(m) not in tiled}
    readers: dict[int, list[Node]] = {}
    for m in body.order:
        for s in m.srcs:
            readers.setdefault(id(s), []).append(m)
    carried = {id(o) for o in body.outputs[:n_carry]}
    segs = row_segments(body, n_carry)
    for m in body.order:
        where = f"{m.op.name.lower()} at {m.loc}"
        if m.op in _NESTED:
            return f"{where} in the body has no register form"
        if m.op == Op.CONCAT and g.is_stored(m) and _by_ranges(m, segs):
            continue  # its parts are the ranges' tiles (read range by range: _segment_refusal)
        if m.op == Op.CONCAT and g.is_stored(m):
            why = _tile_concat_refusal(m, readers.get(id(m), []), id(m) in carried)
            if why:
                return f"{where} is a stored concat that {why}"
            continue
        if m.op == Op.MATMUL and m.ndim != 2:
            return f"{where} is a batched product"
        if (m.ndim >= 2 and fixed(tuple(m.shape[1:]), dynamic) is None) or (
                m.op == Op.MATMUL and fixed(tuple(m.srcs[1].shape), dynamic) is None):
            return f"{where} has a size known only at run time (a register tile's is fixed when compiling)"
        if m.op in (Op.SUM, Op.REDUCE_MAX) and tuple(m.attrs["axes"]) != tuple(range(1, m.srcs[0].ndim)):
            return f"{where} reduces other than each row's values"
        if m.op in _VIEWS and not _in_place(m) and _reaches(m.srcs[0], held, g, set()):
            if id(m) in segs.slices and (why := _segment_refusal(body, segs, held, readers)) is None:
                continue
            return f"{where} reads a value of the step at another element" + (f" ({why})" if m.op == Op.SLICE
                                                                              and id(m) in segs.slices else "")
    return None


@dataclass(frozen=True)
class Segments:
    """Values of a row-split body computed segment by segment: the gates of a layer-norm LSTM are column slices of
    a value normalized over the whole row, so that value (and the product it comes from) is never one register
    tile but one tile per gate. ``widths``: for each row width, the column ranges (offset, width) its column
    slices cut it into, when they partition it; ``nodes``: ids of the values evaluated at those ranges (the
    sliced values and, through elementwise ops of the same width and row sums, what they are computed from and
    what is computed from them at that width, and a carry with its next value); ``slices``: ids of the column
    slices read through the ranges."""

    widths: dict[int, tuple[tuple[int, int], ...]]
    nodes: frozenset[int]
    slices: frozenset[int]


def row_width(n: Node) -> int | None:
    """Values per row of a ``[rows, ...]`` body value (None: a run-time width)."""
    try:
        return math.prod(int(d) for d in n.shape[1:])
    except TypeError:
        return None


def _column_range(m: Node) -> tuple[int, int] | None:
    """(offset, width) of ``m = src[:, a:b]`` on a 2-D ``src``, else None."""
    if m.op != Op.SLICE or m.ndim != 2 or m.srcs[0].ndim != 2:
        return None
    a = m.attrs
    if tuple(a["steps"]) != (1, 1) or int(a["starts"][0]) != 0 or m.shape[0] != m.srcs[0].shape[0]:
        return None
    return int(a["starts"][1]), int(m.shape[1])


def row_segments(body: Graph, n_carry: int = 0) -> Segments:
    """The segments of ``body`` (see ``Segments``; its first ``n_carry`` inputs and outputs are the carries): one
    decision read by the scheduler's refusal and the renderer."""
    ranges: dict[int, set[tuple[int, int]]] = {}
    cut_at: list[tuple[int, int, int]] = []  # (source width, offset, width) of each column slice
    for m in body.order:
        r = _column_range(m)
        if r is not None and (w := row_width(m.srcs[0])) is not None:
            ranges.setdefault(w, set()).add(r)
            cut_at.append((w, *r))
    widths = {}
    for w, rs in ranges.items():
        cuts = sorted(rs)
        ends = [0] + [a + b for a, b in cuts]
        if len(cuts) > 1 and [a for a, _ in cuts] == ends[:-1] and ends[-1] == w:
            widths[w] = tuple(cuts)
    widths = _refined(widths, cut_at)
    slices = {id(m) for m in body.order if _column_range(m) is not None and row_width(m.srcs[0]) in widths}
    nodes: set[int] = set()
    carries = list(zip(body.inputs[:n_carry], body.outputs[:n_carry]))
    while True:  # until nothing joins: each rule can feed the others
        before = len(nodes)
        for m in reversed(body.order):  # towards the sources
            row_sum = m.op in (Op.SUM, Op.REDUCE_MAX) and m.srcs[0].ndim == 2 and row_width(m.srcs[0]) in widths
            if id(m) in slices or row_sum:
                nodes.add(id(m.srcs[0]))
            if id(m) in nodes and m.op not in (Op.INPUT, Op.DATA, Op.CONST):
                # through elementwise ops and views that keep the columns (a bias row broadcast along the batch);
                # a per-row value broadcast along the row (a layer norm's mean) is read whole by every range
                for s in m.srcs:
                    if _same_columns(s, m):
                        nodes.add(id(s))
        for m in body.order:  # towards the results: an elementwise op of a value held by ranges, at its width
            if m.op in ELEMENTWISE and any(id(s) in nodes and _same_columns(s, m) for s in m.srcs):
                nodes.add(id(m))
        for x, nxt in carries:  # a carry is held as its next value is
            if id(x) in nodes or id(nxt) in nodes:
                nodes |= {id(x), id(nxt)}
        if len(nodes) == before:
            return Segments(widths, frozenset(nodes), frozenset(slices))


def _refined(widths: dict[int, tuple[tuple[int, int], ...]], cut_at: list[tuple[int, int, int]]
             ) -> dict[int, tuple[tuple[int, int], ...]]:
    """The ranges of each segmented width, cut wherever a slice between two segmented widths needs them: a GRU
    reads ``rz = sigmoid(gx[:, :2H] + gh[:, :2H])`` by its ranges (r, z), so the gate row ``gh`` it slices (cut
    at 2H for ``n``) must be cut at H as well, and a slice's own ranges at every cut of its source inside it."""
    bounds = {w: {0, w, *(a for a, _ in cuts)} for w, cuts in widths.items()}
    changed = True
    while changed:
        changed = False
        for src, off, w in cut_at:
            if src in bounds and w in bounds:
                into_src = {off + b for b in bounds[w]} - bounds[src]
                into_slice = {b - off for b in bounds[src] if off < b < off + w} - bounds[w]
                bounds[src] |= into_src
                bounds[w] |= into_slice
                changed = changed or bool(into_src or into_slice)
    return {w: tuple((lo, hi - lo) for lo, hi in pairwise(sorted(b))) for w, b in bounds.items()}


def _same_columns(s: Node, m: Node) -> bool:
    """Whether ``m`` reads its source ``s`` column for column (an elementwise op, an expand or an in-place view of
    the same width)."""
    return s.ndim == m.ndim and row_width(s) == row_width(m) and (
        m.op in ELEMENTWISE or m.op == Op.EXPAND or _in_place(m))


def _by_ranges(m: Node, segs: Segments) -> bool:
    """A concat along the row, held by ranges, whose parts are exactly its width's ranges (an LSTM's four gate
    gradients joined): its parts are the ranges' tiles."""
    if m.op != Op.CONCAT or id(m) not in segs.nodes or not _along_the_row(m):
        return False
    cuts, off = [], 0
    for s in m.srcs:
        w = row_width(s)
        if w is None:
            return False
        cuts.append((off, w))
        off += w
    return tuple(cuts) == segs.widths.get(off)


def _segment_refusal(body: Graph, segs: Segments, held: set[int], readers: dict[int, list[Node]]) -> str | None:
    """Why the values of ``segs`` cannot be computed range by range: a held one with no form by ranges, or read
    otherwise than range by range (a view, an op of another width)."""
    by_id = {id(m): m for m in body.order}
    for i in segs.nodes:
        m = by_id.get(i)
        if m is None or i not in held:
            continue
        if m.op not in ELEMENTWISE and m.op not in (Op.MATMUL, Op.INPUT) and not _in_place(m) and not _by_ranges(
                m, segs):
            return f"{m.op.name.lower()} at {m.loc} has no form by ranges"
        for r in readers.get(i, []):
            ok = (id(r) in segs.nodes and r.op in ELEMENTWISE) or id(r) in segs.slices or (
                r.op in (Op.SUM, Op.REDUCE_MAX) and r.srcs[0] is m) or (r.op == Op.MATMUL and r.srcs[0] is m
                                                                        and r.srcs[1] is not m)
            if not ok:
                return f"{r.op.name.lower()} at {r.loc} reads {m.op.name.lower()} at {m.loc} whole"
    return None


def _tile_concat_refusal(m: Node, readers: list[Node], carried: bool) -> str | None:
    """A stored concat of tiles along the row (the gate gradients of an LSTM's backward step) stays a list of
    tiles: stored part by part, and read only as the left operand of products (one ``tl.dot`` per part, summed).
    Why ``m`` is not such a concat; None when it is."""
    if not _along_the_row(m):
        return "joins other than the values of a row"
    if carried:
        return "is carried to the next step"
    for r in readers:
        if r.op != Op.MATMUL or r.srcs[0] is not m or r.srcs[1] is m:
            return f"is read by {r.op.name.lower()} at {r.loc}, not as a product's left operand"
    return None


def _along_the_row(concat: Node) -> bool:
    """A concat of ``[rows, w]`` values along their row (its parts are column ranges of one tile's width)."""
    return concat.ndim == 2 and concat.attrs["axis"] == 1


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

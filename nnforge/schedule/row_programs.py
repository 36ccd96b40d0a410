"""Which consecutive kernels run as one kernel over whole rows (``Target.row_programs``, ``Rows``): in the program
and in the body of a loop the host steps (a row-split body is one kernel already).

A layer norm over the last axis is a sum, a sum of squared deviations and an elementwise kernel; a softmax a max,
an exponential, a sum and a division: three or four kernels, each reading the rows from memory again. Where a
program can hold whole rows (at most ``row_programs`` values each), they are one kernel: each program takes its
rows through every member in order, and a member reads what an earlier one computed where it was computed — a
row's sum broadcast along the row, an element of the rows at its own element. Every other read is a load of a
buffer the group does not write (a member's store is read back by no other member: that would be a load of what
other threads of the program stored, unordered). A kernel that would read an earlier member any other way (at
another element, through a stored alias) starts a new group.

A GEMM whose result rows are narrow enough (``Target.gemm_row_programs``) may lead such a group: each program
computes whole rows of the product (its tile all N columns), and the reductions and elementwise kernels after it
read them from the accumulator — a projection and its layer norm, a transformer's output projection, residual
add and norm — so the product is not written and read back. Its readers may see its rows with their leading axis
split (``[T * N, 4H]`` read as ``[T, N, 4H]``): the same rows, the same elements.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..ir.dims import fixed, same_product
from ..ir.node import Graph, Node, users
from ..ir.ops import ELEMENTWISE, MOVEMENT, Op
from ..passes.fuse import Grouping
from .program import Elementwise, Gemm, Kernel, Loop, Reduce, Rows, stored_node

Member = Reduce | Elementwise | Gemm
_VIEWS = MOVEMENT | {Op.GATHER}  # inlined where they are read


def row_programs(kernels: Sequence[Kernel | Loop], graph: Graph, g: Grouping, widest: int,
                 dynamic: set[str], gemm_widest: int = 0) -> tuple[Kernel | Loop, ...]:
    """``graph``'s ``kernels`` with each run of consecutive kernels over the same rows of at most ``widest``
    values (a width fixed when compiling: none of ``dynamic``, the run-time size symbols) that holds a row
    reduction made one ``Rows`` kernel, led by the GEMM before them where its rows are at most ``gemm_widest``
    values (``widest`` 0: ``kernels`` as they are)."""
    if not widest:
        return tuple(kernels)
    readers = users(graph.order)
    results = {id(o) for o in graph.outputs}
    out: list[Kernel | Loop] = []
    run: list[Member] = []
    rows: tuple[tuple, int] = ((), 0)
    for k in kernels:
        if type(k) is Gemm:
            out.extend(_joined(run, rows, readers, results, g))
            run = []
            shape = _gemm_rows(k, gemm_widest, dynamic)
            if shape is None:
                out.append(k)
            else:
                run, rows = [k], shape
            continue
        shape = _rows_of(k, widest, dynamic) if isinstance(k, Reduce) or type(k) is Elementwise else None
        if (len(run) == 1 and type(run[0]) is Gemm and run[0].node.ndim == 2 and shape is not None
                and _same_rows(shape, rows, dynamic)):
            rows = shape  # the product's rows as its readers index them: its leading axis split, maybe
        if run and (shape != rows or not _reads_rowwise(k, run, g, rows)):  # type: ignore[arg-type]
            out.extend(_joined(run, rows, readers, results, g))
            run = []
        if shape is None:
            out.append(k)
            continue
        rows = rows if run else shape
        run.append(k)  # type: ignore[arg-type]
    out.extend(_joined(run, rows, readers, results, g))
    return tuple(out)


def _gemm_rows(k: Gemm, widest: int, dynamic: set[str]) -> tuple[tuple, int] | None:
    """(its rows, their width) of a GEMM that may lead a group: a product of matrices, or a batch of them (an
    attention's scores; K summed whole, B not held across a loop's steps) of a compile-time width of 2 to
    ``widest`` columns."""
    p = k.node
    if not widest or k.k_parts > 1 or k.b_resident or k.pack_a or k.k_split:
        return None
    width = fixed(p.shape[-1], dynamic)
    if width is None or not 2 <= width <= widest:
        return None
    return tuple(p.shape[:-1]), width


def _same_rows(a: tuple[tuple, int], b: tuple[tuple, int], dynamic: set[str]) -> bool:
    """Rows of one width whose leading axes hold as many rows, whatever the run-time sizes (``dynamic``)."""
    fa, fb = fixed(a[0], dynamic), fixed(b[0], dynamic)
    if fa is not None and fb is not None:
        return a[1] == b[1] and fa == fb
    return a[1] == b[1] and same_product(math.prod(a[0]), math.prod(b[0]))


def _joined(run: list[Member], rows: tuple[tuple, int], readers: dict[int, list[Node]], results: set[int],
            g: Grouping) -> list[Kernel]:
    """``run`` as one ``Rows`` kernel where it holds a row reduction and another kernel, else as it is."""
    if len(run) < 2 or not any(isinstance(k, Reduce) for k in run):
        return list(run)
    stores = tuple(k.out.output is not None or bool(k.also) or _read_after(stored_node(k), run, readers, results, g)
                   for k in run)
    last = run[-1]
    return [Rows(last.node, last.out, tuple(f for k in run for f in k.fuses), (), tuple(run), rows[0], rows[1],
                 stores, _split_views(run, rows, g))]


def _split_views(run: list[Member], rows: tuple[tuple, int], g: Grouping) -> tuple[Node, ...]:
    """The reshapes through which later members read the leading GEMM's rows with their leading axis split (of the
    product, or of elementwise work inlined on it: ``_on_product``), as ``_reads_rowwise`` let them."""
    if type(run[0]) is not Gemm:
        return ()
    earlier = {id(stored_node(m)): m for m in run}
    full = (*rows[0], rows[1])
    found: dict[int, Node] = {}
    stack = [s for k in run[1:] for n in (k.node, getattr(k, "epilogue", None)) if n is not None for s in n.srcs]
    seen: set[int] = set()
    while stack:  # what the members inline, down to the buffers and the members' own values
        n = stack.pop()
        if id(n) in seen or id(n) in earlier or g.is_stored(n):
            continue
        seen.add(id(n))
        if _splits_product_rows(n, full, run, g, earlier):
            found[id(n)] = n
        elif n.op in ELEMENTWISE or n.op in _VIEWS:
            stack.extend(n.srcs)
    return tuple(found.values())


def _rows_of(k: Member, widest: int, dynamic: set[str]) -> tuple[tuple, int] | None:
    """(the leading dims, the row's width) of a kernel that may join a group: a float or integer sum or max over
    the last axis alone, or an elementwise kernel, over rows of a compile-time width of 2 to ``widest`` values."""
    if isinstance(k, Reduce):
        src = k.node.srcs[0]
        if (k.leading or src.ndim < 2 or tuple(k.node.attrs["axes"]) != (src.ndim - 1,)
                or not (k.node.dtype.is_float or k.node.dtype.is_int)):
            return None
        shape = src.shape
    elif k.node.ndim >= 2:
        shape = k.node.shape
    else:
        return None
    width = fixed(shape[-1], dynamic)
    if width is None or not 2 <= width <= widest:
        return None
    return tuple(shape[:-1]), width


def _per_row(n: Node, lead: tuple) -> bool:
    """``n`` holds one value per row: shape ``lead`` or ``lead + (1,)``."""
    return tuple(n.shape) in (lead, (*lead, 1))


def _reads_rowwise(k: Member, run: list[Member], g: Grouping, rows: tuple[tuple, int]) -> bool:
    """Whether ``k`` reads earlier members' values only as the program holds them: a reduction's value per row
    (through broadcasts along the row, reshapes between ``lead`` and ``lead + (1,)`` and elementwise ops), an
    elementwise member's at the element being computed; never through a stored alias or another view."""
    earlier = {id(stored_node(m)): m for m in run}
    lead = rows[0]
    full = (*lead, (k.node.srcs[0] if isinstance(k, Reduce) else k.node).shape[-1])
    seen: set[int] = set()

    def ok(n: Node) -> bool:
        if id(n) in seen:
            return True
        seen.add(id(n))
        if id(n) in earlier:  # held: a row's value wherever its row is read, an element at its own element
            return isinstance(earlier[id(n)], Reduce) or tuple(n.shape) == full
        if n.op == Op.CONST or (n is k.node and isinstance(k, Reduce)):  # the kernel's own sum, in its epilogue
            return True
        if n is not computed and id(n) not in g.alias and (g.is_stored(n) or n.op in (Op.INPUT, Op.DATA, Op.PROJ)):
            return True  # a load of a buffer the group does not write
        if n.op == Op.EXPAND and tuple(n.shape) == full and _per_row(n.srcs[0], lead) and id(n) not in g.alias:
            return ok(n.srcs[0])
        if n.op == Op.RESHAPE and _per_row(n, lead) and _per_row(n.srcs[0], lead) and id(n) not in g.alias:
            return ok(n.srcs[0])
        if _splits_product_rows(n, full, run, g, earlier):
            return True  # held there
        if n.op in ELEMENTWISE:
            return all(ok(s) for s in n.srcs)
        return not _reaches(n, earlier, g)  # another view, or a stored alias: only of what the group does not write

    computed = k.epilogue if isinstance(k, Reduce) else k.node  # the stored value the kernel computes, not loads
    if isinstance(k, Reduce):
        return ok(k.node.srcs[0]) and (computed is None or ok(computed))
    return ok(computed)


def _splits_product_rows(n: Node, full: tuple, run: list[Member], g: Grouping, earlier: dict[int, Member]) -> bool:
    """Whether ``n`` reads the leading GEMM's rows (or elementwise work on them) with their leading axis split to
    ``full``: the rows the program holds, at their own elements (``Rows.views``)."""
    return n.op == Op.RESHAPE and tuple(n.shape) == full and _on_product(n.srcs[0], run, g, earlier)


def _on_product(n: Node, run: list[Member], g: Grouping, earlier: dict[int, Member]) -> bool:
    """Whether ``n`` is the leading GEMM's product (its stored value) or elementwise work inlined on it at the same
    element (a bias added after a reshape was moved before it), reading nothing else the group computes: the
    kernel evaluates it where the product's rows are."""
    if type(run[0]) is not Gemm or n.ndim != 2:
        return False
    product = stored_node(run[0])

    def ok(m: Node) -> bool:
        if m is product:
            return True
        if m.op in ELEMENTWISE and not g.is_stored(m) and id(m) not in g.alias and tuple(m.shape) == tuple(n.shape):
            return all(ok(s) for s in m.srcs)
        return not _reaches(m, earlier, g)  # other data (a bias row), read at the element

    return ok(n)


def _read_after(n: Node, run: list[Member], readers: dict[int, list[Node]], results: set[int],
                g: Grouping) -> bool:
    """Whether a kernel outside the group (or the graph's results) reads ``n``: a reader of it that the group's
    kernels do not compute, or one that is inlined wherever it is read, read so by such a kernel."""
    computed = {id(k.node) for k in run} | {id(k.epilogue) for k in run if isinstance(k, Reduce | Gemm) and k.epilogue}
    stack, seen = [n], set()
    while stack:
        m = stack.pop()
        if id(m) in results:
            return True
        for u in readers.get(id(m), ()):
            if id(u) in seen or id(u) in computed:
                continue
            seen.add(id(u))
            if g.is_stored(u) or not (u.op in ELEMENTWISE or u.op in _VIEWS):
                return True  # a kernel of its own, a loop
            stack.append(u)  # inlined into whichever kernels read it, or a view of the buffer that they load
    return False


def _reaches(n: Node, earlier: dict[int, Member], g: Grouping) -> bool:
    """Whether ``n``'s value in this kernel depends on an earlier member's (through anything it inlines or the
    buffer an alias reads)."""
    stack, seen = [n], set()
    while stack:
        m = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        if id(m) in earlier:
            return True
        if m is not n and g.is_stored(m) and id(m) not in g.alias:
            continue
        stack.extend(m.srcs)
    return False

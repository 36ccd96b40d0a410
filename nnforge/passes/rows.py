"""Row-separable scans: bodies in which batch row ``b`` of every step depends only on row ``b`` of the carries and
of the step's inputs, so the rows can be split among threads that then run the whole time loop on their own rows.

Why: a recurrent step is a small GEMM (M = batch) plus a cell update. Splitting its *columns* among threads costs a
barrier per time step, and on a shared 2-vCPU machine a barrier is where the time goes (measured: libgomp's
barrier spin took 39 % of an LSTM's samples at H = 96 while another process ran). Rows of a batch are
independent in every RNN cell (LSTM, GRU, layer-norm LSTM: the norm reduces over features, not over the batch),
so a thread that owns rows ``[r0, r1)`` needs nobody else's results until the loop ends: no barrier per step.

``row_split(scan)`` decides whether a scan's body is row-separable and returns the body rewritten so that its
batch axis is the symbolic size ``ROWS`` (rendered by the C backend as the thread's row count), with the batch
size it replaces. The classification, per body node:

* ROW: axis 0 is the batch axis and row ``b`` depends only on rows ``b`` of ROW inputs (the carries, whose axis 0
  is the batch, and the step's slices of the scanned inputs, whose axis 1 is).
* FREE: depends on no ROW node (loop-invariant inputs, constants and what is computed from them). A FREE node
  read by a ROW elementwise op has the full batch size on axis 0; it is allowed only when it is a broadcast (a
  constant, or an expand from size 1), which is then rewritten with ``ROWS`` too.

Anything else reading a ROW node (a reduction over the batch, a matmul contracting it, a nested loop, random
numbers) makes the body not row-separable; the reason is returned for ``NNFORGE_DEBUG=2``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..ir.build import make, rebuild
from ..ir.dims import Dim, sym, symbol_name
from ..ir.node import Graph, Node
from ..ir.ops import ELEMENTWISE, REDUCE, Op
from ..schedule import Target

ROWS = "nf_rows"
"""The symbol a row-split body uses for its batch size (one thread's share of the rows)."""


@dataclass(frozen=True)
class RowSplit:
    """A scan's body with its batch axis made the symbol ``ROWS``; ``batch`` is the full batch size;
    ``per_row`` the positions of loop-invariant body inputs read row by row (each thread gets its rows of them)."""

    body: Graph
    batch: int
    per_row: tuple[int, ...] = ()


class NotSeparable(Exception):
    """Why a body is not row-separable (not an error: the scan is then work-shared column by column)."""


def row_split(scan: Node) -> RowSplit | NotSeparable:
    """The row-local body of ``scan`` or the reason there is none."""
    try:
        return _split(scan)
    except NotSeparable as why:
        return why


def worth_splitting(scan: Node, target: Target) -> RowSplit | NotSeparable:
    """``row_split`` and the policy on top of it: a batch of at least ``target.min_split_rows`` rows and per-step
    weights within ``target.max_split_weight_bytes``. The one predicate the passes that prepare a split and the
    backend that runs it both ask."""
    split = row_split(scan)
    if isinstance(split, NotSeparable):
        return split
    if int(split.batch) < target.min_split_rows:
        return NotSeparable(f"batch {int(split.batch)} is too small to split among threads")
    w = step_weight_bytes(scan, pow2=target.pow2_weights)
    if w > target.max_split_weight_bytes:
        return NotSeparable(f"its weights ({w // 1024} KB) exceed {target.max_split_weight_bytes // 1024} KB: every "
                            "thread would stream all of them from L3 each step, where work-shared steps read half each")
    return split


def step_weight_bytes(scan: Node, pow2: bool = False) -> int:
    """Bytes of the matrices the loop must read every step: right operands of matmuls whose left operand depends
    on a carry (``h @ W_hh``). A matmul of step inputs only (``x_t @ W_ih``) does not count: hoisting takes it
    out of the loop, so the answer is the same before and after that pass. ``pow2``: each operand's sides
    rounded up to powers of two (the blocks a Triton program holds them in)."""
    body: Graph = scan.attrs["body"]
    nc = scan.attrs["n_carry"]
    dep = {id(c) for c in body.inputs[:nc]}
    seen: dict[int, int] = {}
    for n in body.order:
        if any(id(s) in dep for s in n.srcs):
            dep.add(id(n))
            if n.op == Op.MATMUL and id(n.srcs[0]) in dep and id(n.srcs[1]) not in dep:
                w = n.srcs[1]
                while w.op in (Op.PERMUTE, Op.RESHAPE, Op.EXPAND, Op.SLICE) and w.op != Op.INPUT:
                    w = w.srcs[0]
                if pow2:
                    dims = [int(d) for d in n.srcs[1].shape]
                    dims[-2:] = [1 << max(d - 1, 0).bit_length() for d in dims[-2:]]
                    seen[id(n.srcs[1])] = math.prod(dims) * w.dtype.itemsize
                else:
                    seen[id(w)] = math.prod(int(d) for d in w.shape) * w.dtype.itemsize
    return sum(seen.values())


def _split(scan: Node) -> RowSplit:
    if scan.op != Op.SCAN:
        raise NotSeparable("only scans are split by rows")
    a = scan.attrs
    body: Graph = a["body"]
    nc, nx = a["n_carry"], a["n_xs"]
    if nc == 0:
        raise NotSeparable("no carry")
    carries, xs = body.inputs[:nc], body.inputs[nc:nc + nx]
    if any(c.ndim < 1 for c in carries) or any(x.ndim < 1 for x in xs):
        raise NotSeparable("a carry or step input has no batch axis")
    batch = carries[0].shape[0]
    if any(int(c.shape[0]) != int(batch) for c in (*carries, *xs)):
        raise NotSeparable("carries and step inputs disagree on axis 0 (no common batch axis)")
    rows = sym(ROWS, int(batch))
    row_ids = {id(n) for n in (*carries, *xs)}
    localize: set[int] = set(row_ids)  # nodes whose axis 0 becomes ROWS
    whole: set[int] = set()  # loop-invariant nodes read whole (a matmul's weights, the source of a FREE node)
    for n in body.order:
        if n.op == Op.INPUT:
            continue
        if not any(id(s) in row_ids for s in n.srcs):
            whole.update(id(s) for s in n.srcs)
            continue
        _classify(n, row_ids, localize, int(batch))
        if n.op == Op.MATMUL:
            whole.add(id(n.srcs[1]))
        row_ids.add(id(n))
    for k, o in enumerate(body.outputs):
        if id(o) not in row_ids:
            raise NotSeparable(f"body output {k} does not depend on the rows (no batch axis to split)")
    for n in body.order:  # a broadcast rewritten for the rows must not also be read whole
        if id(n) in localize and id(n) in whole:
            raise NotSeparable(f"{_name(n)} is read both per row and whole")
    per_row = tuple(k for k, i in enumerate(body.inputs) if k >= nc + nx and id(i) in localize)
    return RowSplit(_localize(body, localize, rows), batch, per_row)


def _classify(n: Node, row_ids: set[int], localize: set[int], batch: int) -> None:
    """Check that row node ``n`` keeps the batch on axis 0 and reads nothing across rows; mark what to rewrite."""
    srcs = n.srcs
    rowsrc = [id(s) in row_ids for s in srcs]
    if n.op in ELEMENTWISE or n.op == Op.CONCAT:
        if n.op == Op.CONCAT and n.attrs["axis"] == 0:
            raise NotSeparable(f"{_name(n)} concatenates along the batch axis")
        for s, r in zip(srcs, rowsrc):
            if not r:
                _broadcast(s, localize, batch, n)
    elif n.op in (Op.GATHER, Op.SCATTER_ADD):
        if n.attrs["axis"] == 0:
            raise NotSeparable(f"{_name(n)} indexes along the batch axis")
        for s, r in zip(srcs, rowsrc):  # off its axis an index moves with the row: row b reads row b
            if not r:
                _broadcast(s, localize, batch, n)
    elif n.op == Op.MATMUL:
        if n.ndim != 2:
            raise NotSeparable(f"{_name(n)} is a batched matmul")
        if not rowsrc[0] or rowsrc[1]:
            raise NotSeparable(f"{_name(n)} contracts the batch axis")
    elif n.op in REDUCE:
        if 0 in n.attrs["axes"]:
            raise NotSeparable(f"{_name(n)} reduces over the batch axis")
    elif n.op == Op.PERMUTE:
        if n.attrs["perm"][0] != 0:
            raise NotSeparable(f"{_name(n)} moves the batch axis")
    elif n.op == Op.RESHAPE:
        if int(srcs[0].shape[0]) != batch:
            raise NotSeparable(f"{_name(n)} merges the batch axis")
    elif n.op == Op.EXPAND:
        if int(srcs[0].shape[0]) != batch:
            raise NotSeparable(f"{_name(n)} broadcasts along the batch axis")
    elif n.op == Op.SLICE:
        if (n.attrs["starts"][0], n.attrs["steps"][0]) != (0, 1) or int(n.attrs["stops"][0]) != batch:
            raise NotSeparable(f"{_name(n)} slices the batch axis")
    elif n.op == Op.PAD:
        if tuple(n.attrs["pads"][0]) != (0, 0):
            raise NotSeparable(f"{_name(n)} pads the batch axis")
    else:
        raise NotSeparable(f"{_name(n)} is not split by rows ({n.op.name.lower()} in the body)")
    if n.ndim < 1 or int(n.shape[0]) != batch:
        raise NotSeparable(f"{_name(n)} drops the batch axis")
    localize.add(id(n))


def one_row_broadcast(n: Node) -> bool:
    """An ``expand`` from one row: every row of the batch reads the same values."""
    return n.op == Op.EXPAND and int(n.srcs[0].shape[0]) == 1


def _broadcast(s: Node, localize: set[int], batch: int, user: Node) -> None:
    """A FREE operand of a row op, read element by element (same shape): fine when every row sees the same values
    (a constant or an expand from one row), or when it is a loop-invariant input (a bias expanded before the loop,
    a mask): row ``b`` then reads its row ``b``, and each thread is given its rows of it. Either way it is
    rewritten with the thread's row count."""
    if s.op in (Op.CONST, Op.INPUT) or one_row_broadcast(s):
        localize.add(id(s))
        return
    raise NotSeparable(f"{_name(user)} reads {_name(s)}, a loop-invariant with a batch axis computed in the body")


def _localize(body: Graph, localize: set[int], rows: Dim) -> Graph:
    """``body`` rebuilt (shape rules re-run) with ``rows`` on axis 0 of every node in ``localize``."""
    new: dict[int, Node] = {}
    for n in body.order:
        if n.op == Op.INPUT:
            local = id(n) in localize
            new[id(n)] = make(Op.INPUT, (), {**n.attrs, "shape": (rows, *n.attrs["shape"][1:])}, loc=n.loc) \
                if local else n
        else:
            attrs = n.attrs
            if id(n) in localize and n.op in (Op.CONST, Op.EXPAND, Op.RESHAPE):
                attrs = {**n.attrs, "shape": (rows, *n.attrs["shape"][1:])}
            elif id(n) in localize and n.op == Op.SLICE:
                attrs = {**n.attrs, "stops": (rows, *n.attrs["stops"][1:])}
            srcs = tuple(new[id(s)] for s in n.srcs)
            new[id(n)] = n if srcs == n.srcs and attrs is n.attrs else rebuild(n, srcs, attrs)
        if id(n) in localize and not is_rows(new[id(n)].shape[0]):
            raise NotSeparable(f"{_name(n)} lost the batch axis when rewritten")
    return Graph([new[id(i)] for i in body.inputs], [new[id(o)] for o in body.outputs],
                 [new[id(e)] for e in body.effects])


def is_rows(d: int) -> bool:
    """Whether a size is a row-split body's batch axis."""
    return symbol_name(d) == ROWS


def _name(n: Node) -> str:
    return f"{n.op.name.lower()} at {n.loc}"

"""``schedule(graph, target) -> Program``: every decision past the graph passes, taken once and recorded.

Taken here, from the graph, its fusion grouping (``passes.fuse``) and the backend's ``Target``:

* the kernels of each graph, in order, and their form (elementwise, reduce, GEMM with an epilogue, a GEMM run
  tile by tile with its column-slice readers, concat, scatter-add, copy);
* where each value goes: a result of its graph (the kernel stores into it), scratch of its own, and the extra
  results a kernel stores the same values into (a scan step's h: the next carry and this step's output row);
* which scans run with their batch rows split among workers (``passes.rows.worth_splitting`` with the target,
  plus the conditions of a split body: static batch, every kernel on rows), and how many rows a pass of the body
  runs on;
* which hoisted input projections are computed inside their row-split loop a chunk of steps at a time;
* which GEMM operands are loop-invariant (B resident across steps);
* which kernels run a vector of the last axis at a time (elementwise kernels, row sums, GEMM epilogue tiles);
* which consecutive kernels over the same rows run as one, each program on whole rows (``row_programs``: a
  layer norm's or a softmax's reductions and elementwise kernels, in the program or a host-stepped body).

A renderer walks the ``Program`` and spells these decisions; it decides none of them.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Iterator

from ..dtypes import DType
from ..ir.dims import fixed, free_symbols, substitute
from ..ir.expr import ONE, ZERO, Expr, coefficient, depends, replace_var, row_major, var
from ..ir.expr import size as size_expr
from ..ir.index import index_map, sliced_index, strided
from ..ir.lengths import loop_length_symbols
from ..ir.node import Graph, Node, users
from ..ir.ops import ELEMENTWISE, REDUCE, Op
from ..passes.fuse import CHEAP, STRIDED, Grouping, Recompute, SlicedGroup, group
from ..passes.rows import ROWS, NotSeparable, RowSplit, is_rows, worth_splitting
from .program import (
    Block,
    Buf,
    ChunkedInput,
    Concat,
    Copy,
    Elementwise,
    Gemm,
    Kernel,
    Loop,
    Program,
    Random,
    Reduce,
    ScatterAdd,
    SlicedGemm,
)
from .registers import register_body_refusal
from .row_programs import row_programs
from .target import Target, Unsupported, gemm_tile

log = logging.getLogger("nnforge.schedule")


def schedule(graph: Graph, target: Target) -> Program:
    """The program that runs ``graph`` (after the passes of ``passes.pipeline(target)``) on ``target``; raises
    ``Unsupported`` for a graph compiled code cannot run (side effects, random numbers on a target that does not
    draw them: the reference interpreter runs those)."""
    if graph.effects:
        raise Unsupported("graphs with side effects (receivers, nf.loop) run on the reference backend")
    s = _Scheduler(target, loop_length_symbols(graph), itertools.count(), itertools.count())
    return Program(graph, target, s.block(graph, top=True, resident=frozenset()))


class _Scheduler:
    """The state of one ``schedule`` call: the target, the run-time size symbols, the buffer name counter and the
    fusion groupings made so far (by graph)."""

    def __init__(self, target: Target, dynamic: set[str], names: Iterator[int], draws: Iterator[int]):
        self.target = target
        self.dynamic = dynamic
        self.names = names
        self.draws = draws  # numbers the program's random nodes: each draws its own stream
        self.groupings: dict[tuple[int, Recompute], tuple[Graph, Grouping]] = {}  # the graph kept: its id its own

    def buf(self, n: Node, output: int | None = None) -> Buf:
        """The buffer of node ``n``: result ``output`` of its graph, or scratch."""
        return self.scratch(n.dtype, n.shape, output)

    def scratch(self, dtype: DType, shape: tuple, output: int | None = None) -> Buf:
        name = f"out{output}" if output is not None else f"b{next(self.names)}"
        return Buf(name, dtype, tuple(shape), output)

    def block(self, graph: Graph, top: bool, resident: frozenset[int], recompute: Recompute = CHEAP,
              whole_rows: bool = True) -> Block:
        """The kernels of ``graph``; ``resident``: ids of its inputs that do not change across the steps of the
        enclosing loop (none at the top level); ``recompute``: the fuser's policy for it; ``whole_rows``: its
        kernels over the same rows may be one (``row_programs``; not in a row-split body, one kernel already)."""
        g = self.grouping(graph, recompute)
        splits = {id(n): self.row_split(n) for n in graph.order if top and n.op == Op.SCAN}
        chunked = find_chunked(graph, g, splits) if top and self.target.chunk_bytes else {}
        sliced = {id(sg.root): sg for sg in g.sliced}
        member_of = {id(m) for sg in sliced.values() for m in sg.members}
        sliced_out = {id(n) for sg in sliced.values() for n in (sg.gemm, sg.root)}  # stored by its kernel
        dest: dict[int, int] = {}
        extra: dict[int, list[int]] = {}
        copies: list[tuple[Node, int]] = []
        dups: list[tuple[Node, int]] = []
        for pos, o in enumerate(graph.outputs):
            if id(o) in dest:
                extra.setdefault(id(o), []).append(pos)
                dups.append((o, pos))
            elif _stored_as_output(o, g, dest, sliced_out):
                dest[id(o.srcs[0])] = pos  # a reshape of a stored value: that value stored into the result
            elif id(o) not in sliced_out and (o.op in (Op.INPUT, Op.DATA) or not g.is_stored(o) or id(o) in g.alias):
                copies.append((o, pos))
            else:
                dest[id(o)] = pos
        stored_extra = set(member_of)
        kernels: list[Kernel | Loop] = []
        for n in graph.order:
            if (n.op in (Op.INPUT, Op.DATA, Op.PROJ) or id(n) in member_of or id(n) in g.alias
                    or not g.is_stored(n) or id(n) in chunked):
                continue
            if n.op in (Op.SCAN, Op.LOOP):
                kernels.append(self.loop(n, graph, g, dest, splits.get(id(n)),
                                         tuple(c for c in chunked.values() if c[0] is n), top))
            elif id(n) in sliced:
                sg = sliced[id(n)]
                outs = tuple(self.buf(m, dest.get(id(m))) for m in sg.members)
                returned = next((r for r in (sg.root, sg.gemm) if id(r) in dest), None)
                product = self.buf(returned, dest[id(returned)]) if returned is not None else None
                kernels.append(SlicedGemm(sg.gemm, outs[-1], _fuses(g, sg.root, sg.gemm, sg.members), (), sg,
                                          outs, tuple(tuple(extra.get(id(m), ())) for m in sg.members),
                                          _resident(sg.gemm, g, resident), self.sliced_lanes(sg, g), product,
                                          self.tile(sg.gemm, sg.width), returned is not sg.gemm))
            else:
                k = self.kernel(n, g, self.buf(n, dest.get(id(n))), tuple(extra.get(id(n), ())), resident, top)
                if isinstance(k, Elementwise | Gemm):
                    stored_extra.add(id(n))
                kernels.append(k)
        copies += [(o, pos) for o, pos in dups if id(o) not in stored_extra]
        if whole_rows:
            kernels = list(row_programs(kernels, graph, g, self.target.row_programs, self.dynamic,
                                        self.target.gemm_row_programs))
        return Block(graph, g, tuple(kernels), tuple(Copy(o, self.buf(o, pos), ()) for o, pos in copies))

    def kernel(self, n: Node, g: Grouping, out: Buf, also: tuple[int, ...], resident: frozenset[int],
               top: bool) -> Kernel:
        """The kernel computing stored node ``n``. Only an elementwise kernel and a GEMM store into ``also``
        themselves (the others' extra results are copied after them)."""
        if n.op == Op.MATMUL:
            return self.gemm(n, out, ("gemm",), also, None, _resident(n, g, resident), g, top)
        if n.op in REDUCE:
            return Reduce(n, out, (_name(n),), (), None, self.leading_sum(n, g), self.reduce_lanes(n, g))
        if id(n) in g.prologue:
            p = next(m for m in g.graph.order if id(m) == g.prologue[id(n)])
            if p.op == Op.MATMUL:
                return self.gemm(p, out, _fuses(g, n, p), also, n, _resident(p, g, resident), g, top)
            return Reduce(p, out, _fuses(g, n, p), (), n, self.leading_sum(p, g), self.reduce_lanes(p, g))
        if n.op == Op.RAND and self.target.random:
            return Random(n, out, ("rand",), (), next(self.draws), n.attrs["dist"])
        if n.op in (Op.RAND, Op.FEEDER, Op.RECEIVER):
            raise Unsupported(f"{n.op.name.lower()} runs on the reference backend")
        if n.op == Op.CONCAT:
            return Concat(n, out, ("concat", *_inlined(g, n)))
        if n.op == Op.SCATTER_ADD:
            return ScatterAdd(n, out, ("scatter_add", *_inlined(g, n)))
        return Elementwise(n, out, _inlined(g, n, root=n), also, *self.vector_lanes(n, g))

    def vector_lanes(self, n: Node, g: Grouping) -> tuple[int, tuple[int, int] | None]:
        """Elements of ``n``'s last axis an elementwise kernel computes at once: the target's lanes for its dtype
        when it has two axes or more, a static width of a vector at least, and a body that vectorizes along the
        last axis (``_vectorizes``); and the columns the vector loop covers (``Elementwise.columns``) where the
        body reads padded values along that axis: those where every such read is inside its source, a vector
        of them at least."""
        lanes = dict(self.target.vector_lanes).get(n.dtype, 1)
        if lanes == 1 or n.ndim < 2 or not self._wide(n.shape[-1], lanes):
            return 1, None
        idx = (*(var(f"i{k}") for k in range(n.ndim - 1)), var("lane"))
        inside: list[tuple[int, int]] = []
        if not self._vectorizes(n, idx, n, g, lanes, inside=inside):
            return 1, None
        if not inside:
            return lanes, None
        start = max(0, *(a for a, _ in inside))
        stop = min(int(n.shape[-1]), *(b for _, b in inside))
        return (lanes, (start, stop)) if stop - start >= lanes else (1, None)

    def reduce_lanes(self, p: Node, g: Grouping) -> int:
        """Columns a float sum or max over the last axis reads at once (vector partial sums or maxima): as for an
        elementwise kernel, of the reduced values along the reduced axis (1: the scalar loop)."""
        src = p.srcs[0]
        lanes = dict(self.target.vector_lanes).get(p.dtype, 1)
        if (p.op not in (Op.SUM, Op.REDUCE_MAX) or lanes == 1 or src.dtype != p.dtype
                or tuple(p.attrs["axes"]) != (src.ndim - 1,) or not self._wide(src.shape[-1], lanes)):
            return 1
        idx = (*(var(f"i{k}") for k in range(src.ndim - 1)), var("lane"))
        return lanes if self._vectorizes(src, idx, None, g, lanes) else 1

    def tile_lanes(self, p: Node, epilogue: Node | None, g: Grouping) -> int:
        """Columns of a GEMM tile whose epilogue (None: the plain store) runs at once: the target's lanes for the
        product's dtype when the epilogue vectorizes along the columns, the accumulator a vector there. (The
        tile is a whole number of vectors wide; a partial tile runs element by element whatever this says.)"""
        lanes = dict(self.target.vector_lanes).get(p.dtype, 1)
        if lanes == 1:
            return 1
        idx = (*(var(f"i{k}") for k in range(p.ndim - 1)), var("lane"))
        if epilogue is None:
            return lanes
        return lanes if self._vectorizes(epilogue, idx, epilogue, g, lanes, frozenset({(id(p), idx)})) else 1

    def sliced_lanes(self, sg: SlicedGroup, g: Grouping) -> int:
        """Columns of a sliced GEMM's tiles its epilogue and member kernels compute at once (as ``tile_lanes``):
        each slice's epilogue at its columns, then each member at the tile's, given the values before it."""
        p = sg.gemm
        lanes = dict(self.target.vector_lanes).get(p.dtype, 1)
        if lanes == 1:
            return 1
        row, lane = var("i"), var("lane")
        given: set[tuple[int, tuple[Expr, ...]]] = set()
        for off in sg.offsets:
            at = (row, sliced_index(lane, size_expr(int(off))))
            if sg.root is not p and not self._vectorizes(sg.root, at, sg.root, g, lanes,
                                                         frozenset({(id(p), at)})):
                return 1
            given.add((id(sg.root), at))
        for m in sg.members:
            if not self._vectorizes(m, (row, lane), m, g, lanes, frozenset(given)):
                return 1
            given.add((id(m), (row, lane)))
        return lanes

    def _wide(self, width: object, lanes: int) -> bool:
        w = self._static(width)
        return w is not None and w >= lanes

    def _vectorizes(self, start: Node, idx: tuple[Expr, ...], root: Node | None, g: Grouping, lanes: int,
                    given: frozenset[tuple[int, tuple[Expr, ...]]] = frozenset(),
                    inside: list[tuple[int, int]] | None = None) -> bool:
        """Whether ``start`` at ``idx`` can be evaluated ``lanes`` values of the index variable ``lane`` at once
        (``root``: the kernel's own node, computed not loaded): every value that moves with the lane has a vector
        form (its dtype's lanes, an op with a vector spelling; no concat or gather; a pad only with ``inside``)
        and every read of a buffer is contiguous or constant along the lane (its coefficient in the read's index
        is 1 or 0); what does not move with it is computed once, as a scalar, and needs a vector type only.
        ``given``: (id(node), index) of values the kernel already holds as vectors (a GEMM tile's accumulators);
        ``inside`` collects the lanes ``[start, stop)`` where each padded read is inside its source (see
        ``_lane_reads``)."""
        t = self.target
        widths = dict(t.vector_lanes)

        def fits(dt: DType) -> bool:
            return widths.get(dt) == lanes

        def spelled(m: Node) -> bool:
            return (m.op, m.dtype, tuple(s.dtype for s in m.srcs)) in t.vector_ops

        return _lane_reads(start, idx, root, g, self._size, fits, spelled, given, inside)

    def leading_sum(self, p: Node, g: Grouping) -> bool:
        """A float sum over leading axes whose reads run along the last kept axis (a bias gradient, a layer
        norm's weight gradient: ``[T, N, C] -> [C]``, a stored buffer or elementwise work on views of them): run
        with the outputs innermost, each read unit-stride. In the generic form every output walks its column
        with the stride of a whole row, ``T * N`` loads each from another cache line; on a GPU the same
        orientation makes a block's loads coalesced."""
        src = p.srcs[0]
        axes = tuple(sorted(p.attrs["axes"]))
        if not (p.op == Op.SUM and p.dtype.is_float and 0 < len(axes) < src.ndim
                and axes == tuple(range(len(axes)))):
            return False
        idx = (*(var(f"i{k}") for k in range(src.ndim - 1)), var("lane"))
        return _lane_reads(src, idx, None, g, self._size, lambda dt: True, lambda m: True)

    def _size(self, d: object) -> Expr:
        """A size as an index expression: a symbol where it is given per call, else its value."""
        return size_expr(d if free_symbols(d) & (self.dynamic | {ROWS}) else int(d))

    def loop(self, n: Node, graph: Graph, g: Grouping, dest: dict[int, int], split: RowSplit | None,
             chunked: tuple[tuple[Node, int, Node, Node, Node], ...], top: bool) -> Loop:
        a = n.attrs
        is_scan = n.op == Op.SCAN
        body: Graph = split.body if split else a["body"]
        if body.effects:
            raise Unsupported("loop bodies with side effects run on the reference backend")
        nc = a["n_carry"] if is_scan else a["n_state"]
        nx = a["n_xs"] if is_scan else 0
        projs = {m.attrs["index"]: m for m in graph.order if m.op == Op.PROJ and m.srcs[0] is n}
        results = []
        for i, (shape, dt) in enumerate(n.types):
            pj = projs.get(i)
            results.append(self.scratch(dt, shape, dest.get(id(pj)) if pj is not None else None))
        length = n.srcs[nc].shape[0] if is_scan and nx else a["length"]
        per_row = set(split.per_row) if split else set()
        # the loop invariants: source k is body input k, after an nf.loop's iteration index where it has one
        first = 0 if is_scan or not a["with_index"] else 1
        resident = frozenset(id(body.inputs[first + k]) for k in range(nc + nx, len(n.srcs)) if k not in per_row)
        ins = [ChunkedInput(k, chunk_steps(view, self.target), self.chunk_gemm(p, root, view, g), view)
               for _, k, view, root, p in chunked]
        # a loop the host steps launches each kernel of its body every step: the target may fuse more by recomputing
        block = self.block(body, top=False, resident=resident,
                           recompute=CHEAP if split else self.target.step_recompute, whole_rows=split is None)
        resident_steps = top and split is None and is_scan and self.target.resident_steps and resident_body(block)
        return Loop(n, tuple(results), length, bool(is_scan and a["reverse"]), block, split,
                    self.row_block(split, block) if split else 0, tuple(ins), resident_steps)

    def chunk_gemm(self, p: Node, root: Node, view: Node, g: Grouping) -> Gemm:
        """The GEMM of a chunked projection: ``steps`` steps of the scan's input at a time into a chunk buffer."""
        steps = chunk_steps(view, self.target)
        out = self.scratch(view.dtype, (steps * int(view.shape[1]), *view.shape[2:]))
        fuses = _fuses(g, root, p) if root is not p else ("gemm",)
        epilogue = root if root is not p else None
        return self.gemm(p, out, fuses, (), epilogue, True, g, True, split_k=False)  # the loop's kernel runs it

    def gemm(self, p: Node, out: Buf, fuses: tuple[str, ...], also: tuple[int, ...], epilogue: Node | None,
             resident: bool, g: Grouping, top: bool, split_k: bool = True) -> Gemm:
        """The GEMM record of matmul ``p``: its packing (``packing``), its epilogue tile's vector form and, where
        ``split_k`` allows (a GEMM a kernel of its own runs, not a loop's chunk), its K in parts (``k_parts``)."""
        pack_a, k_split = self.packing(p, epilogue, g, top)
        lanes = 1 if pack_a else self.tile_lanes(p, epilogue, g)
        parts = self.k_parts(p, top and split_k)
        partials = self.scratch(p.dtype.accumulator, (parts, *p.shape)) if parts > 1 else None
        return Gemm(p, out, fuses, also, epilogue, resident, pack_a, k_split, lanes, self.tile(p, p.shape[-1]),
                    parts, partials)

    def k_parts(self, p: Node, top: bool) -> int:
        """The most parts matmul ``p`` sums its K in (``Gemm.k_parts``; 1: one sum): a float product of two axes
        outside loops whose results, known when compiling, are fewer than ``target.split_k_outputs``, in as many
        parts as bring them to that many partial results, fewer where K is too short for them (K known when
        compiling, or a run-time K that stays short however long the sequence)."""
        t = self.target
        if not top or not t.split_k_outputs or p.ndim != 2 or not p.dtype.is_float:
            return 1
        results = self._static(tuple(p.shape))
        if results is None or t.split_k_outputs <= results:
            return 1
        # K bounds the parts at its length when every run-time size it depends on is vast: a K known when
        # compiling, or one that stays short however long the sequence (min(T, 1) x N, a carry's first step)
        k = p.srcs[0].shape[-1]
        longest = int(substitute(k, dict.fromkeys(free_symbols(k) & self.dynamic, 1 << 30)))
        parts = min(-(-t.split_k_outputs // max(1, results)), longest // t.split_k_min)
        return parts if parts > 1 else 1

    def tile(self, p: Node, width: object) -> tuple[int, int] | None:
        """The register tile of matmul ``p`` whose tiles cover ``width`` columns (``gemm_tile``, by its K and that
        width where they are known when compiling); None where the target names no tiles."""
        if not self.target.gemm_tiles:
            return None
        return gemm_tile(self.target, p.dtype, self._static(p.srcs[0].shape[-1]), self._static(width))

    def packing(self, p: Node, epilogue: Node | None, g: Grouping, top: bool) -> tuple[bool, bool]:
        """(pack_a, k_split) of matmul ``p``: A packed per worker for a 2-D GEMM outside loops whose A is read down
        its columns with K of at least ``target.pack_a_min_k`` (a weight gradient's xᵀ, K = T * N), or with M of
        at least ``target.pack_a_min_m``; sliced along K (by ``target.k_slice``) when the result holds the sums
        (no epilogue changing the dtype) and K is larger than a slice."""
        t = self.target
        if not top or p.ndim != 2:
            return False, False

        view = strided(p.srcs[0], lambda n: n if _has_buffer(n, g) or n.op in (Op.INPUT, Op.DATA) else None,
                       self._size)
        k_stride = view[2][-1] if view is not None else None
        K, M = int(p.srcs[0].shape[-1]), int(p.shape[-2])
        pack = ((k_stride != ONE and t.pack_a_min_k is not None and t.pack_a_min_k <= K)
                or (t.pack_a_min_m is not None and t.pack_a_min_m <= M))
        holds_sums = epilogue is None or epilogue.dtype == p.dtype
        return pack, pack and holds_sums and t.k_slice > 0 and t.k_slice < K

    def grouping(self, graph: Graph, recompute: Recompute = CHEAP) -> Grouping:
        """The fusion grouping of ``graph`` under ``recompute``, made once (the row-split checks and the block read
        the same one)."""
        key = (id(graph), recompute)
        if key not in self.groupings:
            self.groupings[key] = (graph, group(graph, recompute))
        return self.groupings[key][1]

    def row_split(self, n: Node) -> RowSplit | None:
        """``n``'s row-local body when splitting its batch rows among workers is possible and worth it: the body
        is row-separable, ``passes.rows.worth_splitting`` with the target agrees (batch and weight size), the
        batch is not a run-time size, and every kernel of the body has the batch axis (work without it would be
        repeated by every worker). The reason for a refusal is logged (``NNFORGE_DEBUG=2``)."""
        if not self.target.row_split:
            return None
        split = worth_splitting(n, self.target)
        why = None
        if isinstance(split, NotSeparable):
            why = str(split)
        elif free_symbols(split.batch) & self.dynamic:
            why = f"batch {split.batch} is a run-time size"
        else:
            g = self.grouping(split.body)
            for m in split.body.order:
                if m.op in (Op.INPUT, Op.DATA, Op.PROJ) or id(m) in g.alias or not g.is_stored(m):
                    continue
                if not (m.shape and is_rows(m.shape[0])):
                    why = f"{m.op.name.lower()} at {m.loc} in the body has no batch axis (it would run per worker)"
                    break
            if why is None and self.target.steps_in_registers:
                why = register_body_refusal(split.body, g, n.attrs["n_carry"] if n.op == Op.SCAN else
                                            n.attrs["n_state"], self.dynamic)
        if why is not None:
            log.debug("scan at %s not split by rows: %s", n.loc, why)
            return None
        return split

    def row_block(self, split: RowSplit, block: Block) -> int:
        """Rows per pass through a row-split body (0: all of a worker's rows at once). A body of several kernels
        (a layer norm's GEMM, row sums and elementwise passes; a GRU's two GEMMs) runs a few rows at a time, so
        what one kernel writes the next reads from L1: whole register tiles of its GEMMs (``gemm_tile``: 4 rows
        where an H = 96 step's tile has 4, not 6 that would leave 2 to a remainder tile), else
        ``target.row_block``; one fused kernel gains nothing."""
        g = self.grouping(split.body)
        kernels = [m for m in split.body.order if m.op not in (Op.INPUT, Op.DATA, Op.PROJ) and id(m) not in g.alias
                   and g.is_stored(m)]
        if len(kernels) <= 1 or not self.target.row_block:
            return 0
        rows = [k.tile[0] for k in block.kernels if isinstance(k, Gemm | SlicedGemm) and k.tile]
        return math.lcm(*rows) if rows else self.target.row_block

    def _static(self, d: object) -> int | None:
        """Size ``d`` where it is known when compiling (no run-time symbol, not the split batch), else None."""
        return fixed(d, self.dynamic | {ROWS})


def find_chunked(graph: Graph, g: Grouping,
                 splits: dict[int, RowSplit | None]) -> dict[int, tuple[Node, int, Node, Node, Node]]:
    """The hoisted input projections of row-split scans that can be computed chunk by chunk inside their loop:
    by id(root), (scan, k, view, root, matmul) for a GEMM (``root``: its epilogue root, or the matmul) whose only
    reader is the ``k``-th scanned input of the scan, through the reshape ``view``.

    Why: the hoisted ``x @ W_ih + b`` ([T, N, 4H]: 196 MB at T = 2000, N = 64, H = 96) would go through DRAM
    twice, written by the GEMM and read back step by step. Computed a chunk of steps at a time (between two
    synchronizations, which a row-split loop has no others of), the chunk stays in cache for the steps that read
    it. A training step also reads the projection in the backward pass: there it has another reader and stays
    whole."""
    us = users(graph.order)
    outs = {id(o) for o in graph.outputs}
    found: dict[int, tuple[Node, int, Node, Node, Node]] = {}
    for n in graph.order:
        if n.op != Op.SCAN or splits.get(id(n)) is None:
            continue
        nc, nx = n.attrs["n_carry"], n.attrs["n_xs"]
        for k in range(nx):
            view = n.srcs[nc + k]
            if view.op != Op.RESHAPE or id(view) not in g.alias or view.ndim != 3:
                continue
            root = view.srcs[0]
            p = root if root.op == Op.MATMUL else next((m for m in graph.order if id(m) == g.prologue.get(id(root))),
                                                       None)
            if p is None or p.op != Op.MATMUL or p.ndim != 2 or not g.is_stored(root):
                continue
            if us.get(id(root), []) != [view] or us.get(id(view), []) != [n]:
                continue
            if id(root) in outs or id(view) in outs or sum(s is view for s in n.srcs) != 1:
                continue
            if int(p.shape[0]) != int(view.shape[0]) * int(view.shape[1]):
                continue
            found[id(root)] = (n, k, view, root, p)
    return found


def chunk_steps(view: Node, target: Target) -> int:
    """Steps per chunk of a projection read through ``view`` ([T, batch, width]): as many as fit
    ``target.chunk_bytes`` (at least one, at most ``target.max_chunk_steps``)."""
    per_step = int(view.shape[1]) * int(view.shape[2]) * view.dtype.itemsize
    return max(1, min(target.max_chunk_steps, target.chunk_bytes // max(per_step, 1)))


def _has_buffer(n: Node, g: Grouping) -> bool:
    return id(n) in g.stored and id(n) not in g.epilogue_of


def _lane_reads(start: Node, idx: tuple[Expr, ...], root: Node | None, g: Grouping,
                size: Callable[[object], Expr], fits: Callable[[DType], bool], spelled: Callable[[Node], bool],
                given: frozenset[tuple[int, tuple[Expr, ...]]] = frozenset(),
                inside: list[tuple[int, int]] | None = None) -> bool:
    """Whether every buffer ``start`` reads at ``idx`` is read contiguously or at one place along the index
    variable ``lane`` (its coefficient 1 or 0), through views and elementwise ops only (no concat or gather),
    with ``fits`` true of every value's dtype and ``spelled`` of every elementwise op on the way; a value whose
    index does not move with the lane needs only ``fits`` (it is computed once, as a scalar, and broadcast).
    ``root``: the kernel's own node (computed, not loaded); ``given``: (id(node), index) of values the kernel
    already holds. A pad is read only with ``inside`` given, padded along the lane alone, at ``lane + c`` of a
    static source (``c`` a constant): ``inside`` then gets the lanes ``[-c, size - c)`` where the read is in
    the source, and the source is read there, unclamped."""
    seen: dict[tuple, bool] = {}

    def read(m: Node, at: tuple[Expr, ...]) -> bool:
        e = row_major(at, [size(d) for d in m.shape])
        return fits(m.dtype) and (not depends(e, "lane") or coefficient(e, "lane") == ONE)

    def ok(m: Node, at: tuple[Expr, ...]) -> bool:
        key = (id(m), at)
        if key in given:
            return fits(m.dtype)
        if key not in seen:
            seen[key] = one(m, at)
        return seen[key]

    def one(m: Node, at: tuple[Expr, ...]) -> bool:
        if m is not root and not any(depends(e, "lane") for e in at):
            return fits(m.dtype)
        if m is not root and _has_buffer(m, g):
            return read(m, at)
        if m.op == Op.CONST:
            return fits(m.dtype)
        if m.op == Op.RESHAPE and _has_buffer(m.srcs[0], g):
            return read(m, at)
        if m.op in STRIDED:
            return ok(m.srcs[0], tuple(index_map(m, at, size)))
        if m.op == Op.PAD and inside is not None:
            return fits(m.dtype) and padded(m, at)
        return m.op in ELEMENTWISE and spelled(m) and fits(m.dtype) and all(ok(s, at) for s in m.srcs)

    def padded(m: Node, at: tuple[Expr, ...]) -> bool:
        src, spans, inner = m.srcs[0], [], []
        for i, (lo, hi), d in zip(at, m.attrs["pads"], src.shape):
            if int(lo) == 0 and int(hi) == 0:
                inner.append(i)
                continue
            j = i - size(lo)
            c, n = replace_var(j, "lane", ZERO).value, size(d).value
            if not depends(j, "lane") or coefficient(j, "lane") != ONE or c is None or not n:
                return False
            spans.append((-c, n - c))
            inner.append(j)
        assert inside is not None
        inside.extend(spans)
        return ok(src, tuple(inner))

    return ok(start, idx)


def _resident(p: Node, g: Grouping, resident: frozenset[int]) -> bool:
    """B of matmul ``p`` is a loop-invariant input of the body seen through movement ops (a weight)."""
    if p.ndim != 2:
        return False
    b = p.srcs[1]
    while b.op != Op.INPUT:
        if (_has_buffer(b, g) and id(b) not in g.alias) or b.op not in STRIDED:
            return False
        b = b.srcs[0]
    return id(b) in resident


def _name(n: Node) -> str:
    return {Op.MATMUL: "gemm", Op.REDUCE_MAX: "max"}.get(n.op, n.op.name.lower())


def _stored_as_output(o: Node, g: Grouping, dest: dict[int, int], sliced_out: set[int]) -> bool:
    """Whether result ``o``, a reshape another name for its source's buffer, is best made by storing that source
    straight into the result (a GEMM's ``[T * N, P]`` product returned as ``[T, N, P]``), not by a copy: the
    source is computed by a kernel of this graph, stored, and not yet stored into another result."""
    if o.op != Op.RESHAPE or id(o) not in g.alias:
        return False
    s = o.srcs[0]
    return (s.op not in (Op.INPUT, Op.DATA, Op.PROJ, Op.SCAN, Op.LOOP) and g.is_stored(s) and id(s) not in g.alias
            and id(s) not in dest and id(s) not in sliced_out)


def _fuses(g: Grouping, root: Node, p: Node, members: tuple[Node, ...] = ()) -> tuple[str, ...]:
    """The op names a GEMM or reduction kernel evaluates: its own, its epilogue's, its members' (sliced)."""
    names = [_name(p)]
    if root is not p:
        names += _inlined(g, root, root=root, stop=p)
    for m in members:
        names += _inlined(g, m, root=m, stop=p)
    return tuple(names)


def _inlined(g: Grouping, n: Node, root: Node | None = None, stop: Node | None = None) -> tuple[str, ...]:
    """The elementwise ops evaluated in the kernel of ``n`` (``root``: its own node, computed not loaded), in
    evaluation order: sources first, each once."""
    seen: set[int] = set()
    names: list[str] = []

    def walk(m: Node) -> None:
        if id(m) in seen or m is stop:
            return
        seen.add(id(m))
        if m is not root and (_has_buffer(m, g) or id(m) in g.alias):
            return
        for s in m.srcs:
            walk(s)
        if m.op in ELEMENTWISE:
            names.append(m.op.name.lower())
        elif m.op == Op.GATHER:
            names.append("gather")

    for s in (n.srcs if root is None else (n,)):
        walk(s)
    return tuple(names)


def resident_body(block: Block) -> bool:
    """Whether a host loop's body can run as one launch of resident programs (``Target.resident_steps``): each of
    its kernels then runs on those programs in turn, and what a kernel launch would decide on the host per step
    cannot be decided there — a nested loop (its own steps), a random draw (its key), a GEMM summed in parts (its
    parts, from K at run time)."""
    return all(not isinstance(k, Loop | Random) and not (isinstance(k, Gemm) and k.k_parts > 1)
               for k in block.kernels)

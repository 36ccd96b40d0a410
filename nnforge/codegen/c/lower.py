"""Lowering a graph to C: kernels inside one OpenMP parallel region, scans as C loops.

Each top-level kernel or scan is its own C function called from that region (``parts``: compile time, and one
copy of the code for same-shaped layers).

Each stored node (see ``passes.fuse``) gets a kernel; everything else is inlined into its reader as scalar
statements and index expressions. A scan becomes ``for (t ...)`` around its body's kernels with ping-pong
carry buffers, so no Python runs per time step, and the trip count is read from the input shapes at run time.
All buffers are allocated once before the parallel region (loop bodies reuse theirs every step).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ...dtypes import DType
from ...errors import NNForgeError
from ...ir.expr import ZERO, Expr, clamp, coefficient, depends, row_major, var
from ...ir.index import index_map, sliced_index, strided
from ...ir.node import Graph, Node
from ...ir.ops import ELEMENTWISE, Op
from ...ir.printer import fmt_type
from ...passes.fuse import Grouping
from ...passes.rows import ROWS, is_rows
from ...schedule import (
    Block,
    Buf,
    ChunkedInput,
    Concat,
    Elementwise,
    Gemm,
    Kernel,
    Loop,
    Program,
    Random,
    Reduce,
    ScatterAdd,
    SlicedGemm,
    stored_node,
)
from ...schedule.identical import step_keys
from ...schedule.memory import Slot, lifetimes, plan
from .cexpr import (
    PRELUDE,
    VECTORS,
    Sizes,
    Unsupported,
    byte_size,
    ceil_div,
    ctype,
    formula,
    lane_stride,
    literal,
    store,
    vector_formula,
)
from .chunks import emit_chunk
from .emit import Emitter, Names
from .gemm import Epilogue, GemmConfig, Tile, View, check_dtype, emit_gemm, emit_sliced, gemm_prelude, pack_panels
from .memplan import slot_bytes_function
from .parts import UNIT_MARK, part_functions, split_parts
from .rowsched import RowScope

log = logging.getLogger("nnforge.codegen.c")

# Rows (iterations of the axes before a concat's axis) from which its parts share one work-shared loop nest:
# fewer would leave threads of a many-core CPU idle where a nest per part splits all of its elements.
FEW_ROWS = 8


@dataclass
class KernelInfo:
    """One kernel of the listing (``nf.show(stage="fused")``)."""

    kind: str
    out: str
    type: str
    fused: list[str]
    stores: list[str] = field(default_factory=list)
    loads: list[str] = field(default_factory=list)
    children: list[KernelInfo] = field(default_factory=list)
    note: str = ""


class Scalar:
    """Statements of one loop body: each inlined node evaluated once per index (SSA temporaries).

    With ``lanes`` > 1 the body computes ``lanes`` consecutive values of the index variable ``lane`` at once
    (vector temporaries; ``lane`` is the first): a read that moves with ``lane`` must be contiguous (a vector
    load). Values that do not depend on ``lane`` (a row's layer-norm statistics, a sequence's length compared
    with a step, constants) are computed once as scalars in ``pre``, which the caller places before the lane
    loop, and broadcast there: the C compiler could not hoist them itself past the body's stores (the buffers may
    alias). A pad along the lanes is read as its source, unclamped, only with ``inside`` (the caller runs the
    lanes where every such read is in its source: ``Elementwise.columns``). Anything else raises
    ``Unsupported``, and the caller keeps the scalar form."""

    def __init__(self, low: Lowering, ctx: GraphCtx, overrides: dict[int, str] | None = None,
                 identity: tuple[Expr, ...] | None = None, lanes: int = 1, lane: str | None = None,
                 root: Node | None = None, inside: bool = False):
        self.low, self.ctx = low, ctx
        self.root = root  # the kernel's own result: computed, never loaded from its buffer
        self.stmts: list[str] = []
        self.pre: list[str] = []
        self.memo: dict[tuple, str] = {}
        self.overrides = overrides or {}
        self.identity = identity
        self.lanes, self.lane = lanes, lane
        self.uniform: dict[str, str] = {}  # vector value -> the scalar it broadcasts (lanes > 1)
        self.loads: list[str] = []
        self.reads: list[Expr] = []  # the flat index of each load, as read
        self.fused: list[str] = []
        self.inside = inside
        self.once: Scalar | None = None  # with lanes: the scalar form of the lane-invariant values, into ``pre``
        if lanes > 1:
            self.once = Scalar(low, ctx, self.overrides, identity, root=root)
            self.once.stmts = self.pre

    def sibling(self, lane: str) -> Scalar:
        """A Scalar for another lane variable of the same loop body (an unrolled copy): it shares this one's
        lane-invariant values (``pre``) and memo, so what does not move with the lane is computed once."""
        other = Scalar(self.low, self.ctx, self.overrides, self.identity, self.lanes, lane, self.root, self.inside)
        other.pre, other.uniform, other.memo, other.once = self.pre, self.uniform, self.memo, self.once
        return other

    def _vector(self, dt: DType) -> str:
        if self.low.lanes.get(dt) != self.lanes:
            raise Unsupported(f"no {self.lanes}-lane vector form in {dt}")
        return VECTORS[dt].type

    def tmp(self, dt: DType, expr: str) -> str:
        name = self.low.names.fresh("v")
        self.stmts.append(f"const {self._vector(dt) if self.lanes > 1 else ctype(dt)} {name} = {expr};")
        return name

    def _broadcast(self, dt: DType, scalar_expr: str) -> str:
        """A lane-invariant value: the scalar and its broadcast, both computed in ``pre``."""
        self._vector(dt)
        s = self.low.names.fresh("s")
        self.pre.append(f"const {ctype(dt)} {s} = {scalar_expr};")
        return self._splat(dt, s)

    def _splat(self, dt: DType, scalar: str) -> str:
        """The vector of ``scalar`` (a temporary already in ``pre``) in every lane, made once in ``pre``."""
        v = self.low.names.fresh("v")
        self.pre.append(f"const {self._vector(dt)} {v} = {VECTORS[dt].broadcast}({scalar});")
        self.uniform[v] = scalar
        return v

    def load(self, dt: DType, ptr: str, index: Expr) -> str:
        """``ptr[index]`` as a temporary (with lanes: a vector load, or a broadcast hoisted into ``pre``)."""
        access = f"{ptr}[{self.low.sizes.index(index)}]"
        self.loads.append(access)
        self.reads.append(index)
        if self.lanes == 1:
            return self.tmp(dt, access)
        self._vector(dt)
        step = lane_stride(index, self.lane or "")
        if step is None:
            raise Unsupported(f"{access} is not contiguous in {self.lane}")
        return self.tmp(dt, f"{VECTORS[dt].load}(&{access})") if step == 1 else self._broadcast(dt, access)

    def store(self, dt: DType, ptr: str, index: Expr, value: str) -> str:
        """The statement storing ``value`` at ``ptr[index]`` (``lanes`` consecutive elements with lanes)."""
        if self.lanes > 1:
            self._vector(dt)
        return store(ptr, index, value, self.low.sizes, self.lanes, self.lane or "", dt)

    def val(self, n: Node, idx: Sequence[Expr]) -> str:
        """The C value (a temporary, a literal) of ``n`` at index ``idx``, computed once per index."""
        idx = tuple(idx)
        if id(n) in self.overrides and idx == self.identity:
            return self.overrides[id(n)]
        key = (id(n), idx)
        if key in self.memo:
            return self.memo[key]
        out = self._val(n, idx)
        self.memo[key] = out
        return out

    def _val(self, n: Node, idx: tuple[Expr, ...]) -> str:
        ctx, sz = self.ctx, self.low.sizes
        if self.once is not None and n.op != Op.CONST and not any(depends(e, self.lane or "") for e in idx):
            self._vector(n.dtype)  # no vector type: Unsupported, before any scalar statement
            return self._splat(n.dtype, self.once.val(n, idx))
        ptr = None if n is self.root else ctx.buffer(n)
        if ptr is not None:
            return self.load(n.dtype, ptr, row_major(idx, [sz.expr(d) for d in n.shape]))
        if n.op == Op.CONST:
            value = n.attrs["value"]  # a size used as a value (x.shape[0]) may be a run-time trip count
            lit = literal(value, n.dtype) if sz.is_static(value) else f"(({ctype(n.dtype)})({sz(value)}))"
            if self.lanes > 1:
                self._vector(n.dtype)
                bc = f"{VECTORS[n.dtype].broadcast}({lit})"
                self.uniform[bc] = lit
                return bc
            return lit
        if n.op == Op.RESHAPE and ctx.buffer(n.srcs[0]) is not None:
            return self.load(n.dtype, ctx.buffer(n.srcs[0]), row_major(idx, [sz.expr(d) for d in n.shape]))
        if n.op in (Op.PERMUTE, Op.EXPAND, Op.SLICE, Op.RESHAPE):
            return self.val(n.srcs[0], index_map(n, idx, sz.expr))
        if self.lanes > 1 and (n.op == Op.CONCAT or (n.op == Op.PAD and not self.inside)):
            raise Unsupported(f"no vector form of {n.op.name.lower()}")
        if n.op == Op.GATHER:
            return self._gather(n, idx)
        if n.op == Op.PAD:
            return self._pad(n, idx)
        if n.op == Op.CONCAT:
            return self._concat(n, idx)
        if n.op in ELEMENTWISE:
            self.fused.append(n.op.name.lower())
            args = [self.val(s, idx) for s in n.srcs]
            if self.lanes > 1:
                vec = vector_formula(n.op, n.dtype, [s.dtype for s in n.srcs], args)  # checks it has one
                if all(a in self.uniform for a in args):  # lane-invariant: once, as a scalar, before the loop
                    scalars = [self.uniform[a] for a in args]
                    return self._broadcast(n.dtype, formula(n.op, n.dtype, n.srcs[0].dtype, scalars, n.attrs))
                if n.op == Op.DIV and args[1] in self.uniform:
                    # x / s with s the same for every lane (a layer norm's standard deviation): x * (1 / s), the
                    # reciprocal computed once per row. A vector division costs as much as a whole sigmoid on
                    # x86; this rounds twice (<= 1.5 ulp instead of 0.5), as torch's own layer_norm does
                    inv = self._broadcast(n.dtype, f"{literal(1.0, n.dtype)} / {self.uniform[args[1]]}")
                    return self.tmp(n.dtype, vector_formula(Op.MUL, n.dtype, [n.dtype, n.dtype], [args[0], inv]))
                return self.tmp(n.dtype, vec)
            return self.tmp(n.dtype, formula(n.op, n.dtype, n.srcs[0].dtype, args, n.attrs))
        raise Unsupported(f"cannot inline {n.op.name.lower()} (created at {n.loc})")

    def _pad(self, n: Node, idx: tuple[Expr, ...]) -> str:
        sz = self.low.sizes
        src = n.srcs[0]
        conds, inner = [], []
        for i, (lo, _hi), d in zip(idx, n.attrs["pads"], src.shape):
            if int(d) == 0:
                return literal(n.attrs["value"], n.dtype)
            if int(lo) == 0 and int(_hi) == 0:
                inner.append(i)
                continue
            j = i - sz.expr(lo)
            if self.lanes > 1:  # along the lanes, which run where it is in the source (``inside``)
                if not depends(j, self.lane or ""):
                    raise Unsupported("no vector form of a pad across the lanes")
                inner.append(j)
                continue
            conds.append(f"({sz.index(j)} >= 0 && {sz.index(j)} < {sz(d)})")
            inner.append(clamp(j, sz.expr(d)))
        v = self.val(src, inner)
        if not conds:
            return v
        return self.tmp(n.dtype, f"({' && '.join(conds)}) ? {v} : {literal(n.attrs['value'], n.dtype)}")

    def _gather(self, n: Node, idx: tuple[Expr, ...]) -> str:
        """A load of ``x`` at a computed index (the index tensor's value at ``idx``). An out-of-range index reads
        NaN (0 for integers): there is no error channel in a running program, and NaN shows in any loss."""
        if self.lanes > 1:
            raise Unsupported("no vector form of gather (a load at a data-dependent index)")
        x, index = n.srcs
        axis = n.attrs["axis"]
        self.fused.append("gather")
        j, d = self.val(index, idx), self.low.sizes(x.shape[axis])
        clamped = self.tmp(DType.int64, f"({j} < 0 ? 0 : ({j} >= {d} ? {d} - 1 : (int64_t){j}))")
        v = self.val(x, (*idx[:axis], var(clamped), *idx[axis + 1:]))
        bad = "NAN" if n.dtype.is_float else "0"
        return self.tmp(n.dtype, f"({j} >= 0 && {j} < {d}) ? {v} : ({ctype(n.dtype)}){bad}")

    def _concat(self, n: Node, idx: tuple[Expr, ...]) -> str:
        sz = self.low.sizes
        axis = n.attrs["axis"]
        parts: list[tuple[str, str]] = []
        start = ZERO
        for s in n.srcs:
            d = sz.expr(s.shape[axis])
            if int(s.shape[axis]) == 0:
                continue
            v = self.val(s, (*idx[:axis], clamp(idx[axis] - start, d), *idx[axis + 1:]))
            end = d if start == ZERO else _sum(start, d)
            parts.append((f"({sz.index(idx[axis])}) < ({sz.index(end)})", v))
            start = end
        expr = parts[-1][1]
        for cond, v in reversed(parts[:-1]):
            expr = f"({cond} ? {v} : {expr})"
        return self.tmp(n.dtype, expr)


class GraphCtx:
    """Buffers of one graph being lowered: id(node) -> pointer expression."""

    def __init__(self, graph: Graph, grouping: Grouping):
        self.graph = graph
        self.g = grouping
        self.ptr: dict[int, str] = {}

    def buffer(self, n: Node) -> str | None:
        return self.ptr.get(id(n))


@dataclass
class LoopScope:
    """Where code that is invariant in a loop goes: ``pre`` runs once before the loop; ``packed`` dedupes the
    resident B panels packed there. ``iteration``: the C variable of the loop's step (what a draw mixes in)."""

    pre: Emitter
    iteration: str
    packed: dict[tuple, str] = field(default_factory=dict)


class Lowering:
    """Renders a scheduled ``Program`` as C source (and a kernel listing): the kernels, loops, buffers and row
    splits the program records, spelled with OpenMP, vector tiles and the GEMM micro-kernels."""

    def __init__(self, program: Program, sizes: Sizes, gemm: GemmConfig | None = None):
        self.program = program
        self.graph = program.graph
        self.sizes = sizes
        self.gemm = gemm or GemmConfig()
        self.lanes = dict(program.target.vector_lanes)  # per dtype: the prelude's nf_vf32 (NF_VBYTES)
        self.tiles: dict[Tile, None] = {}  # the GEMM tiles used, in order: their micro-kernels go in the source
        self.names = Names()
        self.allocs: list[tuple[str, str, str]] = []
        self.lives: list[tuple[int, int]] = []  # each alloc's (first, last) top-level step
        self.lifetimes = lifetimes(program)  # of the program's top-level scratch buffers, by Buf name
        self.data: list[Node] = []
        self.data_ids: dict[int, int] = {}
        self.listing: list[KernelInfo] = []
        self.stats = {"kernels": 0, "gemm": 0, "fused_gemm": 0, "scans": 0, "sliced": 0, "vector": 0}
        self.scopes: list[LoopScope] = []
        self.marks: list[int] = []  # where the top-level code may be cut into separate C functions
        self.rows: RowScope | None = None  # set while lowering a row-split scan body (one thread's rows)
        self.workspace_slots: list[Slot] = []  # the workspace's slots (``memplan``), set by source()

    @property
    def serial(self) -> bool:
        """Code being lowered runs on one thread's rows, not work-shared."""
        return self.rows is not None

    def omp_for(self, em: Emitter, collapse: int = 0, nowait: bool = False) -> None:
        """The work-sharing pragma for the loop that follows (none inside a row-split body)."""
        if self.serial:
            return
        c = f" collapse({collapse})" if collapse > 1 else ""
        em(f"#pragma omp for{c} schedule(static){' nowait' if nowait else ''}")

    def alloc(self, dt: DType, shape: Sequence[int], buf: Buf | None = None) -> str:
        """A workspace buffer (``buf``: the program's record of it, whose lifetime the memory plan reads). In a
        row-split body a buffer with the batch axis is allocated for the whole batch and each thread gets its rows
        of it (the pointer expression is offset to its first row)."""
        name = self.names.fresh("b")
        rows = self.rows
        life = self.lifetimes.get(buf.name) if buf is not None else None
        if rows is not None and shape and is_rows(shape[0]):
            self.add_alloc(name, ctype(dt), self._bytes(dt, [rows.batch, *shape[1:]]), life)
            return f"({rows.thread_rows(name, shape, self.sizes)})"
        self.add_alloc(name, ctype(dt), self._bytes(dt, shape), life)
        return name

    def add_alloc(self, name: str, ct: str, size: str, life: tuple[int, int] | None = None) -> None:
        """A workspace buffer of ``size`` bytes (C) live over the top-level steps ``life``; by default only in the
        step being rendered (what a renderer allocates for itself: packed panels, carries, a body's scratch)."""
        step = len(self.marks)
        self.allocs.append((name, ct, size))
        self.lives.append(life or (step, step))

    def _bytes(self, dt: DType, shape: Sequence[int]) -> str:
        """A buffer's size in bytes as C: a number when static (so the memory planner can compare sizes)."""
        return byte_size(self.sizes.prod(shape), dt.itemsize)

    # ---- top level ----------------------------------------------------------------------------------------
    def source(self) -> str:
        g = self.graph
        for n in g.order:
            if n.op == Op.DATA:
                self.data_ids[id(n)] = len(self.data)
                self.data.append(n)
        n_in = len(g.inputs)
        ins = [f"(({ctype(n.dtype)}*)args[{k}])" for k, n in enumerate(g.inputs)]
        outs = [f"(({ctype(n.dtype)}*)args[{n_in + len(self.data) + k}])" for k, n in enumerate(g.outputs)]
        body = Emitter(self.names, depth=1)
        first = len(self.marks)
        self.lower_block(self.program.block, ins, outs, body, self.listing)
        keys = step_keys(self.program)
        marks = self.marks[first:]
        assert len(marks) == len(self.program.block.kernels), "one mark per top-level step"
        parts = [(keys[step], lines) for step, lines in split_parts(body.lines, marks)]
        # Scratch buffers live in one workspace the caller owns and reuses across calls (``nf_workspace`` says
        # how many bytes at these sizes): no malloc, free or first-touch page faults per call.
        n_ws = n_in + len(self.data) + len(g.outputs)
        calls, fns, protos = part_functions(parts, [(name, ct) for name, ct, _ in self.allocs], self.names.made)
        if self.gemm.share_buffers:
            slots, where = plan(self.lives, [size for _, _, size in self.allocs])
        else:
            slots, where = [Slot([size]) for _, _, size in self.allocs], list(range(len(self.allocs)))
        self.workspace_slots = slots
        slot_fn = slot_bytes_function(slots)  # renders the slots' sizes: may add derived sizes
        nb, ns = max(1, len(slots)), max(1, self.sizes.n_slots)
        # The caller passes the run-time symbols; every other size is computed from them once per call.
        sizes_fn = ["static void nf_sizes(const int64_t* in, int64_t* S) {",
                    *(f"    S[{k}] = in[{k}];" for k in range(self.sizes.n_inputs)),
                    *(f"    {d}" for d in self.sizes.definitions()), "    (void)in; (void)S;", "}"]
        lines = [f"#define NF_VBYTES {self.gemm.vector_width}", PRELUDE, gemm_prelude(list(self.tiles)),
                 "#define NF_R64(x) (((x) + 63) & ~(int64_t)63)", *fns,
                 UNIT_MARK, *protos, *sizes_fn, *slot_fn,
                 "int64_t nf_workspace(const int64_t* in) {", f"    int64_t S[{ns}] = {{0}}, b[{nb}] = {{0}}, n = 0;",
                 "    nf_sizes(in, S);", "    nf_slot_bytes(S, b);",
                 f"    for (int k = 0; k < {len(slots)}; k++) n += NF_R64(b[k]);", "    return n;", "}"]
        lines += ["void nf_main(void** args, const int64_t* in) {",
                  f"    char* ws_ = (char*)args[{n_ws}];", "    int64_t wo_ = 0;",
                  f"    int64_t S[{ns}] = {{0}}, wb_[{nb}] = {{0}};", "    nf_sizes(in, S);",
                  "    nf_slot_bytes(S, wb_);"]
        for k in range(len(slots)):
            lines.append(f"    char* slot{k}_ = ws_ + wo_; wo_ += NF_R64(wb_[{k}]);")
        for (name, ct, _), k in zip(self.allocs, where):
            lines.append(f"    {ct}* {name} = ({ct}*)slot{k}_;")
        lines.append("    #pragma omp parallel")
        lines.append("    {")
        lines.extend(f"        {c}" for c in calls)
        lines.append("    }")
        lines.append("}")
        return "\n".join(lines) + "\n"

    def data_ptr(self, n: Node) -> str:
        k = len(self.graph.inputs) + self.data_ids[id(n)]
        return f"(({ctype(n.dtype)}*)args[{k}])"

    # ---- one graph ----------------------------------------------------------------------------------------
    def lower_block(self, block: Block, ins: Sequence[str], outs: Sequence[str], em: Emitter,
                    listing: list[KernelInfo]) -> None:
        """The kernels of ``block`` in order (graph inputs at ``ins``, its results into ``outs``): each where
        the graph's order reaches the node it stores, so views and constant data are bound before their
        readers."""
        graph = block.graph
        ctx = GraphCtx(graph, block.grouping)
        for n, p in zip(graph.inputs, ins):
            ctx.ptr[id(n)] = p
        top = graph is self.graph
        at: dict[int, Kernel | Loop] = {}
        chunked: set[int] = set()
        for k in block.kernels:
            at[id(stored_node(k))] = k
            if isinstance(k, Loop):
                chunked |= {id(stored_node(c.gemm)) for c in k.chunked}

        def place(buf: Buf) -> str:
            return outs[buf.output] if buf.output is not None else self.alloc(buf.dtype, buf.shape, buf)

        def also(k: Kernel) -> list[str]:
            return [outs[i] for i in k.also]

        for n in graph.order:
            if id(n) in ctx.ptr:
                continue
            if n.op == Op.DATA:
                ctx.ptr[id(n)] = self.data_ptr(n) if id(n) in self.data_ids else self._late_data(n)
                continue
            if id(n) in block.grouping.alias:
                ctx.ptr[id(n)] = ctx.ptr[id(n.srcs[0])]
                continue
            if id(n) in chunked:
                ctx.ptr[id(n)] = "0"  # computed chunk by chunk inside its scan (``chunks``)
                continue
            k = at.get(id(n))
            if k is None:
                continue
            if isinstance(k, Loop):
                self.lower_loop(k, ctx, em, listing, outs)
            elif isinstance(k, SlicedGemm):  # consumed tile by tile, never stored
                self.kernel_sliced(k, ctx, place, [[outs[i] for i in a] for a in k.also_of], em, listing)
            else:
                ctx.ptr[id(n)] = out = place(k.out)
                self.kernel_stored(k, ctx, out, em, listing, also(k))
            if top:
                self.marks.append(em.mark())
        for c in block.copies:
            self.kernel_pointwise(c.node, ctx, outs[c.out.output], em, listing, kind="copy")

    def kernel_stored(self, k: Kernel, ctx: GraphCtx, out: str, em: Emitter, listing: list[KernelInfo],
                      also: Sequence[str] = ()) -> None:
        """The kernel of record ``k`` into ``out`` (and the extra results ``also``)."""
        if isinstance(k, Gemm):
            if k.k_parts > 1:
                raise Unsupported("a GEMM scheduled to sum K in parts side by side (a GPU form) has no C spelling")
            self.kernel_gemm(k, ctx, out, em, listing, also)
        elif isinstance(k, Reduce) and k.leading:
            self.kernel_leading_sum(k.node, k.epilogue, ctx, out, em, listing)
        elif isinstance(k, Reduce):
            self.kernel_reduce(k.node, k.epilogue, ctx, out, em, listing, k.lanes)
        elif isinstance(k, Concat):
            self.kernel_concat(k.node, ctx, out, em, listing)
        elif isinstance(k, ScatterAdd):
            self.kernel_scatter_add(k.node, ctx, out, em, listing)
        elif isinstance(k, Elementwise):
            self.kernel_pointwise(k.node, ctx, out, em, listing, also=also, lanes=k.lanes, columns=k.columns)
        elif isinstance(k, Random):
            self.kernel_random(k, out, em, listing)
        else:
            raise Unsupported(f"no C form of kernel {type(k).__name__}")

    def _late_data(self, n: Node) -> str:
        self.data_ids[id(n)] = len(self.data)
        self.data.append(n)
        return self.data_ptr(n)

    # ---- kernels ------------------------------------------------------------------------------------------
    def _loops(self, em: Emitter, shape: Sequence[str], prefix: str, nowait: bool = False) -> list[str]:
        """Open a loop nest over ``shape`` with the outer loop(s) shared among threads (closed by the caller);
        returns its index variables."""
        if not shape:
            if not self.serial:
                em("#pragma omp single")
            em.open("{")
            return []
        self.omp_for(em, len(shape) - 1 if len(shape) >= 3 else 0, nowait)
        return self._nest(em, shape, prefix)

    @staticmethod
    def _nest(em: Emitter, shape: Sequence[str], prefix: str) -> list[str]:
        """Open a plain loop nest over ``shape`` (closed by the caller); returns its index variables."""
        idx = [em.fresh(prefix) for _ in shape]
        em(*(f"for (int64_t {i} = 0; {i} < {d}; {i}++)" for i, d in zip(idx, shape)))
        em.open("{")
        return idx

    def kernel_pointwise(self, n: Node, ctx: GraphCtx, out: str, em: Emitter, listing: list[KernelInfo],
                         kind: str = "elementwise", also: Sequence[str] = (), lanes: int = 1,
                         columns: tuple[int, int] | None = None) -> None:
        """``n`` element by element into ``out`` (and into each buffer of ``also``, of the same layout), or
        ``lanes`` elements of the last axis at a time (in ``columns``) where the schedule says so."""
        self.stats["kernels"] += 1
        shape = [self.sizes(d) for d in n.shape]
        if lanes > 1:
            self._vector_pointwise(n, ctx, [out, *also], shape, em, listing, lanes, columns)
            return
        names = self._loops(em, shape, "i")
        idx = [var(i) for i in names]
        sc = Scalar(self, ctx, root=None if kind == "copy" else n)  # a copy loads its source's buffer
        v = sc.val(n, idx)
        em.each(sc.stmts)
        at = self.sizes.index(row_major(idx, [self.sizes.expr(d) for d in n.shape]))
        stores = [f"{o}[{at}]" for o in [out, *also]]
        em.each(f"{st} = {v};" for st in stores)
        em.close()
        listing.append(KernelInfo(kind if sc.fused or kind == "copy" else "copy", ", ".join([out, *also]),
                                  fmt_type(n.shape, n.dtype), sc.fused, [f"{st} = {_last(sc)}" for st in stores],
                                  sc.loads))

    def _vector_pointwise(self, n: Node, ctx: GraphCtx, outs: list[str], shape: list[str], em: Emitter,
                          listing: list[KernelInfo], lanes: int, columns: tuple[int, int] | None) -> None:
        """``kernel_pointwise`` with its innermost loop in vector form (``lanes`` columns at a time from the
        first of ``columns``, a scalar loop for the columns before and after), the outer axes work-shared as in
        the scalar form. The schedule chose it (``Elementwise.lanes``: every value has a vector form, every read
        is contiguous or constant along the last axis, a padded one inside its source in ``columns``); a body
        that cannot be spelled so is a bug of that choice, raised as such."""
        idx = [em.fresh("i") for _ in shape]
        width = int(n.shape[-1])
        start, stop = columns or (0, width)
        end = start + (stop - start) // lanes * lanes
        at = [var(i) for i in idx]
        flat = row_major(at, [self.sizes.expr(d) for d in n.shape])
        vector, scalar = (Scalar(self, ctx, lanes=step, lane=idx[-1], root=n, inside=columns is not None)
                          for step in (lanes, 1))
        bodies = []
        for sc in (vector, scalar):
            try:
                v = sc.val(n, at)
            except Unsupported as e:
                if sc is scalar:
                    raise
                raise NNForgeError(f"the schedule chose {lanes} lanes for the elementwise kernel at {n.loc}, which "
                                   f"has no vector form: {e}") from e
            bodies.append([*sc.stmts, *(sc.store(n.dtype, o, flat, v) for o in outs)])
        self.omp_for(em, len(shape) - 1 if len(shape) >= 3 else 0)
        em(*(f"for (int64_t {i} = 0; {i} < {d}; {i}++)" for i, d in zip(idx[:-1], shape[:-1])))
        em.open("{")
        em.each(vector.pre)  # the scalar form hoists nothing
        if start:
            with em.block(f"for (int64_t {idx[-1]} = 0; {idx[-1]} < {start}; {idx[-1]}++) {{"):
                em.each(bodies[1])
        with em.block(f"for (int64_t {idx[-1]} = {start}; {idx[-1]} < {end}; {idx[-1]} += {lanes}) {{"):
            em.each(bodies[0])
        if end < width:
            with em.block(f"for (int64_t {idx[-1]} = {end}; {idx[-1]} < {width}; {idx[-1]}++) {{"):
                em.each(bodies[1])
        em.close()
        self.stats["vector"] += 1
        span = "" if columns is None else f" in columns {start}..{end}"
        listing.append(KernelInfo("elementwise" if scalar.fused else "copy", ", ".join(outs),
                                  fmt_type(n.shape, n.dtype), scalar.fused,
                                  [st.rstrip(";") for st in bodies[1][-len(outs):]], scalar.loads,
                                  note=f"{lanes} columns at a time{span}"))

    def kernel_random(self, k: Random, out: str, em: Emitter, listing: list[KernelInfo]) -> None:
        """``out`` filled with the draw's numbers (``schedule.Random``), work-shared: element ``i`` depends on the
        key and ``i`` alone, so any split of the elements among threads gives the same numbers. The key mixes the
        call's seed, the draw's number and each enclosing loop's iteration."""
        n = k.node
        if self.serial:
            raise NNForgeError(f"the schedule split the rows of a loop that draws random numbers (at {n.loc})")
        self.stats["kernels"] += 1
        key, i = em.fresh("key"), em.fresh("i")
        mix = f"nf_mix64({self.sizes.seed} ^ nf_mix64({k.draw}))"
        for t in (scope.iteration for scope in self.scopes):
            mix = f"nf_mix64({mix} ^ (uint64_t){t})"
        if k.dist == "normal":
            fn = "nf_normal"
        else:
            fn = "nf_uniformf" if n.dtype == DType.float32 else "nf_uniform"
        value = f"({ctype(n.dtype)}){fn}({key}, {i})"
        with em.block("{"):
            em(f"const uint64_t {key} = {mix};")
            self.omp_for(em)
            em(f"for (int64_t {i} = 0; {i} < {self.sizes.prod(n.shape)}; {i}++) {out}[{i}] = {value};")
        listing.append(KernelInfo("rand", out, fmt_type(n.shape, n.dtype), ["rand"], [f"{out}[{i}] = {value}"], [],
                                  note=f"{k.dist}, draw {k.draw}"))

    def kernel_concat(self, n: Node, ctx: GraphCtx, out: str, em: Emitter, listing: list[KernelInfo]) -> None:
        """A concat computed part by part: each source's values stored at its offset along the axis. Evaluated as
        one pointwise kernel, every index would pick its source through a chain of selects, which keeps the loop
        scalar (the gradient of an LSTM's four gates, concatenated, was the hottest loop of its backward step).
        Along an inner axis the parts are loops inside one work-shared nest over the axes before it, so each
        iteration writes a whole row: an im2col's taps read their input window together, where a pass per tap
        read the whole input once per tap. Along the first axis, or with fewer than ``FEW_ROWS`` rows before the
        axis (threads would idle), each part is a loop nest of its own (``nowait`` but the last: the parts write
        disjoint ranges)."""
        self.stats["kernels"] += 1
        sz = self.sizes
        axis = n.attrs["axis"]
        parts = [src for src in n.srcs if int(src.shape[axis]) != 0]
        oshape = [sz.expr(d) for d in n.shape]
        offset = ZERO
        fused: list[str] = []
        loads: list[str] = []
        stores: list[str] = []
        rows = n.shape[:axis]
        shared = axis > 0 and not (all(sz.is_static(d) for d in rows) and math.prod(map(int, rows)) < FEW_ROWS)
        if shared:
            self.omp_for(em, axis)
            outer = self._nest(em, [sz(d) for d in rows], "i")
        for k, src in enumerate(parts):
            if shared:
                names = [*outer, *self._nest(em, [sz(d) for d in src.shape[axis:]], "i")]
            else:
                names = self._loops(em, [sz(d) for d in src.shape], "i", nowait=k < len(parts) - 1)
            idx = [var(i) for i in names]
            sc = Scalar(self, ctx)
            v = sc.val(src, idx)
            em.each(sc.stmts)
            # the part's first index spelled ``(i + offset)`` as a whole, as the C always was (printed, not analysed)
            at = idx[axis] if offset == ZERO else var(f"({sz.index(idx[axis] + offset)})")
            store = f"{out}[{sz.index(row_major([*idx[:axis], at, *idx[axis + 1:]], oshape))}]"
            em(f"{store} = {v};")
            em.close()
            fused += sc.fused
            loads += sc.loads
            stores.append(f"{store} = {v}")
            d = sz.expr(src.shape[axis])
            offset = d if offset == ZERO else _sum(offset, d)
        if shared:
            em.close()
        listing.append(KernelInfo("elementwise", out, fmt_type(n.shape, n.dtype), ["concat", *fused], stores, loads,
                                  note=f"{len(parts)} parts along axis {axis}"))

    def kernel_scatter_add(self, n: Node, ctx: GraphCtx, out: str, em: Emitter, listing: list[KernelInfo]) -> None:
        """``out[.., index[.., r, ..], ..] += x[.., r, ..]``: threads share the lines along the axis (each line of
        ``out`` is written by one thread, so repeated indices need no atomics), zeroed then summed in order of
        ``r``. An out-of-range index adds nothing (the reference backend raises)."""
        self.stats["kernels"] += 1
        sz = self.sizes
        x, index = n.srcs
        axis = n.attrs["axis"]
        oshape = [sz.expr(d) for d in n.shape]
        names = self._loops(em, [sz(d) for k, d in enumerate(x.shape) if k != axis], "i")
        idx = [var(i) for i in names]
        z, r = em.fresh("z"), em.fresh("r")
        width = sz(n.shape[axis])

        def at(i: str) -> str:
            return sz.index(row_major([*idx[:axis], var(i), *idx[axis:]], oshape))

        em(f"for (int64_t {z} = 0; {z} < {width}; {z}++) {out}[{at(z)}] = 0;")
        em.open(f"for (int64_t {r} = 0; {r} < {sz(x.shape[axis])}; {r}++) {{")
        sc = Scalar(self, ctx)
        read = [*idx[:axis], var(r), *idx[axis:]]
        v, j = sc.val(x, read), sc.val(index, read)
        em.each(sc.stmts)
        store = f"{out}[{at(f'(int64_t){j}')}]"
        em(f"if ({j} >= 0 && {j} < {width}) {store} += {v};")
        em.close()
        em.close()
        listing.append(KernelInfo("scatter_add", out, fmt_type(n.shape, n.dtype), ["scatter_add", *sc.fused],
                                  [f"{store} += {v}"], sc.loads, note=f"axis {axis}, one line per thread"))

    def kernel_reduce(self, p: Node, root: Node | None, ctx: GraphCtx, out: str, em: Emitter,
                      listing: list[KernelInfo], lanes: int = 1) -> None:
        self.stats["kernels"] += 1
        sz = self.sizes
        src = p.srcs[0]
        axes, keep = p.attrs["axes"], p.attrs["keepdims"]
        names = self._loops(em, [sz(d) for d in p.shape], "i")
        idx = [var(i) for i in names]
        ridx = [em.fresh("r") for _ in axes]
        full, it, rit = [], iter(idx), iter(var(r) for r in ridx)
        for a in range(src.ndim):
            if a in axes:
                if keep:
                    next(it)
                full.append(next(rit))
            else:
                full.append(next(it))
        acc_t = "double" if p.dtype == DType.float32 and p.op == Op.SUM else ctype(p.dtype)
        if p.op == Op.SUM:
            init = "0"
        elif p.dtype.is_float:
            init = "-INFINITY"
        else:
            init = {DType.int32: "INT32_MIN", DType.int64: "INT64_MIN", DType.bool: "0"}[p.dtype]
        acc = em.fresh("acc")
        em(f"{acc_t} {acc} = {init};")
        # the scalar loop below sums the columns the vector loops left, if any
        start = self._vector_reduce(p, ctx, full, acc, em, lanes) if lanes > 1 else None
        sc = Scalar(self, ctx)  # the scalar form, also what the listing shows
        v = sc.val(src, full)
        if start is None or start < int(src.shape[-1]):
            order = list(zip(ridx, axes))
            if start is None:  # the axis read with the shortest stride innermost (a permuted source's rows)
                order.sort(key=lambda ra: -_shortest_stride(sc.reads, ra[0]))
            for k, (r, a) in enumerate(order):
                last = k == len(axes) - 1
                if last and p.op == Op.SUM and p.dtype.is_float:
                    # vector lanes of partial sums where ``_vector_reduce`` has no form (the order of a float sum
                    # is not fixed anyway; float32 sums in float64)
                    em(f"#pragma omp simd reduction(+:{acc})")
                em(f"for (int64_t {r} = {(start or 0) if last else 0}; {r} < {sz(src.shape[a])}; {r}++)")
            em.open("{")
            em.each(sc.stmts)
            if p.op == Op.SUM:
                upd = f"{acc} + {v}" if p.dtype != DType.bool else f"{acc} | {v}"
            elif p.dtype.is_float:
                upd = f"(({v} > {acc} || {v} != {v}) ? {v} : {acc})"
            else:
                upd = f"({v} > {acc} ? {v} : {acc})"
            em(f"{acc} = {upd};")
            em.close()
        result = f"({ctype(p.dtype)}){acc}"
        ep = Scalar(self, ctx, {id(p): result}, tuple(idx), root=root)
        if root is not None:
            value = ep.val(root, idx)
            em.each(ep.stmts)
        else:
            value = result
        store = f"{out}[{sz.index(row_major(idx, [sz.expr(d) for d in p.shape]))}]"
        em(f"{store} = {value};")
        em.close()
        kind = "+".join(dict.fromkeys([p.op.name.lower(), *sc.fused, *ep.fused])) if root is not None else "reduce"
        listing.append(KernelInfo(kind, out, fmt_type((root or p).shape, (root or p).dtype),
                                  [p.op.name.lower(), *sc.fused, *ep.fused], [store], sc.loads + ep.loads,
                                  note=f"axes={tuple(axes)}"))

    def _vector_reduce(self, p: Node, ctx: GraphCtx, full: list[Expr], acc: str, em: Emitter, lanes: int) -> int:
        """The vector loops of a float32 sum or max over the last axis: four independent vectors of ``lanes``
        columns per iteration, a sum's added pairwise and widened into two float64 accumulators, a max's taken
        pairwise into one vector (NaN kept, ``nf_vmaxf``), then one vector at a time.

        Returns the first column left to the scalar loop. The schedule chose it (``Reduce.lanes``: the reduced
        values vectorize along the row); a body that cannot be spelled so is a bug of that choice.
        The scalar ``#pragma omp simd`` loop converts every element to double and chains its adds on one or two
        accumulators: latency-bound at 3 cycles per 8 elements; the three row sums of a layer norm were a
        quarter of a layer-norm LSTM step's elementwise time. The scalar max (its NaN test keeps it scalar) was
        the most expensive of a softmax's four kernels on rows of 500."""
        src = p.srcs[0]
        width = int(src.shape[-1])
        wide, narrow = width - width % (4 * lanes), width - width % lanes
        r = em.fresh("r")
        cols = [r, *(em.fresh("r") for _ in range(3))]
        try:
            first = Scalar(self, ctx, lanes=lanes, lane=r)
            unrolled = [first, *(first.sibling(c) for c in cols[1:])] if wide else []
            parts = [sc.val(src, [*full[:-1], var(c)]) for sc, c in zip(unrolled, cols)]
            single = Scalar(self, ctx, lanes=lanes, lane=r) if narrow > wide else None
            one = single.val(src, [*full[:-1], var(r)]) if single else ""
        except Unsupported as e:
            raise NNForgeError(f"the schedule chose {lanes} lanes for the {p.op.name.lower()} at {p.loc}, which "
                               f"has no vector form: {e}") from e
        if p.op == Op.SUM:  # templates: the accumulators, one step's update, four vectors combined, the total
            lo, hi = em.fresh("lo"), em.fresh("hi")
            init, step = f"nf_vf64 {lo} = {{0}}, {hi} = {{0}};", f"nf_vacc_f64(&{lo}, &{hi}, {{}});"
            four, total = "({} + {}) + ({} + {})", f"{acc} = nf_vhsum_f64({lo}, {hi});"
        else:
            m, k = em.fresh("m"), em.fresh("k")
            init, step = f"nf_vf32 {m} = nf_vbc_f32(-INFINITY);", f"{m} = nf_vmaxf({{}}, {m});"
            four = "nf_vmaxf(nf_vmaxf({}, {}), nf_vmaxf({}, {}))"
            total = (f"for (int {k} = 0; {k} < {lanes}; {k}++) {acc} = ({m}[{k}] > {acc} || {m}[{k}] != {m}[{k}]) ? "
                     f"{m}[{k}] : {acc};")
        em.open("{")
        em.each(st for sc in (first, single) if sc for st in sc.pre)
        em(init)
        if unrolled:
            with em.block(f"for (int64_t {r} = 0; {r} < {wide}; {r} += {4 * lanes}) {{"):
                em.each(f"const int64_t {c} = {r} + {k * lanes};" for k, c in enumerate(cols) if k)
                em.each(st for sc in unrolled for st in sc.stmts)
                em(step.format(four.format(*parts)))
        if single:
            with em.block(f"for (int64_t {r} = {wide}; {r} < {narrow}; {r} += {lanes}) {{"):
                em.each(single.stmts)
                em(step.format(one))
        em(total)
        em.close()
        return narrow

    def kernel_leading_sum(self, p: Node, root: Node | None, ctx: GraphCtx, out: str, em: Emitter,
                           listing: list[KernelInfo]) -> None:
        """``out[o] = root(sum_r src[r, o])`` with the outputs innermost: threads share blocks of at most 256
        contiguous outputs along the last kept axis, each summed row by row into a local accumulator (unit-stride
        reads the C compiler vectorizes), where the generic reduce loop would read ``src`` with a stride of the
        whole output per element. ``src`` may be elementwise work on views, evaluated where it is read (the
        schedule checked that its reads run along the last axis); a stored ``src`` summed without an epilogue
        is read as rows of all its kept axes at once. Blocks as many as there are threads when that is fewer (a
        bias gradient's 384 sums were blocks of 256 and 128: one thread read two thirds of the [T * N, 384] rows
        while the other waited)."""
        self.stats["kernels"] += 1
        sz = self.sizes
        src = p.srcs[0]
        k = len(p.attrs["axes"])
        buf = ctx.buffer(src) if root is None else None
        kept = [sz.prod(src.shape[k:])] if buf else [sz(d) for d in src.shape[k:]]
        last, outer = kept[-1], "1" if buf else sz.prod(src.shape[k:-1])
        acc_t = "double" if p.dtype == DType.float32 else ctype(p.dtype)
        b0, j, acc = em.fresh("b"), em.fresh("j"), em.fresh("acc")
        share, bw, nb = em.fresh("share"), em.fresh("bw"), em.fresh("nb")
        em(f"const int64_t {share} = (({outer}) * ({last}) + nf_team() - 1) / nf_team();",
           f"const int64_t {bw} = {share} > 248 ? 256 : {share} < 8 ? 8 : ({share} + 7) / 8 * 8;",  # never 0
           f"const int64_t {nb} = (({last}) + {bw} - 1) / {bw};")
        self.omp_for(em, len(kept))  # the outer kept axes and the blocks of the last one, shared as one range
        *us, q = self._nest(em, [*kept[:-1], nb], "u")
        em(f"const int64_t {b0} = {q} * {bw};",
           f"const int64_t n_ = ({last}) - {b0} < {bw} ? ({last}) - {b0} : {bw};")
        col = var(b0) + var(j)
        kept_idx = [*(var(u) for u in us), col]
        em(f"{acc_t} {acc}[256];", f"for (int64_t {j} = 0; {j} < n_; {j}++) {acc}[{j}] = 0;")
        rs = [var(r) for r in self._nest(em, [sz(d) for d in src.shape[:k]], "r")]
        sc = Scalar(self, ctx)
        if buf:
            rows = [sz.expr(d) for d in src.shape[:k]]
            v = sc.load(src.dtype, buf, row_major([*rs, col], [*rows, math.prod(map(sz.expr, src.shape[k:]))]))
        else:
            v = sc.val(src, [*rs, *kept_idx])
        em("#pragma omp simd")
        with em.block(f"for (int64_t {j} = 0; {j} < n_; {j}++) {{"):
            em.each(sc.stmts)
            em(f"{acc}[{j}] += {v};")
        em.close()
        out_idx = [*([ZERO] * k if p.attrs["keepdims"] else []), *kept_idx]
        ep = Scalar(self, ctx, {id(p): f"({ctype(p.dtype)}){acc}[{j}]"}, tuple(out_idx), root=root)
        value = ep.val(root or p, out_idx)
        at = col if buf else row_major(out_idx, [sz.expr(d) for d in p.shape])  # buf: the sums are contiguous
        store = f"{out}[{sz.index(at)}]"
        with em.block(f"for (int64_t {j} = 0; {j} < n_; {j}++) {{"):
            em.each(ep.stmts)
            em(f"{store} = {value};")
        em.close()
        fused = list(dict.fromkeys([*sc.fused, *ep.fused]))
        listing.append(KernelInfo("+".join(["sum", *fused]) if fused else "reduce", out,
                                  fmt_type((root or p).shape, (root or p).dtype), ["sum", *fused], [store],
                                  sc.loads + ep.loads, note=f"leading axes {tuple(range(k))}, outputs innermost"))

    def operand_views(self, p: Node, ctx: GraphCtx, a_row: Expr = ZERO) -> list[View]:
        """The operands of matmul ``p`` as strided views of their buffers (``gemm.View``); A from its row ``a_row``
        (a chunk's first row)."""
        views = []
        sz = self.sizes
        for k, s in enumerate(p.srcs):
            v = strided(s, ctx.buffer, sz.expr)
            if v is None:
                raise Unsupported(f"matmul operand {s.op.name.lower()} is not a strided view (created at {s.loc})")
            ptr, off, st = v
            if k == 0:
                off = off + a_row * st[-2]
            views.append((ptr, off, st))
        return views

    def gemm_epilogue(self, p: Node, root: Node | None, ctx: GraphCtx, ep_info: list[Scalar]) -> Epilogue | None:
        """The elementwise root computed on the accumulator ``acc`` at index ``idx`` (None: store the sum)."""
        if root is None or root is p:
            return None
        self.stats["fused_gemm"] += 1

        def epilogue(idx: list[Expr], acc: str, lanes: int = 1,
                     lane: str = "") -> tuple[list[str], list[str], str]:
            sc = Scalar(self, ctx, {id(p): acc}, tuple(idx), lanes, lane, root=root)
            value = sc.val(root, idx)
            if lanes == 1:
                ep_info.append(sc)
            return sc.pre, sc.stmts, value

        return epilogue

    def tile(self, k: Gemm | SlicedGemm) -> Tile:
        """The register tile the schedule chose for GEMM kernel ``k`` (the target's last tile keeps the plain C
        names), in this configuration's vectors; noted as used."""
        assert k.tile is not None, "the CPU target names its GEMM tiles"
        mr, nr = k.tile
        plain = (mr, nr * k.node.dtype.itemsize) == self.program.target.gemm_tiles[-1][1:]
        tile = Tile(k.node.dtype, mr, nr, "" if plain else f"_{mr}x{nr}", self.gemm.vector_width)
        self.tiles[tile] = None
        return tile

    def packed_b(self, p: Node, tile: Tile, view: View, columns: Sequence[tuple[str, str]],
                 resident: bool) -> tuple[str, bool]:
        """B of matmul ``p`` packed into ``tile``'s panels of ``columns``; packed once before the innermost loop when
        the schedule says B is resident there (weights in a scan), else by the caller. Returns (buffer, hoisted)."""
        ptr, off, st = view
        nr = tile.nr
        K = self.sizes(p.srcs[0].shape[-1])
        scope = self.scopes[-1] if resident else None
        key = (ptr, off, tuple(st), tuple(columns), p.dtype)
        if scope is not None and key in scope.packed:
            return scope.packed[key], True
        name = self.names.fresh("bp")
        ct = ctype(p.dtype)
        self.add_alloc(name, ct, byte_size(len(columns), ceil_div(columns[0][1], nr), K, nr, p.dtype.itemsize))
        if scope is None:
            return name, False
        pack_panels(self, scope.pre, tile, K, view, columns, name, shared=True)
        scope.packed[key] = name
        return name, True

    def kernel_gemm(self, k: Gemm, ctx: GraphCtx, out: str, em: Emitter, listing: list[KernelInfo],
                    also: Sequence[str] = ()) -> None:
        p, root = k.node, k.epilogue
        self.stats["kernels"] += 1
        self.stats["gemm"] += 1
        check_dtype(p)
        views = self.operand_views(p, ctx)
        ep_info: list[Scalar] = []
        epilogue = self.gemm_epilogue(p, root, ctx, ep_info)
        tile = self.tile(k)
        buf, hoisted = self.packed_b(p, tile, views[1], [("0", self.sizes(p.shape[-1]))], k.b_resident)
        store = emit_gemm(self, em, p, tile, views, out, buf if hoisted else None, buf, epilogue, k.pack_a, k.k_split,
                          also, k.lanes)
        fused = ["matmul"] + (ep_info[0].fused if ep_info else [])
        listing.append(KernelInfo(k.kind, ", ".join([out, *also]), fmt_type((root or p).shape, (root or p).dtype),
                                  fused, [store],
                                  self._gemm_loads(views, ep_info),
                                  note="B packed before the loop" if hoisted else "B packed"))

    def _gemm_loads(self, views: Sequence[View], ep_info: list[Scalar]) -> list[str]:
        (pa, oa, sa), (pb, ob, sb) = views
        i, j, k = var("i"), var("j"), var("k")
        loads = [f"{pa}[{self.sizes.index(oa + i * sa[-2] + k * sa[-1])}]",
                 f"{pb}[{self.sizes.index(ob + k * sb[-2] + j * sb[-1])}]"]
        return loads + [ld for sc in ep_info[:1] for ld in sc.loads]

    def kernel_sliced(self, k: SlicedGemm, ctx: GraphCtx, place: Callable[[Buf], str], extra: list[list[str]],
                      em: Emitter, listing: list[KernelInfo]) -> None:
        """A GEMM and the kernels reading it through column slices as one kernel (see ``emit_sliced``); the GEMM
        result itself gets no buffer. ``place`` gives a member's buffer, ``extra`` its extra results."""
        sg = k.group
        p, root = sg.gemm, sg.root
        check_dtype(p)
        self.stats["kernels"] += 1
        self.stats["gemm"] += 1
        self.stats["sliced"] += 1
        sz = self.sizes
        views = self.operand_views(p, ctx)
        columns = [(str(o), str(sg.width)) for o in sg.offsets]
        tile = self.tile(k)
        buf, hoisted = self.packed_b(p, tile, views[1], columns, k.b_resident)
        if not hoisted:
            pack_panels(self, em, tile, sz(p.srcs[0].shape[-1]), views[1], columns, buf)
        ep_info: list[Scalar] = []
        epilogue = self.gemm_epilogue(p, root if root is not p else None, ctx, ep_info)
        outs = [place(b) for b in k.outs]
        product = place(k.product) if k.product is not None else None
        body_info: list[Scalar] = []

        def body(i: str, u: str, values: list[str], lanes: int) -> tuple[list[str], list[str]]:
            """The slices' values (the epilogue on each tile), then the member kernels reading them."""
            row, col = var(i), var(u)
            sc = Scalar(self, ctx, {}, (row, col), lanes, u)
            for off, value in zip(sg.offsets, values):
                at = sliced_index(col, sz.expr(off))  # the index the column slice at ``off`` reads
                at_product = row_major([row, at], [sz.expr(x) for x in p.shape])
                if product is not None and not k.returns_root:
                    sc.stmts.append(sc.store(p.dtype, product, at_product, value))
                if epilogue is not None:
                    pre, stmts, value = epilogue([row, at], value, lanes, u)
                    sc.pre += pre
                    sc.stmts += stmts
                if product is not None and k.returns_root:
                    sc.stmts.append(sc.store(root.dtype, product, at_product, value))
                sc.memo[(id(root), (row, at))] = value
            for m, o, more in zip(sg.members, outs, extra):
                v = sc.val(m, (row, col))
                sc.overrides[id(m)] = v  # later members use the value, not a reload
                index = row_major([row, col], [sz.expr(x) for x in m.shape])
                sc.stmts += [sc.store(m.dtype, d, index, v) for d in [o, *more]]
            if lanes == 1:
                body_info.append(sc)
            return sc.pre, sc.stmts

        emit_sliced(self, em, p, tile, views[0], buf, [str(o) for o in sg.offsets], sg.width, body, k.lanes)
        for m, o in zip(sg.members, outs):
            ctx.ptr[id(m)] = o
        if product is not None:
            ctx.ptr[id(k.returned)] = product
        fused = ["matmul"] + (ep_info[0].fused if ep_info else []) + body_info[0].fused
        stores = [s for s in body_info[0].stmts if not s.startswith("const ")]
        listing.append(KernelInfo(k.kind, ", ".join(outs), fmt_type(sg.members[-1].shape, sg.members[-1].dtype),
                                  fused, stores, self._gemm_loads(views, ep_info) + body_info[0].loads,
                                  note=f"column tiles of {len(sg.offsets)} slices at {list(sg.offsets)}, "
                                       f"{len(sg.members)} kernels fused; "
                                       + ("B packed before the loop" if hoisted else "B packed")))

    # ---- loops --------------------------------------------------------------------------------------------
    def lower_loop(self, loop: Loop, ctx: GraphCtx, em: Emitter, listing: list[KernelInfo],
                   outs_of_graph: Sequence[str]) -> None:
        """A scan or loop as ``for (t ...)`` around its body's kernels; a loop the schedule splits by rows runs
        with its batch rows split among the threads, each running every step on its own rows with no barrier
        until the loop ends, others with each kernel work-shared (a barrier per kernel)."""
        sz = self.sizes
        n = loop.node
        a = n.attrs
        is_scan = n.op == Op.SCAN
        split = loop.parallel
        nc = a["n_carry"] if is_scan else a["n_state"]
        nx = a["n_xs"] if is_scan else 0
        self.stats["scans"] += 1
        srcs = n.srcs
        for s in srcs:
            if ctx.buffer(s) is None:
                raise Unsupported(f"loop source {s.op.name.lower()} has no buffer")
        projs = {m.attrs["index"]: m for m in ctx.graph.order if m.op == Op.PROJ and m.srcs[0] is n}
        results = []
        for i, b in enumerate(loop.results):
            results.append(outs_of_graph[b.output] if b.output is not None else self.alloc(b.dtype, b.shape, b))
            if i in projs:
                ctx.ptr[id(projs[i])] = results[-1]
        info = KernelInfo("scan" if is_scan else "loop", ", ".join(results[:nc] + results[nc:]), "", [],
                          note="")
        listing.append(info)
        rows = RowScope.new(self.names, split, loop.row_block) if split else None
        carry_bufs = []
        for k in range(nc):
            shape, dt = n.types[k]
            c_a, c_b = self.alloc(dt, shape), self.alloc(dt, shape)
            carry_bufs.append((c_a, c_b))
            self._copy(srcs[k], ctx, c_a, em, info.children)
        if rows is not None:
            rows.declare(em, sz)
        cur, nxt = [], []
        for k, (c_a, c_b) in enumerate(carry_bufs):
            shape, dt = n.types[k]
            cur.append(em.fresh("cur"))
            nxt.append(em.fresh("nxt"))
            em(f"{ctype(dt)}* {cur[-1]} = {rows.thread_rows(c_a, shape, sz) if rows else c_a};",
               f"{ctype(dt)}* {nxt[-1]} = {rows.thread_rows(c_b, shape, sz) if rows else c_b};")
        length = sz(loop.length)
        t, tt = em.fresh("t"), em.fresh("tt")
        rev = is_scan and a["reverse"]
        at = em.mark()
        before = em.sub()  # what goes before the time loop (chunk bookkeeping, weight packing)
        scope = LoopScope(em.sub(), tt)
        info.note = f"{'reverse ' if rev else ''}for {tt} in 0..{length}"
        if rows is not None:
            info.note += rows.note()
        em.open(f"for (int64_t {t} = 0; {t} < {length}; {t}++) {{")
        em(f"const int64_t {tt} = {f'{length} - 1 - {t}' if rev else t};")

        def step(buf: str, shape: Sequence[int]) -> str:
            """This step's slice of a stacked [T, batch, ...] buffer (the current rows of it)."""
            base = f"({buf} + {sz.index(var(tt) * sz.count(shape[1:]))})"
            return rows.current_rows(base, shape[1:], sz) if rows else base

        ins = []
        if not is_scan and a["with_index"]:
            li = em.fresh("li")
            em(f"int64_t {li} = {tt};")
            ins.append(f"(&{li})")

        def carry(ptr: str, k: int) -> str:
            """A carry buffer (already at this thread's rows) at the rows the body runs on now."""
            return rows.block_of_thread_rows(ptr, n.types[k][0], sz) if rows else ptr

        ins += [carry(c, k) for k, c in enumerate(cur)]
        chunked = {c.k: c for c in loop.chunked}
        for k in range(nx):
            x = srcs[nc + k]
            if k in chunked:
                ins.append(self._chunked_input(chunked[k], ctx, rows, t, tt, length, rev, em, before, info))
                continue
            ins.append(step(ctx.buffer(x), x.shape))
            if rows is not None:
                rows.prefetch_next_step(em, ctx.buffer(x), x, t, sz.expr(loop.length), rev, sz)
        for k, s in enumerate(srcs[nc + nx:], start=nc + nx):
            own_rows = rows is not None and k in split.per_row
            ins.append(rows.current_rows(ctx.buffer(s), s.shape, sz) if own_rows else ctx.buffer(s))
        outs = [carry(c, k) for k, c in enumerate(nxt)]
        for j in range(len(n.types) - nc):
            outs.append(step(results[nc + j], n.types[nc + j][0]))
        blocks = rows is not None and rows.block
        if blocks:
            rows.open_block_loop(em, em.fresh("rb"))
        self.scopes.append(scope)
        outer_rows, outer_sizes = self.rows, self.sizes
        if rows is not None:
            self.rows, self.sizes = rows, sz.with_local(ROWS, rows.count)
        try:
            self.lower_block(loop.body, ins, outs, em, info.children)
        finally:
            self.scopes.pop()
            self.rows, self.sizes = outer_rows, outer_sizes
        if blocks:
            em.close()
        em.place(at, [*before.lines, *scope.pre.lines])
        for c, x in zip(cur, nxt):
            tmp = em.fresh("sw")
            em(f"{{ void* {tmp} = {c}; {c} = {x}; {x} = {tmp}; }}")
        em.close()
        for k in range(nc):
            shape, dt = n.types[k]
            if rows is None:
                self._copy_ptr(cur[k], results[k], dt, shape, em)
            else:
                rows.copy_out(em, cur[k], results[k], shape, em.fresh("i"), sz)
        if rows is not None:
            em("#pragma omp barrier")  # the scan's results are complete after it

    def _chunked_input(self, c: ChunkedInput, ctx: GraphCtx, rows: RowScope, t: str, tt: str, length: str,
                       rev: bool, em: Emitter, before: Emitter, info: KernelInfo) -> str:
        """A scanned input whose projection is computed every few steps into a chunk buffer (``chunks``): the
        per-chunk GEMM goes into the time loop here; returns this step's slice of the chunk (the current rows)."""
        sz = self.sizes
        steps, view = c.steps, c.view
        chunk = self.alloc(c.gemm.out.dtype, c.gemm.out.shape)
        lo, count = em.fresh("lo"), em.fresh("cn")
        before(f"int64_t {lo} = 0, {count} = 0;")
        emit_chunk(self, em, c, ctx, chunk, t, length, rev, lo, count, before, rows)
        info.note += f", input projection computed {steps} steps at a time"
        at = f"({chunk} + {sz.index((var(tt) - var(lo)) * sz.count(view.shape[1:]))})"
        return rows.current_rows(at, view.shape[1:], sz)

    def _copy(self, src: Node, ctx: GraphCtx, out: str, em: Emitter, listing: list[KernelInfo]) -> None:
        self.kernel_pointwise(src, ctx, out, em, listing, kind="copy")

    def _copy_ptr(self, src: str, dst: str, dt: DType, shape: Sequence[int], em: Emitter) -> None:
        n = self.sizes.prod(shape)
        i = em.fresh("i")
        self.omp_for(em)
        em(f"for (int64_t {i} = 0; {i} < {n}; {i}++) {dst}[{i}] = {src}[{i}];")


def _shortest_stride(reads: Sequence[Expr], name: str) -> int:
    """The shortest step of the flat indices ``reads`` when loop variable ``name`` grows by one (0 where none
    reads it; a step that is not a number counts as the longest)."""
    steps = [c.value if c is not None and c.value is not None else 1 << 62
             for c in (coefficient(e, name) for e in reads if depends(e, name))]
    return min(map(abs, steps), default=0)


def _sum(a: Expr, b: Expr) -> Expr:
    """``a + b`` not folded: a concat's offsets are spelled as sums of its parts' sizes (``96 + 96``), as the C
    kernels always were (folding them changed gcc's register allocation in the concat loops)."""
    return Expr("add", (a, b))


def _last(sc: Scalar) -> str:
    return sc.stmts[-1].split(" = ", 1)[1].rstrip(";") if sc.stmts else "?"

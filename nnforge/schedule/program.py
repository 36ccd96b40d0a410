"""The records of a scheduled program: what each kernel computes, where its results go, and how loops run.

``schedule(graph, target)`` makes every decision a backend would otherwise take while printing code and writes
it down here; a renderer (``codegen.c``, later ``codegen.triton``) walks these records and only spells them. The
records are frozen. Each names the IR node it computes (``node``, left out of equality and repr): the renderer
evaluates a kernel's fused elementwise body from it, through the block's fusion ``grouping``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..dtypes import DType
from ..ir.lengths import loop_length_symbols
from ..ir.node import Graph, Node
from ..ir.printer import fmt_type, render
from ..passes.fuse import Grouping, SlicedGroup
from ..passes.rows import RowSplit
from .target import Target


@dataclass(frozen=True)
class Buf:
    """Where a value lives: a result of the enclosing graph (``output``: its position) or scratch of its own
    (``output`` None), allocated once for the program. ``per_row``: inside a row-split loop, scratch with the
    batch axis is allocated for the whole batch and each worker uses its rows."""

    name: str
    dtype: DType
    shape: tuple
    output: int | None = None

    def __str__(self) -> str:
        return f"{self.name}: {fmt_type(self.shape, self.dtype)}"


@dataclass(frozen=True)
class Kernel:
    """One kernel: computes ``node`` into ``out`` and stores the same values into the graph results ``also``
    (a scan step's h: the next carry and this step's row of the stacked outputs) without a second pass.
    ``fuses``: the op names it evaluates, the kernel's own op first, elementwise ops inlined into it after."""

    node: Node = field(compare=False, repr=False)
    out: Buf
    fuses: tuple[str, ...]
    also: tuple[int, ...] = ()

    @property
    def kind(self) -> str:
        return "+".join(dict.fromkeys(self.fuses)) or "copy"


@dataclass(frozen=True)
class Elementwise(Kernel):
    """A loop nest over ``out``'s elements evaluating the fused body (no elementwise op inlined: a copy).
    ``lanes``: elements of the last axis computed at once (a vector; 1: one at a time). ``columns``: the span
    ``[start, stop)`` of the last axis the vector loop covers (None: all of it) when the body reads a padded value
    along that axis (a shift, ``x.pad(((0, 0), (1, 0)))[:, :n]``): there every such read is inside its source,
    so no vector needs the pad's value, and the columns before and after run one at a time."""

    lanes: int = 1
    columns: tuple[int, int] | None = None


@dataclass(frozen=True)
class Reduce(Kernel):
    """A sum or max over ``node``'s axes, then ``epilogue`` (the elementwise root computed from each sum; None:
    the sums are stored). ``leading``: a float sum over the leading axes of a stored buffer, run with the outputs
    innermost (unit-stride reads). ``lanes``: a float sum or max over the last axis reads that many columns at
    once (vector partial sums or maxima; 1: one at a time)."""

    epilogue: Node | None = field(default=None, compare=False, repr=False)
    leading: bool = False
    lanes: int = 1


@dataclass(frozen=True)
class Rows(Kernel):
    """``members`` (row reductions over the last axis, elementwise kernels of the rows' shape; first, maybe, the
    GEMM whose rows they read: ``Target.gemm_row_programs``) as one kernel over rows of ``lead`` x ``width`` values
    (``Target.row_programs``): each program takes whole rows through every member in order, a member reading an
    earlier one's value from where it was computed (a row's sum, an element of the rows or of the product's
    rows, through a reshape that splits their leading axis), not from memory. ``stores``: whether each member
    stores its results, as it would alone (False where only later members read them: a softmax's exponentials, a
    layer norm's statistics). ``node``, ``out``: the last member's. ``views``: the reshapes through which members
    read a leading GEMM's rows (or elementwise work inlined on them) with their leading axis split."""

    members: tuple[Reduce | Elementwise | Gemm, ...] = ()
    lead: tuple = ()
    width: int = 0
    stores: tuple[bool, ...] = ()
    views: tuple[Node, ...] = field(default=(), compare=False, repr=False)


@dataclass(frozen=True)
class Gemm(Kernel):
    """A matrix product, then ``epilogue`` on each accumulator (None: the products are stored).
    ``b_resident``: B does not change inside the enclosing loop (a recurrent weight): packed once before the
    loop on a CPU, kept on chip on a GPU. ``pack_a``: A is packed per worker (a large GEMM outside loops, or an
    A read down its columns); ``k_split``: then also in K slices, partial sums kept in the result. ``lanes``:
    columns of a tile the epilogue (or the plain store) computes at once (a vector; 1: one at a time). ``tile``:
    (rows, columns) of its micro-kernel's register tile (``target.gemm_tile``; None: the backend blocks it).
    ``k_parts``: K summed in at most this many parts side by side, each a multiple of ``target.split_k_min`` long
    (as few as K needs at run time), into ``partials`` (``[k_parts, M, N]`` in the accumulator's dtype), then
    added in order with the epilogue (1: one sum over K, ``partials`` None)."""

    epilogue: Node | None = field(default=None, compare=False, repr=False)
    b_resident: bool = False
    pack_a: bool = False
    k_split: bool = False
    lanes: int = 1
    tile: tuple[int, int] | None = None
    k_parts: int = 1
    partials: Buf | None = None


@dataclass(frozen=True)
class SlicedGemm(Kernel):
    """A GEMM whose result is read only through column slices (an RNN's gates ``i, f, g, o``), computed tile by
    tile with the slices' reader kernels (``group.members``) run on each tile while it is in cache: one kernel,
    no buffer for the GEMM result. ``outs``: the members' buffers (``out`` is the last), ``also_of`` their extra
    stores. ``lanes``: columns of a tile the epilogue and the members compute at once (1: one at a time).
    ``product``: where the graph returns the GEMM result or its epilogue's value (a training forward step stacks
    its gate sums ``x_t @ W_ih.T + b + h @ W_hh.T`` for its backward), the buffer each tile is also stored into;
    else None. ``returns_root``: that value is the epilogue's (``group.root``), stored after it, not the
    product's. ``tile``: as a ``Gemm``'s, for tiles of one slice's width."""

    group: SlicedGroup = field(default=None, compare=False, repr=False)  # type: ignore[assignment]
    outs: tuple[Buf, ...] = ()
    also_of: tuple[tuple[int, ...], ...] = ()
    b_resident: bool = False
    lanes: int = 1
    product: Buf | None = None
    tile: tuple[int, int] | None = None
    returns_root: bool = False

    @property
    def returned(self) -> Node:
        """The node whose value ``product`` holds."""
        return self.group.root if self.returns_root else self.group.gemm


@dataclass(frozen=True)
class Concat(Kernel):
    """A concat computed source by source, each into its range along ``node``'s axis."""


@dataclass(frozen=True)
class ScatterAdd(Kernel):
    """``out[.., index[.., r, ..], ..] += x[.., r, ..]``, one line along the axis per worker (no atomics)."""


@dataclass(frozen=True)
class Random(Kernel):
    """Random numbers (``dist``: ``"uniform"`` in [0, 1) or ``"normal"``) from a counter-based generator: each
    element a pure function of the call's seed, the program's ``draw`` number of this node, the iterations of the
    loops around it and the element's index — no generator state crosses workers or steps, and every iteration
    of a loop draws afresh."""

    draw: int = 0
    dist: str = "uniform"


@dataclass(frozen=True)
class Copy(Kernel):
    """A graph result that is not computed into its place: an input, a view read as a buffer, a value already
    stored elsewhere, copied there at the end of the graph."""


@dataclass(frozen=True)
class ChunkedInput:
    """The ``k``-th scanned input of a row-split loop is the hoisted projection ``gemm`` (its only reader,
    through the reshape ``view``), computed ``steps`` steps at a time inside the loop into a chunk buffer."""

    k: int
    steps: int
    gemm: Gemm
    view: Node = field(compare=False, repr=False)


@dataclass(frozen=True)
class Block:
    """The kernels of one graph (the program's, or a loop body's), in order, then the copies into its results.
    ``graph`` and ``grouping`` are what the renderer evaluates fused bodies with."""

    graph: Graph = field(compare=False, repr=False)
    grouping: Grouping = field(compare=False, repr=False)
    kernels: tuple[Kernel | Loop, ...]
    copies: tuple[Copy, ...] = ()


@dataclass(frozen=True)
class Loop:
    """A scan (or ``nf.loop``) as a loop over ``length`` steps inside the program, carries ping-ponged between
    two buffers. ``parallel``: its batch rows are split among workers (threads on a CPU, programs on a GPU), each
    running every step on its rows with no synchronization until the loop ends; ``row_block``: rows per pass
    through the body (0: all of a worker's rows at once). ``chunked``: scanned inputs whose projection is
    computed in the loop a chunk of steps at a time. ``resident``: a loop not split by rows whose steps run in one
    launch, its programs waiting for each other after each kernel of the body (``Target.resident_steps``)."""

    node: Node = field(compare=False, repr=False)
    results: tuple[Buf, ...]
    length: object
    reverse: bool
    body: Block
    parallel: RowSplit | None = field(default=None, compare=False, repr=False)
    row_block: int = 0
    chunked: tuple[ChunkedInput, ...] = ()
    resident: bool = False

    @property
    def kind(self) -> str:
        return "scan" if self.node.op.name == "SCAN" else "loop"


@dataclass(frozen=True)
class Program:
    """A scheduled graph: its top-level block and the target it was scheduled for."""

    graph: Graph = field(compare=False, repr=False)
    target: Target
    block: Block

    def loops(self) -> list[Loop]:
        """Every loop of the program, outer ones first."""
        found: list[Loop] = []

        def walk(b: Block) -> None:
            for k in b.kernels:
                if isinstance(k, Loop):
                    found.append(k)
                    walk(k.body)

        walk(self.block)
        return found

    def kernels(self) -> list[Kernel]:
        """Every kernel of the program (loops' bodies included, the chunked projections where they run)."""
        found: list[Kernel] = []

        def walk(b: Block) -> None:
            for k in b.kernels:
                if isinstance(k, Loop):
                    found.extend(c.gemm for c in k.chunked)
                    walk(k.body)
                else:
                    found.append(k)
            found.extend(b.copies)

        walk(self.block)
        return found

    def __str__(self) -> str:
        return format_program(self)


def format_program(p: Program) -> str:
    """The program as text (``nf.show(..., stage="scheduled")``): one line per kernel, loops as indented blocks,
    each decision that is not the spelling of code written out."""
    syms = sorted(loop_length_symbols(p.graph))
    names = {s: "T" if i == 0 else f"T{i}" for i, s in enumerate(syms)}  # as the IR printer names them
    lines = [f"program for target {p.target.name}"]
    _format_block(p.block, "  ", lines, names)
    return "\n".join(lines)


def _format_block(b: Block, ind: str, lines: list[str], names: dict[str, str]) -> None:
    for k in b.kernels:
        if isinstance(k, Rows):
            lines.append(f"{ind}rows of {k.width} values, whole in each program {{")
            lines.extend(f"{ind}  {_kernel_line(m, names) if kept else m.kind + ' (held, not stored)'}"
                         for m, kept in zip(k.members, k.stores))
            lines.append(f"{ind}}}")
        elif isinstance(k, Loop):
            results = ", ".join(_buf(r, names) for r in k.results)
            lines.append(f"{ind}{_loop_head(k, names)} -> ({results}) {{")
            for c in k.chunked:
                lines.append(f"{ind}  every {c.steps} steps, input {c.k}: {_kernel_line(c.gemm, names)}")
            _format_block(k.body, ind + "  ", lines, names)
            lines.append(f"{ind}}}")
        else:
            lines.append(ind + _kernel_line(k, names))
    for c in b.copies:
        lines.append(ind + _kernel_line(c, names))


def _buf(b: Buf, names: dict[str, str]) -> str:
    return f"{b.name}: {fmt_type(b.shape, b.dtype, names)}"


def _loop_head(k: Loop, names: dict[str, str]) -> str:
    head = f"{k.kind} {'reverse ' if k.reverse else ''}over {render(k.length, names)} steps"
    if k.parallel is not None:
        head += f", rows split among workers (batch {int(k.parallel.batch)}"
        head += f", {k.row_block} rows per pass)" if k.row_block else ")"
    if k.resident:
        head += ", steps in one launch of resident programs"
    return head


def _kernel_line(k: Kernel, names: dict[str, str]) -> str:
    outs = k.outs if isinstance(k, SlicedGemm) else (k.out,)
    also = k.also_of if isinstance(k, SlicedGemm) else (k.also,)
    text = f"{k.kind} -> " + ", ".join(_buf(o, names) + (f" (and out{', out'.join(map(str, a))})" if a else "")
                                       for o, a in zip(outs, also))
    if isinstance(k, SlicedGemm) and k.product is not None:
        text += f", the {'epilogue' if k.returns_root else 'product'} -> {_buf(k.product, names)}"
    notes = []
    if isinstance(k, SlicedGemm):
        notes.append(f"column tiles of {len(k.group.offsets)} slices at {list(k.group.offsets)}")
    if isinstance(k, (Gemm, SlicedGemm)) and k.b_resident:
        notes.append("B resident across steps")
    if isinstance(k, Gemm) and k.pack_a:
        notes.append("A packed" + (" in K slices" if k.k_split else ""))
    if isinstance(k, Gemm) and k.k_parts > 1:
        notes.append(f"K in at most {k.k_parts} parts -> {_buf(k.partials, names)}")
    if isinstance(k, Gemm | SlicedGemm) and k.lanes > 1:
        notes.append(f"tiles {k.lanes} columns at a time")
    if isinstance(k, Elementwise) and k.lanes > 1:
        span = "" if k.columns is None else f" in columns {k.columns[0]}..{k.columns[1]}"
        notes.append(f"{k.lanes} columns at a time{span}")
    if isinstance(k, Reduce) and k.leading:
        notes.append("leading axes, outputs innermost")
    if isinstance(k, Copy):
        notes.append(f"from {k.node.op.name.lower()}")
    if isinstance(k, Random):
        notes.append(f"{k.dist}, draw {k.draw}")
    return text + (f"  [{'; '.join(notes)}]" if notes else "")


def stored_node(k: Kernel | Loop) -> Node:
    """The node whose buffer a kernel fills: a GEMM's or reduction's epilogue root, a sliced GEMM's root, else the
    node it computes."""
    if isinstance(k, SlicedGemm):
        return k.group.root
    if isinstance(k, Gemm | Reduce) and k.epilogue is not None:
        return k.epilogue
    return k.node

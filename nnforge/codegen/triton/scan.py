"""A row-split ``Loop`` as one persistent Triton kernel: no Python, and no launch, per time step.

The schedule splits the loop's batch rows among workers (``Loop.parallel``). Here a worker is a Triton program:
program ``pid`` owns rows ``[pid * ROWS, pid * ROWS + ROWS)`` of the batch for all T steps, with no
synchronization with other programs (the rows are independent). Inside the kernel:

* the carries are register tiles ``[ROWS, width]`` (columns padded to a power of two, at least 16 so a carry can
  be the left operand of ``tl.dot``), loaded once from the scan's initial values and stored once at the end;
* the recurrent weights (GEMM operands the schedule marks ``b_resident``) are loaded once, before the time loop,
  into register tiles; so is everything else that does not change across steps (biases);
* T is a run-time argument of the kernel (the time loop's bound), never a ``tl.constexpr``: a new sequence length
  runs the same compiled kernel; a reverse scan walks ``tt = T - 1 - t``, the direction an argument too, so a
  stack's layers of either direction share one kernel;
* each step reads its slice of the scanned inputs — copied into shared memory a step ahead by Triton's software
  pipeliner (``Tiles.scan_stages``) — or of the chunk buffer its chunked input projection is computed into,
  every ``steps`` steps, by each program for its own rows; it evaluates the body's kernels in order
  on register tiles — a ``SlicedGemm`` as one ``tl.dot`` per gate slice with the cell update on the tiles, the
  gate matrix never stored — and writes this step's rows of the stacked outputs.

Loops the slice cannot render raise ``Unsupported`` with the reason: loops not split by rows, bodies with
nested loops, scatter-adds or batched products, step values read through views, run-time widths.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from ...dtypes import DType
from ...ir.node import Node
from ...ir.ops import Op
from ...schedule import (
    Buf,
    ChunkedInput,
    Concat,
    Copy,
    Elementwise,
    Gemm,
    Loop,
    Reduce,
    SlicedGemm,
    Unsupported,
    stored_node,
)
from ...schedule.registers import Segments, row_segments
from .evaluate import Ctx, Emitter, Eval
from .texpr import acc_dtype, dot, flat, rounded, sliced, tl_dtype

if TYPE_CHECKING:
    from .render import Renderer


Pieces = list[tuple[str, int, int]]  # a value held one register tile per column range: (tile, offset, width)
Held = str | Pieces  # a step value in registers: one tile, or its pieces


def _pieces(held: Held, width: int) -> Pieces:
    return held if isinstance(held, list) else [(held, 0, width)]


def _pad(width: int) -> int:
    """Columns of a register tile holding ``width`` values per row: 1, or a power of two of 16 at least."""
    if width == 1:
        return 1
    return max(16, 1 << (width - 1).bit_length())


def tile_pieces(width: int) -> tuple[tuple[int, int], ...]:
    """The column ranges (offset, width) of the register tiles that hold ``width`` values of a row with the least
    padding: power-of-two tiles, widest first (96 as 64 + 32, where one tile would be 128 wide and a step's
    ``tl.dot`` would multiply a third of zeros); one range where pieces save no column (24 as 16 + 8 pads to 32
    either way) or one would be a single column (no ``tl.dot`` operand)."""
    if width < 2:
        return ((0, width),)
    pieces, off = [], 0
    while off < width:
        rest = width - off
        w = rest if _pad(rest) in (rest, 16) else 1 << (rest.bit_length() - 1)
        pieces.append((off, w))
        off += w
    if sum(_pad(w) for _, w in pieces) >= _pad(width) or any(w == 1 for _, w in pieces):
        return ((0, width),)
    return tuple(pieces)


class ScanKernel:
    """The state of one persistent kernel being rendered (see the module docstring)."""

    def __init__(self, r: Renderer, loop: Loop, ctx: Ctx, results: list[str]):
        self.r, self.loop, self.outer, self.results = r, loop, ctx, results
        self.sz = r.sz
        self.em = Emitter(hoist=True)
        self.em.variant |= {"t", "tt", "clo"}
        self.em.scalars |= {"pid", "r0", "t", "tt", "clo", "cstart", "ccount", "s"}
        n = loop.node
        self.nc, self.nx = n.attrs["n_carry"], n.attrs["n_xs"]
        self.batch = int(loop.parallel.batch)  # type: ignore[union-attr]
        # transposed: every step value is a [width, ROWS] tile, the rows on the inner axis (``Tiles``)
        self.tr = r.tiles.scan_transposed
        self.rows_axis, self.cols_axis = ("[None, :]", "[:, None]") if self.tr else ("[:, None]", "[None, :]")
        self.prologue = ["pid = tl.program_id(0).to(tl.int64)", "r0 = pid * ROWS",
                         f"r = tl.arange(0, ROWS){self.rows_axis}", "gr = r0 + r", f"rmask = gr < {self.batch}"]
        self.widths: dict[int, str] = {}
        self.idents: dict[tuple, tuple[str, ...]] = {}
        self.outer_evals: dict[tuple[str, str | None, bool], Eval] = {}
        self.pieces: dict[int, Pieces] = {}  # values held by column ranges
        # half precision: the step computes in float32 and rounds where it stores (carries stay float32)
        self.wide = any(dt.is_half for _, dt in n.types)
        self.split = r.tiles.scan_pieces  # rows of other widths than powers of two held as power-of-two tiles

    def eval(self, ctx: Ctx, mask: str | None, wide: bool | None = None, **kw) -> Eval:
        """An evaluator of ``ctx``'s nodes in this kernel (wide in a half-precision scan, unless ``wide`` says)."""
        return Eval(self.em, ctx, self.sz, mask, 2, wide=self.wide if wide is None else wide, **kw)

    # ---- tiles --------------------------------------------------------------------------------------------
    def width(self, n: Node) -> int:
        """Values per row of a body value ``[ROWS, ...]`` (a compile-time number)."""
        if not n.shape or n.shape[0] is None:
            raise Unsupported(f"{n.op.name.lower()} at {n.loc} in a row-split body has no batch axis")
        rest = n.shape[1:]
        if not all(self.sz.is_static(d) for d in rest):
            raise Unsupported(f"{n.op.name.lower()} at {n.loc}: a run-time width inside a persistent scan")
        w = 1
        for d in rest:
            w *= int(d)
        return w

    def shape(self, w: int) -> str:
        """The shape of a step value's tile of width ``w``."""
        return f"({_pad(w)}, ROWS)" if self.tr else f"(ROWS, {_pad(w)})"

    def dot(self, a: str, b: str, dt: DType) -> str:
        """``a @ b`` of a step's ``[ROWS, K]`` tile and a ``[K, width]`` weight tile, as the step holds values:
        transposed, ``bᵀ @ aᵀ`` of the ``[width, K]`` and ``[K, ROWS]`` tiles it has then."""
        return dot(b, a, dt) if self.tr else dot(a, b, dt)

    def cols(self, w: int) -> str:
        """The column index tensor ``[1, pad(w)]`` of a tile of width ``w`` (``[pad(w), 1]`` transposed;
        defined once, with its mask)."""
        if w not in self.widths:
            c = f"c{w}"
            self.prologue += [f"{c} = tl.arange(0, {_pad(w)}){self.cols_axis}", f"m{w} = rmask & ({c} < {w})"]
            self.widths[w] = c
        return self.widths[w]

    def krows(self, k: int) -> str:
        """The row index tensor ``[pad(k), 1]`` of a weight tile with ``k`` rows (``[1, pad(k)]`` transposed: the
        tile is then the weight's transpose, the left operand; defined once)."""
        name = f"kr{k}"  # "k<n>" names the emitter's constants
        if not any(line.startswith(f"{name} =") for line in self.prologue):
            self.prologue.append(f"{name} = tl.arange(0, {_pad(k)}){self.rows_axis}")
        return name

    def mask(self, w: int) -> str:
        self.cols(w)
        return f"m{w}"

    def ident(self, n: Node) -> tuple[str, ...]:
        """The index of a body value's own tile: the local row ``r``, its columns split into its axes."""
        w = self.width(n)
        key = tuple(int(d) for d in n.shape[1:])
        if key not in self.idents:
            c = self.cols(w)
            out: list[str] = []
            stride = 1
            for d in reversed(key):
                q = c if stride == 1 else f"{c} // {stride}"
                out.append(q if len(out) == len(key) - 1 else f"({q}) % {d}")
                stride *= d
            rest = tuple(reversed(out))
            names = []
            for k, e in enumerate(rest):
                if e == c:
                    names.append(c)
                else:
                    name = f"c{w}_{k}"
                    self.prologue.append(f"{name} = {e}")
                    names.append(name)
            self.idents[key] = ("r", *names)
        return self.idents[key]

    # ---- reads of the body's inputs -----------------------------------------------------------------------
    def outer_eval(self, mask: str | None, scope: str, wide: bool | None = None) -> Eval:
        """An evaluator of the enclosing graph's nodes (the loop's sources) under ``mask``, one per code scope
        (the step, or the chunk loop), so a value is never used outside the block that computed it; ``wide``
        False: half-precision values as they are stored (a product's operand), else as the kernel's."""
        key = (scope, mask, self.wide if wide is None else wide)
        if key not in self.outer_evals:
            self.outer_evals[key] = self.eval(self.outer, mask, key[2])
        return self.outer_evals[key]

    @staticmethod
    def global_row(i: str) -> str:
        """The batch row of the loop's sources that a body value's row ``i`` reads: the program's own rows, or
        row 0 of a source broadcast along the batch (``i`` is then ``0``)."""
        if i == "0":
            return "0"
        return "gr" if i == "r" else f"r0 + ({i})"

    def bind_inputs(self, body: Ctx) -> list[Held]:
        """The body's inputs: carries as registers (returned: their names; a carry held by column ranges, its
        (tile, offset, width) per range), scanned inputs as this step's slice (of the source, or of a chunk
        buffer), loop invariants read from the loop's sources."""
        loop, n = self.loop, self.loop.node
        split = loop.parallel
        inputs = body.graph.inputs
        chunked = {c.k: c for c in loop.chunked}
        carries: list[Held] = []
        for k in range(self.nc):
            x = inputs[k]
            name = f"h{k}"
            tl_dtype(x.dtype)
            tiles = self.tiling(x)
            pieces = []
            for j, (off, w, idx) in enumerate(tiles):
                tile = name if len(tiles) == 1 else f"{name}_{j}"
                init = self.outer_eval(self.mask(w), "pre").val(n.srcs[k], (self.global_row("r"), *idx[1:]))
                self.em.pre.append(f"{tile} = tl.broadcast_to({init}, {self.shape(w)})")
                self.em.variant.add(tile)
                pieces.append((tile, off, w))
            carries.append(self.hold(x, pieces, body))
        for k in range(self.nx):
            x, src = inputs[self.nc + k], n.srcs[self.nc + k]
            if k in chunked:
                body.leaf[id(x)] = self.chunk_reader(chunked[k])
            else:
                body.leaf[id(x)] = self.step_reader(src)
        for j in range(self.nc + self.nx, len(n.srcs)):
            body.leaf[id(inputs[j])] = self.invariant_reader(n.srcs[j], j in split.per_row)  # type: ignore
        return carries

    def step_reader(self, src: Node):
        def read(ev: Eval, idx: tuple[str, ...]) -> str:
            return self.outer_eval(ev.mask, "step").val(src, ("tt", self.global_row(idx[0]), *idx[1:]))
        return read

    def invariant_reader(self, src: Node, per_row: bool):
        def read(ev: Eval, idx: tuple[str, ...]) -> str:
            at = (self.global_row(idx[0]), *idx[1:]) if per_row else idx
            return self.outer_eval(ev.mask, "step", ev.wide).val(src, at)
        return read

    def chunk_reader(self, c: ChunkedInput):
        width = "*".join(self.sz(d) for d in c.view.shape[2:]) or "1"

        def read(ev: Eval, idx: tuple[str, ...]) -> str:
            row = f"(tt - clo) * {self.batch} + {self.global_row(idx[0])}"
            rest = flat(idx[1:], [self.sz(d) for d in c.view.shape[2:]]) if len(idx) > 1 else "0"
            mask = f", mask={ev.mask}, other=0" if ev.mask else ""
            return ev.tmp(f"tl.load({c.gemm.out.name} + ({row}) * ({width}) + ({rest}){mask})", "x")
        return read

    # ---- the kernel ---------------------------------------------------------------------------------------
    def render(self) -> None:
        loop, em = self.loop, self.em
        n = loop.node
        body_block = loop.body
        if any(isinstance(k, Loop) for k in body_block.kernels):
            raise Unsupported("a loop nested in a persistent scan's body")
        body = Ctx(body_block.graph, body_block.grouping)
        self.segs: Segments = row_segments(body_block.graph, self.nc)
        carries = self.bind_inputs(body)
        length = self.sz(loop.length)
        # Triton's software pipeliner copies each step's input tiles into shared memory asynchronously, stages - 1
        # steps ahead; not where the step reads a chunk buffer the kernel itself writes, every few steps
        stages = self.r.tiles.scan_stages if not loop.chunked else 1
        em.open(f"for t in tl.range(0, {length}, num_stages={stages}):" if stages > 1
                else f"for t in range(0, {length}):")
        # the direction is an argument (n0: 1 reverse, 0 forward), so a layer and its reverse are one kernel
        em.line(f"tt = t + n0 * ({length} - 1 - 2 * t)")
        for c in loop.chunked:
            self.chunk(c, length)
        nxt: dict[int, Held] = {}
        for k in body_block.kernels:
            self.body_kernel(k, body, nxt)  # type: ignore[arg-type]
        for c in body_block.copies:
            if c.node.op == Op.CONCAT:  # a step output joined from step values: stored source by source
                self.concat(c, body, nxt)
                continue
            tiles = self.tiling(c.node)
            pieces = [(self.eval(body, self.mask(w)).val(c.node, idx), off, w) for off, w, idx in tiles]
            self.keep(c.node, pieces, c.out, (), body, nxt)
        for k, name in enumerate(carries):
            if k not in nxt:
                raise Unsupported(f"carry {k} of the scan is not computed by its body")
            w = self.width(body.graph.inputs[k])
            old, new = _pieces(name, w), _pieces(nxt[k], w)
            if isinstance(name, list) != isinstance(nxt[k], list) or [q[1:] for q in old] != [q[1:] for q in new]:
                raise Unsupported(f"carry {k} of the scan is held by column ranges on one side of the step only")
            for (tile, _, tw), (v, _, _) in zip(old, new):
                em.line(f"{tile} = tl.broadcast_to({v}, {self.shape(tw)})")
        em.close()
        for k, name in enumerate(carries):
            x = body.graph.inputs[k]
            for (tile, _, _), (_, w, idx) in zip(_pieces(name, self.width(x)), self.tiling(x)):
                self.store(self.results[k], n.types[k][0], (self.global_row("r"), *idx[1:]), tile, self.mask(w))
        kinds = [kk.kind for kk in body_block.kernels]
        kind = "+".join(dict.fromkeys(["scan", *(s for kk in kinds for s in kk.split("+"))]))
        grid = [f"triton.cdiv({self.batch}, {self.r.tiles.scan_rows})"]
        self.r.emit(kind, em, grid, {"ROWS": self.r.tiles.scan_rows}, self.prologue,
                    extents=["1" if loop.reverse else "0"])

    def store(self, ptr: str, shape: tuple, idx: tuple[str, ...], value: str, mask: str) -> None:
        self.em.line(f"tl.store({ptr} + ({flat(idx, [self.sz(d) for d in shape])}), {value}, mask={mask})")

    def store_row(self, pos: int, tiles: Pieces) -> None:
        """Tiles (value, column offset, width) of this step's row of the scan's stacked output ``pos``. Tiles of
        one width at evenly spaced offsets, two, four, eight... of them, are joined (``tl.join``) into one tensor
        and stored at once: Triton stores a tile from the MMA layout through an exchange in shared memory between
        two barriers, once per store (built for sm_90, an H = 96 LSTM's training forward step had 30 barriers
        storing its eight gate-sum tiles one by one, 18 joined by width); other tiles are stored one by one."""
        ptr, shape = self.results[pos], self.loop.node.types[pos][0]
        by_width: dict[int, list[tuple[int, str]]] = {}
        for v, off, w in tiles:
            by_width.setdefault(w, []).append((off, v))
        for w, group in by_width.items():
            group.sort()
            offs, values = [o for o, _ in group], [v for _, v in group]
            n, gap = len(group), (offs[1] - offs[0] if len(group) > 1 else 0)
            if n < 2 or n & (n - 1) or offs != [offs[0] + j * gap for j in range(n)]:
                for off, v in group:
                    self.store(ptr, shape, ("tt", self.global_row("r"), sliced(self.cols(w), str(off))), v,
                               self.mask(w))
                continue
            axes = n.bit_length() - 1  # joined pairwise: element [.., a0, a1, ..] is tile a0 + 2 a1 + 4 a2 ...
            while len(values) > 1:
                values = [self.em.tmp(f"tl.join({a}, {b})", "j") for a, b in zip(values[::2], values[1::2])]
            grow = "[:, :" + ", None" * axes + "]"
            picks = [", ".join(["None"] * (2 + i) + [":"] + ["None"] * (axes - 1 - i)) for i in range(axes)]
            tile = " + ".join(f"{1 << i} * tl.arange(0, 2)[{pick}]" for i, pick in enumerate(picks))
            base = flat(("tt", self.global_row("r"), sliced(self.cols(w), str(offs[0]))), [self.sz(d) for d in shape])
            self.em.line(f"tl.store({ptr} + ({base}){grow} + ({tile}) * {gap}, {values[0]}, "
                         f"mask={self.mask(w)}{grow})")

    def hold(self, node: Node, pieces: Pieces, body: Ctx) -> Held:
        """``node``'s value in registers, one tile per piece of its ``tiling``, where the step's later kernels
        read it: one tile at the value's own index (``Ctx.reg``), several by their columns (``Ctx.ranges``, and
        products piece by piece)."""
        if len(pieces) == 1:
            body.reg[id(node)] = (pieces[0][0], self.ident(node))
            return pieces[0][0]
        self.pieces[id(node)] = pieces
        body.ranges[id(node)] = {("r", sliced(self.cols(w), str(off))): v for v, off, w in pieces}
        return pieces

    def keep(self, node: Node, pieces: Pieces, buf: Buf, also: tuple[int, ...], body: Ctx,
             nxt: dict[int, Held]) -> None:
        """A body value computed into registers, one tile per piece of its ``tiling`` (``hold``); a body result
        is also the next carry, or stored into this step's row of the stacked output (scratch gets no memory)."""
        positions = ([buf.output] if buf.output is not None else []) + list(also)
        held = self.hold(node, pieces, body)
        for pos in positions:
            if pos < self.nc:
                nxt[pos] = held
            elif isinstance(held, list):
                self.store_row(pos, pieces)
            else:
                self.store(self.results[pos], self.loop.node.types[pos][0],
                           ("tt", self.global_row("r"), *self.ident(node)[1:]), held, self.mask(self.width(node)))

    def body_kernel(self, k, body: Ctx, nxt: dict[int, Held]) -> None:
        if isinstance(k, SlicedGemm):
            self.sliced(k, body, nxt)
        elif isinstance(k, Gemm | Elementwise | Copy):
            self.by_tiles(k, body, nxt)
        elif isinstance(k, Reduce):
            self.row_reduce(k, body, nxt)
        elif isinstance(k, Concat):
            self.concat(k, body, nxt)
        else:
            raise Unsupported(f"{type(k).__name__} inside a persistent scan is not rendered by this slice")

    def product(self, p: Node, body: Ctx, columns: list[tuple[object, str]], resident: bool) -> list[str]:
        """``A @ B[:, off:off + width]`` for each (width, off) of ``columns``: A is this step's ``[ROWS, K]``
        tile (a register value or a load), B's tiles are loaded before the time loop when the schedule marks
        them resident, else each step."""
        em, sz = self.em, self.sz
        a, b = p.srcs
        if p.ndim != 2:
            raise Unsupported("a batched matmul inside a persistent scan")
        if not all(sz.is_static(d) for d in b.shape):
            raise Unsupported("a matmul with a run-time width inside a persistent scan")
        # A held (or computed) one tile per column range: one dot per tile against its rows of B, summed
        pieces = self.pieces.get(id(a)) or [(self.eval(body, self.mask(w)).val(a, idx), off, w)
                                            for off, w, idx in self.tiling(a)]
        narrow = f".to({tl_dtype(p.dtype)})" if self.wide else ""  # a dot's operands in the product's dtype
        tas = []
        for va, k0, kw in pieces:
            # padded columns zeroed (a computed value need not be 0 there); where there are none, the select keeps
            # the operand a value of its own, not the one the step stores: built for sm_90, an LSTM backward step
            # sharing them had 32 barriers, 18 without (Triton then copies the dots' operands to shared memory
            # together)
            tas.append((em.tmp(f"tl.where({self.cols(kw)} < {kw}, {va}, 0){narrow}", "a"), k0, kw))
        accs = []
        for width, off in columns:
            w = int(width)  # type: ignore[call-overload]
            cw = self.cols(w)
            terms = []
            for ta, k0, kw in tas:
                kk = self.krows(kw)
                mb = f"({kk} < {kw}) & ({cw} < {w})"
                vb = Eval(em, body, sz, mb, 2, hoist=resident).masked(b, (sliced(kk, str(k0)), sliced(cw, off)))
                tb = em.tmp(f"{vb}{narrow}", "w", hoist=resident)
                if resident and em.is_variant(tb):
                    raise Unsupported(f"matmul at {p.loc}: B is marked resident but changes across steps")
                terms.append(self.dot(ta, tb, p.dtype))
            total = " + ".join(terms)
            accs.append(em.tmp(total if self.wide else rounded(total, p.dtype), "acc"))
        return accs

    def tiling(self, n: Node) -> list[tuple[int, int, tuple[str, ...]]]:
        """(offset, width, index) of each register tile that holds body value ``n``: the column ranges of a value
        computed range by range (``Segments``: a layer-norm LSTM's gate row), and a row of another width than a
        power of two, cut into power-of-two pieces (``tile_pieces``, unless ``Tiles.scan_pieces`` is off); one
        tile at the value's own index otherwise."""
        w = self.width(n)
        if id(n) not in self.segs.nodes and n.ndim != 2:
            return [(0, w, self.ident(n))]
        base = self.segs.widths[w] if id(n) in self.segs.nodes else ((0, w),)
        cuts = [(off + o, pw) for off, bw in base for o, pw in (tile_pieces(bw) if self.split else ((0, bw),))]
        if len(cuts) < 2:
            return [(0, w, self.ident(n))]
        return [(off, pw, ("r", sliced(self.cols(pw), str(off)))) for off, pw in cuts]

    def by_tiles(self, k: Gemm | Elementwise | Copy, body: Ctx, nxt: dict[int, Held]) -> None:
        """A kernel's value computed tile by tile of its ``tiling``: a product one ``tl.dot`` per tile (summed
        over A's tiles), its epilogue or an elementwise body evaluated at each tile's columns."""
        node = stored_node(k)
        tiles = self.tiling(node)
        if isinstance(k, Gemm):
            p, root = k.node, k.epilogue
            accs = self.product(p, body, [(w, str(off)) for off, w, _ in tiles], k.b_resident)
            values = [acc if root is None else self.eval(body, self.mask(w), root=root,
                                                         overrides={(id(p), idx): acc}).val(root, idx)
                      for (_, w, idx), acc in zip(tiles, accs)]
        else:
            values = [self.eval(body, self.mask(w), root=node).val(node, idx) for _, w, idx in tiles]
        self.keep(node, [(v, off, w) for v, (off, w, _) in zip(values, tiles)], k.out, k.also, body, nxt)

    def concat(self, k: Concat | Copy, body: Ctx, nxt: dict[int, Held]) -> None:
        """A concat of tiles along the row, kept as its tiles (``schedule/registers.py`` admits it when products
        alone read it, or when its parts are the column ranges its readers compute by): each stored into its
        columns of this step's output row, each multiplied by its rows of a product's B (``product``)."""
        n = k.node
        if n.attrs["axis"] != n.ndim - 1 or n.ndim != 2:
            raise Unsupported(f"concat at {n.loc}: inside a persistent scan only a concat along the row")
        pieces, off = [], 0
        for src in n.srcs:
            for o, w, idx in self.tiling(src) if self.width(src) else ():
                pieces.append((self.eval(body, self.mask(w), root=n).val(src, idx), off + o, w))
            off += self.width(src)
        self.keep(n, pieces, k.out, k.also, body, nxt)

    def sliced(self, k: SlicedGemm, body: Ctx, nxt: dict[int, Held]) -> None:
        """One ``tl.dot`` per column slice (gate) on the step's A tile, the GEMM's epilogue on each gate tile,
        then the member kernels (the cell update) on the tiles: the gate matrix is never stored, only the product
        or the epilogue's value where the scan returns it (slice by slice into this step's row)."""
        sg = k.group
        p, root = sg.gemm, sg.root
        # the members' tiling (each [rows, slice width]): the tiles of every slice are the same pieces of it
        parts = self.tiling(sg.members[0])
        cuts = [(off + o, w) for off in sg.offsets for o, w, _ in parts]
        accs = self.product(p, body, [(w, str(off)) for off, w in cuts], k.b_resident)
        tiles: dict[tuple[int, tuple[str, ...]], str] = {}
        returned: Pieces = []  # the product's tiles (or its epilogue's value's) where the scan returns it
        for (off, w), acc in zip(cuts, accs):
            idx = ("r", sliced(self.cols(w), str(off)))
            value = acc
            if root is not p:
                value = self.eval(body, self.mask(w), root=root, overrides={(id(p), idx): acc}).val(root, idx)
            returned.append((value if k.returns_root else acc, off, w))
            tiles[(id(root), idx)] = value
        if k.product is not None:
            if k.product.output < self.nc:
                raise Unsupported(f"matmul at {p.loc}: a carry that is a GEMM read through column slices")
            self.store_row(k.product.output, returned)
        evs = [self.eval(body, self.mask(w), overrides=tiles) for _, w, _ in parts]
        for m, out, more in zip(sg.members, k.outs, k.also_of):
            for ev in evs:
                ev.root = m
            values = [ev.val(m, idx) for ev, (_, _, idx) in zip(evs, parts)]
            self.keep(m, [(v, off, w) for v, (off, w, _) in zip(values, parts)], out, more, body, nxt)

    def row_reduce(self, k: Reduce, body: Ctx, nxt: dict[int, Held]) -> None:
        """A sum or max over all of a row's values (a layer norm's statistics): one reduction across the row, of
        the tile, or of a value held by column ranges, of their tiles combined into one of the narrowest width."""
        p, root = k.node, k.epilogue
        src = p.srcs[0]
        if tuple(p.attrs["axes"]) != tuple(range(1, src.ndim)) or not p.dtype.is_float:
            raise Unsupported("a reduction inside a persistent scan other than a float sum or max over each row")
        em = self.em
        # ranges of one width are tiles of one shape: combined element by element first; wider tiles then fold to
        # the narrowest, halves combined, so one reduction crosses the row (a reduction across a program's warps
        # is a shared-memory round trip between barriers: H = 96 held as 64 + 32 took two per statistic)
        tiles: dict[int, list[str]] = {}
        for _, w, idx in self.tiling(src):
            value = self.eval(body, self.mask(w)).val(src, idx)
            tiles.setdefault(w, []).append(f"{value}.to({acc_dtype(p.dtype)})")
        is_sum = p.op == Op.SUM

        def combine(a: str, b: str) -> str:
            return f"{a} + {b}" if is_sum else f"tl.maximum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)"

        narrowest, axis, tr = min(_pad(w) for w in tiles), 0 if self.tr else 1, int(self.tr)
        empty, fold = ("0", "nf_fold_sum") if is_sum else ('-float("inf")', "nf_fold_max")  # the masked columns
        folded = []
        for w, vs in tiles.items():
            v = f"tl.where({self.mask(w)}, {functools.reduce(combine, vs)}, {empty})"
            cols = _pad(w)
            while cols > narrowest:
                v, cols = f"{fold}({v}, {tr})", cols // 2
            folded.append(v)
        total = functools.reduce(combine, folded)
        total = f"tl.sum({total}, axis={axis})" if is_sum else f"nf_max({total}, {axis})"  # NaN kept on a GPU
        row = f"({total}){self.rows_axis}"
        res = em.tmp(row if self.wide else rounded(row, p.dtype), "s")
        idx = self.ident(p)
        value = res
        if root is not None:
            value = self.eval(body, self.mask(1), root=root, overrides={(id(p), idx): res}).val(root, idx)
        self.keep(stored_node(k), [(value, 0, 1)], k.out, (), body, nxt)

    def chunk(self, c: ChunkedInput, length: str) -> None:
        """Every ``c.steps`` steps, the projection of this program's rows for the next chunk of steps (in the
        scan's direction) into the chunk buffer, between barriers (the program's threads write rows that other
        threads of it read)."""
        em, sz = self.em, self.sz
        steps = c.steps
        p = c.gemm.node
        root = c.gemm.epilogue or p
        em.line(f"cstart = (t // {steps}) * {steps}")
        em.line(f"ccount = tl.minimum({length} - cstart, {steps})")
        em.line(f"clo = cstart + n0 * ({length} - 2 * cstart - ccount)")  # the chunk's steps in the scan's direction
        em.variant |= {"cstart", "ccount", "s", "grow"}
        em.open(f"if t % {steps} == 0:")
        em.line("tl.debug_barrier()")
        em.open("for s in range(0, ccount):")
        em.line(f"grow = (clo + s) * {self.batch} + gr")
        a, b = p.srcs
        K, N = int(b.shape[0]), int(b.shape[1])
        ck, cn = self.cols(K), self.cols(N)
        kk = self.krows(K)
        outer = self.outer
        ta = Eval(em, outer, sz, self.mask(K), 2).masked(a, ("grow", ck))
        mb = f"({kk} < {K}) & ({cn} < {N})"
        tb = Eval(em, outer, sz, mb, 2, hoist=c.gemm.b_resident).masked(b, (kk, cn))
        acc = em.tmp(rounded(self.dot(ta, tb, p.dtype), p.dtype), "acc")
        idx = ("grow", cn)
        value = acc
        if root is not p:
            value = Eval(em, outer, sz, self.mask(N), 2, root=root, overrides={(id(p), idx): acc}).val(root, idx)
        em.line(f"tl.store({c.gemm.out.name} + (s * {self.batch} + gr) * {N} + {cn}, {value}, mask={self.mask(N)})")
        em.close()
        em.line("tl.debug_barrier()")
        em.close()


def render_loop(r: Renderer, loop: Loop, ctx: Ctx, results: list[str]) -> None:
    """The persistent kernel of a row-split loop (see the module docstring); ``Unsupported`` for other loops."""
    if loop.parallel is None:
        raise Unsupported(f"{loop.kind} at {loop.node.loc} is not split by rows (the schedule keeps it "
                          "work-shared): this slice renders only persistent row-split scans")
    if loop.node.op != Op.SCAN:
        raise Unsupported("nf.loop is not rendered by this slice")
    ScanKernel(r, loop, ctx, results).render()

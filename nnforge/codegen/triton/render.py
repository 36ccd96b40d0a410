"""Rendering a scheduled ``Program`` as one Python module of Triton kernels and the launcher that runs them.

The renderer walks the program's records in order and spells each: an ``Elementwise`` or ``Copy`` kernel is a
blocked loop over the flat output index (masked for the partial last block), a ``Reduce`` a tile of outputs by
reduced elements, ``Rows`` whole rows a program through each of its members (``rows.py``), a ``Gemm``
``tl.dot`` over K blocks with its epilogue on the accumulator, a ``Concat`` one kernel storing each source into
its range, and a row-split ``Loop`` one persistent kernel (``scan.py``). The generated ``run(ins, data, outs,
S, dev)`` allocates the program's scratch buffers, computes each grid from the run-time sizes ``S`` and launches
the kernels in order: no Python runs per time step.

What the renderer decides itself (no record holds it yet): the block sizes (``target.Tiles``), multiply-adds
contracted to FMA (``target.FP_FUSION``), float32 dots in IEEE precision (not TF32: results must match the float32
reference), that scratch is allocated per call, and that a half-precision persistent scan computes its step in
float32 (``scan.ScanKernel.wide``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ...dtypes import DType
from ...ir.node import Node
from ...ir.ops import Op
from ...schedule import (
    Block,
    Buf,
    Concat,
    Copy,
    Elementwise,
    Gemm,
    Kernel,
    Loop,
    Program,
    Random,
    Reduce,
    Rows,
    ScatterAdd,
    SlicedGemm,
    Unsupported,
    stored_node,
)
from .evaluate import Ctx, Emitter, Eval
from .rows import render_rows
from .scan import render_loop
from .steps import render_steps
from .target import DOT_PROMOTE_K, FP_FUSION, HELD_BYTES, GemmBlock, Tiles
from .texpr import (
    PRELUDE,
    TORCH_DTYPE,
    Sizes,
    acc_dtype,
    dot,
    flat,
    rounded,
    sliced,
    tile_ids,
    tile_mask,
    tl_dtype,
)

_NAME = re.compile(r"[A-Za-z_]\w*")
# a GEMM kernel's sum over K, spelled into the emitter given its accumulators and batch index
KSum = Callable[[Emitter, list[str], tuple[str, ...]], None]


def open_k_loop(em: Emitter, lo: str, hi: str, static_k: int | None, dt: DType, accs: Sequence[str]) -> list[str]:
    """Open a GEMM's loop over K from ``lo`` to ``hi`` (all of K, or one part of it; ``static_k``: K where it is
    fixed, else None) by ``BK`` (``k0``), accumulating into ``accs``; returns the names each product is added
    into. A half-precision product whose K may exceed ``DOT_PROMOTE_K`` sums each block of that many into a fresh
    accumulator, added into its float32 one when the block ends: the tensor cores' own accumulation does not
    round to nearest, and over the millions of a weight gradient's K its error would grow with K."""
    if not dt.is_half or (static_k is not None and static_k <= DOT_PROMOTE_K):
        em.open(f"for k0 in range({lo}, {hi}, BK):")
        return list(accs)
    parts = [f"part{g}" for g in range(len(accs))]
    em.open(f"for k1 in range({lo}, {hi}, {DOT_PROMOTE_K}):")
    for part in parts:
        em.line(f"{part} = tl.zeros([BM, BN], tl.float32)")
    em.open(f"for k0 in range(k1, tl.minimum(k1 + {DOT_PROMOTE_K}, {hi}), BK):")
    return parts


def close_k_loop(em: Emitter, accs: Sequence[str], into: Sequence[str]) -> None:
    """Close what ``open_k_loop`` opened, adding each block's sum into its accumulator."""
    em.close()
    if list(into) != list(accs):
        for acc, part in zip(accs, into, strict=True):
            em.line(f"{acc} += {part}")
        em.close()


@dataclass(frozen=True)
class Stage:
    """One kernel of a resident loop's body (``steps.resident_kernel``): the function ``name`` of a program id,
    run for each of ``grid`` programs (a host expression) on its arguments — buffers, step counters, run-time
    sizes, ``extents`` (host expressions) — with block sizes ``consts``, wanting ``warps`` warps. ``held``: the
    same kernel with its weights held across steps, as the function loading a program's tile of them and the
    kernel taking them (``Renderer.sliced``), where they fit."""

    name: str
    grid: str
    buffers: list[str]
    counters: list[str]
    sizes: list[str]
    extents: list[str]
    consts: dict[str, int]
    warps: int
    held: tuple[Stage, Stage] | None = None  # the weights function and the kernel that holds them


@dataclass
class Rendered:
    """The module source, the names of its kernels (in launch order) and the records they render."""

    source: str
    kernels: list[str] = field(default_factory=list)


class Renderer:
    """Renders one ``Program`` (see the module docstring)."""

    def __init__(self, program: Program, sizes: Sizes, tiles: Tiles | None = None):
        self.program = program
        self.graph = program.graph
        self.sz = sizes
        self.tiles = tiles or Tiles()
        self.kernels: list[str] = []
        self.names: list[str] = []  # the kernel of each launch, in launch order
        self.alike: dict[str, str] = {}  # kernel text (its name a placeholder) -> its name
        self.run: list[str] = []
        self.ind = "    "  # of the next line of ``run`` (host loops nest it)
        self.buffers: list[str] = []  # every buffer name of the program, in the order kernels take them
        self.scalars: list[str] = []  # host loop counters in scope (kernel arguments when a kernel reads them)
        self.tags = 0  # host loops rendered (their buffers' names)
        self.host_loops = 0  # of them, those run() steps through itself
        self.stages: list[Stage] | None = None  # set while a resident loop's body is rendered (``emit``)

    # ---- the module ---------------------------------------------------------------------------------------
    def render(self) -> Rendered:
        g = self.graph
        ctx = Ctx(g, self.program.block.grouping)
        ins = [f"in{k}" for k in range(len(g.inputs))]
        for n, name in zip(g.inputs, ins):
            ctx.buffers[id(n)] = name
        data = [n for n in g.order if n.op == Op.DATA]
        for k, n in enumerate(data):
            ctx.buffers[id(n)] = f"d{k}"
        outs = [f"out{k}" for k in range(len(g.outputs))]
        self.buffers = [*ins, *(f"d{k}" for k in range(len(data))), *outs]
        self.block(self.program.block, ctx)
        syms = ", ".join(f"S{k}" for k in range(len(self.sz.dynamic)))
        head = ["def run(ins, data, outs, S, dev, seed=0, launch=nf_launch):",
                '    """Launch the kernels in order on tensors of device ``dev`` (with ``launch``: a pass that only '
                'compiles them, warm.py)."""',
                f"    ({', '.join(ins)}{',' if ins else ''}) = ins",
                f"    ({', '.join(f'd{k}' for k in range(len(data)))}{',' if data else ''}) = data",
                f"    ({', '.join(outs)}{',' if outs else ''}) = outs",
                f"    ({syms}{',' if syms else ''}) = S"]
        seeded = any(isinstance(k, Random) for k in self.program.kernels())
        source = "\n".join(["import os", "import torch", "import triton", "import triton.language as tl", "", "",
                            PRELUDE,
                            f"SEEDED = {seeded}  # run() draws random numbers from its seed",
                            f"HOST_LOOPS = {self.host_loops}  # loops run() steps through itself, a launch per step",
                            "",
                            *("\n\n" + k for k in self.kernels), "", "", *head, *self.run, "    return None", ""])
        return Rendered(source, list(self.names))

    def block(self, block: Block, ctx: Ctx) -> None:
        """The kernels of the top-level block in order, then its copies into the results."""
        chunked = {id(stored_node(c.gemm)) for k in block.kernels if isinstance(k, Loop)
                   for c in k.chunked}
        for k in block.kernels:
            if isinstance(k, Loop):
                for c in k.chunked:
                    self.alloc(c.gemm.out)
                results = [self.place(b) for b in k.results]
                if k.parallel is not None:
                    render_loop(self, k, ctx, results)
                else:
                    render_steps(self, k, ctx, results)
                ctx.bind_results(k.node, results)
                continue
            if id(stored_node(k)) in chunked:
                continue
            if isinstance(k, Rows):
                render_rows(self, k, ctx, lambda buf, also: [self.place(buf), *(f"out{i}" for i in also)])
                continue
            if isinstance(k, SlicedGemm):
                outs = [[self.place(o), *(f"out{i}" for i in more)] for o, more in zip(k.outs, k.also_of)]
                product = [self.place(k.product)] if k.product is not None else []
                self.sliced(k, ctx, outs, product)
                for m, o in zip(k.group.members, outs):
                    ctx.buffers[id(m)] = o[0]
                if product:
                    ctx.buffers[id(k.returned)] = product[0]
                continue
            out = self.place(k.out)
            self.kernel(k, ctx, [out, *(f"out{i}" for i in k.also)])
            ctx.buffers[id(stored_node(k))] = out
        self.copies([(c.node, [self.place(c.out), *(f"out{i}" for i in c.also)]) for c in block.copies], ctx)

    def place(self, buf: Buf) -> str:
        """A buffer's name: a result of the program, or scratch allocated by ``run`` (per call)."""
        if buf.output is not None:
            return f"out{buf.output}"
        return self.alloc(buf)

    def alloc(self, buf: Buf) -> str:
        shape = ", ".join(self.sz(d) for d in buf.shape)
        self.run.append(f"{self.ind}{buf.name} = torch.empty(({shape}{',' if len(buf.shape) == 1 else ''}), "
                        f"dtype={TORCH_DTYPE.get(buf.dtype) or tl_dtype(buf.dtype)}, device=dev)")
        self.buffers.append(buf.name)
        return buf.name

    def kernel(self, k: Kernel, ctx: Ctx, outs: list[str]) -> None:
        if isinstance(k, Gemm):
            self.gemm(k, ctx, outs)
        elif isinstance(k, Reduce):
            self.reduce(k, ctx, outs)
        elif isinstance(k, Concat):
            self.concat(k, ctx, outs)
        elif isinstance(k, ScatterAdd):
            self.scatter_add(k, ctx, outs)
        elif isinstance(k, Elementwise | Copy):
            self.elementwise(k, ctx, outs)
        elif isinstance(k, Random):
            self.random(k, outs)
        else:
            raise Unsupported(f"no Triton form of kernel {type(k).__name__}")

    def emit(self, kind: str, em: Emitter, grid: Sequence[str], consts: dict[str, int],
             prologue: Sequence[str] = (), extents: Sequence[str] = (), warps: int | None = None,
             takes: Sequence[str] = ()) -> str:
        """Add one ``@triton.jit`` kernel named after what it fuses and its launch, on ``warps`` warps (default:
        ``Tiles.scan_warps`` for a persistent scan, else ``Tiles.warps``); returns the name. Its
        arguments are the buffers its code names, the host loop counters it reads, then every run-time size,
        then ``extents`` (host expressions its code names ``n0``, ``n1``...: a count passed rather than printed,
        so that kernels alike but for it are one), none of them specialized on (a new step, sequence length or
        count reuses the compiled kernel), then the block sizes. While a resident loop's body is rendered
        (``stages`` set) the kernel is a function of its program id ``vpid`` (and of the values named ``takes``)
        that the loop's kernel calls for each of the programs of ``grid``, noted in ``stages`` rather than
        launched."""
        body = em.finished([*prologue, *em.pre, *em.code])
        used = list(dict.fromkeys(tok for line in body for tok in _NAME.findall(line)))  # in order of first use
        known = set(self.buffers)
        bufs = [b for b in used if b in known]
        counters = [s for s in used if s in self.scalars]
        sizes = [f"S{k}" for k in range(len(self.sz.dynamic))]
        # parameters named by position: kernels alike but for the buffers they are handed (the layers of a
        # stack, each direction) are one kernel, compiled once
        formal = {b: f"ptr{i}" for i, b in enumerate(bufs)} | {c: f"ctr{i}" for i, c in enumerate(counters)}
        body = [_NAME.sub(lambda m: formal.get(m.group(0), m.group(0)), line) for line in body]
        syms = [*(formal[c] for c in counters), *sizes, *(f"n{i}" for i in range(len(extents)))]
        params = [*(formal[b] for b in bufs), *syms, *(f"{c}: tl.constexpr" for c in consts)]
        nospec = f"(do_not_specialize={syms!r})" if syms else ""
        # counters and sizes arrive as int32: offsets built from them (a step times a step's size) pass 2^31
        wide = [f"{s} = {s}.to(tl.int64)" for s in syms]
        stage = self.stages is not None
        if stage:  # called with its program id by a resident loop's kernel (``steps.resident_kernel``)
            body = [line.replace("tl.program_id(0)", "tl.cast(vpid, tl.int32)") for line in body]
            params[0:0] = ["vpid", *takes]
        text = "\n".join(["@triton.jit" if stage else f"@triton.jit{nospec}", f"def {{name}}({', '.join(params)}):",
                          *("    " + line for line in [*wide, *body])])
        name = self.alike.get(text) or f"k{len(self.kernels)}_{kind.replace('+', '_')}" + ("_at" if stage else "")
        if text not in self.alike:
            self.alike[text] = name
            self.kernels.append(text.replace("{name}", name, 1))
        if warps is None:
            warps = self.tiles.scan_warps if "ROWS" in consts else self.tiles.warps
        args = [*bufs, *counters, *sizes, *extents]
        if self.stages is not None:
            self.stages.append(Stage(name, grid[0], bufs, counters, sizes, list(extents), dict(consts), warps))
            return name
        self.names.append(name)
        meta = "".join(f", {c}={v}" for c, v in consts.items()) + f", num_warps={warps}, enable_fp_fusion={FP_FUSION}"
        self.run.append(f"{self.ind}launch({name}, ({', '.join(grid)},), {', '.join(args)}{meta})")
        return name

    # ---- kernels over the flat output index ---------------------------------------------------------------
    def flat_index(self, em: Emitter, shape: Sequence[object]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The multi-index of each flat offset ``offs`` in ``shape`` (and the shape as strings)."""
        dims = tuple(self.sz(d) for d in shape)
        if not dims:
            return (), dims
        ev = Eval(em, Ctx(self.graph, self.program.block.grouping), self.sz, None, 1, hoist=False)
        return ev.unflatten("offs", dims), dims

    def elementwise(self, k: Elementwise | Copy, ctx: Ctx, outs: list[str]) -> None:
        """``k.node`` element by element into ``outs`` (a copy loads the node's buffer, or its view)."""
        copy = isinstance(k, Copy)
        self.fill([(k.node, outs)], ctx, "copy" if copy else k.kind, None if copy else k.node)

    def fill(self, nodes: list[tuple[Node, list[str]]], ctx: Ctx, kind: str = "copy", root: Node | None = None
             ) -> None:
        """Nodes of ``ctx``'s graph, all of one shape, evaluated element by element into their outputs in one
        kernel: loaded from their buffers (or through their views), ``root`` computed from its sources."""
        em = Emitter()
        shape = nodes[0][0].shape
        idx, dims = self.flat_index(em, shape)
        index_lines = len(em.code)
        ev = Eval(em, ctx, self.sz, "m", 1, root=root, flat_hint={(idx, dims): "offs"})
        for n, outs in nodes:
            v = ev.val(n, idx)
            for o in outs:
                em.line(f"tl.store({o} + offs, {v}, mask=m)")
        read = {tok for line in em.code[index_lines:] for tok in _NAME.findall(line)}
        # every access at the flat offset (the multi-index unread: ``emit`` drops it): only the count is the shape's
        self.emit_flat(kind, em, self.sz.prod(shape), passed=read.isdisjoint(set(idx) - {"offs"}))

    def copies(self, copies: list[tuple[Node, list[str]]], ctx: Ctx) -> None:
        """A block's copies into its results, those of one shape in one kernel (``fill``): in a host loop each
        kernel is a launch per step, and a training forward's step saves two carries this way."""
        groups: dict[tuple[str, ...], list[tuple[Node, list[str]]]] = {}
        for n, outs in copies:
            groups.setdefault(tuple(self.sz(d) for d in n.shape), []).append((n, outs))
        for group in groups.values():
            self.fill(group, ctx)

    def emit_flat(self, kind: str, em: Emitter, count: str, masked: bool = True, passed: bool = False) -> str:
        """``emit`` for a kernel over ``count`` flat elements (or lines), ``BLOCK`` per program: its code finds
        ``pid``, its offsets ``offs`` and (``masked``) their mask ``m = offs < count`` set. ``passed``: the code
        depends on no shape but through the count, which is then an argument: the same update of every
        parameter of a model (an optimizer's), or copies of any size, are one kernel, built once."""
        prologue = ["pid = tl.program_id(0).to(tl.int64)", "offs = pid * BLOCK + tl.arange(0, BLOCK)",
                    *([f"m = offs < {'n0' if passed else count}"] if masked else [])]
        return self.emit(kind, em, [f"triton.cdiv({count}, {self.tiles.flat})"], {"BLOCK": self.tiles.flat},
                         prologue, extents=[count] if passed else [])

    def random(self, k: Random, outs: list[str]) -> None:
        """The draw's numbers into ``outs``: Philox (``tl.rand`` / ``tl.randn``) at each flat offset, keyed by
        ``nf_key`` on the host from the call's seed, the draw's number and the host loops' counters: every call
        and every step draws afresh, whatever the block size."""
        n = k.node
        key = f"rk{k.draw}"
        self.run.append(f"{self.ind}{key} = nf_key(seed, {k.draw}{''.join(f', {t}' for t in self.scalars)})")
        em = Emitter()
        draw = "tl.randn" if k.dist == "normal" else "tl.rand"
        value = f"{draw}({key}, offs).to({tl_dtype(n.dtype)})"
        for o in outs:
            em.line(f"tl.store({o} + offs, {value}, mask=m)")
        self.scalars.append(key)  # a kernel argument like a loop counter: never specialized on
        try:
            self.emit_flat(k.kind, em, self.sz.prod(n.shape), passed=True)
        finally:
            self.scalars.pop()

    def concat(self, k: Concat, ctx: Ctx, outs: list[str]) -> None:
        """Each source of the concat into its range along the axis: one kernel, a masked block of every part."""
        n = k.node
        axis = n.attrs["axis"]
        em = Emitter()
        odims = [self.sz(d) for d in n.shape]
        start = "0"
        sizes = []
        for s in n.srcs:
            if int(s.shape[axis]) == 0:
                continue
            numel = self.sz.prod(s.shape)
            sizes.append(numel)
            mask = em.tmp(f"offs < {numel}", "m")
            idx, dims = self.flat_index(em, s.shape)
            v = Eval(em, ctx, self.sz, mask, 1, flat_hint={(idx, dims): "offs"}).val(s, idx)
            at = idx[axis] if start == "0" else f"{idx[axis]} + {start}"
            for o in outs:
                em.line(f"tl.store({o} + ({flat([*idx[:axis], at, *idx[axis + 1:]], odims)}), {v}, mask={mask})")
            d = self.sz(s.shape[axis])
            start = d if start == "0" else f"{start} + {d}"
        if not sizes:
            return
        biggest = sizes[0] if len(sizes) == 1 else f"max({', '.join(sizes)})"
        self.emit_flat(k.kind, em, biggest, masked=False)  # each part masks its own range

    def scatter_add(self, k: ScatterAdd, ctx: Ctx, outs: list[str]) -> None:
        """``out[.., index[.., r, ..], ..] += x[.., r, ..]``: each lane owns one line of ``out`` along the axis,
        zeroes it and adds the values in order of ``r`` (no atomics: the sums are deterministic, as on the CPU).
        An out-of-range index adds nothing (the reference backend raises)."""
        n = k.node
        x, index = n.srcs
        axis = n.attrs["axis"]
        if n.dtype.is_half:
            raise Unsupported(f"scatter_add at {n.loc} in {n.dtype.value} (it would need float32 lines)")
        sz = self.sz
        em = Emitter()
        lines = [d for a, d in enumerate(x.shape) if a != axis]
        n_lines, width, length = sz.prod(lines), sz(n.shape[axis]), sz(x.shape[axis])
        line = Eval(em, ctx, sz, None, 1, hoist=False).unflatten("offs", [sz(d) for d in lines]) if lines else ()
        oshape = [sz(d) for d in n.shape]

        def at(i: str) -> str:  # a block pointer offset even when the lines are one (0-d)
            return f"{flat((*line[:axis], i, *line[axis:]), oshape)}{'' if lines else ' + offs * 0'}"

        em.open(f"for z in range(0, {width}):")
        em.line(f"tl.store({outs[0]} + ({at('z')}), tl.zeros([BLOCK], {tl_dtype(n.dtype)}), mask=m)")
        em.close()
        em.open(f"for r in range(0, {length}):")
        read = (*line[:axis], "(r + offs * 0)", *line[axis:])  # a block index: a broadcast read stays a block
        v, j = Eval(em, ctx, sz, "m", 1).val(x, read), Eval(em, ctx, sz, "m", 1).val(index, read)
        ok = em.tmp(f"m & ({j} >= 0) & ({j} < {width})", "g")
        jj = em.tmp(f"tl.minimum(tl.maximum({j}, 0), {width} - 1).to(tl.int64)", "i")
        ptr = em.tmp(f"{outs[0]} + ({at(jj)})", "p")
        em.line(f"tl.store({ptr}, tl.load({ptr}, mask={ok}, other=0) + {v}, mask={ok})")
        em.close()
        for o in outs[1:]:
            em.open(f"for z in range(0, {width}):")
            em.line(f"tl.store({o} + ({at('z')}), tl.load({outs[0]} + ({at('z')}), mask=m), mask=m)")
            em.close()
        self.emit_flat(k.kind, em, n_lines)

    # ---- reductions ---------------------------------------------------------------------------------------
    def reduce(self, k: Reduce, ctx: Ctx, outs: list[str]) -> None:
        """Outputs by reduced elements, ``BO`` x ``BR`` at a time, accumulated element-wise and reduced at the
        end; the epilogue on each result. ``k.leading`` puts the outputs on the tile's inner (contiguous) axis."""
        p, root = k.node, k.epilogue
        src = p.srcs[0]
        axes = tuple(p.attrs["axes"])
        if p.dtype == DType.bool or not (p.dtype.is_float or p.dtype.is_int):
            raise Unsupported(f"no Triton reduction on {p.dtype.value}")
        acc_t = acc_dtype(p.dtype)
        is_sum = p.op == Op.SUM
        init = "0" if is_sum else ('-float("inf")' if p.dtype.is_float else str(-(2 ** 63) if p.dtype ==
                                                                                   DType.int64 else -(2 ** 31)))
        em = Emitter()
        sz = self.sz
        kept = [d for a, d in enumerate(src.shape) if a not in axes]
        red = [src.shape[a] for a in axes]
        n_out, n_red = sz.prod(kept), sz.prod(red)
        lead = k.leading
        o2, r2 = ("offs[None, :]", "rr[:, None]") if lead else ("offs[:, None]", "rr[None, :]")
        axis = 0 if lead else 1
        dims = "BR, BO" if lead else "BO, BR"
        shape = f"[{dims}]"
        prologue = ["pid = tl.program_id(0).to(tl.int64)", "offs = pid * BO + tl.arange(0, BO)",
                    f"mo = offs < {n_out}", f"acc = tl.full({shape}, {init}, {acc_t})"]
        ev0 = Eval(em, ctx, sz, None, 2, hoist=False)
        out_idx = ev0.unflatten(o2, [sz(d) for d in kept]) if kept else ()
        em.open(f"for r0 in range(0, {n_red}, BR):")
        em.line("rr = r0 + tl.arange(0, BR).to(tl.int64)")
        em.line(f"mt = ({o2} < {n_out}) & ({r2} < {n_red})")
        red_idx = Eval(em, ctx, sz, None, 2, hoist=False).unflatten(r2, [sz(d) for d in red]) if red else ()
        full, it, rit = [], iter(out_idx), iter(red_idx)
        for a in range(src.ndim):
            full.append(next(rit) if a in axes else next(it))
        ev = Eval(em, ctx, sz, "mt", 2)
        if is_sum:
            em.line(f"acc = acc + {ev.masked(src, full)}.to({acc_t})")
        else:
            # on the tile's shape: a 0-d value (one element read) compared with the block of maxima and or-ed with
            # its 0-d NaN test fails under Triton's interpreter
            v = ev.tmp(f"tl.broadcast_to({ev.val(src, full)}, ({dims}))")
            nan = f" | ({v} != {v})" if p.dtype.is_float else ""
            em.line(f"acc = tl.where(mt & (({v} > acc){nan}), {v}, acc)")
        em.close()
        if is_sum:
            em.line(f"res = tl.sum(acc, axis={axis})")
        elif p.dtype.is_float:
            em.line(f"res = nf_max(acc, {axis})")
        else:
            em.line(f"res = tl.max(acc, axis={axis})")
        if p.dtype.is_half:
            em.line(f"res = {rounded('res', p.dtype)}")
        value = "res"
        if root is not None:  # at the result's index over p's shape (its flat offset is ``offs``)
            idx, dims = self.flat_index(em, p.shape)
            value = Eval(em, ctx, sz, "mo", 1, root=root, overrides={(id(p), idx): "res"},
                         flat_hint={(idx, dims): "offs"}).val(root, idx)
        for o in outs:
            em.line(f"tl.store({o} + offs, {value}, mask=mo)")
        self.emit(k.kind, em, [f"triton.cdiv({n_out}, {self.tiles.reduce_rows})"],
                  {"BO": self.tiles.reduce_rows, "BR": self.tiles.reduce_cols}, prologue)

    # ---- GEMM ---------------------------------------------------------------------------------------------
    def static(self, d: object) -> int | None:
        """A size's value where it is fixed when the program is built, else None (a run-time size)."""
        return int(d) if self.sz.is_static(d) else None  # type: ignore[call-overload]

    def gemm(self, k: Gemm, ctx: Ctx, outs: list[str]) -> None:
        """``tl.dot`` over K blocks into a ``BM`` x ``BN`` accumulator (one program per output tile and batch
        index), then the epilogue on the accumulator and the stores. With ``k.k_parts`` the sum over K runs in
        parts (``gemm_parts``), and the epilogue in a kernel of its own that adds them."""
        p = k.node
        if k.pack_a or k.k_split:
            raise Unsupported("a GEMM scheduled with packed A or a K split (CPU forms) has no Triton spelling")
        if k.k_parts > 1:
            return self.gemm_parts(k, ctx, outs)
        batch = p.shape[:-2]
        block = self.gemm_block(p, copies=batch)

        def spell(consts: dict[str, int], k_sum: KSum, takes: Sequence[str] = ()) -> None:
            self.gemm_kernel(k, ctx, outs, block, consts, k_sum, takes)

        spell(block.consts(), lambda em, accs, bidx: self.k_loop(em, ctx, p, bidx))
        if not batch:
            self.hold(p, k.b_resident, block, ["rn"], self.sz(p.shape[-1]), ctx, spell)

    def product_index(self, em: Emitter, ctx: Ctx, batch: Sequence) -> tuple[str, ...]:
        """The index along ``batch`` of the product a program of a batched GEMM computes (its ``pid_b``, from the
        prologue): scalar names, so that a load at it alone (one value per product) takes no block mask."""
        if not batch:
            return ()
        em.scalars.add("pid_b")  # its indices, made from it alone, are scalars too (``Eval.tmp``)
        return Eval(em, ctx, self.sz, None, 2, hoist=False).unflatten("pid_b", [self.sz(d) for d in batch])

    def gemm_kernel(self, k: Gemm, ctx: Ctx, outs: list[str], block: GemmBlock, consts: dict[str, int],
                    k_sum: KSum, takes: Sequence[str] = ()) -> None:
        """``gemm``'s kernel with its sum over K spelled by ``k_sum``."""
        p = k.node
        sz = self.sz
        M, N = sz(p.shape[-2]), sz(p.shape[-1])
        batch = p.shape[:-2]
        em = Emitter()
        prologue = [*self.tile_ids(M, N), f"acc = tl.zeros([BM, BN], {acc_dtype(p.dtype)})"]
        bidx = self.product_index(em, ctx, batch)
        k_sum(em, ["acc"], bidx)
        em.line(tile_mask(M, N))
        self.gemm_epilogue(em, ctx, k, outs, bidx)
        grid = [self.gemm_tiles(p, block) + (f" * ({sz.prod(batch)})" if batch else "")]
        self.emit(k.kind + ("_held" if takes else ""), em, grid, consts, prologue, warps=block.warps, takes=takes)

    def gemm_parts(self, k: Gemm, ctx: Ctx, outs: list[str]) -> None:
        """A two-axis GEMM whose K is summed in parts side by side (``Gemm.k_parts``, a weight gradient's K of
        steps x batch over few tiles): ``nf_k_parts`` splits K at run time into parts of a multiple of
        ``target.split_k_min``, one program per tile and part sums its part into ``k.partials``; a second kernel,
        one program per tile, adds the parts in order (the same sums at every launch) and runs the epilogue."""
        p = k.node
        sz = self.sz
        M, K, N = sz(p.shape[0]), sz(p.srcs[0].shape[-1]), sz(p.shape[1])
        partials = self.alloc(k.partials)
        tag = len(self.names)
        self.run.append(f"{self.ind}chunk{tag}, parts{tag} = nf_k_parts({K}, {k.k_parts}, "
                        f"{self.program.target.split_k_min})")
        acc = acc_dtype(p.dtype)
        block = self.gemm_block(p)
        em = Emitter()
        prologue = [*self.tile_ids(M, N), "lo = pid_b * n0", f"hi = tl.minimum(lo + n0, {K})",
                    f"acc = tl.zeros([BM, BN], {acc})"]
        at = f"{partials} + {{}} * {M} * {N} + ({flat(('rm', 'rn'), [M, N])})"  # a part's tile of the partials
        self.k_loop(em, ctx, p, (), lo="lo", hi="hi")
        em.line(tile_mask(M, N))
        em.line(f"tl.store({at.format('pid_b')}, acc, mask=mo)")
        self.emit("gemm_parts", em, [f"{self.gemm_tiles(p, block)} * parts{tag}"], block.consts(), prologue,
                  extents=[f"chunk{tag}"], warps=block.warps)
        em = Emitter()
        prologue = [*self.tile_ids(M, N), f"acc = tl.zeros([BM, BN], {acc})", tile_mask(M, N)]
        em.open("for part in range(0, n0):")
        em.line(f"acc += tl.load({at.format('part')}, mask=mo, other=0)")
        em.close()
        self.gemm_epilogue(em, ctx, k, outs, ())
        self.emit(f"parts_{k.kind}", em, [self.gemm_tiles(p, block)], {"BM": block.m, "BN": block.n}, prologue,
                  extents=[f"parts{tag}"], warps=block.warps)

    def k_loop(self, em: Emitter, ctx: Ctx, p: Node, bidx: tuple[str, ...] = (), lo: str = "0",
               hi: str | None = None, accs: Sequence[str] = ("acc",), columns: Sequence[str] = ("rn",),
               width: str | None = None) -> None:
        """The sum of matmul ``p`` over K (from ``lo`` to ``hi``) into each of ``accs``, one ``tl.dot`` per
        ``BK``: the tile of A against B's tile at ``columns`` (a sliced product's slices of ``width`` columns;
        by default the program's tile of all ``N``)."""
        a, b = p.srcs
        sz = self.sz
        M, K = sz(p.shape[-2]), sz(a.shape[-1])
        hi = hi or K
        into = open_k_loop(em, lo, hi, self.static(a.shape[-1]), p.dtype, accs)
        em.line("ka = (k0 + tl.arange(0, BK))[None, :]")
        em.line("kb = (k0 + tl.arange(0, BK))[:, None]")
        em.line(f"ma = (rm < {M}) & (ka < {hi})")
        em.line(f"mb = (kb < {hi}) & (rn < {width or sz(p.shape[-1])})")
        va = Eval(em, ctx, sz, "ma", 2).masked(a, (*bidx, "rm", "ka"))
        for acc, cols in zip(into, columns, strict=True):
            vb = Eval(em, ctx, sz, "mb", 2).masked(b, (*bidx, "kb", cols))
            em.line(f"{acc} += {dot(va, vb, p.dtype)}")
        close_k_loop(em, accs, into)

    def gemm_epilogue(self, em: Emitter, ctx: Ctx, k: Gemm, outs: list[str], bidx: tuple[str, ...]) -> None:
        """The epilogue of GEMM ``k`` on its accumulator ``acc`` (rounded to a half-precision product's dtype
        first), stored into ``outs`` where the tile's mask ``mo`` (``tile_mask``) holds."""
        p, root = k.node, k.epilogue
        sz = self.sz
        idx = (*bidx, "rm", "rn")
        value = "acc" if not p.dtype.is_half else em.tmp(rounded("acc", p.dtype), "acc")
        if root is not None:
            value = Eval(em, ctx, sz, "mo", 2, root=root, overrides={(id(p), idx): "acc"}).val(root, idx)
        node = root if root is not None else p
        dims = [sz(d) for d in node.shape]
        for o in outs:
            em.line(f"tl.store({o} + ({flat(idx, dims)}), {value}, mask=mo)")

    def tile_ids(self, rows: str, cols: str) -> list[str]:
        """A GEMM program's tile of a ``rows`` x ``cols`` result, in the order the tiles say (``texpr.tile_ids``)."""
        return tile_ids(rows, cols, self.tiles.gemm_group)

    def gemm_block(self, p: Node, width: object = None, copies: Sequence[object] = ()) -> GemmBlock:
        """The block of a GEMM program of matmul ``p`` (``Tiles.gemm_block``, from its sizes where fixed when the
        program is built): of a sliced product where ``width`` (its slice width) is given, of ``copies`` (batch
        dims) products at once."""
        count = 1
        for d in copies:
            size = self.static(d)
            count = None if size is None or count is None else count * size
        return self.tiles.gemm_block(self.static(p.shape[-2]), self.static(p.shape[-1] if width is None else width),
                                     self.static(p.srcs[0].shape[-1]), p.dtype.is_half, sliced=width is not None,
                                     copies=count)

    def gemm_tiles(self, p: Node, block: GemmBlock, cols: str | None = None) -> str:
        """The number of ``block`` tiles of matmul ``p``'s result (per batch index; over ``cols`` columns where
        given, a sliced product's slice width), printed."""
        cols = cols or self.sz(p.shape[-1])
        return f"triton.cdiv({self.sz(p.shape[-2])}, {block.m}) * triton.cdiv({cols}, {block.n})"

    def sliced(self, k: SlicedGemm, ctx: Ctx, outs: Sequence[Sequence[str]], product: Sequence[str] = ()) -> None:
        """A GEMM read only through column slices (an RNN's gates): one program per tile of rows and of the
        slice width, one ``tl.dot`` accumulator per slice, the GEMM's epilogue on each, then the member kernels
        (the cell update) on the tiles, stored into ``outs`` (one list per member). The product (or the epilogue's
        value, ``k.returns_root``) is stored only into ``product`` (where the graph returns it): a recurrent step
        is this one kernel. In a resident loop whose weights fit (``held_weights``) it is also spelled with its
        tile of the weights loaded once before the steps and held (``Stage.held``)."""
        sg = k.group
        p = sg.gemm
        if p.ndim != 2 or any(m.ndim != 2 for m in sg.members):
            raise Unsupported(f"a sliced GEMM at {p.loc} on more than two axes is not rendered")
        W = self.sz(sg.width)
        block = self.gemm_block(p, width=sg.width)
        columns = [sliced("rn", str(off)) for off in sg.offsets]

        def spell(consts: dict[str, int], k_sum: KSum, takes: Sequence[str] = ()) -> None:
            self.sliced_kernel(k, ctx, outs, product, block, consts, k_sum, takes)

        spell(block.consts(), lambda em, accs, _: self.k_loop(em, ctx, p, accs=accs, columns=columns, width=W))
        self.hold(p, k.b_resident, block, columns, W, ctx, spell)

    def hold(self, p: Node, b_resident: bool, block: GemmBlock, columns: Sequence[str], width: str, ctx: Ctx,
             spell: Callable[[dict[str, int], KSum, Sequence[str]], None]) -> None:
        """In a resident loop, where the weights of matmul ``p`` can be held (``held_weights``), also spell the
        stage just noted for it with a program's tile of them held across steps: a function loading the tile (B
        at ``columns``, each ``width`` wide, in chunks of K) and ``spell(consts, k_sum, takes)``, the stage's
        kernel with its sum over K taking them (``k_held``); the stage then carries both (``Stage.held``)."""
        if self.stages is None:
            return
        chunks, rows = self.held_weights(p, b_resident, block, len(columns))
        if not chunks:
            return
        held = block.consts() | {"BK": rows}
        em = Emitter()
        names = []
        for cols in columns:
            for c in range(chunks):
                em.line(f"kb = ({c} * BK + tl.arange(0, BK))[:, None]")
                em.line(f"mb = (kb < {self.sz(p.srcs[0].shape[-1])}) & (rn < {width})")
                names.append(em.tmp(Eval(em, ctx, self.sz, "mb", 2).masked(p.srcs[1], ("kb", cols)), "w"))
        em.line(f"return ({', '.join(names)},)")
        M = self.sz(p.shape[-2])
        self.emit("weights", em, [self.gemm_tiles(p, block, width)], held, self.tile_ids(M, width), warps=block.warps)
        spell(held, lambda em, accs, _: self.k_held(em, ctx, p, accs, chunks), ("wts",))
        normal, loader, stage = self.stages[-3:]
        self.stages[-3:] = [dataclasses.replace(normal, held=(loader, stage))]

    def held_weights(self, p: Node, b_resident: bool, block: GemmBlock, slices: int) -> tuple[int, int]:
        """(chunks, rows of each) of matmul ``p``'s weights a resident loop's step holds across steps, or (0, 0)
        where it reads them every step: its weights (B) must not change across steps (``b_resident``), its K be
        fixed and at most ``DOT_PROMOTE_K`` (one sum), and a program's tile of them (K in chunks of
        ``Tiles.held_k`` rows, or of K rounded up to a power of two where shorter; ``block.n`` columns for each
        of ``slices``) fit ``HELD_BYTES``."""
        K = self.static(p.srcs[0].shape[-1])
        if not b_resident or K is None or K > DOT_PROMOTE_K:
            return 0, 0
        rows = min(self.tiles.held_k, max(16, 1 << (K - 1).bit_length()))
        chunks = -(-K // rows)
        size = chunks * rows * block.n * slices * p.dtype.itemsize
        return (chunks, rows) if size <= HELD_BYTES else (0, 0)

    def k_held(self, em: Emitter, ctx: Ctx, p: Node, accs: Sequence[str], chunks: int) -> None:
        """The sum over K of matmul ``p`` into ``accs`` (one a column slice) with its weights held in ``wts``
        (``chunks`` chunks a slice, in slice order, as its weights function returns them): a ``tl.dot`` per chunk
        and slice."""
        a = p.srcs[0]
        K = self.sz(a.shape[-1])
        em.open(f"for c in tl.static_range({chunks}):")  # unrolled: ``wts`` is indexed by a constant
        em.line("ka = (c * BK + tl.arange(0, BK))[None, :]")
        em.line(f"ma = (rm < {self.sz(p.shape[0])}) & (ka < {K})")
        va = Eval(em, ctx, self.sz, "ma", 2).masked(a, ("rm", "ka"))
        for g, acc in enumerate(accs):
            em.line(f"{acc} += {dot(va, f'wts[{g * chunks} + c]', p.dtype)}")
        em.close()

    def sliced_kernel(self, k: SlicedGemm, ctx: Ctx, outs: Sequence[Sequence[str]], product: Sequence[str],
                      block: GemmBlock, consts: dict[str, int], k_sum: KSum, takes: Sequence[str] = ()) -> None:
        """``sliced``'s kernel with its sum over K spelled by ``k_sum``."""
        sg = k.group
        p, root = sg.gemm, sg.root
        sz = self.sz
        M, W = sz(p.shape[0]), sz(sg.width)
        em = Emitter()
        accs = [f"acc{g}" for g in range(len(sg.offsets))]
        prologue = [*self.tile_ids(M, W), *(f"{acc} = tl.zeros([BM, BN], {acc_dtype(p.dtype)})" for acc in accs)]
        k_sum(em, accs, ())
        em.line(tile_mask(M, W))
        tiles: dict[tuple[int, tuple[str, ...]], str] = {}
        for g, off in enumerate(sg.offsets):
            idx = ("rm", sliced("rn", str(off)))
            product_value = f"acc{g}" if not p.dtype.is_half else em.tmp(rounded(f"acc{g}", p.dtype), "acc")
            value = product_value
            if root is not p:
                value = Eval(em, ctx, sz, "mo", 2, root=root, overrides={(id(p), idx): value}).val(root, idx)
            for o in product:
                stored = value if k.returns_root else product_value
                em.line(f"tl.store({o} + ({flat(idx, [sz(d) for d in p.shape])}), {stored}, mask=mo)")
            tiles[(id(root), idx)] = value
        ev = Eval(em, ctx, sz, "mo", 2, overrides=tiles)
        for m, dests in zip(sg.members, outs):
            ev.root = m
            v = ev.val(m, ("rm", "rn"))
            for o in dests:
                em.line(f"tl.store({o} + ({flat(('rm', 'rn'), [M, W])}), {v}, mask=mo)")
        self.emit(k.kind + ("_held" if takes else ""), em, [self.gemm_tiles(p, block, W)], consts, prologue,
                  warps=block.warps, takes=takes)

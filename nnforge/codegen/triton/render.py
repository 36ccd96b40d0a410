"""Rendering a scheduled ``Program`` as one Python module of Triton kernels and the launcher that runs them.

The renderer walks the program's records in order and spells each: an ``Elementwise`` or ``Copy`` kernel is a
blocked loop over the flat output index (masked for the partial last block), a ``Reduce`` a tile of outputs by
reduced elements, a ``Gemm`` ``tl.dot`` over K blocks with its epilogue on the accumulator, a ``Concat`` one
kernel storing each source into its range, and a row-split ``Loop`` one persistent kernel (``scan.py``). The
generated ``run(ins, data, outs, S, dev)`` allocates the program's scratch buffers, computes each grid from the
run-time sizes ``S`` and launches the kernels in order: no Python runs per time step.

What the renderer decides itself (no record holds it yet): the block sizes (``target.Tiles``), float32 dots in
IEEE precision (not TF32: results must match the float32 reference), and that scratch is allocated per call.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from ...dtypes import DType
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
    Reduce,
    ScatterAdd,
    SlicedGemm,
    Unsupported,
    stored_node,
)
from .evaluate import Ctx, Emitter, Eval
from .target import Tiles
from .texpr import PRELUDE, TORCH_DTYPE, Sizes, flat, tl_dtype

_NAME = re.compile(r"[A-Za-z_]\w*")


@dataclass
class Rendered:
    """The module source, the names of its kernels (in launch order) and the records they render."""

    source: str
    kernels: list[str] = field(default_factory=list)


def dot(a: str, b: str, dt: DType) -> str:
    """``tl.dot`` accumulating in ``dt``'s accumulator type; float32 in IEEE precision (TF32 would miss float32
    tolerances)."""
    if dt == DType.float32:
        return f"tl.dot({a}, {b}, input_precision=\"ieee\")"
    if dt == DType.float64:
        return f"tl.dot({a}, {b}, out_dtype=tl.float64)"
    raise Unsupported(f"no Triton GEMM on {dt.value} yet")


class Renderer:
    """Renders one ``Program`` (see the module docstring)."""

    def __init__(self, program: Program, sizes: Sizes, tiles: Tiles | None = None):
        self.program = program
        self.graph = program.graph
        self.sz = sizes
        self.tiles = tiles or Tiles()
        self.kernels: list[str] = []
        self.names: list[str] = []
        self.run: list[str] = []
        self.buffers: list[str] = []  # every buffer name of the program, in the order kernels take them

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
        head = ["def run(ins, data, outs, S, dev):",
                '    """Launch the kernels in order on tensors of device ``dev``."""',
                f"    ({', '.join(ins)}{',' if ins else ''}) = ins",
                f"    ({', '.join(f'd{k}' for k in range(len(data)))}{',' if data else ''}) = data",
                f"    ({', '.join(outs)}{',' if outs else ''}) = outs",
                f"    ({syms}{',' if syms else ''}) = S"]
        source = "\n".join(["import torch", "import triton", "import triton.language as tl", "", "", PRELUDE, "",
                            *("\n\n" + k for k in self.kernels), "", "", *head, *self.run, "    return None", ""])
        return Rendered(source, list(self.names))

    def block(self, block: Block, ctx: Ctx) -> None:
        """The kernels of the top-level block in order, then its copies into the results."""
        chunked = {id(stored_node(c.gemm)) for k in block.kernels if isinstance(k, Loop)
                   for c in k.chunked}
        for k in block.kernels:
            if isinstance(k, Loop):
                from .scan import render_loop

                for c in k.chunked:
                    self.alloc(c.gemm.out)
                results = [self.place(b) for b in k.results]
                render_loop(self, k, ctx, results)
                projs = {m.attrs["index"]: m for m in ctx.graph.order if m.op == Op.PROJ and m.srcs[0] is k.node}
                for i, m in projs.items():
                    ctx.buffers[id(m)] = results[i]
                continue
            if id(stored_node(k)) in chunked:
                continue
            if isinstance(k, SlicedGemm):
                raise Unsupported("a sliced GEMM outside a row-split loop (its column tiles at top level) is not "
                                  "rendered by this slice")
            out = self.place(k.out)
            self.kernel(k, ctx, [out, *(f"out{i}" for i in k.also)])
            ctx.buffers[id(stored_node(k))] = out
        for c in block.copies:
            self.elementwise(c, ctx, [self.place(c.out)])

    def place(self, buf: Buf) -> str:
        """A buffer's name: a result of the program, or scratch allocated by ``run`` (per call)."""
        if buf.output is not None:
            return f"out{buf.output}"
        return self.alloc(buf)

    def alloc(self, buf: Buf) -> str:
        shape = ", ".join(self.sz(d) for d in buf.shape)
        self.run.append(f"    {buf.name} = torch.empty(({shape}{',' if len(buf.shape) == 1 else ''}), "
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
            raise Unsupported("scatter_add is not rendered by this slice of the Triton backend")
        elif isinstance(k, Elementwise | Copy):
            self.elementwise(k, ctx, outs)
        else:
            raise Unsupported(f"no Triton form of kernel {type(k).__name__}")

    def emit(self, kind: str, em: Emitter, grid: Sequence[str], consts: dict[str, int],
             prologue: Sequence[str] = ()) -> str:
        """Add one ``@triton.jit`` kernel named after what it fuses and its launch; returns the name. Its
        arguments are the buffers its code names, then every run-time size (never specialized on: a new
        sequence length reuses the compiled kernel), then the block sizes."""
        name = f"k{len(self.names)}_{kind.replace('+', '_')}"
        body = [*prologue, *em.pre, *em.code]
        used = {tok for line in body for tok in _NAME.findall(line)}
        bufs = [b for b in dict.fromkeys(self.buffers) if b in used]
        syms = [f"S{k}" for k in range(len(self.sz.dynamic))]
        params = [*bufs, *syms, *(f"{c}: tl.constexpr" for c in consts)]
        nospec = f"(do_not_specialize={syms!r})" if syms else ""
        text = [f"@triton.jit{nospec}", f"def {name}({', '.join(params)}):", *("    " + line for line in body)]
        self.kernels.append("\n".join(text))
        self.names.append(name)
        meta = "".join(f", {c}={v}" for c, v in consts.items())
        self.run.append(f"    nf_launch({name}, ({', '.join(grid)},), {', '.join([*bufs, *syms])}{meta})")
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
        n = k.node
        em = Emitter()
        numel = self.sz.prod(n.shape)
        prologue = ["pid = tl.program_id(0).to(tl.int64)", "offs = pid * BLOCK + tl.arange(0, BLOCK)",
                    f"m = offs < {numel}"]
        idx, dims = self.flat_index(em, n.shape)
        ev = Eval(em, ctx, self.sz, "m", 1, root=None if isinstance(k, Copy) else n, flat_hint={(idx, dims): "offs"})
        v = ev.val(n, idx)
        for o in outs:
            em.line(f"tl.store({o} + offs, {v}, mask=m)")
        kind = "copy" if isinstance(k, Copy) else k.kind
        self.emit(kind, em, [f"triton.cdiv({numel}, {self.tiles.flat})"], {"BLOCK": self.tiles.flat}, prologue)

    def concat(self, k: Concat, ctx: Ctx, outs: list[str]) -> None:
        """Each source of the concat into its range along the axis: one kernel, a masked block of every part."""
        n = k.node
        axis = n.attrs["axis"]
        em = Emitter()
        prologue = ["pid = tl.program_id(0).to(tl.int64)", "offs = pid * BLOCK + tl.arange(0, BLOCK)"]
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
        self.emit(k.kind, em, [f"triton.cdiv({biggest}, {self.tiles.flat})"], {"BLOCK": self.tiles.flat}, prologue)

    # ---- reductions ---------------------------------------------------------------------------------------
    def reduce(self, k: Reduce, ctx: Ctx, outs: list[str]) -> None:
        """Outputs by reduced elements, ``BO`` x ``BR`` at a time, accumulated element-wise and reduced at the
        end; the epilogue on each result. ``k.leading`` puts the outputs on the tile's inner (contiguous) axis."""
        p, root = k.node, k.epilogue
        src = p.srcs[0]
        axes = tuple(p.attrs["axes"])
        if p.dtype == DType.bool or not (p.dtype.is_float or p.dtype.is_int):
            raise Unsupported(f"no Triton reduction on {p.dtype.value}")
        acc_t = tl_dtype(p.dtype)
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
        shape = "[BR, BO]" if lead else "[BO, BR]"
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
        v = Eval(em, ctx, sz, "mt", 2).val(src, full)
        if is_sum:
            em.line(f"acc = acc + tl.where(mt, {v}, 0).to({acc_t})")
        else:
            nan = f" | ({v} != {v})" if p.dtype.is_float else ""
            em.line(f"acc = tl.where(mt & (({v} > acc){nan}), {v}, acc)")
        em.close()
        if is_sum:
            em.line(f"res = tl.sum(acc, axis={axis})")
        elif p.dtype.is_float:
            em.line(f"res = tl.where(tl.max((acc != acc).to(tl.int32), axis={axis}) > 0, float(\"nan\"), "
                    f"tl.max(acc, axis={axis}))")
        else:
            em.line(f"res = tl.max(acc, axis={axis})")
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
    def gemm(self, k: Gemm, ctx: Ctx, outs: list[str]) -> None:
        """``tl.dot`` over K blocks into a ``BM`` x ``BN`` accumulator (one program per output tile and batch
        index), then the epilogue on the accumulator and the stores."""
        p, root = k.node, k.epilogue
        if k.pack_a or k.k_split:
            raise Unsupported("a GEMM scheduled with packed A or a K split (CPU forms) has no Triton spelling")
        a, b = p.srcs
        sz = self.sz
        M, K, N = sz(p.shape[-2]), sz(a.shape[-1]), sz(p.shape[-1])
        batch = p.shape[:-2]
        em = Emitter()
        prologue = ["pid_m = tl.program_id(0).to(tl.int64)", "pid_n = tl.program_id(1).to(tl.int64)",
                    "rm = (pid_m * BM + tl.arange(0, BM))[:, None]", "rn = (pid_n * BN + tl.arange(0, BN))[None, :]",
                    f"acc = tl.zeros([BM, BN], {_acc(p.dtype)})"]
        bidx: tuple[str, ...] = ()
        if batch:
            prologue.append("pid_b = tl.program_id(2).to(tl.int64)")
            bidx = Eval(em, ctx, sz, None, 2, hoist=False).unflatten("pid_b", [sz(d) for d in batch])
        em.open(f"for k0 in range(0, {K}, BK):")
        em.line("ka = (k0 + tl.arange(0, BK))[None, :]")
        em.line("kb = (k0 + tl.arange(0, BK))[:, None]")
        em.line(f"ma = (rm < {M}) & (ka < {K})")
        em.line(f"mb = (kb < {K}) & (rn < {N})")
        va = Eval(em, ctx, sz, "ma", 2).val(a, (*bidx, "rm", "ka"))
        vb = Eval(em, ctx, sz, "mb", 2).val(b, (*bidx, "kb", "rn"))
        em.line(f"acc += {dot(f'tl.where(ma, {va}, 0)', f'tl.where(mb, {vb}, 0)', p.dtype)}")
        em.close()
        em.line(f"mo = (rm < {M}) & (rn < {N})")
        idx = (*bidx, "rm", "rn")
        value = "acc"
        if root is not None:
            value = Eval(em, ctx, sz, "mo", 2, root=root, overrides={(id(p), idx): "acc"}).val(root, idx)
        node = root if root is not None else p
        dims = [sz(d) for d in node.shape]
        for o in outs:
            em.line(f"tl.store({o} + ({flat(idx, dims)}), {value}, mask=mo)")
        t = self.tiles
        grid = [f"triton.cdiv({M}, {t.gemm_m})", f"triton.cdiv({N}, {t.gemm_n})"]
        if batch:
            grid.append(sz.prod(batch))
        self.emit(k.kind, em, grid, {"BM": t.gemm_m, "BN": t.gemm_n, "BK": t.gemm_k}, prologue)


def _acc(dt: DType) -> str:
    """The accumulator type of a product in ``dt``."""
    if dt == DType.float32:
        return "tl.float32"
    if dt == DType.float64:
        return "tl.float64"
    raise Unsupported(f"no Triton GEMM on {dt.value} yet")

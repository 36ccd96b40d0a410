"""Fused bodies as Triton statements: a node evaluated at an index, views turned into index arithmetic.

An index is a tuple of Triton expressions, one per axis of the node read (tensors of the kernel's block shape,
or scalars). Reading a node either loads its buffer (``Ctx.buffer``), takes a register value a persistent kernel
holds (``Ctx.reg``), asks the enclosing graph (``Ctx.leaf``: a loop body's inputs), or computes it from its
sources: movement ops map the index (permute, expand, slice, reshape) or select (pad, concat, gather), and
elementwise ops apply their formula (``texpr.formula``). Each value is one SSA temporary, computed once per
index and mask.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ...dtypes import DType
from ...ir.node import Graph, Node
from ...ir.ops import ELEMENTWISE, Op
from ...passes.fuse import Grouping
from ...schedule import Unsupported
from .texpr import Sizes, flat, formula, literal, sliced, tl_dtype

_TOKEN = re.compile(r"[A-Za-z_]\w*")
_SCALAR = re.compile(r"S\d+|t\d+")  # run-time sizes and host loop counters: the same in every lane
_LANEWISE = frozenset({"minimum", "maximum", "to", "int64", "int32"})  # Triton that keeps a scalar a scalar


def _defines(line: str, made: set[str]) -> tuple[str | None, str]:
    """The temporary ``line`` assigns (``name = expr``, where name is one of ``made``; else None) and what the
    line reads."""
    head, eq, rest = line.strip().partition(" = ")
    return (head, rest) if eq and head in made else (None, line)


class Emitter:
    """The statements of one kernel. ``code`` holds the kernel's statements in order (indented as the loops
    opened with ``open`` nest them). With ``hoist`` (a persistent kernel), a temporary whose expression names no
    loop-variant name (``variant``: the step counters, the carries and everything computed from them) goes to
    ``pre``, which runs once before the time loop: the step's invariant loads (a bias, a weight tile) are not
    repeated every step. Equal hoisted expressions share one temporary."""

    def __init__(self, hoist: bool = False):
        self.hoist = hoist
        self.pre: list[str] = []
        self.code: list[str] = []
        self.ind = ""
        self.variant: set[str] = set()
        self.scalars: set[str] = set()  # the kernel's own scalar names (its step counters): the same in every lane
        self.counter = 0
        self.made: list[str] = []  # every temporary's name, in the order made (``finished`` drops and renumbers them)
        self.loaded_under: dict[str, str] = {}  # a load's temporary -> the block mask it was loaded under (0 off it)
        self._pre_names: dict[str, str] = {}

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        self.made.append(f"{prefix}{self.counter}")
        return self.made[-1]

    def finished(self, lines: list[str]) -> list[str]:
        """``lines`` without the temporaries nothing reads (an index computed for an access that did not need
        it), the others numbered in order of first use from 1: kernels that differ only in the temporaries made
        on the way read the same, and are one kernel. Names are left as they are where a new one would be a name
        the lines already use otherwise."""
        made = set(self.made)
        while True:
            parts = [_defines(line, made) for line in lines]
            reads = {tok for _, read in parts for tok in _TOKEN.findall(read)}
            dead = {name for name, _ in parts if name is not None and name not in reads}
            if not dead:
                break
            lines = [line for line, (name, _) in zip(lines, parts) if name not in dead]
        used = list(dict.fromkeys(tok for line in lines for tok in _TOKEN.findall(line)))
        mapping = {tok: f"{tok.rstrip('0123456789')}{k}" for k, tok in enumerate((t for t in used if t in made), 1)}
        if not set(mapping.values()).isdisjoint(set(used) - made):
            return lines
        return [_TOKEN.sub(lambda m: mapping.get(m.group(0), m.group(0)), line) for line in lines]

    def is_variant(self, expr: str) -> bool:
        return any(tok in self.variant for tok in _TOKEN.findall(expr))

    def tmp(self, expr: str, prefix: str = "v", hoist: bool = True) -> str:
        """A temporary holding ``expr``; before the loop when it may be (see the class)."""
        if self.hoist and hoist and not self.is_variant(expr):
            if expr in self._pre_names:
                return self._pre_names[expr]
            name = self.fresh(prefix)
            self.pre.append(f"{name} = {expr}")
            self._pre_names[expr] = name
            return name
        name = self.fresh(prefix)
        self.line(f"{name} = {expr}")
        self.variant.add(name)
        return name

    def line(self, text: str) -> None:
        self.code.append(self.ind + text)

    def open(self, header: str) -> None:
        self.line(header)
        self.ind += "    "

    def close(self) -> None:
        self.ind = self.ind[:-4]


@dataclass
class Ctx:
    """How the nodes of one graph are read inside a kernel: ``buffers`` (id -> buffer name; a reshape that is an
    alias reads its source's buffer with its own shape), ``reg`` (id -> (register value, its index)), ``leaf``
    (id -> a function of (evaluator, index) giving the value: a body input read from the enclosing graph),
    ``ranges`` (id -> {index of a column range: register value}: a value held one tile per range)."""

    graph: Graph
    grouping: Grouping
    buffers: dict[int, str] = field(default_factory=dict)
    reg: dict[int, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    leaf: dict[int, Callable[[Eval, tuple[str, ...]], str]] = field(default_factory=dict)
    ranges: dict[int, dict[tuple[str, ...], str]] = field(default_factory=dict)

    def bind_results(self, loop: Node, results: Sequence[str]) -> None:
        """Later kernels read a loop's results (its ``PROJ`` nodes) from the buffers it wrote."""
        for m in self.graph.order:
            if m.op == Op.PROJ and m.srcs[0] is loop:
                self.buffers[id(m)] = results[m.attrs["index"]]

    def buffer(self, n: Node) -> str | None:
        if id(n) in self.buffers:
            return self.buffers[id(n)]
        if id(n) in self.grouping.alias:
            return self.buffer(n.srcs[0])
        return None


class Eval:
    """Evaluates nodes of ``ctx``'s graph at indices, under ``mask`` (the elements the kernel computes: loads
    outside it read nothing). ``rank``: the rank of the kernel's block (constants are tensors of that rank);
    ``root``: the kernel's own node (computed, never loaded); ``overrides``: values already computed at an index
    (a GEMM's accumulator, a sliced GEMM's epilogue on each gate tile); ``flat_hint``: (index, shape) pairs whose
    row-major offset is a name the kernel already has (its flat ``offs``); ``hoist``: whether values may move
    before the time loop; ``wide``: half-precision values are float32 tensors here, loaded and computed wide and
    rounded only where they are stored (a persistent scan's step: its carries, the cell state above all, do not
    lose bits every step)."""

    def __init__(self, em: Emitter, ctx: Ctx, sizes: Sizes, mask: str | None, rank: int, root: Node | None = None,
                 overrides: dict[tuple[int, tuple[str, ...]], str] | None = None,
                 flat_hint: dict[tuple, str] | None = None, hoist: bool = True, wide: bool = False):
        self.em, self.ctx, self.sz = em, ctx, sizes
        self.mask, self.rank, self.root = mask, rank, root
        self.wide = wide
        self.overrides = dict(overrides or {})
        self.flat_hint = flat_hint or {}
        self.hoist = hoist
        self.memo: dict[tuple[int, tuple[str, ...]], str] = {}
        self.fused: list[str] = []

    def tmp(self, expr: str, prefix: str = "v") -> str:
        name = self.em.tmp(expr, prefix, self.hoist)
        if prefix == "i" and self.lane_free(expr):
            self.em.scalars.add(name)  # an index of a scalar index (a pad's shift, a clamp): a load at it is scalar
        return name

    def lane_free(self, expr: str) -> bool:
        """Whether integer expression ``expr`` has one value in every lane: each name it reads is a scalar, and
        the Triton it calls only clamps and converts (``tl.arange`` and the like make blocks)."""
        for m in _TOKEN.finditer(expr):
            name = m.group(0)
            if expr[m.start() - 1:m.start()] == ".":
                if name not in _LANEWISE:
                    return False
            elif name != "tl" and not (_SCALAR.fullmatch(name) or name in self.em.scalars):
                return False
        return True

    def val(self, n: Node, idx: Sequence[str]) -> str:
        idx = tuple(idx)
        key = (id(n), idx)
        if key in self.overrides:
            return self.overrides[key]
        if key not in self.memo:
            self.memo[key] = self._val(n, idx)
        return self.memo[key]

    def load(self, ptr: str, n: Node, idx: tuple[str, ...]) -> str:
        shape = tuple(self.sz(d) for d in n.shape)
        offset = self.flat_hint.get((idx, shape)) or flat(idx, shape)
        scalar = self.lane_free(offset)
        # a scalar offset (a 0-d value, a broadcast element, a step's row) is in range whenever the kernel runs,
        # and Triton takes no block mask for a scalar pointer
        mask = f", mask={self.mask}, other=0" if self.mask and not scalar else ""
        widen = ".to(tl.float32)" if self.wide and n.dtype.is_half else ""
        name = self.tmp(f"tl.load({ptr} + ({offset}){mask}){widen}", "x")
        if self.mask and mask:
            self.em.loaded_under[name] = self.mask
        return name

    def masked(self, n: Node, idx: Sequence[str]) -> str:
        """``n`` at ``idx``, 0 where the block mask is off: a value loaded under the mask already is (a tensor-core
        operand then goes from its pipelined copy in shared memory to the MMA untouched); anything computed
        from such loads may not be (exp(0), 0 / 0), so it is selected."""
        v = self.val(n, idx)
        return v if self.em.loaded_under.get(v) == self.mask else self.tmp(f"tl.where({self.mask}, {v}, 0)")

    def const(self, value: object, n: Node) -> str:
        shape = ", ".join(["1"] * max(self.rank, 1))
        dt = "tl.float32" if self.wide and n.dtype.is_half else tl_dtype(n.dtype)
        if not self.sz.is_static(value):  # a size used as a value (x.shape[0]) may be a run-time trip count
            return self.tmp(f"tl.full([{shape}], 0, {dt}) + ({self.sz(value)})", "k")
        return self.tmp(f"tl.full([{shape}], {literal(value, n.dtype)}, {dt})", "k")

    def _val(self, n: Node, idx: tuple[str, ...]) -> str:
        ctx = self.ctx
        if n is not self.root:
            if id(n) in ctx.reg:
                return self._reg(n, idx)
            if id(n) in ctx.ranges:
                if idx not in ctx.ranges[id(n)]:
                    raise Unsupported(f"{n.op.name.lower()} at {n.loc} is held one tile per column range and "
                                      f"read at {list(idx)}, no range of it")
                return ctx.ranges[id(n)][idx]
            if id(n) in ctx.leaf:
                return ctx.leaf[id(n)](self, idx)
            ptr = ctx.buffer(n)
            if ptr is not None:
                return self.load(ptr, n, idx)
        if n.op == Op.CONST:
            return self.const(n.attrs["value"], n)
        if n.op in (Op.PERMUTE, Op.EXPAND, Op.SLICE, Op.RESHAPE):
            return self.val(n.srcs[0], self.index_map(n, idx))
        if n.op == Op.PAD:
            return self._pad(n, idx)
        if n.op == Op.CONCAT:
            return self._concat(n, idx)
        if n.op == Op.GATHER:
            return self._gather(n, idx)
        if n.op in ELEMENTWISE:
            tl_dtype(n.dtype)
            args = [self.val(s, idx) for s in n.srcs]
            self.fused.append(n.op.name.lower())
            if not self.wide:
                return self.tmp(formula(n.op, n.dtype, [s.dtype for s in n.srcs], args, n.attrs))
            srcs = [DType.float32 if s.dtype.is_half else s.dtype for s in n.srcs]
            if not n.dtype.is_half:
                return self.tmp(formula(n.op, n.dtype, srcs, args, n.attrs))
            if n.op == Op.CAST:  # a cast to half precision the program asks for: rounded there, held wide
                return self.tmp(f"({formula(n.op, n.dtype, srcs, args, n.attrs)}).to(tl.float32)")
            return self.tmp(formula(n.op, DType.float32, srcs, args, n.attrs))
        raise Unsupported(f"the Triton renderer cannot inline {n.op.name.lower()} (created at {n.loc})")

    def _reg(self, n: Node, idx: tuple[str, ...]) -> str:
        """A value a persistent kernel holds in registers, at its own index (or, for a value with one element
        per row, any index of the same row: it broadcasts along the columns)."""
        name, own = self.ctx.reg[id(n)]
        if idx == own or (idx[:1] == own[:1] and all(int(d) == 1 for d in n.shape[1:])):
            return name
        raise Unsupported(f"{n.op.name.lower()} at {n.loc} is held in registers and read through a view "
                          f"(index {list(idx)}); this slice reads step values only element by element")

    def index_map(self, n: Node, idx: tuple[str, ...]) -> tuple[str, ...]:
        """The index into ``n.srcs[0]`` that index ``idx`` of movement node ``n`` reads."""
        src, sz = n.srcs[0], self.sz
        if n.op == Op.PERMUTE:
            out = ["0"] * len(idx)
            for i, p in enumerate(n.attrs["perm"]):
                out[p] = idx[i]
            return tuple(out)
        if n.op == Op.EXPAND:
            return tuple("0" if int(s) == 1 and int(d) != 1 else i for i, s, d in zip(idx, src.shape, n.shape))
        if n.op == Op.SLICE:
            return tuple(sliced(i, sz(a), s) for i, a, s in zip(idx, n.attrs["starts"], n.attrs["steps"]))
        # reshape: one that only adds or drops size-1 axes keeps the other indices; any other regroups the
        # row-major offset
        a = [k for k, d in enumerate(n.shape) if int(d) != 1]
        b = [k for k, d in enumerate(src.shape) if int(d) != 1]
        if [int(n.shape[k]) for k in a] == [int(src.shape[k]) for k in b] and all(
                sz.is_static(n.shape[k]) == sz.is_static(src.shape[j]) for k, j in zip(a, b)):
            out = ["0"] * src.ndim
            for k, j in zip(a, b):
                out[j] = idx[k]
            return tuple(out)
        lin = self.tmp(flat(idx, [sz(d) for d in n.shape]) or "0", "o")
        return self.unflatten(lin, [sz(d) for d in src.shape])

    def unflatten(self, lin: str, shape: Sequence[str]) -> tuple[str, ...]:
        """The multi-index of row-major offset ``lin`` in ``shape``."""
        out: list[str] = []
        stride = "1"
        for k in range(len(shape) - 1, -1, -1):
            q = lin if stride == "1" else f"({lin}) // ({stride})"
            out.append(q if k == 0 else f"({q}) % ({shape[k]})")
            stride = shape[k] if stride == "1" else f"{stride} * {shape[k]}"
        return tuple(self.tmp(e, "i") if e != lin else e for e in reversed(out))

    def _pad(self, n: Node, idx: tuple[str, ...]) -> str:
        sz = self.sz
        src = n.srcs[0]
        conds, inner = [], []
        for i, (lo, hi), d in zip(idx, n.attrs["pads"], src.shape):
            if int(d) == 0:
                return self.const(n.attrs["value"], n)
            if int(lo) == 0 and int(hi) == 0:
                inner.append(i)
                continue
            j = self.tmp(f"({i}) - {sz(lo)}", "i")
            conds.append(f"({j} >= 0) & ({j} < {sz(d)})")
            inner.append(self.tmp(f"tl.minimum(tl.maximum({j}, 0), {sz(d)} - 1)", "i"))
        v = self.val(src, inner)
        if not conds:
            return v
        fill = self.const(n.attrs["value"], n)
        return self.tmp(f"tl.where({' & '.join(conds)}, {v}, {fill})")

    def _concat(self, n: Node, idx: tuple[str, ...]) -> str:
        sz = self.sz
        axis = n.attrs["axis"]
        parts: list[tuple[str, str]] = []
        start = "0"
        for s in n.srcs:
            if int(s.shape[axis]) == 0:
                continue
            d = sz(s.shape[axis])
            j = idx[axis] if start == "0" else f"({idx[axis]}) - ({start})"
            clamped = self.tmp(f"tl.minimum(tl.maximum({j}, 0), {d} - 1)", "i")
            v = self.val(s, (*idx[:axis], clamped, *idx[axis + 1:]))
            end = d if start == "0" else f"{start} + {d}"
            parts.append((f"({idx[axis]}) < ({end})", v))
            start = end
        expr = parts[-1][1]
        for cond, v in reversed(parts[:-1]):
            expr = f"tl.where({cond}, {v}, {expr})"
        return self.tmp(expr)

    def _gather(self, n: Node, idx: tuple[str, ...]) -> str:
        """A load at a computed index; an index out of range reads NaN (0 for integers), as the C backend does."""
        x, index = n.srcs
        axis = n.attrs["axis"]
        self.fused.append("gather")
        j, d = self.val(index, idx), self.sz(x.shape[axis])
        ok = self.tmp(f"({j} >= 0) & ({j} < {d})", "g")
        clamped = self.tmp(f"tl.minimum(tl.maximum({j}, 0), {d} - 1).to(tl.int64)", "i")
        v = self.val(x, (*idx[:axis], clamped, *idx[axis + 1:]))
        bad = self.const(float("nan") if n.dtype.is_float else 0, n)
        return self.tmp(f"tl.where({ok}, {v}, {bad})")

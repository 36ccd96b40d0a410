"""Which top-level steps of a program compute the same thing on different buffers: a structural key per step.

Why: the layers of a stack (and the forward and backward passes of repeated blocks) are the same kernels and
loops on other buffers. A backend that emits each step as a function of its own (the C renderer's parts) emits
one per distinct key and calls it with each step's buffers, the way a kernel cache reuses one kernel for
same-shaped work; the compiler then sees each distinct layer once.

A key is built from the step's records and the IR they evaluate, with every buffer replaced by the order in which
the step first names it (so a step reading one buffer twice differs from one reading two): sizes (run-time
symbols included), dtypes, ops and their attributes, fused bodies, loop bodies and every recorded decision take
part; buffer names and node identities do not. A *step* is what ``memory.lifetimes`` calls one: a kernel or loop of
the block, in order, then the block's copies into its results as one more.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

from ..dtypes import DType
from ..ir.dims import Dim, fold, free_symbols
from ..ir.expr import Expr, const
from ..ir.index import reshape_blocks, strided
from ..ir.lengths import loop_length_symbols
from ..ir.node import Graph, Node
from ..ir.ops import Op
from ..passes.fuse import STRIDED, SlicedGroup
from ..passes.rows import ROWS, RowSplit
from .memory import _written
from .program import Block, Buf, ChunkedInput, Copy, Kernel, Loop, Program, SlicedGemm, stored_node

Key = Hashable


def step_keys(program: Program) -> list[Key]:
    """One key per top-level step of ``program``: its kernels and loops in order, then (if any) its copies. Equal
    keys: the same computation on the same number of distinct buffers, in the same roles."""
    block = program.block
    sizes = _Sizes(frozenset(loop_length_symbols(program.graph)) | {ROWS})
    where = _buffers(block)
    keys: list[Key] = [_Walk(where, sizes, top=True).step(k) for k in block.kernels]
    if block.copies:
        keys.append(_Walk(where, sizes, top=True).copies(block.copies))
    return keys


@dataclass(frozen=True)
class _Sizes:
    """Sizes as keys: a size computed from run-time symbols (``dynamic``: loop lengths, a row split's rows) by its
    expression, any other by its value (the code spells it as a number)."""

    dynamic: frozenset[str]

    def of(self, d: object) -> Hashable:
        if isinstance(d, tuple | list):
            return tuple(self.of(x) for x in d)
        if isinstance(d, Dim) and free_symbols(d) & self.dynamic:
            return "size", self._expr(d.expr)
        return int(d) if isinstance(d, int) and not isinstance(d, bool) else d

    def _expr(self, e: tuple) -> tuple:
        """A size expression as the code spells it: static symbols as their values, constants gathered."""
        return fold(e, lambda name: name in self.dynamic)

    def expr(self, d: int) -> Expr:
        """A size as an index expression: a number unless it is computed from run-time symbols."""
        if isinstance(d, Dim) and free_symbols(d) & self.dynamic:
            return Expr("size", (self._expr(d.expr), int(d)))
        return const(int(d))

    def type(self, n: Node) -> Hashable:
        if n.types is not None:
            return tuple((self.of(s), d.name) for s, d in n.types)
        return self.of(n.shape), n.dtype.name if n.dtype is not None else None

    def value(self, v: object) -> Hashable:
        """An attribute or a record's plain field, hashable."""
        if isinstance(v, Dim):
            return self.of(v)
        if isinstance(v, DType | Enum):
            return v.name
        if isinstance(v, np.ndarray):
            return "array", v.shape, v.dtype.str, hashlib.sha1(np.ascontiguousarray(v).tobytes()).hexdigest()
        if isinstance(v, tuple | list):
            return tuple(self.value(x) for x in v)
        if isinstance(v, Graph):
            raise TypeError("a graph attribute is keyed through its loop's Block")
        if isinstance(v, int | float | str | bool | type(None)):
            return v
        return repr(v)


def _buffers(block: Block) -> dict[int, Hashable]:
    """id(node) -> which buffer holds it, for every node of ``block``'s graph that has one: the graph's inputs,
    constant data, what the block's kernels store (by buffer name) and views read as their source's buffer."""
    g, graph = block.grouping, block.graph
    where: dict[int, Hashable] = {id(n): ("input", k) for k, n in enumerate(graph.inputs)}
    for k in block.kernels:
        for node, buf in _written(k, block):
            where[id(node)] = buf.name  # type: ignore[attr-defined]
        if isinstance(k, Loop):
            for c in k.chunked:
                where[id(stored_node(c.gemm))] = c.gemm.out.name
    for n in graph.order:
        if n.op == Op.DATA:
            where[id(n)] = ("data", id(n))
        elif id(n) in g.alias and id(n.srcs[0]) in where:
            where[id(n)] = where[id(n.srcs[0])]
    return where


def _blocks(n: Node) -> tuple | None:
    """A reshape's blocks of axes (``index.reshape_blocks``), which its index code follows: they come from the
    sizes' recipes, so two reshapes of equal sizes may index alike or not (a block split where the products are
    equal symbolically, one flat division where only their values are)."""
    if n.op != Op.RESHAPE:
        return None
    return tuple((tuple(o), tuple(i)) for o, i in reshape_blocks(n.shape, n.srcs[0].shape))


class _Walk:
    """The key of one step: ``where`` says which nodes are buffers (read as such unless the step computes them);
    buffers are numbered in order of first use, computed nodes in order of evaluation."""

    def __init__(self, where: dict[int, Hashable], sizes: _Sizes, top: bool) -> None:
        self.where = where
        self.sizes = sizes
        self.top = top  # a top-level step: which result a buffer is does not matter (it is a parameter)
        self.buffers: dict[Hashable, int] = {}
        self.refs: dict[tuple[int, frozenset[int]], tuple] = {}
        self.nodes: list[tuple] = []
        self.own: frozenset[int] = frozenset()

    def buffer(self, which: Hashable) -> int:
        return self.buffers.setdefault(which, len(self.buffers))

    def node(self, n: Node) -> tuple:
        """A reference to ``n``: a numbered buffer, or its own evaluation (sources first) added to ``nodes``."""
        memo = id(n), self.own  # what the step computes itself is not read from a buffer
        if memo in self.refs:
            return self.refs[memo]
        view = strided(n, self.base, self.sizes.expr) if n.op in STRIDED or id(n) in self.where else None
        value = _constant(n) if self.base(n) is None else None
        if view is not None:  # a buffer read in place: where its elements are, and how many (a GEMM's K, a loop's
            base, offset, strides = view  # bound, is a view's extent: two products differing only in K differ)
            ref: tuple = ("buffer", self.buffer(base), n.dtype.name, offset, tuple(strides), self.sizes.of(n.shape),
                          self.views(n))
        elif value is not None:  # the same value at every index: only it matters
            ref = ("constant", self.sizes.value(value.attrs["value"]), value.dtype.name)
        else:
            srcs = tuple(self.node(s) for s in n.srcs)
            attrs = tuple((k, self.sizes.value(v)) for k, v in sorted(n.attrs.items())
                          if k not in ("body", "primal"))
            self.nodes.append((n.op.name, srcs, attrs, self.sizes.type(n), _blocks(n)))
            ref = ("node", len(self.nodes) - 1)
        self.refs[memo] = ref
        return ref

    def views(self, n: Node) -> tuple:
        """The views ``n`` reads its buffer through, as the code indexes it: equal strides do not make equal index
        expressions where an axis has one element (a ``[1, 1]`` matrix and its transpose)."""
        chain = []
        while self.base(n) is None and n.op in STRIDED:
            chain.append((n.op.name, tuple((k, self.sizes.value(v)) for k, v in sorted(n.attrs.items())),
                          _blocks(n)))
            n = n.srcs[0]
        return tuple(chain)

    def base(self, n: Node) -> Hashable | None:
        """The buffer ``n`` is read from, if it is read from one (not computed by the step)."""
        return self.where[id(n)] if id(n) in self.where and id(n) not in self.own else None

    def step(self, k: Kernel | Loop) -> Key:
        record = self.record(k)
        return record, tuple(self.nodes)

    def copies(self, copies: Sequence[Copy]) -> Key:
        return tuple(self.record(c) for c in copies), tuple(self.nodes)

    def record(self, r: object) -> Hashable:
        """A record's fields, decisions and nodes alike (``node`` and ``epilogue`` are left out of its equality)."""
        if isinstance(r, Node):
            return self.node(r)
        if isinstance(r, Buf):
            return ("buf", self.buffer(r.name), self.sizes.of(r.shape), r.dtype.name,
                    None if self.top else r.output)
        if isinstance(r, Block):
            return _block_key(r, self.sizes)
        if isinstance(r, SlicedGroup):
            return ("sliced", self.node(r.gemm), self.node(r.root), r.offsets, r.width,
                    tuple(self.node(m) for m in r.members))
        if isinstance(r, RowSplit):
            return ("rows", self.sizes.of(r.batch), r.per_row)
        if isinstance(r, Kernel):  # the nodes it computes are evaluated, not read from their buffers
            outer = self.own
            self.own = outer | {id(n) for n in _computed(r)}
            try:
                return self.fields(r)
            finally:
                self.own = outer
        if isinstance(r, Loop | ChunkedInput):
            return self.fields(r)
        if isinstance(r, tuple):
            return tuple(self.record(v) for v in r)
        return self.sizes.value(r)

    def fields(self, r: Kernel | Loop | ChunkedInput) -> Hashable:
        return type(r).__name__, tuple((f.name, self.record(getattr(r, f.name))) for f in dataclasses.fields(r))


def _computed(k: Kernel) -> tuple[Node, ...]:
    """The nodes kernel ``k`` computes (a copy computes nothing: it reads its node's buffer)."""
    if isinstance(k, SlicedGemm):
        return k.group.gemm, k.group.root, *k.group.members
    if isinstance(k, Copy):
        return ()
    return k.node, stored_node(k)


def _constant(n: Node) -> Node | None:
    """The constant ``n`` is a view of (or is), if it is one: its value is the same at every index."""
    while n.op in STRIDED:
        n = n.srcs[0]
    return n if n.op == Op.CONST else None


def _block_key(block: Block, sizes: _Sizes) -> Key:
    """A loop body: its steps' keys, its buffers numbered apart from the enclosing step's (they are its own)."""
    where = _buffers(block)
    keys = [_Walk(where, sizes, top=False).step(k) for k in block.kernels]
    copies = _Walk(where, sizes, top=False).copies(block.copies) if block.copies else None
    return (tuple(keys), copies, tuple(sizes.type(n) for n in block.graph.inputs),
            tuple(sizes.type(o) for o in block.graph.outputs))

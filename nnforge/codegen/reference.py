"""The reference backend: a numpy interpreter of the IR, loops included. It is the ground truth.

Every op has one row in ``REFERENCE``. Half-precision values are computed in float32 and rounded once per op,
which is what PyTorch does on CPUs, so per-element comparisons with torch stay tight. Scans and loops run
their body graphs step by step; nothing is unrolled.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..dtypes import DType
from ..errors import NNForgeError, TraceError
from ..ir.node import Graph, Node
from ..ir.ops import Op
from ..trace import session
from .streams import LoopStreams, deliver, fetch

_HALF = (DType.float16, DType.bfloat16)


def _wide(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32) if a.dtype in (DType.float16.np, DType.bfloat16.np) else a


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.where(x >= 0, 1 / (1 + np.exp(-np.abs(x))), np.exp(-np.abs(x)) / (1 + np.exp(-np.abs(x))))


_ERF = np.frompyfunc(math.erf, 1, 1)


def _erf(x: np.ndarray) -> np.ndarray:
    """libm's erf (within an ulp in float64; numpy has none, and the interpreter is the ground truth)."""
    return np.asarray(_ERF(np.asarray(x, np.float64)), np.float64).astype(x.dtype, copy=False)


def _sign(x: np.ndarray) -> np.ndarray:
    """torch's sign: 0 at NaN (numpy's is NaN)."""
    return np.where(np.isnan(x), 0, np.sign(x)) if x.dtype.kind == "f" else np.sign(x)


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.integer):
        return np.power(a, np.maximum(b, 0))
    return np.power(a, b)


_ELEMENTWISE: dict[Op, Callable[..., np.ndarray]] = {
    Op.NEG: np.negative, Op.EXP: np.exp, Op.LOG: np.log, Op.SQRT: np.sqrt, Op.RECIP: np.reciprocal,
    Op.SIN: np.sin, Op.COS: np.cos, Op.TANH: np.tanh, Op.SIGMOID: _sigmoid, Op.ERF: _erf, Op.ABS: np.abs,
    Op.SIGN: _sign,
    Op.ADD: np.add, Op.SUB: np.subtract, Op.MUL: np.multiply, Op.POW: _pow, Op.MAX: np.maximum,
    Op.MIN: np.minimum, Op.LT: np.less, Op.LE: np.less_equal, Op.EQ: np.equal, Op.NE: np.not_equal,
    Op.WHERE: np.where,
}


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.integer):
        return np.floor_divide(a, b)
    return np.divide(a, b)


_ELEMENTWISE[Op.DIV] = _divide


def _elementwise(node: Node, args: list[np.ndarray], ctx: Interpreter) -> np.ndarray:
    with np.errstate(all="ignore"):
        out = _ELEMENTWISE[node.op](*[_wide(a) for a in args])
    return np.asarray(out).astype(node.dtype.np, copy=False)


def _matmul(node: Node, args: list[np.ndarray], ctx: Interpreter) -> np.ndarray:
    a, b = (_wide(x) for x in args)
    return np.matmul(a, b).astype(node.dtype.np, copy=False)


def _reduce(node: Node, args: list[np.ndarray], ctx: Interpreter) -> np.ndarray:
    fn = np.sum if node.op == Op.SUM else np.max
    x = _wide(args[0])
    return np.asarray(fn(x, axis=tuple(node.attrs["axes"]), keepdims=node.attrs["keepdims"])).astype(
        node.dtype.np, copy=False)


def _cast(node: Node, args: list[np.ndarray], ctx: Interpreter) -> np.ndarray:
    x = args[0]
    target = node.dtype
    if target.is_int and x.dtype.kind == "f":
        x = np.trunc(_wide(x))  # float -> int truncates toward zero, as in C and PyTorch
    if target in _HALF and x.dtype in (DType.float16.np, DType.bfloat16.np):
        x = x.astype(np.float32)
    return x.astype(target.np)


def _slice(node: Node, args: list[np.ndarray], ctx: Interpreter) -> np.ndarray:
    idx = tuple(slice(a, None if (s < 0 and b < 0) else b, s)
                for a, b, s in zip(node.attrs["starts"], node.attrs["stops"], node.attrs["steps"]))
    return args[0][idx]


def _pad(node: Node, args: list[np.ndarray], ctx: Interpreter) -> np.ndarray:
    return np.pad(args[0], node.attrs["pads"], constant_values=node.attrs["value"])


def _checked_index(node: Node, x_size: int, index: np.ndarray) -> np.ndarray:
    """The index array, or a clear error naming the first value outside [0, size)."""
    bad = (index < 0) | (index >= x_size)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise NNForgeError(f"{node.op.name.lower()}: index {int(index[at])} at position {list(at)} is out of range "
                           f"for size {x_size} along axis {node.attrs['axis']} (created at {node.loc})")
    return index.astype(np.intp, copy=False)


def _gather(node: Node, args: list[np.ndarray], ctx: Interpreter) -> np.ndarray:
    x, index = args
    axis = node.attrs["axis"]
    return np.take_along_axis(x, _checked_index(node, x.shape[axis], index), axis=axis)


def _scatter_add(node: Node, args: list[np.ndarray], ctx: Interpreter) -> np.ndarray:
    x, index = args
    axis = node.attrs["axis"]
    out = np.zeros(tuple(map(int, node.shape)), dtype=_wide(x).dtype)
    idx = list(np.indices(x.shape, sparse=True))
    idx[axis] = _checked_index(node, out.shape[axis], index)
    np.add.at(out, tuple(idx), _wide(x))  # unbuffered: repeated indices all add
    return out.astype(node.dtype.np, copy=False)


def _const(node: Node, args: list[np.ndarray], ctx: Interpreter) -> np.ndarray:
    value = node.attrs["value"]
    return np.full(tuple(map(int, node.shape)), int(value) if isinstance(value, int) else value, dtype=node.dtype.np)


def _rand(node: Node, args: list[np.ndarray], ctx: Interpreter) -> np.ndarray:
    shape = tuple(map(int, node.shape))
    draw = ctx.rng.standard_normal if node.attrs["dist"] == "normal" else ctx.rng.random
    return draw(shape).astype(node.dtype.np)


def _feeder(node: Node, args: list[np.ndarray], ctx: Interpreter) -> np.ndarray:
    io = ctx.streams.get(id(node))
    return io.take(node) if io is not None else fetch(node)


def _receiver(node: Node, args: list[np.ndarray], ctx: Interpreter) -> tuple:
    copies = [np.array(a, copy=True) for a in args]
    io = ctx.streams.get(id(node))
    if io is not None:
        io.send(node, copies)
    else:
        deliver(node, copies)
    return ()


def _scan(node: Node, args: list[np.ndarray], ctx: Interpreter) -> tuple:
    a = node.attrs
    n_carry, n_xs = a["n_carry"], a["n_xs"]
    carry = list(args[:n_carry])
    xs, consts = args[n_carry:n_carry + n_xs], list(args[n_carry + n_xs:])
    length = int(xs[0].shape[0]) if xs else int(a["length"])
    body: Graph = a["body"]
    ys_types = node.types[n_carry:]
    ys = [np.empty((length, *map(int, s[1:])), dtype=d.np) for s, d in ys_types]
    steps = range(length - 1, -1, -1) if a["reverse"] else range(length)
    for t in steps:
        out = ctx.run(body, [*carry, *(x[t] for x in xs), *consts])
        carry = out[:n_carry]
        for y, v in zip(ys, out[n_carry:]):
            y[t] = v
    return (*carry, *ys)


def _loop(node: Node, args: list[np.ndarray], ctx: Interpreter) -> tuple:
    a = node.attrs
    n_state = a["n_state"]
    state, consts = list(args[:n_state]), list(args[n_state:])
    body: Graph = a["body"]
    trips = int(a["length"])
    # Feeders run ahead and Receivers behind, each on a thread of this run of the loop (see streams.py).
    with LoopStreams(body, trips) as io:
        try:
            ctx.streams.update((id(n), io) for n in io.nodes)
            for i in range(trips):
                index = [np.asarray(i, dtype=np.int64)] if a["with_index"] else []
                state = ctx.run(body, [*index, *state, *consts])
        finally:
            for n in io.nodes:
                ctx.streams.pop(id(n), None)
    return tuple(state)


def _input(node: Node, args: list[np.ndarray], ctx: Interpreter) -> np.ndarray:
    raise TraceError(f"the value of a traced input is unknown outside its program: read it after calling the "
                     f"compiled function, not inside the traced body (created at {node.loc})")


REFERENCE: dict[Op, Callable[[Node, list, Any], Any]] = {
    **dict.fromkeys(_ELEMENTWISE, _elementwise),
    Op.CAST: _cast, Op.SUM: _reduce, Op.REDUCE_MAX: _reduce, Op.MATMUL: _matmul,
    Op.RESHAPE: lambda n, a, c: a[0].reshape(tuple(map(int, n.shape))),
    Op.PERMUTE: lambda n, a, c: a[0].transpose(n.attrs["perm"]),
    Op.EXPAND: lambda n, a, c: np.broadcast_to(a[0], tuple(map(int, n.shape))),
    Op.SLICE: _slice, Op.PAD: _pad, Op.GATHER: _gather, Op.SCATTER_ADD: _scatter_add,
    Op.CONCAT: lambda n, a, c: np.concatenate(a, axis=n.attrs["axis"]),
    Op.PROJ: lambda n, a, c: a[0][n.attrs["index"]],
    Op.INPUT: _input, Op.CONST: _const, Op.DATA: lambda n, a, c: n.attrs["array"], Op.RAND: _rand,
    Op.FEEDER: _feeder, Op.RECEIVER: _receiver, Op.SCAN: _scan, Op.LOOP: _loop,
}


class Interpreter:
    """Runs graphs with numpy, loop bodies once per iteration."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.streams: dict[int, LoopStreams] = {}  # id of a Feeder/Receiver in a running loop -> its threads

    def run(self, graph: Graph, inputs: Sequence[np.ndarray], memo: Any = None) -> list[Any]:
        """Outputs of ``graph``. ``memo`` maps top-level nodes computed before to their values (never bodies)."""
        env: dict[int, Any] = {}
        for n, v in zip(graph.inputs, inputs):
            env[id(n)] = v
        for n in graph.order:
            key = id(n)
            if key in env:
                continue
            if memo is not None and n in memo:
                env[key] = memo[n]
                continue
            value = REFERENCE[n.op](n, [env[id(s)] for s in n.srcs], self)
            env[key] = value
            if memo is not None and n.op not in (Op.DATA, Op.CONST):
                memo[n] = value
        return [env[id(n)] for n in graph.outputs]


def realize(node: Node) -> np.ndarray:
    """The value of a top-level node, computed once and memoized for as long as the node lives."""
    if node.op == Op.DATA:
        return node.attrs["array"]
    s = session()
    if node in s.memo:
        return s.memo[node]
    return Interpreter(s.rng).run(Graph((), (node,)), (), s.memo)[0]


def execute_effects(effects: Sequence[Node]) -> None:
    """Run top-level effects (receivers, loops) that have not run yet, in creation order."""
    s = session()
    Interpreter(s.rng).run(Graph((), (), tuple(effects)), (), s.memo)


class ReferenceProgram:
    """A graph made executable by the reference interpreter."""

    def __init__(self, graph: Graph, rng: np.random.Generator):
        self.graph = graph
        self.rng = rng

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return Interpreter(self.rng).run(self.graph, inputs)

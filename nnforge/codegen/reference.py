"""The reference backend: a numpy interpreter of the IR, loops included. It is the ground truth.

Each op's value comes from its numpy rule in ``nnforge.ir.registry.NUMPY`` (the table constant folding uses
too), where half-precision values are computed in float32 and rounded once per op, as PyTorch does on CPUs, so
per-element comparisons with torch stay tight. The ops that need the interpreter's own state have a row in
``INTERPRETED``: scans and loops run their body graphs step by step (nothing is unrolled), random numbers come
from its generator, feeders and receivers talk to the host.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import NNForgeError, TraceError
from ..ir.node import Graph, Node
from ..ir.ops import Op
from ..ir.registry import NUMPY
from ..trace import session
from .streams import LoopStreams, deliver, fetch


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
    step = ctx.steps.get(id(node))  # the body compiled (streamed.py)
    staging = step.staging() if step is not None else None
    with LoopStreams(body, trips, staging.upload if staging is not None else None) as io:
        if step is not None:
            return step.run(staging, state, consts, trips, a["with_index"], io)
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


# The ops that need the interpreter itself (its random generator, its loop streams, running bodies); every other
# op's value comes from the numpy table shared with constant folding.
INTERPRETED: dict[Op, Callable[[Node, list, Interpreter], Any]] = {
    Op.INPUT: _input, Op.RAND: _rand, Op.FEEDER: _feeder, Op.RECEIVER: _receiver, Op.SCAN: _scan, Op.LOOP: _loop,
}


class Interpreter:
    """Runs graphs with numpy, loop bodies once per iteration. ``steps``: loops whose iterations are calls of a
    compiled step instead (by id of the loop node; ``streamed.CompiledStep``)."""

    def __init__(self, rng: np.random.Generator, steps: Mapping[int, Any] | None = None):
        self.rng = rng
        self.steps = steps or {}
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
                env[key] = _memoized(memo[n])
                continue
            args = [env[id(s)] for s in n.srcs]
            pure = NUMPY.get(n.op)
            value = pure(n, args) if pure is not None else INTERPRETED[n.op](n, args, self)
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
        return _memoized(s.memo[node])
    return Interpreter(s.rng).run(Graph((), (node,)), (), s.memo)[0]


class Failed:
    """What an effect is memoized as when ``execute`` stopped at an error (a loop whose Feeder or Receiver raised,
    or an effect after it, which never ran): reading a value it computes raises, rather than running the loop
    again, which would call its Feeders and Receivers a second time."""

    def __init__(self, node: Node, cause: BaseException):
        self.loc, self.cause = node.loc, cause

    def error(self) -> NNForgeError:
        err = NNForgeError(f"this value depends on an nf.loop or Receiver (created at {self.loc}) that did not "
                           f"finish: execute() stopped with {type(self.cause).__name__}: {self.cause}")
        err.__cause__ = self.cause
        return err


def _memoized(value: Any) -> Any:
    """A memoized value, or the error of the effect that did not finish (``Failed``)."""
    if isinstance(value, Failed):
        raise value.error()
    return value


def execute_effects(effects: Sequence[Node]) -> None:
    """Run top-level effects (receivers, loops) that have not run yet, in creation order; on an error, those
    that did not finish are memoized as ``Failed``."""
    s = session()
    try:
        Interpreter(s.rng).run(Graph((), (), tuple(effects)), (), s.memo)
    except BaseException as e:
        for n in effects:
            if n not in s.memo:
                s.memo[n] = Failed(n, e)
        raise


class ReferenceProgram:
    """A graph made executable by the reference interpreter. Its random numbers come from the session's generator
    at each call, so ``nf.manual_seed`` after the program was built still repeats a run."""

    def __init__(self, graph: Graph):
        self.graph = graph

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return _owned(Interpreter(session().rng).run(self.graph, inputs), inputs)


def _owned(outputs: Sequence[np.ndarray], inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Each output an array of its own, writable, as the compiled backends return them: the interpreter hands back
    inputs, views of them (a reshape, a slice), one array for outputs merged into one node, and read-only
    constants, so writing into one output would change the caller's input or another output."""
    held, out = list(inputs), []
    for o in outputs:
        if not o.flags.writeable or any(np.may_share_memory(o, h) for h in held):
            o = o.copy()
        held.append(o)
        out.append(o)
    return out

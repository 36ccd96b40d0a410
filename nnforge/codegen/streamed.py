"""``nf.loop`` bodies that call Python (Feeders, Receivers) under a compiled backend: the body becomes a compiled
step program, called once per iteration by the host, with the Feeders' batches made ahead and the Receivers'
values delivered behind on the threads of ``streams``.

Why one program call per iteration rather than one program for the whole loop: generated code runs without the
GIL and cannot call Python in the middle of its loop without taking it back every step (stalling the very
threads that make the next batch); a call costs tens of microseconds, against a training step's milliseconds.
The state stays where the program keeps it between calls (host arrays on the CPU, device tensors with Triton);
batches and Receiver values cross to and from it as ``runtime/staging.py`` says (on a GPU: pinned memory and a
copy stream, so the loop's thread never waits for a copy).

Which loops: those at the top level of the graph whose Feeders and Receivers sit directly in their body (a
Feeder becomes an input of the step program, a Receiver's values extra outputs). What runs once around them
(the code before and after a loop) runs on the interpreter, as does a loop whose body nests its Feeders or
Receivers deeper (in a scan or an inner ``nf.loop``). Within one iteration every Feeder is called before the
step runs and every Receiver after it; their order among themselves, and every guarantee of ``streams``, is the
interpreter's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from ..ir.loops import calls_python, placeholder
from ..ir.node import Graph, Node
from ..ir.ops import Op
from ..passes.rewrite import substitute
from ..runtime.staging import HostStaging, staging_for
from ..trace import session
from .reference import Interpreter
from .streams import LoopStreams, arrived, deliver, fetch

log = logging.getLogger("nnforge.codegen")

def streamed_loops(graph: Graph) -> list[Node]:
    """The top-level ``nf.loop`` nodes of ``graph`` whose bodies call Feeders or Receivers directly, and no
    deeper: the loops whose steps can run as compiled programs."""

    def direct_only(body: Graph) -> bool:
        nested = [m.attrs["body"] for m in body.order if m.op in (Op.SCAN, Op.LOOP)]
        return calls_python(body) and not any(map(calls_python, nested))

    return [n for n in graph.order if n.op == Op.LOOP and direct_only(n.attrs["body"])]


def step_graph(loop: Node) -> tuple[Graph, tuple[Node, ...], tuple[tuple[Node, int], ...]]:
    """One iteration of ``loop`` as a graph without effects: its body with every Feeder an extra input (after
    the body's own) and every Receiver's values extra outputs (after the new state); also the Feeders and the
    (Receiver, value count) pairs, in the body's order."""
    body: Graph = loop.attrs["body"]
    feeders = tuple(n for n in body.order if n.op == Op.FEEDER)
    receivers = tuple(n for n in body.order if n.op == Op.RECEIVER)
    feeds = {id(f): placeholder(f.shape, f.dtype, f"feed{k}") for k, f in enumerate(feeders)}
    sent = [s for r in receivers for s in r.srcs]
    rest = [e for e in body.effects if e.op != Op.RECEIVER]
    g = substitute(Graph(body.inputs, [*body.outputs, *sent], rest), feeds)
    inputs = [*g.inputs, *(feeds[id(f)] for f in feeders)]
    return Graph(inputs, g.outputs, g.effects), feeders, tuple((r, len(r.srcs)) for r in receivers)


@dataclass(frozen=True)
class CompiledStep:
    """A loop's iteration as a compiled program: ``program`` maps (index, state, consts, one array per Feeder)
    to (new state, each Receiver's values); ``staging`` makes, per run of the loop, what moves those arrays
    between the host and the program (``runtime/staging.py``: asynchronous copies on a GPU)."""

    program: Callable[[Sequence[Any]], list[Any]]
    feeders: tuple[Node, ...]
    receivers: tuple[tuple[Node, int], ...]
    staging: Callable[[], HostStaging]

    def run(self, staging: HostStaging, state: list[np.ndarray], consts: list[np.ndarray], trips: int,
            with_index: bool, io: LoopStreams) -> tuple[np.ndarray, ...]:
        """The loop's final state after ``trips`` calls, Feeders taken from and Receivers sent to ``io`` (whose
        prefetch thread uploads with ``staging``)."""
        state, consts = staging.place(state), staging.place(consts)
        # every step's index placed at once: a step reads its own element, no copy per step
        indices = staging.place([np.arange(trips, dtype=np.int64)])[0] if with_index else None
        take = io.take if io.feeders else (lambda f: staging.upload(fetch(f)))  # where streams says so
        send = io.send if io.receivers else (lambda r, values: deliver(r, arrived(r, values)))
        n = len(state)
        for i in range(trips):
            index = [indices[i, ...]] if indices is not None else []  # a 0-d view
            # a list, not a generator: a Feeder's StopIteration (an exhausted iterator) must reach the caller as
            # itself, which a generator would turn into RuntimeError (PEP 479)
            batches = [staging.use(take(f)) for f in self.feeders]
            outs = staging.call([*index, *state, *consts, *batches])
            state, k = outs[:n], n
            for r, m in self.receivers:
                send(r, staging.download(outs[k:k + m]))
                k += m
        return tuple(staging.host(s) for s in state)


class StreamedProgram:
    """A graph with streamed loops: the top level on the interpreter, each streamed loop's iterations as calls
    of its compiled step (built once, by ``build``)."""

    def __init__(self, graph: Graph, build: Callable[[Graph], Callable], backend: str):
        self.graph = graph
        self.steps: dict[int, CompiledStep] = {}
        for loop in streamed_loops(graph):
            g, feeders, receivers = step_graph(loop)
            program = build(g)
            self.steps[id(loop)] = CompiledStep(program, feeders, receivers, partial(staging_for, program))
            log.info("backend %r: the nf.loop at %s runs its step as compiled code, one call per iteration "
                     "(Feeders and Receivers on host threads); the code around it on the interpreter", backend,
                     loop.loc or "an unknown line")

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return Interpreter(session().rng, self.steps).run(self.graph, inputs)

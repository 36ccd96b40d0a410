"""Tracing state: the session (per execution context) and the stack of trace scopes.

A *session* holds what outlives one trace: memoized values of realized nodes, top-level effects waiting for
``nf.execute()``, the tensors that require gradients, and the random generator. A *scope* is one trace in
progress (a compiled function, a scan or loop body): it collects the effectful nodes created inside it and
the tensors re-bound by in-place updates. Both live in a ``ContextVar`` rather than module globals, so threads
and asyncio tasks each get their own and nothing leaks between them.
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .ir.node import Node

if TYPE_CHECKING:
    from .tensor import Tensor


@dataclass(eq=False)
class Scope:
    """One trace in progress. ``kind`` is "top", "function" or "body"."""

    kind: str
    effects: list[Node] = field(default_factory=list)        # receivers and loops, in creation order
    effectful: set[int] = field(default_factory=set)         # ids of RAND/FEEDER nodes created here
    assigned: dict[int, tuple[Tensor, Node]] = field(default_factory=dict)  # id(tensor) -> (tensor, node before)
    grads_set: dict[int, tuple[Tensor, object]] = field(default_factory=dict)  # id(tensor) -> (tensor, grad before)
    grads_cleared: set[int] = field(default_factory=set)  # ids of tensors whose first .grad write here was None
    modes: dict[int, tuple[weakref.ref, bool]] = field(default_factory=dict)  # id(module) -> (module, training)
    read: dict[int, weakref.ref] = field(default_factory=dict)  # id(tensor) -> each tensor the trace read


@dataclass(eq=False)
class Session:
    """What one execution context keeps between traces."""

    memo: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)
    grad_leaves: dict[int, weakref.ref] = field(default_factory=dict)   # id(node) -> tensor requiring grad
    # id(node) -> a tensor compiled functions read at call time though it requires no grad: a HostValue, or a
    # tensor that changed after a trace had baked it in (a module's, or one a function captured)
    live: dict[int, weakref.ref] = field(default_factory=dict)
    # bumped whenever what compiled functions captured may have changed: a tensor's requires_grad flips, or a
    # parameter, buffer or sub-module of a module some trace called is reassigned; they then trace again
    epoch: int = 0
    rng: np.random.Generator = field(default_factory=np.random.default_rng)
    scopes: list[Scope] = field(default_factory=lambda: [Scope("top")])
    differentiating: int = 0  # eager ``nf.grad`` / ``nf.vjp`` calls running their function (compiled ones inline)

    @property
    def scope(self) -> Scope:
        return self.scopes[-1]

    @property
    def tracing(self) -> bool:
        return len(self.scopes) > 1


_SESSION: contextvars.ContextVar[Session] = contextvars.ContextVar("nnforge_session")


def session() -> Session:
    """The current context's session, created on first use."""
    try:
        return _SESSION.get()
    except LookupError:
        s = Session()
        _SESSION.set(s)
        return s


@contextlib.contextmanager
def scope(kind: str) -> Iterator[Scope]:
    """Open a trace scope for the duration of a with-block."""
    s = session()
    sc = Scope(kind)
    s.scopes.append(sc)
    try:
        yield sc
    finally:
        s.scopes.pop()


@contextlib.contextmanager
def fresh_session() -> Iterator[Session]:
    """Run a block in a new, empty session (tests use it so pending effects never leak between them)."""
    token = _SESSION.set(Session())
    try:
        yield _SESSION.get()
    finally:
        _SESSION.reset(token)


def manual_seed(seed: int) -> None:
    """Seed the generator behind ``nf.randn``/``nf.rand`` and random ops of programs run in this context."""
    session().rng = np.random.default_rng(seed)

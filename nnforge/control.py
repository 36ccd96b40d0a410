"""Loops that stay loops (``scan``, ``loop``) and host I/O nodes (``Feeder``, ``Receiver``).

A body is traced once into its own Graph. Values it reads from outside become extra inputs of the loop node
("consts"), so work that does not depend on the carry is never inside the body at all; effectful nodes made
inside the body (random numbers, feeders, receivers) stay inside and run on every iteration.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from . import dtypes
from .codegen.streams import PENDING, PREFETCH
from .errors import ShapeError, TraceError, at, user_location
from .ir.build import make
from .ir.loops import close_body, placeholder
from .ir.ops import Op, fmt_shape
from .pytree import describe, flatten, unflatten
from .tensor import Tensor, as_tensor, full, where
from .trace import Scope, scope, session


def _is_leaf(x: Any) -> bool:
    return isinstance(x, (Tensor, np.ndarray, int, float, bool)) or type(x).__module__ == "torch"


def _tensors(leaves: list, what: str) -> list[Tensor]:
    out = []
    for v in leaves:
        if not _is_leaf(v):
            raise TraceError(at(f"{what}: expected tensors, got {type(v).__name__}"))
        out.append(v if isinstance(v, Tensor) else Tensor(v))
    return out


def _check_like(new: list[Tensor], old: list[Tensor], what: str) -> None:
    for i, (a, b) in enumerate(zip(new, old)):
        if tuple(map(int, a.shape)) != tuple(map(int, b.shape)):
            raise ShapeError(at(f"{what}: carry leaf {i} changed shape from {fmt_shape(b.shape)} to "
                                f"{fmt_shape(a.shape)}; a carry keeps its shape across iterations"))
        if a.dtype != b.dtype:
            raise TraceError(at(f"{what}: carry leaf {i} changed dtype from {b.dtype} to {a.dtype}"))


def scan(body: Callable, init: Any, xs: Any = None, reverse: bool = False, unroll: int = 1,
         length: int | None = None, checkpoint_every: int | None = None) -> tuple[Any, Any]:
    """``carry, y_t = body(carry, x_t)`` over the leading axis of ``xs``; returns (final carry, stacked ys).

    The trip count is read from ``xs`` at run time, so a compiled function accepts new sequence lengths without
    tracing again. ``reverse`` walks from the end (ys stay in input order). ``checkpoint_every=k`` stores the carry
    only every k steps for backprop and recomputes the rest (memory O(T/k + k) instead of O(T)).
    """
    if not callable(body):
        raise TraceError(at(f"scan: body must be callable, got {type(body).__name__}"))
    if not isinstance(reverse, (bool, np.bool_)):
        raise TraceError(at(f"scan: reverse must be True or False, got {type(reverse).__name__} {reverse!r}"))
    unroll = _whole("scan: unroll", unroll, 1)
    if checkpoint_every is not None:
        checkpoint_every = _whole("scan: checkpoint_every", checkpoint_every, 1)
    if length is not None:
        length = _whole("scan: length", length, 0)
    carry_leaves, carry_def = flatten(init, _is_leaf)
    carry = _tensors(carry_leaves, "scan init")
    xs_leaves, xs_def = flatten(xs, _is_leaf)
    xs_t = _tensors(xs_leaves, "scan xs")
    for x in xs_t:
        if x.ndim == 0:
            raise ShapeError(at("scan: every xs leaf needs a leading (time) axis, got a 0-d tensor"))
    if xs_t:
        n = xs_t[0].shape[0]
        for x in xs_t[1:]:
            if int(x.shape[0]) != int(n):
                shapes = ", ".join(fmt_shape(x.shape) for x in xs_t)
                raise ShapeError(at(f"scan: xs leaves disagree on length: {shapes}"))
        if length is not None and int(length) != int(n):
            raise ShapeError(at(f"scan: length={length} but xs have leading size {int(n)}"))
        length = n
    elif length is None:
        raise TraceError(at("scan: give xs or length"))
    if checkpoint_every is not None and checkpoint_every > 1:
        return _checkpointed(body, carry, carry_def, xs_t, xs_def, length, reverse, unroll, checkpoint_every)
    return _scan(body, carry, carry_def, xs_t, xs_def, length, reverse, unroll)


def _scan(body: Callable, carry: list[Tensor], carry_def: Any, xs: list[Tensor], xs_def: Any, length: int,
          reverse: bool, unroll: int) -> tuple[Any, Any]:
    loc = user_location()
    c_ph = [placeholder(c.shape, c.dtype, f"carry{i}") for i, c in enumerate(carry)]
    x_ph = [placeholder(x.shape[1:], x.dtype, f"x{i}") for i, x in enumerate(xs)]
    with scope("body") as sc:
        out = body(unflatten(carry_def, [Tensor(p) for p in c_ph]),
                   unflatten(xs_def, [Tensor(p) for p in x_ph]) if xs_def != ("none",) else None)
        if sc.assigned:
            raise TraceError(f"scan: the body assigned a tensor in place (at {loc}); return new values as the carry")
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TraceError(f"scan: body must return (new_carry, y), got {type(out).__name__} (scan at {loc})")
    new_leaves, new_def = flatten(out[0], _is_leaf)
    if new_def != carry_def:
        raise TraceError(f"scan: body returned carry structure {describe(new_def)}, expected {describe(carry_def)} "
                         f"like init (scan at {loc})")
    new = [as_tensor(v, like=c) for v, c in zip(new_leaves, carry)]
    _check_like(new, carry, "scan")
    y_leaves, y_def = flatten(out[1], _is_leaf)
    ys = _tensors(y_leaves, "scan y")
    graph, consts = close_body(c_ph + x_ph, [t.node for t in new + ys], sc.effects, sc.effectful)
    types = tuple((c.shape, c.dtype) for c in carry) + tuple(((length, *y.shape), y.dtype) for y in ys)
    node = make(Op.SCAN, tuple(t.node for t in carry + xs) + tuple(consts),
                {"body": graph, "n_carry": len(carry), "n_xs": len(xs), "reverse": bool(reverse),
                 "unroll": int(unroll), "length": length}, types=types)
    outs = [Tensor(make(Op.PROJ, (node,), {"index": i})) for i in range(len(types))]
    return unflatten(carry_def, outs[:len(carry)]), unflatten(y_def, outs[len(carry):])


def _checkpointed(body: Callable, carry: list[Tensor], carry_def: Any, xs: list[Tensor], xs_def: Any, length: int,
                  reverse: bool, unroll: int, k: int) -> tuple[Any, Any]:
    """A scan of segments of k steps, each an inner scan; padded steps leave the carry untouched.

    Differentiating it stores one carry per segment and, in the backward pass, re-runs one segment at a time:
    the recompute-for-memory trade of gradient checkpointing, built from scans alone.
    """
    segments = (length + k - 1) // k
    padded = segments * k
    xs_seg = [x.pad(((0, padded - length),) + ((0, 0),) * (x.ndim - 1)).reshape(segments, k, *x.shape[1:])
              for x in xs]
    start = full((), padded - 1 if reverse else 0, dtypes.int64)
    bound = full((), length, dtypes.int64)
    step = -1 if reverse else 1

    def inner(state, x_t):
        c, t = state
        new_c, y = body(unflatten(carry_def, c), unflatten(xs_def, x_t) if xs_def != ("none",) else None)
        new_leaves, _ = flatten(new_c, _is_leaf)
        valid = t < bound
        kept = [where(valid, as_tensor(n, like=o), o) for n, o in zip(new_leaves, c)]
        return (kept, t + step), y

    def outer(state, x_seg):
        return scan(inner, (list(state[0]), state[1]), list(x_seg), reverse=reverse, unroll=unroll, length=k)

    (c, _), ys = scan(outer, (carry, start), xs_seg, reverse=reverse, length=segments)
    y_leaves, y_def = flatten(ys, _is_leaf)
    y_flat = [y.reshape(padded, *y.shape[2:])[:length] for y in y_leaves]
    return unflatten(carry_def, c), unflatten(y_def, y_flat)


def _restore_grads(sc: Scope) -> None:
    for t, g in sc.grads_set.values():
        t._grad = g


def loop(n: int, body: Callable) -> None:
    """Run ``body()`` (or ``body(i)``) n times as one loop node, like an imperative training loop.

    The body updates state in place (``t.assign(...)``, optimizer steps); the tensors it assigns become the loop's
    carried state and are re-bound to the loop's results. Nothing runs until a result is read or ``nf.execute()``.
    """
    if not callable(body):
        raise TraceError(at(f"loop: body must be callable, got {type(body).__name__}"))
    n = _whole("loop: n", n, 0, "a count of iterations")  # range() would run a negative count zero times
    try:
        with_index = len(inspect.signature(body).parameters) == 1
    except (TypeError, ValueError):
        with_index = False
    idx = [placeholder((), dtypes.int64, "i")] if with_index else []

    # First pass: discover which tensors the body updates in place. Then undo it.
    with scope("body") as sc:
        body(*[Tensor(p) for p in idx])
    state = [t for t, _ in sc.assigned.values()]
    for t, before in sc.assigned.values():
        t._rebind(before)
    _restore_grads(sc)

    # Second pass: trace again with the state as placeholders.
    before = [t.node for t in state]
    ph = [placeholder(t.shape, t.dtype, f"state{i}") for i, t in enumerate(state)]
    for t, p in zip(state, ph):
        t._rebind(p)
    with scope("body") as sc2:
        body(*[Tensor(p) for p in idx])
    new = [t.node for t in state]
    extra = [t for t, _ in sc2.assigned.values() if all(t is not s for s in state)]
    for t, b in zip(state, before):
        t._rebind(b)
    _restore_grads(sc2)
    if extra:
        raise TraceError(at("loop: the body updated different tensors on its second trace; state must not depend on "
                            "Python-side conditions"))
    for b, nn in zip(before, new):
        if tuple(map(int, nn.shape)) != tuple(map(int, b.shape)) or nn.dtype != b.dtype:
            raise ShapeError(at(f"loop: state {fmt_shape(b.shape)} {b.dtype} became {fmt_shape(nn.shape)} {nn.dtype}"))
    graph, consts = close_body(idx + ph, new, sc2.effects, sc2.effectful)
    node = make(Op.LOOP, tuple(before) + tuple(consts),
                {"body": graph, "n_state": len(state), "length": n, "with_index": with_index},
                types=tuple((b.shape, b.dtype) for b in before))
    outer = session().scope
    for i, t in enumerate(state):
        outer.assigned.setdefault(id(t), (t, t.node))
        t._rebind(make(Op.PROJ, (node,), {"index": i}))
    outer.effects.append(node)


def _whole(what: str, value: Any, least: int, meaning: str = "") -> int:
    """``value`` checked to be an int of at least ``least`` (a symbolic size is one): a count that is negative, zero
    where steps are grouped, or fractional says the code computing it is wrong, which running zero or some steps
    would hide. ``meaning``: what the count is, for the message."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        said = f" ({meaning})" if meaning else ""
        raise TraceError(at(f"{what} must be an int{said}, got {type(value).__name__} {value!r}"))
    if value < least:
        said = f"{meaning}, " if meaning else ""
        raise ValueError(at(f"{what} must be {said}{least} or more, got {int(value)}"))
    return value


def _depth(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise TraceError(at(f"{what} must be a non-negative int, got {value!r}"))
    return int(value)


def Feeder(fn: Callable[[], Any], shape: Any, dtype: Any = dtypes.float32, name: str = "",
           prefetch: int = PREFETCH) -> Tensor:
    """A host -> device input: ``fn()`` is called for a fresh array every time the node runs (every iteration).

    In an ``nf.loop`` a host thread calls ``fn`` up to ``prefetch`` iterations ahead, so the next batch is ready
    when a step ends; exactly as many calls as iterations, in order. ``prefetch=0`` calls it when the step needs
    it, on the loop's thread (also the case for any Feeder of a loop that has one with ``prefetch=0``).
    """
    if not callable(fn):
        raise TraceError(at(f"Feeder: fn must be callable, got {type(fn).__name__}"))
    node = make(Op.FEEDER, (), {"fn": fn, "shape": tuple(int(d) for d in shape), "dtype": dtypes.as_dtype(dtype),
                                "name": name, "prefetch": _depth(prefetch, "Feeder: prefetch")})
    session().scope.effectful.add(id(node))
    return Tensor(node)


def Receiver(fn: Callable[..., Any], tensors: Any, name: str = "", pending: int = PENDING) -> None:
    """A device -> host output: ``fn(*arrays)`` receives the values each time the node runs.

    At top level it runs on ``nf.execute()``; inside a loop body, on every iteration. In an ``nf.loop`` a host
    thread calls ``fn`` with copies, in iteration order, while the loop goes on; the loop waits when ``pending``
    values are undelivered, and every delivery has happened when the loop returns. ``pending=0`` calls it on the
    loop's thread (also the case for any Receiver of a loop that has one with ``pending=0``).
    """
    if not callable(fn):
        raise TraceError(at(f"Receiver: fn must be callable, got {type(fn).__name__}"))
    leaves, _ = flatten(list(tensors) if not isinstance(tensors, Tensor) else [tensors], _is_leaf)
    ts = _tensors(leaves, "Receiver")
    node = make(Op.RECEIVER, tuple(t.node for t in ts),
                {"fn": fn, "name": name, "pending": _depth(pending, "Receiver: pending")}, types=())
    session().scope.effects.append(node)


def execute() -> None:
    """Run the pending top-level effects (loops, receivers) in the order they were created."""
    from .codegen.reference import execute_effects

    s = session()
    if s.tracing:
        raise TraceError(at("execute: call it at top level, not inside a traced function"))
    effects, s.scope.effects = s.scope.effects, []
    execute_effects(effects)

"""Compiled functions inside torch autograd.

A compiled function called with torch tensors that require grad returns tensors with a ``grad_fn``: a
``torch.autograd.Function``, so ``loss.backward()`` in a torch training loop reaches the inputs through an
nnforge-compiled layer. The function and its pullback are traced as one graph and cut where the cotangents enter
(``autodiff.partition``): the forward half runs when the layer is called and returns, besides the outputs, the
values the backward half reads (a scan's stacked carries and gate pre-activations); the backward half runs in
``loss.backward()`` from them, without running the forward again. Both halves are built once per signature,
like the forward; tensors the function updates in place are written back once, and its Receivers called once, by
the forward half. A function that sets ``.grad`` itself, and a program loaded from a file saved without its halves,
run their pullback whole instead: it recomputes the forward (its random draws and Receiver calls again), but
writes back neither the in-place updates nor the ``.grad`` the forward's call wrote.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..pytree import flatten, unflatten

if TYPE_CHECKING:
    from ..compile import CompiledFunction

log = logging.getLogger("nnforge.compile")


def needs_autograd(leaves: Sequence[Any]) -> bool:
    """Whether torch records gradients for any of these arguments."""
    import torch

    return torch.is_grad_enabled() and any(isinstance(v, torch.Tensor) and v.requires_grad for v in leaves)


def _pullback(fn: Callable, treedef: Any, base: list, diff: tuple[int, ...]) -> tuple[list, Callable]:
    """Every result of ``fn`` on the leaves ``base`` and the pullback of its floating-point ones with respect to
    ``base[diff]`` (integer results carry no gradient)."""
    from ..compile import _is_leaf
    from ..differentiate import vjp
    from ..tensor import as_tensor

    results: list = []

    def outputs(*primals: Any) -> list:
        vals = list(base)
        for i, p in zip(diff, primals):
            vals[i] = p
        args, kwargs = unflatten(treedef, vals)
        results.extend(as_tensor(o) for o in flatten(fn(*args, **kwargs), _is_leaf)[0])
        return [o for o in results if o.dtype.is_float]

    _, back = vjp(outputs, *[base[i] for i in diff])
    return results, back


def vjp_function(fn: Callable, treedef: Any, n_leaves: int, diff: tuple[int, ...]) -> Callable:
    """``g(*leaves, *cotangents) -> grads of leaves[diff]``: the pullback of ``fn`` as a function of plain arrays,
    for ``nf.compile`` (run whole: it recomputes the forward)."""

    def pullback(*flat: Any) -> tuple:
        _, back = _pullback(fn, treedef, list(flat[:n_leaves]), diff)
        return tuple(back(list(flat[n_leaves:])))

    return pullback


def joint_function(fn: Callable, treedef: Any, n_leaves: int, diff: tuple[int, ...]) -> Callable:
    """``g(*leaves, *cotangents) -> (*results, *grads of leaves[diff])``: ``fn`` and its pullback as one function
    of plain arrays, for ``nf.compile``; its graph is run in two halves (``autodiff.partition``)."""

    def joint(*flat: Any) -> tuple:
        results, back = _pullback(fn, treedef, list(flat[:n_leaves]), diff)
        return (*results, *back(list(flat[n_leaves:])))

    return joint


def joint_key(treedef: Any, n_leaves: int, diff: tuple[int, ...]) -> tuple:
    """Where a compiled function keeps its joint program for an argument structure (``CompiledFunction._vjps``)."""
    return ("joint", treedef, n_leaves, diff)


def forward_half(cf: CompiledFunction, treedef: Any, detached: list, diff: tuple[int, ...]
                 ) -> tuple[list, Any, Callable[[list], list], list[int]] | None:
    """Run the forward half of ``cf`` on the call's leaves: its results, their structure, the backward half
    (cotangents of the floating-point results -> gradients of ``detached[diff]``), which holds the saved values,
    and the positions of the results among them (the backward reads their memory: changed in place, they would
    change the gradients). None where the pullback must run whole (see the module docstring)."""
    from ..autodiff.partition import split_at_cotangents
    from ..compile import implicit_arrays, run_program, stand_in
    from ..interop.convert import is_torch, to_torch
    from ..ir.dims import substitute

    n = len(detached)
    if cf.loaded_from is not None and joint_key(treedef, n, diff) not in cf._vjps:
        return None
    args, kwargs = unflatten(treedef, detached)
    _, _, shapes, plain = cf._lookup(args, kwargs)  # the results' shapes and dtypes: the cotangents'
    env = {f"a{i}.{ax}": s for i, sh in enumerate(shapes) for ax, s in enumerate(sh)}
    results = plain.graph.outputs[:plain.n_out]
    cts = [stand_in(tuple(int(d) for d in substitute(o.shape, env)), o.dtype.np) for o in results if o.dtype.is_float]
    joint = cf.joint_program(treedef, n, diff)
    leaves, arrays, jshapes, entry = joint._lookup((*detached, *cts), {})
    if entry.split is None:
        entry.split = False
        if not (entry.grads or entry.grad_reads):
            first = sum(x is not None for x in arrays[:n])
            primal = [*range(len(results)), *(i for _, i in entry.state)]  # results, then values written back
            try:
                entry.split = split_at_cotangents(entry.graph, range(first, first + len(cts)), primal)
            except ValueError as e:
                log.info("%s: runs its pullback whole: %s", joint.__qualname__, e)
    if entry.split is False:
        return None
    fwd, bwd = (joint._program(entry, jshapes, half) for half in ("forward", "backward"))
    implicit = implicit_arrays(entry)
    outs = run_program(fwd, leaves[:n], arrays[:n], implicit)
    # in-place updates of captured tensors, once a call (the forward's outputs after the results)
    cf._write_back((ref, outs[len(results) + k]) for k, (ref, _) in enumerate(entry.state))
    saved = [outs[k] for k in entry.split.saved_at]

    def backward(cotangents: list) -> list:
        leaves_b, _, arrays_b, _ = joint._split((*detached, *cotangents), {})
        grads = run_program(bwd, leaves_b, arrays_b, implicit + list(saved))
        return [g if is_torch(g) else to_torch(g) for g in grads]

    read_back = sorted({k for k in entry.split.saved_at if k < len(results)})
    return [o if is_torch(o) else to_torch(o) for o in outs[:len(results)]], plain.out_def, backward, read_back


def _whole_pullback(program: CompiledFunction, leaves: list) -> list:
    """The gradients ``program`` (``vjp_function``'s, which runs the function again) computes from ``leaves``,
    without its effects on Python state: the forward's call already wrote back the tensors the function updates
    in place and the ``.grad`` it sets, which a second write would apply twice (an optimizer step taken again,
    gradients accumulated twice)."""
    from ..interop.convert import is_torch, to_torch

    return [g if is_torch(g) else to_torch(g) for g in program._run(tuple(leaves), {}, write_back=False)[2]]


@dataclass
class _Call:
    """One call through torch autograd: what its forward and backward read besides the tensors torch tracks."""

    cf: CompiledFunction
    treedef: Any
    detached: list  # the call's leaves, tensors detached from torch's graph
    diff: tuple[int, ...]  # the positions of the leaves torch differentiates
    out_def: Any = None  # the results' structure, set by the forward


@functools.cache
def _autograd_function() -> type:
    """The ``torch.autograd.Function`` every call through torch autograd applies (made once: a class per call
    cost tens of microseconds). Its ``grad_fn`` prints as ``NnforgeCompiledBackward``."""
    import torch

    from ..compile import _is_leaf

    class GradientsOnce(torch.autograd.Function):
        """Gradients a program computed, recorded so that differentiating them again raises: torch's
        ``once_differentiable`` marks them only where a cotangent requires grad, and otherwise leaves them constants
        whose second derivative would be silently wrong (``x`` times a gradient of ``x``)."""

        @staticmethod
        def forward(ctx, anchor, *grads):  # anchor: a tensor requiring grad, so the gradients record this node
            return tuple(g.detach() for g in grads)

        @staticmethod
        def backward(ctx, *_):
            raise RuntimeError("a compiled function's gradients are computed once (once_differentiable): "
                               "differentiating them again (create_graph=True, then a backward through them) is "
                               "not supported; take higher derivatives with nf.grad inside the compiled function")

    def once(grads: tuple) -> tuple:
        """``grads`` as the backward returns them (None where an input takes none), marked by ``GradientsOnce``
        where the backward runs with grad mode on (``create_graph=True``)."""
        if not torch.is_grad_enabled():
            return grads
        at = [i for i, g in enumerate(grads) if g is not None]
        marked = GradientsOnce.apply(torch.zeros((), requires_grad=True), *(grads[i] for i in at))
        out = list(grads)
        for i, g in zip(at, marked):
            out[i] = g
        return tuple(out)

    class NnforgeCompiled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, call: _Call, *diff_tensors):  # the tensors torch tracks; their values are call.detached
            cf, treedef, detached, diff = call.cf, call.treedef, call.detached, call.diff
            halves = forward_half(cf, treedef, detached, diff)
            if halves is None:
                a, k = unflatten(treedef, detached)
                out_leaves, call.out_def = flatten(cf(*a, **k), _is_leaf)
                outs = [o if isinstance(o, torch.Tensor) else torch.as_tensor(np.asarray(o)) for o in out_leaves]
                ctx.backward_half = None
            else:
                outs, call.out_def, ctx.backward_half, read_back = halves
                ctx.save_for_backward(*[outs[i] for i in read_back])  # torch's check of in-place changes
            ctx.call = call
            ctx.mark_non_differentiable(*[o for o in outs if not o.is_floating_point()])
            ctx.shapes = [(o.shape, o.dtype, o.device) for o in outs]
            return tuple(outs)

        @staticmethod
        def backward(ctx, *grads):  # its gradients are results of a program: differentiating them again raises
            cts = [torch.zeros(s, dtype=d, device=dev) if g is None else g.detach().contiguous()
                   for g, (s, d, dev) in zip(grads, ctx.shapes) if d.is_floating_point]
            with torch.no_grad():
                if ctx.backward_half is not None:
                    _ = ctx.saved_tensors  # raises where a result the backward reads was changed in place since
                    grads = ctx.backward_half(cts)
                else:
                    call = ctx.call
                    pullback = call.cf.vjp_program(call.treedef, len(call.detached), call.diff)
                    grads = _whole_pullback(pullback, [*call.detached, *cts])
            return (None, *once(tuple(grads)))

    return NnforgeCompiled


def call_with_autograd(cf: CompiledFunction, args: tuple, kwargs: dict) -> Any:
    """``cf(*args, **kwargs)`` recorded by torch autograd (see the module docstring)."""
    import torch

    from ..compile import _flatten_call

    leaves, treedef = _flatten_call(args, kwargs)
    diff = tuple(i for i, v in enumerate(leaves)
                 if isinstance(v, torch.Tensor) and v.requires_grad and v.is_floating_point())
    detached = [v.detach() if isinstance(v, torch.Tensor) else v for v in leaves]
    if cf.loaded_from is not None and joint_key(treedef, len(detached), diff) not in cf._vjps:
        cf.vjp_program(treedef, len(detached), diff)  # a loaded program without its gradient says so now
    call = _Call(cf, treedef, detached, diff)
    outs = _autograd_function().apply(call, *[leaves[i] for i in diff])
    return unflatten(call.out_def, list(outs))

"""Compiled functions inside torch autograd.

A compiled function called with torch tensors that require grad returns tensors with a ``grad_fn``: a
``torch.autograd.Function`` whose forward runs the compiled program and whose backward runs the compiled VJP of
the same function (traced and built once per signature, like the forward), so ``loss.backward()`` in a torch
training loop reaches the inputs through an nnforge-compiled layer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..pytree import flatten, unflatten

if TYPE_CHECKING:
    from ..compile import CompiledFunction


def needs_autograd(leaves: Sequence[Any]) -> bool:
    """Whether torch records gradients for any of these arguments."""
    import torch

    return torch.is_grad_enabled() and any(isinstance(v, torch.Tensor) and v.requires_grad for v in leaves)


def vjp_function(fn: Callable, treedef: Any, n_leaves: int, diff: tuple[int, ...]) -> Callable:
    """``g(*leaves, *cotangents) -> grads of leaves[diff]``: the pullback of ``fn`` as a function of plain arrays,
    for ``nf.compile``."""
    from ..compile import _is_leaf
    from ..differentiate import vjp
    from ..tensor import as_tensor

    def pullback(*flat: Any) -> tuple:
        base, cts = list(flat[:n_leaves]), list(flat[n_leaves:])

        def outputs(*primals: Any) -> list:
            vals = list(base)
            for i, p in zip(diff, primals):
                vals[i] = p
            args, kwargs = unflatten(treedef, vals)
            outs = [as_tensor(o) for o in flatten(fn(*args, **kwargs), _is_leaf)[0]]
            return [o for o in outs if o.dtype.is_float]  # integer results carry no gradient

        _, back = vjp(outputs, *[base[i] for i in diff])
        return tuple(back(cts))

    return pullback


def call_with_autograd(cf: CompiledFunction, args: tuple, kwargs: dict) -> Any:
    """``cf(*args, **kwargs)`` recorded by torch autograd (see the module docstring)."""
    import torch

    from ..compile import _is_leaf, _is_static

    leaves, treedef = flatten((args, kwargs), lambda x: _is_leaf(x) or _is_static(x))
    diff = tuple(i for i, v in enumerate(leaves)
                 if isinstance(v, torch.Tensor) and v.requires_grad and v.is_floating_point())
    detached = [v.detach() if isinstance(v, torch.Tensor) else v for v in leaves]
    out_def: list = []
    if cf.loaded_from is not None:  # a loaded program without its gradient program says so now, not in backward
        cf.vjp_program(treedef, len(detached), diff)

    class NnforgeCompiled(torch.autograd.Function):  # grad_fn prints as NnforgeCompiledBackward
        @staticmethod
        def forward(ctx, *diff_tensors):  # the tensors torch tracks; their values come from ``detached``
            a, k = unflatten(treedef, detached)
            out_leaves, od = flatten(cf(*a, **k), _is_leaf)
            out_def.append(od)
            outs = [o if isinstance(o, torch.Tensor) else torch.as_tensor(np.asarray(o)) for o in out_leaves]
            ctx.mark_non_differentiable(*[o for o in outs if not o.is_floating_point()])
            ctx.shapes = [(o.shape, o.dtype) for o in outs]
            return tuple(outs)

        @staticmethod
        def backward(ctx, *grads):
            cts = [torch.zeros(s, dtype=d) if g is None else g.detach().contiguous()
                   for g, (s, d) in zip(grads, ctx.shapes) if d.is_floating_point]
            program = cf.vjp_program(treedef, len(detached), diff)
            return tuple(program(*detached, *cts))

    outs = NnforgeCompiled.apply(*[leaves[i] for i in diff])
    return unflatten(out_def[0], list(outs))

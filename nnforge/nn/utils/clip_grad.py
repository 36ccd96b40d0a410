"""Gradient clipping with torch.nn.utils' rules: ``clip_grad_norm_`` and ``clip_grad_value_``.

Both replace each parameter's ``.grad`` with the clipped one (nnforge tensors are values, so "in place" is a
new ``.grad``), eagerly and inside a compiled training step alike: a step that clips between ``backward`` and
``optimizer.step()`` stays one program.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ...errors import TraceError, at
from ...tensor import Tensor, stack, tensor
from ...trace import session


def _with_grads(parameters: Tensor | Iterable[Tensor]) -> list[Tensor]:
    ps = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    return [p for p in ps if p.grad is not None]


def _norm(g: Tensor, norm_type: float) -> Tensor:
    a = g.abs()
    if norm_type == math.inf:
        return a.max()
    if norm_type == 1.0:
        return a.sum()
    if norm_type == 2.0:
        return (g * g).sum().sqrt()
    return (a ** norm_type).sum() ** (1.0 / norm_type)


def clip_grad_norm_(parameters: Tensor | Iterable[Tensor], max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach: bool | None = None) -> Tensor:
    """Scale the gradients of ``parameters`` so that their joint ``norm_type``-norm (the norm of the per-tensor
    norms) is at most ``max_norm``, by ``min(1, max_norm / (norm + 1e-6))`` as torch does; returns that norm
    before clipping. Parameters without a gradient are skipped. ``error_if_nonfinite`` raises on a NaN or
    infinite norm, which needs its value: eagerly only (a compiled step cannot stop on a value). ``foreach``
    (torch's choice of kernels) is accepted and has no effect: the clipping is part of the step's program."""
    norm_type = float(norm_type)
    if not norm_type > 0:
        raise ValueError(f"clip_grad_norm_: norm_type must be positive (or inf), got {norm_type}")
    params = _with_grads(parameters)
    if not params:
        return tensor(0.0)
    dt = params[0].grad.dtype
    total = _norm(stack([_norm(p.grad, norm_type).cast(dt) for p in params]), norm_type)
    if error_if_nonfinite:
        if session().tracing:
            raise TraceError(at("clip_grad_norm_: error_if_nonfinite needs the norm's value, which a traced "
                                "function does not have; leave it False in compiled code"))
        if not math.isfinite(float(total.item())):
            raise RuntimeError(f"clip_grad_norm_: the total norm of order {norm_type} of the gradients is "
                               f"{float(total.item())}: not finite")
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for p in params:
        p.grad = p.grad * coef.cast(p.grad.dtype)
    return total


def clip_grad_value_(parameters: Tensor | Iterable[Tensor], clip_value: float, foreach: bool | None = None) -> None:
    """Clamp every gradient element of ``parameters`` to ``[-clip_value, clip_value]`` (``foreach``: as above)."""
    for p in _with_grads(parameters):
        p.grad = p.grad.clamp(-float(clip_value), float(clip_value))

"""Optimizers: SGD, Adam and AdamW with torch.optim's update rules.

Everything an optimizer carries between steps (momentum buffers, moment estimates, per-parameter step counters)
is created eagerly as tensors at construction and updated with ``assign``. That makes ``step()`` traceable:
inside ``nf.loop`` the buffers become loop state next to the parameters, and a compiled training step reads them
at call time and writes them back afterwards. Hyper-parameters are plain Python numbers read at trace time, so
changing ``lr`` affects eager steps at once but a compiled step only after it is traced again.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from .. import dtypes
from ..tensor import Tensor, maximum, where


class Optimizer:
    """Base class: parameter groups (lists of tensors with per-group options) and per-parameter state."""

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any]):
        self.defaults = dict(defaults)
        groups = list(params)
        if not groups:
            raise ValueError(f"{type(self).__name__}: got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.param_groups: list[dict[str, Any]] = []
        self.state: dict[int, dict[str, Tensor]] = {}
        seen: set[int] = set()
        for g in groups:
            group = {**self.defaults, **g, "params": list(g["params"])}
            for p in group["params"]:
                if not isinstance(p, Tensor):
                    raise TypeError(f"{type(self).__name__}: parameters must be nnforge tensors, got "
                                    f"{type(p).__name__}")
                if id(p) in seen:
                    raise ValueError(f"{type(self).__name__}: a parameter appears more than once")
                seen.add(id(p))
                self.state[id(p)] = self._init_state(p, group)
            self.param_groups.append(group)

    def _init_state(self, p: Tensor, group: dict[str, Any]) -> dict[str, Tensor]:
        return {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the gradients so the next ``backward`` starts from zero."""
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None if set_to_none or p.grad is None else p.grad * 0

    def step(self) -> None:
        """Update every parameter that has a gradient, in place. As in torch, a frozen parameter (one that does
        not require grad) is accepted and simply skipped: ``backward`` gives it no gradient."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, p.grad, self.state[id(p)], group)

    def _update(self, p: Tensor, grad: Tensor, state: dict[str, Tensor], group: dict[str, Any]) -> None:
        raise NotImplementedError


def _zeros_like(p: Tensor) -> Tensor:
    return Tensor(np.zeros(tuple(map(int, p.shape)), p.dtype.np))


def _counter() -> Tensor:
    return Tensor(np.array(0, np.int64))


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum (dampening, Nesterov) and L2 weight decay."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, maximize: bool = False):
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"SGD: lr, momentum and weight_decay must be non-negative, got {lr}, {momentum}, "
                             f"{weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: Nesterov momentum needs momentum > 0 and zero dampening")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov, maximize=maximize))

    def _init_state(self, p: Tensor, group: dict[str, Any]) -> dict[str, Tensor]:
        if not group["momentum"]:
            return {}
        state = {"momentum_buffer": _zeros_like(p)}
        if group["dampening"]:  # torch's first step copies the gradient undamped: we need to know which step
            state["step"] = _counter()
        return state

    def _update(self, p: Tensor, grad: Tensor, state: dict[str, Tensor], group: dict[str, Any]) -> None:
        g = -grad if group["maximize"] else grad
        if group["weight_decay"]:
            g = g + group["weight_decay"] * p
        mu = group["momentum"]
        if mu:
            buf = state["momentum_buffer"]
            new = buf * mu + g * (1.0 - group["dampening"])
            if "step" in state:
                new = where(state["step"] == 0, g, new)
                state["step"].assign(state["step"] + 1)
            buf.assign(new)
            g = g + new * mu if group["nesterov"] else new
        p.assign(p - g * group["lr"])


class Adam(Optimizer):
    """Adam with bias correction; ``weight_decay`` is L2 added to the gradient (see AdamW for decoupled decay)."""

    decoupled = False

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False, maximize: bool = False):
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"{type(self).__name__}: invalid hyper-parameters lr={lr}, betas={betas}, eps={eps}, "
                             f"weight_decay={weight_decay}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      amsgrad=amsgrad, maximize=maximize))

    def _init_state(self, p: Tensor, group: dict[str, Any]) -> dict[str, Tensor]:
        state = {"step": _counter(), "exp_avg": _zeros_like(p), "exp_avg_sq": _zeros_like(p)}
        if group["amsgrad"]:
            state["max_exp_avg_sq"] = _zeros_like(p)
        return state

    def _update(self, p: Tensor, grad: Tensor, state: dict[str, Tensor], group: dict[str, Any]) -> None:
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        g = -grad if group["maximize"] else grad
        param = p
        if wd and self.decoupled:
            param = p * (1.0 - lr * wd)
        elif wd:
            g = g + wd * p
        step = state["step"] + 1
        state["step"].assign(step)
        m = state["exp_avg"] * b1 + g * (1.0 - b1)
        v = state["exp_avg_sq"] * b2 + g * g * (1.0 - b2)
        state["exp_avg"].assign(m)
        state["exp_avg_sq"].assign(v)
        if group["amsgrad"]:
            v = maximum(state["max_exp_avg_sq"], v)
            state["max_exp_avg_sq"].assign(v)
        # Bias corrections in float64, as torch computes them on the host: 1 - 0.999**t loses digits in float32.
        t = step.cast(dtypes.float64)
        bc1 = (1.0 - b1 ** t).cast(p.dtype)
        bc2_sqrt = (1.0 - b2 ** t).sqrt().cast(p.dtype)
        p.assign(param - (m * lr / bc1) / (v.sqrt() / bc2_sqrt + eps))


class AdamW(Adam):
    """Adam with decoupled weight decay: the parameter shrinks by ``lr * weight_decay`` before the Adam step."""

    decoupled = True

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, maximize: bool = False):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize)

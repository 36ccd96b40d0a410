"""Optimizers: SGD, Adam and AdamW with torch.optim's update rules.

Everything an optimizer carries between steps (momentum buffers, moment estimates, per-parameter step counters)
is created eagerly as tensors at construction and updated with ``assign``. That makes ``step()`` traceable:
inside ``nf.loop`` the buffers become loop state next to the parameters, and a compiled training step reads them
at call time and writes them back afterwards. Hyper-parameters are plain Python numbers; a traced step reads each
group's ``lr`` through a ``HostValue``, so a compiled step reads the number at every call (a schedule changes it
between steps without tracing again), and bakes the others in.

``state_dict()`` / ``load_state_dict()`` use torch.optim's layout and state names, so a checkpoint resumes in
either library. Learning-rate schedules: ``lr_scheduler``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ... import dtypes
from ...interop.convert import to_numpy
from ...tensor import HostValue, Tensor, maximum, where
from ...trace import session


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
        self._host_lr: dict[tuple[int, dtypes.DType], HostValue] = {}  # (group, dtype) -> lr as traces read it
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
                self.state[id(p)] = _named(self._init_state(p, group), len(seen) - 1)
            self.param_groups.append(group)

    def _init_state(self, p: Tensor, group: dict[str, Any]) -> dict[str, Tensor]:
        return {}

    def _params(self) -> list[Tensor]:
        """Every parameter, group after group: the order of the state dict's indices."""
        return [p for group in self.param_groups for p in group["params"]]

    def __getstate__(self) -> dict[str, Any]:
        """State by position, not by ``id``: a copy's (``copy.deepcopy``, pickle) parameters are other objects.
        The learning rates' ``HostValue``s read this optimizer's groups: the copy makes its own."""
        state = {k: v for k, v in self.__dict__.items() if k != "_host_lr"}
        return {**state, "state": [self.state[id(p)] for p in self._params()]}

    def __setstate__(self, d: dict[str, Any]) -> None:
        states = d.pop("state")
        self.__dict__.update(d)
        self._host_lr = {}
        self.state = {id(p): s for p, s in zip(self._params(), states)}

    def state_dict(self) -> dict[str, Any]:
        """torch.optim's layout: ``state`` maps each parameter's index (group after group) to its state as numpy
        copies under torch's names; ``param_groups`` holds each group's options, its ``params`` as indices."""
        groups, first = [], 0
        for group in self.param_groups:
            n = len(group["params"])
            options = {k: v for k, v in group.items() if k != "params"}
            groups.append({**options, "params": list(range(first, first + n))})
            first += n
        state = {i: {k: t.numpy().copy() for k, t in self.state[id(p)].items()} for i, p in enumerate(self._params())}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load ``state_dict()``'s layout, from nnforge or from torch.optim (torch tensors or numpy arrays; a torch
        state's float ``step`` becomes a count): group options (keys this optimizer does not have are ignored,
        as torch's ``foreach`` or ``fused``) and each parameter's state, cast to its tensors' dtypes. A parameter
        without saved state starts afresh, as in torch. Every group size, name and shape is checked before
        anything is written, so a failed load leaves the optimizer untouched."""
        name = f"{type(self).__name__}.load_state_dict"
        saved_groups = list(state_dict["param_groups"])
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"{name}: the state dict has {len(saved_groups)} parameter groups, the optimizer "
                             f"{len(self.param_groups)}")
        saved_state = state_dict["state"]
        options: list[dict[str, Any]] = []
        values: list[tuple[Tensor, np.ndarray]] = []
        problems: list[str] = []
        for k, (group, saved) in enumerate(zip(self.param_groups, saved_groups)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(f"{name}: parameter group {k} has {len(saved['params'])} parameters in the state "
                                 f"dict, {len(group['params'])} in the optimizer")
            options.append({o: tuple(v) if isinstance(v, list) else v for o, v in saved.items()
                            if o in group and o != "params"})
            for index, p in zip(saved["params"], group["params"]):
                own = self.state[id(p)]
                fresh = self._init_state(p, {**group, **options[-1]})
                if set(fresh) != set(own):
                    changed = {o: v for o, v in options[-1].items() if group[o] != v}
                    problems.append(f"parameter group {k}'s options in the state dict ({changed}) keep the state "
                                    f"{sorted(fresh)}, the optimizer was built to keep {sorted(own)}: build it "
                                    "with those options")
                    continue
                entry = {o: v for o, v in self._loaded(dict(saved_state.get(index, {})), set(own)).items()
                         if v is not None}
                unknown = sorted(set(entry) - set(own))
                if unknown:
                    problems.append(f"parameter {index} has state {unknown} this optimizer does not keep (its "
                                    f"state: {sorted(own) or 'none'})")
                for o, t in own.items():
                    a = to_numpy(entry[o]) if o in entry else fresh[o].numpy()
                    if tuple(np.shape(a)) != tuple(map(int, t.shape)):
                        problems.append(f"size mismatch for parameter {index}'s {o!r}: the state dict has shape "
                                        f"{list(np.shape(a))}, the optimizer expects {list(map(int, t.shape))}")
                        continue
                    values.append((t, np.asarray(a).astype(t.dtype.np)))
        if problems:
            raise KeyError(f"{name}: " + "; ".join(problems))
        for group, opts in zip(self.param_groups, options):
            group.update(opts)
        for t, a in values:
            t._rebind(Tensor(a).node)  # re-bind, not assign: loading is not a traced in-place update

    def _loaded(self, entry: dict[str, Any], keeps: set[str]) -> dict[str, Any]:
        """A parameter's saved state as this optimizer keeps it (``keeps``: its names; torch's forms of it:
        ``SGD`` below)."""
        return entry

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the gradients so the next ``backward`` starts from zero."""
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None if set_to_none or p.grad is None else p.grad * 0

    def step(self) -> None:
        """Update every parameter that has a gradient, in place. As in torch, a frozen parameter (one that does
        not require grad) is accepted and simply skipped: ``backward`` gives it no gradient."""
        traced = session().tracing
        for k, group in enumerate(self.param_groups):
            for p in group["params"]:
                if p.grad is not None:
                    lr = group["lr"]
                    if traced and not isinstance(lr, Tensor):
                        lr = self._traced_lr(k, p.dtype)
                    self._update(p, p.grad, self.state[id(p)], {**group, "lr": lr})

    def _traced_lr(self, k: int, dtype: dtypes.DType) -> HostValue:
        """Group ``k``'s learning rate in ``dtype`` as a trace reads it: a number a compiled step reads at each
        call (rounded to ``dtype`` as a Python number in the update would be)."""
        if (k, dtype) not in self._host_lr:
            lr = self._host_lr[k, dtype] = HostValue(lambda group=self.param_groups[k]: group["lr"], dtype)
            lr.name = f"param_groups[{k}].lr"
        return self._host_lr[k, dtype].refresh()

    def _update(self, p: Tensor, grad: Tensor, state: dict[str, Tensor], group: dict[str, Any]) -> None:
        raise NotImplementedError


def _named(state: dict[str, Tensor], index: int) -> dict[str, Tensor]:
    """A parameter's state tensors named as torch's optimizer state dict keys them (``state[3].exp_avg``), so a
    saved training step's captured tensors say which is which."""
    for key, t in state.items():
        t.name = t.name or f"state[{index}].{key}"
    return state


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

    def _loaded(self, entry: dict[str, Any], keeps: set[str]) -> dict[str, Any]:
        """torch's SGD keeps no step count (kept here with dampening): its momentum buffer exists once a step
        was taken (None before)."""
        if "step" in keeps and "step" not in entry:
            entry["step"] = np.array(int(entry.get("momentum_buffer") is not None), np.int64)
        return entry

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


from . import lr_scheduler  # noqa: E402  (after Optimizer, which it reads)

"""Learning-rate schedules with torch.optim.lr_scheduler's interface and values.

A scheduler sets each parameter group's ``lr`` (a Python number) at ``step()``, once per epoch or per training
step, as torch's do; a compiled training step reads ``lr`` at every call (``Optimizer.step``), so a schedule
runs beside a compiled step without tracing it again. Each schedule is a closed form of the step count
(``lr_at``), which equals torch's chained updates up to rounding.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from typing import Any

from . import Optimizer


class LRScheduler:
    """Base class: ``step()`` advances ``last_epoch`` and sets every group's ``lr`` to ``lr_at(base, last_epoch)``
    of its ``initial_lr`` (recorded at construction, as torch records it). Built with ``last_epoch=-1`` it takes
    its first step at once, so the groups hold the epoch-0 rates."""

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1):
        self.optimizer = _nnforge_optimizer(self, optimizer)
        for k, group in enumerate(optimizer.param_groups):
            if last_epoch == -1:
                group.setdefault("initial_lr", group["lr"])
            elif "initial_lr" not in group:
                raise KeyError(f"{type(self).__name__}: param_groups[{k}] has no 'initial_lr', needed to resume at "
                               f"last_epoch={last_epoch}")
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self.step()

    def lr_at(self, k: int, base: float, epoch: int) -> float:
        """Group ``k``'s rate at ``epoch`` from its base rate."""
        raise NotImplementedError

    def step(self) -> None:
        self.last_epoch += 1
        for k, (group, base) in enumerate(zip(self.optimizer.param_groups, self.base_lrs)):
            group["lr"] = self.lr_at(k, base, self.last_epoch)
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def get_last_lr(self) -> list[float]:
        """The rates the groups hold after the last ``step()``."""
        return list(self._last_lr)

    def state_dict(self) -> dict[str, Any]:
        """Everything but the optimizer and functions (as torch's, to resume with ``load_state_dict``)."""
        return {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas", "schedulers")}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.__dict__.update(state_dict)


class LambdaLR(LRScheduler):
    """``base * lr_lambda(epoch)``: one function, or one per group (warm-up and decay shapes of one's own)."""

    def __init__(self, optimizer: Optimizer, lr_lambda: Callable[[int], float] | Sequence[Callable[[int], float]],
                 last_epoch: int = -1):
        n = len(optimizer.param_groups)
        self.lr_lambdas = list(lr_lambda) if isinstance(lr_lambda, (list, tuple)) else [lr_lambda] * n
        if len(self.lr_lambdas) != n:
            raise ValueError(f"LambdaLR: {len(self.lr_lambdas)} functions for {n} parameter groups")
        super().__init__(optimizer, last_epoch)

    def lr_at(self, k: int, base: float, epoch: int) -> float:
        return base * self.lr_lambdas[k](epoch)


class StepLR(LRScheduler):
    """``base * gamma ** (epoch // step_size)``."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1):
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, k: int, base: float, epoch: int) -> float:
        return base * self.gamma ** (epoch // self.step_size)


class MultiStepLR(LRScheduler):
    """``base * gamma ** (milestones passed)``."""

    def __init__(self, optimizer: Optimizer, milestones: Sequence[int], gamma: float = 0.1, last_epoch: int = -1):
        self.milestones, self.gamma = sorted(milestones), gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, k: int, base: float, epoch: int) -> float:
        return base * self.gamma ** bisect.bisect_right(self.milestones, epoch)


class ExponentialLR(LRScheduler):
    """``base * gamma ** epoch``."""

    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1):
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, k: int, base: float, epoch: int) -> float:
        return base * self.gamma ** epoch


class CosineAnnealingLR(LRScheduler):
    """From ``base`` down to ``eta_min`` along half a cosine over ``T_max`` epochs (and back up after, as
    torch's)."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1):
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def lr_at(self, k: int, base: float, epoch: int) -> float:
        return self.eta_min + (base - self.eta_min) * (1 + math.cos(math.pi * epoch / self.T_max)) / 2


class LinearLR(LRScheduler):
    """``base`` times a factor going linearly from ``start_factor`` to ``end_factor`` over ``total_iters``
    epochs, then staying (a warm-up)."""

    def __init__(self, optimizer: Optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0,
                 total_iters: int = 5, last_epoch: int = -1):
        if not (0 < start_factor <= 1 and 0 <= end_factor <= 1):
            raise ValueError(f"LinearLR: start_factor must be in (0, 1] and end_factor in [0, 1], got "
                             f"{start_factor}, {end_factor}")
        self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
        super().__init__(optimizer, last_epoch)

    def lr_at(self, k: int, base: float, epoch: int) -> float:
        done = min(epoch, self.total_iters) / self.total_iters
        return base * (self.start_factor + (self.end_factor - self.start_factor) * done)


class SequentialLR(LRScheduler):
    """``schedulers[i]`` from ``milestones[i - 1]`` on, each counting its epochs from where it starts (a warm-up
    then a decay). The schedulers must be built on the same optimizer; their own steps are not used."""

    def __init__(self, optimizer: Optimizer, schedulers: Sequence[LRScheduler], milestones: Sequence[int],
                 last_epoch: int = -1):
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(f"SequentialLR: {len(schedulers)} schedulers need {len(schedulers) - 1} milestones, got "
                             f"{len(milestones)}")
        if any(s.optimizer is not optimizer for s in schedulers):
            raise ValueError("SequentialLR: every scheduler must be built on the optimizer given")
        self.schedulers, self.milestones = list(schedulers), list(milestones)
        for group in optimizer.param_groups:  # each scheduler stepped once when built: start again from the base
            group["lr"] = group["initial_lr"]
        super().__init__(optimizer, last_epoch)

    def lr_at(self, k: int, base: float, epoch: int) -> float:
        i = bisect.bisect_right(self.milestones, epoch)
        start = self.milestones[i - 1] if i else 0
        return self.schedulers[i].lr_at(k, base, epoch - start)


def _nnforge_optimizer(scheduler: object, optimizer: Any) -> Optimizer:
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"{type(scheduler).__name__}: expected an nnforge optimizer, got {type(optimizer).__name__}")
    return optimizer


class ReduceLROnPlateau(LRScheduler):
    """Cut every group's rate by ``factor`` (down to ``min_lr``) once the metric given to ``step(metric)`` has not
    improved for more than ``patience`` steps, then wait ``cooldown`` steps; torch's rules of improvement
    (``mode`` "min" or "max", ``threshold`` relative or absolute) and of ``eps`` (smaller cuts are skipped). Not
    a closed form of the step count: it keeps its own state, and ``step`` takes the metric."""

    def __init__(self, optimizer: Optimizer, mode: str = "min", factor: float = 0.1, patience: int = 10,
                 threshold: float = 1e-4, threshold_mode: str = "rel", cooldown: int = 0,
                 min_lr: float | Sequence[float] = 0.0, eps: float = 1e-8):
        self.optimizer = _nnforge_optimizer(self, optimizer)
        if factor >= 1.0 or mode not in ("min", "max") or threshold_mode not in ("rel", "abs"):
            raise ValueError(f"ReduceLROnPlateau: needs factor < 1, mode 'min' or 'max' and threshold_mode 'rel' or "
                             f"'abs', got {factor}, {mode!r}, {threshold_mode!r}")
        n = len(optimizer.param_groups)
        self.min_lrs = list(min_lr) if isinstance(min_lr, (list, tuple)) else [min_lr] * n
        if len(self.min_lrs) != n:
            raise ValueError(f"ReduceLROnPlateau: {len(self.min_lrs)} min_lr values for {n} parameter groups")
        self.mode, self.factor, self.patience, self.cooldown, self.eps = mode, factor, patience, cooldown, eps
        self.threshold, self.threshold_mode = threshold, threshold_mode
        self.best = math.inf if mode == "min" else -math.inf
        self.num_bad_epochs = self.cooldown_counter = self.last_epoch = 0
        self._last_lr = [group["lr"] for group in optimizer.param_groups]

    def _is_better(self, value: float) -> bool:
        if self.mode == "min":
            bar = self.best * (1 - self.threshold) if self.threshold_mode == "rel" else self.best - self.threshold
            return value < bar
        bar = self.best * (1 + self.threshold) if self.threshold_mode == "rel" else self.best + self.threshold
        return value > bar

    def step(self, metric: Any) -> None:  # type: ignore[override]
        """One epoch's (or evaluation's) ``metric``: a number or a 0-d tensor."""
        value = float(metric.item() if hasattr(metric, "item") else metric)
        self.last_epoch += 1
        if self._is_better(value):
            self.best, self.num_bad_epochs = value, 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            for group, floor in zip(self.optimizer.param_groups, self.min_lrs):
                new = max(group["lr"] * self.factor, floor)
                if group["lr"] - new > self.eps:
                    group["lr"] = new
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

"""Learning-rate schedules against torch.optim.lr_scheduler: the rates of every step, two parameter groups, and a
compiled training step that follows one without tracing again."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from nn_testutil import mse_step

import nnforge as nf
import nnforge.nn as nn
from nnforge.nn.optim import lr_scheduler as ours


def _warmup_cosine(step: int) -> float:
    """Bonito's shape: a linear warm-up over 5 steps, then a cosine decay to a tenth."""
    return (step + 1) / 5 if step < 5 else 0.1 + 0.9 * (1 + math.cos(math.pi * (step - 5) / 20)) / 2


SCHEDULES = {
    "lambda": lambda lib, opt: lib.LambdaLR(opt, _warmup_cosine),
    "lambdas": lambda lib, opt: lib.LambdaLR(opt, [_warmup_cosine, lambda s: 0.9 ** s]),
    "step": lambda lib, opt: lib.StepLR(opt, step_size=4, gamma=0.5),
    "multistep": lambda lib, opt: lib.MultiStepLR(opt, milestones=[9, 3, 12], gamma=0.3),
    "exponential": lambda lib, opt: lib.ExponentialLR(opt, gamma=0.85),
    "cosine": lambda lib, opt: lib.CosineAnnealingLR(opt, T_max=10, eta_min=0.001),
    "linear": lambda lib, opt: lib.LinearLR(opt, start_factor=0.2, end_factor=0.9, total_iters=7),
    "sequential": lambda lib, opt: lib.SequentialLR(
        opt, [lib.LinearLR(opt, start_factor=0.1, total_iters=4), lib.CosineAnnealingLR(opt, T_max=12)], [4]),
}


def _groups(model) -> list[dict]:
    return [{"params": list(model[0].parameters())}, {"params": list(model[1].parameters()), "lr": 0.3}]


@pytest.mark.parametrize("name", SCHEDULES)
def test_the_rates_are_torchs(name: str) -> None:
    """Each schedule's rates at every step (the one set at construction and 24 more, past a cosine's T_max) for
    two groups of different base rates are torch's; so is ``get_last_lr()``."""
    t_model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    n_model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    t_opt = torch.optim.SGD(_groups(t_model), lr=0.1)
    n_opt = nn.optim.SGD(_groups(n_model), lr=0.1)
    t_sched, n_sched = SCHEDULES[name](torch.optim.lr_scheduler, t_opt), SCHEDULES[name](ours, n_opt)
    for step in range(25):
        want = [g["lr"] for g in t_opt.param_groups]
        np.testing.assert_allclose([g["lr"] for g in n_opt.param_groups], want, rtol=1e-12, err_msg=f"step {step}")
        np.testing.assert_allclose(n_sched.get_last_lr(), t_sched.get_last_lr(), rtol=1e-12)
        t_opt.step()
        t_sched.step()
        n_sched.step()


@pytest.mark.parametrize("kw", [dict(), dict(mode="max", threshold_mode="abs", threshold=0.05, patience=2,
                                          cooldown=2, factor=0.5, min_lr=[0.01, 0.02]),
                                 dict(patience=1, factor=0.3, min_lr=0.004, eps=1e-3)])
def test_reduce_on_plateau_is_torchs(kw: dict, rng: np.random.Generator) -> None:
    """The rates ``ReduceLROnPlateau`` sets from 40 metrics that improve, stall and wander are torch's."""
    t_model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    n_model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    t_opt = torch.optim.SGD(_groups(t_model), lr=0.1)
    n_opt = nn.optim.SGD(_groups(n_model), lr=0.1)
    t_sched = torch.optim.lr_scheduler.ReduceLROnPlateau(t_opt, **kw)
    n_sched = ours.ReduceLROnPlateau(n_opt, **kw)
    metrics = np.concatenate([np.linspace(1.0, 0.5, 8), np.full(10, 0.5), 0.5 + 0.02 * rng.standard_normal(22)])
    lrs = set()
    for m in metrics:
        t_sched.step(float(m))
        n_sched.step(nf.tensor(m))
        assert [g["lr"] for g in n_opt.param_groups] == pytest.approx([g["lr"] for g in t_opt.param_groups],
                                                                      rel=1e-12)
        assert n_sched.get_last_lr() == pytest.approx(t_sched.get_last_lr(), rel=1e-12)
        lrs.add(n_opt.param_groups[0]["lr"])
    assert len(lrs) > 1  # it cut


def test_a_schedule_resumes_from_its_state_dict() -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    opt = nn.optim.SGD(model.parameters(), lr=0.1)
    sched = ours.CosineAnnealingLR(opt, T_max=10)
    for _ in range(4):
        sched.step()
    saved = sched.state_dict()
    opt2 = nn.optim.SGD(model.parameters(), lr=0.1)
    sched2 = ours.CosineAnnealingLR(opt2, T_max=10)
    sched2.load_state_dict(saved)
    sched.step()
    sched2.step()
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"] and sched2.last_epoch == 5


def test_a_compiled_step_follows_a_schedule_without_tracing_again(backend: str, rng: np.random.Generator) -> None:
    """Warm-up and cosine decay (``LambdaLR``) stepped after each compiled Adam step: the parameters of the same
    loop run eagerly (float64), one trace."""
    nf.manual_seed(int(rng.integers(1 << 31)))
    runs = []
    for _ in range(2):
        model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)).to(nf.float64)
        opt = nn.optim.Adam(model.parameters(), lr=0.05)
        runs.append((model, opt, ours.LambdaLR(opt, _warmup_cosine)))
    runs[1][0].load_state_dict(runs[0][0].state_dict())

    compiled = nf.compile(mse_step(*runs[0][:2]), backend=backend)
    eager = mse_step(*runs[1][:2])
    for _ in range(8):
        x, y = rng.standard_normal((6, 3)), rng.standard_normal((6, 1))
        compiled(x, y)
        eager(nf.tensor(x), y)
        for _, _, sched in runs:
            sched.step()
    assert compiled.trace_count == 1
    for k, v in runs[1][0].state_dict().items():
        np.testing.assert_allclose(runs[0][0].state_dict()[k], v, rtol=1e-12, atol=1e-12, err_msg=k)


def test_scheduler_errors() -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    opt = nn.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match="expected an nnforge optimizer, got SGD"):
        ours.StepLR(torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1), step_size=2)
    with pytest.raises(ValueError, match="2 functions for 1 parameter groups"):
        ours.LambdaLR(opt, [lambda s: 1.0, lambda s: 1.0])
    with pytest.raises(ValueError, match="3 schedulers need 2 milestones, got 1"):
        ours.SequentialLR(opt, [ours.StepLR(opt, 2)] * 3, [2])
    with pytest.raises(KeyError, match="no 'initial_lr', needed to resume at last_epoch=4"):
        ours.StepLR(nn.optim.SGD(model.parameters(), lr=0.1), 2, last_epoch=4)

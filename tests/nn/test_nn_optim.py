"""Optimizers against torch.optim, and training steps run eagerly, compiled (nf.compile) and as an nf.loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from nn_testutil import randn

import nnforge as nf
import nnforge.nn as nn
import nnforge.nn.functional as F
from nnforge.nn import optim

# Several optimizer steps compound float32 rounding differences (and Adam divides by sqrt of small moments), so
# the parameter comparison allows a bit more than a single forward pass.
RTOL, ATOL = 2e-4, 2e-5

OPTIMIZERS = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.1, momentum=0.9)),
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("SGD", dict(lr=0.05, momentum=0.8, dampening=0.3)),
    ("SGD", dict(lr=0.05, maximize=True)),
    ("Adam", dict(lr=0.01)),
    ("Adam", dict(lr=0.01, betas=(0.8, 0.9), weight_decay=0.1, amsgrad=True)),
    ("AdamW", dict(lr=0.01)),
    ("AdamW", dict(lr=0.02, weight_decay=0.5, eps=1e-6)),
]


def _mlp(mod):
    return mod.Sequential(mod.Linear(4, 8), mod.Tanh(), mod.Linear(8, 2))


@pytest.mark.parametrize("name,kw", OPTIMIZERS, ids=[f"{n}{k}" for n, k in OPTIMIZERS])
def test_optimizer_matches_torch(name: str, kw: dict) -> None:
    rng = np.random.default_rng(50)
    t_model, n_model = _mlp(torch.nn), _mlp(nn)
    n_model.load_state_dict(t_model.state_dict())
    t_opt = getattr(torch.optim, name)(t_model.parameters(), **kw)
    n_opt = getattr(optim, name)(n_model.parameters(), **kw)
    for _ in range(4):
        x, y = randn(rng, 5, 4), randn(rng, 5, 2)
        t_opt.zero_grad()
        torch.nn.functional.mse_loss(t_model(torch.tensor(x)), torch.tensor(y)).backward()
        t_opt.step()
        n_opt.zero_grad()
        F.mse_loss(n_model(nf.tensor(x)), y).backward()
        n_opt.step()
    for k, v in t_model.state_dict().items():
        np.testing.assert_allclose(n_model.state_dict()[k], v.numpy(), rtol=RTOL, atol=ATOL, err_msg=k)
    if name != "SGD" or kw.get("momentum"):
        assert all(isinstance(s, nf.Tensor) for st in n_opt.state.values() for s in st.values())


def test_param_groups_and_skipped_params() -> None:
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    opt = optim.SGD([{"params": a.parameters()}, {"params": b.parameters(), "lr": 0.0}], lr=0.5)
    before_b = b.weight.numpy().copy()
    before_a_bias = a.bias.numpy().copy()
    a.weight.grad = nf.ones(2, 2)  # a.bias has no grad: it is skipped, as in torch
    b.weight.grad = nf.ones(2, 2)
    opt.step()
    np.testing.assert_array_equal(b.weight.numpy(), before_b)
    np.testing.assert_array_equal(a.bias.numpy(), before_a_bias)
    opt.zero_grad()
    assert a.weight.grad is None and b.weight.grad is None


def test_optimizer_argument_errors() -> None:
    m = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="empty"):
        optim.SGD([], lr=0.1)
    with pytest.raises(ValueError, match="more than once"):
        optim.Adam([m.weight, m.weight])
    with pytest.raises(ValueError, match="Nesterov"):
        optim.SGD(m.parameters(), lr=0.1, nesterov=True)


# ---- training steps: eager, compiled, looped ------------------------------------------------------------------

class _Tagger(nn.Module):
    """A tiny sequence model: conv front end, an LSTM, a linear head; trained with CTC."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(2, 6, 3, padding=1)
        self.norm = nn.BatchNorm1d(6)
        self.rnn = nn.LSTM(6, 8, num_layers=2, reverse=[True, False])
        self.head = nn.Linear(8, 4)

    def forward(self, x):                       # x [N, C, T]
        h = self.norm(self.conv(x)).relu()
        out, _ = self.rnn(h.permute(2, 0, 1))   # [T, N, H]
        return self.head(out).log_softmax(-1)


def _batch(seed: int):
    rng = np.random.default_rng(seed)
    x = randn(rng, 3, 2, 10)
    tg = rng.integers(1, 4, (3, 3))
    return x, tg, np.array([10, 9, 8]), np.array([3, 2, 3])


def _setup(seed: int):
    nf.manual_seed(seed)
    model = _Tagger()
    opt = optim.Adam(model.parameters(), lr=0.02)

    def train_step(x, tg, il, tl):
        opt.zero_grad()
        loss = F.ctc_loss(model(x), tg, il, tl)
        loss.backward()
        opt.step()
        return loss

    return model, opt, train_step


def test_compiled_training_step_matches_eager_and_learns() -> None:
    x, tg, il, tl = _batch(51)
    model_e, _, step_e = _setup(0)
    eager = [step_e(nf.tensor(x), tg, il, tl).item() for _ in range(5)]
    model_c, opt_c, step_c = _setup(0)
    compiled = nf.compile(step_c)
    losses = [float(compiled(x, tg, il, tl)) for _ in range(5)]
    assert compiled.trace_count == 1
    np.testing.assert_allclose(losses, eager, rtol=1e-4)
    assert losses[-1] < losses[0]
    for k, v in model_e.state_dict().items():  # parameters and BatchNorm running statistics
        np.testing.assert_allclose(model_c.state_dict()[k], v, rtol=1e-4, atol=1e-5, err_msg=k)
    assert int(model_c.norm.num_batches_tracked.item()) == 5
    assert all(int(st["step"].item()) == 5 for st in opt_c.state.values())


def test_nf_loop_training_matches_eager() -> None:
    x, tg, il, tl = _batch(52)
    model_e, _, step_e = _setup(1)
    eager = [step_e(nf.tensor(x), tg, il, tl).item() for _ in range(4)]
    model_l, _, step_l = _setup(1)
    xt = nf.tensor(x)
    seen = []
    nf.loop(4, lambda: nf.Receiver(lambda v: seen.append(float(v)), step_l(xt, tg, il, tl)))
    nf.execute()
    for k, v in model_e.state_dict().items():
        np.testing.assert_allclose(model_l.state_dict()[k], v, rtol=1e-4, atol=1e-5, err_msg=k)
    np.testing.assert_allclose(seen, eager, rtol=1e-4)
    assert eager[-1] < eager[0]

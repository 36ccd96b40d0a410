"""Optimizers against torch.optim, their checkpoints (state dicts, copies), and training steps run eagerly, compiled
(nf.compile) and as an nf.loop."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from nn_testutil import mse_step, randn

import nnforge as nf
import nnforge.nn as nn
import nnforge.nn.functional as F
from nnforge.errors import TraceError
from nnforge.nn import optim
from nnforge.torch import torch_optimizer_state

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


# ---- checkpoints -----------------------------------------------------------------------------------------------

def _steps(model, opt, rng: np.random.Generator, n: int, torch_side: bool) -> None:
    for _ in range(n):
        x, y = rng.standard_normal((5, 4)), rng.standard_normal((5, 2))
        opt.zero_grad()
        if torch_side:
            torch.nn.functional.mse_loss(model(torch.tensor(x)), torch.tensor(y)).backward()
        else:
            F.mse_loss(model(nf.tensor(x)), y).backward()
        opt.step()


@pytest.mark.parametrize("name,kw", OPTIMIZERS, ids=[f"{n}{k}" for n, k in OPTIMIZERS])
def test_a_torch_checkpoint_resumes_in_nnforge_and_back(name: str, kw: dict) -> None:
    """A torch model and optimizer trained three steps; their state dicts loaded into fresh nnforge ones (float64);
    three more steps each on the same batches: the same parameters (float64 rounding only). Then the nnforge
    optimizer's state dict loads into a fresh torch one, and two more steps each agree again."""
    rng = np.random.default_rng(53)
    torch.manual_seed(53)
    t_model = _mlp(torch.nn).double()
    t_opt = getattr(torch.optim, name)(t_model.parameters(), **kw)
    _steps(t_model, t_opt, rng, 3, torch_side=True)
    n_model = _mlp(nn).to(nf.float64)
    n_model.load_state_dict(t_model.state_dict())
    n_opt = getattr(optim, name)(n_model.parameters(), **{**kw, "lr": 123.0})  # the checkpoint's lr wins
    n_opt.load_state_dict(t_opt.state_dict())
    assert n_opt.param_groups[0]["lr"] == kw["lr"]
    for torch_side, (model, opt) in ((True, (t_model, t_opt)), (False, (n_model, n_opt))):
        _steps(model, opt, np.random.default_rng(54), 3, torch_side)
    for k, v in t_model.state_dict().items():
        np.testing.assert_allclose(n_model.state_dict()[k], v.numpy(), rtol=1e-12, atol=1e-12, err_msg=k)
    t_back = getattr(torch.optim, name)(t_model.parameters(), **kw)
    t_back.load_state_dict(torch_optimizer_state(n_opt))  # torch tensors, torch's step
    for torch_side, (model, opt) in ((True, (t_model, t_back)), (False, (n_model, n_opt))):
        _steps(model, opt, np.random.default_rng(55), 2, torch_side)
    for k, v in t_model.state_dict().items():
        np.testing.assert_allclose(n_model.state_dict()[k], v.numpy(), rtol=1e-12, atol=1e-12, err_msg=k)


def test_sgds_state_from_before_any_step_hands_torch_no_buffer() -> None:
    """torch starts a missing momentum buffer from the gradient, undamped; a zero buffer would damp that step."""
    torch.manual_seed(57)
    t_model = _mlp(torch.nn).double()
    n_model = _mlp(nn).to(nf.float64)
    n_model.load_state_dict(t_model.state_dict())
    kw = {"lr": 0.1, "momentum": 0.9, "dampening": 0.5}
    n_opt = optim.SGD(n_model.parameters(), **kw)
    t_opt = torch.optim.SGD(t_model.parameters(), **kw)
    t_opt.load_state_dict(torch_optimizer_state(n_opt))
    for torch_side, (model, opt) in ((True, (t_model, t_opt)), (False, (n_model, n_opt))):
        _steps(model, opt, np.random.default_rng(58), 2, torch_side)
    for k, v in t_model.state_dict().items():
        np.testing.assert_allclose(n_model.state_dict()[k], v.numpy(), rtol=1e-12, atol=1e-12, err_msg=k)


def test_a_checkpoint_resumes_a_compiled_training_step() -> None:
    """Five compiled steps, or two, a checkpoint (model and optimizer state dicts) loaded into a fresh model and
    optimizer, and three compiled steps there: the same parameters and optimizer state."""
    x, tg, il, tl = _batch(56)
    model_a, opt_a, step_a = _setup(2)
    step_a = nf.compile(step_a)
    for _ in range(5):
        step_a(x, tg, il, tl)
    model_b, opt_b, step_b = _setup(2)
    step_b = nf.compile(step_b)
    for _ in range(2):
        step_b(x, tg, il, tl)
    model_c, opt_c, step_c = _setup(3)  # other initial weights: all of it comes from the checkpoint
    step_c = nf.compile(step_c)
    step_c(x, tg, il, tl)  # compiled before the load: it reads the loaded state at call time
    model_c.load_state_dict(model_b.state_dict())
    opt_c.load_state_dict(opt_b.state_dict())
    for _ in range(3):
        step_c(x, tg, il, tl)
    for k, v in model_a.state_dict().items():
        np.testing.assert_allclose(model_c.state_dict()[k], v, rtol=1e-5, atol=1e-6, err_msg=k)
    theirs = opt_c.state_dict()["state"]
    for i, a in opt_a.state_dict()["state"].items():
        for k in a:
            np.testing.assert_allclose(theirs[i][k], a[k], rtol=1e-5, atol=1e-6, err_msg=f"{i} {k}")


def test_a_bad_checkpoint_is_refused_before_anything_is_written() -> None:
    model = _mlp(nn)
    opt = optim.Adam(model.parameters(), lr=0.1)
    good = opt.state_dict()
    before = opt.state_dict()
    two_groups = {**good, "param_groups": good["param_groups"] * 2}
    with pytest.raises(ValueError, match="2 parameter groups, the optimizer 1"):
        opt.load_state_dict(two_groups)
    short = {**good, "param_groups": [{**good["param_groups"][0], "params": [0, 1]}]}
    with pytest.raises(ValueError, match="group 0 has 2 parameters in the state dict, 4 in the optimizer"):
        opt.load_state_dict(short)
    bad = copy.deepcopy(good)
    bad["state"][0]["exp_avg"] = np.ones((3, 3), np.float32)
    bad["state"][1]["exp_avg_sq"] = np.ones((8,), np.float32) * 7
    bad["state"][3]["momentum_buffer"] = np.ones((2,), np.float32)
    bad["param_groups"][0]["lr"] = 5.0
    with pytest.raises(KeyError, match=r"parameter 0's 'exp_avg': the state dict has shape \[3, 3\], the optimizer "
                                       r"expects \[8, 4\].*parameter 3 has state \['momentum_buffer'\]"):
        opt.load_state_dict(bad)
    after = opt.state_dict()
    assert opt.param_groups[0]["lr"] == 0.1
    for i in before["state"]:
        for k in before["state"][i]:
            np.testing.assert_array_equal(after["state"][i][k], before["state"][i][k])
    amsgrad = {**good, "param_groups": [{**good["param_groups"][0], "amsgrad": True}]}
    with pytest.raises(KeyError, match=r"options in the state dict \(\{'amsgrad': True\}\) keep the state"):
        opt.load_state_dict(amsgrad)


def test_a_model_and_its_optimizer_copy_together() -> None:
    """``copy.deepcopy((model, opt))``: the copied optimizer steps the copied model's parameters from its own
    copy of the state; the originals stay as they were."""
    rng = np.random.default_rng(57)
    model = _mlp(nn)
    opt = optim.Adam(model.parameters(), lr=0.05)
    _steps(model, opt, rng, 2, torch_side=False)
    before = (model.state_dict(), opt.state_dict())
    model2, opt2 = copy.deepcopy((model, opt))
    assert opt2.param_groups[0]["params"][0] is model2[0].weight
    _steps(model2, opt2, np.random.default_rng(58), 2, torch_side=False)
    for k, v in before[0].items():
        np.testing.assert_array_equal(model.state_dict()[k], v)
    assert all(int(st["step"]) == 2 for st in opt.state_dict()["state"].values())
    assert all(int(st["step"]) == 4 for st in opt2.state_dict()["state"].values())
    reference = copy.deepcopy((model, opt))  # the same two steps from the original: equal to the copy's
    _steps(*reference, np.random.default_rng(58), 2, torch_side=False)
    for k, v in reference[0].state_dict().items():
        np.testing.assert_array_equal(model2.state_dict()[k], v)


def test_a_compiled_step_reads_the_learning_rate_at_each_call(backend: str, rng: np.random.Generator) -> None:
    """A schedule sets ``lr`` between compiled steps (per group, two groups): each call uses the number set, as
    the eager steps do, and the step is traced once."""
    torch.manual_seed(int(rng.integers(1 << 31)))
    twins = []
    for _ in range(2):
        model = _mlp(nn).to(nf.float64)
        opt = optim.Adam([{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": 0.3}], lr=0.1)
        twins.append((model, opt))
    twins[1][0].load_state_dict(twins[0][0].state_dict())

    compiled = nf.compile(mse_step(*twins[0]), backend=backend)
    eager = mse_step(*twins[1])
    for k in range(4):
        x, y = rng.standard_normal((5, 4)), rng.standard_normal((5, 2))
        for _, opt in twins:
            opt.param_groups[0]["lr"], opt.param_groups[1]["lr"] = 0.1 / (k + 1), 0.3 * 0.5 ** k
        compiled(x, y)
        eager(nf.tensor(x), y)
    assert compiled.trace_count == 1
    for k, v in twins[1][0].state_dict().items():
        np.testing.assert_allclose(twins[0][0].state_dict()[k], v, rtol=1e-12, atol=1e-12, err_msg=k)


# ---- gradient clipping -----------------------------------------------------------------------------------------

def _twins_with_grads(rng: np.random.Generator):
    """A float64 MLP in torch and nnforge with the same weights and gradients (the last bias without one)."""
    torch.manual_seed(int(rng.integers(1 << 31)))
    t_model, n_model = _mlp(torch.nn).double(), _mlp(nn).to(nf.float64)
    n_model.load_state_dict(t_model.state_dict())
    x, y = rng.standard_normal((5, 4)), rng.standard_normal((5, 2))
    torch.nn.functional.mse_loss(t_model(torch.tensor(x)), torch.tensor(y)).backward()
    F.mse_loss(n_model(nf.tensor(x)), y).backward()
    t_model[2].bias.grad = None
    n_model[2].bias.grad = None
    return t_model, n_model


@pytest.mark.parametrize("max_norm,norm_type", [(0.05, 2.0), (100.0, 2.0), (0.05, math.inf), (0.05, 1.0),
                                                (0.05, 3.0)])
def test_clip_grad_norm_matches_torch(rng: np.random.Generator, max_norm: float, norm_type: float) -> None:
    """The norm returned and the clipped gradients are torch's (clipping, or not where the norm is below
    ``max_norm``); a parameter without a gradient is skipped."""
    t_model, n_model = _twins_with_grads(rng)
    want = torch.nn.utils.clip_grad_norm_(t_model.parameters(), max_norm, norm_type)
    got = nn.utils.clip_grad_norm_(n_model.parameters(), max_norm, norm_type)
    np.testing.assert_allclose(got.item(), want.item(), rtol=1e-12)
    for (name, t), n in zip(t_model.named_parameters(), n_model.parameters()):
        if t.grad is None:
            assert n.grad is None, name
        else:
            np.testing.assert_allclose(n.grad.numpy(), t.grad.numpy(), rtol=1e-12, atol=1e-15, err_msg=name)


def test_clip_grad_value_matches_torch(rng: np.random.Generator) -> None:
    t_model, n_model = _twins_with_grads(rng)
    torch.nn.utils.clip_grad_value_(t_model.parameters(), 0.02)
    nn.utils.clip_grad_value_(n_model.parameters(), 0.02)
    clipped = 0
    for t, n in zip(t_model.parameters(), n_model.parameters()):
        if t.grad is not None:
            np.testing.assert_allclose(n.grad.numpy(), t.grad.numpy(), rtol=1e-12, atol=1e-15)
            clipped += int((t.grad.abs() == 0.02).sum())
    assert clipped  # some were clipped


def test_a_compiled_step_that_clips_matches_torch(backend: str, rng: np.random.Generator) -> None:
    """backward, clip_grad_norm_, Adam in one compiled step, three steps: the norms and parameters of torch's
    eager loop (float64)."""
    torch.manual_seed(int(rng.integers(1 << 31)))
    t_model = _mlp(torch.nn).double()
    n_model = _mlp(nn).to(nf.float64)
    n_model.load_state_dict(t_model.state_dict())
    t_opt = torch.optim.Adam(t_model.parameters(), lr=0.05)
    n_opt = optim.Adam(n_model.parameters(), lr=0.05)

    @nf.compile(backend=backend)
    def step(x, y):
        n_opt.zero_grad()
        F.mse_loss(n_model(x), y).backward()
        norm = nn.utils.clip_grad_norm_(n_model.parameters(), 0.1)
        n_opt.step()
        return norm

    norms = []
    for _ in range(3):
        x, y = rng.standard_normal((5, 4)), rng.standard_normal((5, 2))
        t_opt.zero_grad()
        torch.nn.functional.mse_loss(t_model(torch.tensor(x)), torch.tensor(y)).backward()
        want = torch.nn.utils.clip_grad_norm_(t_model.parameters(), 0.1)
        t_opt.step()
        np.testing.assert_allclose(float(step(x, y)), want.item(), rtol=1e-10)
        norms.append(want.item())
    assert max(norms) > 0.1  # it clipped
    for k, v in t_model.state_dict().items():
        np.testing.assert_allclose(n_model.state_dict()[k], v.numpy(), rtol=1e-10, atol=1e-12, err_msg=k)


def test_clipping_errors_and_no_gradients() -> None:
    model = _mlp(nn)
    assert nn.utils.clip_grad_norm_(model.parameters(), 1.0).item() == 0.0  # no gradients yet
    model[0].weight.grad = nf.full((8, 4), math.inf)
    with pytest.raises(RuntimeError, match=r"total norm of order 2\.0 of the gradients is inf"):
        nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)
    with pytest.raises(ValueError, match="norm_type must be positive"):
        nn.utils.clip_grad_norm_(model.parameters(), 1.0, norm_type=0)

    @nf.compile
    def step(x):
        model.zero_grad()
        model(x).sum().backward()
        return nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)

    with pytest.raises(TraceError, match="error_if_nonfinite needs the norm's value"):
        step(np.ones((2, 4), np.float32))


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

"""Frozen parameters (``p.requires_grad = False`` and ``requires_grad_(False)`` alike) eagerly and compiled,
and optimizers given frozen parameters."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import nnforge as nf
import nnforge.nn as nn
from nnforge.nn import optim

# A few float32 optimizer steps on both sides, summed in different orders: ~100s of ulps.
RTOL, ATOL = 2e-4, 2e-5


def _mlp(mod):
    return mod.Sequential(mod.Linear(4, 6), mod.Tanh(), mod.Linear(6, 3))


def _freeze(p, how: str) -> None:
    if how == "attribute":
        p.requires_grad = False
    else:
        p.requires_grad_(False)


@pytest.mark.parametrize("how", ["attribute", "method"])
def test_frozen_parameter_gets_no_grad_eagerly(rng, how):
    t_model, n_model = _mlp(torch.nn), _mlp(nn)
    n_model.load_state_dict(t_model.state_dict())
    _freeze(n_model[0].bias, how)
    t_model[0].bias.requires_grad = False
    x = rng.standard_normal((5, 4)).astype(np.float32)
    (n_model(nf.tensor(x)) ** 2).sum().backward()
    (t_model(torch.tensor(x)) ** 2).sum().backward()
    assert n_model[0].bias.grad is None and not n_model[0].bias.requires_grad
    for name, tp in t_model.named_parameters():
        if tp.requires_grad:
            np.testing.assert_allclose(dict(n_model.named_parameters())[name].grad.numpy(), tp.grad.numpy(),
                                       rtol=RTOL, atol=ATOL, err_msg=name)


def test_requires_grad_on_an_int_tensor_is_refused():
    t = nf.tensor(np.arange(3))
    with pytest.raises(nf.DTypeError, match=r"only float tensors can require gradients, got nf\.int64"):
        t.requires_grad = True


@pytest.mark.parametrize("how", ["attribute", "method"])
def test_compiled_step_retraces_when_a_parameter_is_frozen_and_unfrozen(backend, rng, how):
    """Three compiled AdamW steps, the first layer's weight frozen after the first and unfrozen after the second:
    each change traces again, and every parameter follows torch doing the same (AdamW's weight decay included:
    a frozen parameter is skipped whole, as torch skips a parameter without a gradient)."""
    t_model, n_model = _mlp(torch.nn), _mlp(nn)
    n_model.load_state_dict(t_model.state_dict())
    t_opt = torch.optim.AdamW(t_model.parameters(), lr=0.05, weight_decay=0.1)
    n_opt = optim.AdamW(n_model.parameters(), lr=0.05, weight_decay=0.1)

    @nf.compile(backend=backend)
    def step(x):
        n_opt.zero_grad()
        loss = (n_model(x) ** 2).mean()
        loss.backward()
        n_opt.step()
        return loss

    xs = [rng.standard_normal((5, 4)).astype(np.float32) for _ in range(3)]
    frozen_value = None
    for k, x in enumerate(xs):
        if k == 1:
            _freeze(n_model[0].weight, how)
            t_model[0].weight.requires_grad = False
            frozen_value = n_model[0].weight.numpy().copy()
        if k == 2:
            n_model[0].weight.requires_grad = True
            t_model[0].weight.requires_grad = True
        t_opt.zero_grad(set_to_none=True)
        t_loss = (t_model(torch.tensor(x)) ** 2).mean()
        t_loss.backward()
        t_opt.step()
        np.testing.assert_allclose(step(x), t_loss.item(), rtol=RTOL, atol=ATOL)
        if k == 1:
            np.testing.assert_array_equal(n_model[0].weight.numpy(), frozen_value)
    assert step.trace_count == 3
    for name, tp in t_model.named_parameters():
        np.testing.assert_allclose(dict(n_model.named_parameters())[name].numpy(), tp.detach().numpy(),
                                   rtol=RTOL, atol=ATOL, err_msg=name)


def test_module_requires_grad_matches_the_attribute(backend, rng):
    """``Module.requires_grad_(False)`` on a sub-module is the same as setting the attribute on its parameters:
    compiled gradients of the whole model leave those out."""
    model = _mlp(nn)
    model[2].requires_grad_(False)
    assert all(not p.requires_grad for p in model[2].parameters())
    x = rng.standard_normal((5, 4)).astype(np.float32)

    @nf.compile(backend=backend)
    def grads(x):
        (model(x) ** 2).sum().backward()
        return [p.grad for p in model.parameters() if p.grad is not None]

    assert len(grads(x)) == 2
    assert model[2].weight.grad is None


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW"])
def test_optimizers_accept_and_skip_frozen_parameters(backend, rng, name):
    t_model, n_model = _mlp(torch.nn), _mlp(nn)
    n_model.load_state_dict(t_model.state_dict())
    n_model[2].bias.requires_grad = False
    t_model[2].bias.requires_grad = False
    kw = dict(lr=0.1, weight_decay=0.2) if name != "SGD" else dict(lr=0.1, momentum=0.9, weight_decay=0.2)
    t_opt, n_opt = getattr(torch.optim, name)(t_model.parameters(), **kw), getattr(optim, name)(
        n_model.parameters(), **kw)

    @nf.compile(backend=backend)
    def step(x):
        n_opt.zero_grad()
        (n_model(x) ** 2).mean().backward()
        n_opt.step()

    for _ in range(2):
        x = rng.standard_normal((5, 4)).astype(np.float32)
        t_opt.zero_grad()
        (t_model(torch.tensor(x)) ** 2).mean().backward()
        t_opt.step()
        step(x)
    for pname, tp in t_model.named_parameters():
        np.testing.assert_allclose(dict(n_model.named_parameters())[pname].numpy(), tp.detach().numpy(),
                                   rtol=RTOL, atol=ATOL, err_msg=pname)


def test_new_values_loaded_into_a_frozen_parameter_reach_a_compiled_function(backend, rng):
    """A frozen parameter is baked into a trace; loading a checkpoint into it afterwards makes the compiled
    function trace again and compute with the loaded values, not the ones it baked in."""
    model = _mlp(nn)
    model[0].weight.requires_grad = False
    f = nf.compile(lambda x: model(x), backend=backend)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    f(x)
    sd = {k: v + rng.standard_normal(v.shape).astype(np.float32) for k, v in model.state_dict().items()}
    model.load_state_dict(sd)
    np.testing.assert_allclose(np.asarray(f(x)), model(nf.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)
    assert f.trace_count == 2
    f(x)
    assert f.trace_count == 2
    model.load_state_dict(sd | {"0.weight": sd["0.weight"] * 2})  # once more: read at call time by now
    np.testing.assert_allclose(np.asarray(f(x)), model(nf.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)
    assert f.trace_count == 2

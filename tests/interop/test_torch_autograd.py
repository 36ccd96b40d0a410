"""Compiled functions inside torch autograd: grad_fn on results, gradients equal to torch's own, the compiled
VJP built once per signature, and an nnforge module trained by a torch loop step by step like its torch twin."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import nnforge as nf
import nnforge.nn as nn
from nnforge.errors import NNForgeError
from nnforge.torch import TorchModule


def _lstm(x, h0, c0, w_ih, w_hh, b):
    def step(carry, x_t):
        h, c = carry
        i, f, g, o = (x_t @ w_ih.T + h @ w_hh.T + b).chunk(4, axis=-1)
        c = nf.sigmoid(f) * c + nf.sigmoid(i) * nf.tanh(g)
        h = nf.sigmoid(o) * nf.tanh(c)
        return (h, c), h

    (h, c), ys = nf.scan(step, (h0, c0), x)
    return ys, (h, c)


def test_results_carry_a_grad_fn_and_torch_gradients_match(backend: str, rng: np.random.Generator) -> None:
    torch.manual_seed(int(rng.integers(1 << 31)))
    f = nf.compile(_lstm, backend=backend)
    ref = torch.nn.LSTM(4, 6, dtype=torch.float64)
    params = (ref.weight_ih_l0, ref.weight_hh_l0, ref.bias_ih_l0, ref.bias_hh_l0)
    for T in (5, 5, 9):  # a new length without tracing again, the forward and its vjp (x and ys: one length)
        x = torch.randn(T, 3, 4, dtype=torch.float64, requires_grad=True)
        h0 = torch.randn(3, 6, dtype=torch.float64)
        c0 = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
        ys, (h, _) = f(x, h0, c0, params[0], params[1], params[2] + params[3])
        assert ys.grad_fn is not None and h.grad_fn is not None
        (ys.square().sum() + (h * 0.5).sum()).backward()
        ours = [t.grad.clone() for t in (x, c0, *params)]
        for t in (x, c0, *params):
            t.grad = None
        ys2, (h2, _) = ref(x, (h0[None], c0[None]))
        (ys2.square().sum() + (h2[0] * 0.5).sum()).backward()
        for a, b in zip(ours, [t.grad for t in (x, c0, *params)]):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        for t in (x, c0, *params):
            t.grad = None
    assert f.trace_count == 1
    (vjp,) = f._vjps.values()
    assert vjp.trace_count == 1


def test_no_grad_and_integer_outputs(backend: str) -> None:
    f = nf.compile(lambda x: ((x * 2).sum(), (x > 0).sum()), backend=backend)
    x = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    with torch.no_grad():
        s, n = f(x)
    assert s.grad_fn is None
    s, n = f(x)
    assert not n.requires_grad and n.item() == 2
    s.backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_torch_training_loop_with_a_compiled_nnforge_layer_matches_the_torch_loop(
        backend: str, dtype: torch.dtype, rng: np.random.Generator) -> None:
    torch.manual_seed(int(rng.integers(1 << 31)))
    I, H, T, N = 4, 8, 6, 3
    twin = torch.nn.LSTM(I, H, num_layers=2, dtype=dtype)
    head = torch.nn.Linear(H, 2, dtype=dtype)
    ours = torch.nn.Sequential(TorchModule(nn.LSTM(I, H, num_layers=2).to(nf.float64 if dtype == torch.float64
                                                                           else nf.float32), twin, backend=backend),
                               _First(), head)
    theirs = torch.nn.Sequential(copy.deepcopy(twin), _First(), copy.deepcopy(head))
    opts = [torch.optim.Adam(m.parameters(), lr=1e-2) for m in (ours, theirs)]
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    for _ in range(4):
        x, y = torch.randn(T, N, I, dtype=dtype), torch.randn(T, N, 2, dtype=dtype)
        losses = []
        for model, opt in zip((ours, theirs), opts):
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[0] == pytest.approx(losses[1], rel=tol)
        for a, b in zip(ours.parameters(), theirs.parameters()):
            torch.testing.assert_close(a, b, rtol=tol, atol=tol)


class _First(torch.nn.Module):
    def forward(self, out):
        return out[0]


def test_a_twin_that_does_not_fit_is_refused() -> None:
    with pytest.raises(NNForgeError, match=r"parameter 'weight_ih_l0' is \[24, 4\] in the twin and \[32, 4\]"):
        TorchModule(nn.LSTM(4, 8), torch.nn.LSTM(4, 6))
    with pytest.raises(NNForgeError, match="no parameter 'weight_ih_l0'"):
        TorchModule(nn.LSTM(4, 8), torch.nn.Linear(4, 8))

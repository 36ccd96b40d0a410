"""Shared helpers for the nnforge.nn tests: run an nnforge module and its torch twin on the same weights."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

import nnforge as nf

# float32 tolerances: both sides compute the same math in float32 but sum in different orders (blocked BLAS vs
# numpy), and errors compound through recurrences and softmaxes; 1e-4 relative / 1e-5 absolute is a few hundred
# float32 ulps, far below any real bug (a wrong gate or a missing term shows up as O(1e-1) differences).
RTOL, ATOL = 1e-4, 1e-5


def leaves(x: Any) -> list:
    """Tensors in a nested tuple/list output (None entries dropped), in order."""
    if x is None:
        return []
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in leaves(v)]
    return [x]


def compare_with_torch(nf_mod: nf.nn.Module, t_mod: torch.nn.Module, inputs: Sequence[np.ndarray],
                       call: Callable[..., Any] | None = None, seed: int = 0, rtol: float = RTOL,
                       atol: float = ATOL, grad_inputs: bool = True) -> None:
    """Load torch's weights, run both, and compare outputs, every parameter gradient and the input gradients.

    The scalar that is differentiated is sum_i <out_i, w_i> with random w_i, so every output element gets a
    distinct, non-trivial cotangent.
    """
    call = call or (lambda m, *xs: m(*xs))
    nf_mod.load_state_dict(t_mod.state_dict())
    float_in = [np.asarray(a).dtype.kind == "f" and grad_inputs for a in inputs]
    t_in = [torch.tensor(a, requires_grad=f) for a, f in zip(inputs, float_in)]
    n_in = [nf.tensor(a, requires_grad=f) for a, f in zip(inputs, float_in)]
    t_out, n_out = leaves(call(t_mod, *t_in)), leaves(call(nf_mod, *n_in))
    assert len(t_out) == len(n_out), (len(t_out), len(n_out))
    rng = np.random.default_rng(seed)
    weights = [rng.standard_normal(tuple(o.shape)).astype(np.float32) for o in t_out]
    t_loss = sum((o * torch.tensor(w, dtype=o.dtype)).sum() for o, w in zip(t_out, weights))
    n_loss = sum((o * nf.tensor(w, dtype=o.dtype)).sum() for o, w in zip(n_out, weights))
    t_loss.backward()
    n_loss.backward()
    for i, (a, b) in enumerate(zip(n_out, t_out)):
        np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=rtol, atol=atol, err_msg=f"output {i}")
    n_params = dict(nf_mod.named_parameters())
    t_params = dict(t_mod.named_parameters())
    assert n_params.keys() == t_params.keys()
    for name, tp in t_params.items():
        assert n_params[name].grad is not None, f"no gradient for {name}"
        np.testing.assert_allclose(n_params[name].grad.numpy(), tp.grad.numpy(), rtol=rtol, atol=atol,
                                   err_msg=f"gradient of {name}")
    for i, (a, b, f) in enumerate(zip(n_in, t_in, float_in)):
        if f:
            np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=rtol, atol=atol,
                                       err_msg=f"gradient of input {i}")


def randn(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def mse_step(model: nf.nn.Module, opt: Any) -> Callable[[Any, Any], None]:
    """A training step of ``model`` on a mean squared error, ``opt`` stepping it: to compile, or run eagerly."""
    def step(x: Any, y: Any) -> None:
        opt.zero_grad()
        nf.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    return step

"""nn.Embedding as a gather on every backend: values and the weight's gradient (a scatter-add, repeated indices
adding up, the padding row frozen) against torch."""

from __future__ import annotations

import numpy as np
import torch

import nnforge as nf
import nnforge.nn as nn


def test_embedding_forward_and_weight_gradient_match_torch(backend: str, rng: np.random.Generator) -> None:
    ours, theirs = nn.Embedding(7, 5, padding_idx=2).double(), torch.nn.Embedding(7, 5, padding_idx=2).double()
    ours.load_state_dict(theirs.state_dict())
    idx = rng.integers(0, 7, (4, 6))
    idx[0, :3] = 3  # a repeated index: its gradient rows add up
    idx[1, 0] = 2
    ct = rng.standard_normal((4, 6, 5))

    @nf.compile(backend=backend)
    def step(i):
        ours.weight.grad = None
        out = ours(i)
        (out * ct).sum().backward()
        return out, ours.weight.grad

    out, grad = step(idx)
    want = theirs(torch.from_numpy(idx))
    (want * torch.from_numpy(ct)).sum().backward()
    np.testing.assert_allclose(out, want.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(grad, theirs.weight.grad.numpy(), rtol=1e-12, atol=1e-12)
    assert (grad[2] == 0).all() and np.abs(grad[3]).sum() > 0

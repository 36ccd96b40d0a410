"""nn.Conv1d on every backend, in both of its product forms (``weight @ columns`` per sequence below
``CHANNELS_AS_COLUMNS`` output channels, ``columns @ weightᵀ`` with a row per position from it on): outputs and
the gradients of weight, bias and input against torch, with swish and the [N, C, T] -> [T, N, C] permute of a
basecaller's front end after it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import nnforge as nf
import nnforge.nn as nn
import nnforge.nn.functional as F


@pytest.mark.parametrize("c_in,c_out,k,stride,padding,dilation", [
    (3, 5, 5, 1, 2, 1),
    (4, F.CHANNELS_AS_COLUMNS, 5, 3, 2, 1),
    (2, F.CHANNELS_AS_COLUMNS + 3, 4, 2, 3, 2),
])
def test_conv1d_matches_torch(backend: str, rng: np.random.Generator, c_in: int, c_out: int, k: int, stride: int,
                              padding: int, dilation: int) -> None:
    kw = dict(stride=stride, padding=padding, dilation=dilation)
    ours, theirs = nn.Conv1d(c_in, c_out, k, **kw).double(), torch.nn.Conv1d(c_in, c_out, k, **kw).double()
    ours.load_state_dict(theirs.state_dict())
    x = rng.standard_normal((2, c_in, 17))
    t_out = (x.shape[-1] + 2 * padding - dilation * (k - 1) - 1) // stride + 1
    ct = rng.standard_normal((t_out, 2, c_out))

    @nf.compile(backend=backend)
    def step(x):
        ours.zero_grad()
        x = nf.tensor(x, requires_grad=True)
        out = nf.silu(ours(x)).permute(2, 0, 1)
        (out * ct).sum().backward()
        return out, ours.weight.grad, ours.bias.grad, x.grad

    got = step(x)
    tx = torch.tensor(x, requires_grad=True)
    want = torch.nn.functional.silu(theirs(tx)).permute(2, 0, 1)
    (want * torch.from_numpy(ct)).sum().backward()
    for name, a, b in zip(("output", "weight", "bias", "input"), got,
                          (want.detach(), theirs.weight.grad, theirs.bias.grad, tx.grad)):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-10, atol=1e-12, err_msg=name)

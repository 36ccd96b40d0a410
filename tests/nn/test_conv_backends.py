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


@pytest.mark.parametrize("c_in,c_out,k,stride,padding,output_padding,groups,dilation", [
    (3, 5, 4, 2, 1, 0, 1, 1),       # an upsampling by 2
    (4, 6, 3, 3, 0, 2, 2, 1),       # groups, output_padding
    (2, 4, 3, 1, 3, 0, 2, 2),       # more padding than the kernel's span: its ends cut off
    (2, F.CHANNELS_AS_COLUMNS, 5, 5, 2, 4, 1, 1),  # the product with a row per position
])
def test_conv_transpose1d_matches_torch(backend: str, rng: np.random.Generator, c_in: int, c_out: int, k: int,
                                        stride: int, padding: int, output_padding: int, groups: int,
                                        dilation: int) -> None:
    """nn.ConvTranspose1d: outputs and the gradients of weight, bias and input against torch's, in float64; and
    ``output_size`` choosing the output padding, or refused where no padding reaches it."""
    kw = dict(stride=stride, padding=padding, output_padding=output_padding, groups=groups, dilation=dilation)
    ours = nn.ConvTranspose1d(c_in, c_out, k, **kw).double()
    theirs = torch.nn.ConvTranspose1d(c_in, c_out, k, **kw).double()
    ours.load_state_dict(theirs.state_dict())
    x = rng.standard_normal((2, c_in, 7))
    t_out = (7 - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1
    ct = rng.standard_normal((2, c_out, t_out))

    @nf.compile(backend=backend)
    def step(x):
        ours.zero_grad()
        x = nf.tensor(x, requires_grad=True)
        out = ours(x)
        (out * ct).sum().backward()
        return out, ours.weight.grad, ours.bias.grad, x.grad

    got = step(x)
    tx = torch.tensor(x, requires_grad=True)
    want = theirs(tx)
    (want * torch.from_numpy(ct)).sum().backward()
    for name, a, b in zip(("output", "weight", "bias", "input"), got,
                          (want.detach(), theirs.weight.grad, theirs.bias.grad, tx.grad)):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-10, atol=1e-12, err_msg=name)
    size = t_out - output_padding + stride - 1
    np.testing.assert_allclose(ours(x, output_size=[size]).numpy(),
                               theirs(torch.tensor(x), output_size=[size]).detach().numpy(), rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match=rf"output_size {size + 1} is not reachable from an input of length 7"):
        ours(x, output_size=[size + 1])

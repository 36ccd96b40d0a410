"""Feed-forward layers against their torch twins: outputs, parameter gradients and input gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from nn_testutil import ATOL, RTOL, compare_with_torch, randn

import nnforge as nf
import nnforge.nn as nn
import nnforge.nn.functional as F


@pytest.mark.parametrize("bias", [True, False])
def test_linear(bias: bool) -> None:
    rng = np.random.default_rng(10)
    compare_with_torch(nn.Linear(5, 3, bias=bias), torch.nn.Linear(5, 3, bias=bias), [randn(rng, 2, 4, 5)])


@pytest.mark.parametrize("kw", [
    dict(),
    dict(stride=2, padding=1),
    dict(padding=2, dilation=2),
    dict(groups=2, bias=False),
    dict(stride=3, padding=2, dilation=2, groups=2),
    dict(padding="same", dilation=2),
    dict(padding=2, padding_mode="reflect"),
    dict(stride=2, padding=1, padding_mode="replicate"),
    dict(padding="same", dilation=3, padding_mode="circular"),
])
def test_conv1d(kw: dict) -> None:
    rng = np.random.default_rng(11)
    args = (4, 6, 3)
    compare_with_torch(nn.Conv1d(*args, **kw), torch.nn.Conv1d(*args, **kw), [randn(rng, 2, 4, 11)])


def test_conv1d_unbatched_and_kernel_one() -> None:
    rng = np.random.default_rng(12)
    compare_with_torch(nn.Conv1d(3, 5, 1), torch.nn.Conv1d(3, 5, 1), [randn(rng, 3, 7)])


def test_conv1d_unbatched_with_a_row_per_position() -> None:
    """From ``CHANNELS_AS_COLUMNS`` output channels on (the channels-last product), unbatched and 'same'."""
    rng = np.random.default_rng(14)
    args = (3, nn.functional.CHANNELS_AS_COLUMNS, 4)
    compare_with_torch(nn.Conv1d(*args, padding="same", dilation=2), torch.nn.Conv1d(*args, padding="same", dilation=2),
                       [randn(rng, 3, 9)])


def test_conv1d_errors() -> None:
    with pytest.raises(nf.ShapeError, match="channels"):
        nn.Conv1d(4, 2, 3)(nf.zeros(1, 3, 9))
    with pytest.raises(nf.ShapeError, match="shorter"):
        nn.Conv1d(1, 1, 5)(nf.zeros(1, 1, 3))
    with pytest.raises(ValueError, match="padding_mode must be one of zeros, reflect, replicate, circular"):
        nn.Conv1d(1, 1, 3, padding_mode="mirror")


@pytest.mark.parametrize("shape", [(6,), (3, 6)])
def test_layer_norm(shape: tuple) -> None:
    rng = np.random.default_rng(13)
    t_mod = torch.nn.LayerNorm(shape)
    with torch.no_grad():  # non-trivial affine parameters
        t_mod.weight.copy_(torch.tensor(randn(rng, *shape)))
        t_mod.bias.copy_(torch.tensor(randn(rng, *shape)))
    compare_with_torch(nn.LayerNorm(shape), t_mod, [randn(rng, 2, 3, 6, scale=3.0)])


@pytest.mark.parametrize("shape", [(8, 4), (5, 4, 3)])
@pytest.mark.parametrize("momentum", [0.1, None])
def test_batch_norm_train_then_eval(shape: tuple, momentum: float | None) -> None:
    rng = np.random.default_rng(14)
    t_mod, n_mod = torch.nn.BatchNorm1d(4, momentum=momentum), nn.BatchNorm1d(4, momentum=momentum)
    with torch.no_grad():
        t_mod.weight.copy_(torch.tensor(randn(rng, 4)))
        t_mod.bias.copy_(torch.tensor(randn(rng, 4)))
    _train_then_eval(n_mod, t_mod, shape, rng)


def _train_then_eval(n_mod: nn.Module, t_mod: torch.nn.Module, shape: tuple, rng: np.random.Generator) -> None:
    """A norm with running statistics against torch's: a training call (outputs and gradients), two more that
    update the statistics (compared after), then an eval call."""
    compare_with_torch(n_mod, t_mod, [randn(rng, *shape, scale=2.0) + 1.0])
    for _ in range(2):
        x = randn(rng, *shape) * 3 - 1
        t_mod(torch.tensor(x))
        n_mod(nf.tensor(x))
    for name, v in t_mod.state_dict().items():
        np.testing.assert_allclose(n_mod.state_dict()[name], v.numpy(), rtol=RTOL, atol=ATOL, err_msg=name)
    t_mod.eval()
    n_mod.eval()
    compare_with_torch(n_mod, t_mod, [randn(rng, *shape)])


@pytest.mark.parametrize("shape", [(3, 4, 6), (4, 6)])
@pytest.mark.parametrize("affine,track,momentum", [(True, True, 0.1), (False, True, None), (True, False, 0.1)])
def test_instance_norm_train_then_eval(shape: tuple, affine: bool, track: bool, momentum: float | None) -> None:
    """nn.InstanceNorm1d against torch's: each instance normalized over its positions in training, the running
    statistics updated from them (or left as they are with momentum None) and used in eval; an unbatched [C, L]
    input too."""
    rng = np.random.default_rng(18)
    kw = dict(affine=affine, track_running_stats=track, momentum=momentum)
    t_mod, n_mod = torch.nn.InstanceNorm1d(4, **kw), nn.InstanceNorm1d(4, **kw)
    assert list(n_mod.state_dict()) == list(t_mod.state_dict())
    if affine:
        with torch.no_grad():
            t_mod.weight.copy_(torch.tensor(randn(rng, 4)))
            t_mod.bias.copy_(torch.tensor(randn(rng, 4)))
    _train_then_eval(n_mod, t_mod, shape, rng)
    with pytest.raises(ValueError, match=r"more than 1 position per channel in training, got input \[4, 1\]"):
        nn.InstanceNorm1d(4)(nf.tensor(randn(rng, 4, 1)))


def test_channel_and_alpha_dropout() -> None:
    """Dropout1d drops whole channels, the rest scaled by 1/(1-p); AlphaDropout keeps a SELU network's mean and
    variance (dropped elements at SELU's saturation, then torch's affine map); both the identity in eval mode."""
    nf.manual_seed(1)
    rng = np.random.default_rng(19)
    x = randn(rng, 16, 64, 40) + 3.0
    d = nn.Dropout1d(0.25)
    y = d(nf.tensor(x)).numpy()
    dropped = (y == 0).all(-1)
    assert ((y == 0).any(-1) == dropped).all() and 0.2 < dropped.mean() < 0.3
    np.testing.assert_allclose(y[~dropped], x[~dropped] / 0.75, rtol=1e-6)
    z = torch.nn.functional.selu(torch.tensor(randn(rng, 400, 500))).numpy()  # mean 0, variance 1
    a = nn.AlphaDropout(0.2)
    out = a(nf.tensor(z)).numpy()
    assert abs(out.mean()) < 0.01 and abs(out.var() - 1) < 0.02
    saturated = np.isclose(out, out.min())
    assert 0.18 < saturated.mean() < 0.22  # the dropped elements, one value
    for m in (d, a):
        m.eval()
        np.testing.assert_array_equal(m(nf.tensor(x)).numpy(), x)


def test_batch_norm_without_running_stats_or_affine() -> None:
    rng = np.random.default_rng(15)
    kw = dict(affine=False, track_running_stats=False)
    t_mod, n_mod = torch.nn.BatchNorm1d(3, **kw).eval(), nn.BatchNorm1d(3, **kw).eval()
    assert list(n_mod.state_dict()) == list(t_mod.state_dict()) == []
    x = randn(rng, 4, 3, 5)
    np.testing.assert_allclose(n_mod(nf.tensor(x)).numpy(), t_mod(torch.tensor(x)).numpy(), rtol=RTOL, atol=ATOL)


def test_embedding() -> None:
    rng = np.random.default_rng(16)
    idx = rng.integers(0, 7, (3, 4))
    compare_with_torch(nn.Embedding(7, 5), torch.nn.Embedding(7, 5), [idx])


def test_embedding_padding_idx_gets_no_gradient() -> None:
    rng = np.random.default_rng(17)
    idx = np.array([[0, 2, 2, 1], [1, 0, 3, 2]])
    t_mod, n_mod = torch.nn.Embedding(4, 3, padding_idx=2), nn.Embedding(4, 3, padding_idx=2)
    assert np.all(n_mod.weight.numpy()[2] == 0)
    with torch.no_grad():
        t_mod.weight[2] = torch.tensor(randn(rng, 3))  # a loaded, non-zero padding row still comes out
    compare_with_torch(n_mod, t_mod, [idx])


@pytest.mark.parametrize("name,kw", [
    ("ReLU", {}), ("Tanh", {}), ("Sigmoid", {}), ("SiLU", {}), ("GELU", {}), ("GELU", {"approximate": "tanh"}),
    ("LeakyReLU", {"negative_slope": 0.1}), ("ELU", {"alpha": 0.5}), ("CELU", {"alpha": 2.0}), ("SELU", {}),
    ("Softplus", {"beta": 2.0, "threshold": 3.0}), ("LogSigmoid", {}), ("Hardtanh", {"min_val": -2.0, "max_val": 1.5}),
    ("ReLU6", {}), ("Hardsigmoid", {}), ("Hardswish", {}), ("Softsign", {}), ("Mish", {}), ("GLU", {"dim": 1}),
])
def test_activations(name: str, kw: dict) -> None:
    rng = np.random.default_rng(18)
    compare_with_torch(getattr(nn, name)(**kw), getattr(torch.nn, name)(**kw), [randn(rng, 3, 8, scale=3.0)])
    assert nn.Swish is nn.SiLU


def test_activation_reprs_and_errors() -> None:
    assert repr(nn.Softplus(beta=2.0)) == "Softplus(beta=2.0, threshold=20.0)"
    assert repr(nn.ReLU6()) == "ReLU6(min_val=0.0, max_val=6.0)"
    with pytest.raises(ValueError, match="min_val 2 is above max_val 1"):
        nn.Hardtanh(2, 1)
    with pytest.raises(nf.ShapeError, match=r"glu: dimension -1 of input \[2, 3\] must have an even size"):
        nn.GLU()(nf.ones(2, 3))


@pytest.mark.parametrize("shape,eps", [((6,), None), ((3, 6), 1e-3)])
def test_rms_norm(shape: tuple, eps: float | None) -> None:
    rng = np.random.default_rng(19)
    t_mod = torch.nn.RMSNorm(shape, eps=eps)
    with torch.no_grad():
        t_mod.weight.copy_(torch.tensor(randn(rng, *shape)))
    n_mod = nn.RMSNorm(shape, eps=eps)
    compare_with_torch(n_mod, t_mod, [randn(rng, 2, 3, 6, scale=3.0)])
    assert list(n_mod.state_dict()) == ["weight"]
    assert not list(nn.RMSNorm(shape, elementwise_affine=False).parameters())
    with pytest.raises(nf.ShapeError, match=r"rms_norm: input \[2, 5\] does not end with \[6\]"):
        nn.RMSNorm(6)(nf.ones(2, 5))


@pytest.mark.parametrize("shape,groups,affine", [((2, 6, 5), 3, True), ((3, 4), 2, False), ((2, 6, 2, 3), 6, True)])
def test_group_norm(shape: tuple, groups: int, affine: bool) -> None:
    rng = np.random.default_rng(24)
    t_mod = torch.nn.GroupNorm(groups, shape[1], eps=1e-4, affine=affine)
    if affine:
        with torch.no_grad():
            t_mod.weight.copy_(torch.tensor(randn(rng, shape[1])))
            t_mod.bias.copy_(torch.tensor(randn(rng, shape[1])))
    n_mod = nn.GroupNorm(groups, shape[1], eps=1e-4, affine=affine)
    assert list(n_mod.state_dict()) == list(t_mod.state_dict())
    compare_with_torch(n_mod, t_mod, [randn(rng, *shape, scale=3.0)])
    with pytest.raises(nf.ShapeError, match=r"GroupNorm: 6 channels do not split into 4 groups"):
        nn.GroupNorm(4, 6)
    with pytest.raises(nf.ShapeError, match=r"group_norm: 5 channels of \[2, 5\] do not split into 2 groups"):
        F.group_norm(nf.ones(2, 5), 2)


@pytest.mark.parametrize("name,kw", [
    ("MaxPool1d", dict(kernel_size=3, stride=2, padding=1)), ("MaxPool1d", dict(kernel_size=2, dilation=2,
                                                                               ceil_mode=True)),
    ("AvgPool1d", dict(kernel_size=3)), ("AvgPool1d", dict(kernel_size=4, stride=3, padding=2, ceil_mode=True,
                                                           count_include_pad=False)),
    ("AdaptiveAvgPool1d", dict(output_size=1)), ("AdaptiveMaxPool1d", dict(output_size=4)),
])
def test_pooling(name: str, kw: dict) -> None:
    rng = np.random.default_rng(26)
    compare_with_torch(getattr(nn, name)(**kw), getattr(torch.nn, name)(**kw), [randn(rng, 2, 3, 11)])


def test_pooling_errors() -> None:
    with pytest.raises(nf.ShapeError, match=r"max_pool1d: a window of 5 does not fit the input's last axis of 3"):
        nn.MaxPool1d(5)(nf.ones(2, 3))
    with pytest.raises(ValueError, match=r"avg_pool1d: padding 2 is more than half the kernel size 3"):
        nn.AvgPool1d(3, padding=2)(nf.ones(2, 8))
    with pytest.raises(nf.ShapeError, match=r"max_pool1d: needs \[N, C, L\] or \[C, L\] with L > 0, got \[4\]"):
        F.max_pool1d(nf.ones(4), 2)


def test_sequential_matches_torch() -> None:
    rng = np.random.default_rng(19)
    t_mod = torch.nn.Sequential(torch.nn.Conv1d(2, 4, 3, padding=1), torch.nn.SiLU(), torch.nn.Conv1d(4, 3, 1))
    n_mod = nn.Sequential(nn.Conv1d(2, 4, 3, padding=1), nn.SiLU(), nn.Conv1d(4, 3, 1))
    assert list(n_mod.state_dict()) == list(t_mod.state_dict())
    compare_with_torch(n_mod, t_mod, [randn(rng, 2, 2, 9)])


def test_dropout_train_and_eval() -> None:
    nf.manual_seed(0)
    rng = np.random.default_rng(20)
    x = randn(rng, 200, 50) + 3.0
    d = nn.Dropout(0.25)
    y = d(nf.tensor(x)).numpy()
    dropped = y == 0
    assert 0.2 < dropped.mean() < 0.3
    np.testing.assert_allclose(y[~dropped], x[~dropped] / 0.75, rtol=1e-6)
    d.eval()
    np.testing.assert_array_equal(d(nf.tensor(x)).numpy(), x)
    # the gradient flows through kept elements only, scaled like the values
    xt = nf.tensor(x, requires_grad=True)
    d.train()
    out = d(xt)
    out.sum().backward()
    g = xt.grad.numpy()
    np.testing.assert_allclose(g, np.where(out.numpy() == 0, 0.0, 1 / 0.75), rtol=1e-6)


def test_dropout_in_compiled_function_draws_fresh_masks() -> None:
    d = nn.Dropout(0.5)
    f = nf.compile(lambda x: d(x))
    x = np.ones((64,), np.float32) + np.arange(64, dtype=np.float32)
    a, b = f(x), f(x)
    assert not np.array_equal(a == 0, b == 0)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_transformer_encoder_layer(norm_first: bool, activation: str) -> None:
    rng = np.random.default_rng(21)
    kw = dict(d_model=8, nhead=2, dim_feedforward=16, dropout=0.0, activation=activation, norm_first=norm_first)
    t_mod, n_mod = torch.nn.TransformerEncoderLayer(**kw), nn.TransformerEncoderLayer(**kw)
    assert list(n_mod.state_dict()) == list(t_mod.state_dict())
    compare_with_torch(n_mod, t_mod, [randn(rng, 5, 3, 8)])


def test_transformer_encoder_layer_masks_batch_first() -> None:
    rng = np.random.default_rng(22)
    kw = dict(d_model=8, nhead=4, dim_feedforward=12, dropout=0.0, batch_first=True)
    t_mod, n_mod = torch.nn.TransformerEncoderLayer(**kw), nn.TransformerEncoderLayer(**kw)
    pad = np.array([[False] * 5, [False, False, False, True, True], [False] * 4 + [True]])
    causal = np.triu(np.ones((5, 5), bool), 1)
    float_mask = np.where(causal, -np.inf, 0.0).astype(np.float32)
    float_pad = np.where(pad, -np.inf, 0.0).astype(np.float32)
    for mask, kp in ((causal, pad), (float_mask, float_pad)):  # torch wants both masks of one kind
        compare_with_torch(n_mod, t_mod, [randn(rng, 3, 5, 8)],
                           call=lambda m, x, a=mask, b=kp: m(x, src_mask=_as(m, a), src_key_padding_mask=_as(m, b)))


@pytest.mark.parametrize("final_norm", [False, True])
def test_transformer_encoder(final_norm: bool) -> None:
    """Two clones of one layer, each trained on its own, a causal mask to every layer, then the final norm."""
    rng = np.random.default_rng(25)
    kw = dict(d_model=8, nhead=2, dim_feedforward=12, dropout=0.0, batch_first=True)
    t_mod = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(**kw), 2,
                                        norm=torch.nn.LayerNorm(8) if final_norm else None,
                                        enable_nested_tensor=False)
    n_mod = nn.TransformerEncoder(nn.TransformerEncoderLayer(**kw), 2, norm=nn.LayerNorm(8) if final_norm else None)
    assert list(n_mod.state_dict()) == list(t_mod.state_dict())
    with torch.no_grad():  # torch's clones start equal; different layers show each is applied once, in order
        for p in t_mod.layers[1].parameters():
            p.add_(torch.tensor(randn(rng, *p.shape, scale=0.1)))
    causal = np.triu(np.ones((5, 5), bool), 1)
    compare_with_torch(n_mod, t_mod, [randn(rng, 3, 5, 8)], call=lambda m, x: m(x, mask=_as(m, causal)))
    assert n_mod.layers[0].linear1.weight is not n_mod.layers[1].linear1.weight


def _as(module, a: np.ndarray):
    return torch.tensor(a) if isinstance(module, torch.nn.Module) else a


def test_multihead_attention_weights() -> None:
    rng = np.random.default_rng(23)
    t_mod, n_mod = torch.nn.MultiheadAttention(6, 3), nn.MultiheadAttention(6, 3)
    q, k = randn(rng, 4, 2, 6), randn(rng, 5, 2, 6)
    for avg in (True, False):
        compare_with_torch(n_mod, t_mod, [q, k, k], call=lambda m, q, k, v, avg=avg: m(q, k, v,
                                                                                       average_attn_weights=avg))


def test_functional_pad_errors() -> None:
    x = nf.ones(2, 3)
    with pytest.raises(ValueError, match="pad: needs \\(before, after\\) pairs, last dimension first; got 3 sizes"):
        F.pad(x, (1, 2, 3))
    with pytest.raises(nf.ShapeError, match=r"pad: 6 sizes pad 3 dimensions, the input \[2, 3\] has 2"):
        F.pad(x, (1, 1, 1, 1, 1, 1))
    with pytest.raises(nf.ShapeError, match="reflect padding of \\(3, 0\\) on dimension 1 of size 3: each side must "
                                            "be smaller than the size"):
        F.pad(x, (3, 0), mode="reflect")
    with pytest.raises(ValueError, match="mode 'circular' takes no value"):
        F.pad(x, (1, 0), mode="circular", value=1.0)
    with pytest.raises(ValueError, match="mode must be one of constant, reflect, replicate, circular"):
        F.pad(x, (1, 0), mode="edge")
    with pytest.raises(nf.ShapeError, match="cropping 2 and 2 from dimension 1 of size 3"):
        F.pad(x, (-2, -2))

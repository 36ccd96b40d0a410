"""``nnforge.torch.from_torch``: torch models captured by torch.fx and run as nnforge modules, against torch."""

from __future__ import annotations

import math
import pickle
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from torch.nn.utils.rnn import pad_packed_sequence

import nnforge as nf
import nnforge.nn as nn
from nnforge.errors import NNForgeError
from nnforge.torch import TorchModule, from_torch


class _Conv(torch.nn.Module):  # Bonito's Convolution: a conv, then swish
    def __init__(self, c_in: int, c_out: int, k: int, stride: int):
        super().__init__()
        self.conv = torch.nn.Conv1d(c_in, c_out, k, stride=stride, padding=k // 2)

    def forward(self, x):
        return TF.silu(self.conv(x))


class _RNN(torch.nn.Module):  # Bonito's RNNWrapper: a reversed layer flips time around its LSTM
    def __init__(self, n: int, reverse: bool):
        super().__init__()
        self.rnn, self.reverse = torch.nn.LSTM(n, n), reverse

    def forward(self, x):
        if self.reverse:
            x = x.flip(0)
        y, _ = self.rnn(x)
        return y.flip(0) if self.reverse else y


class _Head(torch.nn.Module):  # Bonito's LinearCRFEncoder: tanh scores, scaled, a blank score padded in front
    def __init__(self, n: int):
        super().__init__()
        self.linear, self.scale = torch.nn.Linear(n, 20), 5.0

    def forward(self, x):
        scores = torch.tanh(self.linear(x)) * self.scale
        t, n, c = scores.shape
        return TF.pad(scores.view(t, n, c // 4, 4), (1, 0, 0, 0, 0, 0, 0, 0), value=2.0).view(t, n, -1)


class Basecaller(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Sequential(_Conv(1, 4, 5, 1), _Conv(4, 16, 9, 3))
        self.rnns = torch.nn.Sequential(*[_RNN(16, r) for r in (True, False, True)])
        self.head = _Head(16)

    def forward(self, x):
        return self.head(self.rnns(self.encoder(x).permute(2, 0, 1)))


class Block(torch.nn.Module):
    """A transformer block in the idioms of hand-written ones: einsum scores, a causal mask by triu and
    masked_fill, torch's fused attention, SwiGLU, RMSNorm, a parameter and a buffer read directly."""

    def __init__(self, d: int = 16, heads: int = 2):
        super().__init__()
        self.norm, self.heads = torch.nn.RMSNorm(d), heads
        self.qkv, self.out = torch.nn.Linear(d, 3 * d, bias=False), torch.nn.Linear(d, d)
        self.up, self.down = torch.nn.Linear(d, 4 * d), torch.nn.Linear(2 * d, d)
        self.gain = torch.nn.Parameter(torch.full((d,), 0.5))
        self.register_buffer("pos", torch.linspace(0, 1, d))

    def forward(self, x):  # [N, T, d]
        n, t, d = x.shape
        q, k, v = self.qkv(self.norm(x) + self.pos).chunk(3, dim=-1)
        q = q.view(n, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.view(n, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.reshape(n, t, self.heads, -1).permute(0, 2, 1, 3)
        scores = torch.einsum("nhqd,nhkd->nhqk", q, k) / (d // self.heads) ** 0.5
        probs = scores.masked_fill(torch.ones_like(scores).triu(1).bool(), float("-inf")).softmax(dim=-1)
        o = (probs @ v).transpose(1, 2).contiguous().view(n, t, d)
        fused = TF.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(n, t, d)
        x = x + self.out(o) + 0.1 * fused
        a, b = self.up(x).chunk(2, -1)
        x = x + self.down(TF.silu(a) * b) * self.gain
        values, index = x.max(dim=-1)
        return torch.cat([x, values.unsqueeze(-1), index.unsqueeze(-1).float()], dim=-1), x.sum(dim=1, keepdim=True)


class Causal(torch.nn.Module):
    """A GPT-style block (nanoGPT's idioms): masks made from the traced length (``torch.ones(T, T)``, a buffer
    sliced to ``[:T, :T]``), positions from ``torch.arange(T, device=x.device)``, ``math.sqrt`` of a size."""

    def __init__(self, d: int = 16, heads: int = 2, most: int = 8):
        super().__init__()
        self.heads, self.qkv, self.out = heads, torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.position = torch.nn.Embedding(most, d)
        self.register_buffer("bias", torch.tril(torch.ones(most, most)).view(1, 1, most, most))

    def forward(self, x):  # [N, T, d]
        n, t, d = x.size()
        x = x + self.position(torch.arange(t, device=x.device))
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = [y.view(n, t, self.heads, -1).transpose(1, 2) for y in (q, k, v)]
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        first = scores.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf")).softmax(dim=-1)
        causal = torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device))
        second = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = ((first + second) @ v).transpose(1, 2).contiguous().view(n, t, d)
        return x + self.out(y) + x.new_ones(n, t, 1) * torch.full((1, t, 1), 0.5, dtype=x.dtype, device=x.device)


class InPlace(torch.nn.Module):
    """torch's in-place spellings: methods (chained, and through the tensor one returns), ``x[i] = v``,
    augmented assignments (on a tensor another name holds, on a size, on a view of a tensor not read again),
    ``torch.relu_``, a layer built with ``inplace=True``; each a new value in nnforge, rebound where torch's
    memory is shared."""

    def __init__(self):
        super().__init__()
        self.linear, self.act = torch.nn.Linear(4, 4), torch.nn.ReLU(inplace=True)

    def forward(self, x):  # [N, 4]
        y = self.linear(x) * 2
        y.mul_(3).add_(1)
        y[:, 0] = 5.0
        y[1:, 2:] = x[1:, :2] * 7
        torch.relu_(y)
        z = y.clone()
        w = z.masked_fill_(z > 3, 0.5)
        z.sub_(0.25)
        self.act(w)
        alias = w
        w += 1.5
        w *= z
        n = x.shape[0]
        rows = n
        n += 1
        t = (z * 2).transpose(0, 1)
        t -= 1
        return y.clamp_(max=4.0), alias * rows, z + n, t


def _signal(rng: np.random.Generator, n: int = 3, samples: int = 45) -> np.ndarray:
    return rng.standard_normal((n, 1, samples))


def test_a_basecaller_converts_and_computes_what_torch_does(backend: str, rng: np.random.Generator) -> None:
    model = Basecaller().double()
    ours = from_torch(model)
    assert sorted(ours.state_dict()) == sorted(model.state_dict())
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(ours.state_dict()[key], value.numpy())
    x = _signal(rng)
    expected = model(torch.tensor(x)).detach().numpy()
    got = nf.compile(lambda s: ours(s), backend=backend)(x)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-10, atol=1e-12)


def test_a_transformer_block_converts(backend: str, rng: np.random.Generator) -> None:
    model = Block().double()
    ours = from_torch(model)
    assert sorted(ours.state_dict()) == sorted(model.state_dict())
    x = rng.standard_normal((2, 5, 16))
    expected = [t.detach().numpy() for t in model(torch.tensor(x))]
    got = nf.compile(lambda v: ours(v), backend=backend)(x)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(np.asarray(g), e, rtol=1e-10, atol=1e-12)


@pytest.mark.filterwarnings("ignore:.*traced again")  # one trace per length, as any size outside a scan
def test_masks_and_positions_from_traced_lengths_convert(backend: str, rng: np.random.Generator) -> None:
    model = Causal().double()
    ours = from_torch(model)
    assert sorted(ours.state_dict()) == sorted(model.state_dict())
    f = nf.compile(lambda v: ours(v), backend=backend)
    for t in (5, 7):  # sizes and masks follow the input's length
        x = rng.standard_normal((2, t, 16))
        np.testing.assert_allclose(np.asarray(f(x)), model(torch.tensor(x)).detach().numpy(), rtol=1e-10,
                                   atol=1e-12, err_msg=f"T = {t}")


def test_in_place_calls_convert(backend: str, rng: np.random.Generator) -> None:
    model = InPlace().double()
    x = rng.standard_normal((3, 4))
    got = nf.compile(lambda v: from_torch(model)(v), backend=backend)(x)
    for g, e in zip(got, model(torch.tensor(x))):
        np.testing.assert_allclose(np.asarray(g), e.detach().numpy(), rtol=1e-12, atol=1e-12)


class _Heads(torch.nn.Module):
    """Shapes as attention code writes them: a size tuple extended, and the front of a shape unpacked."""

    def forward(self, x):  # [N, T, 6]
        y = x.view(x.size()[:-1] + (2, 3))  # noqa: RUF005 (the spelling under test)
        z = y.permute(0, 2, 1, 3)
        ones = x.new_ones(*z.shape[0:3:2]).unsqueeze(1).repeat(1, 2, 3)
        return z.reshape(*z.shape[:2], -1) * len(x.shape[1:3]) + ones


def test_sizes_sliced_from_a_shape_unpack(backend: str, rng: np.random.Generator) -> None:
    model = _Heads()
    x = rng.standard_normal((2, 4, 6))
    got = nf.compile(lambda v: from_torch(model)(v), backend=backend)(x)
    np.testing.assert_allclose(np.asarray(got), model(torch.tensor(x)).numpy(), rtol=1e-12, atol=1e-12)


class _Spread(torch.nn.Module):
    """var and std in torch's spellings: ``(dim, unbiased, keepdim)`` by position, a lone ``unbiased``, and
    ``correction`` or ``unbiased`` by keyword (nnforge's own order is ``(axis, keepdims, correction)``)."""

    def forward(self, x):  # [N, T, 6]
        return (x.var(1, False), torch.std(x, 2, True), x.std(1, False, True), x.var(False), torch.var(x, True),
                x.var(dim=(0, 2), unbiased=False), x.std(-1, correction=2, keepdim=True))


def test_variance_arguments_keep_torchs_meaning(backend: str, rng: np.random.Generator) -> None:
    model = _Spread()
    x = rng.standard_normal((2, 4, 6))
    got = nf.compile(lambda v: from_torch(model)(v), backend=backend)(x)
    for g, e in zip(got, model(torch.tensor(x)), strict=True):
        np.testing.assert_allclose(np.asarray(g), e.numpy(), rtol=1e-12, atol=1e-12)


class _Tagger(torch.nn.Module):
    """A tagger over a batch of sequences of different lengths, packed for its recurrent layers as torch's
    examples do."""

    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.LSTM(3, 5, num_layers=2, bidirectional=True, batch_first=True)
        self.elman = torch.nn.RNN(10, 4, 1, "relu", batch_first=True)
        self.head = torch.nn.Linear(4, 4)
        self.cell = torch.nn.RNNCell(4, 2, nonlinearity="relu")

    def forward(self, x, lengths):  # [N, T, 3], [N]
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, (h, _) = self.rnn(packed)
        out, _ = self.elman(out)
        y, _ = pad_packed_sequence(out, batch_first=True)  # the name imported from torch.nn.utils.rnn
        return self.head(y).log_softmax(-1), h, self.cell(y[:, 0])


def test_packed_sequences_convert(backend: str, rng: np.random.Generator) -> None:
    model = _Tagger().double()
    x, lengths = rng.standard_normal((4, 6, 3)), np.array([3, 6, 1, 4])
    want = model(torch.tensor(x), torch.tensor(lengths))
    got = nf.compile(lambda v, n: from_torch(model)(v, n), backend=backend)(x, lengths)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), w.detach().numpy(), rtol=1e-10, atol=1e-12)


class _Upsampled(torch.nn.Module):
    """Transposed convolutions, a layer's and the function's (torch's tuple sizes)."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.ConvTranspose1d(3, 4, 4, stride=2, padding=1, groups=1)
        self.kernel = torch.nn.Parameter(torch.randn(4, 1, 3))

    def forward(self, x):
        return TF.conv_transpose1d(self.up(x), self.kernel, stride=(3,), output_padding=1, groups=2)


def test_convolutions_with_padding_modes_convert(backend: str, rng: np.random.Generator) -> None:
    model = torch.nn.Sequential(torch.nn.Conv1d(2, 4, 3, padding=1, padding_mode="reflect"), torch.nn.GELU(),
                                torch.nn.Conv1d(4, 4, 5, padding="same", padding_mode="circular"),
                                torch.nn.Conv1d(4, 3, 3, stride=2, padding=2, padding_mode="replicate"),
                                _Upsampled()).double()
    ours = from_torch(model)
    x = rng.standard_normal((2, 2, 9))
    np.testing.assert_allclose(np.asarray(nf.compile(lambda v: ours(v), backend=backend)(x)),
                               model(torch.tensor(x)).detach().numpy(), rtol=1e-12, atol=1e-12)


class _WeightNormed(torch.nn.Module):
    """A TCN block with ``torch.nn.utils.parametrizations.weight_norm``: each weight is g * v / |v|."""

    def __init__(self):
        super().__init__()
        wn = torch.nn.utils.parametrizations.weight_norm
        self.conv = wn(torch.nn.Conv1d(2, 4, 3, padding=2, dilation=2))
        self.out = wn(torch.nn.Linear(4, 3), dim=None)

    def forward(self, x):
        return self.out(torch.relu(self.conv(x)[:, :, :-4]).transpose(1, 2))


def test_weight_norm_converts_with_its_parameters(backend: str, rng: np.random.Generator) -> None:
    """The parametrized layers' g and v (torch's keys), the weight computed from them: outputs on every backend,
    and the gradients of g and v against torch's."""
    model = _WeightNormed().double()
    ours = from_torch(model)
    assert sorted(ours.state_dict()) == sorted(model.state_dict())
    x, weights = rng.standard_normal((2, 2, 9)), rng.standard_normal((2, 5, 3))
    np.testing.assert_allclose(np.asarray(nf.compile(lambda v: ours(v), backend=backend)(x)),
                               model(torch.tensor(x)).detach().numpy(), rtol=1e-12, atol=1e-12)
    (ours(nf.tensor(x)) * nf.tensor(weights)).sum().backward()
    (model(torch.tensor(x)) * torch.tensor(weights)).sum().backward()
    grads = {name: p.grad for name, p in ours.named_parameters()}
    for name, p in model.named_parameters():
        np.testing.assert_allclose(grads[name].numpy(), p.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=name)


def test_a_converted_model_pickles(rng: np.random.Generator) -> None:
    """nnforge modules pickle (an EMA copy, a checkpoint, a worker's copy): converted ones too, with the layers
    torch has and nnforge has not as classes (Softmax, Flatten, weight_norm's parametrization)."""
    model = torch.nn.Sequential(_WeightNormed(), torch.nn.Flatten(), torch.nn.Softmax(-1)).double()
    ours = from_torch(model)
    for p in ours.parameters():
        p.assign(p.numpy() * 1.5)  # trained: the copy keeps the parameters' current values
    copy = pickle.loads(pickle.dumps(ours))
    x = nf.tensor(rng.standard_normal((2, 2, 9)))
    np.testing.assert_array_equal(copy(x).numpy(), ours(x).numpy())
    assert not np.allclose(ours(x).numpy(), model(torch.tensor(x.numpy())).detach().numpy())


class _Running(torch.nn.Module):
    """Module state changed in place in forward (a running mean of its inputs), read in the same call."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.zeros(3, dtype=torch.float64))

    def forward(self, x):
        self.mean.mul_(0.5).add_(0.5 * x.mean(0))
        return x - self.mean


def test_buffers_changed_in_place_keep_their_values(backend: str, rng: np.random.Generator) -> None:
    model = _Running()
    ours = from_torch(model)
    f = nf.compile(lambda v: ours(v), backend=backend)
    for _ in range(3):
        x = rng.standard_normal((4, 3))
        np.testing.assert_allclose(np.asarray(f(x)), model(torch.tensor(x)).numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ours.state_dict()["mean"], model.mean.numpy(), rtol=1e-12, atol=1e-12)


class _Rotary(torch.nn.Module):
    """Rotary position embedding of queries and keys ([N, heads, T, d]), pairs of features rotated by angle."""

    def __init__(self, dim: int):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / 10000.0 ** (torch.arange(0, dim, 2).double() / dim), persistent=False)

    def forward(self, q, k):
        angles = torch.outer(torch.arange(q.shape[-2], dtype=self.inv_freq.dtype), self.inv_freq)
        cos, sin = angles.cos(), angles.sin()

        def rotated(x):
            x1, x2 = x[..., ::2], x[..., 1::2]
            return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)

        return rotated(q), rotated(k)


class _TransformerBasecaller(torch.nn.Module):
    """A transformer basecaller's shape: a strided conv stem, then layers of rotary attention within a sliding
    window, a SwiGLU feed-forward, RMSNorm after deepnorm-scaled residuals; a tanh-scaled linear head."""

    def __init__(self, d: int = 16, heads: int = 2, window: int = 3, layers: int = 2):
        super().__init__()
        self.heads, self.window = heads, window
        self.stem = torch.nn.Sequential(torch.nn.Conv1d(1, 8, 5, padding=2), torch.nn.SiLU(),
                                        torch.nn.Conv1d(8, d, 9, stride=3, padding=4), torch.nn.SiLU())
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(d, 3 * d) for _ in range(layers))
        self.out = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(layers))
        self.fc1 = torch.nn.ModuleList(torch.nn.Linear(d, 2 * 24, bias=False) for _ in range(layers))
        self.fc2 = torch.nn.ModuleList(torch.nn.Linear(24, d, bias=False) for _ in range(layers))
        self.norms = torch.nn.ModuleList(torch.nn.RMSNorm(d) for _ in range(2 * layers))
        self.rotary = _Rotary(d // heads)
        self.register_buffer("alpha", torch.tensor(2.0 ** 0.25))
        self.head = torch.nn.Linear(d, 20)

    def forward(self, x):  # [N, 1, samples]
        h = self.stem(x).transpose(1, 2)
        n, t, _ = h.shape
        i = torch.arange(t)
        near = (i[None, :] - i[:, None]).abs() <= self.window
        for k in range(len(self.qkv)):
            q, key, v = self.qkv[k](h).view(n, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
            q, key = self.rotary(q, key)
            a = TF.scaled_dot_product_attention(q, key, v, attn_mask=near).transpose(1, 2).reshape(n, t, -1)
            h = self.norms[2 * k](self.out[k](a) + self.alpha * h)
            y, gate = self.fc1[k](h).chunk(2, dim=-1)
            h = self.norms[2 * k + 1](self.fc2[k](y * TF.silu(gate)) + self.alpha * h)
        return torch.tanh(self.head(h)) * 5.0


@pytest.mark.whole_model
def test_a_transformer_basecaller_converts(backend: str, rng: np.random.Generator) -> None:
    """Outputs and every parameter's gradient of a training loss against torch, in float64, at two lengths (an
    attention model traces once per length: its mask is as long as the sequence)."""
    model = _TransformerBasecaller().double()
    ours = from_torch(model)
    weights = {t: rng.standard_normal((2, t // 3, 20)) for t in (60, 45)}

    @nf.compile(backend=backend)
    def step(x, w):
        ours.zero_grad()
        out = ours(x)
        (out * w).sum().backward()
        return out, {k: p.grad for k, p in ours.named_parameters()}

    for t, w in weights.items():
        x = rng.standard_normal((2, 1, t))
        out, grads = step(x, w)
        model.zero_grad()
        want = model(torch.tensor(x))
        (want * torch.tensor(w)).sum().backward()
        np.testing.assert_allclose(np.asarray(out), want.detach().numpy(), rtol=1e-10, atol=1e-12)
        for k, param in model.named_parameters():
            np.testing.assert_allclose(np.asarray(grads[k]), param.grad.numpy(), rtol=1e-9, atol=1e-11, err_msg=k)


@pytest.mark.whole_model
def test_a_converted_model_trains_like_torch(backend: str, rng: np.random.Generator) -> None:
    """Two Adam steps of a whole compiled nnforge step against torch's loop: the same losses and weights."""
    model = Basecaller().double()
    ours = from_torch(model)
    opt = nn.optim.Adam(ours.parameters(), lr=1e-2)
    torch_opt = torch.optim.Adam(model.parameters(), lr=1e-2)

    @nf.compile(backend=backend)
    def step(x, y):
        opt.zero_grad()
        loss = ((ours(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    for _ in range(2):
        x, y = _signal(rng), rng.standard_normal((15, 3, 25))
        torch_opt.zero_grad()
        loss = ((model(torch.tensor(x)) - torch.tensor(y)) ** 2).mean()
        loss.backward()
        torch_opt.step()
        np.testing.assert_allclose(float(step(x, y)), loss.item(), rtol=1e-10)
    for key, value in model.state_dict().items():
        np.testing.assert_allclose(ours.state_dict()[key], value.numpy(), rtol=1e-8, atol=1e-10, err_msg=key)


def test_a_converted_model_runs_compiled_in_torchs_own_training_loop(rng: np.random.Generator) -> None:
    """``TorchModule(from_torch(m), twin=m)``: torch's parameters, optimizer and backward; one compiled program."""
    model = Basecaller().double()
    twin = Basecaller().double()
    twin.load_state_dict(model.state_dict())
    compiled = TorchModule(from_torch(twin), twin=twin)
    x = torch.tensor(_signal(rng))
    weights = torch.tensor(rng.standard_normal((15, 3, 25)))
    (model(x) * weights).sum().backward()
    (compiled(x) * weights).sum().backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        np.testing.assert_allclose(q.grad.numpy(), p.grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("proj", [0, 2])
def test_a_torch_layer_becomes_its_nnforge_twin(rng: np.random.Generator, proj: int) -> None:
    lstm = torch.nn.LSTM(3, 5, num_layers=2, batch_first=True, proj_size=proj).double()
    ours = from_torch(lstm)
    assert isinstance(ours, nn.LSTM) and sorted(ours.state_dict()) == sorted(lstm.state_dict())
    x = rng.standard_normal((2, 4, 3))
    np.testing.assert_allclose(ours(nf.tensor(x))[0].numpy(), lstm(torch.tensor(x))[0].detach().numpy(),
                               rtol=1e-12, atol=1e-14)


def test_modes_and_frozen_parameters_carry_over() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 2))
    model[2].bias.requires_grad_(False)
    ours = from_torch(model.eval())
    assert not ours.training and not dict(ours.named_parameters())["2.bias"].requires_grad
    x = np.ones((3, 4), np.float32)
    np.testing.assert_allclose(ours(nf.tensor(x)).numpy(), model(torch.tensor(x)).detach().numpy(), rtol=1e-6,
                               atol=1e-6)  # float32 sums of O(1) terms: an output near 0 keeps their rounding
    ours.train()
    assert (ours(nf.tensor(np.ones((64, 4), np.float32))).numpy() != model(torch.ones(64, 4)).detach().numpy()).any()


class _Conv2d(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.image = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3))

    def forward(self, x):
        return self.image(x)


class _Spectrum(torch.nn.Module):
    def forward(self, x):
        return torch.fft.rfft(x).abs()


class _Nonzero(torch.nn.Module):
    def forward(self, x):
        return x.nonzero()


class _ViewChanged(torch.nn.Module):
    def forward(self, x):
        v = x.transpose(0, 1)
        v.mul_(2)
        return x


class _ViewReadAfter(torch.nn.Module):
    def forward(self, x):
        y = x * 1
        first = y[0]
        y[1] = 0.0
        return first


class _ViewAugmented(torch.nn.Module):
    def forward(self, x):
        y = x * 2
        v = y.transpose(0, 1)
        v += 1
        return y


class _Packed(torch.nn.Module):
    def forward(self, x):
        return torch.nn.utils.rnn.pack_sequence([x, x[:2]])


class _PythonLoop(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = torch.nn.LSTMCell(3, 3)

    def forward(self, x):
        h = c = torch.zeros_like(x[0])
        for t in range(x.shape[0]):
            h, c = self.cell(x[t], (h, c))
        return h


class _FloorDivision(torch.nn.Module):
    def forward(self, x):
        return x.long() // 3


def test_an_operand_nnforge_does_not_take_is_named_at_the_users_line() -> None:
    """A TypeError when the converted model runs, not at conversion (fx records `//` as an operator), with forward's
    line: it came from inside nnforge's tensor otherwise."""
    model = from_torch(_FloorDivision())
    with pytest.raises(TypeError, match=r"^from_torch: unsupported operand type\(s\) for //: 'Tensor' and 'int' "
                                        r"\[.*test_from_torch.py:(\d+)\]$") as e:
        model(nf.tensor(np.ones((2, 3), np.float32)))
    assert str(e.value).endswith(f"test_from_torch.py:{_line('x.long() // 3')}]")


def _line(pattern: str) -> int:
    """The line of this file holding ``pattern`` (what an error must point at)."""
    with open(__file__) as f:
        return next(k for k, line in enumerate(f, 1) if pattern in line)


@pytest.mark.parametrize(("model", "message", "source"), [
    (_Conv2d(), r"torch.nn.modules.conv.Conv2d at 'image.0' has no nnforge counterpart", "return self.image(x)"),
    (torch.nn.Conv2d(1, 2, 3), r"torch.nn.modules.conv.Conv2d at 'Conv2d' has no nnforge counterpart", None),
    (_Spectrum(), r"torch.fft.rfft has no nnforge counterpart", "torch.fft.rfft(x)"),
    (_Nonzero(), r"the tensor method .nonzero\(\) has no nnforge counterpart", "x.nonzero()"),
    (_ViewChanged(), r"mul_\(\) changes a view \(transpose, .*test_from_torch.py:\d+\) in place", "v.mul_(2)"),
    (_ViewReadAfter(), r"x\[...\] = value changes a tensor in place while its view \(getitem", "y[1] = 0.0"),
    (_ViewAugmented(), r"x \+= value changes a view \(transpose, .*\) in place, which changes the tensor viewed "
     r"\(.*test_from_torch.py:\d+\), read later", "v += 1"),
    (_PythonLoop(), r"torch.fx could not capture _PythonLoop.forward at .*: .*\(a loop over time steps",
     "for t in range(x.shape[0]):"),
    (_Packed(), r"_Packed.forward at .* \(in torch.nn.utils.rnn.pack_sequence\)",
     "torch.nn.utils.rnn.pack_sequence([x, x[:2]])"),
])
def test_what_cannot_be_converted_is_named_with_the_users_line(model: torch.nn.Module, message: str,
                                                               source: str | None) -> None:
    with pytest.raises(NNForgeError, match=message) as e:
        from_torch(model)
    if source is not None:  # the line of forward that made the call
        line = re.search(r"test_from_torch.py:(\d+)\]", str(e.value))
        assert line and int(line[1]) == _line(source), str(e.value)


class _Layers(torch.nn.Module):
    """One of most layers with an nnforge twin, each converted with its settings."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 8, padding_idx=0)
        self.norm = torch.nn.LayerNorm(8, eps=1e-3)
        self.stack = torch.nn.TransformerEncoder(
            torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True), 2,
            norm=torch.nn.LayerNorm(8), enable_nested_tensor=False)
        self.groups = torch.nn.GroupNorm(3, 12, eps=1e-4)
        self.encoder = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation="gelu", batch_first=True,
                                                        norm_first=True)
        self.attn = torch.nn.MultiheadAttention(8, 2, batch_first=True)
        self.gru = torch.nn.GRU(8, 6, num_layers=2, batch_first=True, bidirectional=True)
        self.bn = torch.nn.BatchNorm1d(12)
        self.act = torch.nn.Sequential(torch.nn.PReLU(5, 0.1), torch.nn.Threshold(-0.8, -1.0),
                                       torch.nn.Softshrink(0.1), torch.nn.Hardshrink(0.05), torch.nn.Tanhshrink(),
                                       torch.nn.Softmin(1), torch.nn.InstanceNorm1d(5, affine=True),
                                       torch.nn.CircularPad1d(1), torch.nn.LPPool1d(2, 3, 1), torch.nn.Dropout1d(0.3),
                                       torch.nn.AlphaDropout(0.3),
                                       torch.nn.Softplus(beta=2.0), torch.nn.LeakyReLU(0.1), torch.nn.Hardtanh(-2, 2),
                                       torch.nn.MaxPool1d(3, 1, 1), torch.nn.AvgPool1d(2, 1, 1, ceil_mode=True),
                                       torch.nn.AvgPool1d(2, 1, count_include_pad=False))
        self.out = torch.nn.Sequential(torch.nn.Flatten(1), torch.nn.Linear(12 * 5, 3), torch.nn.LogSoftmax(-1))

    def forward(self, tokens):  # [N, 5] integer tokens
        x = self.encoder(self.norm(self.embed(tokens)))
        x = self.stack(x, mask=torch.nn.Transformer.generate_square_subsequent_mask(5, dtype=x.dtype))
        a, _ = self.attn(x, x, x, need_weights=False)
        y, _ = self.gru(a + x)
        y = self.groups(self.bn(y.transpose(1, 2))).transpose(1, 2)
        return self.out(self.act(y))


def test_layers_convert_with_their_settings(backend: str, rng: np.random.Generator) -> None:
    model = _Layers().double().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    ours = from_torch(model)
    assert sorted(ours.state_dict()) == sorted(model.state_dict())
    tokens = rng.integers(0, 10, (4, 5))
    expected = model(torch.tensor(tokens)).detach().numpy()
    np.testing.assert_allclose(np.asarray(nf.compile(lambda t: ours(t), backend=backend)(tokens)), expected,
                               rtol=1e-10, atol=1e-12)


class _Idioms(torch.nn.Module):
    """torch's spellings: functions with dim / keepdim / start_dim keywords, methods torch has and nnforge names
    otherwise, dtype conversions, shapes read from the tensor."""

    def forward(self, x):
        n = x.size(0)
        y = torch.flatten(x, start_dim=1).sum(dim=-1, keepdim=True) + torch.mean(x, dim=(1, 2)).unsqueeze(1)
        y = y + torch.cat([x, x], dim=1).amax(dim=(1, 2)).unsqueeze(-1)
        y = y + torch.split(x, 2, dim=1)[0].sum((1, 2))[:, None]
        y = y + x.repeat(1, 2, 1).tile((2,)).repeat_interleave(2, dim=1).norm(dim=(1, 2)).unsqueeze(-1)
        y = y + torch.norm(x, p=1, dim=1).sum(-1, keepdim=True) + torch.linalg.vector_norm(x, ord=3, dim=-1)[:, :1]
        first = x.unbind(dim=1)[0]
        z = first.type_as(x).to(torch.float64).clip(-1, 1).cumsum(dim=-1).argmax(dim=-1).float().view(n, 1)
        return y * x.shape[2] + z + x.min(dim=2).values.sum(dim=1, keepdim=True)


class Rotary(torch.nn.Module):
    """Rotary attention over a key-padding mask, in the idioms of such models: an ``inv_freq`` buffer and
    ``torch.outer`` of the traced positions, ``unflatten`` heads, ``bmm``, a float32 softmax, ``TF.normalize``;
    then a resampled, windowed head (``TF.interpolate``, ``unfold``) and a cross-entropy."""

    def __init__(self, d: int = 8, heads: int = 2):
        super().__init__()
        self.heads, self.qkv, self.out = heads, torch.nn.Linear(d, 3 * d, bias=False), torch.nn.Linear(d, d)
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, d // heads, 2).float() / (d // heads)))
        self.classes = torch.nn.Linear(d, 3)

    def forward(self, x, pad, labels):  # [N, T, d], bool [N, T], int64 [N, 2 T]
        n, t, d = x.shape
        freqs = torch.outer(torch.arange(t, device=x.device).type_as(self.inv_freq), self.inv_freq)
        cos, sin = torch.cat((freqs, freqs), dim=-1).cos(), torch.cat((freqs, freqs), dim=-1).sin()
        q, k, v = [y.unflatten(-1, (self.heads, -1)).transpose(1, 2) for y in self.qkv(x).chunk(3, dim=-1)]
        half = q.shape[-1] // 2
        q, k = [y * cos + torch.cat((-y[..., half:], y[..., :half]), dim=-1) * sin for y in (q, k)]
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.size(-1))
        probs = scores.masked_fill(pad[:, None, None, :], -1e9).softmax(-1, dtype=torch.float32).type_as(x)
        y = torch.bmm(probs.flatten(0, 1), v.flatten(0, 1)).view(n, self.heads, t, -1).transpose(1, 2)
        y = TF.normalize(self.out(y.reshape(n, t, d)), dim=-1) + torch.where(pad[..., None], 0.0, x)
        up = TF.interpolate(y.transpose(1, 2), scale_factor=2, mode="linear").transpose(1, 2)  # [N, 2 T, d]
        windows = up.unfold(1, 3, 2).mean(-1)
        logits = self.classes(up)
        return windows, TF.cross_entropy(logits.flatten(0, 1), labels.flatten()), logits.float().half().double()


def test_rotary_attention_idioms_convert(backend: str, rng: np.random.Generator) -> None:
    model = Rotary().double()
    x = rng.standard_normal((2, 5, 8))
    pad = np.array([[False] * 5, [False, False, False, True, True]])
    labels = rng.integers(0, 3, (2, 10))
    got = nf.compile(lambda *a: from_torch(model)(*a), backend=backend)(x, pad, labels)
    expected = model(torch.tensor(x), torch.tensor(pad), torch.tensor(labels))
    for g, e, tol in zip(got, expected, (1e-6, 1e-6, 1e-3)):  # through a float32 softmax; the last float16
        np.testing.assert_allclose(np.asarray(g), e.detach().numpy(), rtol=tol, atol=tol)


def test_torch_idioms_convert(rng: np.random.Generator) -> None:
    x = rng.standard_normal((2, 3, 4))
    np.testing.assert_allclose(from_torch(_Idioms())(nf.tensor(x)).numpy(), _Idioms()(torch.tensor(x)).numpy(),
                               rtol=1e-12, atol=1e-12)
